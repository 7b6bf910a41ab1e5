//! The worker's own small HTTP endpoint on `SHEPHERD_LISTEN`: `GET /healthz` (process
//! up) and `GET /metrics` (Prometheus text), for pod probes and scraping. A worker that
//! cannot bind (another Shepherd process holds the address) logs it and works on.
//!
//! The endpoint runs on actix's own thread, so it would answer while the process's
//! tokio threads are all stuck. `shepherd agents` therefore gives it a [`Watchdog`]:
//! a task on the runtime beats every second, and `/healthz` answers 503, saying why,
//! when the beat is older than [`STALL`] (every worker thread stuck) or a read of a
//! file an agent wrote is stuck on the blocking pool
//! (`crate::agents::outcome::STUCK_READS`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix_web::{App, HttpResponse, HttpServer, web};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::telemetry::Metrics;

/// How old the runtime's beat may be before `/healthz` fails.
pub const STALL: Duration = Duration::from_secs(10);

/// The runtime's heartbeat, read by `/healthz` on another thread.
#[derive(Clone)]
pub struct Watchdog {
    /// When it started.
    epoch: Instant,
    /// Milliseconds after `epoch` of the last beat.
    beat_ms: Arc<AtomicU64>,
}

impl Watchdog {
    /// Starts beating on the current tokio runtime until `shutdown`.
    pub fn start(shutdown: CancellationToken) -> Self {
        let dog = Self {
            epoch: Instant::now(),
            beat_ms: Arc::new(AtomicU64::new(0)),
        };
        let beat = dog.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => beat.beat(),
                    () = shutdown.cancelled() => return,
                }
            }
        });
        dog
    }

    /// Records a beat now.
    fn beat(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.beat_ms.store(ms, Ordering::SeqCst);
    }

    /// `Err` (why) when the runtime has not beaten within `stall`, or an agent file
    /// read is stuck.
    pub fn check(&self, stall: Duration) -> Result<(), String> {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let age = now.saturating_sub(self.beat_ms.load(Ordering::SeqCst));
        if age > u64::try_from(stall.as_millis()).unwrap_or(u64::MAX) {
            return Err(format!(
                "the runtime's worker threads have not run for {} s",
                age / 1000
            ));
        }
        let stuck = crate::agents::outcome::STUCK_READS.load(Ordering::SeqCst);
        if stuck > 0 {
            return Err(format!(
                "{stuck} read(s) of files agents wrote are stuck on their threads"
            ));
        }
        Ok(())
    }
}

/// `GET /healthz`: 200 `ok`, or 503 with the watchdog's reason.
async fn healthz(dog: web::Data<Option<Watchdog>>) -> HttpResponse {
    match dog.as_ref().as_ref().map(|d| d.check(STALL)) {
        Some(Err(why)) => HttpResponse::ServiceUnavailable().body(format!("unhealthy: {why}\n")),
        _ => HttpResponse::Ok().body("ok\n"),
    }
}

/// Serves `/healthz` and `/metrics` until `shutdown`.
pub async fn serve(config: &Config, metrics: Metrics, shutdown: CancellationToken) {
    serve_watched(config, metrics, None, shutdown).await;
}

/// [`serve`], with `/healthz` following `watchdog`.
pub async fn serve_watched(
    config: &Config,
    metrics: Metrics,
    watchdog: Option<Watchdog>,
    shutdown: CancellationToken,
) {
    let listen = config.listen;
    let data = web::Data::new(metrics);
    let dog = web::Data::new(watchdog);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .app_data(dog.clone())
            .route("/healthz", web::get().to(healthz))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_fails_while_a_read_of_an_agent_file_is_stuck() {
        use crate::agents::outcome::STUCK_READS;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dog = rt.block_on(async {
            let dog = Watchdog::start(CancellationToken::new());
            tokio::time::sleep(Duration::from_millis(50)).await;
            dog
        });
        assert_eq!(dog.check(STALL), Ok(()));
        // As `read_agent_file_off_thread` counts a read past its time limit.
        STUCK_READS.fetch_add(1, Ordering::SeqCst);
        let e = dog.check(STALL).unwrap_err();
        assert!(
            e.contains("1 read(s) of files agents wrote are stuck"),
            "{e}"
        );
        STUCK_READS.fetch_sub(1, Ordering::SeqCst);
        assert_eq!(dog.check(STALL), Ok(()));
    }

    #[test]
    fn the_watchdog_fails_while_every_worker_thread_is_stuck() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dog = rt.block_on(async { Watchdog::start(CancellationToken::new()) });
        let stall = Duration::from_secs(1);
        let healthy = |dog: &Watchdog| {
            (0..100).any(|_| {
                std::thread::sleep(Duration::from_millis(100));
                dog.check(stall).is_ok()
            })
        };
        assert!(healthy(&dog), "{:?}", dog.check(stall));
        // Both worker threads block (as reads of FIFOs on the async threads did), until
        // released.
        let (started_tx, started) = std::sync::mpsc::channel();
        let mut releases = Vec::new();
        for _ in 0..2 {
            let (release_tx, release) = std::sync::mpsc::channel::<()>();
            releases.push(release_tx);
            let started_tx = started_tx.clone();
            rt.spawn(async move {
                started_tx.send(()).unwrap();
                let _ = release.recv();
            });
        }
        started.recv().unwrap();
        started.recv().unwrap();
        std::thread::sleep(stall * 3);
        let e = dog.check(stall).unwrap_err();
        assert!(e.contains("have not run"), "{e}");
        // Once the threads are free, the beat resumes and health comes back.
        drop(releases);
        assert!(healthy(&dog), "{:?}", dog.check(stall));
    }
}
