//! Verified Forgejo deliveries → core events (forgejo-facts.md §2–§3).
//!
//! Three-way result: `Ok(Some(event))` for an event Shepherd acts on, `Ok(None)` for a
//! known-but-ignored one (other event types and actions, tag pushes, deleted
//! comments), `Err` for a payload that does not match Forgejo's schema, naming the
//! JSON path. Also the conversions from REST answers (`payload` structs) into the
//! observation types, so the Forgejo client and resync build events the same way.

use std::collections::BTreeSet;

use serde::de::DeserializeOwned;

use super::command;
use super::effect::rfc3339_ms;
use super::event::{
    CiContext, CiState, Event, IssueAction, IssueSnapshot, PrAction, PrSnapshot, PrState,
    ReviewFact, ReviewHint, ReviewState, RunOutcome,
};
use super::ids::{Login, RepoName, Sha};
use super::payload;

/// A delivery whose JSON does not match what Forgejo sends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{event_type} payload at {path}: {message}")]
pub struct NormalizeError {
    /// The event type routed on.
    pub event_type: String,
    /// JSON path of the problem (`.` for the whole document).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// Normalizes one verified delivery. `event_type` is `X-Forgejo-Event-Type` (or
/// `X-Gitea-Event-Type`); `body` is the JSON payload (for form deliveries, the decoded
/// `payload` field).
pub fn normalize(event_type: &str, body: &[u8]) -> Result<Option<Event>, NormalizeError> {
    let n = Normalizer { event_type };
    match event_type {
        "pull_request" | "pull_request_sync" | "pull_request_label" => {
            n.pull_request(n.parse(body)?)
        }
        "pull_request_review_approved" => n.review(n.parse(body)?, ReviewHint::Approved),
        "pull_request_review_rejected" => n.review(n.parse(body)?, ReviewHint::Rejected),
        "pull_request_review_comment" => n.review(n.parse(body)?, ReviewHint::Comment),
        "pull_request_comment" | "issue_comment" => n.comment(n.parse(body)?),
        "issues" | "issue_label" => n.issue(n.parse(body)?),
        "action_run_success" => n.action_run(n.parse(body)?, RunOutcome::Success),
        "action_run_failure" => n.action_run(n.parse(body)?, RunOutcome::Failure),
        "action_run_recover" => n.action_run(n.parse(body)?, RunOutcome::Recover),
        "status" => n.status(n.parse(body)?),
        "push" => n.push(n.parse(body)?),
        _ => Ok(None),
    }
}

/// Parsing context (the event type, for error messages).
struct Normalizer<'a> {
    /// The routed event type.
    event_type: &'a str,
}

impl Normalizer<'_> {
    /// Deserializes the body, naming the JSON path of a mismatch.
    fn parse<T: DeserializeOwned>(&self, body: &[u8]) -> Result<T, NormalizeError> {
        let de = &mut serde_json::Deserializer::from_slice(body);
        serde_path_to_error::deserialize(de)
            .map_err(|e| self.error(&e.path().to_string(), e.inner()))
    }

    /// An error at `path`.
    fn error(&self, path: &str, message: impl ToString) -> NormalizeError {
        NormalizeError {
            event_type: self.event_type.to_owned(),
            path: path.to_owned(),
            message: message.to_string(),
        }
    }

    /// A repository name at `path`.
    fn repo(&self, path: &str, r: &payload::Repository) -> Result<RepoName, NormalizeError> {
        r.full_name.parse().map_err(|e| self.error(path, e))
    }

    /// A commit id at `path`.
    fn sha(&self, path: &str, s: &str) -> Result<Sha, NormalizeError> {
        s.parse().map_err(|e| self.error(path, e))
    }

    /// `pull_request`, `pull_request_sync`, `pull_request_label`.
    fn pull_request(
        &self,
        p: payload::PullRequestPayload,
    ) -> Result<Option<Event>, NormalizeError> {
        let action = match p.action.as_str() {
            "opened" => PrAction::Opened,
            "closed" => PrAction::Closed,
            "reopened" => PrAction::Reopened,
            "edited" => PrAction::Edited,
            "synchronized" => PrAction::Synchronized,
            "label_updated" | "label_cleared" => PrAction::Labeled,
            _ => return Ok(None),
        };
        let repo = self.repo("repository.full_name", &p.repository)?;
        let mut pr = pr_snapshot(&repo, &p.pull_request);
        if action == PrAction::Synchronized {
            // The conflict check runs after this payload is built: `mergeable` is noise.
            pr.mergeable = None;
        }
        Ok(Some(Event::PullRequest {
            action,
            base_changed_from: p.changes.and_then(|c| c.ref_).map(|r| r.from),
            pr,
            sender: login(p.sender.as_ref()),
        }))
    }

    /// `pull_request_review_*`: a hint to re-read the reviews.
    fn review(
        &self,
        p: payload::PullRequestPayload,
        hint: ReviewHint,
    ) -> Result<Option<Event>, NormalizeError> {
        let repo = self.repo("repository.full_name", &p.repository)?;
        Ok(Some(Event::Review {
            hint,
            pr: pr_snapshot(&repo, &p.pull_request),
            sender: login(p.sender.as_ref()),
        }))
    }

    /// `issue_comment` / `pull_request_comment`.
    fn comment(&self, p: payload::IssueCommentPayload) -> Result<Option<Event>, NormalizeError> {
        match p.action.as_str() {
            "created" | "edited" => {}
            _ => return Ok(None),
        }
        let repo = self.repo("repository.full_name", &p.repository)?;
        Ok(Some(Event::Comment {
            repo,
            number: p.issue.number,
            is_pull: p.is_pull || p.issue.pull_request.is_some(),
            comment_id: p.comment.id,
            commands: command::parse(&p.comment.body),
            at_ms: time_ms(p.comment.created_at.as_deref()),
            sender: login(p.sender.as_ref()).or_else(|| login(p.comment.user.as_ref())),
        }))
    }

    /// `issues` / `issue_label` on a plain issue (PRs send `pull_request*` events).
    fn issue(&self, p: payload::IssuePayload) -> Result<Option<Event>, NormalizeError> {
        if p.issue.pull_request.is_some() {
            return Ok(None);
        }
        let action = match p.action.as_str() {
            "opened" => IssueAction::Opened,
            "closed" => IssueAction::Closed,
            "reopened" => IssueAction::Reopened,
            "edited" => IssueAction::Edited,
            "label_updated" | "label_cleared" => IssueAction::Labeled,
            _ => IssueAction::Other,
        };
        let repo = self.repo("repository.full_name", &p.repository)?;
        Ok(Some(Event::Issue {
            action,
            issue: issue_snapshot(&repo, &p.issue),
            sender: login(p.sender.as_ref()),
        }))
    }

    /// `action_run_*`: the PR number is inside the JSON text `run.event_payload`.
    fn action_run(
        &self,
        p: payload::ActionPayload,
        outcome: RunOutcome,
    ) -> Result<Option<Event>, NormalizeError> {
        let repo = self.repo("run.repository.full_name", &p.run.repository)?;
        let sha = self.sha("run.commit_sha", &p.run.commit_sha)?;
        let pr_number = match p.run.event.starts_with("pull_request") {
            true => pr_number_in(&p.run.event_payload),
            false => None,
        };
        Ok(Some(Event::ActionRun {
            repo,
            sha,
            pr_number,
            outcome,
            sender: login(p.run.trigger_user.as_ref()),
        }))
    }

    /// Gitea's `status`.
    fn status(&self, p: payload::CommitStatusPayload) -> Result<Option<Event>, NormalizeError> {
        let repo = self.repo("repository.full_name", &p.repository)?;
        let sha = self.sha("sha", &p.sha)?;
        let context = CiContext {
            context: p.context,
            state: CiState::parse(&p.state),
            description: p.description.unwrap_or_default(),
            target_url: p.target_url.unwrap_or_default(),
            updated_ms: time_ms(p.updated_at.as_deref()),
        };
        Ok(Some(Event::Status {
            repo,
            sha,
            context,
            sender: login(p.sender.as_ref()),
        }))
    }

    /// `push` to a branch (tags and branch deletions are ignored).
    fn push(&self, p: payload::PushPayload) -> Result<Option<Event>, NormalizeError> {
        let Some(branch) = p.ref_.strip_prefix("refs/heads/") else {
            return Ok(None);
        };
        if p.after.is_empty() || p.after.chars().all(|c| c == '0') {
            return Ok(None);
        }
        let repo = self.repo("repository.full_name", &p.repository)?;
        Ok(Some(Event::Push {
            repo,
            branch: branch.to_owned(),
            after: Some(self.sha("after", &p.after)?),
            sender: login(p.sender.as_ref()),
        }))
    }
}

/// The PR number in an Actions run's triggering payload (`number` or
/// `pull_request.number`).
fn pr_number_in(event_payload: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(event_payload).ok()?;
    v.get("pull_request")
        .and_then(|p| p.get("number"))
        .or_else(|| v.get("number"))
        .and_then(serde_json::Value::as_u64)
}

/// A user's login, if present and valid.
fn login(u: Option<&payload::User>) -> Option<Login> {
    u.and_then(|u| u.login.parse().ok())
}

/// RFC 3339 → unix ms (0 when absent or unparsable).
fn time_ms(t: Option<&str>) -> i64 {
    t.and_then(rfc3339_ms::from_text).unwrap_or(0)
}

/// Label names of a label list.
fn label_names(labels: Option<&Vec<payload::Label>>) -> BTreeSet<String> {
    labels
        .map(|ls| ls.iter().map(|l| l.name.clone()).collect())
        .unwrap_or_default()
}

/// Longest PR or issue description kept in a snapshot (bytes); longer ones are cut on
/// a char boundary and marked. The snapshot is stored in the record and decoded,
/// stepped and encoded again with every later event, so a 5 MiB description would
/// cost that on every event; what the core reads from it (linked issues, the bot
/// marker) belongs near the top.
pub const MAX_BODY_KEPT: usize = 64 * 1024;

/// A description as kept in a snapshot (see [`MAX_BODY_KEPT`]).
fn kept_body(body: Option<&str>) -> String {
    super::record::bounded_text(body.unwrap_or_default(), MAX_BODY_KEPT)
}

/// Forgejo's default `WORK_IN_PROGRESS_PREFIXES`.
const WIP_PREFIXES: [&str; 2] = ["WIP:", "[WIP]"];

/// A PR snapshot from a webhook's `pull_request` or `GET …/pulls/{n}`.
pub fn pr_snapshot(repo: &RepoName, pr: &payload::PullRequest) -> PrSnapshot {
    let title_wip = WIP_PREFIXES
        .iter()
        .any(|p| pr.title.trim_start().to_uppercase().starts_with(p));
    let state = match (pr.merged, pr.state.as_str()) {
        (true, _) => PrState::Merged,
        (false, "closed") => PrState::Closed,
        (false, _) => PrState::Open,
    };
    PrSnapshot {
        repo: repo.clone(),
        number: pr.number,
        state,
        draft: pr.draft || title_wip,
        title: pr.title.clone(),
        body: kept_body(pr.body.as_deref()),
        author: login(pr.user.as_ref()),
        head_sha: pr.head.sha.parse().ok(),
        head_ref: pr.head.ref_.clone(),
        base_ref: pr.base.ref_.clone(),
        labels: label_names(pr.labels.as_ref()),
        mergeable: Some(pr.mergeable),
        updated_ms: time_ms(pr.updated_at.as_deref()),
        comments: pr.comments,
    }
}

/// An issue snapshot from a webhook's `issue` or `GET …/issues/{n}`.
pub fn issue_snapshot(repo: &RepoName, issue: &payload::Issue) -> IssueSnapshot {
    IssueSnapshot {
        repo: repo.clone(),
        number: issue.number,
        open: issue.state != "closed",
        title: issue.title.clone(),
        body: kept_body(issue.body.as_deref()),
        author: login(issue.user.as_ref()),
        labels: label_names(issue.labels.as_ref()),
        updated_ms: time_ms(issue.updated_at.as_deref()),
    }
}

/// Longest review body kept in a review fact (bytes), cut and marked like a
/// description: every reviewer's latest review is kept in the record (unofficial ones
/// too, as facts), and any account can review with a megabyte-sized body.
pub const MAX_REVIEW_BODY_KEPT: usize = 16 * 1024;

/// A review from `GET …/pulls/{n}/reviews` (`None` without a reviewer).
pub fn review(r: &payload::PullReview) -> Option<ReviewFact> {
    Some(ReviewFact {
        id: r.id,
        reviewer: login(r.user.as_ref())?,
        state: ReviewState::parse(&r.state),
        body: super::record::bounded_text(&r.body, MAX_REVIEW_BODY_KEPT),
        commit_id: r.commit_id.to_lowercase(),
        stale: r.stale,
        official: r.official,
        dismissed: r.dismissed,
        submitted_ms: time_ms(r.submitted_at.as_deref()),
    })
}

/// The contexts of `GET …/commits/{sha}/status` (empty when there are none).
pub fn ci_contexts(c: &payload::CombinedStatus) -> Vec<CiContext> {
    c.statuses
        .iter()
        .flatten()
        .map(|s| CiContext {
            context: s.context.clone(),
            state: CiState::parse(&s.status),
            description: s.description.clone().unwrap_or_default(),
            target_url: s.target_url.clone().unwrap_or_default(),
            updated_ms: time_ms(s.updated_at.as_deref()),
        })
        .collect()
}

#[cfg(test)]
#[path = "normalize_tests.rs"]
mod tests;
