//! Redis Streams with consumer groups: group creation, batched blocking reads, reclaim
//! of a dead consumer's entries (`XAUTOCLAIM`), delivery counts, dead letters, and the
//! sampled figures behind the queue gauges.
//!
//! Delivery semantics: an entry read by a consumer stays pending until it is acked (by
//! the commit script, or by [`dead_letter`]). A consumer that dies leaves its entries
//! pending; after the reclaim idle time another consumer claims them, which counts one
//! more delivery. An entry delivered more than the configured number of times is poison
//! and goes to the dead letters.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use crate::store::Conn;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply,
};
use redis::{AsyncCommands, Script, Value};
use tracing::instrument;

use super::StoreError;

/// Field names the dead-letter script adds in front of the original entry's fields.
pub mod dead_letter_fields {
    /// Why the entry was dead-lettered.
    pub const REASON: &str = "dl_reason";
    /// Key of the stream the entry came from.
    pub const STREAM: &str = "dl_stream";
    /// The entry's id in that stream.
    pub const ID: &str = "dl_id";
    /// Consumer group it was pending in.
    pub const GROUP: &str = "dl_group";
    /// How many times it had been delivered.
    pub const DELIVERIES: &str = "dl_deliveries";
    /// When it was dead-lettered (unix ms).
    pub const AT: &str = "dl_at";
}

/// Moves a pending entry to the dead letters and acks it (see `lua/dead_letter.lua`).
static DEAD_LETTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/dead_letter.lua")));

/// Removes an idle consumer that holds nothing (see `lua/remove_consumer.lua`).
static REMOVE_CONSUMER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/remove_consumer.lua")));

/// One stream entry as read by a consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Stream id (`<ms>-<seq>`).
    pub id: String,
    /// Field → raw value.
    pub fields: HashMap<String, Vec<u8>>,
    /// How many times the entry has been delivered, this delivery included.
    pub deliveries: u64,
}

impl Entry {
    /// A field as UTF-8 text (lossy), or `""` when absent.
    pub fn text(&self, field: &str) -> String {
        self.fields
            .get(field)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    }

    /// A field's raw bytes, when present.
    pub fn bytes(&self, field: &str) -> Option<&[u8]> {
        self.fields.get(field).map(Vec::as_slice)
    }

    fn from_stream_id(s: StreamId, deliveries: u64) -> Self {
        let fields = s
            .map
            .into_iter()
            .map(|(k, v)| {
                let bytes = match v {
                    Value::BulkString(b) => b,
                    Value::SimpleString(s) => s.into_bytes(),
                    Value::Int(i) => i.to_string().into_bytes(),
                    _ => Vec::new(),
                };
                (k, bytes)
            })
            .collect();
        Self {
            id: s.id,
            fields,
            deliveries,
        }
    }
}

/// Creates `group` on `stream` (and the stream itself) if missing. The group starts at
/// the beginning of the stream so that entries queued before the first worker started
/// are processed too.
pub async fn ensure_group(conn: &mut Conn, stream: &str, group: &str) -> Result<(), StoreError> {
    let r: Result<(), redis::RedisError> = conn.xgroup_create_mkstream(stream, group, "0").await;
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Reads up to `count` entries for `consumer`, blocking up to `block` when none is
/// waiting. `from` is `">"` for new entries or `"0"` for the consumer's own pending
/// entries (after a restart under the same name). Use a dedicated connection: the call
/// blocks.
#[instrument(skip_all, fields(stream))]
pub async fn read_group(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    from: &str,
    count: usize,
    block: Duration,
) -> Result<Vec<Entry>, StoreError> {
    let mut opts = StreamReadOptions::default()
        .group(group, consumer)
        .count(count);
    if from == ">" {
        opts = opts.block(block.as_millis().try_into().unwrap_or(usize::MAX));
    }
    let reply: Option<StreamReadReply> = conn.xread_options(&[stream], &[from], &opts).await?;
    let Some(reply) = reply else {
        return Ok(Vec::new());
    };
    // Own pending entries re-read with "0" have been delivered at least once before.
    let deliveries = if from == ">" { 1 } else { 2 };
    Ok(reply
        .keys
        .into_iter()
        .flat_map(|k| k.ids)
        .map(|s| Entry::from_stream_id(s, deliveries))
        .collect())
}

/// Claims up to `count` entries of other (presumably dead) consumers that have been
/// pending for at least `min_idle`, starting the scan at `cursor` (`"0-0"` first).
/// Returns the next cursor (`"0-0"` when the scan wrapped) and the claimed entries with
/// their delivery counts (the claim itself counts as a delivery).
#[instrument(skip_all, fields(stream))]
pub async fn autoclaim(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    min_idle: Duration,
    cursor: &str,
    count: usize,
) -> Result<(String, Vec<Entry>), StoreError> {
    let idle_ms: u64 = min_idle.as_millis().try_into().unwrap_or(u64::MAX);
    let reply: StreamAutoClaimReply = conn
        .xautoclaim_options(
            stream,
            group,
            consumer,
            idle_ms,
            cursor,
            StreamAutoClaimOptions::default().count(count),
        )
        .await?;
    if reply.claimed.is_empty() {
        return Ok((reply.next_stream_id, Vec::new()));
    }
    let counts = delivery_counts(
        conn,
        stream,
        group,
        reply.claimed.iter().map(|s| s.id.as_str()),
    )
    .await?;
    let entries = reply
        .claimed
        .into_iter()
        .map(|s| {
            let n = counts.get(&s.id).copied().unwrap_or(1);
            Entry::from_stream_id(s, n)
        })
        .collect();
    Ok((reply.next_stream_id, entries))
}

/// Hands pending entries that were read but never started (a worker stopping mid-batch)
/// back to the group as if this read had not happened: each keeps its owner, its
/// delivery count goes back by one (`XCLAIM … RETRYCOUNT n-1 JUSTID`; JUSTID itself
/// counts nothing), and its idle time is set to `idle`, so the reclaimer of another
/// consumer takes it at once. Without this, five graceful restarts during a backlog
/// would dead-letter valid entries as "delivered too often".
#[instrument(skip_all, fields(stream, entries = ids.len()))]
pub async fn give_back(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    ids: &[&str],
    idle: std::time::Duration,
) -> Result<(), StoreError> {
    let counts = delivery_counts(conn, stream, group, ids.iter().copied()).await?;
    let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
    let mut pipe = redis::pipe();
    for (id, n) in &counts {
        pipe.cmd("XCLAIM")
            .arg(stream)
            .arg(group)
            .arg(consumer)
            .arg(0)
            .arg(id)
            .arg("IDLE")
            .arg(idle_ms)
            .arg("RETRYCOUNT")
            .arg(n.saturating_sub(1))
            .arg("JUSTID");
    }
    super::client::query_pipeline::<redis::Value>(conn, &pipe).await?;
    Ok(())
}

/// Delivery counts of pending entries (one pipelined `XPENDING` per id).
async fn delivery_counts<'a>(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    ids: impl Iterator<Item = &'a str>,
) -> Result<HashMap<String, u64>, StoreError> {
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.cmd("XPENDING")
            .arg(stream)
            .arg(group)
            .arg(id)
            .arg(id)
            .arg(1);
    }
    let replies: Vec<redis::streams::StreamPendingCountReply> =
        super::client::query_pipeline(conn, &pipe).await?;
    Ok(replies
        .into_iter()
        .flat_map(|r| r.ids)
        .map(|p| (p.id, p.times_delivered as u64))
        .collect())
}

/// Moves the pending entry `id` of `stream` to `dead_letters` with `reason` (plus the
/// delivery count and the entry's original fields) and acks it, atomically. Returns
/// false when the entry was no longer pending (someone else dealt with it).
#[instrument(skip_all, fields(stream, id, reason))]
pub async fn dead_letter(
    conn: &mut Conn,
    stream: &str,
    dead_letters: &str,
    group: &str,
    id: &str,
    reason: &str,
    deliveries: u64,
) -> Result<bool, StoreError> {
    let moved: i64 = DEAD_LETTER
        .key(stream)
        .key(dead_letters)
        .arg(group)
        .arg(id)
        .arg(reason)
        .arg(deliveries)
        .arg(now_ms())
        .invoke_async(conn)
        .await?;
    Ok(moved == 1)
}

/// Acknowledges entries without any other write (entries with nothing to commit).
pub async fn ack(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    ids: &[&str],
) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let _: i64 = conn.xack(stream, group, ids).await?;
    Ok(())
}

/// Number of entries pending (delivered, not acked) in `group` of `stream`.
pub async fn pending_count(conn: &mut Conn, stream: &str, group: &str) -> Result<u64, StoreError> {
    let v: Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .query_async(conn)
        .await?;
    match v {
        Value::Array(items) => match items.first() {
            Some(Value::Int(n)) => Ok((*n).max(0) as u64),
            _ => Ok(0),
        },
        _ => Ok(0),
    }
}

/// What `XINFO GROUPS` says about one consumer group of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupFigures {
    /// The last entry id delivered to any of its consumers.
    pub last_delivered_id: String,
    /// Entries delivered and not yet acknowledged.
    pub pending: u64,
    /// Consumers known to the group.
    pub consumers: u64,
    /// Entries not yet delivered to it, when Redis can tell.
    pub lag: Option<u64>,
}

/// The figures of `group` on `stream`; `None` when the group does not exist. Fails when
/// the stream does not exist (Redis: "no such key") or Redis does.
pub async fn group_figures(
    conn: &mut Conn,
    stream: &str,
    group: &str,
) -> Result<Option<GroupFigures>, StoreError> {
    let groups: redis::streams::StreamInfoGroupsReply = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(conn)
        .await?;
    Ok(groups
        .groups
        .into_iter()
        .find(|g| g.name == group)
        .map(|g| GroupFigures {
            last_delivered_id: g.last_delivered_id,
            pending: g.pending as u64,
            consumers: g.consumers as u64,
            lag: g.lag.map(|l| l as u64),
        }))
}

/// Ids of up to `count` entries pending in `group` of `stream`, oldest first.
pub async fn pending_ids(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    count: usize,
) -> Result<Vec<String>, StoreError> {
    let pending: redis::streams::StreamPendingCountReply = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .arg("-")
        .arg("+")
        .arg(count)
        .query_async(conn)
        .await?;
    Ok(pending.ids.into_iter().map(|p| p.id).collect())
}

/// Number of entries in a stream (e.g. the dead letters).
pub async fn length(conn: &mut Conn, stream: &str) -> Result<u64, StoreError> {
    Ok(conn.xlen(stream).await?)
}

/// Removes consumers of `group` that hold no pending entries and have been idle for at
/// least `idle` (names left behind by processes that exited or were killed: every
/// process picks a fresh name). Returns how many were removed.
pub async fn prune_consumers(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    idle: Duration,
) -> Result<usize, StoreError> {
    let info: redis::streams::StreamInfoConsumersReply =
        conn.xinfo_consumers(stream, group).await?;
    let idle_ms = usize::try_from(idle.as_millis()).unwrap_or(usize::MAX);
    let mut removed = 0;
    for c in info
        .consumers
        .iter()
        .filter(|c| c.pending == 0 && c.idle >= idle_ms)
    {
        if remove_consumer_if_idle(conn, stream, group, &c.name).await? {
            removed += 1;
        }
    }
    Ok(removed)
}

/// Removes one consumer from `group` when it holds no pending entries (graceful exit),
/// atomically (see `lua/remove_consumer.lua`). Returns whether it was removed.
pub async fn remove_consumer_if_idle(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
) -> Result<bool, StoreError> {
    let removed: i64 = REMOVE_CONSUMER
        .key(stream)
        .arg(group)
        .arg(consumer)
        .invoke_async(conn)
        .await?;
    Ok(removed == 1)
}

/// Current time in unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A stream id as `(ms, seq)` for comparisons; `None` when malformed.
fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// Trims `stream` of the entries older than `older_than_ms` (unix ms) that every
/// consumer group has delivered and acknowledged: the bound is the oldest of the age
/// bound, each group's oldest pending entry and each group's last-delivered id (what
/// follows it was never delivered). A stream with no group (dispatch, dead letters) is
/// trimmed by age alone. Exact `MINID` (not `~`): it runs once a minute and must never
/// remove an entry at or above the bound. Returns how many entries went.
pub async fn trim_acknowledged(
    conn: &mut Conn,
    stream: &str,
    older_than_ms: u64,
) -> Result<u64, StoreError> {
    let exists: bool = redis::cmd("EXISTS").arg(stream).query_async(conn).await?;
    if !exists {
        return Ok(0);
    }
    let groups: redis::streams::StreamInfoGroupsReply = conn.xinfo_groups(stream).await?;
    let mut bound = (older_than_ms, 0);
    for g in &groups.groups {
        let delivered = parse_id(&g.last_delivered_id).unwrap_or((0, 0));
        bound = bound.min(delivered);
        if g.pending > 0 {
            let summary: redis::streams::StreamPendingReply =
                conn.xpending(stream, &g.name).await?;
            if let redis::streams::StreamPendingReply::Data(d) = summary {
                bound = bound.min(parse_id(&d.start_id).unwrap_or((0, 0)));
            }
        }
    }
    if bound == (0, 0) {
        return Ok(0);
    }
    Ok(redis::cmd("XTRIM")
        .arg(stream)
        .arg("MINID")
        .arg(format!("{}-{}", bound.0, bound.1))
        .query_async(conn)
        .await?)
}

/// Renews the hold of `consumer` on its pending entries (see `lua/renew.lua`);
/// returns, per id, whether it is still this consumer's.
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/renew.lua")));

/// Resets the idle time of each of `ids` that is still pending for `consumer`, so a
/// long-running job's entry is not reclaimed by another consumer; returns, per id,
/// whether it was still ours (false: another consumer claimed it, or it was acked).
#[instrument(skip_all, fields(stream, entries = ids.len()))]
pub async fn renew(
    conn: &mut Conn,
    stream: &str,
    group: &str,
    consumer: &str,
    ids: &[&str],
) -> Result<Vec<bool>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut inv = RENEW.key(stream);
    inv.arg(group).arg(consumer);
    for id in ids {
        inv.arg(*id);
    }
    let reply: Vec<i64> = inv.invoke_async(conn).await?;
    Ok(reply.into_iter().map(|v| v == 1).collect())
}

/// Id of the newest entry of `stream` (`0-0` when it is empty or missing): where a
/// reader that wants only what comes next starts.
pub async fn last_id(conn: &mut Conn, stream: &str) -> Result<String, StoreError> {
    let reply: redis::streams::StreamRangeReply = redis::cmd("XREVRANGE")
        .arg(stream)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(conn)
        .await?;
    Ok(reply
        .ids
        .into_iter()
        .next()
        .map_or_else(|| "0-0".to_owned(), |e| e.id))
}

/// Reads up to `count` entries after `after` without a consumer group (every reader
/// sees every entry), blocking up to `block`. Use a dedicated connection.
pub async fn read_after(
    conn: &mut Conn,
    stream: &str,
    after: &str,
    count: usize,
    block: Duration,
) -> Result<Vec<Entry>, StoreError> {
    let opts = StreamReadOptions::default()
        .count(count)
        .block(block.as_millis().try_into().unwrap_or(usize::MAX));
    let reply: Option<StreamReadReply> = conn.xread_options(&[stream], &[after], &opts).await?;
    Ok(reply
        .map(|r| {
            r.keys
                .into_iter()
                .flat_map(|k| k.ids)
                .map(|s| Entry::from_stream_id(s, 1))
                .collect()
        })
        .unwrap_or_default())
}
