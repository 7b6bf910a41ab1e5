//! Response and request bodies of the Forgejo REST API (forgejo-facts.md §3–§4), with
//! only the fields Shepherd reads. Every field has a serde default so a missing or
//! `null` field never fails a whole read; unknown fields are ignored.

use chrono::{DateTime, FixedOffset};
use serde::{Deserialize, Deserializer, Serialize};

use crate::core::policy::MergeStyle;

/// Deserializes `null` as the type's default (Forgejo sends `null` for empty lists and
/// absent objects in several places, e.g. `statuses` of an empty combined status).
pub(super) fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A Forgejo user, as embedded in PRs, reviews and comments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct User {
    /// Numeric id.
    pub id: i64,
    /// Username.
    pub login: String,
}

/// A label (repository label, or one attached to an issue or PR).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Label {
    /// Numeric id; the `DELETE …/labels/{id}` route of v11/v12 needs it.
    pub id: i64,
    /// Label name.
    pub name: String,
    /// Hex colour without `#`.
    pub color: String,
    /// Description.
    pub description: String,
}

/// One side of a PR (`head` or `base`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BranchInfo {
    /// Branch name (or `refs/pull/N/head` when the head branch is gone).
    #[serde(rename = "ref")]
    pub ref_name: String,
    /// Current tip of the branch: for `head`, the sha to match statuses against.
    pub sha: String,
    /// The repository the branch is in (a fork's for a PR from a fork; 0 when the
    /// answer did not say).
    pub repo_id: i64,
}

/// A pull request (`GET …/pulls/{n}`, `GET …/pulls`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PullRequest {
    /// Internal id.
    pub id: i64,
    /// PR index within the repository.
    pub number: u64,
    /// Title.
    pub title: String,
    /// Body (markdown), `""` when empty.
    #[serde(deserialize_with = "null_default")]
    pub body: String,
    /// Author.
    #[serde(deserialize_with = "null_default")]
    pub user: User,
    /// `"open"` or `"closed"`.
    pub state: String,
    /// True when the title carries a WIP prefix.
    pub draft: bool,
    /// No conflict, not checking, not WIP. Says nothing about approvals or CI.
    pub mergeable: bool,
    /// True once merged.
    pub merged: bool,
    /// When it was merged.
    pub merged_at: Option<DateTime<FixedOffset>>,
    /// The merge commit, once merged.
    pub merge_commit_sha: Option<String>,
    /// Labels currently on the PR.
    #[serde(deserialize_with = "null_default")]
    pub labels: Vec<Label>,
    /// Head branch and sha.
    #[serde(deserialize_with = "null_default")]
    pub head: BranchInfo,
    /// Base branch and its current tip.
    #[serde(deserialize_with = "null_default")]
    pub base: BranchInfo,
    /// The commit the head is built on (`git merge-base` of head and base, as Forgejo
    /// last computed it): equal to the base's tip when the PR is up to date with it.
    #[serde(deserialize_with = "null_default")]
    pub merge_base: String,
    /// Last update.
    pub updated_at: Option<DateTime<FixedOffset>>,
    /// Conversation comments (`None` when the answer did not carry the count).
    pub comments: Option<u64>,
}

impl PullRequest {
    /// True while the PR is open.
    pub fn is_open(&self) -> bool {
        self.state == "open"
    }
}

/// One commit status. Its state is under the key `status`, not `state`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CommitStatus {
    /// Status id.
    pub id: i64,
    /// `pending`, `success`, `error`, `failure` or `warning`.
    pub status: String,
    /// CI context name.
    pub context: String,
    /// Human-readable description.
    #[serde(deserialize_with = "null_default")]
    pub description: String,
    /// Link to the CI run (may be relative for Forgejo Actions).
    #[serde(deserialize_with = "null_default")]
    pub target_url: String,
    /// Last update.
    pub updated_at: Option<DateTime<FixedOffset>>,
}

/// The combined status of a sha, merged over every page of contexts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CombinedStatus {
    /// `failure`, `warning`, `pending`, `success`, or `""` when there are no statuses.
    pub state: String,
    /// The sha (`""` when there are no statuses).
    pub sha: String,
    /// Number of contexts.
    pub total_count: u64,
    /// Latest status per context.
    #[serde(deserialize_with = "null_default")]
    pub statuses: Vec<CommitStatus>,
}

/// An issue or PR conversation comment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Comment {
    /// Comment id (for `PATCH …/issues/comments/{id}`).
    pub id: i64,
    /// Author.
    #[serde(deserialize_with = "null_default")]
    pub user: User,
    /// Markdown body.
    #[serde(deserialize_with = "null_default")]
    pub body: String,
    /// Link to the comment.
    pub html_url: String,
    /// When it was posted.
    pub created_at: Option<DateTime<FixedOffset>>,
    /// Last edit (what `?since=` filters on).
    pub updated_at: Option<DateTime<FixedOffset>>,
}

/// One file a PR changes (`GET …/pulls/{n}/files`, Forgejo's `ChangedFile`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChangedFile {
    /// Path in the head.
    pub filename: String,
    /// The path before a rename, `""` otherwise.
    #[serde(deserialize_with = "null_default")]
    pub previous_filename: String,
    /// `added`, `deleted`, `changed`, `renamed`, `copied` or `unchanged`.
    pub status: String,
    /// Lines added.
    pub additions: u64,
    /// Lines deleted.
    pub deletions: u64,
}

/// An inline (code) comment of a review (`GET …/pulls/{n}/reviews/{id}/comments`,
/// Forgejo's `PullReviewComment`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReviewComment {
    /// Comment id.
    pub id: i64,
    /// Author.
    #[serde(deserialize_with = "null_default")]
    pub user: User,
    /// Markdown body.
    #[serde(deserialize_with = "null_default")]
    pub body: String,
    /// File the comment is on.
    #[serde(deserialize_with = "null_default")]
    pub path: String,
    /// Line in the new version (0 when the comment is on a removed line).
    pub position: u64,
    /// Line in the old version (0 when the comment is on an added line).
    pub original_position: u64,
    /// The lines of the diff the comment refers to.
    #[serde(deserialize_with = "null_default")]
    pub diff_hunk: String,
    /// The commit it was made on.
    #[serde(deserialize_with = "null_default")]
    pub commit_id: String,
}

/// A collaborator's permission on a repository.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RepoPermission {
    /// `owner`, `admin`, `write`, `read` or `none`.
    pub permission: String,
}

impl RepoPermission {
    /// True for write access or more (`write`, `admin`, `owner`).
    pub fn can_write(&self) -> bool {
        matches!(self.permission.as_str(), "write" | "admin" | "owner")
    }
}

/// Body of `POST …/pulls/{n}/merge`. The Go form fields without JSON tags keep their
/// Go names (`Do`, `MergeTitleField`, `MergeMessageField`). There is deliberately no
/// `force_merge` field: Shepherd never bypasses branch protection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MergeRequest {
    /// Merge style: the policy's own type, whose kebab-case names are Forgejo's `Do`
    /// values.
    #[serde(rename = "Do")]
    pub style: MergeStyle,
    /// The head sha the merge is pinned to; a moved head gives 409 "head out of date".
    pub head_commit_id: String,
    /// Delete the head branch after merging.
    pub delete_branch_after_merge: bool,
    /// Commit title; Forgejo's default when absent.
    #[serde(rename = "MergeTitleField", skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Commit message body; Forgejo's default when absent.
    #[serde(rename = "MergeMessageField", skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Why Forgejo refused a merge with 405.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeRefusal {
    /// "PR not in mergeable state" / "Please try again later": conflict check running,
    /// conflicts or an error. Re-check mergeability later.
    NotMergeable,
    /// Branch protection: `not allowed to merge [reason: …]`, with the reason.
    Protection(String),
    /// The PR is a work in progress.
    WorkInProgress,
    /// The bot may not merge ("User not allowed to merge PR").
    UserNotAllowed,
    /// The merge style is not enabled for the repository.
    StyleNotAllowed,
    /// The PR is already merged (Forgejo answers this 405 with an empty message).
    AlreadyMerged,
    /// Anything else.
    Other,
}

/// Why Forgejo refused a merge with 409.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeConflictKind {
    /// `head_commit_id` no longer matches the head: do not merge the old head.
    HeadOutOfDate,
    /// Merge or rebase conflicts (body is `ErrMergeConflicts`/`ErrRebaseConflicts`).
    Conflict,
    /// The PR was already merged.
    AlreadyMerged,
    /// Push out of date, rejected by a hook, unrelated histories, auto-merge scheduled.
    Other,
}

/// The outcome of `POST …/pulls/{n}/merge`, one variant per way it can end. Only
/// [`MergeOutcome::Merged`] means merged for sure; [`MergeOutcome::Forbidden`] and
/// [`MergeOutcome::Ambiguous`] must be resolved by re-reading the PR.
#[derive(Debug)]
pub enum MergeOutcome {
    /// 200: merged.
    Merged,
    /// 403: either merged with a head branch that could not be deleted (protected,
    /// default branch, no permission), or refused before merging (a token without the
    /// write scope, a user without write access). The answer cannot tell them apart:
    /// only a re-read of the PR can.
    Forbidden {
        /// Forgejo's message.
        message: String,
    },
    /// 405: a merge condition is not met.
    NotAllowed {
        /// Classified reason.
        refusal: MergeRefusal,
        /// Forgejo's message.
        message: String,
    },
    /// 409: conflict, moved head, already merged, …
    Conflict {
        /// Classified kind.
        kind: MergeConflictKind,
        /// Forgejo's message (or the conflict's `StdErr`).
        message: String,
    },
    /// 404: the PR does not exist or is closed.
    NotFound {
        /// Forgejo's message.
        message: String,
    },
    /// Timeout, 5xx, transport error after sending: the merge may or may not have
    /// happened. Never retry blindly; re-read the PR.
    Ambiguous {
        /// What happened.
        error: super::ForgejoError,
    },
}

impl MergeOutcome {
    /// True when the PR is certainly merged (a 403 is not: see [`Self::Forbidden`]).
    pub fn is_merged(&self) -> bool {
        matches!(self, Self::Merged)
    }
}

/// An issue (`GET …/issues/{n}`); PRs are issues too, with `pull_request` set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Issue {
    /// Index within the repository.
    pub number: u64,
    /// Title.
    pub title: String,
    /// Body.
    #[serde(deserialize_with = "null_default")]
    pub body: String,
    /// Author.
    #[serde(deserialize_with = "null_default")]
    pub user: User,
    /// `"open"` or `"closed"`.
    pub state: String,
    /// Labels on the issue.
    #[serde(deserialize_with = "null_default")]
    pub labels: Vec<Label>,
    /// Set when the issue is a pull request.
    pub pull_request: Option<IssuePullRef>,
    /// Last update.
    pub updated_at: Option<DateTime<FixedOffset>>,
    /// The milestone, when it has one.
    pub milestone: Option<Milestone>,
    /// The issue's repository (`RepositoryMeta`; dependencies may be in another).
    pub repository: Option<RepositoryMeta>,
}

/// An issue's milestone (the fields Shepherd shows).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Milestone {
    /// Title.
    pub title: String,
    /// `open` or `closed`.
    pub state: String,
}

/// The repository an issue belongs to (`RepositoryMeta`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RepositoryMeta {
    /// `owner/name`.
    pub full_name: String,
}

/// The `pull_request` summary inside an issue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IssuePullRef {
    /// Merged.
    pub merged: bool,
    /// Draft (WIP).
    pub draft: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy's merge style is what the client sends: each one serializes to one of
    /// the values Forgejo's `MergePullRequestOption.Do` accepts (forgejo-openapi-v15).
    #[test]
    fn every_policy_merge_style_is_a_forgejo_do_value() {
        let forgejo = [
            "merge",
            "rebase",
            "rebase-merge",
            "squash",
            "fast-forward-only",
        ];
        let styles = [
            MergeStyle::Merge,
            MergeStyle::Rebase,
            MergeStyle::RebaseMerge,
            MergeStyle::Squash,
            MergeStyle::FastForwardOnly,
        ];
        for (style, want) in styles.into_iter().zip(forgejo) {
            let body = MergeRequest {
                style,
                head_commit_id: "abc".into(),
                delete_branch_after_merge: true,
                title: None,
                message: None,
            };
            let json = serde_json::to_value(&body).unwrap();
            assert_eq!(json["Do"], want, "{style:?}");
        }
    }
}
