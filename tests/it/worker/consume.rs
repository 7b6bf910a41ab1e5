//! The real `shepherd work` binary: commits, poison entries, reclaim of a dead
//! consumer's entries, and graceful shutdown.

use std::time::Duration;

use super::{REPO, history, internal_fields, pending, pr_sync, webhook_fields, xadd};
use crate::support::redis::{RedisServer, xlen};
use crate::support::shepherd::Shepherd;
use crate::support::{QUIET_POLICY, poll_until_named};

/// Generous bound for a condition the worker should reach quickly.
const WAIT: Duration = Duration::from_secs(20);

/// Starts `shepherd work` on `redis` with `prefix` and extra settings, under the quiet
/// policy (these tests count history entries: no timer may add one).
async fn worker(redis: &RedisServer, prefix: &str, env: &[(&str, &str)]) -> Shepherd {
    let mut b = Shepherd::builder(redis)
        .args(["work"])
        .prefix(prefix)
        .policy(QUIET_POLICY);
    for (k, v) in env {
        b = b.env(k, *v);
    }
    b.start().await
}

#[tokio::test]
async fn poison_entries_are_dead_lettered_with_a_reason_and_acked() {
    let redis = RedisServer::start();
    let keys = shepherd::store::Keys::new("poison", 1);
    let mut conn = redis.conn().await;
    let events = keys.events(0);
    let body = String::from_utf8(pr_sync(7, 1)).unwrap();
    let good = xadd(
        &mut conn,
        &events,
        &webhook_fields("pull_request_sync", "d-good", &body),
    )
    .await;
    xadd(
        &mut conn,
        &events,
        &webhook_fields("pull_request_sync", "d-bad", "{not json"),
    )
    .await;
    xadd(
        &mut conn,
        &events,
        &internal_fields("timer/ci-poll", "{\"type\":\"no-such-event\"}"),
    )
    .await;
    xadd(&mut conn, &events, &[("kind", "martian"), ("body", "{}")]).await;
    let _w = worker(&redis, "poison", &[]).await;
    poll_until_named(WAIT, "three dead letters", || {
        let mut c = conn.clone();
        let dead = keys.dead_letters(0);
        async move { xlen(&mut c, &dead).await == 3 }
    })
    .await;
    poll_until_named(WAIT, "nothing pending", || {
        let mut c = conn.clone();
        let events = events.clone();
        async move { pending(&mut c, &events).await == 0 }
    })
    .await;
    let dead = crate::support::redis::stream_entries(&mut conn, &keys.dead_letters(0)).await;
    let reasons: Vec<&str> = dead.iter().map(|(_, f)| f["dl_reason"].as_str()).collect();
    assert!(
        reasons.iter().any(|r| r.starts_with("undecodable webhook")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("undecodable internal event")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("unknown entry kind")),
        "{reasons:?}"
    );
    assert!(
        dead.iter()
            .any(|(_, f)| f.get("delivery").map(String::as_str) == Some("d-bad"))
    );
    let h = history(&mut conn, &keys.history(REPO, 7)).await;
    assert_eq!(h.len(), 1, "the good entry is committed: {h:?}");
    assert_eq!(h[0]["entry"], good);
}

#[tokio::test]
async fn entries_of_a_dead_consumer_are_reclaimed_and_committed() {
    let redis = RedisServer::start();
    let keys = shepherd::store::Keys::new("reclaim", 1);
    let mut conn = redis.conn().await;
    let events = keys.events(0);
    let _: () = redis::cmd("XGROUP")
        .arg(&["CREATE", &events, "workers", "0", "MKSTREAM"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 1..=5 {
        let body = String::from_utf8(pr_sync(n, 1)).unwrap();
        ids.push(
            xadd(
                &mut conn,
                &events,
                &webhook_fields("pull_request_sync", &format!("d{n}"), &body),
            )
            .await,
        );
    }
    // A consumer reads them and dies without acking.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg(&[
            "GROUP", "workers", "ghost", "COUNT", "10", "STREAMS", &events, ">",
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(pending(&mut conn, &events).await, 5);
    let _w = worker(&redis, "reclaim", &[("SHEPHERD_RECLAIM_IDLE_SECS", "1")]).await;
    poll_until_named(WAIT, "the ghost's entries are committed", || {
        let mut c = conn.clone();
        let events = events.clone();
        async move { pending(&mut c, &events).await == 0 }
    })
    .await;
    for (n, id) in (1..=5).zip(&ids) {
        let h = history(&mut conn, &keys.history(REPO, n)).await;
        assert_eq!(h.len(), 1, "PR {n}: {h:?}");
        assert_eq!(&h[0]["entry"], id);
    }
    assert_eq!(xlen(&mut conn, &keys.dead_letters(0)).await, 0);
}

#[tokio::test]
async fn an_entry_delivered_too_often_is_dead_lettered() {
    let redis = RedisServer::start();
    let keys = shepherd::store::Keys::new("toomany", 1);
    let mut conn = redis.conn().await;
    let events = keys.events(0);
    let _: () = redis::cmd("XGROUP")
        .arg(&["CREATE", &events, "workers", "0", "MKSTREAM"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let body = String::from_utf8(pr_sync(3, 1)).unwrap();
    xadd(
        &mut conn,
        &events,
        &webhook_fields("pull_request_sync", "d3", &body),
    )
    .await;
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg(&[
            "GROUP", "workers", "ghost", "COUNT", "10", "STREAMS", &events, ">",
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    // Max one delivery: the reclaim is the second, so the entry is poison.
    let _w = worker(
        &redis,
        "toomany",
        &[
            ("SHEPHERD_RECLAIM_IDLE_SECS", "1"),
            ("SHEPHERD_MAX_DELIVERIES", "1"),
        ],
    )
    .await;
    poll_until_named(WAIT, "the entry is dead-lettered", || {
        let mut c = conn.clone();
        let dead = keys.dead_letters(0);
        async move { xlen(&mut c, &dead).await == 1 }
    })
    .await;
    let dead = crate::support::redis::stream_entries(&mut conn, &keys.dead_letters(0)).await;
    assert!(
        dead[0].1["dl_reason"].starts_with("delivered 2 times"),
        "{:?}",
        dead[0].1
    );
    assert_eq!(pending(&mut conn, &events).await, 0);
    assert!(history(&mut conn, &keys.history(REPO, 3)).await.is_empty());
}

/// Events-history entries of PRs 1..=40 (one per committed entry).
async fn committed(
    conn: &mut crate::support::redis::TestConn,
    keys: &shepherd::store::Keys,
) -> usize {
    let mut total = 0;
    for n in 1..=40 {
        total += xlen(conn, &keys.history(REPO, n)).await;
    }
    total
}

#[tokio::test]
async fn sigterm_stops_between_entries_loses_nothing_and_exits_within_10s() {
    let redis = RedisServer::start();
    let keys = shepherd::store::Keys::new("term", 1);
    let mut conn = redis.conn().await;
    let events = keys.events(0);
    let mut w = worker(&redis, "term", &[]).await;
    for i in 0..400u32 {
        let n = u64::from(i % 40) + 1;
        let body = String::from_utf8(pr_sync(n, i)).unwrap();
        xadd(
            &mut conn,
            &events,
            &webhook_fields("pull_request_sync", &format!("t{i}"), &body),
        )
        .await;
    }
    poll_until_named(WAIT, "the worker has committed something", || {
        let mut c = conn.clone();
        let key = keys.history(REPO, 1);
        async move { xlen(&mut c, &key).await > 0 }
    })
    .await;
    let asked = std::time::Instant::now();
    w.terminate();
    let status = w.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "graceful exit: {status}");
    assert!(asked.elapsed() < Duration::from_secs(10));
    // Entries it had not finished are left pending, never acked: committed and pending
    // account for every entry read so far (the rest is still unread).
    let done = committed(&mut conn, &keys).await;
    let left = pending(&mut conn, &events).await as usize;
    let read: redis::streams::StreamInfoGroupsReply = redis::cmd("XINFO")
        .arg(&["GROUPS", &events])
        .query_async(&mut conn)
        .await
        .unwrap();
    let read = read.groups[0].entries_read.unwrap_or(0);
    assert_eq!(done + left, read, "committed {done} + pending {left}");
    // Entries read but never started were handed back uncounted: a graceful stop does
    // not bring a valid entry closer to the dead-letter stream.
    let details: redis::streams::StreamPendingCountReply = redis::cmd("XPENDING")
        .arg(&events)
        .arg("workers")
        .arg("-")
        .arg("+")
        .arg(1_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(details.ids.len(), left);
    for p in &details.ids {
        assert_eq!(p.times_delivered, 0, "entry {} left counted", p.id);
    }
    // A new worker takes the rest over: nothing was lost.
    let mut again = worker(&redis, "term", &[("SHEPHERD_RECLAIM_IDLE_SECS", "1")]).await;
    poll_until_named(WAIT, "all 400 entries committed", || {
        let (mut c, keys) = (conn.clone(), keys.clone());
        async move { committed(&mut c, &keys).await == 400 }
    })
    .await;
    again.terminate();
    assert!(again.wait_exit(Duration::from_secs(10)).await.success());
    assert_eq!(pending(&mut conn, &events).await, 0);
    let consumers: Vec<redis::Value> = redis::cmd("XINFO")
        .arg(&["CONSUMERS", &events, "workers"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        consumers.len() <= 1,
        "the idle one left the group: {consumers:?}"
    );
}
