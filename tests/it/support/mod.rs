//! Test support: spawn redis-server on free ports, start Shepherd, a fake Forgejo,
//! signing helpers, and polling with deadlines (never sleeps to wait for results).

pub mod fake_forgejo;
pub mod redis;
pub mod scenario;
pub mod shepherd;
pub mod webhook;

use std::future::Future;
use std::time::{Duration, Instant};

/// The webhook secret every test instance accepts by default.
pub const TEST_SECRET: &str = "it-webhook-secret";

/// Interval between two checks of a condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls `cond` until it holds; panics when `deadline` passes first.
pub async fn poll_until<F, Fut>(deadline: Duration, cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll_until_named(deadline, "a condition holds", cond).await;
}

/// Polls `cond` until it holds; panics naming `what` when `deadline` passes first.
pub async fn poll_until_named<F, Fut>(deadline: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + deadline;
    loop {
        if cond().await {
            return;
        }
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting until {what}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
