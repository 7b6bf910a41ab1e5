//! Posting a formal review (`POST …/pulls/{n}/reviews`), for the reviewer agents: the
//! agent runner posts the verdict an agent wrote with that reviewer's own client (its
//! own token), so a review is always by the reviewer agent's Forgejo user.
//!
//! Forgejo (routers/api/v1/repo/pull_review.go, `preparePullReviewType`) refuses an
//! `APPROVED` or `REQUEST_CHANGES` by the PR's author with 422 ("approve / reject your
//! own pull is not allowed"), wants a body for `REQUEST_CHANGES`, and reviews the
//! current head when `commit_id` is empty.

use serde::Serialize;
use tracing::instrument;

use super::client::repo_path;
use super::{ForgejoClient, ForgejoError};
use crate::core::payload::PullReview;

/// The body of `POST …/pulls/{n}/reviews` (`CreatePullReviewOptions`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NewReview {
    /// `APPROVED`, `REQUEST_CHANGES` or `COMMENT`.
    pub event: String,
    /// The review's text.
    pub body: String,
    /// The commit reviewed (the work item's head).
    pub commit_id: String,
    /// Inline comments.
    pub comments: Vec<NewReviewComment>,
}

/// One inline comment (`CreatePullReviewComment`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NewReviewComment {
    /// File path.
    pub path: String,
    /// The comment.
    pub body: String,
    /// Line in the new version (0: none).
    pub new_position: u64,
    /// Line in the old version, for a removed line (0: none).
    pub old_position: u64,
}

impl ForgejoClient {
    /// `POST /repos/{o}/{r}/pulls/{n}/reviews`: submits a formal review as this
    /// client's user.
    #[instrument(skip_all, fields(repo = %repo, pr = number, event = %review.event))]
    pub async fn create_review(
        &self,
        repo: &str,
        number: u64,
        review: &NewReview,
    ) -> Result<PullReview, ForgejoError> {
        let path = format!("{}/pulls/{number}/reviews", repo_path(repo)?);
        let body = serde_json::to_value(review)
            .map_err(|e| ForgejoError::Invalid(format!("review body: {e}")))?;
        self.send_json(reqwest::Method::POST, &path, &body).await
    }
}
