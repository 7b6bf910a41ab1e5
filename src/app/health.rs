//! The worker's own small HTTP endpoint on `SHEPHERD_LISTEN`: `GET /healthz` (process
//! up) and `GET /metrics` (Prometheus text), for pod probes and scraping. A worker that
//! cannot bind (another Shepherd process holds the address) logs it and works on.

use actix_web::{App, HttpResponse, HttpServer, web};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::telemetry::Metrics;

/// Serves `/healthz` and `/metrics` until `shutdown`.
pub async fn serve(config: &Config, metrics: Metrics, shutdown: CancellationToken) {
    let listen = config.listen;
    let data = web::Data::new(metrics);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route(
                "/healthz",
                web::get().to(|| async { HttpResponse::Ok().body("ok\n") }),
            )
            .route("/metrics", web::get().to(render))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .bind(listen);
    let server = match server {
        Ok(s) => s.run(),
        Err(e) => {
            tracing::warn!(%listen, error = %e, "cannot serve /healthz and /metrics (SHEPHERD_LISTEN); working without them");
            return;
        }
    };
    tracing::info!(%listen, "worker health and metrics endpoint listening");
    let handle = server.handle();
    let stopper = tokio::spawn(async move {
        shutdown.cancelled().await;
        handle.stop(true).await;
    });
    if let Err(e) = server.await {
        tracing::warn!(error = %e, "health endpoint failed");
    }
    stopper.abort();
}

/// `GET /metrics`.
async fn render(metrics: web::Data<Metrics>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(metrics.render())
}
