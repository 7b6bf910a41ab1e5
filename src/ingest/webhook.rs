//! `POST /webhooks/forgejo` (and `/webhooks/gitea`): read the body once under the size
//! limit, verify, classify, dedup+append, answer (DESIGN §3). Every refusal is an
//! [`IngestError`], turned into an HTTP answer in exactly one place
//! ([`ResponseError`] below), with a short message and no internals. Every queued (or
//! already queued) delivery is logged through `ingest::accept_log`: one `info` line
//! each, or a summary a second above 50 a second; refusals keep their own lines.

use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderMap};
use actix_web::{HttpRequest, HttpResponse, ResponseError, web};
use bytes::BytesMut;
use futures_util::StreamExt;
use serde_json::json;
use tracing::instrument;

use crate::ingest::accept_log;
use crate::ingest::delivery::{self, Delivery, DeliveryError, EVENT_HEADERS};
use crate::ingest::signature::{self, SignatureError};
use crate::ingest::{AppState, BODY_TIMEOUT, WorkerRedis};
use crate::store::StoreError;
use crate::store::enqueue::Enqueued;

/// Most bytes of header names and values a webhook request may carry (431 beyond).
/// Forgejo sends about 1 KiB, a configured `Authorization` header included.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// `Retry-After` seconds sent with a 503.
const RETRY_AFTER_SECS: u32 = 5;

/// Event types Forgejo (and Gitea's `status`) can send; used only to bound the
/// cardinality of the `event` metric label. Anything else is counted as `other`
/// (and still accepted and archived).
pub(super) const KNOWN_EVENTS: [&str; 31] = [
    "create",
    "delete",
    "fork",
    "push",
    "issues",
    "issue_assign",
    "issue_label",
    "issue_milestone",
    "issue_comment",
    "pull_request",
    "pull_request_assign",
    "pull_request_label",
    "pull_request_milestone",
    "pull_request_sync",
    "pull_request_review_request",
    "pull_request_comment",
    "pull_request_review_approved",
    "pull_request_review_rejected",
    "pull_request_review_comment",
    "pull_request_approved",
    "pull_request_rejected",
    "wiki",
    "repository",
    "release",
    "package",
    "action_run_failure",
    "action_run_recover",
    "action_run_success",
    "status",
    "schedule",
    "workflow_dispatch",
];

/// Why a delivery was not queued. One variant per HTTP answer family.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The body is larger than `SHEPHERD_MAX_BODY_BYTES` → 413.
    #[error("body larger than {0} bytes")]
    TooLarge(usize),
    /// The body could not be read from the connection → 400.
    #[error("cannot read the request body")]
    BodyRead,
    /// The body did not arrive within [`BODY_TIMEOUT`] (a slow or stalled sender) → 408.
    #[error("request body not received in time")]
    BodyTimeout,
    /// The request's headers add up to more than [`MAX_HEADER_BYTES`] → 431.
    #[error("request headers too large")]
    HeadersTooLarge,
    /// A content type Forgejo never sends (only JSON and form are accepted) → 415.
    #[error("unsupported content type (use application/json or application/x-www-form-urlencoded)")]
    UnsupportedMediaType,
    /// A `Content-Encoding` other than `identity` on an API body → 415. Nothing is
    /// decompressed there (issue 12, finding 2: 5 KB of gzip inflated to megabytes).
    #[error("compressed request bodies are not accepted (send Content-Encoding: identity)")]
    Encoded,
    /// Missing, empty or wrong signature → 401.
    #[error("{0}")]
    Signature(#[from] SignatureError),
    /// Signed but unusable: headers or payload → 400.
    #[error("{0}")]
    Malformed(#[from] DeliveryError),
    /// Redis is down, slow, or the process is at its in-flight bound → 503.
    #[error("queue unavailable: {0}")]
    Unavailable(#[from] StoreError),
    /// Too many deliveries in flight to Redis for the timeout → 503.
    #[error("too many deliveries in flight")]
    Overloaded,
}

impl IngestError {
    /// The `outcome` metric label.
    fn outcome(&self) -> &'static str {
        match self {
            Self::TooLarge(_) => "too_large",
            Self::BodyRead
            | Self::BodyTimeout
            | Self::HeadersTooLarge
            | Self::UnsupportedMediaType
            | Self::Encoded
            | Self::Malformed(_) => "bad_request",
            Self::Signature(_) => "bad_signature",
            Self::Unavailable(_) | Self::Overloaded => "unavailable",
        }
    }
}

impl ResponseError for IngestError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyRead | Self::Malformed(_) => StatusCode::BAD_REQUEST,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::UnsupportedMediaType | Self::Encoded => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Signature(_) => StatusCode::UNAUTHORIZED,
            Self::Unavailable(_) | Self::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut resp = HttpResponse::build(self.status_code());
        let message = match self {
            // Never say which check failed to an unauthenticated sender.
            Self::Signature(_) => "invalid signature".to_owned(),
            // Never leak Redis internals.
            Self::Unavailable(_) | Self::Overloaded => {
                resp.insert_header((header::RETRY_AFTER, RETRY_AFTER_SECS));
                "queue unavailable, retry later".to_owned()
            }
            other => other.to_string(),
        };
        resp.json(json!({ "error": message }))
    }
}

/// The webhook handler: times the request and counts its outcome.
#[instrument(skip_all, fields(delivery, event, repo))]
pub async fn receive(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
) -> Result<HttpResponse, IngestError> {
    let start = Instant::now();
    let result = ingest(&state, &req, body).await;
    let (event, outcome) = match &result {
        Ok(a) if matches!(a.outcome, Enqueued::New(_)) => (a.event.as_str(), "queued"),
        Ok(a) => (a.event.as_str(), "duplicate"),
        Err(e) => (claimed_event(req.headers()), e.outcome()),
    };
    let metrics = &state.metrics;
    metrics
        .deliveries
        .with_label_values(&[metric_event(event), outcome])
        .inc();
    metrics
        .ingest_latency
        .with_label_values(&[outcome])
        .observe(start.elapsed().as_secs_f64());
    match result {
        Ok(Accepted {
            delivery,
            outcome: Enqueued::New(id),
            ..
        }) => Ok(HttpResponse::Accepted().json(json!({ "delivery": delivery, "id": id }))),
        Ok(Accepted {
            delivery,
            outcome: Enqueued::Duplicate(id),
            ..
        }) => {
            Ok(HttpResponse::Ok()
                .json(json!({ "duplicate": true, "delivery": delivery, "id": id })))
        }
        Err(e) => {
            match &e {
                IngestError::Signature(reason) => {
                    metrics.signature_failures.inc();
                    tracing::info!(%reason, "delivery refused: signature");
                }
                IngestError::Unavailable(err) => {
                    metrics.redis_errors.with_label_values(&["enqueue"]).inc();
                    tracing::warn!(error = %err, "delivery refused: redis unavailable");
                }
                _ => tracing::info!(error = %e, "delivery refused"),
            }
            Err(e)
        }
    }
}

/// A delivery that made it into Redis (new or duplicate).
struct Accepted {
    /// Its fine-grained event type.
    event: String,
    /// Its delivery id.
    delivery: String,
    /// New entry or duplicate.
    outcome: Enqueued,
}

/// Body → verified → classified → queued. Returns the event type with the outcome.
async fn ingest(
    state: &AppState,
    req: &HttpRequest,
    body: web::Payload,
) -> Result<Accepted, IngestError> {
    let limit = state.config.max_body_bytes;
    let headers = req.headers();
    // actix bounds a request head at 128 KiB; Forgejo's headers are about 1 KiB.
    let header_bytes: usize = headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len())
        .sum();
    if header_bytes > MAX_HEADER_BYTES {
        return Err(IngestError::HeadersTooLarge);
    }
    let form = body_is_form(headers)?;
    let body = tokio::time::timeout(BODY_TIMEOUT, read_body(req, body, limit))
        .await
        .map_err(|_| IngestError::BodyTimeout)??;
    let get = |name: &str| headers.get(name).map(|v| v.as_bytes());
    let tag = signature::signature_from_headers(get)?;
    let signed = signature::signed_bytes(body, form);
    // Unverified: this name only picks which secrets may have signed the payload. It
    // is the canonical name, the same one the delivery is routed by (finding 1 of
    // issue 12: a trimmed name used to route, the raw one to pick the secrets).
    let claimed = delivery::repository_of(&signed);
    let secrets = match &claimed {
        Ok(repo) => state.webhook_secrets.candidates(repo),
        // Refused with 400 once signed with the secrets of the nearest canonical name
        // (401 otherwise): never queued either way, and checked against one scope's
        // secrets like any delivery, not every configured secret (an unsigned 5 MiB
        // body must not cost one HMAC per secret).
        Err(DeliveryError::BadRepository(_, nearest)) => state.webhook_secrets.candidates(nearest),
        Err(_) => state.webhook_secrets.candidates(""),
    };
    let verified = signature::verify(signed, &tag, secrets)?;
    let received_ms = chrono::Utc::now().timestamp_millis();
    let delivery = Delivery::classify_probed(verified, get, received_ms, claimed)?;
    let span = tracing::Span::current();
    span.record("delivery", delivery.id());
    span.record("event", delivery.event());
    span.record("repo", delivery.repo());
    // This worker thread's own connection when the app has one, else the shared one.
    let mut conn = req
        .app_data::<web::Data<WorkerRedis>>()
        .map_or_else(|| state.redis.clone(), |local| local.0.clone());
    let outcome = enqueue(state, &mut conn, &delivery).await?;
    if matches!(outcome, Enqueued::New(_))
        && let Err(e) = state.enqueuer.record_repo(&mut conn, delivery.repo()).await
    {
        // The delivery is durably queued; the repo set is only an index for resync.
        state
            .metrics
            .redis_errors
            .with_label_values(&["repos"])
            .inc();
        tracing::warn!(error = %e, "cannot record the repository");
    }
    accept_log::log_accepted(&delivery, matches!(outcome, Enqueued::Duplicate(_)));
    Ok(Accepted {
        event: delivery.event().to_owned(),
        delivery: delivery.id().to_owned(),
        outcome,
    })
}

/// Takes an in-flight permit (bounded, waiting at most the Redis timeout), then runs
/// the atomic dedup+append.
async fn enqueue(
    state: &AppState,
    conn: &mut crate::store::Conn,
    delivery: &Delivery,
) -> Result<Enqueued, IngestError> {
    let timeout: Duration = state.config.redis_timeout;
    let _permit = tokio::time::timeout(timeout, state.in_flight.acquire())
        .await
        .map_err(|_| IngestError::Overloaded)?
        .map_err(|_| IngestError::Overloaded)?;
    Ok(delivery.enqueue(&state.enqueuer, conn).await?)
}

/// The body of an authenticated API request (results and admin APIs), read only
/// after the caller checked the bearer token from the headers: at most `limit` bytes,
/// within [`BODY_TIMEOUT`] like a webhook, and never decompressed (a
/// `Content-Encoding` other than `identity` is refused before a byte is read).
pub async fn read_api_body(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<bytes::Bytes, IngestError> {
    if let Some(enc) = req.headers().get(header::CONTENT_ENCODING)
        && !enc
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"identity")
    {
        return Err(IngestError::Encoded);
    }
    tokio::time::timeout(BODY_TIMEOUT, read_body(req, payload, limit))
        .await
        .map_err(|_| IngestError::BodyTimeout)?
}

/// Reads the whole body, refusing early on a `Content-Length` over the limit and
/// stopping as soon as the streamed body passes it.
async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<bytes::Bytes, IngestError> {
    let declared =
        header_str(req.headers(), "content-length").and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(IngestError::TooLarge(limit));
    }
    // The first chunk is kept as is: a body that arrives in one piece is never copied.
    let mut first: Option<bytes::Bytes> = None;
    let mut buf = BytesMut::new();
    let mut total = 0usize;
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| IngestError::BodyRead)?;
        total += chunk.len();
        if total > limit {
            return Err(IngestError::TooLarge(limit));
        }
        match first.take() {
            None if buf.is_empty() => first = Some(chunk),
            None => buf.extend_from_slice(&chunk),
            Some(head) => {
                buf.reserve(declared.unwrap_or(total * 2).min(limit));
                buf.extend_from_slice(&head);
                buf.extend_from_slice(&chunk);
            }
        }
    }
    Ok(first.unwrap_or_else(|| buf.freeze()))
}

/// Whether the body is a form (`payload=<json>`) rather than raw JSON. A missing
/// content type counts as JSON; anything but JSON or form is refused before the body
/// is read (Forgejo sends only those two).
fn body_is_form(headers: &HeaderMap) -> Result<bool, IngestError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(false);
    };
    let value = value
        .to_str()
        .map_err(|_| IngestError::UnsupportedMediaType)?;
    if signature::is_form(Some(value)) {
        return Ok(true);
    }
    let media = value.split(';').next().unwrap_or_default().trim();
    if media.eq_ignore_ascii_case("application/json") {
        Ok(false)
    } else {
        Err(IngestError::UnsupportedMediaType)
    }
}

/// A header as UTF-8 text, when present and valid.
fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The event type a request claims (unverified; for metrics of refusals only).
fn claimed_event(headers: &HeaderMap) -> &str {
    EVENT_HEADERS
        .iter()
        .find_map(|h| header_str(headers, h))
        .unwrap_or("unknown")
}

/// Bounds the `event` label to known names.
fn metric_event(event: &str) -> &str {
    KNOWN_EVENTS
        .iter()
        .find(|k| **k == event)
        .copied()
        .unwrap_or(if event == "unknown" {
            "unknown"
        } else {
            "other"
        })
}
