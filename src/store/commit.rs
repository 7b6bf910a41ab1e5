//! Compare-and-set commit of transitions, and record loads.
//!
//! A worker turns one events-stream entry into a [`CommitPlan`]: the new version of
//! every record the event touched (usually one PR; every open PR of a repository for a
//! repository-wide event), their history entries, the effects for the executor, the
//! timers, and the changes to the work index. [`commit`] runs it as ONE Lua call
//! (`lua/commit.lua`) that:
//!
//! 1. checks that the entry is still pending in the `workers` group — if a consumer
//!    that reclaimed it has committed it meanwhile, the plan is [`CommitOutcome::Stale`]
//!    and nothing is written, so every entry is committed at most once;
//! 2. compares every record's stored version with the version the plan was computed
//!    from — on a mismatch nothing is written and the worker reloads and steps again
//!    ([`CommitOutcome::Conflict`]);
//! 3. writes everything and acks the entry (ack after commit, atomically).
//!
//! The records live in the repository's shard; every key the script touches carries
//! that shard's hash tag, so the call is valid on Redis Cluster too.

use std::sync::LazyLock;

use crate::store::Conn;
use redis::Script;
use serde::Serialize;
use tracing::instrument;

use super::{Keys, StoreError, keys::WORKERS_GROUP};

/// Field names of an effects-stream entry: the contract between the worker (writer, in
/// the commit) and the executor (reader, consumer group `executors`).
pub mod effect_fields {
    /// Deterministic effect id (record key + version + index): the executor's
    /// idempotency key (`Keys::effect_done`) and the hidden marker in comments.
    pub const ID: &str = "id";
    /// Effect kind name (`dispatch`, `add_labels`, `merge`, `observe` …), for routing
    /// and metrics without decoding the body.
    pub const KIND: &str = "kind";
    /// The effect itself: `core::effect::Effect` as JSON.
    pub const EFFECT: &str = "effect";
    /// Key of the record whose transition produced the effect.
    pub const RECORD: &str = "record";
    /// Repository `owner/name`.
    pub const REPO: &str = "repo";
    /// PR or issue number.
    pub const NUMBER: &str = "number";
    /// Record version the transition produced.
    pub const VERSION: &str = "version";
    /// Events-stream id of the entry that caused the transition.
    pub const CAUSE: &str = "cause";
    /// Name of the event of that entry (`timer/ci-poll`, `resync`, `pull_request/…`),
    /// so the executor knows what an observation's reads are for without reading the
    /// entry back.
    pub const CAUSE_EVENT: &str = "cause_event";
    /// Receive time (unix ms) of that entry, for the end-to-end lag metric.
    pub const RECEIVED: &str = "received";
}

/// Field names of a history entry (one per committed transition of a record).
pub mod history_fields {
    /// Events-stream id of the entry that caused the transition.
    pub const ENTRY: &str = "entry";
    /// Delivery id (or internal event id) of that entry.
    pub const DELIVERY: &str = "delivery";
    /// Event name.
    pub const EVENT: &str = "event";
    /// The core's note on what the transition did and why.
    pub const NOTE: &str = "note";
    /// Phase after the transition.
    pub const PHASE: &str = "phase";
    /// Record version after the transition.
    pub const VERSION: &str = "version";
    /// Number of effects the transition produced.
    pub const EFFECTS: &str = "effects";
    /// Commit time, unix ms.
    pub const AT: &str = "at";
    /// Present (the original stream id) when the entry was a replay.
    pub const REPLAY: &str = "replay";
}

/// Approximate cap on the entries of one record's history stream.
const HISTORY_MAX: u32 = 5000;

/// The commit script (see the module docs).
static COMMIT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/commit.lua")));

/// The new state of one record.
#[derive(Debug, Clone)]
pub struct RecordWrite {
    /// Record key (`Keys::pr_record` / `Keys::issue_record`).
    pub key: String,
    /// History stream key of the record.
    pub history_key: String,
    /// Repository index key the record belongs to.
    pub index_key: String,
    /// Version the transition was computed from (0: the record did not exist).
    pub expect: u64,
    /// The record serialized (JSON), stored as version `expect + 1`; `None` when the
    /// transition changed nothing (the version is only checked).
    pub data: Option<String>,
    /// Phase after the transition (stored beside the data for cheap inspection).
    pub phase: String,
    /// Field/value pairs of the history entry (see [`history_fields`]); empty for no
    /// entry (a repository-wide event that did not concern this record).
    pub history: Vec<(String, String)>,
    /// Whether the record stays in the repository index (open records do; closed and
    /// merged ones leave it, so repository-wide events skip them).
    pub indexed: bool,
}

/// A timer to schedule: at `due_ms` the internal event `event` (JSON `body`) is queued
/// on the shard's events stream. Scheduling the same `(record, id)` again replaces it.
#[derive(Debug, Clone)]
pub struct TimerWrite {
    /// Due time, unix ms.
    pub due_ms: u64,
    /// Key of the record the timer belongs to.
    pub record: String,
    /// Timer id within the record.
    pub id: String,
    /// Repository `owner/name`.
    pub repo: String,
    /// Event name of the event to queue.
    pub event: String,
    /// The event as JSON.
    pub body: String,
}

impl TimerWrite {
    /// `timer` of the record at `record` (PR or issue `number` of `repo`), stored with
    /// the `TimerFired` event it becomes when due.
    pub fn for_timer(
        record: &str,
        repo: &crate::core::ids::RepoName,
        scope: crate::core::ids::Scope,
        number: u64,
        timer: &crate::core::effect::Timer,
    ) -> Self {
        let fired = crate::core::event::Event::TimerFired {
            repo: repo.clone(),
            scope,
            number,
            timer: timer.clone(),
        };
        Self {
            due_ms: u64::try_from(timer.due_ms).unwrap_or(0),
            record: record.to_owned(),
            id: timer.id.clone(),
            repo: repo.to_string(),
            event: fired.name(),
            body: serde_json::to_string(&fired).unwrap_or_default(),
        }
    }

    /// The sorted-set member: unique per record and timer id.
    pub fn member(&self) -> String {
        format!("{}/{}", self.record, self.id)
    }

    /// The payload stored beside it (`lua/timers.lua` parses it back): tab-separated,
    /// the body last since only it may contain tabs.
    pub fn payload(&self) -> String {
        format!("{}\t{}\t{}", self.repo, self.event, self.body)
    }
}

/// Everything one events-stream entry commits, in one shard.
#[derive(Debug, Clone, Default)]
pub struct CommitPlan {
    /// Shard of the records (and of the entry).
    pub shard: u16,
    /// Id of the events-stream entry being committed and acked; `None` for writes that
    /// come from no entry (`rebuild --apply`).
    pub entry_id: Option<String>,
    /// New record states (at least one).
    pub records: Vec<RecordWrite>,
    /// Effects-stream entries (field/value pairs, see [`effect_fields`]).
    pub effects: Vec<Vec<(String, String)>>,
    /// Timers to schedule.
    pub timers: Vec<TimerWrite>,
    /// Work dispatched: work id → owner (`pr|issue TAB repo TAB number`).
    pub work_add: Vec<(String, String)>,
    /// Work ended (result reported, cancelled, expired, superseded).
    pub work_end: Vec<String>,
    /// Of `work_end`, the ids whose claim the agent's own push superseded, with their
    /// owner: the ended marker holds the owner instead of `1`, so the agent's late
    /// result is still accepted once (`lua/report.lua`).
    pub work_superseded: Vec<(String, String)>,
    /// TTL of the ended-work markers, in seconds.
    pub ended_ttl_secs: u64,
}

/// What came of a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Everything written and the entry acked.
    Committed,
    /// The record at `index` (in plan order) is at version `found`, not the expected
    /// one: nothing written; reload and step again.
    Conflict {
        /// Index of the conflicting record in [`CommitPlan::records`].
        index: usize,
        /// Its current version.
        found: u64,
    },
    /// The entry is no longer pending (another consumer committed it): nothing written.
    Stale,
}

/// The plan as the script reads it (every scalar a string: Lua numbers are doubles).
#[derive(Serialize)]
struct WirePlan<'a> {
    group: &'a str,
    entry_id: &'a str,
    history_max: String,
    ended_ttl: String,
    records: Vec<WireRecord<'a>>,
    effects: Vec<Vec<&'a str>>,
    timers: Vec<[String; 3]>,
    work_add: Vec<[&'a str; 2]>,
    work_end: &'a [String],
    superseded: std::collections::BTreeMap<&'a str, &'a str>,
}

#[derive(Serialize)]
struct WireRecord<'a> {
    expect: String,
    version: String,
    write: &'static str,
    data: &'a str,
    phase: &'a str,
    history: Vec<&'a str>,
    indexed: &'static str,
}

fn flatten(pairs: &[(String, String)]) -> Vec<&str> {
    pairs
        .iter()
        .flat_map(|(k, v)| [k.as_str(), v.as_str()])
        .collect()
}

/// Runs `plan` atomically (see the module docs).
#[instrument(skip_all, fields(shard = plan.shard, entry = plan.entry_id.as_deref().unwrap_or("")))]
pub async fn commit(
    conn: &mut Conn,
    keys: &Keys,
    plan: &CommitPlan,
) -> Result<CommitOutcome, StoreError> {
    let wire = WirePlan {
        group: WORKERS_GROUP,
        entry_id: plan.entry_id.as_deref().unwrap_or(""),
        history_max: HISTORY_MAX.to_string(),
        ended_ttl: plan.ended_ttl_secs.max(1).to_string(),
        records: plan
            .records
            .iter()
            .map(|r| WireRecord {
                expect: r.expect.to_string(),
                version: (r.expect + 1).to_string(),
                write: if r.data.is_some() { "1" } else { "0" },
                data: r.data.as_deref().unwrap_or(""),
                phase: &r.phase,
                history: flatten(&r.history),
                indexed: if r.indexed { "1" } else { "0" },
            })
            .collect(),
        effects: plan.effects.iter().map(|e| flatten(e)).collect(),
        timers: plan
            .timers
            .iter()
            .map(|t| [t.due_ms.to_string(), t.member(), t.payload()])
            .collect(),
        work_add: plan
            .work_add
            .iter()
            .map(|(id, owner)| [id.as_str(), owner.as_str()])
            .collect(),
        work_end: &plan.work_end,
        superseded: plan
            .work_superseded
            .iter()
            .map(|(id, owner)| (id.as_str(), owner.as_str()))
            .collect(),
    };
    let json = serde_json::to_string(&wire).map_err(|e| StoreError::Protocol {
        script: "commit",
        reply: format!("cannot encode the plan: {e}"),
    })?;
    let shard = plan.shard;
    let mut inv = COMMIT.prepare_invoke();
    inv.key(keys.events(shard))
        .key(keys.effects(shard))
        .key(keys.timers(shard))
        .key(keys.work_index(shard))
        .key(keys.timer_data(shard));
    for r in &plan.records {
        inv.key(&r.key).key(&r.history_key).key(&r.index_key);
    }
    for id in &plan.work_end {
        inv.key(keys.work_ended(shard, id));
    }
    inv.arg(json);
    let reply: Vec<String> = inv.invoke_async(conn).await?;
    match reply.as_slice() {
        [ok] if ok == "ok" => Ok(CommitOutcome::Committed),
        [s] if s == "stale" => Ok(CommitOutcome::Stale),
        [c, index, found] if c == "conflict" => Ok(CommitOutcome::Conflict {
            index: index.parse().unwrap_or(0),
            found: found.parse().unwrap_or(0),
        }),
        other => Err(StoreError::Protocol {
            script: "commit",
            reply: format!("{other:?}"),
        }),
    }
}

/// A stored record: its version and serialized data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// Version (number of committed transitions).
    pub version: u64,
    /// Serialized record (JSON).
    pub data: String,
}

/// Loads the record at `key`; `None` when it does not exist yet (version 0).
pub async fn load(conn: &mut Conn, key: &str) -> Result<Option<StoredRecord>, StoreError> {
    let (v, data): (Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(key)
        .arg("v")
        .arg("data")
        .query_async(conn)
        .await?;
    match (v, data) {
        (None, _) => Ok(None),
        (Some(v), Some(data)) => {
            let version = v.parse().map_err(|_| StoreError::Corrupt {
                key: key.to_owned(),
                reason: format!("version {v:?} is not a number"),
            })?;
            Ok(Some(StoredRecord { version, data }))
        }
        (Some(_), None) => Err(StoreError::Corrupt {
            key: key.to_owned(),
            reason: "no data field".into(),
        }),
    }
}

/// Loads several records in one round trip (a repository-wide event); no keys, no
/// records (and no round trip).
pub async fn load_many(
    conn: &mut Conn,
    keys: &[String],
) -> Result<Vec<Option<StoredRecord>>, StoreError> {
    let mut pipe = redis::pipe();
    for k in keys {
        pipe.cmd("HMGET").arg(k).arg("v").arg("data");
    }
    let replies: Vec<(Option<String>, Option<String>)> =
        super::client::query_pipeline(conn, &pipe).await?;
    keys.iter()
        .zip(replies)
        .map(|(key, (v, data))| match (v, data) {
            (None, _) => Ok(None),
            (Some(v), Some(data)) => Ok(Some(StoredRecord {
                version: v.parse().map_err(|_| StoreError::Corrupt {
                    key: key.clone(),
                    reason: format!("version {v:?} is not a number"),
                })?,
                data,
            })),
            (Some(_), None) => Err(StoreError::Corrupt {
                key: key.clone(),
                reason: "no data field".into(),
            }),
        })
        .collect()
}

/// Members of a repository index (record keys of its open PRs and issues).
pub async fn index_members(conn: &mut Conn, index_key: &str) -> Result<Vec<String>, StoreError> {
    Ok(redis::cmd("SMEMBERS")
        .arg(index_key)
        .query_async(conn)
        .await?)
}
