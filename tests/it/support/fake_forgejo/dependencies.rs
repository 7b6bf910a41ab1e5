//! The fake's issue dependencies, served as Forgejo v15.0.3 does
//! (`routers/api/v1/repo/issue_dependency.go`, `GetIssueDependencies` and
//! `GetIssueBlocks`; routes in `routers/api/v1/api.go`, `/issues/{index}/dependencies`
//! and `/blocks`): `GET …/issues/{index}/dependencies` lists the issues that block
//! issue `index`, `GET …/issues/{index}/blocks` the issues it blocks, each a JSON array
//! of issues without `X-Total-Count` (`IssueListWithoutPagination`), paged by `page`
//! (at least 1) and `limit` (`limit <= 1` means the default 30, as the handler has it);
//! 404 when the issue does not exist.

use serde_json::Value;

use super::FakeForgejo;
use super::model::Model;
use super::render;
use super::routes::{Reply, lock};

/// The dependency routes below `/repos/{o}/{r}/` (`rest`), or `None` for other paths.
pub fn route(
    model: &Model,
    repo: &str,
    rest: &[&str],
    query: &[(String, String)],
) -> Option<Reply> {
    let (n, blocks) = match rest {
        ["issues", n, "dependencies"] => (n, false),
        ["issues", n, "blocks"] => (n, true),
        _ => return None,
    };
    let r = &model.repos[repo];
    let Some(n) = n.parse::<u64>().ok().filter(|n| r.issues.contains_key(n)) else {
        return Some(Reply::not_found());
    };
    let get = |k: &str| {
        query
            .iter()
            .find(|(q, _)| q == k)
            .and_then(|(_, v)| v.parse::<usize>().ok())
            .unwrap_or(0)
    };
    let page = get("page").max(1);
    let limit = match get("limit") {
        l if l <= 1 => 30,
        l => l,
    };
    let related: Vec<Value> = model
        .dependencies
        .iter()
        .filter(|(dep_repo, _, _)| dep_repo == repo)
        .filter_map(|(_, blocker, blocked)| match blocks {
            true if *blocker == n => Some(*blocked),
            false if *blocked == n => Some(*blocker),
            _ => None,
        })
        .filter_map(|other| r.issues.get(&other))
        .map(|i| render::issue(model, r, i))
        .skip((page - 1) * limit)
        .take(limit)
        .collect();
    Some(Reply::json(200, Value::Array(related)))
}

impl FakeForgejo {
    /// Makes issue `blocked` depend on issue `blocker` (Forgejo's "depends on": the
    /// Epic `blocked` waits for its part `blocker`).
    pub fn add_dependency(&self, repo: &str, blocker: u64, blocked: u64) {
        lock(&self.shared.model)
            .dependencies
            .push((repo.into(), blocker, blocked));
    }

    /// Sets the milestone (by title) of issue `n`.
    pub fn set_milestone(&self, repo: &str, n: u64, title: &str) {
        let mut model = lock(&self.shared.model);
        if let Some(i) = model.repo_mut(repo).issues.get_mut(&n) {
            i.milestone = Some(title.into());
        }
    }
}
