//! Forgejo JSON as serde structs, with field names exactly as Forgejo sends them
//! (forgejo-facts.md §3). Only the fields Shepherd reads are declared; unknown fields
//! are ignored, and fields Forgejo sometimes sends as `null` default to empty values.
//!
//! These structs serve both webhook payloads and REST responses (a PR, its reviews, a
//! combined status), so the Forgejo client can deserialize API answers with them and
//! turn them into core observations.

use serde::{Deserialize, Serialize};

/// A Forgejo user (`modules/structs/user.go`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct User {
    /// Numeric id (negative for system users such as `forgejo-actions`).
    #[serde(default)]
    pub id: i64,
    /// The username.
    #[serde(default)]
    pub login: String,
}

/// A repository (`modules/structs/repo.go`); `full_name` is `owner/name`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Repository {
    /// Numeric id.
    #[serde(default)]
    pub id: i64,
    /// `owner/name`.
    pub full_name: String,
    /// The default branch.
    #[serde(default)]
    pub default_branch: String,
}

/// A label (`modules/structs/issue_label.go`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Label {
    /// Numeric id.
    #[serde(default)]
    pub id: i64,
    /// The label's name, the identity Shepherd uses.
    pub name: String,
}

/// One side of a PR (`PRBranchInfo`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BranchInfo {
    /// Branch name (`refs/pull/N/head` when the head branch is gone).
    #[serde(rename = "ref", default)]
    pub ref_: String,
    /// Tip commit of that branch.
    #[serde(default)]
    pub sha: String,
}

/// A pull request (`modules/structs/pull.go`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PullRequest {
    /// The PR index.
    pub number: u64,
    /// Author.
    #[serde(default)]
    pub user: Option<User>,
    /// Title (a WIP prefix makes it a draft).
    #[serde(default)]
    pub title: String,
    /// Description (bot marker, `Closes #N`).
    #[serde(default)]
    pub body: Option<String>,
    /// The full label list.
    #[serde(default)]
    pub labels: Option<Vec<Label>>,
    /// `open` or `closed`.
    #[serde(default)]
    pub state: String,
    /// Work in progress (title prefix).
    #[serde(default)]
    pub draft: bool,
    /// Conflict-free and not being checked; meaningless in sync payloads.
    #[serde(default)]
    pub mergeable: bool,
    /// Whether it was merged.
    #[serde(default)]
    pub merged: bool,
    /// Target branch (its `sha` is the base tip, not the merge base).
    #[serde(default)]
    pub base: BranchInfo,
    /// Source branch; `head.sha` is what CI statuses are posted on.
    #[serde(default)]
    pub head: BranchInfo,
    /// Last change, RFC 3339 (orders observations of the same PR).
    #[serde(default)]
    pub updated_at: Option<String>,
    /// Conversation comments (Forgejo's `Issue.NumComments`).
    #[serde(default)]
    pub comments: Option<u64>,
}

/// Old value of an edited field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChangeFrom {
    /// The previous value.
    #[serde(default)]
    pub from: String,
}

/// What an `edited` action changed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Changes {
    /// Previous title.
    #[serde(default)]
    pub title: Option<ChangeFrom>,
    /// Previous body.
    #[serde(default)]
    pub body: Option<ChangeFrom>,
    /// Previous base branch.
    #[serde(rename = "ref", default)]
    pub ref_: Option<ChangeFrom>,
}

/// The `review` object of a review webhook.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReviewInfo {
    /// The event-type string, e.g. `pull_request_review_approved`.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// The review body.
    #[serde(default)]
    pub content: String,
}

/// `PullRequestPayload` (`modules/structs/hook.go`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PullRequestPayload {
    /// opened, closed, reopened, edited, synchronized, label_updated, reviewed, …
    pub action: String,
    /// PR index.
    pub number: u64,
    /// Present on `edited`.
    #[serde(default)]
    pub changes: Option<Changes>,
    /// The PR as it is now.
    pub pull_request: PullRequest,
    /// The repository.
    pub repository: Repository,
    /// Who caused the event.
    #[serde(default)]
    pub sender: Option<User>,
    /// Present on review events.
    #[serde(default)]
    pub review: Option<ReviewInfo>,
}

/// The `pull_request` stub inside an issue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IssuePullStub {
    /// Whether the PR was merged.
    #[serde(default)]
    pub merged: bool,
}

/// An issue (`modules/structs/issue.go`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Issue {
    /// The index.
    pub number: u64,
    /// Author.
    #[serde(default)]
    pub user: Option<User>,
    /// Title.
    #[serde(default)]
    pub title: String,
    /// Description.
    #[serde(default)]
    pub body: Option<String>,
    /// Full label list.
    #[serde(default)]
    pub labels: Option<Vec<Label>>,
    /// `open` or `closed`.
    #[serde(default)]
    pub state: String,
    /// Set when the issue is a pull request.
    #[serde(default)]
    pub pull_request: Option<IssuePullStub>,
    /// Last change, RFC 3339.
    #[serde(default)]
    pub updated_at: Option<String>,
}

/// `IssuePayload` (events `issues`, `issue_label`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IssuePayload {
    /// opened, closed, reopened, edited, label_updated, label_cleared, …
    pub action: String,
    /// Issue index.
    #[serde(default)]
    pub number: u64,
    /// The issue as it is now.
    pub issue: Issue,
    /// The repository.
    pub repository: Repository,
    /// Who caused the event.
    #[serde(default)]
    pub sender: Option<User>,
}

/// A conversation comment (`modules/structs/issue_comment.go`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Comment {
    /// Comment id.
    #[serde(default)]
    pub id: i64,
    /// Author.
    #[serde(default)]
    pub user: Option<User>,
    /// Markdown body (commands).
    #[serde(default)]
    pub body: String,
    /// Creation time, RFC 3339.
    #[serde(default)]
    pub created_at: Option<String>,
}

/// `IssueCommentPayload` (events `issue_comment`, `pull_request_comment`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IssueCommentPayload {
    /// created, edited, deleted.
    pub action: String,
    /// The issue or PR commented on.
    pub issue: Issue,
    /// The comment.
    pub comment: Comment,
    /// The repository.
    pub repository: Repository,
    /// Who commented.
    #[serde(default)]
    pub sender: Option<User>,
    /// Whether the comment is on a pull request.
    #[serde(default)]
    pub is_pull: bool,
}

/// One commit of a push.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PushCommit {
    /// Commit id.
    #[serde(default)]
    pub id: String,
}

/// `PushPayload` (event `push`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushPayload {
    /// Full ref, e.g. `refs/heads/main`.
    #[serde(rename = "ref")]
    pub ref_: String,
    /// Old tip.
    #[serde(default)]
    pub before: String,
    /// New tip.
    #[serde(default)]
    pub after: String,
    /// The repository.
    pub repository: Repository,
    /// Who pushed.
    #[serde(default)]
    pub sender: Option<User>,
}

/// A Forgejo Actions run (`modules/structs/action.go`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ActionRun {
    /// Run id.
    #[serde(default)]
    pub id: i64,
    /// The repository (the payload has no top-level one).
    pub repository: Repository,
    /// Who triggered the run.
    #[serde(default)]
    pub trigger_user: Option<User>,
    /// Commit the run tested.
    #[serde(default)]
    pub commit_sha: String,
    /// Triggering event, e.g. `pull_request` or `push`.
    #[serde(default)]
    pub event: String,
    /// JSON text of the triggering webhook payload (holds the PR number).
    #[serde(default)]
    pub event_payload: String,
    /// Final run status.
    #[serde(default)]
    pub status: String,
}

/// `ActionPayload` (events `action_run_success`, `_failure`, `_recover`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionPayload {
    /// success, failure or recover.
    pub action: String,
    /// The finished run.
    pub run: ActionRun,
}

/// Gitea's `CommitStatusPayload` (event `status`; Forgejo never sends it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommitStatusPayload {
    /// The commit.
    pub sha: String,
    /// Status context.
    #[serde(default)]
    pub context: String,
    /// pending, success, error, failure, warning.
    #[serde(default)]
    pub state: String,
    /// Human text.
    #[serde(default)]
    pub description: Option<String>,
    /// Link to the CI run.
    #[serde(default)]
    pub target_url: Option<String>,
    /// Last update, RFC 3339.
    #[serde(default)]
    pub updated_at: Option<String>,
    /// The repository.
    pub repository: Repository,
    /// Who posted the status.
    #[serde(default)]
    pub sender: Option<User>,
}

/// One review from `GET …/pulls/{index}/reviews` (`modules/structs/pull_review.go`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PullReview {
    /// Review id.
    pub id: i64,
    /// Reviewer.
    #[serde(default)]
    pub user: Option<User>,
    /// APPROVED, REQUEST_CHANGES, COMMENT, PENDING, REQUEST_REVIEW or "".
    #[serde(default)]
    pub state: String,
    /// Review body.
    #[serde(default)]
    pub body: String,
    /// Commit reviewed.
    #[serde(default)]
    pub commit_id: String,
    /// New commits changed the diff since.
    #[serde(default)]
    pub stale: bool,
    /// Counts towards approvals.
    #[serde(default)]
    pub official: bool,
    /// Explicitly or automatically dismissed.
    #[serde(default)]
    pub dismissed: bool,
    /// Submission time, RFC 3339.
    #[serde(default)]
    pub submitted_at: Option<String>,
}

/// One entry of a combined status. Note the state key: the combined-status endpoint
/// returns `status` per entry (as the statuses list does); `state` is accepted too.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CommitStatus {
    /// Status context (check name).
    #[serde(default)]
    pub context: String,
    /// pending, success, error, failure, warning.
    #[serde(default, alias = "state")]
    pub status: String,
    /// Human text, e.g. "Failing after 1m".
    #[serde(default)]
    pub description: Option<String>,
    /// Link to the CI run.
    #[serde(default)]
    pub target_url: Option<String>,
    /// Last update, RFC 3339.
    #[serde(default)]
    pub updated_at: Option<String>,
}

/// `GET …/commits/{ref}/status`: the latest status per context.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CombinedStatus {
    /// Worst state; `""` when there are no statuses at all.
    #[serde(default)]
    pub state: String,
    /// The commit (`""` when there are no statuses).
    #[serde(default)]
    pub sha: String,
    /// Number of contexts.
    #[serde(default)]
    pub total_count: u64,
    /// One per context; `null` when there are none.
    #[serde(default)]
    pub statuses: Option<Vec<CommitStatus>>,
}
