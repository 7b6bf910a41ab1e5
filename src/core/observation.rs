//! What Shepherd observes about PRs, issues, CI and reviews: the fact types carried by
//! events and kept in records (also re-exported from `core::event`).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::ids::{Login, RepoName, Sha};

/// A PR as Forgejo shows it at one moment (webhook `pull_request` or `GET …/pulls/N`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrSnapshot {
    /// Repository.
    pub repo: RepoName,
    /// PR index.
    pub number: u64,
    /// Open, closed or merged.
    pub state: PrState,
    /// Work in progress (WIP title prefix).
    pub draft: bool,
    /// Title.
    pub title: String,
    /// Description (bot marker, linked issues).
    pub body: String,
    /// Author.
    pub author: Option<Login>,
    /// Current head commit.
    pub head_sha: Option<Sha>,
    /// Source branch name.
    pub head_ref: String,
    /// Target branch name.
    pub base_ref: String,
    /// Label names.
    pub labels: BTreeSet<String>,
    /// Conflict-free: `None` when unknown (sync payloads, checking).
    pub mergeable: Option<bool>,
    /// Forgejo's `updated_at` in unix ms (orders snapshots of one PR); 0 if unknown.
    pub updated_ms: i64,
    /// Forgejo's `comments`: the PR's conversation comments (the status comment is
    /// one), `None` when the payload did not say. Zero proves there is no status
    /// comment yet, so the first one is posted without listing the comments.
    #[serde(default)]
    pub comments: Option<u64>,
}

/// Whether a PR is open, closed or merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrState {
    /// Open.
    Open,
    /// Closed without merge.
    Closed,
    /// Merged.
    Merged,
}

/// An issue as Forgejo shows it at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssueSnapshot {
    /// Repository.
    pub repo: RepoName,
    /// Issue index.
    pub number: u64,
    /// Open (`true`) or closed.
    pub open: bool,
    /// Title.
    pub title: String,
    /// Description.
    pub body: String,
    /// Author.
    pub author: Option<Login>,
    /// Label names.
    pub labels: BTreeSet<String>,
    /// Forgejo's `updated_at` in unix ms; 0 if unknown.
    pub updated_ms: i64,
}

/// A commit status state (Forgejo's five values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CiState {
    /// Still running or queued.
    Pending,
    /// Passed.
    Success,
    /// Failed.
    Failure,
    /// Errored (Forgejo reports it as failure in combined states).
    Error,
    /// Warning: not success, so it blocks a merge like a failure.
    Warning,
}

impl CiState {
    /// Parses Forgejo's state text; unknown text is treated as pending.
    pub fn parse(s: &str) -> CiState {
        match s.to_ascii_lowercase().as_str() {
            "success" => CiState::Success,
            "failure" => CiState::Failure,
            "error" => CiState::Error,
            "warning" => CiState::Warning,
            _ => CiState::Pending,
        }
    }

    /// Whether this state is a failure that a `ci-fix` should address.
    pub fn is_failing(self) -> bool {
        match self {
            CiState::Failure | CiState::Error | CiState::Warning => true,
            CiState::Pending | CiState::Success => false,
        }
    }
}

/// The latest status of one CI context on one commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CiContext {
    /// Context name, e.g. `ci / test (pull_request)`.
    pub context: String,
    /// Its state.
    pub state: CiState,
    /// Human text.
    pub description: String,
    /// Link to the run.
    pub target_url: String,
    /// When Forgejo last updated it (unix ms; 0 if unknown): orders observations.
    pub updated_ms: i64,
}

/// A formal review state (forgejo-facts §3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReviewState {
    /// Approved.
    Approved,
    /// Changes requested.
    RequestChanges,
    /// A comment-only review (does not change the reviewer's stance).
    Comment,
    /// Not submitted yet.
    Pending,
    /// An open review request.
    RequestReview,
    /// Unknown.
    Unknown,
}

impl ReviewState {
    /// Parses Forgejo's review state text.
    pub fn parse(s: &str) -> ReviewState {
        match s {
            "APPROVED" => ReviewState::Approved,
            "REQUEST_CHANGES" => ReviewState::RequestChanges,
            "COMMENT" => ReviewState::Comment,
            "PENDING" => ReviewState::Pending,
            "REQUEST_REVIEW" => ReviewState::RequestReview,
            _ => ReviewState::Unknown,
        }
    }
}

/// One formal review as a fact of the PR record (from `GET …/pulls/{n}/reviews`, read
/// as [`super::payload::PullReview`] and normalized by `normalize::review`). Not the
/// review webhook: that is [`super::event::Event::Review`], a hint to read these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewFact {
    /// Review id.
    pub id: i64,
    /// Reviewer.
    pub reviewer: Login,
    /// Its state.
    pub state: ReviewState,
    /// Body (context for `review-feedback` work).
    pub body: String,
    /// Commit reviewed.
    pub commit_id: String,
    /// Outdated by later commits.
    pub stale: bool,
    /// Counts towards approvals.
    pub official: bool,
    /// Dismissed.
    pub dismissed: bool,
    /// Submission time (unix ms, 0 if unknown): orders one reviewer's reviews.
    pub submitted_ms: i64,
}

/// A repository permission level of a user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Permission {
    /// No access or read only.
    Read,
    /// Write access.
    Write,
    /// Admin or owner.
    Admin,
}

/// One issue that blocks an issue (Forgejo's "depends on": `GET
/// …/issues/{index}/dependencies`), as `Observe(Dependencies)` read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DependencyFact {
    /// The dependency's repository (Forgejo allows dependencies across repositories).
    pub repo: RepoName,
    /// Its index.
    pub number: u64,
    /// Open (`true`) or closed.
    pub open: bool,
    /// The dependency is itself a pull request.
    #[serde(default)]
    pub is_pull: bool,
    /// Open PRs of the issue's repository whose body links the dependency (`Closes
    /// #N`), as read (the core decides which of them to trust).
    #[serde(default)]
    pub linking_prs: Vec<LinkingPrFact>,
}

/// An open PR that links a dependency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkingPrFact {
    /// PR index.
    pub number: u64,
    /// Its author.
    pub author: Option<Login>,
    /// Its head branch.
    pub head_ref: String,
    /// The head branch is in the PR's own repository (not a fork).
    pub same_repo: bool,
}
