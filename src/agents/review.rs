//! `review` work: the reviewer agent writes its verdict to the review file
//! (`SHEPHERD_REVIEW_FILE`), and the runner posts it as a formal review with the
//! reviewer's own Forgejo client (`SHEPHERD_REVIEWER_TOKENS`).
//!
//! Why the runner posts and not the agent: the reviewer's token can approve PRs. An
//! agent runs model-written shell commands; a token in its environment or prompt could
//! be printed, logged or used on another PR. Held here, it reaches no argv, prompt,
//! log or agent environment, and the review can only be the work item's, on its head.
//!
//! The review file: `{"event": "APPROVED"|"REQUEST_CHANGES", "body": "…",
//! "comments": [{"path": "…", "line": N, "old_line": N?, "body": "…"}]}`. A file that
//! is missing or invalid posts nothing and reports `failed` (signature `review-file`,
//! the reason in the summary), so the claim ends now; the machine does not review that
//! head again. Each posted review carries a hidden marker with the work id: a runner
//! that retries the item (after a crash between posting and reporting) finds it and
//! does not post twice.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::core::effect::WorkItem;
use crate::core::event::WorkOutcome;
use crate::core::texts;
use crate::forgejo::{ForgejoClient, ForgejoError, NewReview, NewReviewComment};
use crate::worker::results::ResultReport;

/// Largest review file read.
pub const REVIEW_FILE_MAX: u64 = 256 * 1024;
/// Most inline comments posted with one review.
pub const MAX_INLINE_COMMENTS: usize = 50;
/// Most bytes of the review's body (Forgejo's column is large; a prompt-sized cap
/// keeps the next round's prompt bounded).
pub const MAX_REVIEW_BODY: usize = 32 * 1024;
/// Tries of the post on transient errors.
const POST_TRIES: u32 = 3;

/// Most earlier reviews shown in a prompt (the most recent).
pub const MAX_EARLIER_REVIEWS: usize = 20;

/// One formal review as the prompt shows it (earlier rounds for a reviewer agent).
#[derive(Debug, Clone, Default, Serialize)]
pub struct EarlierReview {
    /// Review id.
    pub id: i64,
    /// Reviewer's login (one line).
    pub reviewer: String,
    /// `APPROVED`, `REQUEST_CHANGES` or `COMMENT`.
    pub state: String,
    /// The commit it reviewed (one line).
    pub commit_id: String,
    /// Submission time (RFC 3339).
    pub submitted_at: String,
    /// Newer commits changed the diff since.
    pub stale: bool,
    /// Dismissed.
    pub dismissed: bool,
    /// Its body without Shepherd's marker (bounded).
    pub body: String,
}

/// The formal reviews of a PR for the prompt: submitted ones only (no pending ones
/// or open review requests), oldest first, the last [`MAX_EARLIER_REVIEWS`]; and how
/// many older ones were left out.
pub fn earlier_reviews(list: &[crate::core::payload::PullReview]) -> (Vec<EarlierReview>, usize) {
    use super::context::{MAX_REVIEW_BYTES, bounded, one_line};
    let shown: Vec<EarlierReview> = list
        .iter()
        .filter(|r| matches!(r.state.as_str(), "APPROVED" | "REQUEST_CHANGES" | "COMMENT"))
        .map(|r| EarlierReview {
            id: r.id,
            reviewer: one_line(r.user.as_ref().map_or("", |u| u.login.as_str())),
            state: r.state.clone(),
            commit_id: one_line(&r.commit_id),
            submitted_at: one_line(r.submitted_at.as_deref().unwrap_or("")),
            stale: r.stale,
            dismissed: r.dismissed,
            body: bounded(
                texts::strip_review_marker(&r.body).trim_end(),
                MAX_REVIEW_BYTES,
            ),
        })
        .collect();
    let omitted = shown.len().saturating_sub(MAX_EARLIER_REVIEWS);
    (shown.into_iter().skip(omitted).collect(), omitted)
}

/// The verdict as the agent writes it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ReviewFile {
    /// `APPROVED` or `REQUEST_CHANGES`.
    pub event: ReviewEvent,
    /// The review's text (required for `REQUEST_CHANGES`).
    #[serde(default)]
    pub body: String,
    /// Inline comments.
    #[serde(default)]
    pub comments: Vec<InlineComment>,
}

/// A verdict.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub enum ReviewEvent {
    /// Approve.
    #[serde(rename = "APPROVED")]
    Approved,
    /// Request changes.
    #[serde(rename = "REQUEST_CHANGES")]
    RequestChanges,
}

impl ReviewEvent {
    /// Forgejo's name.
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewEvent::Approved => "APPROVED",
            ReviewEvent::RequestChanges => "REQUEST_CHANGES",
        }
    }
}

/// One inline comment.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct InlineComment {
    /// File path.
    pub path: String,
    /// Line in the new version (0: none).
    #[serde(default)]
    pub line: u64,
    /// Line in the old version, for a removed line.
    #[serde(default)]
    pub old_line: u64,
    /// The comment.
    pub body: String,
}

/// Reads and checks the review file; the error says what is wrong. The file is data:
/// a symlink, FIFO or other special file is refused, like one over
/// [`REVIEW_FILE_MAX`] (`super::outcome::read_agent_file`).
pub fn read_review_file(path: &Path) -> Result<ReviewFile, String> {
    parse_review_file(super::outcome::read_agent_file(path, REVIEW_FILE_MAX))
}

/// [`read_review_file`] off the async threads, with a time limit.
pub async fn read_review_file_off_thread(path: &Path) -> Result<ReviewFile, String> {
    parse_review_file(
        super::outcome::read_agent_file_off_thread(path.to_path_buf(), REVIEW_FILE_MAX).await,
    )
}

/// The review file's bytes (or why there are none) as a checked review.
fn parse_review_file(
    read: Result<Vec<u8>, super::outcome::AgentFileError>,
) -> Result<ReviewFile, String> {
    use super::outcome::AgentFileError;
    let bytes = match read {
        Ok(b) => b,
        Err(AgentFileError::Missing) => {
            return Err("the agent wrote no review file (SHEPHERD_REVIEW_FILE)".into());
        }
        Err(AgentFileError::TooLarge(len, _)) => {
            return Err(format!(
                "the review file has {len} bytes, more than the {REVIEW_FILE_MAX} accepted"
            ));
        }
        Err(AgentFileError::Refused(why)) => {
            return Err(format!("the review file cannot be read: {why}"));
        }
    };
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    let file: ReviewFile = serde_path_to_error::deserialize(de)
        .map_err(|e| format!("the review file is not a valid review: {e}"))?;
    check(&file)?;
    Ok(file)
}

/// The rules Forgejo and Shepherd put on a review.
fn check(file: &ReviewFile) -> Result<(), String> {
    if file.event == ReviewEvent::RequestChanges && file.body.trim().is_empty() {
        return Err("REQUEST_CHANGES needs a body saying what to change".into());
    }
    if file.body.len() > MAX_REVIEW_BODY {
        return Err(format!(
            "the review body has {} bytes, more than {MAX_REVIEW_BODY}",
            file.body.len()
        ));
    }
    if file.comments.len() > MAX_INLINE_COMMENTS {
        return Err(format!(
            "{} inline comments, more than {MAX_INLINE_COMMENTS}",
            file.comments.len()
        ));
    }
    if let Some((i, _)) = file
        .comments
        .iter()
        .enumerate()
        .find(|(_, c)| c.path.trim().is_empty() || c.body.trim().is_empty())
    {
        return Err(format!("inline comment {} needs a path and a body", i + 1));
    }
    Ok(())
}

/// The request body of the verdict for `item` (its head; the marker appended).
pub fn new_review(item: &WorkItem, file: &ReviewFile) -> NewReview {
    let marker = texts::review_marker(item.id.as_str());
    NewReview {
        event: file.event.as_str().to_owned(),
        body: format!("{}\n\n{marker}", file.body.trim_end()),
        commit_id: item
            .head_sha
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        comments: file
            .comments
            .iter()
            .map(|c| NewReviewComment {
                path: c.path.clone(),
                body: c.body.clone(),
                new_position: c.line,
                old_position: c.old_line,
            })
            .collect(),
    }
}

/// Posts the verdict in `path` as the reviewer's review of `item` (unless a review
/// with this item's marker exists already) and returns the result to report.
///
/// The review is pinned (`commit_id`) to the head the agent was given, and posted only
/// while the PR's head is still that head (read just before posting): a verdict for a
/// head the PR has moved past is not posted and is reported `failed` with the
/// signature `review-stale` ([`STALE_SIGNATURE`]) — the core keeps it in the attempt
/// history, and the new head gets its own round.
pub async fn post(reviewer: &ForgejoClient, item: &WorkItem, path: &Path) -> ResultReport {
    let failed = |signature: &str, why: String| ResultReport {
        id: None,
        outcome: WorkOutcome::Failed,
        signature: Some(signature.to_owned()),
        summary: Some(why),
        usage: None,
        stopped: None,
    };
    let file = match read_review_file_off_thread(path).await {
        Ok(f) => f,
        Err(why) => return failed("review-file", why),
    };
    let verdict = match file.event {
        ReviewEvent::Approved => "approved",
        ReviewEvent::RequestChanges => "requested changes",
    };
    let first_line = file.body.lines().next().unwrap_or("").trim().to_owned();
    let summary = format!("Review posted: {verdict}. {first_line}");
    let repo = item.repo.as_str();
    match posted_before(reviewer, item).await {
        Ok(true) => {
            tracing::info!("the review of this work item was posted before; not again");
            return ResultReport {
                id: None,
                outcome: WorkOutcome::Succeeded,
                signature: None,
                summary: Some(summary),
                usage: None,
                stopped: None,
            };
        }
        Ok(false) => {}
        Err(e) => return failed("review-post", format!("reading the reviews failed: {e}")),
    }
    match head_moved(reviewer, item).await {
        Ok(None) => {}
        Ok(Some(now)) => {
            let given = item.head_sha.as_ref().map_or("(none)", |h| h.as_str());
            tracing::warn!(
                given = %given, now = %now,
                "the PR's head moved while the reviewer ran; the verdict is not posted"
            );
            return failed(
                STALE_SIGNATURE,
                format!(
                    "Review not posted: the PR's head moved from {} to {} while the \
                     reviewer ran (its verdict, {verdict}, was for the old head).",
                    short(given),
                    short(&now),
                ),
            );
        }
        Err(e) => return failed("review-post", format!("reading the PR failed: {e}")),
    }
    let body = new_review(item, &file);
    let mut pause = std::time::Duration::from_millis(500);
    for attempt in 1..=POST_TRIES {
        match reviewer.create_review(repo, item.number, &body).await {
            Ok(r) => {
                tracing::info!(review = r.id, event = file.event.as_str(), "review posted");
                return ResultReport {
                    id: None,
                    outcome: WorkOutcome::Succeeded,
                    signature: None,
                    summary: Some(summary),
                    usage: None,
                    stopped: None,
                };
            }
            Err(e) if e.is_retryable() && attempt < POST_TRIES => {
                tracing::info!(error = %e, attempt, "posting the review failed; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
                // A timeout may have posted it after all.
                if matches!(posted_before(reviewer, item).await, Ok(true)) {
                    return ResultReport {
                        id: None,
                        outcome: WorkOutcome::Succeeded,
                        signature: None,
                        summary: Some(summary),
                        usage: None,
                        stopped: None,
                    };
                }
            }
            Err(e) => return failed("review-post", post_error(&e)),
        }
    }
    unreachable!("the last try returns")
}

/// The signature of a verdict not posted because the PR's head moved.
pub const STALE_SIGNATURE: &str = "review-stale";

/// The PR's head now, when it is not the head `item` was dispatched for (`GET
/// /repos/{owner}/{repo}/pulls/{index}`, retried on transient errors).
async fn head_moved(
    reviewer: &ForgejoClient,
    item: &WorkItem,
) -> Result<Option<String>, ForgejoError> {
    let mut pause = std::time::Duration::from_millis(500);
    let mut attempt = 1;
    let pr = loop {
        match reviewer.get_pull(item.repo.as_str(), item.number).await {
            Ok(pr) => break pr,
            Err(e) if e.is_retryable() && attempt < POST_TRIES => {
                tokio::time::sleep(pause).await;
                pause *= 2;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    let now = pr.head.sha;
    let same = item
        .head_sha
        .as_ref()
        .is_some_and(|h| h.as_str().eq_ignore_ascii_case(&now));
    Ok((!same).then_some(now))
}

/// The first 12 characters of a sha (for a summary).
fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

/// Whether a review with `item`'s marker is on the PR.
async fn posted_before(reviewer: &ForgejoClient, item: &WorkItem) -> Result<bool, ForgejoError> {
    let marker = texts::review_marker(item.id.as_str());
    let reviews = reviewer
        .list_reviews(item.repo.as_str(), item.number)
        .await?;
    Ok(reviews.iter().any(|r| r.body.contains(&marker)))
}

/// What a failed post says (Forgejo's 422 for a self-review is named).
fn post_error(e: &ForgejoError) -> String {
    match e.status() {
        Some(422) => format!(
            "Forgejo refused the review (422: a review of one's own PR, or an invalid \
             inline comment): {e}"
        ),
        Some(401 | 403) => format!("the reviewer's token was refused: {e}"),
        _ => format!("posting the review failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("review.json");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn review_files_are_checked_with_clear_errors() {
        let (_d, p) = write(
            r#"{"event":"REQUEST_CHANGES","body":"Fix x.","comments":[{"path":"a.rs","line":3,"body":"here"}]}"#,
        );
        let file = read_review_file(&p).unwrap();
        assert_eq!(file.event, ReviewEvent::RequestChanges);
        assert_eq!(file.comments[0].line, 3);
        let (_d, p) = write(r#"{"event":"APPROVED"}"#);
        assert_eq!(read_review_file(&p).unwrap().body, "");
        for (text, says) in [
            (r#"{"event":"REQUEST_CHANGES"}"#, "needs a body"),
            (r#"{"event":"LGTM"}"#, "event"),
            (r#"{"event":"APPROVED","extra":1}"#, "extra"),
            (
                r#"{"event":"APPROVED","comments":[{"path":"","body":"x"}]}"#,
                "inline comment 1",
            ),
            ("not json", "not a valid review"),
        ] {
            let (_d, p) = write(text);
            let err = read_review_file(&p).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
        let missing = std::path::Path::new("/nonexistent/review.json");
        assert!(
            read_review_file(missing)
                .unwrap_err()
                .contains("no review file")
        );
    }

    #[test]
    fn a_review_file_that_is_a_symlink_or_a_fifo_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("other.json");
        std::fs::write(&target, r#"{"event":"APPROVED"}"#).unwrap();
        let link = dir.path().join("review.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = read_review_file(&link).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        let fifo = dir.path().join("fifo.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success(), "mkfifo");
        let err = read_review_file(&fifo).unwrap_err();
        assert!(err.contains("a FIFO"), "{err}");
    }

    #[test]
    fn the_posted_review_is_for_the_items_head_and_carries_its_marker() {
        let item: WorkItem = serde_json::from_value(serde_json::json!({
            "id": "o:r:pr:4:2", "kind": "review", "repo": "o/r", "number": 4,
            "head_sha": "0123456789abcdef0123456789abcdef01234567", "tier": 0,
            "tier_name": "haiku", "attempt": 1, "priority": 25,
            "claim_expires_at": crate::ops::timefmt::rfc3339(crate::agents::job::now_ms() + 3_600_000),
            "context": {"failing_checks": [], "change_requests": [], "attempts": []}
        }))
        .unwrap();
        let file = ReviewFile {
            event: ReviewEvent::Approved,
            body: "Looks right.\n".into(),
            comments: vec![InlineComment {
                path: "a.rs".into(),
                line: 0,
                old_line: 7,
                body: "gone".into(),
            }],
        };
        let body = new_review(&item, &file);
        assert_eq!(body.commit_id, "0123456789abcdef0123456789abcdef01234567");
        assert_eq!(body.event, "APPROVED");
        assert_eq!(
            body.body,
            "Looks right.\n\n<!-- shepherd-review: o:r:pr:4:2 -->"
        );
        assert_eq!(
            texts::strip_review_marker(&body.body).trim(),
            "Looks right."
        );
        assert_eq!(
            (body.comments[0].new_position, body.comments[0].old_position),
            (0, 7)
        );
    }
}
