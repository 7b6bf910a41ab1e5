//! The events-stream entry layout (`store::event_entry`) as each writer puts it into a
//! real Redis: the three scripts that append entries (a due timer, an effect's events,
//! a work result) and the plain append of resync and replay write the same fields in
//! the same order — the timer script, which writes them itself, included.

use redis::ToRedisArgs;
use shepherd::core::event::{Event, WorkOutcome};
use shepherd::store::commit::{self, CommitPlan, TimerWrite};
use shepherd::store::effects::{self, InternalEvent};
use shepherd::store::event_entry::{self, EventEntry};
use shepherd::store::work::{self, ReportOutcome, ResultEvent, WorkOwner};
use shepherd::store::{Keys, Store, timers};

use crate::support::redis::RedisServer;

/// The field names of an internal entry, in order, as `EventEntry` writes them.
fn layout() -> Vec<String> {
    EventEntry::internal("d", "e", "o/r", 1, "{}")
        .to_redis_args()
        .chunks(2)
        .map(|p| String::from_utf8(p[0].clone()).unwrap())
        .collect()
}

/// Every entry of `stream` as `(field names in order, field → value)`.
async fn entries(
    conn: &mut crate::support::redis::TestConn,
    stream: &str,
) -> Vec<(Vec<String>, std::collections::HashMap<String, String>)> {
    let raw: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .expect("XRANGE");
    raw.into_iter()
        .map(|(_, flat)| {
            let names = flat.iter().step_by(2).cloned().collect();
            let map = flat
                .chunks(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect();
            (names, map)
        })
        .collect()
}

#[tokio::test]
async fn every_writer_of_events_entries_writes_one_layout() {
    let redis = RedisServer::start();
    let keys = Keys::new("layout", 1);
    let store = Store::connect(&redis.url(), keys.clone()).await.unwrap();
    let mut conn = store.conn();
    let repo = "o/r".parse().unwrap();
    let event = Event::WorkResult {
        work_id: "o:r:pr:1:1".parse().unwrap(),
        outcome: WorkOutcome::Succeeded,
        signature: None,
        summary: None,
        usage: None,
        stopped: None,
    };

    // 1. A due timer, popped by lua/timers.lua.
    let timer = shepherd::core::effect::Timer {
        id: "mergeability".into(),
        due_ms: 1,
        kind: shepherd::core::effect::TimerKind::Mergeability,
    };
    let plan = CommitPlan {
        timers: vec![TimerWrite::for_timer(
            &keys.pr_record("o/r", 1),
            &repo,
            shepherd::core::ids::Scope::Pr,
            1,
            &timer,
        )],
        ..CommitPlan::default()
    };
    commit::commit(&mut conn, &keys, &plan).await.unwrap();
    assert_eq!(
        timers::pop_due(&mut conn, &keys, 0, 10, 10).await.unwrap(),
        1
    );

    // 2. An effect's events, queued by lua/effect_finish.lua (two, to check the splice).
    let internal = [
        InternalEvent::new("o/r/pr/1@2.0", 0, "o/r", &event, 42),
        InternalEvent::new("o/r/pr/1@2.0", 1, "o/r", &event, 42),
    ];
    let ttl = std::time::Duration::from_secs(60);
    let queued = effects::finish(&mut conn, &keys, 0, "1-1", "o/r/pr/1@2.0", &internal, ttl);
    assert!(queued.await.unwrap());

    // 3. A work result, queued by lua/report.lua.
    let owner_value = WorkOwner::encode(false, "o/r", 1);
    let plan = CommitPlan {
        work_add: vec![("o:r:pr:1:1".into(), owner_value)],
        ..CommitPlan::default()
    };
    commit::commit(&mut conn, &keys, &plan).await.unwrap();
    let owner = WorkOwner {
        shard: 0,
        issue: false,
        repo: "o/r".into(),
        number: 1,
    };
    let result = ResultEvent {
        event: event.name(),
        body: serde_json::to_string(&event).unwrap(),
        received_ms: 7,
    };
    let reported = work::report(&mut conn, &keys, &owner, "o:r:pr:1:1", &result, 60);
    assert!(matches!(reported.await.unwrap(), ReportOutcome::Queued(_)));

    // 4. The plain append (resync, replay).
    let body = serde_json::to_string(&event).unwrap();
    let entry = EventEntry::internal("resync:x", "work-result", "o/r", 9, &body);
    event_entry::append(&mut conn, &keys.events(0), &entry)
        .await
        .unwrap();

    let mut check = redis.conn().await;
    let written = entries(&mut check, &keys.events(0)).await;
    assert_eq!(written.len(), 5, "{written:?}");
    let expected = layout();
    for (names, fields) in &written {
        assert_eq!(names, &expected, "{fields:?}");
        assert_eq!(fields["kind"], "internal");
        assert_eq!(fields["repo"], "o/r");
    }
    let deliveries: Vec<&str> = written
        .iter()
        .map(|(_, f)| f["delivery"].as_str())
        .collect();
    assert!(deliveries[0].starts_with("timer:"), "{deliveries:?}");
    assert_eq!(
        deliveries[1..],
        [
            "effect:o/r/pr/1@2.0:0",
            "effect:o/r/pr/1@2.0:1",
            "result:o:r:pr:1:1",
            "resync:x"
        ]
    );
    assert!(
        written[0].1["event"].starts_with("timer/"),
        "{:?}",
        written[0].1
    );
    assert_eq!(written[1].1["received"], "42");
    assert_eq!(written[3].1["body"], body);
}
