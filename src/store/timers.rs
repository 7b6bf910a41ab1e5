//! Timers: a sorted set per shard (score = due time in unix ms) whose due members are
//! popped and queued as internal events on the shard's events stream by one Lua call
//! (`lua/timers.lua`). Any number of pollers may run: each timer is popped by exactly
//! one of them, and popping and queueing happen together, so a crash in between cannot
//! lose a timer.
//!
//! Timers are written by the commit script (from `Schedule` effects), never here.

use std::sync::LazyLock;

use crate::store::Conn;
use redis::Script;
use tracing::instrument;

use super::{Keys, StoreError};

/// The pop-and-queue script.
static POP_DUE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/timers.lua")));

/// Pops up to `limit` timers of `shard` due at `now_ms` and queues them as internal
/// events; returns how many were queued.
#[instrument(skip_all, fields(shard))]
pub async fn pop_due(
    conn: &mut Conn,
    keys: &Keys,
    shard: u16,
    now_ms: u64,
    limit: usize,
) -> Result<usize, StoreError> {
    let n: usize = POP_DUE
        .key(keys.timers(shard))
        .key(keys.timer_data(shard))
        .key(keys.events(shard))
        .arg(now_ms)
        .arg(limit)
        .invoke_async(conn)
        .await?;
    Ok(n)
}

/// Every timer scheduled in a shard (due or not): its sorted-set member
/// (`<record key>/<timer id>`) and due time (unix ms), soonest first.
pub async fn scheduled(
    conn: &mut Conn,
    keys: &Keys,
    shard: u16,
) -> Result<Vec<(String, i64)>, StoreError> {
    let all: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(keys.timers(shard))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await?;
    Ok(all.into_iter().map(|(m, due)| (m, due as i64)).collect())
}

/// Number of timers scheduled in a shard (due or not), for inspection and gauges.
pub async fn count(conn: &mut Conn, keys: &Keys, shard: u16) -> Result<u64, StoreError> {
    Ok(redis::cmd("ZCARD")
        .arg(keys.timers(shard))
        .query_async(conn)
        .await?)
}
