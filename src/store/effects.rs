//! The executor's side of the effects streams (consumer group `executors`).
//!
//! The commit script appends every effect but `Schedule` to its shard's effects stream
//! (fields in [`super::commit::effect_fields`]). An executor reads them in batches,
//! runs each effect, and then, in ONE Lua call ([`finish`]), queues the internal
//! events the effect produced (observations, outcomes) on the same shard's events
//! stream, sets the effect's done marker and acks the entry. A redelivered effect whose
//! done marker is set is only acked, so its events are queued once.
//!
//! A transient failure parks the entry in the shard's retry set ([`park_for_retry`]:
//! ZADD + XACK, atomically); [`pop_due_retries`] moves due ones back onto the stream.
//! Parked entries carry two extra fields, [`ATTEMPT`] and [`FIRST_TRY`], so the
//! retry budget survives the round trip.
//!
//! Dispatch messages go to `<prefix>:dispatch` through [`append_dispatch`], which
//! writes a per-effect marker with the entry (same slot, one script), so no work item
//! is queued twice however often its effect runs.

use std::sync::LazyLock;
use std::time::Duration;

use crate::store::Conn;
use redis::{Script, ToRedisArgs};
use tracing::instrument;

use super::event_entry::EventEntry;
use super::keys::EXECUTORS_GROUP;
use super::{Keys, StoreError};
use crate::core::event::Event;

/// Field of a parked-and-requeued entry: tries so far (absent on a first delivery).
pub const ATTEMPT: &str = "attempt";
/// Field of a parked-and-requeued entry: unix ms of the first try.
pub const FIRST_TRY: &str = "first_try";

/// Finishes an entry: events + done marker + ack (see `lua/effect_finish.lua`).
static FINISH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/effect_finish.lua")));
/// Parks an entry in the retry set (see `lua/effect_retry.lua`).
static PARK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/effect_retry.lua")));
/// Moves due retries back to the stream (see `lua/effect_retries_pop.lua`).
static POP_RETRIES: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/effect_retries_pop.lua")));
/// Appends to the dispatch stream once per effect (see `lua/dispatch.lua`).
static DISPATCH: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/dispatch.lua")));

/// An internal event ready to be queued on an events stream.
#[derive(Debug, Clone, PartialEq)]
pub struct InternalEvent {
    /// Unique id in the `delivery` field (`effect:<effect id>:<n>`).
    pub delivery: String,
    /// Event name (`Event::name`).
    pub name: String,
    /// Repository `owner/name`.
    pub repo: String,
    /// Receive time to record (unix ms): the original delivery's, for the lag metric.
    pub received_ms: u64,
    /// The event as JSON.
    pub body: String,
}

impl InternalEvent {
    /// The `index`-th event produced by effect `effect_id`.
    pub fn new(effect_id: &str, index: usize, repo: &str, event: &Event, received_ms: u64) -> Self {
        Self {
            delivery: format!("effect:{effect_id}:{index}"),
            name: event.name(),
            repo: repo.to_owned(),
            received_ms,
            body: serde_json::to_string(event).unwrap_or_default(),
        }
    }

    /// The events-stream entry it becomes.
    pub fn entry(&self) -> EventEntry<'_> {
        EventEntry::internal(
            &self.delivery,
            &self.name,
            &self.repo,
            self.received_ms,
            &self.body,
        )
    }
}

/// Queues `events` on the shard's events stream, sets the done marker of `effect_id`
/// (for `done_ttl`) and acks `entry_id`, atomically. Returns false when the effect was
/// already done (nothing queued, the entry only acked).
#[instrument(skip_all, fields(shard, entry = entry_id, effect = effect_id))]
pub async fn finish(
    conn: &mut Conn,
    keys: &Keys,
    shard: u16,
    entry_id: &str,
    effect_id: &str,
    events: &[InternalEvent],
    done_ttl: Duration,
) -> Result<bool, StoreError> {
    let mut inv = FINISH.prepare_invoke();
    inv.key(keys.effects(shard))
        .key(keys.events(shard))
        .key(keys.effect_done(shard, effect_id))
        .arg(EXECUTORS_GROUP)
        .arg(entry_id)
        .arg(millis(done_ttl))
        .arg(events.len());
    for e in events {
        let entry = e.entry();
        inv.arg(entry.num_of_args()).arg(entry);
    }
    let queued: i64 = inv.invoke_async(conn).await?;
    Ok(queued == 1)
}

/// Whether effect `effect_id` of `shard` is done.
pub async fn is_done(
    conn: &mut Conn,
    keys: &Keys,
    shard: u16,
    effect_id: &str,
) -> Result<bool, StoreError> {
    let n: i64 = redis::cmd("EXISTS")
        .arg(keys.effect_done(shard, effect_id))
        .query_async(conn)
        .await?;
    Ok(n == 1)
}

/// Parks entry `entry_id` in the shard's retry set until `due_ms`, as the field/value
/// list `fields` (which carries the updated [`ATTEMPT`] and [`FIRST_TRY`]), and acks it.
#[instrument(skip_all, fields(shard, entry = entry_id, due_ms))]
pub async fn park_for_retry(
    conn: &mut Conn,
    keys: &Keys,
    shard: u16,
    entry_id: &str,
    fields: &[(String, String)],
    due_ms: u64,
) -> Result<(), StoreError> {
    let flat: Vec<&str> = fields
        .iter()
        .flat_map(|(k, v)| [k.as_str(), v.as_str()])
        .collect();
    let member = serde_json::to_string(&flat).map_err(|e| StoreError::Protocol {
        script: "effect_retry",
        reply: format!("cannot encode the entry: {e}"),
    })?;
    let _: i64 = PARK
        .key(keys.effects(shard))
        .key(keys.effect_retries(shard))
        .arg(EXECUTORS_GROUP)
        .arg(entry_id)
        .arg(due_ms)
        .arg(member)
        .invoke_async(conn)
        .await?;
    Ok(())
}

/// Moves up to `limit` retries of `shard` due at `now_ms` back onto its effects
/// stream; returns how many moved.
pub async fn pop_due_retries(
    conn: &mut Conn,
    keys: &Keys,
    shard: u16,
    now_ms: u64,
    limit: usize,
) -> Result<usize, StoreError> {
    Ok(POP_RETRIES
        .key(keys.effect_retries(shard))
        .key(keys.effects(shard))
        .arg(now_ms)
        .arg(limit)
        .invoke_async(conn)
        .await?)
}

/// Number of effects waiting for a retry in `shard` (gauges, tests).
pub async fn retry_count(conn: &mut Conn, keys: &Keys, shard: u16) -> Result<u64, StoreError> {
    Ok(redis::cmd("ZCARD")
        .arg(keys.effect_retries(shard))
        .query_async(conn)
        .await?)
}

/// Appends `field = json` to `<prefix>:dispatch` unless effect `effect_id` did before
/// (within `ttl`). Returns the new entry id, or `None` for a repeat.
#[instrument(skip_all, fields(effect = effect_id, field))]
pub async fn append_dispatch(
    conn: &mut Conn,
    keys: &Keys,
    effect_id: &str,
    field: &str,
    json: &str,
    ttl: Duration,
) -> Result<Option<String>, StoreError> {
    Ok(DISPATCH
        .key(keys.dispatch())
        .key(keys.dispatch_sent(effect_id))
        .arg(millis(ttl))
        .arg(field)
        .arg(json)
        .invoke_async(conn)
        .await?)
}

/// A duration in whole milliseconds (at least 1, as `PX` requires).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
