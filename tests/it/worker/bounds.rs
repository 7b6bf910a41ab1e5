//! Hostile input through the real `shepherd work` binary (issue 12): a PR body with
//! 100,000 `Closes #N` is processed without stalling its shard and links only
//! `MAX_LINKED_ISSUES` issues.

use std::time::Duration;

use shepherd::core::record::{MAX_LINKED_ISSUES, PrRecord};

use super::{REPO, history, pr_sync, webhook_fields, xadd};
use crate::support::redis::RedisServer;
use crate::support::shepherd::Shepherd;
use crate::support::{QUIET_POLICY, poll_until_named};

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
async fn delivered(conn: &mut redis::aio::MultiplexedConnection, stream: &str, id: &str) -> bool {
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
    let _w = Shepherd::builder(&redis)
        .args(["work"])
        .prefix("fanout")
        .policy(QUIET_POLICY)
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
