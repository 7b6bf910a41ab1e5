//! The issue timeline (`GET /repos/{o}/{r}/issues/{index}/timeline`, v15 API definition
//! `issueGetCommentsAndTimeline`, paginated, items `TimelineComment`) with the label
//! events Forgejo writes: `models/issues/issue_label.go` `newIssueLabel` creates a
//! comment of type `label` (`CommentTypeLabel.String()`) with content `"1"` when a label
//! is added, `deleteIssueLabel` one with empty content when it is removed; the doer is
//! the comment's poster. `services/convert/issue_comment.go` (`ToTimelineComment`)
//! renders the content as `body`, the poster as `user`, the label as `label`. Plain
//! comments appear as type `comment`.

use serde_json::{Value, json};

use super::model::{Model, now};
use super::render;
use super::routes::{Reply, paginate};

/// A label added to or removed from an issue or PR (a `label` timeline comment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelEventRow {
    /// Timeline comment id (shares the id sequence with comments).
    pub id: i64,
    /// Issue/PR number.
    pub number: u64,
    /// The label.
    pub label_id: i64,
    /// Added (`true`) or removed.
    pub added: bool,
    /// Who did it.
    pub user: String,
    /// When.
    pub created_at: String,
}

impl Model {
    /// Records that `user` added (or removed) label `label_id` on `number` now.
    pub fn label_event(&mut self, repo: &str, number: u64, label_id: i64, added: bool, user: &str) {
        let id = self.id();
        self.user_id(user);
        self.repo_mut(repo).label_events.push(LabelEventRow {
            id,
            number,
            label_id,
            added,
            user: user.into(),
            created_at: now(),
        });
    }
}

/// `GET …/issues/{n}/timeline`: comments and label events, oldest first, paginated.
pub fn timeline(model: &Model, repo: &str, n: u64, query: &[(String, String)]) -> Reply {
    let r = &model.repos[repo];
    let Some(issue) = r.issues.get(&n) else {
        return Reply::not_found();
    };
    let full = r.full_name();
    let kind = if issue.pull.is_some() {
        "pulls"
    } else {
        "issues"
    };
    let parent = format!("{}/{full}/{kind}/{n}", render::HTML_BASE);
    let (issue_url, pr_url) = match issue.pull.is_some() {
        true => (String::new(), parent.clone()),
        false => (parent.clone(), String::new()),
    };
    let mut items: Vec<(i64, Value)> = r
        .comments
        .iter()
        .filter(|c| c.number == n)
        .map(|c| {
            let v = json!({
                "id": c.id,
                "type": "comment",
                "body": c.body,
                "user": render::user(model, &c.user),
                "html_url": format!("{parent}#issuecomment-{}", c.id),
                "issue_url": issue_url,
                "pull_request_url": pr_url,
                "created_at": c.created_at,
                "updated_at": c.updated_at,
            });
            (c.id, v)
        })
        .collect();
    for e in r.label_events.iter().filter(|e| e.number == n) {
        let label = r
            .labels
            .iter()
            .find(|l| l.id == e.label_id)
            .map(|l| render::label(r, l));
        let v = json!({
            "id": e.id,
            "type": "label",
            "body": if e.added { "1" } else { "" },
            "user": render::user(model, &e.user),
            "label": label,
            "html_url": format!("{parent}#issuecomment-{}", e.id),
            "issue_url": issue_url,
            "pull_request_url": pr_url,
            "created_at": e.created_at,
            "updated_at": e.created_at,
        });
        items.push((e.id, v));
    }
    items.sort_by_key(|(id, _)| *id);
    paginate(items.into_iter().map(|(_, v)| v).collect(), query)
}
