//! The merge queue of each target branch (`core::queue::BranchQueue`), stored as a
//! hash `{v, data}` under [`super::Keys::merge_queue`] and changed only by
//! compare-and-set on `v` in one Lua call (which also lists the branch in the
//! repository's set of queues, a key of the same slot). The rules are the core's:
//! load, apply the pure op, write back if nobody wrote in between, else start over.

use std::sync::LazyLock;

use redis::Script;

use super::{Conn, Keys, StoreError};
use crate::core::queue::{BranchQueue, Entry, Place, QueueOp, changed_places};

/// Writes `data` with version `ARGV[2]` iff the stored version is `ARGV[1]` (absent =
/// 0); adds the branch `ARGV[4]` to the repository's set of queues (`KEYS[2]`).
/// Returns 1 when written, 0 when the version moved.
static CAS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '0') \
         if v ~= tonumber(ARGV[1]) then return 0 end \
         redis.call('HSET', KEYS[1], 'v', ARGV[2], 'data', ARGV[3]) \
         redis.call('SADD', KEYS[2], ARGV[4]) \
         return 1",
    )
});

/// How often an op is tried again after losing the compare-and-set to another writer.
const CAS_TRIES: usize = 16;

/// The queue of `branch` as stored (an empty one when there is none).
pub async fn load(
    conn: &mut Conn,
    keys: &Keys,
    repo: &str,
    branch: &str,
) -> Result<BranchQueue, StoreError> {
    let key = keys.merge_queue(repo, branch);
    let data: Option<String> = redis::cmd("HGET")
        .arg(&key)
        .arg("data")
        .query_async(conn)
        .await?;
    match data {
        None => Ok(BranchQueue::new(branch)),
        Some(s) => serde_json::from_str(&s).map_err(|e| StoreError::Corrupt {
            key: key.clone(),
            reason: e.to_string(),
        }),
    }
}

/// The branches of `repo` that have a queue.
pub async fn branches(conn: &mut Conn, keys: &Keys, repo: &str) -> Result<Vec<String>, StoreError> {
    let mut out: Vec<String> = redis::cmd("SMEMBERS")
        .arg(keys.merge_queues(repo))
        .query_async(conn)
        .await?;
    out.sort();
    Ok(out)
}

/// What applying an op did.
#[derive(Debug)]
pub struct Applied {
    /// The queue after the op.
    pub queue: BranchQueue,
    /// The PRs to tell their new place.
    pub notices: Vec<(u64, Place)>,
    /// Whether the op changed the queue (false: a duplicate or stale op).
    pub changed: bool,
    /// The op's PR's entry before the op, if it had one.
    pub entry_before: Option<Entry>,
}

/// Changes the queue of `branch` with `f` under compare-and-set (the batched queue's
/// steps, issue 29); `f` may run more than once, on fresh loads.
pub async fn update(
    conn: &mut Conn,
    keys: &Keys,
    repo: &str,
    branch: &str,
    f: impl Fn(&mut BranchQueue),
) -> Result<Applied, StoreError> {
    let key = keys.merge_queue(repo, branch);
    for _ in 0..CAS_TRIES {
        let before = load(conn, keys, repo, branch).await?;
        let mut after = before.clone();
        f(&mut after);
        if after == before {
            return Ok(Applied {
                queue: before,
                notices: Vec::new(),
                changed: false,
                entry_before: None,
            });
        }
        after.version = before.version + 1;
        let data = serde_json::to_string(&after).map_err(|e| StoreError::Corrupt {
            key: key.clone(),
            reason: e.to_string(),
        })?;
        let written: i64 = CAS
            .key(&key)
            .key(keys.merge_queues(repo))
            .arg(before.version)
            .arg(after.version)
            .arg(data)
            .arg(branch)
            .invoke_async(conn)
            .await?;
        if written == 1 {
            let notices = changed_places(&before, &after);
            return Ok(Applied {
                queue: after,
                notices,
                changed: true,
                entry_before: None,
            });
        }
    }
    Err(StoreError::Protocol {
        script: "merge-queue compare-and-set",
        reply: format!("{key}: lost {CAS_TRIES} times in a row"),
    })
}

/// Applies `op` at `now_ms` under compare-and-set. An op that changes nothing (a
/// duplicate: its effect ran before and died before it was marked done) tells its own
/// PR and the head their current places again, so no notice is lost to a crash.
pub async fn apply(
    conn: &mut Conn,
    keys: &Keys,
    repo: &str,
    op: &QueueOp,
    now_ms: i64,
) -> Result<Applied, StoreError> {
    let key = keys.merge_queue(repo, &op.branch);
    for _ in 0..CAS_TRIES {
        let before = load(conn, keys, repo, &op.branch).await?;
        let mut after = before.clone();
        let entry_before = before
            .entries
            .iter()
            .find(|e| e.number == op.number)
            .cloned();
        if !after.apply(op, now_ms) {
            let places = before.places();
            let notices = places
                .into_iter()
                .filter(|(n, p)| *n == op.number || p.head)
                .collect();
            return Ok(Applied {
                queue: before,
                notices,
                changed: false,
                entry_before,
            });
        }
        after.version = before.version + 1;
        let data = serde_json::to_string(&after).map_err(|e| StoreError::Corrupt {
            key: key.clone(),
            reason: e.to_string(),
        })?;
        let written: i64 = CAS
            .key(&key)
            .key(keys.merge_queues(repo))
            .arg(before.version)
            .arg(after.version)
            .arg(data)
            .arg(&op.branch)
            .invoke_async(conn)
            .await?;
        if written == 1 {
            let notices = changed_places(&before, &after);
            return Ok(Applied {
                queue: after,
                notices,
                changed: true,
                entry_before,
            });
        }
    }
    // Other writers won the race every time: the entry stays pending and is retried.
    Err(StoreError::Protocol {
        script: "merge-queue compare-and-set",
        reply: format!("{key}: lost {CAS_TRIES} times in a row"),
    })
}

/// Changes the queue of `branch` with `change` (false: it changed nothing, nothing is
/// written) under compare-and-set, as [`apply`] does for ops; returns the queue after
/// and whether it changed. Used for what is not a PR's op (a freeze).
pub async fn change(
    conn: &mut Conn,
    keys: &Keys,
    repo: &str,
    branch: &str,
    mut change: impl FnMut(&mut BranchQueue) -> bool,
) -> Result<(BranchQueue, bool), StoreError> {
    let key = keys.merge_queue(repo, branch);
    for _ in 0..CAS_TRIES {
        let before = load(conn, keys, repo, branch).await?;
        let mut after = before.clone();
        if !change(&mut after) {
            return Ok((before, false));
        }
        after.version = before.version + 1;
        let data = serde_json::to_string(&after).map_err(|e| StoreError::Corrupt {
            key: key.clone(),
            reason: e.to_string(),
        })?;
        let written: i64 = CAS
            .key(&key)
            .key(keys.merge_queues(repo))
            .arg(before.version)
            .arg(after.version)
            .arg(data)
            .arg(branch)
            .invoke_async(conn)
            .await?;
        if written == 1 {
            return Ok((after, true));
        }
    }
    Err(StoreError::Protocol {
        script: "merge-queue compare-and-set",
        reply: format!("{key}: lost {CAS_TRIES} times in a row"),
    })
}
