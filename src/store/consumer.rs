//! The one consumer loop: everything about reading a Redis stream in a consumer group,
//! for every reader Shepherd has — the events streams (group `workers`), the effects
//! streams (`executors`), the results stream (`results`), and any new one (the agent
//! runner on `<prefix>:dispatch`, group `agents`, is meant to move here from its own
//! `agents/consume.rs`). The loop owns delivery; its user, a
//! [`Handler`], owns only what an entry means.
//!
//! What [`run`] does for a [`Spec`] (one group, one or more source streams):
//!
//! - **Group**: creates the group (and the stream) from the stream's start, and again
//!   whenever a read finds it missing (the stream was deleted).
//! - **Reading**: one reader per source, on a dedicated blocking connection: first this
//!   consumer's own pending entries (a restart under the same name), paging by id so
//!   that an entry which keeps failing is left to the reclaimer, then new entries
//!   (`XREADGROUP … COUNT batch BLOCK 1000`).
//! - **Reclaim**: every reclaim idle time / 2 (1 s … 30 s), a full `XAUTOCLAIM` scan of
//!   every source for entries idle at least the reclaim idle time: entries of dead
//!   consumers, and this consumer's own entries left pending after a failure.
//! - **Poison**: an entry delivered more than `max_deliveries` times goes to its
//!   source's dead-letter stream without reaching the handler, and so does an entry the
//!   handler answers [`Outcome::DeadLetter`] for (`streams::dead_letter`: moved and
//!   acked in one script).
//! - **Shutdown**: readers stop between batches and the handler gets the token; entries
//!   it did not start ([`Outcome::NotStarted`]) go back to the group uncounted and at
//!   once reclaimable (`streams::give_back`), so a graceful stop never brings a valid
//!   entry closer to the dead letters.
//! - **Housekeeping**: consumers that have held nothing for an hour are removed; on a
//!   graceful exit this consumer leaves each group in which it holds nothing; the
//!   pending gauge of every source is sampled every 5 s.
//! - **Long jobs**: an entry the handler still works on when `handle` returns
//!   ([`Outcome::Held`], after [`Held::hold`]) has its idle time reset every reclaim
//!   idle time / 3 while it is held, so no reclaimer takes a job that is still running;
//!   the handler finishes it later with [`Held::ack`]. [`Handler::capacity`] bounds how
//!   many entries one read or claim asks for.
//!
//! # The handler's contract
//!
//! [`Handler::handle`] gets a batch (read or reclaimed) and answers one [`Handled`] per
//! entry, in any order; an entry missing from the answer counts as [`Outcome::Retry`].
//! It may run the entries concurrently. It should check [`Batch::stop`] before it
//! starts each entry and answer [`Outcome::NotStarted`] once it has fired.
//!
//! | outcome | the loop then |
//! |---|---|
//! | `Finished` | nothing: the handler's own write acked it (a commit script) |
//! | `Ack` | acks it (`XACK`; one call per batch) |
//! | `DeadLetter(reason)` | moves it to the dead letters, then calls [`Handler::dead_lettered`] |
//! | `Retry` | nothing: it stays pending and is reclaimed after the idle time (one more delivery) |
//! | `NotStarted` | hands it back uncounted, at once reclaimable |
//! | `Held` | nothing now; keeps it from being reclaimed until [`Held::ack`] / [`Held::release`] |
//!
//! # A user that runs long jobs
//!
//! The shape of a runner that starts one job per entry, at most `slots` at a time,
//! and acks each entry when its job ends:
//!
//! ```no_run
//! use std::sync::Arc;
//! use shepherd::store::consumer::{self, Batch, Handled, Handler, Outcome, Source, Spec};
//! use shepherd::store::streams::Entry;
//!
//! struct Runner {
//!     slots: Arc<tokio::sync::Semaphore>,
//! }
//!
//! impl Handler for Runner {
//!     fn capacity(&self) -> usize {
//!         self.slots.available_permits()
//!     }
//!
//!     async fn handle(&self, batch: &Batch<'_>, entries: Vec<Entry>) -> Vec<Handled> {
//!         let mut out = Vec::new();
//!         for entry in entries {
//!             let Ok(slot) = self.slots.clone().try_acquire_owned() else {
//!                 // Full (a read and a claim raced): give it back for anyone to take.
//!                 out.push(Handled::new(entry, Outcome::NotStarted));
//!                 continue;
//!             };
//!             if batch.stop.is_cancelled() {
//!                 out.push(Handled::new(entry, Outcome::NotStarted));
//!                 continue;
//!             }
//!             let Some(work) = entry.bytes("work").map(<[u8]>::to_vec) else {
//!                 out.push(Handled::new(entry, Outcome::DeadLetter("no work field".into())));
//!                 continue;
//!             };
//!             let (held, stream, id) = (batch.held.clone(), batch.source.stream.clone(), entry.id.clone());
//!             held.hold(&stream, &id);
//!             tokio::spawn(async move {
//!                 let _slot = slot;
//!                 let _ = work; // … run the job to its end …
//!                 if let Err(e) = held.ack(&stream, &id).await {
//!                     tracing::warn!(error = %e, "ack failed; the entry is still held");
//!                 }
//!             });
//!             out.push(Handled::new(entry, Outcome::Held));
//!         }
//!         out
//!     }
//! }
//!
//! # async fn start(store: shepherd::store::Store, shutdown: tokio_util::sync::CancellationToken) {
//! let keys = store.keys().clone();
//! let spec = Spec {
//!     group: "agents".into(),
//!     consumer: "runner-1".into(),
//!     sources: vec![Source::new(keys.dispatch(), keys.dead_letters(0), 0, "dispatch")],
//!     batch: 16,
//!     reclaim_idle: std::time::Duration::from_secs(60),
//!     max_deliveries: 5,
//!     metrics: None,
//! };
//! let runner = Arc::new(Runner { slots: Arc::new(tokio::sync::Semaphore::new(2)) });
//! consumer::run(&store, spec, runner, shutdown).await.expect("the runner's loop");
//! # }
//! ```

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use crate::store::Conn;
use prometheus::{IntCounterVec, IntGaugeVec};
use redis::Script;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::streams::{self, Entry};
use super::{Store, StoreError};

/// Longest a read blocks: bounds how long a stop waits for a reader.
pub const BLOCK: Duration = Duration::from_millis(1000);
/// Pause after a failed read or group creation before trying again.
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// How often the pending gauges are sampled.
const GAUGE_INTERVAL: Duration = Duration::from_secs(5);
/// Consumers idle (and holding nothing) for this long are removed from the group.
pub const PRUNE_IDLE: Duration = Duration::from_secs(3600);
/// Longest a reader waits for room before asking [`Handler::capacity`] again (a
/// handler may free room without going through [`Held`]).
const ROOM_RECHECK: Duration = Duration::from_millis(1000);

/// Resets the idle time of held entries (see `lua/hold.lua`).
static HOLD: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/hold.lua")));

/// Sleeps `d` unless `stop` fires first; returns false when it did.
pub async fn pause(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => true,
        () = stop.cancelled() => false,
    }
}

/// One stream the loop reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The stream key.
    pub stream: String,
    /// Where its poison entries go.
    pub dead_letters: String,
    /// Shard of the stream, for the handler (0 for an unsharded stream).
    pub shard: u16,
    /// Label of its pending gauge (`shepherd_queue_entries{stream=label}`).
    pub label: String,
}

impl Source {
    /// A source reading `stream`, dead-lettering to `dead_letters`.
    pub fn new(
        stream: impl Into<String>,
        dead_letters: impl Into<String>,
        shard: u16,
        label: impl Into<String>,
    ) -> Self {
        Self {
            stream: stream.into(),
            dead_letters: dead_letters.into(),
            shard,
            label: label.into(),
        }
    }
}

/// What to consume, and how.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Consumer group (created when missing).
    pub group: String,
    /// This process's consumer name in the group (unique per process).
    pub consumer: String,
    /// The streams to read, one reader each.
    pub sources: Vec<Source>,
    /// Entries per read and per claim, at most.
    pub batch: usize,
    /// An entry pending this long without an ack is taken over (`XAUTOCLAIM`). Must
    /// exceed the handler's worst-case time for one entry, unless it holds entries.
    pub reclaim_idle: Duration,
    /// Deliveries after which an entry is poison (`SHEPHERD_MAX_DELIVERIES`).
    pub max_deliveries: u32,
    /// Where Redis errors and pending gauges are counted; `None`: nowhere.
    pub metrics: Option<Metrics>,
}

/// The metric families the loop writes.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// `shepherd_redis_errors_total{op}`: `xreadgroup`, `xautoclaim`, `hold`,
    /// `dead_letter`, `ack`.
    pub redis_errors: IntCounterVec,
    /// `shepherd_queue_entries{stream, kind="pending"}`, per source.
    pub queue_gauges: IntGaugeVec,
}

/// What the handler did with an entry (see the module docs for what the loop does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done, and acked by the handler's own write (e.g. a commit script).
    Finished,
    /// Done with nothing to write: the loop acks it.
    Ack,
    /// Poison: the loop moves it to the dead letters with this reason.
    DeadLetter(String),
    /// Not done (a transient failure): left pending, retried after the idle time.
    Retry,
    /// Never started (shutdown, or no room): handed back uncounted.
    NotStarted,
    /// Still running: [`Held::hold`] was called; the handler finishes it later.
    Held,
}

/// One entry of a batch with what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Handled {
    /// The entry (given back to the loop, which needs its id and delivery count).
    pub entry: Entry,
    /// What the loop does next with it.
    pub outcome: Outcome,
}

impl Handled {
    /// `entry` with `outcome`.
    pub fn new(entry: Entry, outcome: Outcome) -> Self {
        Self { entry, outcome }
    }
}

/// What a handler gets with each batch besides the entries.
pub struct Batch<'a> {
    /// The stream the entries come from.
    pub source: &'a Source,
    /// Fires at shutdown: start no further entry once it has.
    pub stop: &'a CancellationToken,
    /// Entries kept beyond this call ([`Outcome::Held`]).
    pub held: &'a Held,
    /// True when the entries were reclaimed from another consumer (or left pending).
    pub reclaimed: bool,
}

/// The per-stream work a loop runs (see the module docs for the contract).
pub trait Handler: Send + Sync + 'static {
    /// Handles a batch; one [`Handled`] per entry.
    fn handle(
        &self,
        batch: &Batch<'_>,
        entries: Vec<Entry>,
    ) -> impl Future<Output = Vec<Handled>> + Send;

    /// Called once an entry is in the dead letters (delivered too often, or answered
    /// [`Outcome::DeadLetter`]): the place to log it with the stream's own fields and
    /// count it.
    fn dead_lettered(&self, source: &Source, entry: &Entry, reason: &str) {
        tracing::warn!(stream = %source.stream, entry = %entry.id, %reason, "dead-lettered a poison entry");
    }

    /// How many more entries the handler takes now; 0 pauses reading and reclaiming
    /// until [`Held::ack`]/[`Held::release`] frees room (or a second passes). A
    /// bound per read and per claim, not a global one: several readers and the
    /// reclaimer may each ask at once, so a handler that must never exceed a number
    /// answers [`Outcome::NotStarted`] for the surplus.
    fn capacity(&self) -> usize {
        usize::MAX
    }
}

/// Entries a handler keeps after `handle` returned ([`Outcome::Held`]): the loop
/// resets their idle time while they are held, so they are not reclaimed. Cheap to
/// clone (one shared set).
#[derive(Clone)]
pub struct Held {
    /// The shared state.
    inner: Arc<HeldInner>,
}

/// State behind [`Held`].
struct HeldInner {
    /// Shared connection for acks and idle resets.
    conn: Conn,
    /// The loop's group.
    group: String,
    /// The loop's consumer name.
    consumer: String,
    /// Held entry ids by stream.
    ids: Mutex<HashMap<String, HashSet<String>>>,
    /// Woken when room is freed (an entry acked or released).
    freed: Notify,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held").field("len", &self.len()).finish()
    }
}

impl Held {
    fn new(conn: Conn, group: &str, consumer: &str) -> Self {
        Self {
            inner: Arc::new(HeldInner {
                conn,
                group: group.to_owned(),
                consumer: consumer.to_owned(),
                ids: Mutex::new(HashMap::new()),
                freed: Notify::new(),
            }),
        }
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashSet<String>>> {
        // A panic while holding the lock cannot leave the sets half-written.
        self.inner
            .ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps entry `id` of `stream` from being reclaimed until it is acked or released.
    /// Call it before the job starts, so that a job which ends at once finds it held.
    pub fn hold(&self, stream: &str, id: &str) {
        self.ids()
            .entry(stream.to_owned())
            .or_default()
            .insert(id.to_owned());
    }

    /// Whether entry `id` of `stream` is held (false once acked, released, or lost to
    /// another consumer after a stall longer than the reclaim idle time).
    pub fn contains(&self, stream: &str, id: &str) -> bool {
        self.ids().get(stream).is_some_and(|s| s.contains(id))
    }

    /// Number of entries held.
    pub fn len(&self) -> usize {
        self.ids().values().map(HashSet::len).sum()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Acks a held entry (its job is done) and stops holding it. On an error it stays
    /// held (and kept alive): ack again, or release it.
    pub async fn ack(&self, stream: &str, id: &str) -> Result<(), StoreError> {
        let mut conn = self.inner.conn.clone();
        streams::ack(&mut conn, stream, &self.inner.group, &[id]).await?;
        self.release(stream, id);
        Ok(())
    }

    /// Stops holding an entry without acking it: acked by the handler's own write, or
    /// left pending for a reclaimer (one more delivery).
    pub fn release(&self, stream: &str, id: &str) {
        let mut ids = self.ids();
        if let Some(set) = ids.get_mut(stream) {
            set.remove(id);
            if set.is_empty() {
                ids.remove(stream);
            }
        }
        drop(ids);
        self.inner.freed.notify_waiters();
    }

    /// Resets the idle time of every held entry; forgets (and returns) those that are
    /// no longer pending for this consumer.
    async fn refresh(&self) -> Result<Vec<(String, String)>, StoreError> {
        let snapshot: Vec<(String, Vec<String>)> = self
            .ids()
            .iter()
            .map(|(s, ids)| (s.clone(), ids.iter().cloned().collect()))
            .collect();
        let mut conn = self.inner.conn.clone();
        let mut lost = Vec::new();
        for (stream, ids) in snapshot {
            let gone: Vec<String> = HOLD
                .key(&stream)
                .arg(&self.inner.group)
                .arg(&self.inner.consumer)
                .arg(&ids)
                .invoke_async(&mut conn)
                .await?;
            for id in gone {
                self.release(&stream, &id);
                lost.push((stream.clone(), id));
            }
        }
        Ok(lost)
    }
}

/// Runs the loop for `spec` with `handler` until `shutdown` fires; returns once every
/// reader has finished its batch and this consumer has left the groups it holds
/// nothing in. Fails only when a reader cannot get its connection at start.
pub async fn run<H: Handler>(
    store: &Store,
    spec: Spec,
    handler: Arc<H>,
    shutdown: CancellationToken,
) -> Result<(), StoreError> {
    let stop = shutdown.child_token();
    let held = Held::new(store.conn(), &spec.group, &spec.consumer);
    let me = Arc::new(Loop {
        store: store.clone(),
        spec,
        handler,
        held,
        stop,
    });
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..me.spec.sources.len() {
        let span = tracing::info_span!(
            "consume",
            stream = %me.spec.sources[index].stream,
            group = %me.spec.group,
            consumer = %me.spec.consumer
        );
        tasks.spawn(me.clone().read(index).instrument(span));
    }
    tasks.spawn(me.clone().reclaim_loop());
    tasks.spawn(me.clone().hold_loop());
    tasks.spawn(me.clone().gauge_loop());
    let mut first_error = None;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                me.stop.cancel();
                first_error.get_or_insert(e);
            }
            Err(e) => {
                me.stop.cancel();
                tracing::error!(error = %e, "a consumer task panicked");
            }
        }
    }
    me.leave().await;
    first_error.map_or(Ok(()), Err)
}

/// One running loop: what its tasks share.
struct Loop<H> {
    /// Redis (shared connection, and blocking ones for the readers).
    store: Store,
    /// What to consume.
    spec: Spec,
    /// The per-stream work.
    handler: Arc<H>,
    /// Entries kept beyond `handle`.
    held: Held,
    /// Fires at shutdown (or when a task failed).
    stop: CancellationToken,
}

impl<H: Handler> Loop<H> {
    /// Reads source `index` until stop: own pending entries first, then new ones.
    async fn read(self: Arc<Self>, index: usize) -> Result<(), StoreError> {
        let source = &self.spec.sources[index];
        let (group, consumer) = (&self.spec.group, &self.spec.consumer);
        let mut conn = self.store.blocking_conn(BLOCK).await?;
        let mut group_ready = false;
        // Own pending entries first, paging by id so that an entry that keeps failing
        // is left to the reclaimer instead of being re-read forever.
        let mut own_from = Some("0-0".to_owned());
        while !self.stop.is_cancelled() {
            if !group_ready {
                match streams::ensure_group(&mut conn, &source.stream, group).await {
                    Ok(()) => group_ready = true,
                    Err(e) => {
                        tracing::warn!(error = %e, "creating the consumer group failed; retrying");
                        if !pause(RETRY_PAUSE, &self.stop).await {
                            break;
                        }
                        continue;
                    }
                }
            }
            let Some(room) = self.wait_for_room().await else {
                break;
            };
            let from = own_from.as_deref().unwrap_or(">");
            let read = streams::read_group(
                &mut conn,
                &source.stream,
                group,
                consumer,
                from,
                room,
                BLOCK,
            );
            let batch = match read.await {
                Ok(b) => b,
                Err(e) => {
                    self.redis_error("xreadgroup");
                    tracing::warn!(error = %e, "reading the stream failed; retrying");
                    group_ready = !e.is_missing_group();
                    if !pause(RETRY_PAUSE, &self.stop).await {
                        break;
                    }
                    continue;
                }
            };
            if own_from.is_some() {
                match batch.last() {
                    Some(last) => own_from = Some(last.id.clone()),
                    None => {
                        own_from = None;
                        continue;
                    }
                }
            }
            if !batch.is_empty() {
                self.settle(source, batch, false).await;
            }
        }
        Ok(())
    }

    /// Entries the handler takes now (at most a batch): waits while it takes none;
    /// `None` once stop fires.
    async fn wait_for_room(&self) -> Option<usize> {
        loop {
            let freed = self.held.inner.freed.notified();
            let room = self.room();
            if room > 0 {
                return Some(room);
            }
            tokio::select! {
                () = freed => {}
                () = tokio::time::sleep(ROOM_RECHECK) => {}
                () = self.stop.cancelled() => return None,
            }
        }
    }

    /// Entries the handler takes now, at most a batch.
    fn room(&self) -> usize {
        self.handler.capacity().min(self.spec.batch)
    }

    /// Gives a batch to the handler (after dead-lettering what was delivered too often)
    /// and carries out its answer.
    async fn settle(&self, source: &Source, entries: Vec<Entry>, reclaimed: bool) {
        let max = u64::from(self.spec.max_deliveries);
        let (poison, fresh): (Vec<Entry>, Vec<Entry>) =
            entries.into_iter().partition(|e| e.deliveries > max);
        for entry in poison {
            let reason = format!(
                "delivered {} times (SHEPHERD_MAX_DELIVERIES = {max})",
                entry.deliveries
            );
            self.dead_letter(source, &entry, &reason).await;
        }
        if fresh.is_empty() {
            return;
        }
        let batch = Batch {
            source,
            stop: &self.stop,
            held: &self.held,
            reclaimed,
        };
        let mut ack = Vec::new();
        let mut back = Vec::new();
        for Handled { entry, outcome } in self.handler.handle(&batch, fresh).await {
            match outcome {
                Outcome::Finished | Outcome::Retry | Outcome::Held => {}
                Outcome::Ack => ack.push(entry.id),
                Outcome::NotStarted => back.push(entry.id),
                Outcome::DeadLetter(reason) => self.dead_letter(source, &entry, &reason).await,
            }
        }
        let mut conn = self.store.conn();
        if !ack.is_empty() {
            let ids: Vec<&str> = ack.iter().map(String::as_str).collect();
            let acked = streams::ack(&mut conn, &source.stream, &self.spec.group, &ids);
            if let Err(e) = acked.await {
                self.redis_error("ack");
                tracing::warn!(error = %e, "acking entries failed; they will be redelivered");
            }
        }
        if !back.is_empty() {
            // If this fails the entries simply stay pending, counted, and are
            // reclaimed after the idle time as usual.
            let ids: Vec<&str> = back.iter().map(String::as_str).collect();
            let (group, consumer) = (&self.spec.group, &self.spec.consumer);
            let idle = self.spec.reclaim_idle;
            let given = streams::give_back(&mut conn, &source.stream, group, consumer, &ids, idle);
            if let Err(e) = given.await {
                tracing::warn!(error = %e, "handing back unstarted entries failed; they stay pending");
            }
        }
    }

    /// Moves one pending entry to its source's dead letters, then tells the handler.
    async fn dead_letter(&self, source: &Source, entry: &Entry, reason: &str) {
        let moved = streams::dead_letter(
            &mut self.store.conn(),
            &source.stream,
            &source.dead_letters,
            &self.spec.group,
            &entry.id,
            reason,
            entry.deliveries,
        )
        .await;
        match moved {
            Ok(true) => self.handler.dead_lettered(source, entry, reason),
            Ok(false) => {
                tracing::debug!(entry = %entry.id, "not dead-lettered: no longer pending (handled elsewhere)");
            }
            Err(e) => {
                self.redis_error("dead_letter");
                tracing::warn!(entry = %entry.id, %reason, error = %e, "dead-lettering failed; the entry stays pending");
            }
        }
    }

    /// Reclaims idle entries of every source, every half reclaim idle time (1 s … 30 s),
    /// and prunes long-gone consumers now and then.
    async fn reclaim_loop(self: Arc<Self>) -> Result<(), StoreError> {
        let every =
            (self.spec.reclaim_idle / 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
        let mut since_prune = Duration::ZERO;
        while pause(every, &self.stop).await {
            for source in &self.spec.sources {
                if self.stop.is_cancelled() {
                    break;
                }
                if let Err(e) = self.reclaim(source).await {
                    self.redis_error("xautoclaim");
                    tracing::warn!(stream = %source.stream, error = %e, "reclaiming pending entries failed");
                }
            }
            since_prune += every;
            if since_prune >= PRUNE_IDLE / 4 {
                since_prune = Duration::ZERO;
                self.prune().await;
            }
        }
        Ok(())
    }

    /// One full `XAUTOCLAIM` scan of a source; claimed entries are settled at once.
    async fn reclaim(&self, source: &Source) -> Result<(), StoreError> {
        let mut conn = self.store.conn();
        let mut cursor = "0-0".to_owned();
        loop {
            let room = self.room();
            if room == 0 {
                return Ok(());
            }
            let (next, claimed) = streams::autoclaim(
                &mut conn,
                &source.stream,
                &self.spec.group,
                &self.spec.consumer,
                self.spec.reclaim_idle,
                &cursor,
                room,
            )
            .await?;
            if !claimed.is_empty() {
                tracing::info!(
                    stream = %source.stream,
                    count = claimed.len(),
                    "reclaimed entries of a dead or slow consumer"
                );
                self.settle(source, claimed, true).await;
            }
            if next == "0-0" || self.stop.is_cancelled() {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// Removes consumers that have held nothing for [`PRUNE_IDLE`].
    async fn prune(&self) {
        let mut conn = self.store.conn();
        for source in &self.spec.sources {
            let pruned =
                streams::prune_consumers(&mut conn, &source.stream, &self.spec.group, PRUNE_IDLE);
            match pruned.await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(stream = %source.stream, removed = n, "pruned idle consumers")
                }
                Err(e) => {
                    tracing::debug!(stream = %source.stream, error = %e, "pruning consumers failed")
                }
            }
        }
    }

    /// Keeps held entries from being reclaimed: resets their idle time every third of
    /// the reclaim idle time.
    async fn hold_loop(self: Arc<Self>) -> Result<(), StoreError> {
        let every = (self.spec.reclaim_idle / 3).max(Duration::from_millis(100));
        while pause(every, &self.stop).await {
            if self.held.is_empty() {
                continue;
            }
            match self.held.refresh().await {
                Ok(lost) => {
                    for (stream, id) in lost {
                        tracing::warn!(%stream, entry = %id, "a held entry is no longer ours (acked elsewhere, or reclaimed after a stall)");
                    }
                }
                Err(e) => {
                    self.redis_error("hold");
                    tracing::warn!(error = %e, "keeping held entries failed; retrying");
                }
            }
        }
        Ok(())
    }

    /// Samples the pending gauge of every source until stop.
    async fn gauge_loop(self: Arc<Self>) -> Result<(), StoreError> {
        let Some(metrics) = &self.spec.metrics else {
            return Ok(());
        };
        let mut conn = self.store.conn();
        loop {
            for source in &self.spec.sources {
                let pending = streams::pending_count(&mut conn, &source.stream, &self.spec.group);
                if let Ok(n) = pending.await {
                    metrics
                        .queue_gauges
                        .with_label_values(&[source.label.as_str(), "pending"])
                        .set(i64::try_from(n).unwrap_or(i64::MAX));
                }
            }
            if !pause(GAUGE_INTERVAL, &self.stop).await {
                return Ok(());
            }
        }
    }

    /// On a graceful exit: leave every group in which this consumer holds nothing (no
    /// entry is dropped), to keep the consumer lists short.
    async fn leave(&self) {
        let mut conn = self.store.conn();
        for source in &self.spec.sources {
            let (group, consumer) = (&self.spec.group, &self.spec.consumer);
            let left = streams::remove_consumer_if_idle(&mut conn, &source.stream, group, consumer);
            if let Err(e) = left.await {
                tracing::debug!(stream = %source.stream, error = %e, "leaving the consumer group failed");
            }
        }
    }

    /// Counts a Redis error of `op`.
    fn redis_error(&self, op: &str) {
        if let Some(m) = &self.spec.metrics {
            m.redis_errors.with_label_values(&[op]).inc();
        }
    }
}
