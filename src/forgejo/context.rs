//! Reads for the agents' context (forgejo-facts.md §4.2 and Forgejo's OpenAPI): a PR's
//! raw diff, its changed files, the inline comments of a review, and conversation
//! comments since a time. Every read is bounded by its caller's limits, so a huge PR
//! costs at most the bytes and pages the prompt can show.

use chrono::{DateTime, SecondsFormat, Utc};
use tracing::instrument;

use super::client::{PAGE_LIMIT, page_is_last, repo_path};
use super::types::{ChangedFile, Comment, ReviewComment};
use super::{ForgejoClient, ForgejoError};

/// A raw diff, read up to a byte limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CappedDiff {
    /// The diff's first bytes (all of it unless `truncated`).
    pub text: String,
    /// The diff went on past the limit.
    pub truncated: bool,
}

/// The first files of a PR's changed-file list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileList {
    /// At most the requested number of files, in Forgejo's order.
    pub files: Vec<ChangedFile>,
    /// How many files the PR changes (`X-Total-Count`), when Forgejo said.
    pub total: Option<usize>,
}

impl ForgejoClient {
    /// `GET /repos/{o}/{r}/pulls/{n}.diff`: the PR's diff as `git diff` prints it
    /// (text/plain), reading at most `max_bytes` of it.
    #[instrument(skip_all, fields(repo = %repo, pr = number))]
    pub async fn pull_diff(
        &self,
        repo: &str,
        number: u64,
        max_bytes: usize,
    ) -> Result<CappedDiff, ForgejoError> {
        let path = format!("{}/pulls/{number}.diff", repo_path(repo)?);
        let (text, truncated) = self.get_text_capped(&path, max_bytes).await?;
        Ok(CappedDiff { text, truncated })
    }

    /// `GET …/pulls/{n}/files`: the first `max_files` changed files (pages of
    /// [`PAGE_LIMIT`], stopping as soon as enough are read).
    #[instrument(skip_all, fields(repo = %repo, pr = number))]
    pub async fn pull_files(
        &self,
        repo: &str,
        number: u64,
        max_files: usize,
    ) -> Result<FileList, ForgejoError> {
        let path = format!("{}/pulls/{number}/files", repo_path(repo)?);
        let mut files: Vec<ChangedFile> = Vec::new();
        let mut total = None;
        let mut page = 1usize;
        while files.len() < max_files {
            let q = [
                ("page", page.to_string()),
                ("limit", PAGE_LIMIT.to_string()),
            ];
            let answer = self.send(reqwest::Method::GET, &path, &q, None).await?;
            let items: Vec<ChangedFile> = super::client::decode(&path, &answer.body)?;
            total = answer.total.or(total);
            let n = items.len();
            files.extend(items);
            if page_is_last(n, files.len(), answer.total) {
                break;
            }
            page += 1;
        }
        files.truncate(max_files);
        Ok(FileList { files, total })
    }

    /// `GET …/pulls/{n}/reviews/{id}/comments`: the inline comments of one review (not
    /// paginated; 404 when the review is not this PR's).
    #[instrument(skip_all, fields(repo = %repo, pr = number, review = review_id))]
    pub async fn review_comments(
        &self,
        repo: &str,
        number: u64,
        review_id: i64,
    ) -> Result<Vec<ReviewComment>, ForgejoError> {
        let path = format!(
            "{}/pulls/{number}/reviews/{review_id}/comments",
            repo_path(repo)?
        );
        self.get_json(&path, &[]).await
    }

    /// `GET …/issues/{n}/comments?since=`: the plain comments of an issue or PR updated
    /// at or after `since_ms` (all of them without it). Not paginated by Forgejo.
    #[instrument(skip_all, fields(repo = %repo, number = number))]
    pub async fn comments_since(
        &self,
        repo: &str,
        number: u64,
        since_ms: Option<i64>,
    ) -> Result<Vec<Comment>, ForgejoError> {
        let path = format!("{}/issues/{number}/comments", repo_path(repo)?);
        let query: Vec<(&str, String)> = since_ms
            .and_then(DateTime::<Utc>::from_timestamp_millis)
            .map(|t| ("since", t.to_rfc3339_opts(SecondsFormat::Secs, true)))
            .into_iter()
            .collect();
        self.get_json(&path, &query).await
    }
}
