//! The work index: which work items are active, and where their results go.
//!
//! The commit script adds a work id (→ its owner `pr|issue TAB repo TAB number`) when it
//! commits a `Dispatch`, and removes it — leaving an "ended" marker with a TTL — when
//! the work ends. A result (results API or results stream) is accepted only for an
//! active id, and only once: `lua/report.lua` checks, marks the id reported and queues
//! the result as an internal event on the owner's shard in one call.

use std::sync::LazyLock;

use crate::store::Conn;
use redis::Script;
use tracing::instrument;

use super::event_entry::EventEntry;
use super::{Keys, StoreError};

/// The report script.
static REPORT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/report.lua")));

/// Who a work item belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkOwner {
    /// Shard of the owner's records.
    pub shard: u16,
    /// True for an issue (`issue-impl`), false for a PR.
    pub issue: bool,
    /// Repository `owner/name`.
    pub repo: String,
    /// PR or issue number.
    pub number: u64,
}

impl WorkOwner {
    /// The value stored in the work index.
    pub fn encode(issue: bool, repo: &str, number: u64) -> String {
        format!("{}\t{repo}\t{number}", if issue { "issue" } else { "pr" })
    }

    fn decode(shard: u16, v: &str) -> Option<Self> {
        let mut it = v.split('\t');
        let issue = match it.next()? {
            "issue" => true,
            "pr" => false,
            _ => return None,
        };
        let repo = it.next()?.to_owned();
        let number = it.next()?.parse().ok()?;
        Some(Self {
            shard,
            issue,
            repo,
            number,
        })
    }
}

/// What [`lookup`] found about a work id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkLookup {
    /// Active, owned by this record.
    Active(WorkOwner),
    /// Its claim ended because the agent's own push superseded it (no cancel): the
    /// agent's result is still accepted once, and recorded on that attempt.
    Superseded(WorkOwner),
    /// It existed and has ended (within the retention window).
    Ended,
    /// Never seen.
    Unknown,
}

/// Finds a work id in every shard's work index (one pipelined round trip).
#[instrument(skip_all, fields(work_id))]
pub async fn lookup(conn: &mut Conn, keys: &Keys, work_id: &str) -> Result<WorkLookup, StoreError> {
    // One small pipeline per shard (its two keys share the shard's hash slot; a Redis
    // Cluster refuses a pipeline across slots), all in flight at once: on one server
    // the multiplexed connection writes them together, one round trip as before.
    let replies: Vec<(Option<String>, Option<String>)> =
        futures_util::future::try_join_all((0..keys.shards()).map(|shard| {
            let mut conn = conn.clone();
            let mut pipe = redis::pipe();
            pipe.hget(keys.work_index(shard), work_id);
            pipe.get(keys.work_ended(shard, work_id));
            async move {
                let pair: (Option<String>, Option<String>) = pipe.query_async(&mut conn).await?;
                Ok::<_, StoreError>(pair)
            }
        }))
        .await?;
    let mut ended = false;
    for (shard, (owner, marker)) in (0..keys.shards()).zip(replies) {
        if let Some(owner) = owner.and_then(|v| WorkOwner::decode(shard, &v)) {
            return Ok(WorkLookup::Active(owner));
        }
        // The ended marker is `1`, or the owner of a claim the agent's push superseded.
        if let Some(owner) = marker.as_deref().and_then(|v| WorkOwner::decode(shard, v)) {
            return Ok(WorkLookup::Superseded(owner));
        }
        ended |= marker.is_some();
    }
    Ok(if ended {
        WorkLookup::Ended
    } else {
        WorkLookup::Unknown
    })
}

/// Whether a result was already queued for `work_id` (of `owner`): a runner that
/// finds one does not start the work again (a reclaimed entry whose result is queued
/// but not yet folded into the record).
pub async fn is_reported(
    conn: &mut Conn,
    keys: &Keys,
    owner: &WorkOwner,
    work_id: &str,
) -> Result<bool, StoreError> {
    let n: u64 = redis::cmd("EXISTS")
        .arg(keys.work_reported(owner.shard, work_id))
        .query_async(conn)
        .await?;
    Ok(n > 0)
}

/// What came of [`report`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportOutcome {
    /// Queued as an internal event with this stream id.
    Queued(String),
    /// The work id is not (or no longer) in the index and never ended: unknown.
    Unknown,
    /// The work has ended.
    Ended,
    /// A result was already queued for it.
    AlreadyReported,
}

/// The internal event carrying a work result.
#[derive(Debug, Clone)]
pub struct ResultEvent {
    /// Event name.
    pub event: String,
    /// Event JSON.
    pub body: String,
    /// Receive time, unix ms.
    pub received_ms: u64,
}

/// Queues `result` for `work_id` (owned by `owner`) unless the work is no longer active
/// or already reported, atomically. `marker_ttl_secs` bounds how long the "reported"
/// marker is kept.
#[instrument(skip_all, fields(work_id))]
pub async fn report(
    conn: &mut Conn,
    keys: &Keys,
    owner: &WorkOwner,
    work_id: &str,
    result: &ResultEvent,
    marker_ttl_secs: u64,
) -> Result<ReportOutcome, StoreError> {
    let shard = owner.shard;
    let delivery = format!("result:{work_id}");
    let reply: Vec<String> = REPORT
        .key(keys.work_index(shard))
        .key(keys.work_ended(shard, work_id))
        .key(keys.work_reported(shard, work_id))
        .key(keys.events(shard))
        .arg(work_id)
        .arg(marker_ttl_secs.max(1))
        .arg(EventEntry::internal(
            &delivery,
            &result.event,
            &owner.repo,
            result.received_ms,
            &result.body,
        ))
        .invoke_async(conn)
        .await?;
    match reply.as_slice() {
        [q, id] if q == "queued" => Ok(ReportOutcome::Queued(id.clone())),
        [s] if s == "unknown" => Ok(ReportOutcome::Unknown),
        [s] if s == "ended" => Ok(ReportOutcome::Ended),
        [s] if s == "reported" => Ok(ReportOutcome::AlreadyReported),
        other => Err(StoreError::Protocol {
            script: "report",
            reply: format!("{other:?}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_round_trip_through_the_index_value() {
        let v = WorkOwner::encode(true, "org/repo", 42);
        assert_eq!(
            WorkOwner::decode(3, &v),
            Some(WorkOwner {
                shard: 3,
                issue: true,
                repo: "org/repo".into(),
                number: 42
            })
        );
        assert_eq!(WorkOwner::decode(0, "pr\torg/repo\tx"), None);
        assert_eq!(WorkOwner::decode(0, "nope\torg/repo\t1"), None);
    }
}
