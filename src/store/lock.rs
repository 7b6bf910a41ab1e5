//! Short exclusive locks: `SET key token NX PX ttl`, released only by the holder that
//! took it (compare-and-delete in one script), and expiring by themselves when a holder
//! dies. Each concept that needs mutual exclusion has its own key
//! ([`super::Keys::merge_lock`] per target branch, [`super::Keys::status_lock`] per
//! PR's status comment), so holding one never delays the other.

use std::sync::LazyLock;
use std::time::Duration;

use crate::store::Conn;
use redis::Script;

use super::StoreError;

/// Deletes the lock only while it still holds the caller's token.
static UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then \
         return redis.call('DEL', KEYS[1]) else return 0 end",
    )
});

/// Takes the lock `key` for `ttl` with `token`; false when someone holds it.
pub async fn try_lock(
    conn: &mut Conn,
    key: &str,
    token: &str,
    ttl: Duration,
) -> Result<bool, StoreError> {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(millis(ttl))
        .query_async(conn)
        .await?;
    Ok(set.is_some())
}

/// Releases the lock `key` if it still holds `token` (a lock that expired and was
/// taken by someone else is left alone).
pub async fn unlock(conn: &mut Conn, key: &str, token: &str) -> Result<(), StoreError> {
    let _: i64 = UNLOCK.key(key).arg(token).invoke_async(conn).await?;
    Ok(())
}

/// A duration in whole milliseconds (at least 1, as `PX` requires).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
