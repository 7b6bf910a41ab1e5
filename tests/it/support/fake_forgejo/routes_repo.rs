//! Repository routes of the fake: pulls, reviews, commit statuses, labels, issue
//! labels, comments and collaborator permissions (forgejo-facts.md §4.2); the agents'
//! context reads are in `routes_context.rs`.

use serde_json::{Value, json};

use super::model::{Model, combined_state};
use super::render;
use super::routes::{Reply, list_pulls, page_params, paginate, route_merge};

/// Routes `/repos/{repo}/{rest…}`; the repository exists.
pub fn route_repo(
    model: &mut Model,
    bot: &str,
    method: &str,
    repo: &str,
    rest: &[&str],
    query: &[(String, String)],
    body: &Value,
) -> Reply {
    let num = |s: &str| s.parse::<u64>().ok();
    match (method, rest) {
        ("GET", ["pulls"]) => list_pulls(model, repo, query),
        ("GET", ["pulls", n]) if n.ends_with(".diff") || n.ends_with(".patch") => {
            super::routes_context::diff(model, repo, n, query)
        }
        ("GET", ["pulls", n, "files"]) => super::routes_context::files(model, repo, n, query),
        ("GET", ["pulls", n, "reviews", id, "comments"]) => {
            super::routes_context::review_comments(model, repo, n, id)
        }
        ("GET", ["pulls", n]) => with_pull(model, repo, n, |m, r, i| {
            Reply::json(200, render::pull(m, r, i))
        }),
        ("GET", ["pulls", n, "reviews"]) => with_pull(model, repo, n, |m, r, i| {
            let items = r
                .reviews
                .iter()
                .filter(|v| v.number == i.number)
                .map(|v| render::review(m, r, v))
                .collect();
            paginate(items, query)
        }),
        ("POST", ["pulls", n, "reviews"]) => match num(n) {
            Some(n) => super::reviews::create(model, bot, repo, n, body),
            None => Reply::not_found(),
        },
        (_, ["pulls", n, "merge"]) => match num(n) {
            Some(n) => route_merge(model, bot, method, repo, n, body),
            None => Reply::not_found(),
        },
        ("GET", ["commits", sha, "status"]) => combined(model, repo, sha, query),
        ("GET", ["commits", sha, "statuses"]) | ("GET", ["statuses", sha]) => {
            let r = &model.repos[repo];
            let sha = resolve_ref(model, repo, sha);
            let mut rows = r.statuses.get(&sha).cloned().unwrap_or_default();
            rows.reverse();
            let items = rows.iter().map(render::status).collect();
            paginate(items, query)
        }
        ("POST", ["statuses", sha]) => create_status(model, repo, sha, body),
        ("GET", ["labels"]) => {
            let r = &model.repos[repo];
            paginate(
                r.labels.iter().map(|l| render::label(r, l)).collect(),
                query,
            )
        }
        ("POST", ["labels"]) => create_label(model, repo, body),
        ("GET", ["issues", n]) => match num(n).and_then(|n| model.repos[repo].issues.get(&n)) {
            Some(i) => Reply::json(200, render::issue(model, &model.repos[repo], i)),
            None => Reply::not_found(),
        },
        (_, ["issues", "comments", id]) => comment_by_id(model, method, repo, id, body),
        (_, ["issues", n, "labels"]) => match num(n) {
            Some(n) => issue_labels(model, bot, method, repo, n, body),
            None => Reply::not_found(),
        },
        ("DELETE", ["issues", n, "labels", ident]) => match num(n) {
            Some(n) => remove_issue_label(model, bot, repo, n, ident),
            None => Reply::not_found(),
        },
        ("GET", ["issues", n, "timeline"]) => match num(n) {
            Some(n) => super::timeline::timeline(model, repo, n, query),
            None => Reply::not_found(),
        },
        (_, ["issues", n, "comments"]) => match num(n) {
            Some(n) => issue_comments(model, method, bot, repo, n, query, body),
            None => Reply::not_found(),
        },
        ("GET", ["collaborators", user, "permission"]) => permission(model, repo, user),
        ("GET", []) => super::queue::repo(model, repo),
        ("POST", ["pulls", n, "update"]) => match num(n) {
            Some(n) => super::queue::update(model, repo, n, query),
            None => Reply::not_found(),
        },
        ("GET", ["branches", name @ ..]) if !name.is_empty() => {
            super::queue::branch(model, repo, &name.join("/"))
        }
        ("POST", ["branches"]) => super::batch::create_branch(model, repo, body),
        ("DELETE", ["branches", name @ ..]) if !name.is_empty() => {
            super::batch::delete_branch(model, repo, &name.join("/"))
        }
        ("POST", ["pulls"]) => super::batch::create_pull(model, bot, repo, body),
        _ => Reply::not_found(),
    }
}

/// Runs `f` on PR `n`, or answers 404.
fn with_pull(
    model: &Model,
    repo: &str,
    n: &str,
    f: impl FnOnce(&Model, &super::model::RepoRow, &super::model::IssueRow) -> Reply,
) -> Reply {
    let r = &model.repos[repo];
    match n.parse::<u64>().ok().and_then(|n| r.issues.get(&n)) {
        Some(i) if i.pull.is_some() => f(model, r, i),
        _ => Reply::not_found(),
    }
}

/// A branch name resolves to its tip; anything else is taken as a sha.
fn resolve_ref(model: &Model, repo: &str, r: &str) -> String {
    model.repos[repo]
        .branches
        .get(r)
        .cloned()
        .unwrap_or_else(|| r.to_owned())
}

/// `GET …/commits/{ref}/status`: latest status per context, one page of contexts; an
/// empty page is Forgejo's zero-valued object.
fn combined(model: &Model, repo: &str, sha: &str, query: &[(String, String)]) -> Reply {
    let r = &model.repos[repo];
    let sha = resolve_ref(model, repo, sha);
    let latest = r.latest_statuses(&sha);
    let (page, limit) = page_params(query);
    let start = (page - 1).saturating_mul(limit).min(latest.len());
    let slice = &latest[start..(start + limit).min(latest.len())];
    let mut reply = if slice.is_empty() {
        Reply::json(
            200,
            json!({"state": "", "sha": "", "total_count": 0, "statuses": null, "repository": null, "commit_url": "", "url": ""}),
        )
    } else {
        Reply::json(
            200,
            json!({
                "state": combined_state(slice),
                "sha": sha,
                "total_count": slice.len(),
                "statuses": slice.iter().map(render::status).collect::<Vec<_>>(),
                "repository": render::repo(model, r),
                "commit_url": format!("{}/api/v1/repos/{repo}/commits/{sha}", render::HTML_BASE),
                "url": format!("{}/api/v1/repos/{repo}/commits/{sha}/status", render::HTML_BASE),
            }),
        )
    };
    reply.total = Some(latest.len());
    reply
}

fn create_status(model: &mut Model, repo: &str, sha: &str, body: &Value) -> Reply {
    let s = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let state = s("state");
    if !["pending", "success", "error", "failure", "warning"].contains(&state.as_str()) {
        return Reply::error(422, "invalid state");
    }
    let context = if s("context").is_empty() {
        "default".to_owned()
    } else {
        s("context")
    };
    let id = model.add_status(repo, sha, &context, &state, &s("description"));
    let r = &model.repos[repo];
    let row = r.statuses[sha]
        .iter()
        .find(|x| x.id == id)
        .expect("just added");
    Reply::json(201, render::status(row))
}

fn create_label(model: &mut Model, repo: &str, body: &Value) -> Reply {
    let name = body.get("name").and_then(Value::as_str).unwrap_or("");
    let color = body.get("color").and_then(Value::as_str).unwrap_or("");
    let hex = color.trim_start_matches('#');
    if name.is_empty() || hex.len() != 6 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Reply::error(422, "[Name Color]: invalid label");
    }
    let id = model.id();
    let r = model.repos.get_mut(repo).expect("exists");
    // Forgejo does not check name uniqueness on creation.
    r.labels.push(super::model::LabelRow {
        id,
        name: name.to_owned(),
        color: hex.to_lowercase(),
        description: body
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    });
    let l = r.labels.last().expect("just pushed");
    Reply::json(201, render::label(r, l))
}

/// `GET/POST/PUT/DELETE …/issues/{n}/labels`. POST and PUT take all names or all ids;
/// unknown names are silently ignored, mixing gives 400.
/// Every change is a `label` timeline entry by `doer` (`timeline.rs`).
fn issue_labels(
    model: &mut Model,
    doer: &str,
    method: &str,
    repo: &str,
    n: u64,
    body: &Value,
) -> Reply {
    let r = model.repos.get_mut(repo).expect("exists");
    if !r.issues.contains_key(&n) {
        return Reply::not_found();
    }
    let wanted = match method {
        "POST" | "PUT" => {
            let items = body
                .get("labels")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let ids: Option<Vec<i64>> = if items.iter().all(Value::is_string) {
                Some(
                    items
                        .iter()
                        .filter_map(|v| {
                            r.labels
                                .iter()
                                .find(|l| Some(l.name.as_str()) == v.as_str())
                        })
                        .map(|l| l.id)
                        .collect(),
                )
            } else if items.iter().all(Value::is_i64) {
                Some(
                    items
                        .iter()
                        .filter_map(Value::as_i64)
                        .filter(|id| r.labels.iter().any(|l| l.id == *id))
                        .collect(),
                )
            } else {
                None
            };
            match ids {
                Some(ids) => ids,
                None => return Reply::error(400, "labels must be all names or all ids"),
            }
        }
        _ => Vec::new(),
    };
    let issue = r.issues.get_mut(&n).expect("checked");
    let before = issue.labels.clone();
    match method {
        "GET" => {}
        "POST" => {
            for id in wanted {
                if !issue.labels.contains(&id) {
                    issue.labels.push(id);
                }
            }
        }
        "PUT" => issue.labels = wanted,
        "DELETE" => issue.labels.clear(),
        _ => return Reply::error(405, "method not allowed"),
    }
    let after = issue.labels.clone();
    for id in before.iter().filter(|id| !after.contains(id)) {
        model.label_event(repo, n, *id, false, doer);
    }
    for id in after.iter().filter(|id| !before.contains(id)) {
        model.label_event(repo, n, *id, true, doer);
    }
    if method == "DELETE" {
        return Reply::empty(204);
    }
    let r = &model.repos[repo];
    Reply::json(200, render::labels_of(r, &r.issues[&n]))
}

/// `DELETE …/issues/{n}/labels/{identifier}`: a name first (v13+), then an id; an
/// unknown label is 422; a label not on the issue is a quiet 204.
fn remove_issue_label(model: &mut Model, doer: &str, repo: &str, n: u64, ident: &str) -> Reply {
    let r = model.repos.get_mut(repo).expect("exists");
    let id = r
        .labels
        .iter()
        .find(|l| l.name == ident)
        .or_else(|| {
            ident
                .parse::<i64>()
                .ok()
                .and_then(|id| r.labels.iter().find(|l| l.id == id))
        })
        .map(|l| l.id);
    let Some(id) = id else {
        return Reply::error(422, "label does not exist");
    };
    match r.issues.get_mut(&n) {
        Some(issue) => {
            let was_on = issue.labels.contains(&id);
            issue.labels.retain(|l| *l != id);
            if was_on {
                model.label_event(repo, n, id, false, doer);
            }
            Reply::empty(204)
        }
        None => Reply::not_found(),
    }
}

fn issue_comments(
    model: &mut Model,
    method: &str,
    bot: &str,
    repo: &str,
    n: u64,
    query: &[(String, String)],
    body: &Value,
) -> Reply {
    if !model.repos[repo].issues.contains_key(&n) {
        return Reply::not_found();
    }
    match method {
        "GET" => super::routes_context::list_comments(model, repo, n, query),
        "POST" => {
            let text = body.get("body").and_then(Value::as_str).unwrap_or("");
            if text.is_empty() {
                return Reply::error(422, "[Body]: Required");
            }
            let id = model.add_comment(repo, n, bot, text);
            let r = &model.repos[repo];
            let c = r.comments.iter().find(|c| c.id == id).expect("just added");
            Reply::json(201, render::comment(model, r, c))
        }
        _ => Reply::error(405, "method not allowed"),
    }
}

fn comment_by_id(model: &mut Model, method: &str, repo: &str, id: &str, body: &Value) -> Reply {
    let Some(id) = id.parse::<i64>().ok() else {
        return Reply::not_found();
    };
    let r = model.repos.get_mut(repo).expect("exists");
    let Some(pos) = r.comments.iter().position(|c| c.id == id) else {
        return Reply::not_found();
    };
    match method {
        "GET" => {}
        "PATCH" => {
            let text = body.get("body").and_then(Value::as_str).unwrap_or("");
            let c = &mut r.comments[pos];
            c.body = text.to_owned();
            c.updated_at = super::model::now();
        }
        "DELETE" => {
            r.comments.remove(pos);
            return Reply::empty(204);
        }
        _ => return Reply::error(405, "method not allowed"),
    }
    let r = &model.repos[repo];
    Reply::json(200, render::comment(model, r, &r.comments[pos]))
}

fn permission(model: &Model, repo: &str, user: &str) -> Reply {
    let r = &model.repos[repo];
    let known = model.users.contains_key(user) || r.permissions.contains_key(&user.to_lowercase());
    if !known {
        return Reply::error(404, "user does not exist");
    }
    let permission = r.permission_of(user);
    let role = match permission.as_str() {
        "owner" => "Owner",
        "admin" => "Administrator",
        "write" => "Writer",
        "read" => "Reader",
        _ => "None",
    };
    Reply::json(
        200,
        json!({"permission": permission, "role_name": role, "user": render::user(model, user)}),
    )
}
