//! The HTTP surface: webhook ingest (signature verification, classification,
//! dedup+append), health, readiness and metrics, the results API, the admin API and
//! the status page. `crate::app::http` mounts all of it on one server.
//!
//! Building blocks:
//! - [`AppState`]: configuration, metrics, the shared Redis connection, the enqueuer;
//!   handlers receive it as `web::Data<AppState>`;
//! - [`configure`]: the ingest routes (`/webhooks/forgejo`, `/webhooks/gitea`,
//!   `/healthz`, `/readyz`, `/metrics`); [`results_api::configure`] and
//!   [`admin::routes`] mount the rest.
//!
//! Redis is reached through one multiplexed [`Conn`] (reconnecting on its
//! own), every call bounded by `SHEPHERD_REDIS_TIMEOUT_MS`, and at most
//! [`MAX_IN_FLIGHT`] deliveries wait on it at once: past that a delivery gets 503
//! rather than a place in an unbounded queue.

pub mod accept_log;
pub mod admin;
pub mod delivery;
pub mod probe;
pub mod results_api;
pub mod secrets;
pub mod signature;
pub mod status_page;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

use actix_web::{HttpResponse, web};
use anyhow::Context;
use tokio::sync::Semaphore;

pub use delivery::Delivery;
pub use secrets::WebhookSecrets;
pub use signature::Verified;

use crate::config::Config;
use crate::store::client::LazyOptions;
use crate::store::enqueue::Enqueuer;
use crate::store::{Conn, Keys};
use crate::telemetry::Metrics;

/// Most deliveries waiting on Redis at once per process (beyond: 503).
pub const MAX_IN_FLIGHT: usize = 512;

/// Longest time a client may take to send the request line and headers (then 408 and
/// the connection is closed). Forgejo sends everything at once; only a slow-loris
/// client needs more.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest time a client may take to send a webhook body (then 408; see
/// `webhook::read_body`). Well inside Forgejo's own 5 s delivery timeout.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(3);

/// State shared by every handler of the HTTP app.
pub struct AppState {
    /// Validated configuration.
    pub config: Arc<Config>,
    /// Metric families (cheap to clone; shared with the rest of the process).
    pub metrics: Metrics,
    /// The process's multiplexed Redis connection; clone it per call.
    pub redis: Conn,
    /// Redis key layout.
    pub keys: Keys,
    /// Dedup+append of verified deliveries.
    pub enqueuer: Enqueuer,
    /// Secrets that may sign a delivery, per repository (global and `[webhooks]`).
    pub webhook_secrets: WebhookSecrets,
    /// Bound on deliveries waiting on Redis ([`MAX_IN_FLIGHT`]).
    pub in_flight: Semaphore,
}

impl AppState {
    /// Builds the state. The Redis connection is made lazily (and re-made after
    /// failures), so the server starts and answers 503 while Redis is away.
    /// Fails when no webhook secret is configured at all, or when the policy file
    /// names an unset `secret_env` variable.
    pub fn new(config: Arc<Config>, metrics: Metrics) -> anyhow::Result<Self> {
        let policy = crate::config::load_policy(&config)?;
        let webhook_secrets = WebhookSecrets::resolve(&config.webhook_secrets, &policy, |name| {
            std::env::var(name).ok()
        })?;
        let redis = connect_lazy(&config)?;
        let keys = Keys::new(config.key_prefix.clone(), config.shards);
        let enqueuer = Enqueuer::new(keys.clone(), config.retention, config.redis_timeout)
            .with_wait_replicas(config.redis_wait_replicas);
        Ok(Self {
            config,
            metrics,
            redis,
            keys,
            enqueuer,
            webhook_secrets,
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
        })
    }
}

/// The Redis connection of one HTTP worker thread. Each actix worker runs its own
/// single-threaded runtime; a connection created there is driven on that same thread,
/// so the webhook path never hands a request to another thread and back (measured:
/// a quarter of the server's CPU went to those cross-thread wake-ups with one shared
/// connection; docs/benchmarks.md).
pub struct WorkerRedis(pub Conn);

/// A lazily connecting, self-reconnecting multiplexed connection with every timeout
/// set from `SHEPHERD_REDIS_TIMEOUT_MS`.
pub fn connect_lazy(config: &Config) -> anyhow::Result<Conn> {
    crate::store::client::connect_lazy(
        &config.redis,
        LazyOptions {
            connect_timeout: config.redis_timeout,
            response_timeout: config.redis_timeout,
            retries: 2,
            delays: Some((Duration::from_millis(10), Duration::from_millis(200))),
            pipeline_buffer: Some(MAX_IN_FLIGHT),
        },
    )
    .context("SHEPHERD_REDIS_URL is not a usable Redis URL")
}

/// Mounts the ingest routes on an app or scope.
pub fn configure(cfg: &mut web::ServiceConfig) {
    for path in ["/webhooks/forgejo", "/webhooks/gitea"] {
        // A resource (not `cfg.route`) so that other methods get 405, not 404.
        cfg.service(
            web::resource(path)
                .route(web::post().to(webhook::receive))
                .default_service(web::to(post_only)),
        );
    }
    cfg.route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics));
}

/// Any method but POST on a webhook path: 405 with `Allow: POST`.
async fn post_only() -> HttpResponse {
    HttpResponse::MethodNotAllowed()
        .insert_header((actix_web::http::header::ALLOW, "POST"))
        .finish()
}

/// `GET /healthz`: the process is up.
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().body("ok\n")
}

/// `GET /readyz`: Redis answers a `PING` within the timeout.
async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let mut conn = state.redis.clone();
    let ping = crate::store::enqueue::ping(&mut conn);
    match tokio::time::timeout(state.config.redis_timeout, ping).await {
        Ok(Ok(_)) => HttpResponse::Ok().body("ready\n"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "not ready: redis");
            HttpResponse::ServiceUnavailable().body("redis unavailable\n")
        }
        Err(_) => HttpResponse::ServiceUnavailable().body("redis timeout\n"),
    }
}

/// `GET /metrics`: Prometheus text format.
async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(state.metrics.render())
}
