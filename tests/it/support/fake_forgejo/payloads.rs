//! Webhook payloads for changes of the fake's model, in Forgejo's shapes
//! (forgejo-facts.md §2–§3), with the `X-Forgejo-Event` / `X-Forgejo-Event-Type`
//! values Forgejo would send. Scenario tests sign them and post them to the ingest.

use serde_json::{Value, json};

use super::FakeForgejo;
use super::model::{Model, RepoRow};
use super::render;

/// One webhook delivery's content.
#[derive(Debug, Clone, PartialEq)]
pub struct Webhook {
    /// `X-Forgejo-Event` (coarse).
    pub event: &'static str,
    /// `X-Forgejo-Event-Type` (fine-grained; route on this).
    pub event_type: &'static str,
    /// The JSON payload.
    pub payload: Value,
}

impl Webhook {
    /// The body as Forgejo sends it: two-space indented JSON, no trailing newline.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(&self.payload).expect("a Value serializes")
    }
}

fn repo_of<'a>(model: &'a Model, repo: &str) -> &'a RepoRow {
    model
        .repos
        .get(repo)
        .unwrap_or_else(|| panic!("no repository {repo}"))
}

/// `pull_request_review_approved|rejected|comment` / `reviewed` for review `id`, sent
/// by its reviewer (forgejo-facts.md §3: `review.type` is the event type, `review.content`
/// the body, no review id or commit).
pub fn review(model: &Model, repo: &str, n: u64, review_id: i64) -> Webhook {
    let review = model.repos[repo]
        .reviews
        .iter()
        .find(|v| v.id == review_id)
        .cloned()
        .expect("no such review");
    let event_type = match review.state.as_str() {
        "APPROVED" => "pull_request_review_approved",
        "REQUEST_CHANGES" => "pull_request_review_rejected",
        _ => "pull_request_review_comment",
    };
    let mut w = pull_request(model, repo, n, event_type, "reviewed", &review.user);
    w.payload["requested_reviewer"] = w.payload["sender"].clone();
    w.payload["review"] = serde_json::json!({"type": event_type, "content": review.body});
    w
}

/// A `PullRequestPayload` for PR `n` with `action`, sent by `sender`.
pub fn pull_request(
    model: &Model,
    repo: &str,
    n: u64,
    event_type: &'static str,
    action: &str,
    sender: &str,
) -> Webhook {
    let r = repo_of(model, repo);
    let issue = r
        .issues
        .get(&n)
        .unwrap_or_else(|| panic!("no PR {repo}#{n}"));
    let event = match event_type {
        "pull_request_review_approved" => "pull_request_approved",
        "pull_request_review_rejected" => "pull_request_rejected",
        "pull_request_review_comment" => "pull_request_comment",
        _ => "pull_request",
    };
    Webhook {
        event,
        event_type,
        payload: json!({
            "action": action,
            "number": n,
            "pull_request": render::pull(model, r, issue),
            "requested_reviewer": null,
            "repository": render::repo(model, r),
            "sender": render::user(model, sender),
            "commit_id": "",
            "review": null,
        }),
    }
}

/// An `IssuePayload` for issue `n`.
pub fn issue(
    model: &Model,
    repo: &str,
    n: u64,
    event_type: &'static str,
    action: &str,
    sender: &str,
) -> Webhook {
    let r = repo_of(model, repo);
    let i = r
        .issues
        .get(&n)
        .unwrap_or_else(|| panic!("no issue {repo}#{n}"));
    Webhook {
        event: "issues",
        event_type,
        payload: json!({
            "action": action,
            "number": n,
            "issue": render::issue(model, r, i),
            "repository": render::repo(model, r),
            "sender": render::user(model, sender),
            "commit_id": "",
        }),
    }
}

/// An `IssueCommentPayload` for comment `comment_id` (on an issue or a PR).
pub fn comment(model: &Model, repo: &str, comment_id: i64, action: &str) -> Webhook {
    let r = repo_of(model, repo);
    let c = r
        .comments
        .iter()
        .find(|c| c.id == comment_id)
        .unwrap_or_else(|| panic!("no comment {comment_id}"));
    let i = &r.issues[&c.number];
    let is_pull = i.pull.is_some();
    let mut payload = json!({
        "action": action,
        "issue": render::issue(model, r, i),
        "comment": render::comment(model, r, c),
        "repository": render::repo(model, r),
        "sender": render::user(model, &c.user),
        "is_pull": is_pull,
    });
    if is_pull {
        payload["pull_request"] = render::pull(model, r, i);
    }
    Webhook {
        event: "issue_comment",
        event_type: if is_pull {
            "pull_request_comment"
        } else {
            "issue_comment"
        },
        payload,
    }
}

/// An `ActionPayload` for a finished Forgejo Actions run on `sha` (`action` is
/// `success`, `failure` or `recover`), triggered by PR `pr` when given. A `recover`
/// carries the previous, failed run of the workflow as `last_run`.
pub fn action_run(
    model: &Model,
    repo: &str,
    sha: &str,
    action: &str,
    pr: Option<u64>,
    run_id: i64,
) -> Webhook {
    let (event_type, status) = match action {
        "success" => ("action_run_success", "success"),
        "recover" => ("action_run_recover", "success"),
        _ => ("action_run_failure", "failure"),
    };
    let mut payload = json!({
        "action": action,
        "run": run(model, repo, sha, pr, run_id, status),
        "prior_status": "running",
    });
    if action == "recover" {
        payload["last_run"] = run(model, repo, sha, pr, run_id - 1, "failure");
    }
    Webhook {
        event: event_type,
        event_type,
        payload,
    }
}

/// One `ActionRun` object.
fn run(model: &Model, repo: &str, sha: &str, pr: Option<u64>, id: i64, status: &str) -> Value {
    let r = repo_of(model, repo);
    let trigger = pr
        .and_then(|n| r.issues.get(&n))
        .map_or_else(|| r.owner.clone(), |i| i.user.clone());
    let event_payload = pr.map_or_else(
        || json!({"ref": format!("refs/heads/{}", r.default_branch), "after": sha}),
        |n| json!({"action": "synchronized", "number": n, "pull_request": {"number": n, "head": {"sha": sha}}}),
    );
    let event = if pr.is_some() { "pull_request" } else { "push" };
    let now = super::model::now();
    json!({
        "id": id,
        "title": format!("CI for {sha}"),
        "repository": render::repo(model, r),
        "workflow_id": "ci.yml",
        "index_in_repo": id,
        "trigger_user": render::user(model, &trigger),
        "ScheduleID": 0,
        "prettyref": pr.map_or_else(|| r.default_branch.clone(), |n| format!("#{n}")),
        "is_ref_deleted": false,
        "commit_sha": sha,
        "is_fork_pull_request": false,
        "need_approval": false,
        "approved_by": 0,
        "event": event,
        "event_payload": event_payload.to_string(),
        "trigger_event": event,
        "status": status,
        "started": now,
        "stopped": now,
        "created": now,
        "updated": now,
        "duration": 61_000_000_000_i64,
        "html_url": format!("{}/{}/actions/runs/{id}", render::HTML_BASE, r.full_name()),
    })
}

/// A `PushPayload` for a branch update.
pub fn push(
    model: &Model,
    repo: &str,
    branch: &str,
    before: &str,
    after: &str,
    sender: &str,
) -> Webhook {
    let r = repo_of(model, repo);
    Webhook {
        event: "push",
        event_type: "push",
        payload: json!({
            "ref": format!("refs/heads/{branch}"),
            "before": before,
            "after": after,
            "compare_url": format!("{}/{}/compare/{before}...{after}", render::HTML_BASE, r.full_name()),
            "commits": [],
            "total_commits": 0,
            "head_commit": null,
            "repository": render::repo(model, r),
            "pusher": render::user(model, sender),
            "sender": render::user(model, sender),
        }),
    }
}

/// Builders of the webhook for a change the test just made to the model.
impl FakeForgejo {
    /// `pull_request` / `opened`, sent by the author.
    pub fn pr_opened(&self, repo: &str, n: u64) -> Webhook {
        let author = self.issue(repo, n).user;
        self.with_model(|m| pull_request(m, repo, n, "pull_request", "opened", &author))
    }

    /// `pull_request_sync` / `synchronized`; `mergeable` is false as Forgejo sends it
    /// (the conflict check is still running).
    pub fn pr_synchronized(&self, repo: &str, n: u64, sender: &str) -> Webhook {
        let mut w = self
            .with_model(|m| pull_request(m, repo, n, "pull_request_sync", "synchronized", sender));
        w.payload["pull_request"]["mergeable"] = false.into();
        w
    }

    /// `pull_request` / `closed` (merged or not, as the model says).
    pub fn pr_closed(&self, repo: &str, n: u64, sender: &str) -> Webhook {
        self.with_model(|m| pull_request(m, repo, n, "pull_request", "closed", sender))
    }

    /// `pull_request` / `reopened`.
    pub fn pr_reopened(&self, repo: &str, n: u64, sender: &str) -> Webhook {
        self.with_model(|m| pull_request(m, repo, n, "pull_request", "reopened", sender))
    }

    /// `pull_request` / `edited` with `changes.title.from`.
    pub fn pr_edited(&self, repo: &str, n: u64, sender: &str, old_title: &str) -> Webhook {
        let mut w = self.with_model(|m| pull_request(m, repo, n, "pull_request", "edited", sender));
        w.payload["changes"] = serde_json::json!({"title": {"from": old_title}});
        w
    }

    /// `pull_request_label` / `label_updated` (or `label_cleared` when none are left),
    /// with the full label list in `pull_request.labels`.
    pub fn pr_label_updated(&self, repo: &str, n: u64, sender: &str) -> Webhook {
        let action = if self.labels_on(repo, n).is_empty() {
            "label_cleared"
        } else {
            "label_updated"
        };
        self.with_model(|m| pull_request(m, repo, n, "pull_request_label", action, sender))
    }

    /// `pull_request_review_approved|rejected|comment` / `reviewed` for review `id`.
    pub fn pr_reviewed(&self, repo: &str, n: u64, review_id: i64) -> Webhook {
        self.with_model(|m| review(m, repo, n, review_id))
    }

    /// `issue_comment` or `pull_request_comment` / `created` for comment `id`.
    pub fn comment_created(&self, repo: &str, comment_id: i64) -> Webhook {
        self.with_model(|m| comment(m, repo, comment_id, "created"))
    }

    /// `issues` / `opened`, sent by the author.
    pub fn issue_opened(&self, repo: &str, n: u64) -> Webhook {
        let author = self.issue(repo, n).user;
        self.with_model(|m| issue(m, repo, n, "issues", "opened", &author))
    }

    /// `issues` / `closed`.
    pub fn issue_closed(&self, repo: &str, n: u64, sender: &str) -> Webhook {
        self.with_model(|m| issue(m, repo, n, "issues", "closed", sender))
    }

    /// `issue_label` / `label_updated` (or `label_cleared`) with the full label list.
    pub fn issue_label_updated(&self, repo: &str, n: u64, sender: &str) -> Webhook {
        let action = if self.labels_on(repo, n).is_empty() {
            "label_cleared"
        } else {
            "label_updated"
        };
        self.with_model(|m| issue(m, repo, n, "issue_label", action, sender))
    }

    /// `action_run_success` / `_failure` / `_recover` for a run on `sha` (`action` is
    /// `success`, `failure` or `recover`), triggered by PR `pr` when given.
    pub fn action_run(&self, repo: &str, sha: &str, action: &str, pr: Option<u64>) -> Webhook {
        self.with_model(|m| {
            let run_id = m.id();
            action_run(m, repo, sha, action, pr, run_id)
        })
    }

    /// `push` of `branch` from `before` to `after`.
    pub fn push_event(
        &self,
        repo: &str,
        branch: &str,
        before: &str,
        after: &str,
        sender: &str,
    ) -> Webhook {
        self.with_model(|m| push(m, repo, branch, before, after, sender))
    }
}
