//! The webhooks Forgejo itself would deliver after the bot's own writes: label changes
//! (`pull_request_label` / `issue_label`), new comments, merges (`pull_request` closed,
//! and `issues` closed for each issue the merge closed), all with the bot as `sender`;
//! and after a formal review posted through the API by any user (a reviewer agent),
//! `pull_request_review_*` with that user as `sender`.
//! They collect in an outbox the test can drain and send, so scenarios can check that
//! Shepherd ignores the echoes of its own actions.

use serde_json::Value;

use super::model::Model;
use super::payloads::{self, Webhook};
use super::routes::Reply;

/// The deliveries a successful write (`reply` before any injected override) causes.
pub fn emitted(
    model: &Model,
    bot: &str,
    method: &str,
    segs: &[&str],
    reply: &Reply,
) -> Vec<Webhook> {
    let ["repos", owner, name, rest @ ..] = segs else {
        return Vec::new();
    };
    let repo = format!("{owner}/{name}");
    let num = |s: &str| s.parse::<u64>().ok();
    match (method, rest) {
        ("POST" | "PUT" | "DELETE", ["issues", n, "labels", ..]) => num(n)
            .map(|n| label_event(model, &repo, n, bot))
            .into_iter()
            .collect(),
        ("POST", ["issues", _, "comments"]) => reply
            .body
            .as_ref()
            .and_then(|b| b.get("id"))
            .and_then(Value::as_i64)
            .map(|id| payloads::comment(model, &repo, id, "created"))
            .into_iter()
            .collect(),
        ("POST", ["pulls"]) if reply.status == 201 => reply
            .body
            .as_ref()
            .and_then(|b| b.get("number"))
            .and_then(Value::as_u64)
            .map(|n| payloads::pull_request(model, &repo, n, "pull_request", "opened", bot))
            .into_iter()
            .collect(),
        ("POST", ["pulls", n, "update"]) if reply.status == 200 => num(n)
            .map(|n| {
                let mut w = payloads::pull_request(
                    model,
                    &repo,
                    n,
                    "pull_request_sync",
                    "synchronized",
                    bot,
                );
                // As Forgejo sends it: the conflict check is still running.
                w.payload["pull_request"]["mergeable"] = false.into();
                w
            })
            .into_iter()
            .collect(),
        ("POST", ["pulls", n, "reviews"]) if reply.status == 200 => {
            let id = reply
                .body
                .as_ref()
                .and_then(|b| b.get("id"))
                .and_then(Value::as_i64);
            match (num(n), id) {
                (Some(n), Some(id)) => vec![payloads::review(model, &repo, n, id)],
                _ => Vec::new(),
            }
        }
        ("POST", ["pulls", n, "merge"]) if matches!(reply.status, 200 | 403) => num(n)
            .map(|n| merge_events(model, &repo, n, bot))
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn label_event(model: &Model, repo: &str, n: u64, bot: &str) -> Webhook {
    let issue = &model.repos[repo].issues[&n];
    let action = if issue.labels.is_empty() {
        "label_cleared"
    } else {
        "label_updated"
    };
    if issue.pull.is_some() {
        payloads::pull_request(model, repo, n, "pull_request_label", action, bot)
    } else {
        payloads::issue(model, repo, n, "issue_label", action, bot)
    }
}

fn merge_events(model: &Model, repo: &str, n: u64, bot: &str) -> Vec<Webhook> {
    let mut out = vec![payloads::pull_request(
        model,
        repo,
        n,
        "pull_request",
        "closed",
        bot,
    )];
    let record = model
        .merges
        .iter()
        .rev()
        .find(|m| m.repo == repo && m.number == n);
    let merge_sha = model.repos[repo].issues[&n]
        .pull
        .as_ref()
        .and_then(|p| p.merge_commit_sha.clone())
        .unwrap_or_default();
    for issue in record.map(|m| m.closed_issues.clone()).unwrap_or_default() {
        let mut w = payloads::issue(model, repo, issue, "issues", "closed", bot);
        w.payload["commit_id"] = merge_sha.clone().into();
        out.push(w);
    }
    out
}
