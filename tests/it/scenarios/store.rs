//! The executor's store scripts on a real Redis: finishing an effect queues its events
//! once, a parked retry comes back with its bookkeeping, a dispatch is appended once per
//! effect id, and the merge and status-comment locks are each exclusive, released only
//! by their holder, and independent of each other.

use std::time::Duration;

use shepherd::core::event::Event;
use shepherd::store::effects::{self, InternalEvent};
use shepherd::store::keys::EXECUTORS_GROUP;
use shepherd::store::{Keys, Store, lock, streams};

use crate::support::redis::{RedisServer, stream_entries};

async fn store(redis: &RedisServer) -> Store {
    Store::connect(&redis.url(), Keys::new("fx", 1))
        .await
        .expect("connect")
}

/// Adds an effects-stream entry and delivers it to the `executors` group.
async fn delivered(store: &Store, fields: &[(&str, &str)]) -> String {
    let keys = store.keys();
    let mut conn = store.conn();
    streams::ensure_group(&mut conn, &keys.effects(0), EXECUTORS_GROUP)
        .await
        .unwrap();
    let mut cmd = redis::cmd("XADD");
    cmd.arg(keys.effects(0)).arg("*");
    for (k, v) in fields {
        cmd.arg(*k).arg(*v);
    }
    let _: String = cmd.query_async(&mut conn).await.unwrap();
    let read = streams::read_group(
        &mut conn,
        &keys.effects(0),
        EXECUTORS_GROUP,
        "c1",
        ">",
        10,
        Duration::from_millis(100),
    )
    .await
    .unwrap();
    read.last().expect("delivered").id.clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn scenario_store_finish_park_dispatch_and_lock() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let keys = store.keys().clone();
    let mut conn = store.conn();
    let mut check = redis.conn().await;

    // Finish: events queued once, even when a reclaimed copy finishes too.
    let event = Event::WorkResult {
        work_id: "o:r:pr:1:1".parse().unwrap(),
        outcome: shepherd::core::event::WorkOutcome::Failed,
        signature: None,
        summary: None,
        usage: None,
        stopped: None,
    };
    let internal = [InternalEvent::new("o/r/pr/1@2.0", 0, "o/r", &event, 42)];
    let first = delivered(&store, &[("id", "o/r/pr/1@2.0")]).await;
    let again = delivered(&store, &[("id", "o/r/pr/1@2.0")]).await;
    let ttl = Duration::from_secs(60);
    assert!(
        effects::finish(&mut conn, &keys, 0, &first, "o/r/pr/1@2.0", &internal, ttl)
            .await
            .unwrap()
    );
    assert!(
        !effects::finish(&mut conn, &keys, 0, &again, "o/r/pr/1@2.0", &internal, ttl)
            .await
            .unwrap()
    );
    assert!(
        effects::is_done(&mut conn, &keys, 0, "o/r/pr/1@2.0")
            .await
            .unwrap()
    );
    let events = stream_entries(&mut check, &keys.events(0)).await;
    assert_eq!(events.len(), 1);
    let (_, f) = &events[0];
    assert_eq!(f["kind"], "internal");
    assert_eq!(f["delivery"], "effect:o/r/pr/1@2.0:0");
    assert_eq!(f["received"], "42");
    assert_eq!(serde_json::from_str::<Event>(&f["body"]).unwrap(), event);
    assert_eq!(
        streams::pending_count(&mut conn, &keys.effects(0), EXECUTORS_GROUP)
            .await
            .unwrap(),
        0
    );

    // Park and pop: acked now, back on the stream when due, with its bookkeeping.
    let entry = delivered(&store, &[("id", "x@1.0"), ("kind", "comment")]).await;
    let fields = vec![
        ("id".to_owned(), "x@1.0".to_owned()),
        ("kind".to_owned(), "comment".to_owned()),
        ("attempt".to_owned(), "1".to_owned()),
        ("first_try".to_owned(), "7".to_owned()),
    ];
    effects::park_for_retry(&mut conn, &keys, 0, &entry, &fields, 1_000)
        .await
        .unwrap();
    assert_eq!(
        streams::pending_count(&mut conn, &keys.effects(0), EXECUTORS_GROUP)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        effects::pop_due_retries(&mut conn, &keys, 0, 999, 10)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        effects::pop_due_retries(&mut conn, &keys, 0, 1_000, 10)
            .await
            .unwrap(),
        1
    );
    assert_eq!(effects::retry_count(&mut conn, &keys, 0).await.unwrap(), 0);
    let back = stream_entries(&mut check, &keys.effects(0)).await;
    let (_, last) = back.last().unwrap();
    assert_eq!(
        (last["attempt"].as_str(), last["first_try"].as_str()),
        ("1", "7")
    );

    // Dispatch: once per effect id.
    let first = effects::append_dispatch(&mut conn, &keys, "e@1.0", "work", "{}", ttl)
        .await
        .unwrap();
    let again = effects::append_dispatch(&mut conn, &keys, "e@1.0", "work", "{}", ttl)
        .await
        .unwrap();
    assert!(first.is_some() && again.is_none());
    assert_eq!(stream_entries(&mut check, &keys.dispatch()).await.len(), 1);

    // Locks: each exclusive, released only by its holder; the merge lock and the
    // status-comment lock are separate keys, so one held never blocks the other.
    let merge = keys.merge_lock("o/r", "main");
    let status = keys.status_lock("o/r", 3);
    assert!(lock::try_lock(&mut conn, &merge, "a", ttl).await.unwrap());
    assert!(!lock::try_lock(&mut conn, &merge, "b", ttl).await.unwrap());
    assert!(
        lock::try_lock(&mut conn, &status, "s1", ttl).await.unwrap(),
        "a held merge lock does not hold the status comment"
    );
    assert!(
        !lock::try_lock(&mut conn, &status, "s2", ttl).await.unwrap(),
        "two status writers still exclude each other"
    );
    lock::unlock(&mut conn, &merge, "b").await.unwrap();
    assert!(!lock::try_lock(&mut conn, &merge, "b", ttl).await.unwrap());
    lock::unlock(&mut conn, &merge, "a").await.unwrap();
    assert!(lock::try_lock(&mut conn, &merge, "b", ttl).await.unwrap());
    assert!(
        !lock::try_lock(&mut conn, &status, "s2", ttl).await.unwrap(),
        "releasing the merge lock leaves the status lock held"
    );
    lock::unlock(&mut conn, &status, "s1").await.unwrap();
    assert!(lock::try_lock(&mut conn, &status, "s2", ttl).await.unwrap());
}

/// The merge lease (issue 16): exclusive; a busy answer names the holder and its time
/// left; renewed only by its own taking; lost by itself when not renewed; and a taking
/// that lost it (expired, then taken by another) is refused by the fence and cannot
/// release the new holder's lease.
#[tokio::test(flavor = "multi_thread")]
async fn merge_lease_is_exclusive_renewed_by_its_holder_and_fenced_once_lost() {
    use lock::{Lease, Taken};
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let mut conn = store.conn();
    let key = store.keys().merge_lock("o/r", "main");
    let ttl = Duration::from_millis(400);

    let Taken::Held(first) = Lease::try_take(&mut conn, &key, "w1", ttl).await.unwrap() else {
        panic!("a free lease is taken");
    };
    assert!(first.token().starts_with("w1:"), "{}", first.token());
    match Lease::try_take(&mut conn, &key, "w2", ttl).await.unwrap() {
        Taken::Busy { holder, remaining } => {
            assert_eq!(holder.as_deref(), Some(first.token()));
            assert!(
                remaining > Duration::ZERO && remaining <= ttl,
                "{remaining:?}"
            );
        }
        Taken::Held(_) => panic!("a held lease is not taken twice"),
    }
    // Renewed past its first lifetime, it is still held.
    for _ in 0..3 {
        tokio::time::sleep(ttl / 2).await;
        assert!(
            first.renew(&mut conn).await.unwrap(),
            "its holder renews it"
        );
    }
    assert!(matches!(
        Lease::try_take(&mut conn, &key, "w2", ttl).await.unwrap(),
        Taken::Busy { .. }
    ));
    // Not renewed (its holder died or paused), it runs out; another takes it.
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let Taken::Held(second) = Lease::try_take(&mut conn, &key, "w2", ttl).await.unwrap() else {
        panic!("an expired lease is free again");
    };
    assert!(
        !first.renew(&mut conn).await.unwrap(),
        "the old taking learns it lost the lease"
    );
    assert!(
        !first
            .extend(&mut conn, Duration::from_secs(60))
            .await
            .unwrap(),
        "the fence refuses the old taking"
    );
    first.release(&mut conn).await.unwrap();
    assert!(
        second.renew(&mut conn).await.unwrap(),
        "the old taking's release left the new holder's lease alone"
    );
    second.release(&mut conn).await.unwrap();
    assert!(matches!(
        Lease::try_take(&mut conn, &key, "w3", ttl).await.unwrap(),
        Taken::Held(_)
    ));
}

/// Merge waiters (issue 16): a release wakes the oldest waiter whose `merge-retry`
/// timer still exists by moving that timer to now (never later, never creating one);
/// a waiter whose timer is gone is dropped and the next one woken.
#[tokio::test(flavor = "multi_thread")]
async fn a_released_merge_lease_wakes_the_oldest_waiter_with_a_timer() {
    use lock::Waiter;
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let keys = store.keys();
    let mut conn = store.conn();
    let waiters = keys.merge_waiters("o/r", "main");
    let gone = Waiter::of_record(0, &keys.pr_record("o/r", 1));
    let first = Waiter::of_record(0, &keys.pr_record("o/r", 2));
    let second = Waiter::of_record(0, &keys.pr_record("o/r", 3));
    for (w, at) in [(&gone, 100), (&first, 200), (&second, 300)] {
        lock::add_waiter(&mut conn, &waiters, w, at).await.unwrap();
    }
    // Waiting again keeps the first place.
    lock::add_waiter(&mut conn, &waiters, &first, 999)
        .await
        .unwrap();
    for (w, due) in [(&first, 50_000), (&second, 60_000)] {
        let _: i64 = redis::cmd("ZADD")
            .arg(keys.timers(0))
            .arg(due)
            .arg(&w.timer_member)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let score = |member: String| {
        let mut conn = store.conn();
        let key = keys.timers(0);
        async move {
            let s: Option<f64> = redis::cmd("ZSCORE")
                .arg(key)
                .arg(member)
                .query_async(&mut conn)
                .await
                .unwrap();
            s
        }
    };
    let woken = lock::wake_next_waiter(&mut conn, keys, &waiters, 1_000)
        .await
        .unwrap();
    assert_eq!(
        woken.as_ref(),
        Some(&first),
        "the oldest waiter with a timer"
    );
    assert_eq!(score(first.timer_member.clone()).await, Some(1_000.0));
    assert_eq!(score(second.timer_member.clone()).await, Some(60_000.0));
    assert_eq!(
        score(gone.timer_member.clone()).await,
        None,
        "no timer is created for a waiter whose timer is gone"
    );
    // A wake never moves a timer later.
    let woken = lock::wake_next_waiter(&mut conn, keys, &waiters, 70_000)
        .await
        .unwrap();
    assert_eq!(woken, None, "second's timer is due before 70 s: not moved");
    assert_eq!(score(second.timer_member.clone()).await, Some(60_000.0));
    assert_eq!(
        lock::wake_next_waiter(&mut conn, keys, &waiters, 1)
            .await
            .unwrap(),
        None,
        "no waiters left"
    );
    lock::add_waiter(&mut conn, &waiters, &second, 5)
        .await
        .unwrap();
    lock::remove_waiter(&mut conn, &waiters, &second)
        .await
        .unwrap();
    assert_eq!(
        lock::wake_next_waiter(&mut conn, keys, &waiters, 1)
            .await
            .unwrap(),
        None,
        "a waiter that took the lease left the set"
    );
}
