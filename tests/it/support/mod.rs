//! Test support: spawn redis-server on free ports, start Shepherd, a fake Forgejo,
//! signing helpers, and polling with deadlines (never sleeps to wait for results).

pub mod fake_forgejo;
pub mod git_remote;
pub mod model_stub;
pub mod openapi;
pub mod opencode;
pub mod redis;
pub mod scenario;
pub mod shepherd;
pub mod webhook;

use std::future::Future;
use std::time::{Duration, Instant};

/// The webhook secret every test instance accepts by default.
pub const TEST_SECRET: &str = "it-webhook-secret";

/// Policy for processes whose tests count history entries or effects: the timers the
/// default policy arms for real (the stale check fires a day after the last activity)
/// are set explicitly here, far beyond any test's run, so no test depends on the date
/// or on whether a timer poll happens to run before its assertion. Likewise
/// `agent_authors = "anyone"`: no permission read of a PR's author joins the effects
/// these tests count (the gate has its own tests: `core::machine::tests::authors`,
/// `scenarios::authors`).
pub const QUIET_POLICY: &str = "\
[defaults]
stale_after_secs = 31536000
agent_authors = \"anyone\"
";

/// The time fixtures are dated from: the test process's start, less one hour, in
/// whole seconds (Forgejo's `updated_at` has second resolution). Fixture times are
/// relative to it, never to a calendar date.
pub fn fixture_epoch_secs() -> i64 {
    static EPOCH: std::sync::LazyLock<i64> =
        std::sync::LazyLock::new(|| chrono::Utc::now().timestamp() - 3_600);
    *EPOCH
}

/// `secs` after [`fixture_epoch_secs`] as RFC 3339 UTC (`…Z`), as Forgejo writes times.
pub fn fixture_time(secs: i64) -> String {
    chrono::DateTime::from_timestamp(fixture_epoch_secs() + secs, 0)
        .expect("a representable time")
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

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

/// Reads an HTTP response head from `stream` and returns its status code (0 when the
/// connection closed without one). Panics past `deadline`.
pub async fn read_status(stream: &mut tokio::net::TcpStream, deadline: Duration) -> u16 {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            match tokio::io::AsyncReadExt::read(stream, &mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    };
    tokio::time::timeout(deadline, read)
        .await
        .expect("the server answers in time");
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}
