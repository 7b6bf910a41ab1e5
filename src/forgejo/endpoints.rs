//! Read endpoints and comments: pull requests, reviews, commit statuses, comments,
//! collaborator permissions and the version (forgejo-facts.md §4.2).

use reqwest::Method;
use serde_json::json;
use tracing::instrument;

use super::client::{PAGE_LIMIT, decode, page_is_last, repo_path};
use super::types::{
    CombinedStatus, Comment, CommitStatus, Issue, PullRequest, RepoPermission, User,
};
use super::{ForgejoClient, ForgejoError};
use crate::core::payload::PullReview;

/// Safety stop for combined-status paging (50 × 100 = 5,000 contexts).
const MAX_STATUS_PAGES: usize = 100;

impl ForgejoClient {
    /// `GET /version`: the server version, e.g. `15.0.3+gitea-1.22.0`.
    #[instrument(skip_all)]
    pub async fn version(&self) -> Result<String, ForgejoError> {
        #[derive(serde::Deserialize)]
        struct Version {
            version: String,
        }
        let v: Version = self.get_json("/version", &[]).await?;
        Ok(v.version)
    }

    /// `GET /user`: the token's own user (checks the token and the bot login at start).
    #[instrument(skip_all)]
    pub async fn current_user(&self) -> Result<User, ForgejoError> {
        self.get_json("/user", &[]).await
    }

    /// `GET /repos/{o}/{r}/pulls/{n}`.
    #[instrument(skip_all, fields(repo = %repo, pr = number))]
    pub async fn get_pull(&self, repo: &str, number: u64) -> Result<PullRequest, ForgejoError> {
        let path = format!("{}/pulls/{number}", repo_path(repo)?);
        self.get_json(&path, &[]).await
    }

    /// `GET /repos/{o}/{r}/issues/{n}` (PRs are issues too).
    #[instrument(skip_all, fields(repo = %repo, number = number))]
    pub async fn get_issue(&self, repo: &str, number: u64) -> Result<Issue, ForgejoError> {
        let path = format!("{}/issues/{number}", repo_path(repo)?);
        self.get_json(&path, &[]).await
    }

    /// Every open PR of a repository (`state=open`, always: an empty state lists all).
    #[instrument(skip_all, fields(repo = %repo))]
    pub async fn list_open_pulls(&self, repo: &str) -> Result<Vec<PullRequest>, ForgejoError> {
        let path = format!("{}/pulls", repo_path(repo)?);
        self.get_all(&path, &[("state", "open".to_owned())]).await
    }

    /// Every review of a PR, all pages, in the core's wire shape of a review (the one
    /// `core::normalize::review` reads).
    #[instrument(skip_all, fields(repo = %repo, pr = number))]
    pub async fn list_reviews(
        &self,
        repo: &str,
        number: u64,
    ) -> Result<Vec<PullReview>, ForgejoError> {
        let path = format!("{}/pulls/{number}/reviews", repo_path(repo)?);
        self.get_all(&path, &[]).await
    }

    /// The combined status of `sha` over all its contexts: pages of 50 contexts are
    /// merged and the state is recomputed over all of them. No statuses at all gives
    /// state `""` with no statuses (Forgejo's answer), never `pending`.
    #[instrument(skip_all, fields(repo = %repo, sha = %sha))]
    pub async fn combined_status(
        &self,
        repo: &str,
        sha: &str,
    ) -> Result<CombinedStatus, ForgejoError> {
        let path = format!("{}/commits/{}/status", repo_path(repo)?, checked_ref(sha)?);
        let mut statuses: Vec<CommitStatus> = Vec::new();
        for page in 1..=MAX_STATUS_PAGES {
            let q = [
                ("page", page.to_string()),
                ("limit", PAGE_LIMIT.to_string()),
            ];
            let answer = self.send(Method::GET, &path, &q, None).await?;
            let combined: CombinedStatus = decode(&path, &answer.body)?;
            let n = combined.statuses.len();
            statuses.extend(combined.statuses);
            if page_is_last(n, statuses.len(), answer.total) {
                break;
            }
        }
        let state = combine_states(statuses.iter().map(|s| s.status.as_str()));
        Ok(CombinedStatus {
            sha: if statuses.is_empty() {
                String::new()
            } else {
                sha.to_owned()
            },
            total_count: statuses.len() as u64,
            state,
            statuses,
        })
    }

    /// Every status ever posted on `sha` (not only the latest per context), all pages.
    #[instrument(skip_all, fields(repo = %repo, sha = %sha))]
    pub async fn list_statuses(
        &self,
        repo: &str,
        sha: &str,
    ) -> Result<Vec<CommitStatus>, ForgejoError> {
        let path = format!("{}/statuses/{}", repo_path(repo)?, checked_ref(sha)?);
        self.get_all(&path, &[]).await
    }

    /// `POST …/issues/{n}/comments`.
    #[instrument(skip_all, fields(repo = %repo, number = number))]
    pub async fn create_comment(
        &self,
        repo: &str,
        number: u64,
        body: &str,
    ) -> Result<Comment, ForgejoError> {
        let path = format!("{}/issues/{number}/comments", repo_path(repo)?);
        self.send_json(Method::POST, &path, &json!({ "body": body }))
            .await
    }

    /// `PATCH …/issues/comments/{id}`: edits a comment in place (the sticky comment).
    #[instrument(skip_all, fields(repo = %repo, comment = id))]
    pub async fn edit_comment(
        &self,
        repo: &str,
        id: i64,
        body: &str,
    ) -> Result<Comment, ForgejoError> {
        let path = format!("{}/issues/comments/{id}", repo_path(repo)?);
        self.send_json(Method::PATCH, &path, &json!({ "body": body }))
            .await
    }

    /// Every plain comment of an issue or PR (this endpoint is not paginated).
    #[instrument(skip_all, fields(repo = %repo, number = number))]
    pub async fn list_comments(
        &self,
        repo: &str,
        number: u64,
    ) -> Result<Vec<Comment>, ForgejoError> {
        let path = format!("{}/issues/{number}/comments", repo_path(repo)?);
        self.get_json(&path, &[]).await
    }

    /// The most recent comment whose body contains `marker` (a hidden
    /// `<!-- … -->` marker), optionally only among comments by `author`.
    #[instrument(skip_all, fields(repo = %repo, number = number))]
    pub async fn find_comment_with_marker(
        &self,
        repo: &str,
        number: u64,
        marker: &str,
        author: Option<&str>,
    ) -> Result<Option<Comment>, ForgejoError> {
        let comments = self.list_comments(repo, number).await?;
        Ok(comments.into_iter().rev().find(|c| {
            c.body.contains(marker) && author.is_none_or(|a| c.user.login.eq_ignore_ascii_case(a))
        }))
    }

    /// Posts `body` unless a comment carrying `marker` (by `author`, when given)
    /// already exists: the idempotent form of a one-off comment, safe to retry after a
    /// crash between posting and recording it.
    pub async fn comment_once(
        &self,
        repo: &str,
        number: u64,
        marker: &str,
        body: &str,
        author: Option<&str>,
    ) -> Result<(Comment, CommentWrite), ForgejoError> {
        match self
            .find_comment_with_marker(repo, number, marker, author)
            .await?
        {
            Some(existing) => Ok((existing, CommentWrite::Unchanged)),
            None => Ok((
                self.create_comment(repo, number, body).await?,
                CommentWrite::Created,
            )),
        }
    }

    /// The sticky comment: edits the comment carrying `marker` (by `author`, when
    /// given) to `body`, or creates it; nothing is written when the text is unchanged.
    pub async fn upsert_comment(
        &self,
        repo: &str,
        number: u64,
        marker: &str,
        body: &str,
        author: Option<&str>,
    ) -> Result<(Comment, CommentWrite), ForgejoError> {
        match self
            .find_comment_with_marker(repo, number, marker, author)
            .await?
        {
            Some(existing) if existing.body == body => Ok((existing, CommentWrite::Unchanged)),
            Some(existing) => Ok((
                self.edit_comment(repo, existing.id, body).await?,
                CommentWrite::Edited,
            )),
            None => Ok((
                self.create_comment(repo, number, body).await?,
                CommentWrite::Created,
            )),
        }
    }

    /// `GET /repos/{o}/{r}/collaborators/{user}/permission`.
    #[instrument(skip_all, fields(repo = %repo, user = %user))]
    pub async fn collaborator_permission(
        &self,
        repo: &str,
        user: &str,
    ) -> Result<RepoPermission, ForgejoError> {
        if user.is_empty() || user.contains(['/', '?', '#']) {
            return Err(ForgejoError::Invalid(format!("{user:?} is not a login")));
        }
        let path = format!("{}/collaborators/{user}/permission", repo_path(repo)?);
        self.get_json(&path, &[]).await
    }
}

/// What [`ForgejoClient::upsert_comment`] and [`ForgejoClient::comment_once`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommentWrite {
    /// A new comment was posted.
    Created,
    /// The existing comment was edited.
    Edited,
    /// Nothing was written: the comment already says that.
    Unchanged,
}

/// Checks that a sha or ref is safe as one path segment.
fn checked_ref(sha: &str) -> Result<&str, ForgejoError> {
    if !sha.is_empty()
        && sha
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        Ok(sha)
    } else {
        Err(ForgejoError::Invalid(format!("{sha:?} is not a sha")))
    }
}

/// Forgejo's combined state: the worst state by priority
/// error < failure < warning < pending < success, with `error` reported as `failure`;
/// `""` when there is no status. Unknown states are ignored.
pub fn combine_states<'a>(states: impl IntoIterator<Item = &'a str>) -> String {
    let rank = |s: &str| match s {
        "error" => Some(0),
        "failure" => Some(1),
        "warning" => Some(2),
        "pending" => Some(3),
        "success" => Some(4),
        _ => None,
    };
    let worst = states.into_iter().filter_map(rank).min();
    match worst {
        None => "",
        Some(0 | 1) => "failure",
        Some(2) => "warning",
        Some(3) => "pending",
        Some(_) => "success",
    }
    .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_state_priority() {
        assert_eq!(combine_states([]), "");
        assert_eq!(combine_states(["success", "success"]), "success");
        assert_eq!(combine_states(["success", "pending"]), "pending");
        assert_eq!(combine_states(["pending", "warning"]), "warning");
        assert_eq!(combine_states(["warning", "error"]), "failure");
        assert_eq!(combine_states(["failure", "success"]), "failure");
    }
}
