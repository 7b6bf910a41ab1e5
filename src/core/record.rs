//! The per-PR and per-issue records: versioned, serializable facts (each with the time
//! it was observed) plus what is in flight. The store keeps one record per PR/issue
//! and commits a new one with compare-and-set on `version`.
//!
//! Versioning: `step` returns the record with `version` already incremented (old + 1)
//! when anything changed, and effect ids use that new version. The store commits it
//! if the stored version still equals the version the record had when loaded. A
//! transition that changes nothing returns the record untouched
//! ([`crate::core::machine::Transition::is_noop`]) and needs no commit.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::command::Command;
use super::effect::{WorkItem, WorkKind};
use super::event::{CiContext, IssueSnapshot, Permission, PrSnapshot, ReviewFact};
use super::ids::{Login, RepoName, Sha, WorkId};

/// Current record schema; bump it (and migrate in `from_json`) on incompatible change.
pub const SCHEMA: u32 = 1;

/// Everything Shepherd knows and has in flight for one pull request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrRecord {
    /// Record schema ([`SCHEMA`]).
    pub schema: u32,
    /// Version for compare-and-set; 0 for a record never committed.
    pub version: u64,
    /// Repository.
    pub repo: RepoName,
    /// PR index.
    pub number: u64,
    /// The newest PR snapshot (ordered by Forgejo's `updated_at`).
    pub pr: Option<PrSnapshot>,
    /// What is known about conflicts with the base branch.
    pub conflict: ConflictFact,
    /// CI contexts per commit (the head's and a few recent ones).
    pub ci: BTreeMap<Sha, ShaCi>,
    /// The latest review of each reviewer, from the last full read.
    pub reviews: Option<ReviewFacts>,
    /// Work, claims, attempts, tier, hold and commands.
    pub work: WorkState,
    /// Merge progress.
    pub merge: MergeState,
    /// The CI poll in progress (backoff), if any.
    pub ci_poll: Option<CiPoll>,
    /// Last human or CI activity (unix ms), for `stale-check`.
    pub last_activity_ms: i64,
    /// `last_activity_ms` at which a `stale-check` was last dispatched (once per lull).
    pub stale_checked_at: Option<i64>,
    /// The state block of the last status comment upserted (to edit only on change).
    pub status_comment: Option<String>,
    /// Linked issues were told about the merge.
    pub merge_announced: bool,
    /// Since when (unix ms) a short-lived status has been waiting to be written
    /// (`status_settle_secs`); `None` when the comment holds what the machine wants.
    #[serde(default)]
    pub status_pending_since_ms: Option<i64>,
    /// A status comment was asked for at least once (never reset, unlike
    /// `status_comment`, which a command clears to force a rewrite).
    #[serde(default)]
    pub status_posted: bool,
    /// Approvals announced by review webhooks (reviewer → when) since the last full
    /// reviews read. In merge mode `auto` they count towards the decision to try a
    /// merge without a reviews read first: the executor's pre-merge re-check reads
    /// the reviews anyway and alone decides whether the merge call is made. Cleared by
    /// a later full read (a new head asks for one).
    #[serde(default)]
    pub approval_hints: BTreeMap<Login, ApprovalHint>,
    /// The PR's part in its branch's merge queue (policy `merge_queue`).
    #[serde(default)]
    pub queue: QueueFacts,
    /// Reviewer agents' rounds on this PR (`review` work).
    #[serde(default, skip_serializing_if = "AgentReview::is_empty")]
    pub agent_review: AgentReview,
    /// `/shepherd agents on` by a user with write access: agent work for a PR outside
    /// `agent_authors`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents_on: Option<AgentsOn>,
    /// The last `/shepherd agents on` refused (its author has no write access).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents_on_refused: Option<AgentsOn>,
    /// When the PR author's permission was last asked for (`agent_authors`), so a
    /// step asks once, not at every event while the read is under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author_read_ms: Option<i64>,
}

/// Who gave `/shepherd agents on` (or had it refused), and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentsOn {
    /// The commenter.
    pub by: Login,
    /// When the command ran (unix ms).
    pub at_ms: i64,
}

/// An approval announced by a review webhook and not read yet (`approval_hints`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalHint {
    /// When the webhook was stepped (unix ms); a reviews read taken later drops it.
    pub at_ms: i64,
}

/// What a PR record knows and has asked of its target branch's merge queue
/// (`core::queue`). Level-triggered like the rest: `membership` is what the record
/// last asked for, and a differing wish sends a new op.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueFacts {
    /// What the record last asked of the queue (None: never asked, or left).
    #[serde(default)]
    pub membership: Option<QueueMembership>,
    /// Where the queue last said the PR stands (its notices carry it).
    #[serde(default)]
    pub place: Option<crate::core::queue::Place>,
    /// Position class (`/shepherd priority`).
    #[serde(default)]
    pub priority: crate::core::queue::Priority,
    /// The record version of the last op sent: only a place that reflects it counts.
    #[serde(default)]
    pub sent_version: u64,
    /// `/shepherd dequeue`: stays out of the queue until `/shepherd queue`.
    #[serde(default)]
    pub dequeued: bool,
    /// Updates onto a moving tip during the current turn at the head.
    #[serde(default)]
    pub updates: u32,
    /// The head an update replaced: until a new head arrives the record waits for it
    /// (it does not ask to merge the old head again).
    #[serde(default)]
    pub updated_from: Option<Sha>,
    /// The head the last update produced (set when it arrives).
    #[serde(default)]
    pub updated_head: Option<Sha>,
    /// The tip the last update built the PR on; a CI failure on the head that update
    /// produced failed "only on top of the new base".
    #[serde(default)]
    pub updated_onto: Option<Sha>,
    /// Since when (unix ms) the queue's head has waited for CI on this head sha
    /// (`merge_queue_ci_timeout_secs`); `None` when not the head or CI settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_wait: Option<(Sha, i64)>,
    /// The head's CI did not settle in time: the record parks (`ci-timeout`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ci_timed_out: bool,
    /// The head was held by a freeze of its queue: why and until when (the status
    /// comment shows it), and when to ask again (unix ms; 0: now, as after a notice of
    /// the queue). Cleared by the next outcome of an advance that is not `Frozen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frozen: Option<(String, i64)>,
    /// The batched queue ejected this head (issue 29): work for it until a new head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_failure: Option<BatchFailure>,
}

/// Why the batched merge queue ejected a PR's head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchFailure {
    /// The head it was batched with.
    pub head: Sha,
    /// `ci-failed` (after bisection) or `conflict` (while the batch was built).
    pub reason: crate::core::queue::Ejection,
    /// The failing checks (for `ci-failed`).
    #[serde(default)]
    pub failing: Vec<String>,
    /// What it was tested with ("failed on top of …").
    pub note: String,
}

/// What a PR asked of its branch's queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueMembership {
    /// Target branch.
    pub branch: String,
    /// Joined (to be tested), or parked with the reason, keeping its ticket.
    pub parked: Option<crate::core::queue::Ejection>,
    /// The priority it joined with.
    pub priority: crate::core::queue::Priority,
}

/// Reviewer-agent rounds of one PR: one per `review` dispatch, so at most one per
/// head sha ever, and at most `max_review_rounds` (validated ≤ 20) in all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentReview {
    /// Every review dispatch, oldest first.
    #[serde(default)]
    pub rounds: Vec<ReviewRound>,
    /// The rounds ran out and the PR was handed to a human (once: after a resume the
    /// PR waits for a human review instead of going back to `needs-human`).
    #[serde(default)]
    pub exhausted: bool,
}

impl AgentReview {
    /// Nothing recorded (records that never had a review keep their JSON as before).
    pub fn is_empty(&self) -> bool {
        self.rounds.is_empty() && !self.exhausted
    }
}

/// One review dispatch and what came of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewRound {
    /// The head the review was dispatched for.
    pub head_sha: Sha,
    /// The work item.
    pub work_id: WorkId,
    /// The reviewer agent's user named in the work item.
    pub reviewer: Login,
    /// Dispatch time (unix ms).
    pub dispatched_ms: i64,
    /// The verdict of a reviewer agent's formal review on `head_sha`, once read.
    #[serde(default)]
    pub verdict: Option<ReviewVerdict>,
    /// That review's id.
    #[serde(default)]
    pub review_id: Option<i64>,
}

/// A reviewer agent's verdict on one head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReviewVerdict {
    /// `APPROVED`.
    Approved,
    /// `REQUEST_CHANGES`.
    ChangesRequested,
}

impl ReviewVerdict {
    /// The verdict's name.
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewVerdict::Approved => "approved",
            ReviewVerdict::ChangesRequested => "changes-requested",
        }
    }
}

/// Work bookkeeping shared by PR and issue records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkState {
    /// The one active work item, if any (the claim).
    pub active: Option<ActiveWork>,
    /// The last [`ATTEMPTS_KEPT`] finished attempts, oldest first (older ones are
    /// counted in `attempts_dropped`; add them with [`WorkState::push_attempt`]).
    pub attempts: Vec<Attempt>,
    /// Finished attempts dropped from the front of `attempts` (counted, not kept).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts_dropped: u64,
    /// `attempts_dropped` by kind (a work item's attempt number counts them too).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attempts_dropped_by_kind: BTreeMap<WorkKind, u64>,
    /// [`WorkState::attempts_total`] at the last resume: `max_attempts_total`
    /// counts the attempts since.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts_base: u64,
    /// A push by this user arrived while the PR needed a human and their permission
    /// was not known: the hold ends if the permission read says write access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_by_push: Option<Login>,
    /// Current tier; never goes down.
    pub tier: u8,
    /// Attempts before this index do not count towards `needs-human` or awaiting a
    /// push (reset by resume and retry).
    pub stuck_base: usize,
    /// Paused or needs-human.
    pub hold: Option<Hold>,
    /// Work items dispatched so far (the next work id's sequence number).
    pub seq: u64,
    /// Managed labels Shepherd has asked for (claim, tier, needs-human).
    pub labels_applied: BTreeSet<String>,
    /// Known repository permissions of commenters.
    pub permissions: BTreeMap<Login, PermissionFact>,
    /// Commands waiting for the commenter's permission to be observed.
    pub pending_commands: Vec<PendingCommand>,
    /// Ids of comments whose commands were handled (a redelivery does nothing twice):
    /// the [`HANDLED_COMMENTS_KEPT`] highest; lower ones are covered by
    /// `handled_floor`.
    pub handled_comments: Vec<i64>,
    /// Comments with an id at or below this are never handled again: it is the
    /// highest id dropped from `handled_comments`, so every comment ever handled is
    /// either in that list or at or below the floor, and a replayed delivery of it,
    /// however old, runs nothing (O(1) state for the life of the record).
    #[serde(default)]
    pub handled_floor: i64,
    /// Spending and budget holds (issue 28).
    #[serde(default, skip_serializing_if = "BudgetFacts::is_empty")]
    pub budget: BudgetFacts,
    /// Transient agent failures in a row and the back-off before the next try
    /// (issue 27, `machine::transient`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transient: Option<TransientRetry>,
    /// What a previous (polling) dispatcher left: carried tier and attempts, a claim
    /// label Shepherd did not set (issue 27; `core::legacy`).
    #[serde(
        default,
        skip_serializing_if = "crate::core::legacy::LegacyFacts::is_empty"
    )]
    pub legacy: crate::core::legacy::LegacyFacts,
}

/// Transient agent failures (model 429/5xx, overload, timeouts) reported in a row by
/// a record's work items, none counted as an attempt (issue 27).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransientRetry {
    /// How many in a row (1 after the first); past `transient_retries` the next one
    /// is a failed attempt.
    pub count: u32,
    /// The kind of the last one (its claim label stays while the retry waits).
    pub kind: WorkKind,
    /// No agent work for the record before this (unix ms); `None` once the back-off
    /// timer fired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at_ms: Option<i64>,
    /// What the last one said (bounded, like an attempt's summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// What a record knows of its spending and budget (issue 28).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetFacts {
    /// `over-budget`: no agent work until the stop's reset or a grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<BudgetHold>,
    /// What `/shepherd budget +<amount>` granted this record and it has not spent.
    #[serde(skip_serializing_if = "crate::core::budget::Grant::is_empty")]
    pub grant: crate::core::budget::Grant,
    /// Micro-dollars spent by every run whose result said (the cost so far).
    pub spent_micros: u64,
    /// Input + output tokens spent by those runs.
    pub spent_tokens: u64,
    /// Runs whose result carried usage.
    pub runs: u64,
}

impl BudgetFacts {
    /// Nothing known (records without budget facts keep their JSON as before).
    pub fn is_empty(&self) -> bool {
        *self == BudgetFacts::default()
    }
}

/// Why a record is `over-budget`, and until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetHold {
    /// The decision that stopped it (the cap, what was left and needed, the reset).
    pub stop: crate::core::budget::Stop,
    /// Since when (unix ms).
    pub since_ms: i64,
}

/// Whether a counter is zero (kept out of the JSON, so records without dropped
/// attempts keep their JSON as before).
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How many finished attempts a record keeps in full (the rest are counted).
pub const ATTEMPTS_KEPT: usize = 10;

impl WorkState {
    /// Every finished attempt ever, kept or dropped.
    pub fn attempts_total(&self) -> u64 {
        self.attempts_dropped
            .saturating_add(u64::try_from(self.attempts.len()).unwrap_or(u64::MAX))
    }

    /// Finished attempts of `kind` ever, kept or dropped.
    pub fn attempts_of(&self, kind: WorkKind) -> u64 {
        let kept = self.attempts.iter().filter(|a| a.kind == kind).count();
        let dropped = self
            .attempts_dropped_by_kind
            .get(&kind)
            .copied()
            .unwrap_or(0);
        dropped.saturating_add(u64::try_from(kept).unwrap_or(u64::MAX))
    }

    /// The 1-based number (among all attempts ever) of `attempts[i]`.
    pub fn attempt_number(&self, i: usize) -> u64 {
        self.attempts_dropped
            .saturating_add(u64::try_from(i).unwrap_or(u64::MAX))
            .saturating_add(1)
    }

    /// Adds a finished attempt, dropping the oldest beyond [`ATTEMPTS_KEPT`] into the
    /// counters (and moving `stuck_base` with them).
    pub fn push_attempt(&mut self, attempt: Attempt) {
        self.attempts.push(attempt);
        while self.attempts.len() > ATTEMPTS_KEPT {
            let dropped = self.attempts.remove(0);
            self.attempts_dropped = self.attempts_dropped.saturating_add(1);
            let n = self
                .attempts_dropped_by_kind
                .entry(dropped.kind)
                .or_default();
            *n = n.saturating_add(1);
            self.stuck_base = self.stuck_base.saturating_sub(1);
        }
    }
}

/// How many open linking PRs an issue record tracks (more are not held on to: each
/// one costs an outsider only a PR, so the record must not grow with them).
pub const LINKING_PRS_KEPT: usize = 16;

/// Most commands a record holds while their authors' permissions are looked up. A
/// login's commands past [`MAX_PENDING_PER_LOGIN`] are dropped (the comment still
/// counts as handled); a newcomer past this bound evicts the oldest commands of other
/// logins. One lookup answers in seconds and empties its login's queue, so only a
/// flood loses anything.
pub const MAX_PENDING_COMMANDS: usize = 32;

/// Most commands one login has waiting for its permission lookup: one lookup answers
/// them all, so more only fill the record (and [`MAX_PENDING_COMMANDS`] evicts the
/// oldest of others rather than refusing a newcomer).
pub const MAX_PENDING_PER_LOGIN: usize = 4;

/// Longest agent summary kept in a record (bytes); longer ones are cut on a char
/// boundary and marked (see [`bounded_text`]). The summary is copied into every
/// later work item of the record.
pub const MAX_SUMMARY_BYTES: usize = 2_000;

/// Longest agent-reported failure signature kept in a record (bytes), cut likewise.
pub const MAX_REPORTED_SIGNATURE_BYTES: usize = 200;

/// How many earlier attempts a work item's context carries: the most recent ones.
pub const WORK_ITEM_ATTEMPTS: usize = 10;

/// `text` cut to at most `max` bytes on a char boundary, with a note saying how long
/// it was when cut (the note fits within `max`).
pub fn bounded_text(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut note = format!(" … [truncated from {} bytes]", text.len());
    if note.len() > max {
        // Too small a bound for the note: the cut text alone, still within `max`.
        note.clear();
    }
    let mut end = max.saturating_sub(note.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{note}", &text[..end])
}

/// How many handled comment ids a record remembers beside the floor (room for
/// deliveries that arrive out of id order: a comment is only missed if it arrives
/// after this many newer command comments were handled).
pub const HANDLED_COMMENTS_KEPT: usize = 64;

/// What is known about conflicts (Forgejo's `mergeable` is also false while a conflict
/// check runs and for WIP PRs, so one `false` is only a suspicion).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum ConflictFact {
    /// Not known (new head, or never read).
    Unknown,
    /// Mergeable.
    Clean,
    /// One read said not mergeable at `since_ms`; confirmed by a later read.
    Suspected {
        /// When (unix ms, worker clock).
        since_ms: i64,
    },
    /// Conflicts confirmed (two reads apart, or a merge attempt said so).
    Conflicting,
}

/// CI contexts of one commit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShaCi {
    /// Latest status per context (ordered by Forgejo's `updated_at`).
    pub contexts: BTreeMap<String, CiContext>,
    /// When the combined status was last read (unix ms); 0 if only events were seen.
    pub observed_ms: i64,
}

/// Reviews as of one full read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReviewFacts {
    /// When they were read (unix ms).
    pub at_ms: i64,
    /// The latest approving or change-requesting review of each reviewer (comment-only
    /// reviews do not change a reviewer's stance).
    pub latest: BTreeMap<Login, ReviewFact>,
}

/// The claimed work item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveWork {
    /// The item as dispatched.
    pub item: WorkItem,
    /// Signature of the problem it was dispatched for.
    pub signature: String,
    /// When it was dispatched (unix ms).
    pub dispatched_ms: i64,
    /// When the claim expires (unix ms).
    pub expires_ms: i64,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttemptOutcome {
    /// The agent reported success.
    Succeeded,
    /// The agent reported failure.
    Failed,
    /// The agent found nothing to change.
    NoChanges,
    /// The claim's TTL ran out (a failed attempt).
    Expired,
    /// A new head arrived before the result (the agent's own push, usually).
    Superseded,
    /// The PR/issue closed, or a human took over.
    Cancelled,
    /// The work item never reached an agent (dispatch failed after retries).
    DispatchFailed,
    /// The runner stopped the agent when its spending reached the run's budget
    /// (issue 28): the record waits in `over-budget`; escalation and the stuck rule
    /// pass over such attempts, so a budget stop never raises the tier.
    OverBudget,
}

impl AttemptOutcome {
    /// The outcome's name.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::NoChanges => "no-changes",
            AttemptOutcome::Expired => "expired",
            AttemptOutcome::Superseded => "superseded",
            AttemptOutcome::Cancelled => "cancelled",
            AttemptOutcome::DispatchFailed => "dispatch-failed",
            AttemptOutcome::OverBudget => "over-budget",
        }
    }
}

/// One finished attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The work item.
    pub work_id: WorkId,
    /// Kind.
    pub kind: WorkKind,
    /// Tier used.
    pub tier: u8,
    /// Signature of the problem it addressed (escalation compares these).
    pub signature: String,
    /// The head it worked on.
    pub head_sha: Option<Sha>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The agent's own failure signature, if reported.
    pub reported_signature: Option<String>,
    /// The agent's summary, if reported.
    pub summary: Option<String>,
    /// Dispatch time (unix ms).
    pub started_ms: i64,
    /// End time (unix ms).
    pub ended_ms: i64,
    /// What the run cost in micro-dollars, when its result said (issue 28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micros: Option<u64>,
    /// Its input + output tokens, when its result said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

/// Why nothing is dispatched or merged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "hold")]
pub enum Hold {
    /// `/shepherd pause`.
    Paused {
        /// Who paused it.
        by: Option<Login>,
        /// Since when (unix ms).
        since_ms: i64,
    },
    /// Stuck, or a merge failed permanently: a human must act.
    NeedsHuman {
        /// Why.
        reason: String,
        /// Since when (unix ms).
        since_ms: i64,
        /// A snapshot has shown the needs-human label (so its absence now means a human
        /// removed it).
        label_seen: bool,
    },
}

/// Merge progress (mode `auto`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum MergeState {
    /// Nothing in progress.
    Idle,
    /// Reviews are being re-read before merging `sha`. Written by builds before
    /// issue 17's whole-life economy (the executor's pre-merge re-check reads the
    /// reviews, so the machine no longer reads them first); a stored record in this
    /// state merges at its next step, or starts over when its timer comes.
    Verifying {
        /// The head to merge.
        sha: Sha,
        /// When the re-read was requested (a reviews read at or after it verifies).
        since_ms: i64,
    },
    /// A `Merge` effect is out.
    InFlight {
        /// The pinned head.
        sha: Sha,
        /// Since when (unix ms).
        since_ms: i64,
    },
    /// Forgejo said "try again later", or the target branch's merge lease was busy:
    /// not before `not_before_ms`.
    Backoff {
        /// Earliest next attempt (unix ms).
        not_before_ms: i64,
        /// Waiting for the branch's merge lease: the executor that releases it wakes
        /// this record's `merge-retry` timer early (`store::lock::wake_next_waiter`),
        /// so the timer ends the back-off whenever it fires; `not_before_ms` is then
        /// only the fallback for a holder that died.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        lease_wait: bool,
    },
}

/// A CI poll in progress for one head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CiPoll {
    /// The head being polled.
    pub sha: Sha,
    /// Polls made so far (the next delay is initial × 2^n, capped).
    pub n: u32,
    /// When the next poll is due (unix ms).
    pub due_ms: i64,
    /// A Forgejo Actions event named this head: from then on its finished runs say
    /// when to read, so the backoff reads stop (issue 17). Pending contexts of an
    /// external CI on the same head are still read by the resync (CI not settled).
    #[serde(default)]
    pub events: bool,
}

/// A commenter's observed permission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionFact {
    /// The level.
    pub permission: Permission,
    /// When it was read (unix ms).
    pub at_ms: i64,
}

/// A command waiting for its author's permission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingCommand {
    /// Who gave it.
    pub login: Login,
    /// The command.
    pub command: Command,
    /// The comment it came from.
    pub comment_id: i64,
}

/// Everything Shepherd knows and has in flight for one issue with `issue-impl` work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IssueRecord {
    /// Record schema ([`SCHEMA`]).
    pub schema: u32,
    /// Version for compare-and-set (same rules as [`PrRecord::version`]).
    pub version: u64,
    /// Repository.
    pub repo: RepoName,
    /// Issue index.
    pub number: u64,
    /// The newest issue snapshot.
    pub issue: Option<IssueSnapshot>,
    /// `issue-impl` work, claims, attempts, tier, hold and commands.
    pub work: WorkState,
    /// The merged PR that implements it (done: no more `issue-impl`). Only a merge
    /// sets it: an open PR can still be closed unmerged.
    pub done_by_pr: Option<u64>,
    /// Open PRs by a bot author (the agents' own) whose body links the issue: while any is open no new `issue-impl` is
    /// dispatched; one closed unmerged (or no longer linking) is removed again.
    /// At most [`LINKING_PRS_KEPT`].
    #[serde(default)]
    pub linking_prs: BTreeSet<u64>,
    /// A trusted `/shepherd implement` asked for `issue-impl` (as the label does).
    #[serde(default)]
    pub requested: bool,
    /// The issue's dependencies (Forgejo issue dependencies) as last read, and
    /// whether a read is due or in flight: every dispatch is preceded by a read.
    #[serde(default)]
    pub deps: DependencyState,
}

/// What an issue record knows of its dependencies (`core::machine::issue_deps`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DependencyState {
    /// The last read: when, and every dependency Forgejo listed.
    pub read: Option<DependencyRead>,
    /// The last read may be used for a dispatch: set by a read, cleared by the
    /// dispatch it allowed and by the recheck timer.
    pub fresh: bool,
    /// A read was asked for at this time and has not come back yet.
    pub requested_ms: Option<i64>,
}

/// One read of an issue's dependencies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DependencyRead {
    /// When it was read (unix ms).
    pub at_ms: i64,
    /// The dependencies, open and closed.
    pub items: Vec<super::event::DependencyFact>,
}

impl PrRecord {
    /// A fresh record (version 0) for a PR nothing is known about yet.
    pub fn new(repo: RepoName, number: u64) -> PrRecord {
        PrRecord {
            schema: SCHEMA,
            version: 0,
            repo,
            number,
            pr: None,
            conflict: ConflictFact::Unknown,
            ci: BTreeMap::new(),
            reviews: None,
            work: WorkState::default(),
            merge: MergeState::Idle,
            ci_poll: None,
            last_activity_ms: 0,
            stale_checked_at: None,
            status_comment: None,
            merge_announced: false,
            status_pending_since_ms: None,
            status_posted: false,
            approval_hints: BTreeMap::new(),
            queue: QueueFacts::default(),
            agent_review: AgentReview::default(),
            agents_on: None,
            agents_on_refused: None,
            author_read_ms: None,
        }
    }

    /// The current head commit, if known.
    pub fn head_sha(&self) -> Option<&Sha> {
        self.pr.as_ref().and_then(|p| p.head_sha.as_ref())
    }

    /// Whether the PR is known to be open (the worker fans `Target::Repo` events out
    /// to open records only).
    pub fn is_open(&self) -> bool {
        matches!(
            self.pr.as_ref().map(|p| p.state),
            Some(super::event::PrState::Open)
        )
    }

    /// Issues the PR body links with `Closes/Fixes/Resolves #N` (the worker delivers
    /// PR events to these issues' records too).
    pub fn linked_issues(&self) -> BTreeSet<u64> {
        self.pr
            .as_ref()
            .map(|p| linked_issues(&p.body))
            .unwrap_or_default()
    }

    /// Serializes for the store.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Deserializes from the store, naming the JSON path of a mismatch.
    pub fn from_json(text: &str) -> Result<PrRecord, RecordError> {
        decode(text)
    }
}

impl IssueRecord {
    /// A fresh record (version 0).
    pub fn new(repo: RepoName, number: u64) -> IssueRecord {
        IssueRecord {
            schema: SCHEMA,
            version: 0,
            repo,
            number,
            issue: None,
            work: WorkState::default(),
            done_by_pr: None,
            linking_prs: BTreeSet::new(),
            requested: false,
            deps: DependencyState::default(),
        }
    }

    /// Serializes for the store.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Deserializes from the store, naming the JSON path of a mismatch.
    pub fn from_json(text: &str) -> Result<IssueRecord, RecordError> {
        decode(text)
    }
}

/// A stored record that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Malformed JSON or a schema mismatch at `path`.
    #[error("record at {path}: {message}")]
    Decode {
        /// JSON path of the problem.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Written by a newer Shepherd.
    #[error("record schema {0} is newer than this Shepherd understands ({SCHEMA})")]
    Schema(u32),
}

/// Decodes a record and checks its schema.
fn decode<T: serde::de::DeserializeOwned + HasSchema>(text: &str) -> Result<T, RecordError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    let value: T = serde_path_to_error::deserialize(de).map_err(|e| RecordError::Decode {
        path: e.path().to_string(),
        message: e.inner().to_string(),
    })?;
    match value.schema() {
        s if s > SCHEMA => Err(RecordError::Schema(s)),
        _ => Ok(value),
    }
}

/// Records carry a schema number.
trait HasSchema {
    /// The stored schema.
    fn schema(&self) -> u32;
}

impl HasSchema for PrRecord {
    fn schema(&self) -> u32 {
        self.schema
    }
}

impl HasSchema for IssueRecord {
    fn schema(&self) -> u32 {
        self.schema
    }
}

/// Most linked issues taken from one PR body. Each one is a record the worker loads,
/// steps and commits with the PR's events, so the number must stay small whatever the
/// body says: links past the first `MAX_LINKED_ISSUES` distinct ones are ignored (a
/// body with 100,000 `Closes #N` once stalled a shard for minutes).
pub const MAX_LINKED_ISSUES: usize = 20;

/// The verbs that link an issue (Forgejo's closing keywords).
const LINK_VERBS: [&str; 9] = [
    "close", "closes", "closed", "fix", "fixes", "fixed", "resolve", "resolves", "resolved",
];

/// Issue numbers a body links with `close[sd]`, `fix(e[sd])`, `resolve[sd]` + `#N`
/// (case-insensitive, same repository only): the first [`MAX_LINKED_ISSUES`] distinct
/// ones. One pass over the words without copying the body, stopping at the cap, so a
/// hostile body costs time linear in its length at most.
pub fn linked_issues(body: &str) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    let mut words = body
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .filter(|w| !w.is_empty());
    let Some(mut prev) = words.next() else {
        return out;
    };
    for word in words {
        if is_link_verb(prev)
            && let Some(n) = issue_ref(word)
        {
            out.insert(n);
            if out.len() >= MAX_LINKED_ISSUES {
                break;
            }
        }
        prev = word;
    }
    out
}

/// Whether `word` (with an optional trailing `:`) is a linking verb.
fn is_link_verb(word: &str) -> bool {
    let verb = word.trim_end_matches(':');
    LINK_VERBS.iter().any(|v| v.eq_ignore_ascii_case(verb))
}

/// `#N` (with optional trailing punctuation) → `N`.
fn issue_ref(word: &str) -> Option<u64> {
    let target = word.trim_end_matches(['.', ';', ':', '!']);
    target.strip_prefix('#')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linked_issues_are_found() {
        let body = "Fixes #12, closes #3.\nResolves: #7\nsee #9\nfix#10 Closed #x";
        assert_eq!(linked_issues(body), BTreeSet::from([3, 7, 12]));
        assert_eq!(linked_issues(""), BTreeSet::new());
        assert_eq!(linked_issues("CLOSES #4"), BTreeSet::from([4]));
    }

    #[test]
    fn linked_issue_fan_out_of_a_100_000_link_body_is_capped() {
        let body: String = (1..=100_000).map(|n| format!("Closes #{n}\n")).collect();
        let links = linked_issues(&body);
        assert_eq!(links.len(), MAX_LINKED_ISSUES);
        let first: BTreeSet<u64> = (1..=MAX_LINKED_ISSUES as u64).collect();
        assert_eq!(links, first, "the first ones in the body");
        // Repeats do not use up the cap.
        let repeated = format!("{}Fixes #77", "Closes #1\n".repeat(50_000));
        assert_eq!(linked_issues(&repeated), BTreeSet::from([1, 77]));
    }

    #[test]
    fn oversized_agent_text_is_cut_on_a_char_boundary_and_says_so() {
        assert_eq!(bounded_text("short", 10), "short");
        let long = "é".repeat(3_000_000);
        let cut = bounded_text(&long, MAX_SUMMARY_BYTES);
        assert!(cut.len() <= MAX_SUMMARY_BYTES, "{}", cut.len());
        assert!(cut.ends_with(" … [truncated from 6000000 bytes]"), "{cut}");
        assert!(cut.starts_with("éé"));
        // A bound smaller than the note: the cut text alone, never over the bound.
        assert_eq!(bounded_text(&long, 5), "éé");
    }

    #[test]
    fn records_round_trip_and_name_bad_paths() {
        let r = PrRecord::new("o/r".parse().unwrap(), 5);
        let back = PrRecord::from_json(&r.to_json()).unwrap();
        assert_eq!(back, r);
        let bad = r.to_json().replace("\"tier\":0", "\"tier\":\"x\"");
        let err = PrRecord::from_json(&bad).unwrap_err();
        assert!(err.to_string().contains("tier"), "{err}");
        let newer = r.to_json().replace("\"schema\":1", "\"schema\":99");
        assert!(matches!(
            PrRecord::from_json(&newer),
            Err(RecordError::Schema(99))
        ));
    }
}
