//! The ingest side of the store: dedup a delivery on its id and append its entry to
//! its shard's events stream, atomically, in one loaded Lua script
//! ([`lua/enqueue.lua`](./lua/enqueue.lua)), called with `EVALSHA` (the script text
//! is sent only once per Redis process, after a `NOSCRIPT` reply).
//!
//! Why a script and not `SET NX` followed by `XADD`: a crash, timeout or failover
//! between the two would leave the delivery marked seen with no entry, and Forgejo
//! never retries, so the event would be lost for good. The alternative with the same
//! guarantee, `MULTI SET NX … XADD … EXEC`, is measured in `docs/benchmarks.md`.
//!
//! Every call runs under the configured Redis timeout; the caller turns a
//! [`StoreError`] into `503 Retry-After`. Nothing is buffered in this process: a
//! delivery is either in Redis when [`Enqueuer::enqueue`] returns `Ok`, or the sender
//! is told to come back.
//!
//! Only verified deliveries reach this: the one caller is
//! `ingest::Delivery::enqueue`, and a `Delivery` exists only after its signature was
//! verified (the `Verified` typestate); this module only sees the entry it makes.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::Conn;
use redis::{ErrorKind, ServerErrorKind};

use crate::store::event_entry::EventEntry;
use crate::store::{Keys, StoreError};

/// Source of the dedup+append script.
pub const ENQUEUE_LUA: &str = include_str!("lua/enqueue.lua");

/// Repositories remembered per process as already in the `<prefix>:repos` set; the set
/// is cleared when it reaches this size (it is only a cache).
const KNOWN_REPOS_CAP: usize = 10_000;

/// The cache above is also cleared this often, so a `<prefix>:repos` set lost with a
/// Redis that kept no data is filled again within minutes.
const KNOWN_REPOS_TTL: Duration = Duration::from_secs(600);

/// Whether a reply failed because the connection itself was lost (not because Redis
/// refused the command): the connection manager reconnects on such errors, and the
/// first command after an outage often meets the old, broken connection.
fn connection_lost(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// `PING` on the ingest's connection, once more on the reconnected connection when the
/// connection itself was lost: after a Redis restart, each server thread's connection
/// reports the broken pipe once before the manager has reconnected, and a readiness
/// probe must not call a Redis that is back unavailable.
pub async fn ping(conn: &mut Conn) -> Result<(), redis::RedisError> {
    let cmd = redis::cmd("PING");
    let mut reply: Result<String, redis::RedisError> = cmd.query_async(conn).await;
    if reply.as_ref().is_err_and(connection_lost) {
        reply = cmd.query_async(conn).await;
    }
    reply.map(drop)
}

/// What happened to a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// Newly appended; the events-stream entry id.
    New(String),
    /// The delivery id was queued before, as this entry id; nothing was written.
    Duplicate(String),
}

/// Appends verified deliveries to the events streams. One per process, shared.
#[derive(Debug)]
pub struct Enqueuer {
    /// Key layout (prefix, shards).
    keys: Keys,
    /// The enqueue script (its SHA1 is computed once, here).
    script: redis::Script,
    /// Replay window: TTL of dedup markers and MINID distance of the streams.
    retention: Duration,
    /// Bound on each Redis round trip.
    timeout: Duration,
    /// Repositories already recorded in `<prefix>:repos` by this process, and when the
    /// cache was last cleared.
    known_repos: Mutex<(HashSet<String>, Instant)>,
    /// Replicas that must confirm each enqueue (`WAIT`); 0: none.
    wait_replicas: u32,
}

impl Enqueuer {
    /// An enqueuer for this key layout, retention window and per-call timeout.
    pub fn new(keys: Keys, retention: Duration, timeout: Duration) -> Self {
        Self {
            keys,
            script: redis::Script::new(ENQUEUE_LUA),
            retention,
            timeout,
            known_repos: Mutex::new((HashSet::new(), Instant::now())),
            wait_replicas: 0,
        }
    }

    /// Requires `n` replicas to confirm each enqueue before it counts as accepted
    /// (`SHEPHERD_REDIS_WAIT_REPLICAS`): `WAIT n` on the connection that wrote it, with
    /// half the enqueue timeout; fewer confirmations are an error (the ingest answers
    /// 503; the entry may stay and a redelivery is deduplicated).
    pub fn with_wait_replicas(mut self, n: u32) -> Self {
        self.wait_replicas = n;
        self
    }

    /// The key layout.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Loads the script into Redis (`SCRIPT LOAD`) so the first delivery needs no
    /// retry; harmless to skip, since a `NOSCRIPT` reply triggers the same load.
    pub async fn preload(&self, conn: &mut Conn) -> Result<(), StoreError> {
        let invocation = self.script.prepare_invoke();
        let load = invocation.load_async(conn);
        tokio::time::timeout(self.timeout, load)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))??;
        Ok(())
    }

    /// Dedups on the entry's delivery id and appends the entry to its repository's
    /// shard, atomically, within the timeout.
    pub async fn enqueue(
        &self,
        conn: &mut Conn,
        entry: &EventEntry<'_>,
    ) -> Result<Enqueued, StoreError> {
        tokio::time::timeout(self.timeout, self.enqueue_inner(conn, entry))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
    }

    async fn enqueue_inner(
        &self,
        conn: &mut Conn,
        entry: &EventEntry<'_>,
    ) -> Result<Enqueued, StoreError> {
        let cmd = self.evalsha(entry);
        let mut reply: Result<(i64, String), redis::RedisError> = cmd.query_async(conn).await;
        if reply.as_ref().is_err_and(connection_lost) {
            // The connection broke (a Redis restart, a failover) and the manager is
            // already reconnecting: try once more on the new connection, still inside
            // the timeout. Safe even if the first call did run: the delivery id is
            // then already marked, and the script answers with the original entry.
            reply = cmd.query_async(conn).await;
        }
        let (new, id) = match reply {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // Redis restarted or flushed its script cache: load once, retry once.
                self.script.prepare_invoke().load_async(conn).await?;
                cmd.query_async(conn).await?
            }
            other => other?,
        };
        if self.wait_replicas > 0 {
            // A duplicate waits too: the first copy may have been answered 503 before
            // it reached the replicas.
            let shard = self.keys.shard_of(entry.repo());
            let wait = self.timeout / 2;
            let acked = conn
                .wait_replicas(&self.keys.events(shard), self.wait_replicas, wait)
                .await?;
            if acked < self.wait_replicas {
                return Err(StoreError::NotReplicated {
                    wanted: self.wait_replicas,
                    acked,
                    within: wait,
                });
            }
        }
        Ok(if new == 1 {
            Enqueued::New(id)
        } else {
            Enqueued::Duplicate(id)
        })
    }

    /// The `EVALSHA` command for one delivery, built directly so the 15 KB body is
    /// copied once into the command buffer.
    fn evalsha(&self, entry: &EventEntry<'_>) -> redis::Cmd {
        let shard = self.keys.shard_of(entry.repo());
        let retention_ms = u64::try_from(self.retention.as_millis()).unwrap_or(u64::MAX);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash())
            .arg(2)
            .arg(self.keys.seen(shard, entry.delivery()))
            .arg(self.keys.events(shard))
            .arg(retention_ms)
            .arg(entry);
        cmd
    }

    /// Adds the delivery's repository to `<prefix>:repos` unless this process already
    /// did. Kept out of the script on purpose: the set has no shard hash tag, so on a
    /// Redis Cluster it lives in another slot than the stream.
    pub async fn record_repo(&self, conn: &mut Conn, repo: &str) -> Result<(), StoreError> {
        if repo.is_empty() {
            return Ok(());
        }
        {
            let mut known = self.known();
            if known.1.elapsed() > KNOWN_REPOS_TTL || known.0.len() >= KNOWN_REPOS_CAP {
                *known = (HashSet::new(), Instant::now());
            }
            if known.0.contains(repo) {
                return Ok(());
            }
        }
        let mut cmd = redis::cmd("SADD");
        cmd.arg(self.keys.repos()).arg(repo);
        let sadd = cmd.query_async::<i64>(conn);
        tokio::time::timeout(self.timeout, sadd)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))??;
        self.known().0.insert(repo.to_owned());
        Ok(())
    }

    fn known(&self) -> std::sync::MutexGuard<'_, (HashSet<String>, Instant)> {
        // A panic while holding this lock cannot leave the cache inconsistent.
        self.known_repos
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
