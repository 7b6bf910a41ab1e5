//! The normalized event vocabulary: every Forgejo webhook Shepherd acts on (DESIGN
//! §2.2) and every internal event (timers, API observations, work results, effect
//! outcomes, resync). Events are stored as JSON in the Redis events stream, so they
//! are `Serialize + Deserialize` and must stay backwards compatible.

use serde::{Deserialize, Serialize};

use super::command::Command;
use super::effect::{EffectKindName, Timer};
use super::ids::{EffectId, Login, RepoName, Scope, Sha, WorkId};
pub use super::observation::{
    CiContext, CiState, DependencyFact, IssueSnapshot, LinkingPrFact, Permission, PrSnapshot,
    PrState, ReviewFact, ReviewState,
};

/// The record an event is for. The worker loads that record (for `Repo`: every open
/// PR record of the repository) and calls `step`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// One pull request record.
    Pr(RepoName, u64),
    /// One issue record.
    Issue(RepoName, u64),
    /// Every open PR record of the repository (the core ignores it where irrelevant).
    Repo(RepoName),
    /// Nothing to route (should not happen for events `normalize` returns).
    None,
}

/// How Forgejo Actions finished a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunOutcome {
    /// `action_run_success`.
    Success,
    /// `action_run_failure`.
    Failure,
    /// `action_run_recover`.
    Recover,
}

/// What a PR webhook said happened (the snapshot carries the facts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrAction {
    /// `opened`.
    Opened,
    /// `closed` (merged or not: see the snapshot).
    Closed,
    /// `reopened`.
    Reopened,
    /// `edited` (title, body or base branch).
    Edited,
    /// `synchronized`: a new head commit.
    Synchronized,
    /// `label_updated` / `label_cleared`.
    Labeled,
    /// Anything else on a PR (assigned, milestoned, review requested): facts only.
    Other,
}

/// What an issue webhook said happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IssueAction {
    /// `opened`.
    Opened,
    /// `closed`.
    Closed,
    /// `reopened`.
    Reopened,
    /// `edited`.
    Edited,
    /// `label_updated` / `label_cleared`.
    Labeled,
    /// Anything else: facts only.
    Other,
}

/// What a review webhook hinted (no id or commit: re-read the reviews).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReviewHint {
    /// `pull_request_review_approved`.
    Approved,
    /// `pull_request_review_rejected`.
    Rejected,
    /// `pull_request_review_comment`.
    Comment,
}

/// What an agent reported for a work item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkOutcome {
    /// Changes pushed (or the merge done, for `ready-to-merge`).
    Succeeded,
    /// The agent gave up.
    Failed,
    /// Nothing needed changing.
    NoChanges,
    /// The run failed for a reason a later run may not have (model 429/5xx, overload,
    /// timeouts; issue 27): retried after a back-off without counting an attempt, at
    /// most `transient_retries` times in a row, then a failed attempt.
    Transient,
}

/// What became of a `Merge` effect after the executor's checks and retries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "result")]
pub enum MergeOutcome {
    /// The PR is merged.
    Merged,
    /// Forgejo reports conflicts.
    Conflict,
    /// The head moved past the pinned sha.
    HeadMoved,
    /// "Please try again later" (conflict check running), or not ready on re-check.
    TryAgain,
    /// Another executor holds the target branch's merge lease (or this one lost it
    /// before the merge call): no merge was attempted; try again in `retry_ms`, when
    /// the holder's lease will have run out if it died.
    LockBusy {
        /// How long to wait, in milliseconds.
        retry_ms: u64,
    },
    /// Merge queue: the head was updated onto the branch tip `onto` (a new head
    /// follows as a `pull_request_sync`); CI runs again on it.
    Updated {
        /// The tip the head is now built on.
        onto: Sha,
        /// The head the update replaced (the pinned one).
        from: Sha,
    },
    /// Merge queue: the tip moved between the checks and the merge (a
    /// fast-forward-only merge that could not fast-forward); the head is updated again.
    BaseMoved,
    /// Merge queue: the branch's queue is frozen (`core::queue::freeze`): nothing was
    /// updated or merged; ask again in `retry_ms` (or when the queue tells the PR its
    /// place again, as an unfreeze does).
    Frozen {
        /// Why and until when (shown in the status comment).
        note: String,
        /// How long to wait, in milliseconds.
        retry_ms: u64,
    },
    /// Anything else (protection refused, not allowed, …): a human must look.
    FailedPermanent {
        /// Forgejo's message.
        message: String,
    },
}

/// An effect outcome reported back to the machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum EffectOutcome {
    /// The result of a `Merge` (or a `QueueAdvance`).
    Merge(MergeOutcome),
    /// The PR's place in its branch's merge queue changed (after a `Queue` op of any
    /// PR of that branch).
    Queue(crate::core::queue::Place),
    /// The batched merge queue ejected the PR (issue 29): its head conflicted while the
    /// batch was built, or it failed CI alone after a bisection.
    QueueEjected(crate::core::record::BatchFailure),
    /// Any other effect failed after the retry budget.
    Failed {
        /// Which kind of effect.
        kind: EffectKindName,
        /// For a failed dispatch: the work item that never reached an agent.
        work_id: Option<WorkId>,
        /// Why.
        message: String,
    },
    /// The dispatch path held a work item back: a spend cap is reached (issue 28).
    OverBudget {
        /// The work item that was not handed to the agents.
        work_id: WorkId,
        /// Which cap, what was left and needed, and when it resets.
        stop: crate::core::budget::Stop,
    },
}

/// Everything that can happen to a PR or issue, normalized.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum Event {
    /// `pull_request`, `pull_request_sync`, `pull_request_label` and other PR webhooks.
    PullRequest {
        /// What happened.
        action: PrAction,
        /// The PR after it happened.
        pr: PrSnapshot,
        /// Old base branch when `edited` changed it.
        base_changed_from: Option<String>,
        /// Who did it.
        sender: Option<Login>,
    },
    /// `pull_request_review_approved` / `_rejected` / `_comment`.
    Review {
        /// What kind of review.
        hint: ReviewHint,
        /// The PR at that moment.
        pr: PrSnapshot,
        /// The reviewer.
        sender: Option<Login>,
    },
    /// `issue_comment` / `pull_request_comment` (created or edited).
    Comment {
        /// Repository.
        repo: RepoName,
        /// Issue or PR index.
        number: u64,
        /// On a PR.
        is_pull: bool,
        /// Comment id.
        comment_id: i64,
        /// Commands found in the body (outside code and quotes).
        commands: Vec<Command>,
        /// When it was written (unix ms, 0 if unknown).
        at_ms: i64,
        /// The commenter.
        sender: Option<Login>,
    },
    /// `issues` / `issue_label` on a plain issue.
    Issue {
        /// What happened.
        action: IssueAction,
        /// The issue after it happened.
        issue: IssueSnapshot,
        /// Who did it.
        sender: Option<Login>,
    },
    /// `action_run_success` / `_failure` / `_recover`: re-read the combined status.
    ActionRun {
        /// Repository.
        repo: RepoName,
        /// Commit the run tested.
        sha: Sha,
        /// The PR, when the triggering payload names one.
        pr_number: Option<u64>,
        /// How the run ended.
        outcome: RunOutcome,
        /// Who triggered the run.
        sender: Option<Login>,
    },
    /// Gitea's `status` event: one context's new state.
    Status {
        /// Repository.
        repo: RepoName,
        /// Commit.
        sha: Sha,
        /// The context's status.
        context: CiContext,
        /// Who posted it.
        sender: Option<Login>,
    },
    /// `push` to a branch (PRs targeting it may now conflict).
    Push {
        /// Repository.
        repo: RepoName,
        /// Branch name (without `refs/heads/`).
        branch: String,
        /// New tip.
        after: Option<Sha>,
        /// Who pushed.
        sender: Option<Login>,
    },
    /// A timer the machine scheduled came due.
    TimerFired {
        /// Repository.
        repo: RepoName,
        /// Record kind.
        scope: Scope,
        /// PR or issue index.
        number: u64,
        /// The timer as scheduled.
        timer: Timer,
    },
    /// `Observe(Pr)` result: the PR read from the API.
    ObservedPr {
        /// The PR.
        pr: PrSnapshot,
    },
    /// `Observe(Reviews)` result: every review of the PR.
    ObservedReviews {
        /// Repository.
        repo: RepoName,
        /// PR index.
        number: u64,
        /// All reviews, any order.
        reviews: Vec<ReviewFact>,
        /// When they were read (unix ms).
        at_ms: i64,
    },
    /// `Observe(CombinedStatus)` result.
    ObservedStatus {
        /// Repository.
        repo: RepoName,
        /// PR index.
        number: u64,
        /// The commit read.
        sha: Sha,
        /// Latest status per context (empty when none).
        contexts: Vec<CiContext>,
        /// When it was read (unix ms).
        at_ms: i64,
    },
    /// `Observe(Dependencies)` result: the issues that block issue `number`.
    ObservedDependencies {
        /// Repository.
        repo: RepoName,
        /// Issue index.
        number: u64,
        /// Every dependency Forgejo lists, open and closed.
        dependencies: Vec<DependencyFact>,
        /// When they were read (unix ms).
        at_ms: i64,
    },
    /// `Observe(Permission)` result.
    ObservedPermission {
        /// Repository.
        repo: RepoName,
        /// Record kind where the command waits.
        scope: Scope,
        /// PR or issue index.
        number: u64,
        /// Whose permission.
        login: Login,
        /// The level.
        permission: Permission,
        /// When it was read (unix ms).
        at_ms: i64,
    },
    /// `Observe(Legacy)` result: what a previous dispatcher left (`core::legacy`).
    ObservedLegacy {
        /// Repository.
        repo: RepoName,
        /// Record kind.
        scope: Scope,
        /// PR or issue index.
        number: u64,
        /// Comments holding a state block, oldest first (bounded by the reader).
        comments: Vec<crate::core::legacy::LegacyComment>,
        /// The claim label's timeline events, oldest first.
        claim_events: Vec<crate::core::legacy::LabelEvent>,
        /// When they were read (unix ms).
        at_ms: i64,
    },
    /// An agent's report for a work item (the id names the record).
    WorkResult {
        /// The work item.
        work_id: WorkId,
        /// What happened.
        outcome: WorkOutcome,
        /// The agent's failure signature, if it gave one.
        signature: Option<String>,
        /// A line for the history.
        summary: Option<String>,
        /// What the run consumed, when the runner or the agent said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<super::usage::Usage>,
        /// Why the runner stopped the agent, when it did (issue 28).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stopped: Option<super::usage::StopReason>,
    },
    /// An effect's outcome after the executor's checks and retries.
    EffectOutcome {
        /// Repository.
        repo: RepoName,
        /// Record kind.
        scope: Scope,
        /// PR or issue index.
        number: u64,
        /// The effect.
        effect_id: EffectId,
        /// What happened.
        outcome: EffectOutcome,
    },
    /// Resync: an open PR with its status and reviews, read from the API.
    ResyncObserved {
        /// The PR.
        pr: PrSnapshot,
        /// Combined status of its head (empty when none).
        contexts: Vec<CiContext>,
        /// Its reviews.
        reviews: Vec<ReviewFact>,
        /// When they were read (unix ms).
        at_ms: i64,
    },
}

impl Event {
    /// The record(s) this event is for.
    pub fn target(&self) -> Target {
        match self {
            Event::PullRequest { pr, .. }
            | Event::Review { pr, .. }
            | Event::ObservedPr { pr }
            | Event::ResyncObserved { pr, .. } => Target::Pr(pr.repo.clone(), pr.number),
            Event::Comment {
                repo,
                number,
                is_pull,
                ..
            } => match is_pull {
                true => Target::Pr(repo.clone(), *number),
                false => Target::Issue(repo.clone(), *number),
            },
            Event::Issue { issue, .. } => Target::Issue(issue.repo.clone(), issue.number),
            Event::ActionRun {
                repo, pr_number, ..
            } => match pr_number {
                Some(n) => Target::Pr(repo.clone(), *n),
                None => Target::Repo(repo.clone()),
            },
            Event::Status { repo, .. } | Event::Push { repo, .. } => Target::Repo(repo.clone()),
            Event::ObservedReviews { repo, number, .. }
            | Event::ObservedStatus { repo, number, .. } => Target::Pr(repo.clone(), *number),
            Event::ObservedDependencies { repo, number, .. } => {
                Target::Issue(repo.clone(), *number)
            }
            Event::TimerFired {
                repo,
                scope,
                number,
                ..
            }
            | Event::ObservedPermission {
                repo,
                scope,
                number,
                ..
            }
            | Event::ObservedLegacy {
                repo,
                scope,
                number,
                ..
            }
            | Event::EffectOutcome {
                repo,
                scope,
                number,
                ..
            } => scoped(repo, *scope, *number),
            Event::WorkResult { work_id, .. } => match work_id.subject() {
                Some((repo, scope, number)) => scoped(&repo, scope, number),
                None => Target::None,
            },
        }
    }

    /// Who caused the event, where Forgejo says so (internal events have none).
    pub fn sender(&self) -> Option<&Login> {
        match self {
            Event::PullRequest { sender, .. }
            | Event::Review { sender, .. }
            | Event::Comment { sender, .. }
            | Event::Issue { sender, .. }
            | Event::ActionRun { sender, .. }
            | Event::Status { sender, .. }
            | Event::Push { sender, .. } => sender.as_ref(),
            Event::TimerFired { .. }
            | Event::ObservedPr { .. }
            | Event::ObservedReviews { .. }
            | Event::ObservedStatus { .. }
            | Event::ObservedPermission { .. }
            | Event::ObservedLegacy { .. }
            | Event::ObservedDependencies { .. }
            | Event::WorkResult { .. }
            | Event::EffectOutcome { .. }
            | Event::ResyncObserved { .. } => None,
        }
    }

    /// A short name for logs and history (`pull_request/synchronized`, `timer`, …).
    pub fn name(&self) -> String {
        match self {
            Event::PullRequest { action, .. } => format!("pull_request/{}", kebab(action)),
            Event::Review { hint, .. } => format!("review/{}", kebab(hint)),
            Event::Comment { .. } => "comment".into(),
            Event::Issue { action, .. } => format!("issue/{}", kebab(action)),
            Event::ActionRun { outcome, .. } => format!("action_run/{}", kebab(outcome)),
            Event::Status { .. } => "status".into(),
            Event::Push { .. } => "push".into(),
            Event::TimerFired { timer, .. } => format!("timer/{}", timer.kind.name()),
            Event::ObservedPr { .. } => "observed/pr".into(),
            Event::ObservedReviews { .. } => "observed/reviews".into(),
            Event::ObservedStatus { .. } => "observed/status".into(),
            Event::ObservedPermission { .. } => "observed/permission".into(),
            Event::ObservedLegacy { .. } => "observed/legacy".into(),
            Event::ObservedDependencies { .. } => "observed/dependencies".into(),
            Event::WorkResult { outcome, .. } => format!("work-result/{}", kebab(outcome)),
            Event::EffectOutcome { .. } => "effect-outcome".into(),
            Event::ResyncObserved { .. } => "resync".into(),
        }
    }
}

/// The target of a record of a given scope.
fn scoped(repo: &RepoName, scope: Scope, number: u64) -> Target {
    match scope {
        Scope::Pr => Target::Pr(repo.clone(), number),
        Scope::Issue => Target::Issue(repo.clone(), number),
    }
}

/// The serde (kebab-case) name of a unit enum value.
fn kebab<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "?".into(),
    }
}
