//! Consumption of `<prefix>:dispatch` by the agent runners — the only file of the
//! runner that talks to the stream, with a narrow interface so it can move onto the
//! shared consumer loop of `store/`:
//!
//! - [`Consumer::reader`]: group `agents` (created if missing), this consumer's own
//!   pending entries first (a restart under the same `--consumer`), then new entries,
//!   and every half reclaim idle time the entries of dead runners idle for longer
//!   than `SHEPHERD_RECLAIM_IDLE_SECS` (`XAUTOCLAIM`). It reads only while the runner
//!   has room (`room`'s permits: one per entry the runner may hold), so entries the
//!   runner cannot run soon stay in the stream for other runners.
//! - [`Consumer::renew`]: the runner's heartbeat over the entries it holds. A held
//!   entry's idle time is reset, so a job that runs for an hour is never reclaimed by
//!   another runner; one that another runner did take is reported lost.
//! - [`Consumer::ack`] when a job is finished, [`Consumer::give_back`] for jobs not
//!   finished at shutdown (another runner takes them at once),
//!   [`Consumer::dead_letter`] for entries that cannot be decoded or were delivered
//!   `SHEPHERD_MAX_DELIVERIES` times, [`Consumer::leave`] on a graceful exit.
//! - [`watch_cancels`]: cancel notices reach *every* runner (a plain `XREAD` after the
//!   stream's end at start, no group), since the one running the work item is rarely
//!   the one the group would hand the notice to. The group's copy is just acked.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::core::effect::WorkItem;
use crate::store::keys::AGENTS_GROUP;
use crate::store::{Store, StoreError, streams};
use crate::worker::dispatch::{CANCEL_FIELD, CancelNotice, WORK_FIELD};

/// Entries per read at most.
const BATCH: usize = 32;
/// Longest a read blocks (bounds how long a stop waits for the reader).
const BLOCK: Duration = Duration::from_millis(1000);
/// Pause after a failed read.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// One entry of the dispatch stream, decoded.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Stream id.
    pub id: String,
    /// Times it has been delivered (this one included).
    pub deliveries: u64,
    /// What it carries.
    pub message: Message,
}

/// What a dispatch entry carries.
#[derive(Debug, Clone)]
pub enum Message {
    /// A work item (field `work`).
    Work(Box<WorkItem>),
    /// A cancel notice (field `cancel`).
    Cancel(CancelNotice),
    /// Neither, or undecodable: the reason.
    Bad(String),
}

/// Decodes an entry's fields.
fn decode(entry: &streams::Entry) -> Message {
    if let Some(bytes) = entry.bytes(WORK_FIELD) {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        return match serde_path_to_error::deserialize(de) {
            Ok(item) => Message::Work(Box::new(item)),
            Err(e) => Message::Bad(format!("undecodable work item: {e}")),
        };
    }
    if let Some(bytes) = entry.bytes(CANCEL_FIELD) {
        return match serde_json::from_slice(bytes) {
            Ok(c) => Message::Cancel(c),
            Err(e) => Message::Bad(format!("undecodable cancel notice: {e}")),
        };
    }
    Message::Bad(format!(
        "neither a `{WORK_FIELD}` nor a `{CANCEL_FIELD}` field"
    ))
}

/// This runner's membership of the group `agents` on the dispatch stream.
pub struct Consumer {
    /// Redis.
    store: Store,
    /// `<prefix>:dispatch`.
    stream: String,
    /// This process's consumer name.
    name: String,
    /// Idle time after which an entry of a dead runner is reclaimed.
    reclaim_idle: Duration,
}

impl Consumer {
    /// The consumer `name` of `store`'s dispatch stream.
    pub fn new(store: Store, name: String, reclaim_idle: Duration) -> Self {
        let stream = store.keys().dispatch();
        Self {
            store,
            stream,
            name,
            reclaim_idle,
        }
    }

    /// This consumer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads entries into `tx` until `shutdown`, taking one permit of `room` per entry
    /// (the runner gives it back when it is done with the entry).
    pub async fn reader(
        self: Arc<Self>,
        room: Arc<Semaphore>,
        tx: mpsc::Sender<Delivery>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let mut conn = self.store.blocking_conn(BLOCK).await?;
        while let Err(e) = streams::ensure_group(&mut conn, &self.stream, AGENTS_GROUP).await {
            tracing::warn!(error = %e, "creating the agents group failed; retrying");
            if !pause(RETRY_PAUSE, &shutdown).await {
                return Ok(());
            }
        }
        let reclaim_every =
            (self.reclaim_idle / 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
        let mut last_reclaim = tokio::time::Instant::now();
        // Own pending entries first, paging by id.
        let mut own: Option<String> = Some("0-0".into());
        loop {
            let permits = tokio::select! {
                p = room.clone().acquire_many_owned(1) => p?,
                () = shutdown.cancelled() => return Ok(()),
            };
            // Take whatever further room there is, up to a batch.
            let extra = room.available_permits().min(BATCH - 1);
            let mut permits = permits;
            if extra > 0
                && let Ok(more) = room.clone().try_acquire_many_owned(extra as u32)
            {
                permits.merge(more);
            }
            let n = permits.num_permits();
            let reclaim = last_reclaim.elapsed() >= reclaim_every;
            let read = match (&own, reclaim) {
                (Some(from), _) => self.read(&mut conn, from, n).await,
                (None, true) => {
                    last_reclaim = tokio::time::Instant::now();
                    self.reclaim(n).await
                }
                (None, false) => self.read(&mut conn, ">", n).await,
            };
            let entries = match read {
                Ok(entries) => entries,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the dispatch stream failed; retrying");
                    drop(permits);
                    if e.is_missing_group() {
                        let _ = streams::ensure_group(&mut conn, &self.stream, AGENTS_GROUP).await;
                    }
                    if !pause(RETRY_PAUSE, &shutdown).await {
                        return Ok(());
                    }
                    continue;
                }
            };
            if own.is_some() {
                own = entries.last().map(|e| e.id.clone());
            }
            // Keep one permit per entry handed over; give the rest back.
            permits.forget();
            room.add_permits(n - entries.len().min(n));
            for entry in entries {
                let delivery = Delivery {
                    message: decode(&entry),
                    id: entry.id,
                    deliveries: entry.deliveries,
                };
                if tx.send(delivery).await.is_err() {
                    return Ok(());
                }
            }
            if shutdown.is_cancelled() {
                return Ok(());
            }
        }
    }

    /// One group read (`from` = `>` for new entries, an id for own pending ones).
    async fn read(
        &self,
        conn: &mut crate::store::Conn,
        from: &str,
        n: usize,
    ) -> Result<Vec<streams::Entry>, StoreError> {
        streams::read_group(conn, &self.stream, AGENTS_GROUP, &self.name, from, n, BLOCK).await
    }

    /// Claims up to `n` entries of dead runners (idle past the reclaim idle time).
    async fn reclaim(&self, n: usize) -> Result<Vec<streams::Entry>, StoreError> {
        let (_, claimed) = streams::autoclaim(
            &mut self.store.conn(),
            &self.stream,
            AGENTS_GROUP,
            &self.name,
            self.reclaim_idle,
            "0-0",
            n,
        )
        .await?;
        if !claimed.is_empty() {
            tracing::info!(
                count = claimed.len(),
                "reclaimed work items of a runner that stopped"
            );
        }
        Ok(claimed)
    }

    /// Renews the hold on `ids`; per id, whether it is still ours.
    pub async fn renew(&self, ids: &[&str]) -> Result<Vec<bool>, StoreError> {
        streams::renew(
            &mut self.store.conn(),
            &self.stream,
            AGENTS_GROUP,
            &self.name,
            ids,
        )
        .await
    }

    /// Acknowledges a finished entry.
    pub async fn ack(&self, id: &str) -> Result<(), StoreError> {
        streams::ack(&mut self.store.conn(), &self.stream, AGENTS_GROUP, &[id]).await
    }

    /// Hands unfinished entries back for another runner to take at once.
    pub async fn give_back(&self, ids: &[&str]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        streams::give_back(
            &mut self.store.conn(),
            &self.stream,
            AGENTS_GROUP,
            &self.name,
            ids,
            self.reclaim_idle,
        )
        .await
    }

    /// Moves an entry to the dead letters (and acks it).
    pub async fn dead_letter(
        &self,
        id: &str,
        reason: &str,
        deliveries: u64,
    ) -> Result<(), StoreError> {
        let dead = self.store.keys().dead_letters(0);
        streams::dead_letter(
            &mut self.store.conn(),
            &self.stream,
            &dead,
            AGENTS_GROUP,
            id,
            reason,
            deliveries,
        )
        .await
        .map(|_| ())
    }

    /// Leaves the group on a graceful exit (only when nothing is pending for us).
    pub async fn leave(&self) {
        if let Err(e) = streams::remove_consumer_if_idle(
            &mut self.store.conn(),
            &self.stream,
            AGENTS_GROUP,
            &self.name,
        )
        .await
        {
            tracing::debug!(error = %e, "leaving the agents group failed");
        }
    }
}

/// Sends every cancel notice appended to the dispatch stream from now on into `tx`,
/// until `shutdown`.
pub async fn watch_cancels(
    store: Store,
    tx: mpsc::Sender<CancelNotice>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let stream = store.keys().dispatch();
    let mut conn = store.blocking_conn(BLOCK).await?;
    let mut after = loop {
        match streams::last_id(&mut conn, &stream).await {
            Ok(id) => break id,
            Err(e) => {
                tracing::warn!(error = %e, "reading the dispatch stream's end failed; retrying");
                if !pause(RETRY_PAUSE, &shutdown).await {
                    return Ok(());
                }
            }
        }
    };
    while !shutdown.is_cancelled() {
        let entries = match streams::read_after(&mut conn, &stream, &after, BATCH * 4, BLOCK).await
        {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "watching for cancel notices failed; retrying");
                if !pause(RETRY_PAUSE, &shutdown).await {
                    return Ok(());
                }
                continue;
            }
        };
        for entry in entries {
            after = entry.id.clone();
            if let Message::Cancel(notice) = decode(&entry)
                && tx.send(notice).await.is_err()
            {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Sleeps `d` unless `shutdown` fires first; false when it did.
async fn pause(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => true,
        () = shutdown.cancelled() => false,
    }
}
