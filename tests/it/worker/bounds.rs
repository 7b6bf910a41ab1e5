//! Hostile input through the real worker (issue 12): a PR body with 100,000
//! `Closes #N` is processed without stalling its shard and links only
//! `MAX_LINKED_ISSUES` issues; an oversized agent summary and a comment flood leave
//! bounded records and work items.

use std::time::Duration;

use serde_json::json;
use shepherd::core::record::{
    MAX_LINKED_ISSUES, MAX_PENDING_PER_LOGIN, MAX_SUMMARY_BYTES, PrRecord,
};

use super::{REPO, history, pr_sync, webhook_fields, xadd};
use crate::support::fake_forgejo::{Fault, NewPr};
use crate::support::redis::{RedisServer, stream_entries};
use crate::support::scenario::Scenario;
use crate::support::shepherd::Shepherd;
use crate::support::{QUIET_POLICY, poll_until_named};

/// The repository of the scenarios here.
const SREPO: &str = "acme/widgets";

/// Generous bound for a condition the worker should reach quickly.
const WAIT: Duration = Duration::from_secs(20);

/// `pr_sync(number, seq)` with `body` as the PR description.
pub fn pr_sync_with_body(number: u64, seq: u32, body: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_slice(&pr_sync(number, seq)).unwrap();
    v["pull_request"]["body"] = body.into();
    serde_json::to_string(&v).unwrap()
}

/// A PR body linking issues 1..=n.
pub fn many_links(n: u64) -> String {
    (1..=n).map(|i| format!("Closes #{i}\n")).collect()
}

/// Whether the `workers` group of `stream` has delivered `id` to a consumer.
async fn delivered(conn: &mut crate::support::redis::TestConn, stream: &str, id: &str) -> bool {
    let groups: redis::streams::StreamInfoGroupsReply = match redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(conn)
        .await
    {
        Ok(g) => g,
        Err(_) => return false,
    };
    let at = |x: &str| -> (u64, u64) {
        let (a, b) = x.split_once('-').unwrap_or((x, "0"));
        (a.parse().unwrap_or(0), b.parse().unwrap_or(0))
    };
    groups
        .groups
        .iter()
        .any(|g| g.name == "workers" && at(&g.last_delivered_id) >= at(id))
}

#[tokio::test]
async fn linked_issue_fan_out_of_100_000_links_is_capped_and_does_not_stall_the_shard() {
    let redis = RedisServer::start();
    let keys = shepherd::store::Keys::new("fanout", 1);
    let mut conn = redis.conn().await;
    let events = keys.events(0);
    // The fixture's author is a bot author here, so its linking PR holds the issues
    // (an outsider's open PR would leave the issue records untouched).
    let policy = format!("{QUIET_POLICY}bot_users = [\"cleveragents-bot\"]\n");
    let _w = Shepherd::builder(&redis)
        .args(["work"])
        .prefix("fanout")
        .policy(&policy)
        .start()
        .await;
    let hostile = pr_sync_with_body(7, 1, &many_links(100_000));
    let big = xadd(
        &mut conn,
        &events,
        &webhook_fields("pull_request_sync", "d-hostile", &hostile),
    )
    .await;
    // The unrelated PR arrives once the hostile entry is being processed, so it is in
    // a later batch of the same shard: it waits for the hostile entry to finish.
    poll_until_named(WAIT, "the hostile entry is read", || {
        let (mut c, events, big) = (conn.clone(), events.clone(), big.clone());
        async move { delivered(&mut c, &events, &big).await }
    })
    .await;
    let plain = String::from_utf8(pr_sync(8, 1)).unwrap();
    xadd(
        &mut conn,
        &events,
        &webhook_fields("pull_request_sync", "d-plain", &plain),
    )
    .await;
    poll_until_named(
        WAIT,
        "the unrelated PR on the same shard is committed",
        || {
            let mut c = conn.clone();
            let key = keys.history(REPO, 8);
            async move { !history(&mut c, &key).await.is_empty() }
        },
    )
    .await;

    let h = history(&mut conn, &keys.history(REPO, 7)).await;
    assert_eq!(h.len(), 1, "the hostile PR is committed too: {h:?}");
    assert_eq!(h[0]["entry"], big);
    let data: String = redis::cmd("HGET")
        .arg(keys.pr_record(REPO, 7))
        .arg("data")
        .query_async(&mut conn)
        .await
        .expect("the PR record");
    let record = PrRecord::from_json(&data).unwrap();
    let cap = MAX_LINKED_ISSUES as u64;
    assert_eq!(
        record.linked_issues(),
        (1..=cap).collect(),
        "the first MAX_LINKED_ISSUES links"
    );
    for n in [1, cap] {
        let exists: bool = redis::cmd("EXISTS")
            .arg(keys.issue_record(REPO, n))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(exists, "linked issue #{n} got the event");
    }
    let past: bool = redis::cmd("EXISTS")
        .arg(keys.issue_record(REPO, cap + 1))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!past, "issue #{} is past the cap", cap + 1);
}

/// A scenario PR by `alice` (with write access, so it gets agent work) whose head
/// fails CI; returns its number.
async fn open_red_pr(s: &Scenario) -> u64 {
    s.fake.set_permission(SREPO, "alice", "write");
    let n = s.fake.open_pr(SREPO, NewPr::new("alice", "Add y"));
    let sha = s.fake.head_sha(SREPO, n);
    s.fake
        .set_status(SREPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&s.fake.pr_opened(SREPO, n)).await;
    n
}

/// The stored JSON of scenario PR `n`.
async fn record_json(s: &Scenario, n: u64) -> String {
    redis::cmd("HGET")
        .arg(s.shepherd.keys().pr_record(SREPO, n))
        .arg("data")
        .query_async(&mut s.redis_conn())
        .await
        .expect("the PR record")
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_agent_summary_is_cut_and_later_work_items_stay_small() {
    let s = Scenario::start("").await;
    let n = open_red_pr(&s).await;
    let items = s.wait_work_items(1).await;
    let id = items[0]["id"].as_str().unwrap().to_owned();
    // 4.7 MB through the results stream (no HTTP body limit on that path).
    let huge = "y".repeat(4_700_000);
    let result = json!({"id": id, "outcome": "failed", "summary": huge}).to_string();
    let mut conn = s.redis_conn();
    let _: String = redis::cmd("XADD")
        .arg(s.shepherd.keys().results())
        .arg("*")
        .arg("result")
        .arg(&result)
        .query_async(&mut conn)
        .await
        .unwrap();
    // The same failure comes back: a second ci-fix carries the earlier attempt.
    let items = s.wait_work_items(2).await;
    let carried = items[1]["context"]["attempts"][0]["summary"]
        .as_str()
        .expect("the first attempt's summary");
    assert!(carried.len() <= MAX_SUMMARY_BYTES, "{}", carried.len());
    assert!(
        carried.ends_with("[truncated from 4700000 bytes]"),
        "says so"
    );
    let record = record_json(&s, n).await;
    assert!(record.len() < 100_000, "record of {} bytes", record.len());
    let events = s.shepherd.keys().events(0);
    for (id, fields) in stream_entries(&mut conn, &events).await {
        let body = fields.get("body").map_or(0, String::len);
        assert!(body < 100_000, "events entry {id} of {body} bytes");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_1_8_mb_comment_of_commands_leaves_at_most_max_pending_commands() {
    let s = Scenario::start("").await;
    let n = s.fake.open_pr(SREPO, NewPr::new("alice", "Add y"));
    let d = s.send(&s.fake.pr_opened(SREPO, n)).await;
    // The permission lookup fails, so the commands stay pending.
    let perm = format!("/repos/{SREPO}/collaborators/mallory/permission");
    s.fake.inject(Fault::on("GET", &perm));
    let flood = "/shepherd pause\n".repeat(112_500);
    assert!(flood.len() >= 1_800_000);
    for _ in 0..5 {
        let c = s.fake.add_comment(SREPO, n, "mallory", &flood);
        s.send(&s.fake.comment_created(SREPO, c)).await;
    }
    poll_until_named(WAIT, "the five comments are committed", || async {
        let h = crate::support::redis::stream_entries(
            &mut s.redis_conn(),
            &s.shepherd.keys().history(SREPO, n),
        )
        .await;
        h.len() >= 6 && h.iter().any(|(_, f)| f.get("delivery") == Some(&d))
    })
    .await;
    let record: serde_json::Value = serde_json::from_str(&record_json(&s, n).await).unwrap();
    let pending = record["work"]["pending_commands"].as_array().unwrap().len();
    assert_eq!(pending, MAX_PENDING_PER_LOGIN, "one login's share");
    assert_eq!(record["work"]["hold"], serde_json::Value::Null);
}
