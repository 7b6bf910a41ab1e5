//! The fake's one HTTP handler: logs the call, checks `Authorization: token …`, applies
//! injected faults, then routes `/api/v1/…` by hand onto the model with Forgejo's
//! paths, field names, pagination (`page`/`limit`, `X-Total-Count`) and status codes.

use std::sync::{Arc, Mutex, MutexGuard};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};

use super::faults::{Call, Fault, FaultAction, take_fault};
use super::merge::merge;
use super::model::Model;
use super::outbox::emitted;
use super::payloads::Webhook;
use super::render;

/// State shared between the server and the test's handle.
pub struct Shared {
    /// The model.
    pub model: Mutex<Model>,
    /// Injected faults, first match wins.
    pub faults: Mutex<Vec<Fault>>,
    /// Every request, in arrival order.
    pub calls: Mutex<Vec<Call>>,
    /// The only accepted API token.
    pub token: String,
    /// Login of the token's user (the bot).
    pub bot_login: String,
    /// Further users' tokens (`(token, login)`): reviewer agents post as themselves.
    pub user_tokens: Mutex<Vec<(String, String)>>,
    /// Tokens limited to some scopes (`(token, scopes)`, e.g. `read:repository`); a
    /// token not listed here has every scope.
    pub token_scopes: Mutex<Vec<(String, Vec<String>)>>,
    /// Webhooks Forgejo would have sent for the bot's writes, oldest first.
    pub outbox: Mutex<Vec<Webhook>>,
}

/// Locks a mutex, ignoring poisoning (a panicking test must not hide the model).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An answer before it becomes an HTTP response.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// JSON body, or none.
    pub body: Option<Value>,
    /// `X-Total-Count`.
    pub total: Option<usize>,
    /// `Retry-After`.
    pub retry_after: Option<String>,
    /// A `text/plain` body instead of JSON (a raw diff).
    pub text: Option<String>,
    /// Further headers (`Content-Range`, `Accept-Ranges`); boxed to keep a `Reply`
    /// small (it is the error type of some routes' helpers).
    pub headers: Box<[(String, String)]>,
}

impl Reply {
    /// A JSON answer.
    pub fn json(status: u16, body: Value) -> Self {
        Self {
            status,
            body: Some(body),
            total: None,
            retry_after: None,
            text: None,
            headers: Box::default(),
        }
    }

    /// An answer without a body.
    pub fn empty(status: u16) -> Self {
        Self {
            status,
            body: None,
            total: None,
            retry_after: None,
            text: None,
            headers: Box::default(),
        }
    }

    /// Forgejo's `{"message","url"}` error.
    pub fn error(status: u16, message: &str) -> Self {
        Self::json(
            status,
            json!({"message": message, "url": "https://forgejo.test/api/swagger"}),
        )
    }

    /// A `text/plain` answer.
    pub fn text(status: u16, text: String) -> Self {
        Self {
            text: Some(text),
            ..Self::empty(status)
        }
    }

    /// The answer with one more header.
    pub fn header(mut self, name: &str, value: String) -> Self {
        let mut all = self.headers.into_vec();
        all.push((name.to_owned(), value));
        self.headers = all.into_boxed_slice();
        self
    }

    /// 404 as Forgejo words it.
    pub fn not_found() -> Self {
        Self::error(404, "The target couldn't be found.")
    }
}

/// The actix handler for every path.
pub async fn handle(
    req: HttpRequest,
    body: web::Bytes,
    shared: web::Data<Arc<Shared>>,
) -> HttpResponse {
    let method = req.method().as_str().to_owned();
    let path = req
        .path()
        .strip_prefix("/api/v1")
        .unwrap_or(req.path())
        .to_owned();
    let query: Vec<(String, String)> = form_urlencoded::parse(req.query_string().as_bytes())
        .into_owned()
        .collect();
    let json_body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let index = {
        let mut calls = lock(&shared.calls);
        calls.push(Call {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            body: json_body.clone(),
            user_agent: req
                .headers()
                .get("user-agent")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned(),
            status: 0,
            at: std::time::Instant::now(),
        });
        calls.len() - 1
    };
    let reply = answer(&req, &shared, &method, &path, &query, &json_body).await;
    if let Some(call) = lock(&shared.calls).get_mut(index) {
        call.status = reply.status;
    }
    to_response(reply)
}

async fn answer(
    req: &HttpRequest,
    shared: &Shared,
    method: &str,
    path: &str,
    query: &[(String, String)],
    body: &Value,
) -> Reply {
    if !req.path().starts_with("/api/v1/") {
        return Reply::not_found();
    }
    // `GET /version` needs no token (Forgejo's miscellaneous routes).
    if method == "GET" && path == "/version" && request_token(req, query).is_none() {
        return super::actions::version(&lock(&shared.model));
    }
    let Some(doer) = authorized(req, query, shared) else {
        return Reply::error(401, "token is required");
    };
    if let Some(refusal) = scope_refusal(req, query, shared, method, path) {
        return refusal;
    }
    let fault = take_fault(&mut lock(&shared.faults), method, path);
    let mut override_status = None;
    match fault {
        Some(FaultAction::Respond {
            status,
            retry_after,
            message,
        }) => {
            let mut r = Reply::error(status, &message);
            r.retry_after = retry_after;
            return r;
        }
        Some(FaultAction::RespondJson { status, body }) => return Reply::json(status, body),
        Some(FaultAction::Stall(d)) => {
            tokio::time::sleep(d).await;
            return Reply::error(504, "stalled");
        }
        Some(FaultAction::Delay(d)) => tokio::time::sleep(d).await,
        Some(FaultAction::ApplyThenRespond(status)) => override_status = Some(status),
        None => {}
    }
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let ("GET", ["repos", owner, name, rest @ ..]) = (method, segs.as_slice()) {
        let range = req.headers().get("range").and_then(|v| v.to_str().ok());
        let mut model = lock(&shared.model);
        let repo = format!("{owner}/{name}");
        if model.repos.contains_key(&repo)
            && let Some(reply) = super::actions::route(&mut model, &repo, rest, query, range)
                .or_else(|| super::dependencies::route(&model, &repo, rest, query))
        {
            return reply;
        }
    }
    let reply = {
        let mut model = lock(&shared.model);
        let reply = route(&mut model, &doer, method, &segs, query, body);
        if method != "GET" && (200..300).contains(&reply.status) {
            touch_target(&mut model, &segs);
        }
        let hooks = emitted(&model, &doer, method, &segs, &reply);
        lock(&shared.outbox).extend(hooks);
        reply
    };
    match override_status {
        Some(status) => Reply::error(status, ""),
        None => reply,
    }
}

/// A successful write to `/repos/{o}/{r}/issues|pulls/{n}/…` changes the issue's
/// `updated_at`.
fn touch_target(model: &mut Model, segs: &[&str]) {
    if let ["repos", owner, name, "issues" | "pulls", n, ..] = segs
        && let Ok(n) = n.parse::<u64>()
    {
        model.touch(&format!("{owner}/{name}"), n);
    }
}

/// The user of the request's token — `Authorization: token|bearer <T>` (any case),
/// or `?token=` / `?access_token=` — when it is the bot's or another known user's.
fn authorized(req: &HttpRequest, query: &[(String, String)], shared: &Shared) -> Option<String> {
    let token = request_token(req, query)?;
    if token == shared.token {
        return Some(shared.bot_login.clone());
    }
    lock(&shared.user_tokens)
        .iter()
        .find(|(t, _)| *t == token)
        .map(|(_, login)| login.clone())
}

/// The token a request carries: `Authorization: token|bearer <T>` (any case), or
/// `?token=` / `?access_token=`.
fn request_token(req: &HttpRequest, query: &[(String, String)]) -> Option<String> {
    let header = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| {
            scheme.eq_ignore_ascii_case("token") || scheme.eq_ignore_ascii_case("bearer")
        })
        .map(|(_, t)| t.trim().to_owned());
    let param = query
        .iter()
        .find(|(k, _)| k == "token" || k == "access_token")
        .map(|(_, v)| v.clone());
    header.or(param)
}

/// The scope category of an API path, as Forgejo's route groups assign them
/// (`routers/api/v1/api.go`: `tokenRequiresScopes`): `/user…` is `user`,
/// `/repos/issues/search` and `/repos/{o}/{r}/issues…` and `…/labels…` are `issue`,
/// the rest of `/repos/…` is `repository`; `/version` needs none.
fn scope_category(path: &str) -> Option<&'static str> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["user", ..] => Some("user"),
        ["repos", "issues", "search"] => Some("issue"),
        ["repos", _, _, "issues" | "labels", ..] => Some("issue"),
        ["repos", ..] => Some("repository"),
        _ => None,
    }
}

/// Forgejo's 403 for a token whose scopes do not cover the route: a `GET` needs
/// `read:<category>` (which `write:<category>` includes), anything else
/// `write:<category>`; the message is `tokenRequiresScopes`' own.
fn scope_refusal(
    req: &HttpRequest,
    query: &[(String, String)],
    shared: &Shared,
    method: &str,
    path: &str,
) -> Option<Reply> {
    let token = request_token(req, query)?;
    let category = scope_category(path)?;
    let scopes = lock(&shared.token_scopes)
        .iter()
        .find(|(t, _)| *t == token)
        .map(|(_, s)| s.clone())?;
    let level = if method == "GET" { "read" } else { "write" };
    let held = |s: &str| {
        s == "all" || s == format!("write:{category}") || s == format!("{level}:{category}")
    };
    if scopes.iter().any(|s| held(s)) {
        return None;
    }
    Some(Reply::error(
        403,
        &format!("token does not have at least one of required scope(s): [{level}:{category}]"),
    ))
}

fn to_response(reply: Reply) -> HttpResponse {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut builder = HttpResponse::build(status);
    if let Some(total) = reply.total {
        builder.insert_header(("X-Total-Count", total.to_string()));
    }
    if let Some(ra) = reply.retry_after {
        builder.insert_header(("Retry-After", ra));
    }
    for (k, v) in reply.headers.into_vec() {
        builder.insert_header((k, v));
    }
    match (reply.text, reply.body) {
        (Some(t), _) => builder.content_type("text/plain; charset=utf-8").body(t),
        (None, Some(b)) => builder.json(b),
        (None, None) => builder.finish(),
    }
}

/// One page of `items` by `page` (1-based) and `limit` (default 30, at most 50).
pub fn paginate(items: Vec<Value>, query: &[(String, String)]) -> Reply {
    let (page, limit) = page_params(query);
    let total = items.len();
    let start = (page - 1).saturating_mul(limit).min(total);
    let end = start.saturating_add(limit).min(total);
    let mut r = Reply::json(200, Value::Array(items[start..end].to_vec()));
    r.total = Some(total);
    r
}

/// `(page, limit)` with Forgejo's defaults and bounds.
pub fn page_params(query: &[(String, String)]) -> (usize, usize) {
    let get = |k: &str| {
        query
            .iter()
            .find(|(q, _)| q == k)
            .and_then(|(_, v)| v.parse::<usize>().ok())
    };
    let page = get("page").filter(|p| *p > 0).unwrap_or(1);
    let limit = get("limit").filter(|l| *l > 0).unwrap_or(30).min(50);
    (page, limit)
}

fn route(
    model: &mut Model,
    bot: &str,
    method: &str,
    segs: &[&str],
    query: &[(String, String)],
    body: &Value,
) -> Reply {
    match (method, segs) {
        ("GET", ["version"]) => super::actions::version(model),
        ("GET", ["user"]) => Reply::json(200, render::user(model, bot)),
        ("GET", ["repos", "search"]) => search_repos(model, query),
        ("GET", ["repos", "issues", "search"]) => search_issues(model, query),
        (_, ["repos", owner, name, rest @ ..]) => {
            let repo = format!("{owner}/{name}");
            if !model.repos.contains_key(&repo) {
                return Reply::not_found();
            }
            super::routes_repo::route_repo(model, bot, method, &repo, rest, query, body)
        }
        _ => Reply::not_found(),
    }
}

/// `GET /repos/search`: every repository, one page, as `{"ok", "data"}`
/// (`SearchResults`), with `X-Total-Count`.
fn search_repos(model: &Model, query: &[(String, String)]) -> Reply {
    let items: Vec<Value> = model
        .repos
        .values()
        .map(|r| render::repo(model, r))
        .collect();
    let page = paginate(items, query);
    let mut r = Reply::json(200, json!({"ok": true, "data": page.body}));
    r.total = page.total;
    r
}

/// `GET /repos/issues/search`: open issues and PRs of every repository, one page.
fn search_issues(model: &Model, query: &[(String, String)]) -> Reply {
    let items: Vec<Value> = model
        .repos
        .values()
        .flat_map(|r| {
            r.issues
                .values()
                .filter(|i| i.state == "open")
                .map(move |i| render::issue(model, r, i))
        })
        .collect();
    paginate(items, query)
}

/// Routes merge requests (kept here so `routes_repo` stays about reads and issues).
pub fn route_merge(
    model: &mut Model,
    bot: &str,
    method: &str,
    repo: &str,
    number: u64,
    body: &Value,
) -> Reply {
    match method {
        "GET" => {
            let merged = model.repos[repo]
                .issues
                .get(&number)
                .and_then(|i| i.pull.as_ref())
                .is_some_and(|p| p.merged);
            if merged {
                Reply::empty(204)
            } else {
                Reply::not_found()
            }
        }
        "POST" => merge(model, bot, repo, number, body),
        _ => Reply::error(405, "method not allowed"),
    }
}

/// Renders every PR of `repo` matching the `state` filter (empty or missing: all).
pub fn list_pulls(model: &Model, repo: &str, query: &[(String, String)]) -> Reply {
    let r = &model.repos[repo];
    let state = query
        .iter()
        .find(|(k, _)| k == "state")
        .map_or("", |(_, v)| v.as_str());
    let items: Vec<Value> = r
        .issues
        .values()
        .rev()
        .filter(|i| i.pull.is_some())
        .filter(|i| match state {
            "open" | "closed" => i.state == state,
            _ => true,
        })
        .map(|i| render::pull(model, r, i))
        .collect();
    paginate(items, query)
}
