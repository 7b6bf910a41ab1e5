//! The client's answers as the core's Forgejo structs (`core::payload`), so REST reads
//! become observations through the same conversions as webhooks
//! (`core::normalize::pr_snapshot`, `ci_contexts`, `issue_snapshot`). Reviews need no
//! conversion: the client reads them as `core::payload::PullReview` directly.

use chrono::{DateTime, FixedOffset};

use super::types::{CombinedStatus, CommitStatus, Issue, Label, PullRequest, User};
use crate::core::payload;

fn time(t: Option<DateTime<FixedOffset>>) -> Option<String> {
    t.map(|t| t.to_rfc3339())
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn user(u: User) -> Option<payload::User> {
    (!u.login.is_empty()).then_some(payload::User {
        id: u.id,
        login: u.login,
    })
}

fn labels(labels: Vec<Label>) -> Option<Vec<payload::Label>> {
    Some(labels.into_iter().map(Into::into).collect())
}

impl From<Label> for payload::Label {
    fn from(l: Label) -> Self {
        Self {
            id: l.id,
            name: l.name,
        }
    }
}

impl From<PullRequest> for payload::PullRequest {
    fn from(p: PullRequest) -> Self {
        Self {
            number: p.number,
            user: user(p.user),
            title: p.title,
            body: Some(p.body),
            labels: labels(p.labels),
            state: p.state,
            draft: p.draft,
            mergeable: p.mergeable,
            merged: p.merged,
            base: payload::BranchInfo {
                ref_: p.base.ref_name,
                sha: p.base.sha,
            },
            head: payload::BranchInfo {
                ref_: p.head.ref_name,
                sha: p.head.sha,
            },
            updated_at: time(p.updated_at),
            comments: p.comments,
        }
    }
}

impl From<Issue> for payload::Issue {
    fn from(i: Issue) -> Self {
        Self {
            number: i.number,
            user: user(i.user),
            title: i.title,
            body: Some(i.body),
            labels: labels(i.labels),
            state: i.state,
            pull_request: i
                .pull_request
                .map(|p| payload::IssuePullStub { merged: p.merged }),
            updated_at: time(i.updated_at),
        }
    }
}

impl From<CommitStatus> for payload::CommitStatus {
    fn from(s: CommitStatus) -> Self {
        Self {
            context: s.context,
            status: s.status,
            description: non_empty(s.description),
            target_url: non_empty(s.target_url),
            updated_at: time(s.updated_at),
        }
    }
}

impl From<CombinedStatus> for payload::CombinedStatus {
    fn from(c: CombinedStatus) -> Self {
        Self {
            state: c.state,
            sha: c.sha,
            total_count: c.total_count,
            statuses: (!c.statuses.is_empty())
                .then(|| c.statuses.into_iter().map(Into::into).collect()),
        }
    }
}
