//! The fake's routes for the agents' context, served from the model as Forgejo does
//! (its OpenAPI v15 paths, fields and pagination): a PR's raw diff
//! (`pulls/{index}.diff|.patch`, text/plain), its changed files (paginated, with
//! `X-Total-Count`), the inline comments of one review (not paginated; 404 when the
//! review is not the PR's), and an issue's comments filtered by `since`/`before`
//! (RFC 3339 against `updated_at`; 422 when unparsable).

use chrono::DateTime;
use serde_json::Value;

use super::model::{IssueRow, Model, RepoRow};
use super::render;
use super::routes::{Reply, paginate};

/// The PR `n` (a number) of `r`, if it is one.
fn pull<'a>(r: &'a RepoRow, n: &str) -> Option<&'a IssueRow> {
    n.parse::<u64>()
        .ok()
        .and_then(|n| r.issues.get(&n))
        .filter(|i| i.pull.is_some())
}

/// `GET …/pulls/{index}.diff` (or `.patch`): the files' hunks between the base tip
/// and the head, as `git diff` (or `git format-patch`) prints them.
pub fn diff(model: &Model, repo: &str, segment: &str, query: &[(String, String)]) -> Reply {
    let r = &model.repos[repo];
    let (n, patch) = match segment.rsplit_once('.') {
        Some((n, "diff")) => (n, false),
        Some((n, "patch")) => (n, true),
        _ => return Reply::not_found(),
    };
    if query
        .iter()
        .any(|(k, v)| k == "binary" && v.parse::<bool>().is_err())
    {
        return Reply::error(422, "binary must be a boolean");
    }
    let Some(issue) = pull(r, n) else {
        return Reply::not_found();
    };
    let p = issue.pull.as_ref().expect("a PR");
    let base_sha = r.branches.get(&p.base_ref).cloned().unwrap_or_default();
    let mut text = String::new();
    if patch {
        text.push_str(&format!(
            "From {} Mon Sep 17 00:00:00 2001\nFrom: {} <{}@noreply.forgejo.test>\nSubject: [PATCH] {}\n\n---\n",
            p.head_sha, issue.user, issue.user, issue.title
        ));
    }
    for f in &p.files {
        text.push_str(&f.diff(&base_sha, &p.head_sha));
    }
    Reply::text(200, text)
}

/// `GET …/pulls/{index}/files?page=&limit=`.
pub fn files(model: &Model, repo: &str, n: &str, query: &[(String, String)]) -> Reply {
    let r = &model.repos[repo];
    let Some(issue) = pull(r, n) else {
        return Reply::not_found();
    };
    let p = issue.pull.as_ref().expect("a PR");
    let items = p
        .files
        .iter()
        .map(|f| render::changed_file(r, f, &p.head_sha))
        .collect();
    paginate(items, query)
}

/// `GET …/pulls/{index}/reviews/{id}/comments`.
pub fn review_comments(model: &Model, repo: &str, n: &str, id: &str) -> Reply {
    let r = &model.repos[repo];
    let Some(issue) = pull(r, n) else {
        return Reply::not_found();
    };
    let review = id
        .parse::<i64>()
        .ok()
        .and_then(|id| r.reviews.iter().find(|v| v.id == id))
        .filter(|v| v.number == issue.number && v.state != "PENDING");
    let Some(review) = review else {
        return Reply::not_found();
    };
    let items = r
        .review_comments
        .iter()
        .filter(|c| c.review_id == review.id)
        .map(|c| render::review_comment(model, r, issue.number, c))
        .collect();
    Reply::json(200, Value::Array(items))
}

/// `GET …/issues/{index}/comments?since=&before=`: comments updated at or after
/// `since` and at or before `before`, oldest first (not paginated).
pub fn list_comments(model: &Model, repo: &str, n: u64, query: &[(String, String)]) -> Reply {
    let bound = |key: &str| -> Result<Option<i64>, Reply> {
        match query.iter().find(|(k, _)| k == key) {
            None => Ok(None),
            Some((_, v)) => DateTime::parse_from_rfc3339(v)
                .map(|t| Some(t.timestamp()))
                .map_err(|_| Reply::error(422, &format!("{key}: not an RFC 3339 time"))),
        }
    };
    let (since, before) = match (bound("since"), bound("before")) {
        (Ok(s), Ok(b)) => (s, b),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let r = &model.repos[repo];
    let items = r
        .comments
        .iter()
        .filter(|c| c.number == n)
        .filter(|c| {
            let updated = DateTime::parse_from_rfc3339(&c.updated_at)
                .map(|t| t.timestamp())
                .unwrap_or(0);
            since.is_none_or(|s| updated >= s) && before.is_none_or(|b| updated <= b)
        })
        .map(|c| render::comment(model, r, c))
        .collect();
    Reply::json(200, Value::Array(items))
}
