//! The figures behind the status page and `inspect owner/repo`: one summary line per
//! open PR (phase, reason, age of the phase, active work, tier), queue depth and lag
//! of every consumer group, dead-letter counts, the last resync time, and the work
//! items the agent runners (`shepherd agents`) hold, and the agents' spending (the
//! ledger: per repository, and the most expensive open PRs).

use std::collections::HashMap;

use crate::store::Conn;
use serde::{Deserialize, Serialize};

use super::timefmt::now_ms;
use super::{Ops, OpsError};
use crate::core::ids::RepoName;
use crate::core::machine::{Phase, decide};
use crate::core::record::{Hold, PrRecord};
use crate::store::agent_runs::{self, AgentRun};
use crate::store::commit::{self, history_fields};
use crate::store::keys::{AGENTS_GROUP, EXECUTORS_GROUP, WORKERS_GROUP};
use crate::store::queue as store_queue;
use crate::store::{archive, markers, streams};

/// History entries read back to find when the current phase began.
const PHASE_LOOKBACK: usize = 200;

/// One open PR, summarized.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PrSummary {
    /// Repository.
    pub repo: String,
    /// PR index.
    pub number: u64,
    /// Title.
    pub title: String,
    /// Phase (`awaiting-ci`, …).
    pub phase: String,
    /// Why.
    pub reason: String,
    /// When the phase began (unix ms; the first history entry of the current run of
    /// entries in this phase), if known.
    pub phase_since_ms: Option<i64>,
    /// Current tier and its name.
    pub tier: u8,
    /// Name of the tier.
    pub tier_name: String,
    /// Finished attempts.
    pub attempts: usize,
    /// Active work: kind, id, claim expiry (unix ms).
    pub active: Option<ActiveSummary>,
    /// Record version.
    pub version: u64,
    /// The reviewer agents' latest round, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<ReviewSummary>,
    /// Its place in its branch's merge queue, when it is in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_queue: Option<QueueSpot>,
}

/// One PR's place in its target branch's merge queue (from the stored queue).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSpot {
    /// Target branch.
    pub branch: String,
    /// 1-based position among the PRs waiting to be tested (1 = being tested); `None`
    /// while parked.
    pub position: Option<u32>,
    /// PRs waiting to be tested in the whole queue.
    pub length: u32,
    /// `testing` (the head), `waiting`, or `parked: <reason>` (ejected, keeping its
    /// ticket until it is ready again).
    pub state: String,
    /// `high` or `normal` (`/shepherd priority`).
    pub priority: String,
    /// Since when it waits in its current state of the queue (unix ms; re-entering
    /// after a parking restarts it).
    pub since_ms: i64,
    /// When it first entered the queue (unix ms).
    pub entered_ms: i64,
}

impl QueueSpot {
    /// One line: `main: position 2 of 3, waiting, priority normal`.
    pub fn line(&self) -> String {
        let at = match self.position {
            Some(p) => format!("position {p} of {}", self.length),
            None => "not in line".to_owned(),
        };
        format!(
            "{}: {at}, {}, priority {}",
            self.branch, self.state, self.priority
        )
    }
}

/// The merge queue of one target branch, in order: the PR being tested first, then
/// those waiting, then the parked ones.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BranchQueueSummary {
    /// Repository.
    pub repo: String,
    /// Target branch.
    pub branch: String,
    /// Its PRs, in queue order.
    pub entries: Vec<(u64, QueueSpot)>,
    /// PRs merged through it so far.
    pub merged: u64,
    /// Ejections so far, by reason.
    pub ejections: Vec<(String, u64)>,
}

/// The spots of every PR in `q`, in queue order (head, waiting, parked).
pub fn queue_spots(q: &crate::core::queue::BranchQueue) -> Vec<(u64, QueueSpot)> {
    let places = q.places();
    let order = q.order();
    let length = u32::try_from(order.len()).unwrap_or(u32::MAX);
    order
        .into_iter()
        .chain(q.parked())
        .map(|e| {
            let place = places.get(&e.number);
            let state = match (e.parked, q.head == Some(e.number)) {
                (Some(reason), _) => format!("parked: {}", reason.as_str()),
                (None, true) => "testing".to_owned(),
                (None, false) => "waiting".to_owned(),
            };
            let spot = QueueSpot {
                branch: q.branch.clone(),
                position: place.and_then(|p| p.position),
                length,
                state,
                priority: e.priority.as_str().to_owned(),
                since_ms: e.since_ms,
                entered_ms: e.entered_ms,
            };
            (e.number, spot)
        })
        .collect()
}

/// The merge queues of `repo`, one per target branch that has one.
pub async fn repo_queues(ops: &Ops, repo: &RepoName) -> Result<Vec<BranchQueueSummary>, OpsError> {
    let mut conn = ops.conn();
    let mut out = Vec::new();
    for branch in store_queue::branches(&mut conn, &ops.keys, repo.as_str()).await? {
        let q = store_queue::load(&mut conn, &ops.keys, repo.as_str(), &branch).await?;
        out.push(BranchQueueSummary {
            repo: repo.to_string(),
            branch,
            entries: queue_spots(&q),
            merged: q.stats.merged,
            ejections: (q.stats.ejections.iter())
                .map(|(e, n)| (e.as_str().to_owned(), *n))
                .collect(),
        });
    }
    Ok(out)
}

/// PR `record`'s spot in its branch's queue, read from the stored queue.
async fn queue_spot(
    ops: &Ops,
    conn: &mut Conn,
    record: &PrRecord,
) -> Result<Option<QueueSpot>, OpsError> {
    let Some(m) = &record.queue.membership else {
        return Ok(None);
    };
    let q = store_queue::load(conn, &ops.keys, record.repo.as_str(), &m.branch).await?;
    Ok(queue_spots(&q)
        .into_iter()
        .find(|(n, _)| *n == record.number)
        .map(|(_, spot)| spot))
}

/// The reviewer agents' latest round of a PR.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReviewSummary {
    /// Rounds so far (the latest's number).
    pub round: u32,
    /// `max_review_rounds`.
    pub max_rounds: u32,
    /// The reviewer agent of the latest round.
    pub reviewer: String,
    /// Its verdict (`approved`, `changes-requested`), once read.
    pub verdict: Option<String>,
}

impl ReviewSummary {
    /// One line: `round 2/3 by rev: changes-requested`.
    pub fn line(&self) -> String {
        format!(
            "round {}/{} by {}: {}",
            self.round,
            self.max_rounds,
            self.reviewer,
            self.verdict.as_deref().unwrap_or("pending")
        )
    }
}

/// The active work item of a PR.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ActiveSummary {
    /// Work id.
    pub id: String,
    /// Kind (`ci-fix`, …).
    pub kind: String,
    /// Tier.
    pub tier: u8,
    /// Tier name.
    pub tier_name: String,
    /// Claim expiry (unix ms).
    pub expires_ms: i64,
}

/// Depth and lag of one consumer group on one stream.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct QueueFigures {
    /// Stream key.
    pub stream: String,
    /// Consumer group.
    pub group: String,
    /// Entries in the stream (the archive, for events streams).
    pub length: u64,
    /// Entries not yet delivered to the group (`None` when Redis cannot tell).
    pub lag: Option<u64>,
    /// Entries delivered but not acknowledged.
    pub pending: u64,
    /// Consumers in the group.
    pub consumers: u64,
}

/// Everything the status page shows.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Overview {
    /// When it was computed (unix ms).
    pub now_ms: i64,
    /// Open PRs of every known repository.
    pub prs: Vec<PrSummary>,
    /// Events and effects queues of every shard.
    pub queues: Vec<QueueFigures>,
    /// Dead letters over all shards.
    pub dead_letters: u64,
    /// Last completed resync (unix ms), if any.
    pub last_resync_ms: Option<i64>,
    /// While an executor's Forgejo circuit breaker is open: milliseconds until its
    /// next probe.
    #[serde(default)]
    pub forgejo_circuit_open_ms: Option<i64>,
    /// Work items the agent runners hold now (waiting for a slot or running), whose
    /// runner's heartbeat is recent; oldest first.
    #[serde(default)]
    pub agents: Vec<AgentRun>,
    /// Agent runners with a recent heartbeat that run their agents unsandboxed
    /// (`SHEPHERD_AGENT_SANDBOX=off`), whether or not they hold work.
    #[serde(default)]
    pub unsandboxed_runners: Vec<String>,
    /// The merge queues of every known repository (policy `merge_queue`).
    #[serde(default)]
    pub merge_queues: Vec<BranchQueueSummary>,
    /// Agent spending per repository (the ledger): today, this month, what its caps
    /// leave; repositories with no spending this month and no cap are left out.
    #[serde(default)]
    pub spend: Vec<super::costs::RepoSpend>,
    /// The most expensive open PRs (lifetime cost), most expensive first.
    #[serde(default)]
    pub expensive_prs: Vec<super::costs::PrSpend>,
}

/// How old a runner's heartbeat may be for its items to show as live: its heartbeat
/// comes every third of the reclaim idle time, at most every 20 s.
fn agents_fresh(ops: &Ops) -> std::time::Duration {
    (ops.config.reclaim_idle * 2).min(std::time::Duration::from_secs(60))
}

/// Summaries of the open PRs of `repo` with a record, by number.
pub async fn repo_prs(ops: &Ops, repo: &RepoName) -> Result<Vec<PrSummary>, OpsError> {
    let mut conn = ops.conn();
    let index = ops.keys.repo_index(repo.as_str());
    let keys: Vec<String> = commit::index_members(&mut conn, &index)
        .await?
        .into_iter()
        .filter(|k| k.contains(":pr:"))
        .collect();
    let stored = commit::load_many(&mut conn, &keys).await?;
    let now = now_ms();
    let mut out = Vec::new();
    for (key, s) in keys.iter().zip(stored) {
        let Some(s) = s else { continue };
        let Ok(record) = PrRecord::from_json(&s.data) else {
            tracing::warn!(key = %key, "undecodable record skipped");
            continue;
        };
        if !record.is_open() {
            continue;
        }
        let hist = ops.keys.history(repo.as_str(), record.number);
        out.push(summarize(ops, &mut conn, &record, &hist, now).await?);
    }
    out.sort_by_key(|p| p.number);
    Ok(out)
}

/// One PR's summary.
pub async fn summarize(
    ops: &Ops,
    conn: &mut Conn,
    record: &PrRecord,
    history_key: &str,
    now: i64,
) -> Result<PrSummary, OpsError> {
    let policy = ops.policy.for_repo(&record.repo);
    let d = decide(record, &policy, now);
    let phase = d.phase.as_str().to_owned();
    let phase_since_ms = phase_since(conn, history_key, &phase).await?;
    let merge_queue = queue_spot(ops, conn, record).await?;
    Ok(PrSummary {
        repo: record.repo.to_string(),
        number: record.number,
        title: record
            .pr
            .as_ref()
            .map(|p| p.title.clone())
            .unwrap_or_default(),
        phase,
        reason: d.reason,
        phase_since_ms,
        tier: record.work.tier,
        tier_name: policy.tier_name(record.work.tier),
        attempts: usize::try_from(record.work.attempts_total()).unwrap_or(usize::MAX),
        active: record.work.active.as_ref().map(|a| ActiveSummary {
            id: a.item.id.to_string(),
            kind: a.item.kind.as_str().to_owned(),
            tier: a.item.tier,
            tier_name: policy.tier_name(a.item.tier),
            expires_ms: a.expires_ms,
        }),
        version: record.version,
        review: record.agent_review.rounds.last().map(|r| ReviewSummary {
            round: u32::try_from(record.agent_review.rounds.len()).unwrap_or(u32::MAX),
            max_rounds: policy.max_review_rounds,
            reviewer: r.reviewer.to_string(),
            verdict: r.verdict.map(|v| v.as_str().to_owned()),
        }),
        merge_queue,
    })
}

/// When the current run of history entries in `phase` began.
async fn phase_since(
    conn: &mut Conn,
    history_key: &str,
    phase: &str,
) -> Result<Option<i64>, OpsError> {
    let entries = archive::newest(conn, history_key, PHASE_LOOKBACK).await?;
    let mut since = None;
    for e in entries {
        let field = |name: &str| e.fields.get(name).map_or("", String::as_str);
        if field(history_fields::PHASE) != phase {
            break;
        }
        let at: Option<i64> = field(history_fields::AT).parse().ok();
        since = at.or(since);
    }
    Ok(since)
}

/// Queue figures of `group` on `stream` (zeros when the stream or group is missing).
pub async fn queue(conn: &mut Conn, stream: &str, group: &str) -> Result<QueueFigures, OpsError> {
    let length = streams::length(conn, stream).await?;
    let mut q = QueueFigures {
        stream: stream.to_owned(),
        group: group.to_owned(),
        length,
        lag: Some(length),
        ..QueueFigures::default()
    };
    if length == 0 {
        q.lag = Some(0);
        return Ok(q);
    }
    if let Ok(Some(g)) = streams::group_figures(conn, stream, group).await {
        q.lag = g.lag;
        q.pending = g.pending;
        q.consumers = g.consumers;
    }
    Ok(q)
}

/// Everything the status page shows.
#[tracing::instrument(skip_all)]
pub async fn overview(ops: &Ops) -> Result<Overview, OpsError> {
    let mut conn = ops.conn();
    let now = now_ms();
    let mut out = Overview {
        now_ms: now,
        ..Overview::default()
    };
    for shard in ops.shards() {
        out.queues
            .push(queue(&mut conn, &ops.keys.events(shard), WORKERS_GROUP).await?);
        out.queues
            .push(queue(&mut conn, &ops.keys.effects(shard), EXECUTORS_GROUP).await?);
        out.dead_letters += streams::length(&mut conn, &ops.keys.dead_letters(shard)).await?;
    }
    out.last_resync_ms = markers::last_resync(&mut conn, &ops.keys).await?;
    out.forgejo_circuit_open_ms = markers::open_circuit_ms(&mut conn, &ops.keys).await?;
    out.queues
        .push(queue(&mut conn, &ops.keys.dispatch(), AGENTS_GROUP).await?);
    out.agents = agent_runs::live(&mut conn, &ops.keys, now, agents_fresh(ops)).await?;
    out.unsandboxed_runners =
        agent_runs::unsandboxed_runners(&mut conn, &ops.keys, now, agents_fresh(ops)).await?;
    let repos = super::resync::known(ops).await?;
    for repo in &repos {
        out.prs.extend(repo_prs(ops, repo).await?);
        out.merge_queues.extend(repo_queues(ops, repo).await?);
    }
    (out.spend, out.expensive_prs) =
        super::costs::spend_overview(ops, &repos, &out.prs, now).await?;
    Ok(out)
}

/// Open PRs grouped by phase, in the order a person reads them.
pub fn by_phase(prs: &[PrSummary]) -> Vec<(String, Vec<&PrSummary>)> {
    let order = [
        Phase::NeedsHuman,
        Phase::MergeConflicts,
        Phase::CiFix,
        Phase::ReviewFeedback,
        Phase::ReadyToMerge,
        Phase::Queued,
        Phase::Merging,
        Phase::AwaitingReview,
        Phase::AwaitingCi,
        Phase::Paused,
        Phase::OverBudget,
        Phase::Merged,
        Phase::Closed,
    ];
    let mut groups: HashMap<&str, Vec<&PrSummary>> = HashMap::new();
    for p in prs {
        groups.entry(p.phase.as_str()).or_default().push(p);
    }
    order
        .iter()
        .filter_map(|ph| {
            groups
                .remove(ph.as_str())
                .map(|v| (ph.as_str().to_owned(), v))
        })
        .collect()
}

/// True when a record is held for a human.
pub fn needs_human(record: &PrRecord) -> bool {
    matches!(record.work.hold, Some(Hold::NeedsHuman { .. }))
}
