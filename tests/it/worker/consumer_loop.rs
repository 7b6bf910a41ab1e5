//! The store's one consumer loop (`store::consumer`) on its own, against a real
//! redis-server, with a recording handler: the paths its three users (events, effects,
//! results) do not show through the binary — a group re-created after its stream is
//! deleted, own pending entries first, every outcome, held entries kept from the
//! reclaimer and acked later, the capacity bound, and a graceful stop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::streams::StreamPendingCountReply;
use shepherd::store::consumer::{self, Batch, Handled, Handler, Outcome, Source, Spec};
use shepherd::store::streams::Entry;
use shepherd::store::{Keys, Store};
use tokio_util::sync::CancellationToken;

use super::xadd;
use crate::support::poll_until_named;
use crate::support::redis::{RedisServer, stream_entries, xlen};

/// Generous bound for what the loop should do within a second or two.
const WAIT: Duration = Duration::from_secs(20);
/// The group of these tests.
const GROUP: &str = "testers";

/// What the handler answers for an entry, given how many times it has seen its id.
type Decide = dyn Fn(&Entry, usize, &Batch<'_>) -> Outcome + Send + Sync;

/// A handler that records what it is given and answers what `decide` says.
struct Recorder {
    /// Per call of `handle`: the entries `(id, deliveries, reclaimed)`.
    batches: Mutex<Vec<Vec<(String, u64, bool)>>>,
    /// `(id, reason)` of every `dead_lettered` call.
    dead: Mutex<Vec<(String, String)>>,
    /// Answer of `capacity`.
    capacity: AtomicUsize,
    /// The answer per entry.
    decide: Box<Decide>,
}

impl Recorder {
    fn new(
        decide: impl Fn(&Entry, usize, &Batch<'_>) -> Outcome + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            batches: Mutex::new(Vec::new()),
            dead: Mutex::new(Vec::new()),
            capacity: AtomicUsize::new(usize::MAX),
            decide: Box::new(decide),
        })
    }

    /// Every entry handed over, in order: `(id, deliveries, reclaimed)`.
    fn seen(&self) -> Vec<(String, u64, bool)> {
        self.batches
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    fn dead(&self) -> Vec<(String, String)> {
        self.dead.lock().unwrap().clone()
    }
}

impl Handler for Recorder {
    async fn handle(&self, batch: &Batch<'_>, entries: Vec<Entry>) -> Vec<Handled> {
        let mut record = Vec::new();
        let mut out = Vec::new();
        for entry in entries {
            let times = self
                .seen()
                .iter()
                .filter(|(id, _, _)| *id == entry.id)
                .count()
                + record
                    .iter()
                    .filter(|(id, _, _): &&(String, u64, bool)| *id == entry.id)
                    .count();
            record.push((entry.id.clone(), entry.deliveries, batch.reclaimed));
            let outcome = (self.decide)(&entry, times + 1, batch);
            out.push(Handled::new(entry, outcome));
        }
        self.batches.lock().unwrap().push(record);
        out
    }

    fn dead_lettered(&self, _source: &Source, entry: &Entry, reason: &str) {
        self.dead
            .lock()
            .unwrap()
            .push((entry.id.clone(), reason.to_owned()));
    }

    fn capacity(&self) -> usize {
        self.capacity.load(Ordering::SeqCst)
    }
}

/// A store on `redis` with the key prefix `prefix`.
async fn store(redis: &RedisServer, prefix: &str) -> Store {
    Store::connect(&redis.url(), Keys::new(prefix, 1))
        .await
        .expect("connect")
}

/// The loop's settings for one stream of `store`'s shard 0.
fn spec(store: &Store, consumer: &str, reclaim_idle: Duration, max_deliveries: u32) -> Spec {
    let keys = store.keys();
    Spec {
        group: GROUP.into(),
        consumer: consumer.into(),
        sources: vec![Source::new(
            keys.events(0),
            keys.dead_letters(0),
            0,
            "events:0",
        )],
        batch: 16,
        reclaim_idle,
        max_deliveries,
        metrics: None,
    }
}

/// Runs the loop in the background; the handle ends when it returns.
fn start<H: Handler>(
    store: &Store,
    spec: Spec,
    handler: Arc<H>,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let (store, stop) = (store.clone(), stop.clone());
    tokio::spawn(async move {
        consumer::run(&store, spec, handler, stop)
            .await
            .expect("the loop runs");
    })
}

/// The pending entries of `GROUP` on `stream`: id → (consumer, deliveries).
async fn pending(
    conn: &mut crate::support::redis::TestConn,
    stream: &str,
) -> HashMap<String, (String, usize)> {
    let reply: StreamPendingCountReply = redis::cmd("XPENDING")
        .arg(stream)
        .arg(GROUP)
        .arg("-")
        .arg("+")
        .arg(1000)
        .query_async(conn)
        .await
        .expect("XPENDING");
    reply
        .ids
        .into_iter()
        .map(|p| (p.id, (p.consumer, p.times_delivered)))
        .collect()
}

/// Consumer names of `GROUP` on `stream`.
async fn consumers(conn: &mut crate::support::redis::TestConn, stream: &str) -> Vec<String> {
    let info: redis::streams::StreamInfoConsumersReply = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(stream)
        .arg(GROUP)
        .query_async(conn)
        .await
        .expect("XINFO CONSUMERS");
    info.consumers.into_iter().map(|c| c.name).collect()
}

/// One test entry.
async fn add(conn: &mut crate::support::redis::TestConn, stream: &str, n: u32) -> String {
    let n = n.to_string();
    xadd(conn, stream, &[("n", n.as_str())]).await
}

/// Milliseconds since `id` was created, by the Redis clock.
async fn age_ms(conn: &mut crate::support::redis::TestConn, id: &str) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    let now = secs * 1000 + micros / 1000;
    let at: u64 = id.split('-').next().unwrap().parse().unwrap();
    now.saturating_sub(at)
}

#[tokio::test]
async fn every_outcome_is_carried_out_and_retries_come_back_reclaimed() {
    let redis = RedisServer::start();
    let store = store(&redis, "outcomes").await;
    let mut conn = redis.conn().await;
    let stream = store.keys().events(0);
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(add(&mut conn, &stream, n).await);
    }
    // Entry 0 is finished by the handler's own write (an XACK here, a commit script in
    // the worker), 1 acked by the loop, 2 is poison, 3 fails once and succeeds when it
    // comes back.
    let url = redis.url();
    let (group_stream, group) = (stream.clone(), GROUP);
    let rec = Recorder::new(move |e, times, _| match e.text("n").as_str() {
        "0" => {
            let mut c = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .expect("a connection of the handler's own");
            let acked: i64 = redis::cmd("XACK")
                .arg(&group_stream)
                .arg(group)
                .arg(&e.id)
                .query(&mut c)
                .expect("XACK");
            assert_eq!(acked, 1);
            Outcome::Finished
        }
        "1" => Outcome::Ack,
        "2" => Outcome::DeadLetter("not a test entry".into()),
        _ if times == 1 => Outcome::Retry,
        _ => Outcome::Ack,
    });
    let stop = CancellationToken::new();
    let task = start(
        &store,
        spec(&store, "c1", Duration::from_secs(1), 5),
        rec.clone(),
        &stop,
    );
    poll_until_named(
        WAIT,
        "the retried entry comes back and all are done",
        || {
            let (mut c, stream, rec) = (conn.clone(), stream.clone(), rec.clone());
            async move { rec.seen().len() == 5 && pending(&mut c, &stream).await.is_empty() }
        },
    )
    .await;
    let seen = rec.seen();
    assert_eq!(
        seen[..4].to_vec(),
        ids.iter()
            .map(|id| (id.clone(), 1, false))
            .collect::<Vec<_>>(),
        "first delivery of each, read (not reclaimed): {seen:?}"
    );
    assert_eq!(
        seen[4],
        (ids[3].clone(), 2, true),
        "the retry is reclaimed, counted"
    );
    let dead = stream_entries(&mut conn, &store.keys().dead_letters(0)).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].1["dl_reason"], "not a test entry");
    assert_eq!(dead[0].1["dl_id"], ids[2]);
    assert_eq!(dead[0].1["n"], "2", "the original fields travel along");
    assert_eq!(
        rec.dead(),
        vec![(ids[2].clone(), "not a test entry".to_owned())]
    );
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn entries_delivered_too_often_are_dead_lettered_before_the_handler() {
    let redis = RedisServer::start();
    let store = store(&redis, "toooften").await;
    let mut conn = redis.conn().await;
    let stream = store.keys().events(0);
    let _: () = redis::cmd("XGROUP")
        .arg(&["CREATE", &stream, GROUP, "0", "MKSTREAM"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let id = add(&mut conn, &stream, 1).await;
    // A consumer reads it and dies; with at most one delivery, the reclaim is poison.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg(&[
            "GROUP", GROUP, "ghost", "COUNT", "10", "STREAMS", &stream, ">",
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let rec = Recorder::new(|_, _, _| Outcome::Ack);
    let stop = CancellationToken::new();
    let task = start(
        &store,
        spec(&store, "c1", Duration::from_secs(1), 1),
        rec.clone(),
        &stop,
    );
    poll_until_named(WAIT, "the entry is dead-lettered", || {
        let rec = rec.clone();
        async move { !rec.dead().is_empty() }
    })
    .await;
    let dead = rec.dead();
    assert_eq!(dead[0].0, id);
    assert!(dead[0].1.starts_with("delivered 2 times"), "{dead:?}");
    assert!(rec.seen().is_empty(), "the handler never saw it");
    assert!(pending(&mut conn, &stream).await.is_empty(), "acked");
    assert_eq!(xlen(&mut conn, &store.keys().dead_letters(0)).await, 1);
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn own_pending_entries_come_first_and_a_deleted_stream_gets_its_group_back() {
    let redis = RedisServer::start();
    let store = store(&redis, "ownfirst").await;
    let mut conn = redis.conn().await;
    let stream = store.keys().events(0);
    let _: () = redis::cmd("XGROUP")
        .arg(&["CREATE", &stream, GROUP, "0", "MKSTREAM"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let mine = add(&mut conn, &stream, 1).await;
    // An earlier process under the same name read it and stopped without acking.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg(&["GROUP", GROUP, "c1", "COUNT", "10", "STREAMS", &stream, ">"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let new = add(&mut conn, &stream, 2).await;
    let rec = Recorder::new(|_, _, _| Outcome::Ack);
    let stop = CancellationToken::new();
    // A reclaim idle time far beyond the test: only the read of own entries finds it.
    let task = start(
        &store,
        spec(&store, "c1", Duration::from_secs(600), 5),
        rec.clone(),
        &stop,
    );
    poll_until_named(WAIT, "both entries are handled", || {
        let rec = rec.clone();
        async move { rec.seen().len() == 2 }
    })
    .await;
    let batches = rec.batches.lock().unwrap().clone();
    assert_eq!(
        batches[0],
        vec![(mine.clone(), 2, false)],
        "own pending first: {batches:?}"
    );
    assert_eq!(batches[1], vec![(new.clone(), 1, false)], "{batches:?}");
    // The stream goes away (and its group with it); the loop makes the group again.
    let _: i64 = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut conn)
        .await
        .unwrap();
    poll_until_named(WAIT, "the group is back", || {
        let (mut c, stream) = (conn.clone(), stream.clone());
        async move {
            let groups: Result<redis::streams::StreamInfoGroupsReply, _> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&stream)
                .query_async(&mut c)
                .await;
            groups.is_ok_and(|g| g.groups.iter().any(|g| g.name == GROUP))
        }
    })
    .await;
    let after = add(&mut conn, &stream, 3).await;
    poll_until_named(WAIT, "the entry after the deletion is handled", || {
        let rec = rec.clone();
        let after = after.clone();
        async move { rec.seen().iter().any(|(id, _, _)| *id == after) }
    })
    .await;
    assert!(pending(&mut conn, &stream).await.is_empty());
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn held_entries_are_not_reclaimed_until_released_and_acks_end_them() {
    let redis = RedisServer::start();
    let store = store(&redis, "held").await;
    let mut conn = redis.conn().await;
    let stream = store.keys().events(0);
    let idle = Duration::from_secs(1);
    // c1 holds every entry (a long job) and keeps the handle to finish them later.
    let holder: Arc<Mutex<Option<consumer::Held>>> = Arc::new(Mutex::new(None));
    let keep = holder.clone();
    let c1 = Recorder::new(move |e, _, b| {
        b.held.hold(&b.source.stream, &e.id);
        *keep.lock().unwrap() = Some(b.held.clone());
        Outcome::Held
    });
    let c2 = Recorder::new(|_, _, _| Outcome::Ack);
    let stop = CancellationToken::new();
    let t1 = start(&store, spec(&store, "c1", idle, 5), c1.clone(), &stop);
    let acked = add(&mut conn, &stream, 1).await;
    let released = add(&mut conn, &stream, 2).await;
    poll_until_named(WAIT, "c1 holds both", || {
        let c1 = c1.clone();
        async move { c1.seen().len() == 2 }
    })
    .await;
    let t2 = start(&store, spec(&store, "c2", idle, 5), c2.clone(), &stop);
    // Several reclaim idle times pass with c2's reclaimer scanning every second.
    poll_until_named(WAIT, "four reclaim idle times have passed", || {
        let (mut c, id) = (conn.clone(), released.clone());
        async move { age_ms(&mut c, &id).await >= 4 * 1000 }
    })
    .await;
    let p = pending(&mut conn, &stream).await;
    assert_eq!(
        p[&acked],
        ("c1".to_owned(), 1),
        "still c1's, uncounted: {p:?}"
    );
    assert_eq!(p[&released], ("c1".to_owned(), 1), "{p:?}");
    assert!(
        c2.seen().is_empty(),
        "c2 reclaimed a held entry: {:?}",
        c2.seen()
    );
    let held = holder.lock().unwrap().clone().expect("c1 kept the handle");
    assert_eq!(held.len(), 2);
    held.ack(&stream, &acked).await.expect("ack");
    held.release(&stream, &released);
    assert!(!held.contains(&stream, &acked) && !held.contains(&stream, &released));
    // The released one is no longer kept: after the idle time c2 (or c1) reclaims it.
    poll_until_named(WAIT, "the released entry is reclaimed", || {
        let (c1, c2, id) = (c1.clone(), c2.clone(), released.clone());
        async move {
            c2.seen()
                .iter()
                .chain(c1.seen().iter())
                .any(|(i, n, r)| *i == id && *n == 2 && *r)
        }
    })
    .await;
    let p = pending(&mut conn, &stream).await;
    assert!(!p.contains_key(&acked), "the acked one is done: {p:?}");
    stop.cancel();
    t1.await.unwrap();
    t2.await.unwrap();
}

#[tokio::test]
async fn reads_never_ask_for_more_than_the_handler_has_room_for() {
    let redis = RedisServer::start();
    let store = store(&redis, "room").await;
    let mut conn = redis.conn().await;
    let stream = store.keys().events(0);
    for n in 0..5 {
        add(&mut conn, &stream, n).await;
    }
    let rec = Recorder::new(|_, _, _| Outcome::Ack);
    rec.capacity.store(0, Ordering::SeqCst);
    let stop = CancellationToken::new();
    let task = start(
        &store,
        spec(&store, "c1", Duration::from_secs(600), 5),
        rec.clone(),
        &stop,
    );
    // No room: the reader is up (it made the group) and waits for room.
    poll_until_named(WAIT, "the reader has made the group", || {
        let (mut c, stream) = (conn.clone(), stream.clone());
        async move {
            let groups: Result<redis::streams::StreamInfoGroupsReply, _> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&stream)
                .query_async(&mut c)
                .await;
            groups.is_ok_and(|g| g.groups.iter().any(|g| g.name == GROUP))
        }
    })
    .await;
    rec.capacity.store(2, Ordering::SeqCst);
    poll_until_named(WAIT, "all five are handled", || {
        let rec = rec.clone();
        async move { rec.seen().len() == 5 }
    })
    .await;
    // A read while there was no room, or one that ignored it, takes all five at once.
    let sizes: Vec<usize> = rec.batches.lock().unwrap().iter().map(Vec::len).collect();
    assert!(
        sizes.iter().all(|&n| n <= 2),
        "batches of at most 2: {sizes:?}"
    );
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_stop_hands_back_unstarted_entries_and_leaves_the_group_only_when_empty() {
    let redis = RedisServer::start();
    let store = store(&redis, "stop").await;
    let mut conn = redis.conn().await;
    let stream = store.keys().events(0);
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(add(&mut conn, &stream, n).await);
    }
    // The first entry is done; then the stop comes, and the rest are never started.
    let stop = CancellationToken::new();
    let fire = stop.clone();
    let rec = Recorder::new(move |e, _, b| {
        if b.stop.is_cancelled() {
            return Outcome::NotStarted;
        }
        if e.text("n") == "0" {
            fire.cancel();
        }
        Outcome::Ack
    });
    let task = start(
        &store,
        spec(&store, "c1", Duration::from_secs(600), 5),
        rec.clone(),
        &stop,
    );
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the loop returns after the stop")
        .unwrap();
    let p = pending(&mut conn, &stream).await;
    assert_eq!(p.len(), 3, "{p:?}");
    for id in &ids[1..] {
        assert_eq!(p[id], ("c1".to_owned(), 0), "handed back uncounted: {p:?}");
    }
    assert_eq!(
        consumers(&mut conn, &stream).await,
        vec!["c1".to_owned()],
        "it holds entries: it stays in the group"
    );
    // A second run takes the rest over (as the same consumer) and then leaves.
    let stop = CancellationToken::new();
    let rest = Recorder::new(|_, _, _| Outcome::Ack);
    let task = start(
        &store,
        spec(&store, "c1", Duration::from_secs(600), 5),
        rest.clone(),
        &stop,
    );
    poll_until_named(WAIT, "the rest is handled", || {
        let (mut c, stream) = (conn.clone(), stream.clone());
        async move { pending(&mut c, &stream).await.is_empty() }
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    assert!(
        consumers(&mut conn, &stream).await.is_empty(),
        "it left the group"
    );
}
