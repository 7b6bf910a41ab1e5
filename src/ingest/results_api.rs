//! `POST /api/v1/work/{id}/result` (DESIGN §4): agents report the result of a work
//! item. Bearer `SHEPHERD_AGENT_TOKEN` (compared in constant time); the body is
//! `{"outcome": "succeeded"|"failed"|"no-changes"|"transient", "signature"?, "summary"?}`
//! (`transient`: a model provider's failure, retried without an attempt up to
//! `transient_retries` times in a row; issue 27).
//!
//! | status | when |
//! |---|---|
//! | 202 | queued as a `WorkResult` event |
//! | 401 | token missing or wrong (checked from the headers, before any body is read) |
//! | 408 | the body did not arrive within the webhook body timeout (3 s) |
//! | 413 | the body is larger than [`MAX_RESULT_BODY`] |
//! | 415 | a compressed body (`Content-Encoding`): nothing is decompressed |
//! | 404 | unknown work id (or the results API is off: no token configured) |
//! | 409 | the work is no longer active, or its result was already reported |
//! | 422 | the body is not a valid result |
//! | 503 | Redis unavailable (retry later) |
//!
//! Mounted on the ingest app with [`configure`]; handlers use the ingest's
//! [`AppState`] (configuration and Redis connection).

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use secrecy::ExposeSecret;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::ingest::AppState;
use crate::ingest::webhook::read_api_body;
use crate::worker::results::{ResultReport, Submitted, submit};

/// Largest result body accepted (413 beyond). A result is an outcome, a signature
/// and a summary; this keeps what one request can make the process hold small
/// (issue 12, finding 2), far below the webhook limit.
pub const MAX_RESULT_BODY: usize = 64 * 1024;

/// Mounts the results API.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/api/v1/work/{id}/result", web::post().to(report));
}

/// An error answer: status and a JSON `{"error": …}` body with a clear message.
fn error(status: actix_web::http::StatusCode, message: &str) -> HttpResponse {
    HttpResponse::build(status).json(json!({ "error": message }))
}

/// Whether the request carries `Authorization: Bearer <expected>`. Both sides are
/// hashed first so the comparison is constant-time in the length too.
fn authorized(req: &HttpRequest, expected: &str) -> bool {
    let Some(given) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let a = Sha256::digest(given.trim().as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    a.ct_eq(&b).into()
}

/// The handler.
async fn report(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> HttpResponse {
    use actix_web::http::StatusCode;
    let work_id = path.into_inner();
    let span = tracing::info_span!("work_result", work_id = %work_id);
    let _enter = span.enter();
    let Some(token) = state.config.agent_token.as_ref() else {
        return error(
            StatusCode::NOT_FOUND,
            "the results API is off (SHEPHERD_AGENT_TOKEN is not set)",
        );
    };
    if !authorized(&req, token.expose_secret()) {
        return HttpResponse::Unauthorized()
            .insert_header((header::WWW_AUTHENTICATE, "Bearer"))
            .json(json!({ "error": "missing or wrong bearer token" }));
    }
    // Only now, authenticated, is the body read (bounded in size and time).
    let body = match read_api_body(&req, payload, MAX_RESULT_BODY).await {
        Ok(b) => b,
        Err(e) => {
            tracing::info!(error = %e, "work result refused");
            return actix_web::ResponseError::error_response(&e);
        }
    };
    let de = &mut serde_json::Deserializer::from_slice(&body);
    let report: ResultReport = match serde_path_to_error::deserialize(de) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!(
                    "invalid result at {}: {}; expected {{\"outcome\": \"succeeded\"|\"failed\"|\"no-changes\"|\"transient\", \"signature\"?, \"summary\"?}}",
                    e.path(),
                    e.inner()
                ),
            );
        }
    };
    if report.id.as_deref().is_some_and(|id| id != work_id) {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "the body's id differs from the id in the path",
        );
    }
    let mut conn = state.redis.clone();
    let submitted = tokio::time::timeout(
        state.config.redis_timeout * 2,
        submit(
            &mut conn,
            &state.keys,
            &work_id,
            &report,
            state.config.retention,
        ),
    )
    .await;
    match submitted {
        Ok(Ok(Submitted::Queued(id))) => {
            tracing::info!(entry = %id, "work result queued");
            HttpResponse::Accepted().json(json!({ "id": work_id, "queued": id }))
        }
        Ok(Ok(Submitted::Unknown)) => error(StatusCode::NOT_FOUND, "unknown work id"),
        Ok(Ok(Submitted::Ended)) => error(StatusCode::CONFLICT, "the work is no longer active"),
        Ok(Ok(Submitted::AlreadyReported)) => error(
            StatusCode::CONFLICT,
            "a result was already reported for this work",
        ),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "queueing a work result failed");
            unavailable()
        }
        Err(_) => {
            tracing::warn!("queueing a work result timed out");
            unavailable()
        }
    }
}

/// 503 with `Retry-After`.
fn unavailable() -> HttpResponse {
    HttpResponse::ServiceUnavailable()
        .insert_header((header::RETRY_AFTER, "5"))
        .json(json!({ "error": "storage unavailable; retry later" }))
}
