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
    let (before, after) = cas(conn, keys, repo, branch, |q| {
        let old = q.clone();
        f(q);
        *q != old
    })
    .await?;
    Ok(match after {
        Some(after) => Applied {
            notices: changed_places(&before, &after),
            queue: after,
            changed: true,
            entry_before: None,
        },
        None => Applied {
            queue: before,
            notices: Vec::new(),
            changed: false,
            entry_before: None,
        },
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
    let mut entry_before = None;
    let (before, after) = cas(conn, keys, repo, &op.branch, |q| {
        entry_before = q.entries.iter().find(|e| e.number == op.number).cloned();
        q.apply(op, now_ms)
    })
    .await?;
    Ok(match after {
        Some(after) => Applied {
            notices: changed_places(&before, &after),
            queue: after,
            changed: true,
            entry_before,
        },
        None => Applied {
            notices: before
                .places()
                .into_iter()
                .filter(|(n, p)| *n == op.number || p.head)
                .collect(),
            queue: before,
            changed: false,
            entry_before,
        },
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
    change: impl FnMut(&mut BranchQueue) -> bool,
) -> Result<(BranchQueue, bool), StoreError> {
    Ok(match cas(conn, keys, repo, branch, change).await? {
        (_, Some(after)) => (after, true),
        (before, None) => (before, false),
    })
}

/// The compare-and-set loop of [`update`] and [`change`]: loads the queue, lets
/// `change` edit a copy (false: nothing to write) and writes it only over the version
/// it loaded, retrying on fresh loads. Returns the queue loaded last and, when written,
/// the queue written.
async fn cas(
    conn: &mut Conn,
    keys: &Keys,
    repo: &str,
    branch: &str,
    mut change: impl FnMut(&mut BranchQueue) -> bool,
) -> Result<(BranchQueue, Option<BranchQueue>), StoreError> {
    let key = keys.merge_queue(repo, branch);
    for _ in 0..CAS_TRIES {
        let before = load(conn, keys, repo, branch).await?;
        let mut after = before.clone();
        if !change(&mut after) {
            return Ok((before, None));
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
            return Ok((before, Some(after)));
        }
    }
    // Other writers won the race every time: the caller's entry stays pending and is
    // retried.
    Err(StoreError::Protocol {
        script: "merge-queue compare-and-set",
        reply: format!("{key}: lost {CAS_TRIES} times in a row"),
    })
}
