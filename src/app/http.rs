//! The HTTP server of `serve` and `run`: [`routes`] mounts every route Shepherd
//! answers, and [`serve`] runs an actix `HttpServer` with them on `SHEPHERD_LISTEN`
//! until the shutdown token is cancelled.
//!
//! | path | handler |
//! |---|---|
//! | `POST /webhooks/forgejo`, `POST /webhooks/gitea` | `ingest::webhook` |
//! | `GET /healthz`, `GET /readyz`, `GET /metrics` | `ingest` |
//! | `POST /api/v1/work/{id}/result` | `ingest::results_api` |
//! | `/api/v1/admin/…` | `ingest::admin` |
//! | `GET /` (status page) | `ingest::status_page` |

use std::time::Duration;

use actix_web::{App, HttpServer, web};
use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::ingest::{self, AppState, HEAD_TIMEOUT, WorkerRedis, admin, results_api};

/// Seconds the server waits for in-flight requests after shutdown is requested.
const SHUTDOWN_GRACE_SECS: u64 = 10;

/// Every route of the HTTP server: the ingest routes (webhooks, health, readiness,
/// metrics), the results API, the admin API and the status page. The admin routes
/// carry the operator tools' own Redis connection, made here once.
pub fn routes(
    state: &AppState,
) -> anyhow::Result<impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static> {
    let admin = admin::routes(state)?;
    Ok(move |cfg: &mut web::ServiceConfig| {
        ingest::configure(cfg);
        results_api::configure(cfg);
        admin(cfg);
    })
}

/// Runs the HTTP server on `SHEPHERD_LISTEN` with [`routes`] until `shutdown` is
/// cancelled; then stops accepting, lets in-flight requests finish (up to a grace
/// period) and returns.
pub async fn serve(state: AppState, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mount = routes(&state)?;
    let state = web::Data::new(state);
    let listen = state.config.listen;
    let max_body = state.config.max_body_bytes;
    {
        // Best effort: load the script now so the first delivery needs no retry.
        let mut conn = state.redis.clone();
        if let Err(e) = state.enqueuer.preload(&mut conn).await {
            tracing::warn!(error = %e, "redis not reachable at start; answering 503 until it is");
        }
    }
    let app_state = state.clone();
    let server = HttpServer::new(move || {
        let mount = mount.clone();
        // Runs on each worker thread: the connection's driver task lands there too.
        // The URL was already accepted by AppState::new, so this cannot fail.
        let local =
            ingest::connect_lazy(&app_state.config).expect("the Redis URL was validated at start");
        App::new()
            .app_data(app_state.clone())
            .app_data(web::Data::new(WorkerRedis(local)))
            .app_data(web::PayloadConfig::new(max_body))
            .configure(mount)
    })
    .disable_signals()
    .client_request_timeout(HEAD_TIMEOUT)
    .client_disconnect_timeout(Duration::from_secs(1))
    .shutdown_timeout(SHUTDOWN_GRACE_SECS)
    .bind(listen)
    .with_context(|| format!("cannot listen on {listen} (SHEPHERD_LISTEN)"))?
    .run();
    tracing::info!(%listen, "listening");
    let handle = server.handle();
    // Writes the per-second summary of accepted deliveries above 50 a second.
    let summaries = shutdown.child_token();
    let summariser = tokio::spawn(ingest::accept_log::summarise_deliveries(summaries.clone()));
    let stopper = tokio::spawn(async move {
        shutdown.cancelled().await;
        handle.stop(true).await;
    });
    let result = server.await.context("HTTP server failed");
    stopper.abort();
    summaries.cancel();
    let _ = summariser.await;
    result
}
