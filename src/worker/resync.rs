//! Periodic resync (DESIGN §5): Forgejo never retries a failed delivery, so every
//! `SHEPHERD_RESYNC_INTERVAL_SECS` one worker reads every known repository's open PRs
//! from the API and feeds them in as observations (`crate::ops::resync`).
//!
//! One worker at a time: a worker resyncs only after taking `Keys::resync_lock()` with
//! `SET NX PX <interval>`. The lock is not released after the run — it expires — so
//! however many workers run, the fleet resyncs once per interval; if the holder dies,
//! the lock expires and another worker takes the next turn.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::forgejo::ForgejoClient;
use crate::ops::{Ops, resync};
use crate::store::{StoreError, markers};

/// Runs the periodic resync until `shutdown`; returns at once when the interval is
/// off or Forgejo is not configured. Failures are logged, never fatal to the worker.
pub async fn run_periodic_resync(
    config: Arc<Config>,
    owner: String,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Some(interval) = config.resync_interval else {
        return Ok(());
    };
    let client = match ForgejoClient::from_config(&config, None) {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(error = %e, "periodic resync off: no Forgejo API configured");
            return Ok(());
        }
    };
    let ops = Ops::connect(config.clone())?;
    // The first turn comes one interval after start: a restarted fleet does not
    // hammer the API, and `shepherd resync --all` is there for right after an outage.
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(interval) => {}
        }
        match take_turn(&ops, &owner, interval).await {
            Ok(false) => tracing::debug!("another worker holds the resync turn"),
            Ok(true) => run_once(&ops, &client).await,
            Err(e) => tracing::warn!(error = %e, "resync lock: redis failed"),
        }
    }
}

/// One resync of every known repository.
async fn run_once(ops: &Ops, client: &ForgejoClient) {
    let repos = match resync::known_repos(ops).await {
        Ok(r) => r,
        Err(e) => return tracing::warn!(error = %e, "periodic resync: listing repositories failed"),
    };
    match resync::resync_repos(ops, client, &repos).await {
        Ok(report) => {
            let queued: usize = report.repos.iter().map(|r| r.queued).sum();
            let errors: usize = report.repos.iter().map(|r| r.errors.len()).sum();
            tracing::info!(repos = repos.len(), queued, errors, "periodic resync done");
        }
        Err(e) => tracing::warn!(error = %e, "periodic resync failed"),
    }
}

/// Takes this interval's resync turn (`SET NX PX`); true when it is ours.
async fn take_turn(ops: &Ops, owner: &str, interval: Duration) -> Result<bool, StoreError> {
    markers::take_resync_turn(&mut ops.conn(), &ops.keys, owner, interval).await
}
