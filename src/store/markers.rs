//! Small fleet-wide markers, one key each (no shard tag): the time of the last
//! completed resync and the turn of the periodic resync (`Keys::last_resync`,
//! `Keys::resync_lock`), and the executor's notice that its Forgejo circuit breaker is
//! open (`Keys::forgejo_circuit`), which the status page of every process shows.

use std::time::Duration;

use crate::store::Conn;

use super::{Keys, StoreError};

/// A duration in whole milliseconds, at least 1 (as `PX` requires).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Records that a resync completed at `at_ms` (unix ms).
pub async fn set_last_resync(conn: &mut Conn, keys: &Keys, at_ms: i64) -> Result<(), StoreError> {
    let _: () = redis::cmd("SET")
        .arg(keys.last_resync())
        .arg(at_ms)
        .query_async(conn)
        .await?;
    Ok(())
}

/// When the last resync completed (unix ms); `None` before the first (or when the
/// stored value is not a number).
pub async fn last_resync(conn: &mut Conn, keys: &Keys) -> Result<Option<i64>, StoreError> {
    let last: Option<String> = redis::cmd("GET")
        .arg(keys.last_resync())
        .query_async(conn)
        .await?;
    Ok(last.and_then(|l| l.parse().ok()))
}

/// Takes the periodic resync's turn for `ttl` as `owner` (a `store::lock` that is never
/// released: it expires, so the fleet resyncs once per `ttl`); true when it is ours.
pub async fn take_resync_turn(
    conn: &mut Conn,
    keys: &Keys,
    owner: &str,
    ttl: Duration,
) -> Result<bool, StoreError> {
    super::lock::try_lock(conn, &keys.resync_lock(), owner, ttl).await
}

/// Records that the circuit breaker for Forgejo at `url` is open for `ttl` more (until
/// its next probe), replacing an earlier notice.
pub async fn publish_open_circuit(
    conn: &mut Conn,
    keys: &Keys,
    url: &str,
    ttl: Duration,
) -> Result<(), StoreError> {
    let _: () = redis::cmd("SET")
        .arg(keys.forgejo_circuit())
        .arg(url)
        .arg("PX")
        .arg(millis(ttl))
        .query_async(conn)
        .await?;
    Ok(())
}

/// How long the last open-circuit notice has to live, in ms; `None` when there is
/// none (the breaker is closed, or no executor has seen it open).
pub async fn open_circuit_ms(conn: &mut Conn, keys: &Keys) -> Result<Option<i64>, StoreError> {
    let ttl: i64 = redis::cmd("PTTL")
        .arg(keys.forgejo_circuit())
        .query_async(conn)
        .await?;
    Ok((ttl > 0).then_some(ttl))
}
