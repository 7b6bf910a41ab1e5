//! An issue's or PR's timeline (`GET /repos/{o}/{r}/issues/{index}/timeline`, in the
//! v15 API definition as `issueGetCommentsAndTimeline`, paginated): every comment and
//! event. Shepherd reads it for the label events of a claim label it did not set
//! (`core::legacy`). In Forgejo (`models/issues/issue_label.go`, `newIssueLabel` and
//! `deleteIssueLabel`) adding a label writes a comment of type `label` whose content is
//! `"1"`, removing one writes the same type with empty content; the API
//! (`services/convert/issue_comment.go`, `ToTimelineComment`) gives the content as
//! `body`, the label as `label`, the doer as `user` and the time as `created_at`.

use chrono::{DateTime, FixedOffset};
use serde::{Deserialize, Serialize};
use tracing::instrument;

use super::client::repo_path;
use super::types::{Label, User, null_default};
use super::{ForgejoClient, ForgejoError};

/// One timeline entry (Forgejo's `TimelineComment`, the fields Shepherd reads).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TimelineComment {
    /// Entry id.
    pub id: i64,
    /// Kind: `comment`, `label`, `pull_push`, … (`CommentType.String()`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Who did it.
    #[serde(deserialize_with = "null_default")]
    pub user: User,
    /// Content: for `label`, `"1"` when added, `""` when removed.
    #[serde(deserialize_with = "null_default")]
    pub body: String,
    /// The label of a `label` entry.
    pub label: Option<Label>,
    /// When.
    pub created_at: Option<DateTime<FixedOffset>>,
}

impl TimelineComment {
    /// `Some(true)` when this entry added `label`, `Some(false)` when it removed it.
    pub fn label_change(&self, label: &str) -> Option<bool> {
        let named = self.label.as_ref().is_some_and(|l| l.name == label);
        (self.kind == "label" && named).then(|| self.body == "1")
    }
}

impl ForgejoClient {
    /// Every timeline entry of issue or PR `index`, oldest first (all pages).
    #[instrument(skip_all, fields(repo = %repo, number = index))]
    pub async fn timeline(
        &self,
        repo: &str,
        index: u64,
    ) -> Result<Vec<TimelineComment>, ForgejoError> {
        let path = format!("{}/issues/{index}/timeline", repo_path(repo)?);
        self.get_all(&path, &[]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_entries_read_as_added_or_removed() {
        let added: TimelineComment = serde_json::from_value(serde_json::json!({
            "id": 3, "type": "label", "body": "1", "user": {"id": 1, "login": "old-bot"},
            "label": {"id": 9, "name": "auto/claimed-implementer", "color": "c5def5"},
            "created_at": "2001-01-02T03:04:05Z"
        }))
        .unwrap();
        assert_eq!(added.label_change("auto/claimed-implementer"), Some(true));
        assert_eq!(added.label_change("other"), None);
        let removed = TimelineComment {
            body: String::new(),
            ..added.clone()
        };
        assert_eq!(
            removed.label_change("auto/claimed-implementer"),
            Some(false)
        );
        let comment = TimelineComment {
            kind: "comment".into(),
            ..added
        };
        assert_eq!(comment.label_change("auto/claimed-implementer"), None);
    }
}
