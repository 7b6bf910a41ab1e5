//! The admin API under `/api/v1/admin/…` (DESIGN §5): the operator tools over HTTP,
//! JSON in and out, for operators without shell access. Handlers call the same
//! functions in [`crate::ops`] as the CLI.
//!
//! Authentication: `Authorization: Bearer $SHEPHERD_ADMIN_TOKEN`, compared in constant
//! time (both sides hashed first, so the length leaks nothing either).
//!
//! | status | when |
//! |---|---|
//! | 200 | done; the body is the operation's report |
//! | 400 | malformed request (bad target, time, JSON) |
//! | 401 | no bearer token (checked from the headers, before any body is read) |
//! | 403 | wrong bearer token |
//! | 404 | admin API off (no `SHEPHERD_ADMIN_TOKEN`), or nothing matched |
//! | 408 | the body did not arrive within the webhook body timeout (3 s) |
//! | 409 | a compare-and-set lost (`rebuild --apply`): try again |
//! | 413 | the body is larger than [`MAX_ADMIN_BODY`] |
//! | 415 | a compressed body (`Content-Encoding`): nothing is decompressed |
//! | 503 | Redis or Forgejo unavailable |
//!
//! | route | operation |
//! |---|---|
//! | `POST /api/v1/admin/replay` | [`ReplayRequest`] → `ReplayReport` |
//! | `GET /api/v1/admin/inspect/{owner}/{repo}` | open PRs, one summary each |
//! | `GET /api/v1/admin/inspect/{owner}/{repo}/{number}` | one PR in depth |
//! | `POST /api/v1/admin/rebuild` | [`RebuildRequest`] → `RebuildReport` |
//! | `POST /api/v1/admin/resync` | [`ResyncRequest`] → `ResyncReport` |
//! | `GET /api/v1/admin/dlq` | dead letters |
//! | `GET /api/v1/admin/dlq/{id}` | one dead letter in full |
//! | `POST /api/v1/admin/dlq/retry` | `{"id": …}` or `{"all": true}` |
//! | `POST /api/v1/admin/dlq/drop` | `{"id": …}` or `{"all": true}` |
//! | `GET /api/v1/admin/status` | the status page's figures as JSON |
//! | `GET /api/v1/admin/costs` | [`CostsRequest`] as query parameters (`from`, `to`, `days`, `repo`, `top`; `format=csv` for CSV) → `CostsReport` |

use std::sync::Arc;

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, ResponseError, web};
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::Config;
use crate::ingest::AppState;
use crate::ingest::webhook::{IngestError, read_api_body};
use crate::ops::costs::{self, CostsRequest};
use crate::ops::rebuild::{self, RebuildRequest};
use crate::ops::replay::{self, ReplayRequest};
use crate::ops::resync::{self, ResyncRequest};
use crate::ops::{Ops, OpsError, dlq, inspect, status};

/// Largest admin request body accepted (413 beyond); the requests are small JSON
/// objects (a target, a time, an id). Read only after the token matched (issue 12,
/// finding 2).
pub const MAX_ADMIN_BODY: usize = 64 * 1024;

/// Why an admin request failed; [`ResponseError`] maps each to its status, in one
/// place, with a message that never carries internals.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No `SHEPHERD_ADMIN_TOKEN`: the admin API does not exist.
    #[error("not found")]
    Disabled,
    /// No bearer token in the request.
    #[error("missing bearer token")]
    Unauthorized,
    /// A bearer token that is not the admin token.
    #[error("wrong bearer token")]
    Forbidden,
    /// The body could not be read: too large, too slow, compressed.
    #[error(transparent)]
    Body(#[from] IngestError),
    /// The operation failed.
    #[error(transparent)]
    Ops(#[from] OpsError),
}

impl ResponseError for AdminError {
    fn status_code(&self) -> StatusCode {
        match self {
            AdminError::Disabled => StatusCode::NOT_FOUND,
            AdminError::Unauthorized => StatusCode::UNAUTHORIZED,
            AdminError::Forbidden => StatusCode::FORBIDDEN,
            AdminError::Body(e) => e.status_code(),
            AdminError::Ops(e) => match e {
                OpsError::BadRequest(_) => StatusCode::BAD_REQUEST,
                OpsError::NotFound(_) => StatusCode::NOT_FOUND,
                OpsError::Conflict(_) => StatusCode::CONFLICT,
                OpsError::Unavailable(_) | OpsError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
                OpsError::Other(_) => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }

    fn error_response(&self) -> HttpResponse {
        let message = match self {
            AdminError::Ops(OpsError::Store(e)) => {
                tracing::warn!(error = %e, "admin request: redis failed");
                "redis unavailable; try again".to_owned()
            }
            AdminError::Ops(OpsError::Other(e)) => {
                tracing::error!(error = format!("{e:#}"), "admin request failed");
                "internal error (see the server log)".to_owned()
            }
            other => other.to_string(),
        };
        let mut r = HttpResponse::build(self.status_code());
        if matches!(self, AdminError::Unauthorized) {
            r.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        r.json(json!({ "error": message }))
    }
}

/// Checks the admin token: from the `Authorization: Bearer` header, or (for a browser
/// on the status page) from `query_token`.
pub fn check(
    config: &Config,
    req: &HttpRequest,
    query_token: Option<&str>,
) -> Result<(), AdminError> {
    let Some(expected) = config.admin_token.as_ref() else {
        return Err(AdminError::Disabled);
    };
    let header_token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(given) = header_token.or(query_token).filter(|t| !t.is_empty()) else {
        return Err(AdminError::Unauthorized);
    };
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(expected.expose_secret().as_bytes());
    if bool::from(a.ct_eq(&b)) {
        Ok(())
    } else {
        Err(AdminError::Forbidden)
    }
}

/// Mounts the admin API and the status page, sharing one [`Ops`] with a Redis
/// connection of its own (never the ingest's: scans must not delay deliveries).
pub fn routes(
    state: &AppState,
) -> anyhow::Result<impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static> {
    let ops = web::Data::from(Arc::new(Ops::connect(state.config.clone())?));
    if state.config.admin_token.is_none() {
        // Said once at start, so an operator looking for the page knows why it is gone.
        tracing::warn!(
            "SHEPHERD_ADMIN_TOKEN is not set: the admin API and the status page (/) are off (404)"
        );
    }
    Ok(move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(ops.clone())
            .route("/", web::get().to(super::status_page::page))
            .service(
                web::scope("/api/v1/admin")
                    .route("/replay", web::post().to(replay_handler))
                    .route("/inspect/{owner}/{repo}", web::get().to(inspect_repo))
                    .route(
                        "/inspect/{owner}/{repo}/{number}",
                        web::get().to(inspect_pr),
                    )
                    .route("/rebuild", web::post().to(rebuild_handler))
                    .route("/resync", web::post().to(resync_handler))
                    .route("/status", web::get().to(status_handler))
                    .route("/costs", web::get().to(costs_handler))
                    .route("/dlq", web::get().to(dlq_list))
                    .route("/dlq/retry", web::post().to(dlq_retry))
                    .route("/dlq/drop", web::post().to(dlq_drop))
                    .route("/dlq/{id}", web::get().to(dlq_show)),
            );
    })
}

/// The body of an authenticated admin request (call [`check`] first).
async fn body_of(req: &HttpRequest, payload: web::Payload) -> Result<web::Bytes, AdminError> {
    Ok(read_api_body(req, payload, MAX_ADMIN_BODY).await?)
}

/// Parses a JSON body (after authentication, so an unauthenticated caller learns
/// nothing about the request format); an empty body is `{}`.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, AdminError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        body
    };
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de)
        .map_err(|e| AdminError::Ops(OpsError::BadRequest(format!("invalid JSON body: {e}"))))
}

/// A JSON 200 answer.
fn ok<T: serde::Serialize>(v: &T) -> HttpResponse {
    HttpResponse::Ok().json(v)
}

async fn replay_handler(
    ops: web::Data<Ops>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, AdminError> {
    check(&ops.config, &req, None)?;
    let body = body_of(&req, payload).await?;
    let body: ReplayRequest = parse(&body)?;
    let report = replay::replay(&ops, &body, &|line| tracing::info!(line, "replay")).await?;
    Ok(ok(&report))
}

async fn inspect_repo(
    ops: web::Data<Ops>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, AdminError> {
    check(&ops.config, &req, None)?;
    let (owner, repo) = path.into_inner();
    Ok(ok(
        &inspect::inspect(&ops, &format!("{owner}/{repo}")).await?
    ))
}

async fn inspect_pr(
    ops: web::Data<Ops>,
    req: HttpRequest,
    path: web::Path<(String, String, String)>,
) -> Result<HttpResponse, AdminError> {
    check(&ops.config, &req, None)?;
    let (owner, repo, n) = path.into_inner();
    Ok(ok(
        &inspect::inspect(&ops, &format!("{owner}/{repo}#{n}")).await?
    ))
}

async fn rebuild_handler(
    ops: web::Data<Ops>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, AdminError> {
    check(&ops.config, &req, None)?;
    let body = body_of(&req, payload).await?;
    let body: RebuildRequest = parse(&body)?;
    Ok(ok(&rebuild::rebuild(&ops, &body).await?))
}

async fn resync_handler(
    ops: web::Data<Ops>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, AdminError> {
    check(&ops.config, &req, None)?;
    let body = body_of(&req, payload).await?;
    let body: ResyncRequest = parse(&body)?;
    Ok(ok(&resync::resync(&ops, &body).await?))
}

async fn status_handler(ops: web::Data<Ops>, req: HttpRequest) -> Result<HttpResponse, AdminError> {
    check(&ops.config, &req, None)?;
    Ok(ok(&status::overview(&ops).await?))
}

/// The query of `GET /api/v1/admin/costs`: the [`CostsRequest`]'s fields, and
/// `format=csv` for CSV. (Spelled out, not `flatten`ed: a flattened struct would read
/// the query's numbers as strings and refuse them.)
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct CostsQuery {
    /// `json` (the default) or `csv`.
    format: Option<String>,
    /// [`CostsRequest::from`].
    from: Option<String>,
    /// [`CostsRequest::to`].
    to: Option<String>,
    /// [`CostsRequest::days`].
    days: Option<u32>,
    /// [`CostsRequest::repo`].
    repo: Option<String>,
    /// [`CostsRequest::top`].
    top: Option<usize>,
}

async fn costs_handler(ops: web::Data<Ops>, req: HttpRequest) -> Result<HttpResponse, AdminError> {
    check(&ops.config, &req, None)?;
    // Parsed after the token matched, like every admin request.
    let query = web::Query::<CostsQuery>::from_query(req.query_string())
        .map_err(|e| AdminError::Ops(OpsError::BadRequest(format!("invalid query: {e}"))))?
        .into_inner();
    let request = CostsRequest {
        from: query.from,
        to: query.to,
        days: query.days,
        repo: query.repo,
        top: query.top,
    };
    let report = costs::costs(&ops, &request, crate::ops::timefmt::now_ms()).await?;
    match query.format.as_deref() {
        None | Some("json") => Ok(ok(&report)),
        Some("csv") => Ok(HttpResponse::Ok()
            .content_type("text/csv; charset=utf-8")
            .body(costs::render_csv(&report))),
        Some(other) => Err(AdminError::Ops(OpsError::BadRequest(format!(
            "format {other:?} is neither json nor csv"
        )))),
    }
}

async fn dlq_list(ops: web::Data<Ops>, req: HttpRequest) -> Result<HttpResponse, AdminError> {
    check(&ops.config, &req, None)?;
    Ok(ok(&dlq::list(&ops).await?))
}

async fn dlq_show(
    ops: web::Data<Ops>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, AdminError> {
    check(&ops.config, &req, None)?;
    Ok(ok(&dlq::show(&ops, &path).await?))
}

/// Body of `dlq/retry` and `dlq/drop`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DlqSelect {
    /// One dead letter.
    #[serde(default)]
    id: Option<String>,
    /// Every dead letter.
    #[serde(default)]
    all: bool,
}

impl DlqSelect {
    /// The id to act on (`None`: all), or a 400.
    fn target(&self) -> Result<Option<&str>, OpsError> {
        match (&self.id, self.all) {
            (Some(id), false) => Ok(Some(id)),
            (None, true) => Ok(None),
            _ => Err(OpsError::BadRequest(
                "give either \"id\" or \"all\": true".into(),
            )),
        }
    }
}

async fn dlq_retry(
    ops: web::Data<Ops>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, AdminError> {
    check(&ops.config, &req, None)?;
    let body = body_of(&req, payload).await?;
    let body: DlqSelect = parse(&body)?;
    let r = ReplayRequest {
        dead_letter: Some(body.target()?.unwrap_or("").to_owned()),
        ..ReplayRequest::default()
    };
    let report =
        dlq::replay_dead_letters(&ops, &r, &|line| tracing::info!(line, "dlq retry")).await?;
    Ok(ok(&report))
}

async fn dlq_drop(
    ops: web::Data<Ops>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, AdminError> {
    check(&ops.config, &req, None)?;
    let body = body_of(&req, payload).await?;
    let body: DlqSelect = parse(&body)?;
    let n = dlq::drop_entries(&ops, body.target()?).await?;
    Ok(ok(&json!({ "dropped": n })))
}
