//! `POST /webhooks/forgejo` (and `/webhooks/gitea`): read the body once under the size
//! limit, verify, classify, dedup+append, answer (DESIGN §3). Every refusal is an
//! [`IngestError`], turned into an HTTP answer in exactly one place
//! ([`ResponseError`] below), with a short message and no internals.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderMap};
use actix_web::{HttpRequest, HttpResponse, ResponseError, web};
use bytes::BytesMut;
use futures_util::StreamExt;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::instrument;

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
const KNOWN_EVENTS: [&str; 31] = [
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
    log_accepted(
        &ACCEPTED,
        &delivery,
        matches!(outcome, Enqueued::Duplicate(_)),
    );
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

/// Accepted deliveries logged one line each per second; above this, one summary line
/// a second instead.
pub const SINGLE_LINES_PER_SECOND: u64 = 50;

/// The process's log of accepted deliveries.
static ACCEPTED: AcceptLog = AcceptLog::new();

/// Counter slots: one per [`KNOWN_EVENTS`] entry, then one for every other event.
const EVENT_SLOTS: usize = KNOWN_EVENTS.len() + 1;

/// Bits of the window word holding the count of the current second.
const COUNT_BITS: u32 = 21;
/// Largest count kept (the count saturates there).
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
/// Bit of the window word set when the whole second is summarised (the second
/// before it was above the limit).
const QUIET: u64 = 1 << COUNT_BITS;
/// Shift of the unix second in the window word.
const SECOND_SHIFT: u32 = COUNT_BITS + 1;

/// The rate limiter of the accepted-delivery lines, lock-free on the ingest path: one
/// atomic word holds the current second, its count so far and whether the whole
/// second is summarised (it follows a second above the limit, so a sustained load
/// logs one summary a second and nothing else); the summarised deliveries are counted
/// per event in atomics of the second's parity, read and reset once when the second
/// is closed (by the next delivery of a later second, or by [`summarise_deliveries`]).
/// Nothing is allocated per delivery beyond the one line itself.
pub struct AcceptLog {
    /// `second << SECOND_SHIFT | QUIET? | count`.
    window: AtomicU64,
    /// Summarised deliveries per event slot, by the parity of their second.
    summarised: [[AtomicU64; EVENT_SLOTS]; 2],
}

/// What to do with one accepted delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// Log it on a line of its own.
    Line,
    /// Only counted: the second's summary line shows it.
    Counted,
}

/// A closed second in which some deliveries were summarised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The unix second.
    pub second: u64,
    /// Deliveries accepted in it (logged singly or summarised).
    pub accepted: u64,
    /// Summarised deliveries by event type (event names bounded like the metric's).
    pub counts: Vec<(&'static str, u64)>,
}

impl Summary {
    /// Summarised deliveries in all.
    pub fn summarised(&self) -> u64 {
        self.counts.iter().map(|(_, n)| n).sum()
    }
}

impl Default for AcceptLog {
    fn default() -> Self {
        Self::new()
    }
}

impl AcceptLog {
    /// An empty log (no second open yet).
    pub const fn new() -> Self {
        Self {
            window: AtomicU64::new(0),
            summarised: [
                [const { AtomicU64::new(0) }; EVENT_SLOTS],
                [const { AtomicU64::new(0) }; EVENT_SLOTS],
            ],
        }
    }

    /// Notes one accepted delivery of `event` in unix second `second`: whether it gets
    /// a line of its own, and the summary of the second this one closed, if any.
    pub fn note(&self, second: u64, event: &str) -> (Note, Option<Summary>) {
        let step = |w| Some(advance(w, second, 1));
        let prev = match self
            .window
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, step)
        {
            Ok(w) | Err(w) => w,
        };
        let next = advance(prev, second, 1);
        let (current, quiet, count) = unpack(next);
        let note = if quiet || count > SINGLE_LINES_PER_SECOND {
            self.summarised[parity(current)][event_slot(event)].fetch_add(1, Ordering::Relaxed);
            Note::Counted
        } else {
            Note::Line
        };
        (note, self.close(prev, next))
    }

    /// Closes the open second when `now` (a unix second) is past it, returning its
    /// summary when it has one. Called about every quarter second, so the summary of a
    /// burst is written even when no delivery follows it.
    pub fn tick(&self, now: u64) -> Option<Summary> {
        let step = |w| (unpack(w).0 < now).then(|| advance(w, now, 0));
        let prev = self
            .window
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, step)
            .ok()?;
        self.close(prev, advance(prev, now, 0))
    }

    /// The summary of the second `prev` held, when the step to `next` left it (only
    /// the one caller whose update moved the window reads and resets its counters).
    fn close(&self, prev: u64, next: u64) -> Option<Summary> {
        let (second, _, accepted) = unpack(prev);
        if unpack(next).0 == second {
            return None;
        }
        let counts: Vec<(&'static str, u64)> = self.summarised[parity(second)]
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| {
                let n = c.swap(0, Ordering::AcqRel);
                (n > 0).then(|| (slot_event(slot), n))
            })
            .collect();
        (!counts.is_empty()).then_some(Summary {
            second,
            accepted,
            counts,
        })
    }
}

/// The window word after `add` deliveries in `second`: a later second opens a new
/// window (summarised as a whole when it directly follows one above the limit); the
/// same or an earlier second (another thread read the clock a moment before) counts in
/// the open window.
fn advance(window: u64, second: u64, add: u64) -> u64 {
    let (open, quiet, count) = unpack(window);
    if second > open {
        let quiet = second == open + 1 && count > SINGLE_LINES_PER_SECOND;
        pack(second, quiet, add)
    } else {
        pack(open, quiet, (count + add).min(COUNT_MAX))
    }
}

fn pack(second: u64, quiet: bool, count: u64) -> u64 {
    (second << SECOND_SHIFT) | if quiet { QUIET } else { 0 } | count.min(COUNT_MAX)
}

fn unpack(window: u64) -> (u64, bool, u64) {
    (
        window >> SECOND_SHIFT,
        window & QUIET != 0,
        window & COUNT_MAX,
    )
}

fn parity(second: u64) -> usize {
    (second % 2) as usize
}

fn event_slot(event: &str) -> usize {
    KNOWN_EVENTS
        .iter()
        .position(|k| *k == event)
        .unwrap_or(KNOWN_EVENTS.len())
}

fn slot_event(slot: usize) -> &'static str {
    KNOWN_EVENTS.get(slot).copied().unwrap_or("other")
}

/// Logs an accepted delivery through `log`: its own `info` line, or only counted
/// (and a summary line when this delivery closed a summarised second).
fn log_accepted(log: &AcceptLog, delivery: &Delivery, duplicate: bool) {
    let second = u64::try_from(delivery.received_ms() / 1000).unwrap_or(0);
    let (note, closed) = log.note(second, delivery.event());
    if let Some(summary) = closed {
        log_summary(&summary);
    }
    if note == Note::Counted {
        return;
    }
    let repo = Some(delivery.repo())
        .filter(|r| !r.is_empty())
        .map(tracing::field::display);
    let number = number_of(delivery.verified().payload());
    let (event, id) = (delivery.event(), delivery.id());
    // Outside the request's span: the line carries its own fields.
    if duplicate {
        tracing::info!(parent: None, event = %event, repo, number, delivery = %id,
            "delivery already queued (a redelivery)");
    } else {
        tracing::info!(parent: None, event = %event, repo, number, delivery = %id,
            "delivery queued");
    }
}

/// One line for a second in which more than [`SINGLE_LINES_PER_SECOND`] deliveries
/// arrived (or that followed such a second).
fn log_summary(s: &Summary) {
    let at = chrono::DateTime::from_timestamp(i64::try_from(s.second).unwrap_or(0), 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default();
    let per_event = s
        .counts
        .iter()
        .map(|(e, n)| format!("{e}={n}"))
        .collect::<Vec<_>>()
        .join(",");
    tracing::info!(
        parent: None,
        second = %at,
        accepted = s.accepted,
        summarised = s.summarised(),
        per_event = %per_event,
        "deliveries summarised: more than {SINGLE_LINES_PER_SECOND} a second"
    );
}

/// Closes each second of the accepted-delivery log as it passes, writing its summary
/// line, until `shutdown` (then the open second is closed too). Started with the HTTP
/// server.
pub async fn summarise_deliveries(shutdown: CancellationToken) {
    let now = || u64::try_from(chrono::Utc::now().timestamp()).unwrap_or(0);
    let mut every = tokio::time::interval(Duration::from_millis(250));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = every.tick() => {}
        }
        if let Some(summary) = ACCEPTED.tick(now()) {
            log_summary(&summary);
        }
    }
    if let Some(summary) = ACCEPTED.tick(now() + 1) {
        log_summary(&summary);
    }
}

/// The pull request or issue number a payload is about, when it names one: `number`
/// (pull request events), else `pull_request.number` (reviews), else `issue.number`
/// (issue and comment events). Parsed only for deliveries that get a line.
fn number_of(payload: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Numbered {
        number: Option<u64>,
    }
    #[derive(serde::Deserialize)]
    struct Payload {
        number: Option<u64>,
        pull_request: Option<Numbered>,
        issue: Option<Numbered>,
    }
    let p: Payload = serde_json::from_slice(payload).ok()?;
    p.number
        .or(p.pull_request.and_then(|n| n.number))
        .or(p.issue.and_then(|n| n.number))
}

#[cfg(test)]
mod accept_log_tests {
    use super::*;

    #[test]
    fn low_rates_get_a_line_each_and_no_summary() {
        let log = AcceptLog::new();
        for second in 100..103 {
            for _ in 0..SINGLE_LINES_PER_SECOND {
                assert_eq!(log.note(second, "push"), (Note::Line, None));
            }
        }
        assert_eq!(log.tick(200), None);
    }

    #[test]
    fn above_the_limit_the_rest_of_the_second_is_counted_then_summarised() {
        let log = AcceptLog::new();
        for _ in 0..SINGLE_LINES_PER_SECOND {
            assert_eq!(log.note(10, "push").0, Note::Line);
        }
        assert_eq!(log.note(10, "push").0, Note::Counted);
        assert_eq!(log.note(10, "pull_request").0, Note::Counted);
        assert_eq!(log.note(10, "no_such_event").0, Note::Counted);
        assert_eq!(log.tick(10), None, "the second is still open");
        let summary = log.tick(11).expect("closing the second summarises it");
        assert_eq!(summary.second, 10);
        assert_eq!(summary.accepted, SINGLE_LINES_PER_SECOND + 3);
        assert_eq!(
            summary.counts,
            vec![("push", 1), ("pull_request", 1), ("other", 1)]
        );
        assert_eq!(log.tick(12), None, "a second is summarised once");
    }

    #[test]
    fn a_second_after_one_above_the_limit_is_summarised_whole() {
        let log = AcceptLog::new();
        for _ in 0..=SINGLE_LINES_PER_SECOND {
            log.note(20, "push");
        }
        // The first delivery of the next second closes the previous one.
        let (note, closed) = log.note(21, "status");
        assert_eq!(note, Note::Counted);
        assert_eq!(closed.expect("second 20 closed").counts, vec![("push", 1)]);
        assert_eq!(log.note(21, "status").0, Note::Counted);
        let summary = log.tick(22).expect("second 21 summarised");
        assert_eq!((summary.accepted, summary.summarised()), (2, 2));
        // Quiet seconds reset it: after a gap, lines again.
        assert_eq!(log.note(30, "push").0, Note::Line);
    }

    #[test]
    fn a_late_clock_reading_counts_in_the_open_second() {
        let log = AcceptLog::new();
        log.note(40, "push");
        assert_eq!(log.note(39, "push"), (Note::Line, None));
        assert_eq!(unpack(log.window.load(Ordering::Acquire)), (40, false, 2));
    }

    #[test]
    fn numbers_come_from_the_payload_kinds_that_have_one() {
        assert_eq!(
            number_of(br#"{"number": 7, "pull_request": {"number": 7}}"#),
            Some(7)
        );
        assert_eq!(number_of(br#"{"pull_request": {"number": 8}}"#), Some(8));
        assert_eq!(
            number_of(br#"{"issue": {"number": 9}, "comment": {}}"#),
            Some(9)
        );
        assert_eq!(
            number_of(br#"{"ref": "refs/heads/main", "pull_request": null}"#),
            None
        );
        assert_eq!(number_of(b"{not json"), None);
    }
}
