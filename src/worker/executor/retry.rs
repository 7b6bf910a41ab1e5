//! The retry budget of transient failures: exponential backoff with full jitter, never
//! sooner than the server's `Retry-After` (or the circuit breaker's cool-down), and a
//! budget of tries and of total time after which the failure is reported to the
//! machine. Pure, so it is tested without Redis or time.

use std::time::Duration;

use rand::Rng;

/// How transient failures are retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries in all (the first included) before giving up.
    pub max_tries: u32,
    /// Longest time from the first try to the last.
    pub budget: Duration,
    /// Smallest delay, and the unit of the exponential ceiling.
    pub base: Duration,
    /// Largest ceiling of the jittered delay.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_tries: 10,
            budget: Duration::from_secs(600),
            base: Duration::from_millis(500),
            cap: Duration::from_secs(120),
        }
    }
}

/// What to do after a transient failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Try again after this delay.
    RetryIn(Duration),
    /// The budget is spent: report the failure.
    GiveUp,
}

impl RetryPolicy {
    /// The decision after try number `tries` (1 = the first) failed, `elapsed` after the
    /// first try, with the server's `retry_after`; `unit` is a random draw in `[0, 1)`.
    pub fn next(
        &self,
        tries: u32,
        elapsed: Duration,
        retry_after: Option<Duration>,
        unit: f64,
    ) -> Next {
        if tries >= self.max_tries {
            return Next::GiveUp;
        }
        let exp = self
            .base
            .saturating_mul(1u32 << tries.saturating_sub(1).min(20));
        let ceiling = exp.min(self.cap);
        // Full jitter over the ceiling, plus the base so a retry never spins.
        let jittered = self.base + ceiling.mul_f64(unit.clamp(0.0, 1.0));
        let delay = jittered.max(retry_after.unwrap_or_default());
        if elapsed + delay > self.budget {
            return Next::GiveUp;
        }
        Next::RetryIn(delay)
    }

    /// [`RetryPolicy::next`] with a fresh random draw.
    pub fn next_random(
        &self,
        tries: u32,
        elapsed: Duration,
        retry_after: Option<Duration>,
    ) -> Next {
        let unit: f64 = rand::rng().random_range(0.0..1.0);
        self.next(tries, elapsed, retry_after, unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_with_jitter_and_a_floor() {
        let p = RetryPolicy::default();
        let d = |tries, unit| match p.next(tries, Duration::ZERO, None, unit) {
            Next::RetryIn(d) => d,
            Next::GiveUp => panic!("gave up"),
        };
        assert_eq!(d(1, 0.0), p.base);
        assert_eq!(d(1, 0.999_999).as_millis(), 999);
        assert_eq!(d(4, 1.0), p.base + p.base * 8);
        assert_eq!(d(9, 1.0), p.base + p.cap, "capped");
    }

    #[test]
    fn honours_retry_after() {
        let p = RetryPolicy::default();
        let next = p.next(1, Duration::ZERO, Some(Duration::from_secs(7)), 0.0);
        assert_eq!(next, Next::RetryIn(Duration::from_secs(7)));
    }

    #[test]
    fn gives_up_after_the_budget() {
        let p = RetryPolicy::default();
        assert_eq!(p.next(10, Duration::ZERO, None, 0.0), Next::GiveUp);
        assert_eq!(
            p.next(2, Duration::from_millis(599_500), None, 0.5),
            Next::GiveUp,
            "no time left"
        );
        assert!(matches!(
            p.next(9, Duration::from_secs(10), None, 0.5),
            Next::RetryIn(_)
        ));
    }
}
