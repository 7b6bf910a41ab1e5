//! Forgejo REST client for exactly the endpoints effects need, with typed errors.
//!
//! ```text
//! actions.rs    Forgejo Actions: the version (read once), runs, a run's jobs, a job's log tail
//! client.rs     ForgejoClient: auth, timeout, user agent, one request, decoding, paging
//! endpoints.rs  PRs, reviews, combined status / statuses, comments, permission, version
//! context.rs    the agents' context: raw diff, changed files, review comments, comments since
//! labels.rs     repository labels, issue labels by name / by id, LabelCache per repo
//! merge.rs      POST …/merge → MergeOutcome; GET …/merge
//! queue.rs      the merge queue: POST …/pulls/{n}/update, a branch's tip, merge settings
//! reviews.rs    POST …/pulls/{n}/reviews: a reviewer agent's formal review
//! dependencies.rs  the issues an issue blocks (where its Epic is)
//! convert.rs    answers as core::payload structs (From impls)
//! breaker.rs    circuit breaker per host (fail fast while the host is down)
//! calls.rs      why a call was made (Cause) and its endpoint template, for the call metrics
//! error.rs      ForgejoError: is_retryable(), retry_after()
//! types.rs      the response fields Shepherd reads; the merge request body
//! ```
//!
//! Repositories are named `owner/name`; paths and field names follow
//! `forgejo-facts.md` §4 (e.g. `state=open` on every PR listing, commit statuses under
//! the key `status`, merge body keys `Do` / `head_commit_id`, never `force_merge`).

mod actions;
mod batch;
mod breaker;
mod calls;
mod client;
mod context;
mod convert;
mod dependencies;
mod endpoints;
mod error;
mod labels;
mod merge;
mod queue;
mod reviews;
mod timeline;
mod types;

pub use actions::{ActionRun, ActionRunJob, ForgejoVersion, JOB_LOGS_SINCE, LogTail};
pub use batch::{BranchCreated, ManualMerge};
pub use breaker::{BreakerConfig, BreakerState, CircuitBreaker};
pub use calls::{Cause, endpoint};
pub use client::{ClientOptions, ForgejoClient, PAGE_LIMIT};
pub use context::{CappedDiff, FileList};
pub use endpoints::{CommentWrite, combine_states};
pub use error::ForgejoError;
pub use labels::{LabelCache, default_color};
pub use queue::{Branch, BranchCommit, RepoSettings, UpdateOutcome};
pub use reviews::{NewReview, NewReviewComment};
pub use timeline::TimelineComment;
pub use types::{
    BranchInfo, ChangedFile, CombinedStatus, Comment, CommitStatus, Issue, IssuePullRef, Label,
    MergeConflictKind, MergeOutcome, MergeRefusal, MergeRequest, PullRequest, RepoPermission,
    ReviewComment, User,
};
