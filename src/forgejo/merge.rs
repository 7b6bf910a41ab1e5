//! Merging: `POST …/pulls/{n}/merge` turned into a [`MergeOutcome`] that tells every
//! way it can end apart (forgejo-facts.md §4.3), and `GET …/pulls/{n}/merge`.

use reqwest::Method;
use tracing::instrument;

use super::client::repo_path;
use super::types::{MergeConflictKind, MergeOutcome, MergeRefusal, MergeRequest};
use super::{ForgejoClient, ForgejoError};

impl ForgejoClient {
    /// Merges a PR, pinned to `request.head_commit_id`. Never sends `force_merge`.
    ///
    /// `Err` means the merge certainly did not happen (circuit open, connection
    /// refused, 401, 422, 429, …); timeouts, 5xx and transport failures after sending
    /// come back as [`MergeOutcome::Ambiguous`] because the merge may have gone through.
    #[instrument(skip_all, fields(repo = %repo, pr = number, head = %request.head_commit_id))]
    pub async fn merge(
        &self,
        repo: &str,
        number: u64,
        request: &MergeRequest,
    ) -> Result<MergeOutcome, ForgejoError> {
        let path = format!("{}/pulls/{number}/merge", repo_path(repo)?);
        let body = serde_json::to_value(request)
            .map_err(|e| ForgejoError::Invalid(format!("merge body: {e}")))?;
        match self.send(Method::POST, &path, &[], Some(&body)).await {
            Ok(answer) if answer.status == 200 => Ok(MergeOutcome::Merged),
            // 201 would be a scheduled auto-merge, which Shepherd never asks for.
            Ok(answer) => Ok(MergeOutcome::Ambiguous {
                error: ForgejoError::Status {
                    code: answer.status,
                    method: "POST".into(),
                    path,
                    message: "unexpected success status".into(),
                    retry_after: None,
                },
            }),
            Err(e) => classify(e),
        }
    }

    /// `GET …/pulls/{n}/merge`: 204 merged, 404 not merged.
    #[instrument(skip_all, fields(repo = %repo, pr = number))]
    pub async fn is_merged(&self, repo: &str, number: u64) -> Result<bool, ForgejoError> {
        let path = format!("{}/pulls/{number}/merge", repo_path(repo)?);
        match self.send(Method::GET, &path, &[], None).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Sorts a failed merge request into an outcome or a certain non-merge.
fn classify(e: ForgejoError) -> Result<MergeOutcome, ForgejoError> {
    let ForgejoError::Status { code, message, .. } = &e else {
        return match e {
            ForgejoError::Timeout { .. } | ForgejoError::Transport { .. } => {
                Ok(MergeOutcome::Ambiguous { error: e })
            }
            other => Err(other),
        };
    };
    let message = message.clone();
    match code {
        // Merged-but-branch-kept or refused: the caller re-reads the PR (§4.3).
        403 => Ok(MergeOutcome::Forbidden { message }),
        404 => Ok(MergeOutcome::NotFound { message }),
        405 => Ok(MergeOutcome::NotAllowed {
            refusal: refusal(&message),
            message,
        }),
        409 => Ok(MergeOutcome::Conflict {
            kind: conflict_kind(&message),
            message,
        }),
        500..=599 => Ok(MergeOutcome::Ambiguous { error: e }),
        _ => Err(e),
    }
}

/// Classifies a 405 message.
pub(super) fn refusal(message: &str) -> MergeRefusal {
    let lower = message.to_ascii_lowercase();
    if let Some(rest) = message.split_once("[reason:").map(|(_, r)| r) {
        return MergeRefusal::Protection(rest.trim().trim_end_matches(']').trim().to_owned());
    }
    if lower.trim().is_empty() || lower.contains("already merged") {
        MergeRefusal::AlreadyMerged
    } else if lower.contains("try again later") || lower.contains("mergeable state") {
        MergeRefusal::NotMergeable
    } else if lower.contains("work in progress") {
        MergeRefusal::WorkInProgress
    } else if lower.contains("not allowed to merge") {
        MergeRefusal::UserNotAllowed
    } else if lower.contains("merge style") {
        MergeRefusal::StyleNotAllowed
    } else {
        MergeRefusal::Other
    }
}

/// Classifies a 409 message (or raw `ErrMergeConflicts` body).
pub(super) fn conflict_kind(message: &str) -> MergeConflictKind {
    let lower = message.to_ascii_lowercase();
    if lower.contains("head out of date") {
        MergeConflictKind::HeadOutOfDate
    } else if lower.contains("\"style\"") || lower.contains("conflict") {
        MergeConflictKind::Conflict
    } else if lower.contains("merged") {
        MergeConflictKind::AlreadyMerged
    } else {
        MergeConflictKind::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals() {
        assert_eq!(
            refusal("not allowed to merge [reason: Does not have enough approvals]"),
            MergeRefusal::Protection("Does not have enough approvals".into())
        );
        assert_eq!(
            refusal("Please try again later"),
            MergeRefusal::NotMergeable
        );
        assert_eq!(
            refusal("User not allowed to merge PR"),
            MergeRefusal::UserNotAllowed
        );
        assert_eq!(
            refusal("Work in progress PRs cannot be merged"),
            MergeRefusal::WorkInProgress
        );
        assert_eq!(refusal(""), MergeRefusal::AlreadyMerged);
        assert_eq!(refusal("signed commits required"), MergeRefusal::Other);
    }

    #[test]
    fn conflicts() {
        assert_eq!(
            conflict_kind("head out of date"),
            MergeConflictKind::HeadOutOfDate
        );
        assert_eq!(
            conflict_kind(
                r#"{"Style":"squash","StdOut":"","StdErr":"CONFLICT (content)","Err":{}}"#
            ),
            MergeConflictKind::Conflict
        );
        assert_eq!(
            conflict_kind("pull request has already been merged"),
            MergeConflictKind::AlreadyMerged
        );
        assert_eq!(
            conflict_kind("merge push out of date"),
            MergeConflictKind::Other
        );
    }
}
