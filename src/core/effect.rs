//! Effects are data: what the machine wants done, executed later by the executor.
//! Every effect carries a deterministic id (record key + version + index) so that a
//! redelivered effect is recognised, and every comment carries that id as a hidden
//! marker so a retry after a crash finds the comment instead of posting it twice.

use serde::{Deserialize, Serialize};

use super::ids::{EffectId, RepoName, Scope, Sha, WorkId};
use super::policy::MergeStyle;

/// One effect of a transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Effect {
    /// Deterministic id: `<repo>/<scope>/<number>@<version>.<index>`.
    pub id: EffectId,
    /// Repository.
    pub repo: RepoName,
    /// Whether the record is a PR's or an issue's (timers and outcomes come back to it).
    pub scope: Scope,
    /// PR or issue index.
    pub number: u64,
    /// What to do.
    pub kind: EffectKind,
}

/// What an effect does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
#[expect(
    clippy::large_enum_variant,
    reason = "the work item (with its run limits, issue 28) is the effect that matters; \
              effects are built a few per step, so the size costs nothing a box would save"
)]
pub enum EffectKind {
    /// Hand a work item to the agents (dispatch stream, optional HTTP sink).
    Dispatch(WorkItem),
    /// Tell the agents a work item is no longer wanted.
    CancelWork {
        /// The work item.
        work_id: WorkId,
    },
    /// Add labels to the PR/issue (by name).
    AddLabels {
        /// Label names.
        labels: Vec<String>,
    },
    /// Remove labels from the PR/issue (by name; absent labels are fine).
    RemoveLabels {
        /// Label names.
        labels: Vec<String>,
    },
    /// Create or edit in place the one sticky status comment (found by its
    /// `<!-- SHEPHERD-STATE: … -->` block).
    UpsertComment {
        /// Full body, with the state block and footer.
        body: String,
        /// The PR has no status comment yet, as far as Forgejo's own count shows: the
        /// record never asked for one and the newest PR snapshot counted no comments
        /// at all. The executor may then create the comment without listing the PR's
        /// comments first (issue 17); it still lists them on any retry.
        #[serde(default)]
        first: bool,
    },
    /// Post a comment on issue/PR `number` (the effect id marker and footer included).
    Comment {
        /// Where to post (the record's own number, or a linked issue).
        number: u64,
        /// Full body.
        body: String,
    },
    /// Merge the PR, pinned to `head_sha`; never `force_merge`. The outcome comes back
    /// as [`crate::core::event::EffectOutcome::Merge`].
    Merge {
        /// The head the decision was made for (`head_commit_id`).
        head_sha: Sha,
        /// `Do`.
        style: MergeStyle,
        /// `delete_branch_after_merge`.
        delete_branch: bool,
        /// `MergeTitleField`, when set.
        title: Option<String>,
        /// `MergeMessageField`, when set.
        message: Option<String>,
    },
    /// Apply an op to the target branch's merge queue (`core::queue`); the PRs whose
    /// place changed are told with [`crate::core::event::EffectOutcome::Queue`].
    Queue(crate::core::queue::QueueOp),
    /// Advance the head of the merge queue: update it onto the branch tip when it is
    /// not built on it, else merge it pinned to `head_sha` (fast-forward only where the
    /// repository allows it, `style` otherwise) while the tip is still its base. The
    /// outcome comes back as [`crate::core::event::EffectOutcome::Merge`]. Never
    /// `force_merge`.
    QueueAdvance {
        /// The head whose CI passed on top of the tip (`head_commit_id`).
        head_sha: Sha,
        /// Target branch.
        branch: String,
        /// `style` of the update.
        update_style: crate::core::policy::UpdateStyle,
        /// `Do` when the repository does not allow fast-forward-only merges.
        style: MergeStyle,
        /// `delete_branch_after_merge`.
        delete_branch: bool,
        /// Whether the head may be updated once more (`merge_queue_max_updates` not
        /// reached this turn): when not and the tip moved, the outcome is `BaseMoved`
        /// and the PR goes to the back of the queue.
        #[serde(default = "yes")]
        may_update: bool,
        /// The batch settings (issue 29): `merge_queue_batch_size` > 1 advances a batch
        /// led by this PR instead of the PR alone.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch: Option<BatchSettings>,
    },
    /// Freeze or unfreeze a branch's merge queue (`core::queue::freeze`); the queue's
    /// head is told its place, so a head a freeze held asks again at once.
    QueueFreeze(crate::core::queue::freeze::FreezeOp),
    /// Read something from the API; the result comes back as an `Observed*` event.
    Observe(ObserveWhat),
    /// Fire a timer later (same timer id replaces an earlier schedule).
    Schedule(Timer),
}

impl EffectKind {
    /// The kind's name without its data.
    pub fn name(&self) -> EffectKindName {
        match self {
            EffectKind::Dispatch(_) => EffectKindName::Dispatch,
            EffectKind::CancelWork { .. } => EffectKindName::CancelWork,
            EffectKind::AddLabels { .. } => EffectKindName::AddLabels,
            EffectKind::RemoveLabels { .. } => EffectKindName::RemoveLabels,
            EffectKind::UpsertComment { .. } => EffectKindName::UpsertComment,
            EffectKind::Comment { .. } => EffectKindName::Comment,
            EffectKind::Merge { .. } => EffectKindName::Merge,
            EffectKind::Queue(_) => EffectKindName::Queue,
            EffectKind::QueueAdvance { .. } => EffectKindName::QueueAdvance,
            EffectKind::QueueFreeze(_) => EffectKindName::QueueFreeze,
            EffectKind::Observe(_) => EffectKindName::Observe,
            EffectKind::Schedule(_) => EffectKindName::Schedule,
        }
    }
}

/// The name of an effect kind (for outcomes and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EffectKindName {
    /// `Dispatch`.
    Dispatch,
    /// `CancelWork`.
    CancelWork,
    /// `AddLabels`.
    AddLabels,
    /// `RemoveLabels`.
    RemoveLabels,
    /// `UpsertComment`.
    UpsertComment,
    /// `Comment`.
    Comment,
    /// `Merge`.
    Merge,
    /// `Queue`.
    Queue,
    /// `QueueAdvance`.
    QueueAdvance,
    /// `QueueFreeze`.
    QueueFreeze,
    /// `Observe`.
    Observe,
    /// `Schedule`.
    Schedule,
}

/// The batch settings a `QueueAdvance` carries (policy `merge_queue_batch_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchSettings {
    /// `merge_queue_batch_size` (> 1).
    pub size: u32,
    /// `merge_queue_batch_wait_secs`.
    pub wait_secs: u64,
    /// `merge_queue_flaky_retries`.
    pub flaky_retries: u32,
    /// `merge_queue_step_results` (an effect stored before it existed reads `true`, the
    /// default).
    #[serde(default = "yes")]
    pub step_results: bool,
}

/// What to read from the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "what")]
pub enum ObserveWhat {
    /// `GET …/pulls/{n}` → `ObservedPr`.
    Pr,
    /// `GET …/pulls/{n}/reviews` (all pages) → `ObservedReviews`.
    Reviews,
    /// `GET …/commits/{sha}/status` (all pages) → `ObservedStatus`.
    CombinedStatus {
        /// The commit.
        sha: Sha,
    },
    /// The commenter's permission on the repository → `ObservedPermission`.
    Permission {
        /// Whose.
        login: super::ids::Login,
    },
    /// What a previous dispatcher left (`core::legacy`) → `ObservedLegacy`: the
    /// comments holding an `ESCALATION-STATE` block (`GET …/issues/{n}/comments`), and
    /// the claim label's events in the timeline (`GET …/issues/{n}/timeline`).
    Legacy {
        /// Read the comments.
        comments: bool,
        /// Read the timeline for this label's events (a claim label to time).
        claim_label: Option<String>,
    },
    /// An issue's dependencies (`GET …/issues/{index}/dependencies`) and the open PRs
    /// that link them → `ObservedDependencies`.
    Dependencies,
}

/// A timer: fires `TimerFired` for the same record at `due_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timer {
    /// When (unix ms).
    pub due_ms: i64,
    /// What it is for.
    pub kind: TimerKind,
    /// Identity within the record: scheduling the same id again replaces it.
    pub id: String,
}

/// What a timer is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum TimerKind {
    /// Poll the combined status of `sha` (backoff while pending or missing).
    CiPoll {
        /// The head being polled.
        sha: Sha,
    },
    /// Re-read the PR's mergeability after a push (Forgejo checks asynchronously).
    Mergeability,
    /// A claim's TTL ran out.
    ClaimExpiry {
        /// The claimed work item.
        work_id: WorkId,
    },
    /// Retry a merge that Forgejo asked to try again later, or re-verify one.
    MergeRetry,
    /// Check for inactivity (`stale-check`).
    StaleCheck,
    /// A short-lived status has waited `status_settle_secs`: write it now unless a
    /// newer one was written meanwhile.
    StatusSettle,
    /// The merge queue's head has waited `merge_queue_ci_timeout_secs` for its CI.
    QueueCi,
    /// The spend caps that held the record in `over-budget` have reset (issue 28).
    BudgetReset,
    /// The back-off after a transient agent failure is over: the work may be
    /// dispatched again (issue 27).
    TransientRetry,
    /// A `succeeded` result has waited `push_grace_secs` for the push (PR work) or the
    /// PR (issue work) it announced: none came, so the attempt counts as `no-changes`
    /// (issue 27).
    PushGrace {
        /// The work item whose result waits.
        work_id: WorkId,
    },
    /// A foreign claim's TTL ran out, or the read of a previous dispatcher's state did
    /// not answer in time (`core::legacy`).
    Legacy,
    /// An issue's dependencies are read again (`dependency_recheck_secs`): while it
    /// is blocked by an open one, and when a read never came back.
    DependencyRecheck,
}

impl TimerKind {
    /// The kind's name.
    pub fn name(&self) -> &'static str {
        match self {
            TimerKind::CiPoll { .. } => "ci-poll",
            TimerKind::Mergeability => "mergeability",
            TimerKind::ClaimExpiry { .. } => "claim-expiry",
            TimerKind::MergeRetry => "merge-retry",
            TimerKind::StaleCheck => "stale-check",
            TimerKind::StatusSettle => "status-settle",
            TimerKind::QueueCi => "queue-ci",
            TimerKind::BudgetReset => "budget-reset",
            TimerKind::TransientRetry => "transient-retry",
            TimerKind::PushGrace { .. } => "push-grace",
            TimerKind::Legacy => "legacy",
            TimerKind::DependencyRecheck => "dependency-recheck",
        }
    }
}

/// The kind of a work item (DESIGN §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkKind {
    /// Make failing CI pass.
    CiFix,
    /// Address change requests.
    ReviewFeedback,
    /// Resolve conflicts with the base branch.
    MergeConflicts,
    /// Look at a PR nobody touched for a long time.
    StaleCheck,
    /// Implement an issue (opens a PR).
    IssueImpl,
    /// Merge a ready PR (merge mode `dispatch` only).
    ReadyToMerge,
    /// Review the PR's head as a reviewer agent (at most once per head sha; claim label
    /// `auto/claimed-reviewer`).
    Review,
}

impl WorkKind {
    /// Dispatch priority: higher first. PR work goes before new `issue-impl` work.
    pub fn priority(self) -> u8 {
        match self {
            WorkKind::ReadyToMerge => 60,
            WorkKind::MergeConflicts => 50,
            WorkKind::CiFix => 40,
            WorkKind::ReviewFeedback => 30,
            WorkKind::Review => 25,
            WorkKind::StaleCheck => 20,
            WorkKind::IssueImpl => 10,
        }
    }

    /// The contract name (`ci-fix`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            WorkKind::CiFix => "ci-fix",
            WorkKind::ReviewFeedback => "review-feedback",
            WorkKind::MergeConflicts => "merge-conflicts",
            WorkKind::StaleCheck => "stale-check",
            WorkKind::IssueImpl => "issue-impl",
            WorkKind::ReadyToMerge => "ready-to-merge",
            WorkKind::Review => "review",
        }
    }
}

/// A work item exactly as DESIGN §4 specifies its JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkItem {
    /// Work id (results are reported against it).
    pub id: WorkId,
    /// Kind.
    pub kind: WorkKind,
    /// `owner/name`.
    pub repo: RepoName,
    /// PR or issue index.
    pub number: u64,
    /// The head the work is for (`null` for `issue-impl`).
    pub head_sha: Option<Sha>,
    /// Model tier, 0-based.
    pub tier: u8,
    /// Model tier name.
    pub tier_name: String,
    /// 1-based attempt number of this kind on this record.
    pub attempt: u32,
    /// Higher first ([`WorkKind::priority`]).
    pub priority: u8,
    /// When the claim ends (RFC 3339, UTC, millisecond precision).
    #[serde(with = "rfc3339_ms")]
    pub claim_expires_at: i64,
    /// What the agent needs to know.
    pub context: WorkContext,
    /// The limits the runner holds the run to (issue 28: the budget left, runaway
    /// guards); omitted when none is set.
    #[serde(default, skip_serializing_if = "super::usage::RunLimits::is_none")]
    pub limits: super::usage::RunLimits,
}

/// The `context` object of a work item.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkContext {
    /// Failing CI contexts of the head (for `ci-fix`).
    pub failing_checks: Vec<FailingCheck>,
    /// Active change requests (for `review-feedback`).
    pub change_requests: Vec<ChangeRequest>,
    /// Earlier attempts on this record, oldest first.
    pub attempts: Vec<AttemptSummary>,
    /// What else the agent must know about the problem, e.g. that CI failed only on
    /// top of the new base the merge queue updated the PR onto.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Who reviews and which round it is (for `review` only; absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<ReviewRequest>,
    /// Whether the PR's author is trusted (the bot, an agent or bot user, a trusted
    /// user, or write access): `false` marks their title, body and diff as text from
    /// an untrusted author in the prompt; absent when not known (issue work, or
    /// `agent_authors = "anyone"` without a permission read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author_trusted: Option<bool>,
    /// `issue-impl` only: the branch to work on and the branch to start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issue: Option<Box<IssueWork>>,
}

/// The `context.issue` object of an `issue-impl` work item: where the agent works.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssueWork {
    /// The branch to create and push (policy `issue_branch`).
    pub branch: String,
    /// The branch to start from and open the PR against: the head branch of the open
    /// PR of a dependency (stacked work); `None`: the repository's default branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// The dependency whose PR `base` is, and that PR: `(issue, pr)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_of: Option<(u64, u64)>,
}

/// The `context.review` object of a `review` work item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewRequest {
    /// The reviewer agent's Forgejo user (one of the policy's `reviewer_logins`, never
    /// the PR's author): the runner posts the review with this user's token.
    pub reviewer: super::ids::Login,
    /// 1-based review round on this PR.
    pub round: u32,
    /// The policy's `max_review_rounds`.
    pub max_rounds: u32,
}

/// One failing CI context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailingCheck {
    /// Context name.
    pub context: String,
    /// `failure`, `error` or `warning`.
    pub state: super::event::CiState,
    /// Description.
    pub description: String,
    /// Link to the run.
    pub target_url: String,
}

/// One active change request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeRequest {
    /// Review id.
    pub review_id: i64,
    /// Reviewer.
    pub reviewer: super::ids::Login,
    /// What they asked for.
    pub body: String,
}

/// An earlier attempt, as agents see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptSummary {
    /// Kind.
    pub kind: WorkKind,
    /// Tier used.
    pub tier: u8,
    /// Outcome (`succeeded`, `failed`, `no-changes`, `expired`, `superseded`, …).
    pub outcome: String,
    /// The problem's signature.
    pub signature: String,
    /// The agent's summary.
    pub summary: Option<String>,
    /// When it was dispatched (RFC 3339 in JSON): the agent runner shows the
    /// conversation comments posted since the previous attempt. Absent in work items
    /// written before the field existed.
    #[serde(
        default,
        with = "rfc3339_ms_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub started_at: Option<i64>,
}

/// Serde helpers for an optional time: unix milliseconds in Rust, RFC 3339 text or
/// absent in JSON.
pub mod rfc3339_ms_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes unix ms as RFC 3339 text (`None` is skipped by the field).
    pub fn serialize<S: Serializer>(ms: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
        match ms {
            Some(ms) => s.serialize_str(&super::rfc3339_ms::to_text(*ms)),
            None => s.serialize_none(),
        }
    }

    /// Deserializes RFC 3339 text (or `null`) into unix ms.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) => super::rfc3339_ms::from_text(&s)
                .map(Some)
                .ok_or_else(|| serde::de::Error::custom(format!("not RFC 3339: {s:?}"))),
        }
    }
}

/// Serde helpers: unix milliseconds in Rust, RFC 3339 text in JSON.
pub mod rfc3339_ms {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    /// Unix ms → RFC 3339 text (UTC).
    pub fn to_text(ms: i64) -> String {
        DateTime::<Utc>::from_timestamp_millis(ms)
            .unwrap_or_default()
            .to_rfc3339_opts(SecondsFormat::Millis, true)
    }

    /// RFC 3339 text → unix ms.
    pub fn from_text(s: &str) -> Option<i64> {
        DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|d| d.timestamp_millis())
    }

    /// Serializes unix ms as RFC 3339 text.
    pub fn serialize<S: Serializer>(ms: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&to_text(*ms))
    }

    /// Deserializes RFC 3339 text into unix ms.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        let s = String::deserialize(d)?;
        from_text(&s).ok_or_else(|| serde::de::Error::custom(format!("not RFC 3339: {s:?}")))
    }
}

/// Serde default of a flag that was always true before it existed.
fn yes() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_start_times_are_rfc3339_and_optional() {
        let attempt = AttemptSummary {
            kind: WorkKind::CiFix,
            tier: 1,
            outcome: "failed".into(),
            signature: "ci=failure".into(),
            summary: None,
            started_at: Some(1_700_000_000_123),
        };
        let v = serde_json::to_value(&attempt).unwrap();
        assert_eq!(v["started_at"], "2023-11-14T22:13:20.123Z");
        assert_eq!(
            serde_json::from_value::<AttemptSummary>(v).unwrap(),
            attempt
        );
        // Work items written before the field existed still decode.
        let old = serde_json::json!({
            "kind": "ci-fix", "tier": 1, "outcome": "failed", "signature": "s", "summary": null
        });
        let back: AttemptSummary = serde_json::from_value(old).unwrap();
        assert_eq!(back.started_at, None);
        let none = AttemptSummary {
            started_at: None,
            ..attempt
        };
        let v = serde_json::to_value(&none).unwrap();
        assert!(v.get("started_at").is_none(), "absent, not null: {v}");
    }
}
