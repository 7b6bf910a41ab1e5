//! A circuit breaker per Forgejo host. After `threshold` consecutive failures that make
//! the host look unhealthy (timeouts, connection errors, 429, 5xx) it opens: calls fail
//! fast with a retryable [`ForgejoError::CircuitOpen`] instead of piling onto a dead
//! server. After `cooldown` it lets one probe through (half-open); the probe's success
//! closes it, its failure opens it for another cool-down.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::IntGauge;

use super::ForgejoError;

/// Tuning of a [`CircuitBreaker`].
#[derive(Debug, Clone, Copy)]
pub struct BreakerConfig {
    /// Consecutive host failures that open the circuit.
    pub threshold: u32,
    /// How long the circuit stays open before a probe is let through.
    pub cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            threshold: 5,
            cooldown: Duration::from_secs(30),
        }
    }
}

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through; counts consecutive failures.
    Closed {
        /// Consecutive host failures so far.
        failures: u32,
    },
    /// Calls fail fast until the instant.
    Open {
        /// When a probe may go through.
        until: Instant,
    },
    /// One probe is in flight; other calls fail fast until it reports (or, if the
    /// probe was abandoned without reporting, until another cool-down has passed).
    HalfOpen {
        /// When the probe was let through.
        since: Instant,
    },
}

/// The breaker of one host. Shared by every clone of a client.
#[derive(Debug)]
pub struct CircuitBreaker {
    /// Host name, for errors and the gauge label.
    host: String,
    /// Tuning.
    config: BreakerConfig,
    /// Current state.
    state: Mutex<BreakerState>,
    /// `circuit_open{host}` gauge, when metrics are wired.
    gauge: Option<IntGauge>,
}

impl CircuitBreaker {
    /// A closed breaker for `host`.
    pub fn new(host: impl Into<String>, config: BreakerConfig, gauge: Option<IntGauge>) -> Self {
        if let Some(g) = &gauge {
            g.set(0);
        }
        Self {
            host: host.into(),
            config,
            state: Mutex::new(BreakerState::Closed { failures: 0 }),
            gauge,
        }
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        *self.lock()
    }

    /// Asks to make a call: `Ok` to go ahead (possibly as the half-open probe), or a
    /// `CircuitOpen` error to fail fast.
    pub fn acquire(&self) -> Result<(), ForgejoError> {
        let mut state = self.lock();
        match *state {
            BreakerState::Closed { .. } => Ok(()),
            BreakerState::Open { until } => {
                let now = Instant::now();
                if now >= until {
                    *state = BreakerState::HalfOpen { since: now };
                    Ok(())
                } else {
                    Err(self.open_error(until - now))
                }
            }
            BreakerState::HalfOpen { since } => {
                let now = Instant::now();
                if now.duration_since(since) >= self.config.cooldown {
                    *state = BreakerState::HalfOpen { since: now };
                    Ok(())
                } else {
                    Err(self.open_error(self.config.cooldown - now.duration_since(since)))
                }
            }
        }
    }

    /// Reports a call's result. Answers that show the host is alive (any 2xx, and
    /// 4xx other than 429) count as success.
    pub fn record<T>(&self, result: &Result<T, ForgejoError>) {
        let failed = matches!(result, Err(e) if e.counts_against_host());
        if matches!(result, Err(ForgejoError::CircuitOpen { .. })) {
            return;
        }
        let mut state = self.lock();
        let next = match (*state, failed) {
            (_, false) => BreakerState::Closed { failures: 0 },
            (BreakerState::Closed { failures }, true)
                if failures.saturating_add(1) < self.config.threshold =>
            {
                BreakerState::Closed {
                    failures: failures + 1,
                }
            }
            (BreakerState::Open { until }, true) => BreakerState::Open { until },
            (_, true) => BreakerState::Open {
                until: Instant::now() + self.config.cooldown,
            },
        };
        if next != *state {
            let open = matches!(next, BreakerState::Open { .. });
            if open && !matches!(*state, BreakerState::Open { .. }) {
                tracing::warn!(host = %self.host, "Forgejo circuit breaker opened");
            } else if matches!(next, BreakerState::Closed { failures: 0 })
                && !matches!(*state, BreakerState::Closed { .. })
            {
                tracing::info!(host = %self.host, "Forgejo circuit breaker closed");
            }
            if let Some(g) = &self.gauge {
                g.set(i64::from(!matches!(next, BreakerState::Closed { .. })));
            }
            *state = next;
        }
    }

    fn open_error(&self, retry_after: Duration) -> ForgejoError {
        ForgejoError::CircuitOpen {
            host: self.host.clone(),
            retry_after,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BreakerState> {
        // A poisoned lock only means another thread panicked mid-update of a Copy
        // value; the value itself is always valid.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout() -> Result<(), ForgejoError> {
        Err(ForgejoError::Timeout {
            method: "GET".into(),
            path: "/x".into(),
        })
    }

    fn not_found() -> Result<(), ForgejoError> {
        Err(ForgejoError::Status {
            code: 404,
            method: "GET".into(),
            path: "/x".into(),
            message: String::new(),
            retry_after: None,
        })
    }

    #[test]
    fn opens_after_threshold_and_probes_after_cooldown() {
        let gauge = IntGauge::new("g", "g").unwrap();
        let b = CircuitBreaker::new(
            "h",
            BreakerConfig {
                threshold: 3,
                cooldown: Duration::from_millis(30),
            },
            Some(gauge.clone()),
        );
        for _ in 0..2 {
            b.acquire().unwrap();
            b.record(&timeout());
        }
        b.record(&not_found());
        assert_eq!(b.state(), BreakerState::Closed { failures: 0 });
        for _ in 0..3 {
            b.acquire().unwrap();
            b.record(&timeout());
        }
        assert!(matches!(b.state(), BreakerState::Open { .. }));
        assert_eq!(gauge.get(), 1);
        let e = b.acquire().unwrap_err();
        assert!(e.is_retryable() && e.retry_after().is_some());
        std::thread::sleep(Duration::from_millis(40));
        b.acquire().expect("probe allowed after the cool-down");
        assert!(b.acquire().is_err(), "only one probe at a time");
        b.record(&timeout());
        assert!(matches!(b.state(), BreakerState::Open { .. }));
        std::thread::sleep(Duration::from_millis(40));
        b.acquire().unwrap();
        b.record(&Ok(()));
        assert_eq!(b.state(), BreakerState::Closed { failures: 0 });
        assert_eq!(gauge.get(), 0);
    }
}
