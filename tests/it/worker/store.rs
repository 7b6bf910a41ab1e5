//! The store's Lua scripts against a real redis-server: compare-and-set commits,
//! exactly-once commits of an entry, timers popped exactly once by concurrent pollers,
//! dead letters, and reclaim of a dead consumer's entries.

use std::collections::HashSet;
use std::time::Duration;

use shepherd::store::commit::{self, CommitOutcome, CommitPlan, RecordWrite, TimerWrite};
use shepherd::store::keys::WORKERS_GROUP;
use shepherd::store::{Keys, Store, streams, timers};

use crate::support::redis::{RedisServer, stream_entries, xlen};

/// A store with a unique prefix on `redis`.
async fn store(redis: &RedisServer, prefix: &str) -> Store {
    Store::connect(&redis.url(), Keys::new(prefix, 1))
        .await
        .expect("connect")
}

/// Queues an internal entry on shard 0 and reads it as `consumer`; returns its id.
async fn pending_entry(store: &Store, consumer: &str) -> String {
    let mut conn = store.conn();
    let stream = store.keys().events(0);
    streams::ensure_group(&mut conn, &stream, WORKERS_GROUP)
        .await
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg(&[
            "kind", "internal", "delivery", "d", "event", "e", "repo", "o/r", "received", "0",
            "body", "{}",
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let read = streams::read_group(
        &mut conn,
        &stream,
        WORKERS_GROUP,
        consumer,
        ">",
        1,
        Duration::from_millis(10),
    )
    .await
    .unwrap();
    read[0].id.clone()
}

/// A plan that writes `o/r#1` from version `expect`, for `entry`.
fn plan_for(keys: &Keys, entry: &str, expect: u64, data: &str) -> CommitPlan {
    CommitPlan {
        shard: 0,
        entry_id: Some(entry.to_owned()),
        records: vec![RecordWrite {
            key: keys.pr_record("o/r", 1),
            history_key: keys.history("o/r", 1),
            index_key: keys.repo_index("o/r"),
            expect,
            data: Some(data.to_owned()),
            phase: "awaiting-ci".into(),
            history: vec![("entry".into(), entry.to_owned())],
            indexed: true,
        }],
        effects: vec![vec![
            ("id".into(), format!("fx-{entry}")),
            ("kind".into(), "comment".into()),
        ]],
        ended_ttl_secs: 60,
        ..CommitPlan::default()
    }
}

#[tokio::test]
async fn concurrent_commits_on_one_version_one_wins_the_other_retries() {
    let redis = RedisServer::start();
    let store = store(&redis, "cas").await;
    let keys = store.keys().clone();
    let a = pending_entry(&store, "c1").await;
    let b = pending_entry(&store, "c2").await;
    let (pa, pb) = (plan_for(&keys, &a, 0, "A"), plan_for(&keys, &b, 0, "B"));
    let (mut c1, mut c2) = (store.conn(), store.conn());
    let (ra, rb) = tokio::join!(
        commit::commit(&mut c1, &keys, &pa),
        commit::commit(&mut c2, &keys, &pb)
    );
    let outcomes = [ra.unwrap(), rb.unwrap()];
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == CommitOutcome::Committed)
            .count(),
        1,
        "{outcomes:?}"
    );
    assert!(
        outcomes.contains(&CommitOutcome::Conflict { index: 0, found: 1 }),
        "{outcomes:?}"
    );
    // The loser reloads (version 1) and commits on top.
    let loser = if outcomes[0] == CommitOutcome::Committed {
        &b
    } else {
        &a
    };
    let retry = plan_for(&keys, loser, 1, "AB");
    assert_eq!(
        commit::commit(&mut c1, &keys, &retry).await.unwrap(),
        CommitOutcome::Committed
    );
    let stored = commit::load(&mut c1, &keys.pr_record("o/r", 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((stored.version, stored.data.as_str()), (2, "AB"));
    let mut conn = redis.conn().await;
    assert_eq!(
        xlen(&mut conn, &keys.history("o/r", 1)).await,
        2,
        "one history entry per commit"
    );
    assert_eq!(
        xlen(&mut conn, &keys.effects(0)).await,
        2,
        "effects only of the commits that won"
    );
    assert_eq!(
        streams::pending_count(&mut c1, &keys.events(0), WORKERS_GROUP)
            .await
            .unwrap(),
        0,
        "both acked"
    );
}

#[tokio::test]
async fn an_entry_committed_by_one_consumer_is_stale_for_another() {
    let redis = RedisServer::start();
    let store = store(&redis, "stale").await;
    let keys = store.keys().clone();
    let id = pending_entry(&store, "slow").await;
    let mut conn = store.conn();
    // Another consumer reclaims it (idle 0) and commits it first.
    let (_, claimed) = streams::autoclaim(
        &mut conn,
        &keys.events(0),
        WORKERS_GROUP,
        "fast",
        Duration::ZERO,
        "0-0",
        10,
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].deliveries, 2, "the claim counts as a delivery");
    let first = commit::commit(&mut conn, &keys, &plan_for(&keys, &id, 0, "fast"))
        .await
        .unwrap();
    assert_eq!(first, CommitOutcome::Committed);
    // The slow consumer's commit of the same entry (even on the right version) is refused.
    let second = commit::commit(&mut conn, &keys, &plan_for(&keys, &id, 1, "slow"))
        .await
        .unwrap();
    assert_eq!(second, CommitOutcome::Stale);
    let stored = commit::load(&mut conn, &keys.pr_record("o/r", 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.data, "fast");
    let mut raw = redis.conn().await;
    assert_eq!(xlen(&mut raw, &keys.history("o/r", 1)).await, 1);
}

#[tokio::test]
async fn timers_pop_exactly_once_with_two_pollers() {
    let redis = RedisServer::start();
    let store = store(&redis, "tmr").await;
    let keys = store.keys().clone();
    let mut conn = store.conn();
    const N: usize = 600;
    let plan = CommitPlan {
        shard: 0,
        timers: (0..N)
            .map(|i| TimerWrite {
                due_ms: 1_000 + i as u64,
                record: keys.pr_record("o/r", i as u64),
                id: "ci-poll".into(),
                repo: "o/r".into(),
                event: "timer/ci-poll".into(),
                body: format!("{{\"n\":{i}}}\tafter a tab"),
            })
            .collect(),
        ..CommitPlan::default()
    };
    assert_eq!(
        commit::commit(&mut conn, &keys, &plan).await.unwrap(),
        CommitOutcome::Committed
    );
    // Rescheduling the same timer id replaces it (one member per record and id).
    assert_eq!(timers::count(&mut conn, &keys, 0).await.unwrap(), N as u64);
    assert_eq!(
        commit::commit(&mut conn, &keys, &plan).await.unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(timers::count(&mut conn, &keys, 0).await.unwrap(), N as u64);
    let poller = |mut c: shepherd::store::Conn, keys: Keys| async move {
        let mut total = 0;
        loop {
            let n = timers::pop_due(&mut c, &keys, 0, 10_000, 7).await.unwrap();
            if n == 0 {
                return total;
            }
            total += n;
        }
    };
    let (a, b) = tokio::join!(
        poller(store.conn(), keys.clone()),
        poller(store.conn(), keys.clone())
    );
    assert_eq!(a + b, N, "every timer popped once ({a} + {b})");
    let mut raw = redis.conn().await;
    let entries = stream_entries(&mut raw, &keys.events(0)).await;
    assert_eq!(entries.len(), N);
    let bodies: HashSet<&str> = entries.iter().map(|(_, f)| f["body"].as_str()).collect();
    assert_eq!(bodies.len(), N, "each timer's own event, once");
    let (_, first) = &entries[0];
    assert_eq!(first["kind"], "internal");
    assert_eq!(first["event"], "timer/ci-poll");
    assert_eq!(first["repo"], "o/r");
    assert!(
        first["body"].ends_with("}\tafter a tab"),
        "{}",
        first["body"]
    );
    assert_eq!(timers::count(&mut conn, &keys, 0).await.unwrap(), 0);
    // Not yet due: nothing pops.
    let later = CommitPlan {
        timers: vec![TimerWrite {
            due_ms: 50_000,
            ..plan.timers[0].clone()
        }],
        ..CommitPlan::default()
    };
    commit::commit(&mut conn, &keys, &later).await.unwrap();
    assert_eq!(
        timers::pop_due(&mut conn, &keys, 0, 10_000, 10)
            .await
            .unwrap(),
        0
    );
}

#[tokio::test]
async fn dead_letter_keeps_the_reason_and_the_fields_and_acks() {
    let redis = RedisServer::start();
    let store = store(&redis, "dl").await;
    let keys = store.keys().clone();
    let id = pending_entry(&store, "c").await;
    let mut conn = store.conn();
    let moved = streams::dead_letter(
        &mut conn,
        &keys.events(0),
        &keys.dead_letters(0),
        WORKERS_GROUP,
        &id,
        "undecodable",
        3,
    )
    .await
    .unwrap();
    assert!(moved);
    assert_eq!(
        streams::pending_count(&mut conn, &keys.events(0), WORKERS_GROUP)
            .await
            .unwrap(),
        0
    );
    let mut raw = redis.conn().await;
    let dead = stream_entries(&mut raw, &keys.dead_letters(0)).await;
    assert_eq!(dead.len(), 1);
    let f = &dead[0].1;
    assert_eq!(f["dl_reason"], "undecodable");
    assert_eq!(f["dl_id"], id);
    assert_eq!(f["dl_deliveries"], "3");
    assert_eq!(f["delivery"], "d", "original fields are kept");
    // A second attempt finds nothing pending and writes nothing.
    let again = streams::dead_letter(
        &mut conn,
        &keys.events(0),
        &keys.dead_letters(0),
        WORKERS_GROUP,
        &id,
        "x",
        4,
    )
    .await
    .unwrap();
    assert!(!again);
    assert_eq!(xlen(&mut raw, &keys.dead_letters(0)).await, 1);
}

/// Finding 6 of issue 12: a pipeline over zero keys (a repository with no open PR
/// record) was sent to Redis as an empty command and failed; it must answer "nothing".
/// A plan that writes no record must still commit and acknowledge its entry.
#[tokio::test]
async fn empty_key_lists_are_answered_empty_not_sent_as_an_empty_command() {
    let redis = RedisServer::start();
    let store = store(&redis, "empty").await;
    let mut conn = store.conn();
    let none = commit::load_many(&mut conn, &[])
        .await
        .expect("no keys, no error");
    assert!(none.is_empty());

    let entry = pending_entry(&store, "c1").await;
    let plan = CommitPlan {
        shard: 0,
        entry_id: Some(entry),
        ended_ttl_secs: 60,
        ..CommitPlan::default()
    };
    let outcome = commit::commit(&mut conn, store.keys(), &plan).await;
    assert!(
        matches!(outcome, Ok(CommitOutcome::Committed)),
        "{outcome:?}"
    );
    let pending: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
        .arg(store.keys().events(0))
        .arg(WORKERS_GROUP)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(pending.count(), 0, "the entry is acknowledged");
}

/// Appends entries `ms-1 ..= ms-n` (explicit, long-past ids) to `stream`.
async fn old_entries(conn: &mut shepherd::store::Conn, stream: &str, ms: u64, n: u64) {
    for seq in 1..=n {
        let _: String = redis::cmd("XADD")
            .arg(stream)
            .arg(format!("{ms}-{seq}"))
            .arg(&["kind", "internal"])
            .query_async(conn)
            .await
            .unwrap();
    }
}

/// Issue 12 (by reading): streams were trimmed by age even where a consumer group had
/// not acknowledged, and dispatch/results/dead letters never. Only entries older than
/// the bound that every group has delivered and acknowledged may go.
#[tokio::test]
async fn trimming_never_drops_what_a_consumer_group_has_not_acknowledged() {
    let redis = RedisServer::start();
    let store = store(&redis, "trim").await;
    let mut conn = store.conn();
    let mut check = redis.conn().await;
    let now = streams::now_ms();
    let stream = "trim:grouped";
    old_entries(&mut conn, stream, 1000, 10).await;
    streams::ensure_group(&mut conn, stream, "g").await.unwrap();
    let read = streams::read_group(
        &mut conn,
        stream,
        "g",
        "c",
        ">",
        6,
        Duration::from_millis(10),
    )
    .await
    .unwrap();
    assert_eq!(read.len(), 6);
    for seq in [1, 2, 3, 5] {
        let _: i64 = redis::cmd("XACK")
            .arg(stream)
            .arg("g")
            .arg(format!("1000-{seq}"))
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    // 1000-4 and 1000-6 are pending, 1000-7.. were never delivered: only 1..3 may go.
    let trimmed = streams::trim_acknowledged(&mut conn, stream, now)
        .await
        .unwrap();
    assert_eq!(trimmed, 3);
    assert_eq!(xlen(&mut check, stream).await, 7);

    // A second group that has read nothing holds everything.
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg("late")
        .arg("0")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: i64 = redis::cmd("XACK")
        .arg(stream)
        .arg("g")
        .arg("1000-4")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        streams::trim_acknowledged(&mut conn, stream, now)
            .await
            .unwrap(),
        0
    );

    // No group (dispatch, dead letters): by age only; the young entries stay.
    let plain = "trim:plain";
    old_entries(&mut conn, plain, 1000, 4).await;
    old_entries(&mut conn, plain, now + 60_000, 2).await;
    assert_eq!(
        streams::trim_acknowledged(&mut conn, plain, now)
            .await
            .unwrap(),
        4
    );
    assert_eq!(xlen(&mut check, plain).await, 2);
    assert_eq!(
        streams::trim_acknowledged(&mut conn, "trim:missing", now)
            .await
            .unwrap(),
        0
    );
}

/// Entries a stopping worker read but never started go back uncounted and at once
/// reclaimable; the entry it did start keeps its count (issue 12's review: five graceful
/// restarts during a backlog would otherwise dead-letter valid entries).
#[tokio::test]
async fn entries_given_back_at_shutdown_are_uncounted_and_reclaimable_at_once() {
    let redis = RedisServer::start();
    let store = store(&redis, "giveback").await;
    let ids = [
        pending_entry(&store, "w1").await,
        pending_entry(&store, "w1").await,
        pending_entry(&store, "w1").await,
    ];
    let stream = store.keys().events(0);
    let mut conn = store.conn();
    let back = [ids[1].as_str(), ids[2].as_str()];
    streams::give_back(
        &mut conn,
        &stream,
        WORKERS_GROUP,
        "w1",
        &back,
        Duration::from_secs(60),
    )
    .await
    .expect("give back");
    let details: redis::streams::StreamPendingCountReply = redis::cmd("XPENDING")
        .arg(&stream)
        .arg(WORKERS_GROUP)
        .arg("-")
        .arg("+")
        .arg(10)
        .query_async(&mut conn)
        .await
        .unwrap();
    let by_id: std::collections::HashMap<_, _> =
        details.ids.iter().map(|p| (p.id.clone(), p)).collect();
    assert_eq!(by_id.len(), 3, "nothing is acked or lost");
    assert_eq!(
        by_id[&ids[0]].times_delivered, 1,
        "the started entry keeps its count"
    );
    for id in &back {
        let p = by_id[*id];
        assert_eq!(p.times_delivered, 0, "{id} is uncounted");
        assert!(p.last_delivered_ms >= 60_000, "{id} is reclaimable at once");
        assert_eq!(p.consumer, "w1");
    }
    // Another consumer's reclaim (idle 30 s) takes exactly the two at once.
    let (_, claimed) = streams::autoclaim(
        &mut conn,
        &stream,
        WORKERS_GROUP,
        "w2",
        Duration::from_secs(30),
        "0-0",
        10,
    )
    .await
    .expect("autoclaim");
    let mut got: Vec<String> = claimed.iter().map(|e| e.id.clone()).collect();
    got.sort();
    let mut want: Vec<String> = back.iter().map(|s| (*s).to_owned()).collect();
    want.sort();
    assert_eq!(got, want);
    assert!(
        claimed.iter().all(|e| e.deliveries == 1),
        "the claim is their first delivery"
    );
}
