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

/// Extends the lease only while it still holds the caller's token: `1` when extended,
/// `0` when it expired or someone else holds it now (the caller lost it).
static RENEW_IF_HELD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then \
         redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 else return 0 end",
    )
});

/// A short lease on one key: taken with `SET NX PX`, kept alive by its holder with
/// [`Lease::renew`] (compare-and-`PEXPIRE`), and lost by itself within its time to
/// live when the holder dies. The token is unique to this taking (the holder's name
/// and a random part), so a second executor running the same effect after a reclaim
/// never mistakes the dead holder's lease for its own. Every write the lease protects
/// is fenced by [`Lease::extend`]: it succeeds only while this taking still holds the
/// key, and covers the write's whole time, so a holder that lost the lease (its renewals
/// stopped, it paused past the lifetime) learns it before writing, never after.
#[derive(Debug, Clone)]
pub struct Lease {
    key: String,
    token: String,
    ttl: Duration,
}

/// What [`Lease::try_take`] found.
#[derive(Debug)]
pub enum Taken {
    /// The lease is the caller's.
    Held(Lease),
    /// Someone holds it: `holder` (their token) for about `remaining` more.
    Busy {
        /// The holder's token (`name:random`), for logs.
        holder: Option<String>,
        /// Its remaining time to live (zero when unknown).
        remaining: Duration,
    },
}

impl Lease {
    /// Takes the lease `key` for `ttl` in the name of `holder` (a process or consumer
    /// name, kept in the token for operators and drills).
    pub async fn try_take(
        conn: &mut Conn,
        key: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Taken, StoreError> {
        let token = format!("{holder}:{}", uuid::Uuid::new_v4().simple());
        if try_lock(conn, key, &token, ttl).await? {
            return Ok(Taken::Held(Lease {
                key: key.to_owned(),
                token,
                ttl,
            }));
        }
        let (holder, pttl): (Option<String>, i64) = redis::pipe()
            .cmd("GET")
            .arg(key)
            .cmd("PTTL")
            .arg(key)
            .query_async(conn)
            .await?;
        Ok(Taken::Busy {
            holder,
            remaining: Duration::from_millis(u64::try_from(pttl).unwrap_or(0)),
        })
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The token of this taking.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Its lifetime after each renewal.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Renews the lease for its lifetime; false when it was lost.
    pub async fn renew(&self, conn: &mut Conn) -> Result<bool, StoreError> {
        self.extend(conn, self.ttl).await
    }

    /// The fence: extends the lease to `cover` from now, only while this taking still
    /// holds it. False when it was lost: the protected write must not be made.
    pub async fn extend(&self, conn: &mut Conn, cover: Duration) -> Result<bool, StoreError> {
        let held: i64 = RENEW_IF_HELD
            .key(&self.key)
            .arg(&self.token)
            .arg(millis(cover))
            .invoke_async(conn)
            .await?;
        Ok(held == 1)
    }

    /// Releases the lease if this taking still holds it.
    pub async fn release(&self, conn: &mut Conn) -> Result<(), StoreError> {
        unlock(conn, &self.key, &self.token).await
    }
}

/// A record that waits for a branch's merge lease: its shard and its `merge-retry`
/// timer's member in that shard's timers set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    /// The record's shard.
    pub shard: u16,
    /// `<record key>/merge-retry`.
    pub timer_member: String,
}

impl Waiter {
    /// The waiter of a PR record's merge retry.
    pub fn of_record(shard: u16, record_key: &str) -> Waiter {
        Waiter {
            shard,
            timer_member: format!("{record_key}/merge-retry"),
        }
    }

    fn encode(&self) -> String {
        format!("{}\t{}", self.shard, self.timer_member)
    }

    fn decode(s: &str) -> Option<Waiter> {
        let (shard, member) = s.split_once('\t')?;
        Some(Waiter {
            shard: shard.parse().ok()?,
            timer_member: member.to_owned(),
        })
    }
}

/// Adds `waiter` to the set `waiters` (kept in the order it first waited).
pub async fn add_waiter(
    conn: &mut Conn,
    waiters: &str,
    waiter: &Waiter,
    now_ms: i64,
) -> Result<(), StoreError> {
    let _: i64 = redis::cmd("ZADD")
        .arg(waiters)
        .arg("NX")
        .arg(now_ms)
        .arg(waiter.encode())
        .query_async(conn)
        .await?;
    Ok(())
}

/// Removes `waiter` from `waiters` (it took the lease).
pub async fn remove_waiter(
    conn: &mut Conn,
    waiters: &str,
    waiter: &Waiter,
) -> Result<(), StoreError> {
    let _: i64 = redis::cmd("ZREM")
        .arg(waiters)
        .arg(waiter.encode())
        .query_async(conn)
        .await?;
    Ok(())
}

/// How many waiters one release tries before giving up (each one whose timer is gone
/// is dropped: it was woken already, or its record moved on).
const WAKE_TRIES: usize = 8;

/// Wakes the oldest waiter whose `merge-retry` timer is still scheduled: the timer is
/// moved to `now_ms` (`ZADD XX LT`: only an existing timer, only earlier), so the timer
/// pollers queue it at once. Returns the woken waiter. A waiter popped here and not
/// woken (its timer already fired) loses nothing: its record is past the wait.
pub async fn wake_next_waiter(
    conn: &mut Conn,
    keys: &super::Keys,
    waiters: &str,
    now_ms: i64,
) -> Result<Option<Waiter>, StoreError> {
    for _ in 0..WAKE_TRIES {
        let popped: Vec<(String, f64)> =
            redis::cmd("ZPOPMIN").arg(waiters).query_async(conn).await?;
        let Some((raw, _)) = popped.into_iter().next() else {
            return Ok(None);
        };
        let Some(waiter) = Waiter::decode(&raw) else {
            tracing::warn!(member = %raw, "dropping a malformed merge waiter");
            continue;
        };
        let changed: i64 = redis::cmd("ZADD")
            .arg(keys.timers(waiter.shard))
            .arg("XX")
            .arg("LT")
            .arg("CH")
            .arg(now_ms)
            .arg(&waiter.timer_member)
            .query_async(conn)
            .await?;
        if changed == 1 {
            return Ok(Some(waiter));
        }
    }
    Ok(None)
}
