//! What the batched merge queue (issue 29) needs of Forgejo, all operations of the v15
//! API definition:
//! - `POST /repos/{o}/{r}/branches` `{new_branch_name, old_ref_name}`: a temporary
//!   batch branch at the target's tip (201; 409 when it exists already);
//! - `DELETE /repos/{o}/{r}/branches/{branch}` (204; 404 when gone). Forgejo closes
//!   every unmerged PR whose head or base is the deleted branch (`CloseBranchPulls`,
//!   `services/pull/pull.go`), so the batch's helper PRs go with it;
//! - `POST /repos/{o}/{r}/pulls` `{head, base, title, body}`: a helper PR (a queued PR's
//!   branch into the batch branch, or the batch branch into the target); 409 when an
//!   open PR for the same head and base exists, found then with `GET …/pulls`;
//! - `POST …/pulls/{n}/merge` with `Do: manually-merged` and `MergeCommitID`: a queued
//!   PR marked merged by the landed batch tip. Forgejo (`services/pull/merge.go`
//!   `MergedManually`, v15) checks only that the repository allows manual merges, that
//!   the id is a full-length sha of an existing commit and that the commit is on the
//!   PR's base branch (`IsCommitInBranch`); it then sends the usual `pull_request`
//!   closed webhook with `merged: true`. The API refuses a merged PR with 405 and an
//!   empty message first (`CheckPullMergeable`), so a resumed landing reads each PR
//!   before marking it.

use reqwest::Method;
use serde_json::json;
use tracing::instrument;

use super::client::repo_path;
use super::types::PullRequest;
use super::{ForgejoClient, ForgejoError};

/// How creating a branch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchCreated {
    /// 201.
    Created,
    /// 409: a branch of that name exists (a restart after the create).
    Exists,
}

/// How marking a PR manually merged ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManualMerge {
    /// 200: marked merged now.
    Marked,
    /// Forgejo refused (404 closed, 405 merged or not allowed, 409 wrong commit).
    Refused {
        /// The status.
        code: u16,
        /// Forgejo's message.
        message: String,
    },
}

/// A branch name as a path: each `/`-separated part percent-encoded.
fn branch_path(branch: &str) -> Result<String, ForgejoError> {
    super::queue::branch_path(branch)
}

impl ForgejoClient {
    /// `POST …/branches`: `name` at commit `from`.
    #[instrument(skip_all, fields(repo = %repo, branch = %name))]
    pub async fn create_branch(
        &self,
        repo: &str,
        name: &str,
        from: &str,
    ) -> Result<BranchCreated, ForgejoError> {
        let path = format!("{}/branches", repo_path(repo)?);
        let body = json!({"new_branch_name": name, "old_ref_name": from});
        match self.send(Method::POST, &path, &[], Some(&body)).await {
            Ok(_) => Ok(BranchCreated::Created),
            Err(ForgejoError::Status { code: 409, .. }) => Ok(BranchCreated::Exists),
            Err(e) => Err(e),
        }
    }

    /// `DELETE …/branches/{branch}`: true when deleted now, false when already gone.
    #[instrument(skip_all, fields(repo = %repo, branch = %name))]
    pub async fn delete_branch(&self, repo: &str, name: &str) -> Result<bool, ForgejoError> {
        let path = format!("{}/branches/{}", repo_path(repo)?, branch_path(name)?);
        match self.send(Method::DELETE, &path, &[], None).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `POST …/pulls`: a helper PR `head` → `base`; an open one that exists already
    /// (409, a restart after the create) is found in the open PRs and returned.
    #[instrument(skip_all, fields(repo = %repo, head = %head, base = %base))]
    pub async fn create_helper_pull(
        &self,
        repo: &str,
        head: &str,
        base: &str,
        title: &str,
    ) -> Result<PullRequest, ForgejoError> {
        let path = format!("{}/pulls", repo_path(repo)?);
        let body = json!({"head": head, "base": base, "title": title, "body": ""});
        match self
            .send_json::<PullRequest>(Method::POST, &path, &body)
            .await
        {
            Ok(pr) => Ok(pr),
            Err(ForgejoError::Status { code: 409, .. }) => {
                let query = [("state", "open".to_owned())];
                let open: Vec<PullRequest> = self.get_all(&path, &query).await?;
                open.into_iter()
                    .find(|p| p.head.ref_name == head && p.base.ref_name == base)
                    .ok_or_else(|| {
                        ForgejoError::Invalid(format!(
                            "Forgejo says a PR {head} → {base} exists but lists none"
                        ))
                    })
            }
            Err(e) => Err(e),
        }
    }

    /// `POST …/pulls/{n}/merge` `{Do: manually-merged, MergeCommitID}`.
    #[instrument(skip_all, fields(repo = %repo, pr = number, commit = %commit))]
    pub async fn mark_manually_merged(
        &self,
        repo: &str,
        number: u64,
        commit: &str,
    ) -> Result<ManualMerge, ForgejoError> {
        let path = format!("{}/pulls/{number}/merge", repo_path(repo)?);
        let body = json!({"Do": "manually-merged", "MergeCommitID": commit});
        match self.send(Method::POST, &path, &[], Some(&body)).await {
            Ok(_) => Ok(ManualMerge::Marked),
            Err(ForgejoError::Status { code, message, .. })
                if matches!(code, 404 | 405 | 409 | 422) =>
            {
                Ok(ManualMerge::Refused { code, message })
            }
            Err(e) => Err(e),
        }
    }
}
