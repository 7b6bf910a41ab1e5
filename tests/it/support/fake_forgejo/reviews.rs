//! `POST /repos/{o}/{r}/pulls/{index}/reviews` as Forgejo decides it
//! (routers/api/v1/repo/pull_review.go, `CreatePullReview` and
//! `preparePullReviewType`): the doer (any user with a token) reviews; `APPROVED` or
//! `REQUEST_CHANGES` on one's own PR is 422; `REQUEST_CHANGES` needs a body; `COMMENT`
//! needs a body or inline comments; an empty `commit_id` means the head; inline
//! comments (`path`, `body`, `new_position`/`old_position`) belong to the review. The
//! answer is the `PullReview`; the review is a comment, so the PR's `updated_at` moves,
//! and the `pull_request_review_*` webhook goes out with the doer as sender (outbox).

use serde_json::Value;

use super::model::{Model, ReviewCommentRow};
use super::render;
use super::routes::Reply;

/// Creates a review of PR `n` by `doer`.
pub fn create(model: &mut Model, doer: &str, repo: &str, n: u64, body: &Value) -> Reply {
    let Some(issue) = model.repos[repo].issues.get(&n) else {
        return Reply::not_found();
    };
    let Some(pull) = &issue.pull else {
        return Reply::not_found();
    };
    let author = issue.user.clone();
    let head = pull.head_sha.clone();
    let text = body.get("body").and_then(Value::as_str).unwrap_or("");
    let comments = body
        .get("comments")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let has_body = !text.trim().is_empty();
    let event = body.get("event").and_then(Value::as_str).unwrap_or("");
    let own = author.eq_ignore_ascii_case(doer);
    let state = match event {
        "APPROVED" if own => return Reply::error(422, "approve your own pull is not allowed"),
        "REQUEST_CHANGES" if own => {
            return Reply::error(422, "reject your own pull is not allowed");
        }
        "APPROVED" => "APPROVED",
        "REQUEST_CHANGES" if !has_body => {
            return Reply::error(422, "review event REQUEST_CHANGES requires a body");
        }
        "REQUEST_CHANGES" => "REQUEST_CHANGES",
        "COMMENT" if !has_body && comments.is_empty() => {
            return Reply::error(422, "review event COMMENT requires a body or a comment");
        }
        "COMMENT" => "COMMENT",
        // Anything else stays a pending review (Forgejo's ReviewTypePending).
        _ => "PENDING",
    };
    let commit = match body.get("commit_id").and_then(Value::as_str) {
        Some(c) if !c.is_empty() => c.to_owned(),
        _ => head,
    };
    let id = model.submit_review(repo, n, doer, state, text, &commit);
    for c in &comments {
        let line = |k: &str| c.get(k).and_then(Value::as_u64).unwrap_or(0);
        let (new, old) = (line("new_position"), line("old_position"));
        let comment_id = model.id();
        model.repo_mut(repo).review_comments.push(ReviewCommentRow {
            id: comment_id,
            review_id: id,
            user: doer.to_owned(),
            path: c
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            line: if new > 0 { new } else { old },
            body: c
                .get("body")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            diff_hunk: String::new(),
            commit_id: commit.clone(),
            created_at: super::model::now(),
        });
    }
    let r = &model.repos[repo];
    let review = r.reviews.iter().find(|v| v.id == id).expect("just stored");
    Reply::json(200, render::review(model, r, review))
}
