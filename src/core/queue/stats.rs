//! Analytics of one branch's queue (issue 29, docs/merge-queue.md "Analytics"): the
//! time in queue of recent merges, kept bounded in the queue itself so the
//! percentiles of the last 24 h and 7 d survive restarts and need no other key, and
//! the figures derived from the counters.

use serde::{Deserialize, Serialize};

use super::QueueStats;

/// Most merges whose time in queue is kept (about 12 an hour for 7 days with a 5-minute
/// CI; beyond that the oldest samples go first, so the 7-day figures then cover fewer
/// days, which [`WaitSummary::count`] shows).
pub const WAITS_KEPT: usize = 2_000;

/// How long a sample is kept: the longest window reported.
pub const WEEK_MS: i64 = 7 * DAY_MS;

/// One day in ms.
pub const DAY_MS: i64 = 86_400_000;

/// The time in queue of one merged PR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitSample {
    /// When it merged (unix ms).
    pub at_ms: i64,
    /// First entry to merge, ms.
    pub wait_ms: u64,
}

/// Percentiles of the time in queue over a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitSummary {
    /// Merges in the window.
    pub count: u64,
    /// Median, ms (nearest rank).
    pub p50_ms: u64,
    /// 90th percentile, ms (nearest rank).
    pub p90_ms: u64,
    /// Longest, ms.
    pub max_ms: u64,
}

impl QueueStats {
    /// Counts a merge after `wait_ms` in the queue, at `now_ms`.
    pub fn record_merge(&mut self, now_ms: i64, wait_ms: u64) {
        self.merged += 1;
        self.merged_wait_ms = self.merged_wait_ms.saturating_add(wait_ms);
        self.recent_waits.push_back(WaitSample {
            at_ms: now_ms,
            wait_ms,
        });
        while self.recent_waits.len() > WAITS_KEPT
            || (self.recent_waits.front()).is_some_and(|s| s.at_ms < now_ms - WEEK_MS)
        {
            self.recent_waits.pop_front();
        }
    }

    /// The time in queue of the PRs merged in the `window_ms` before `now_ms`.
    pub fn waits(&self, now_ms: i64, window_ms: i64) -> WaitSummary {
        let mut w: Vec<u64> = (self.recent_waits.iter())
            .filter(|s| s.at_ms > now_ms - window_ms && s.at_ms <= now_ms)
            .map(|s| s.wait_ms)
            .collect();
        w.sort_unstable();
        WaitSummary {
            count: u64::try_from(w.len()).unwrap_or(u64::MAX),
            p50_ms: nearest_rank(&w, 50),
            p90_ms: nearest_rank(&w, 90),
            max_ms: w.last().copied().unwrap_or(0),
        }
    }
}

impl QueueStats {
    /// Batches green on their first test, of those tested for the first time (`None`
    /// before the first batch: the serial queue has none).
    pub fn first_pass(&self) -> Option<(u64, u64)> {
        (self.batches_first_tested > 0)
            .then_some((self.batches_first_pass_green, self.batches_first_tested))
    }

    /// CI runs of the batched queue per PR merged (`None` before both exist).
    pub fn ci_runs_per_merge(&self) -> Option<f64> {
        (self.ci_runs > 0 && self.merged > 0).then(|| self.ci_runs as f64 / self.merged as f64)
    }
}

/// The `pct` percentile of sorted `v` by nearest rank (0 when empty).
fn nearest_rank(v: &[u64], pct: usize) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let rank = (pct * v.len()).div_ceil(100).max(1);
    v[rank.min(v.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_window_and_bounded_samples() {
        let now = 30 * DAY_MS;
        let mut s = QueueStats::default();
        // Ten merges in the last hour: 1 … 10 minutes in queue.
        for i in 1..=10u64 {
            s.record_merge(now - 3_600_000 + i64::try_from(i).unwrap(), i * 60_000);
        }
        let day = s.waits(now, DAY_MS);
        assert_eq!(day.count, 10);
        assert_eq!(day.p50_ms, 5 * 60_000);
        assert_eq!(day.p90_ms, 9 * 60_000);
        assert_eq!(day.max_ms, 10 * 60_000);
        assert_eq!(s.merged, 10);
        assert_eq!(s.merged_wait_ms, 55 * 60_000);
        // Two days later the day window is empty, the week still has them.
        let later = now + 2 * DAY_MS;
        assert_eq!(s.waits(later, DAY_MS), WaitSummary::default());
        assert_eq!(s.waits(later, WEEK_MS).count, 10);
        // A merge eight days later drops every sample older than a week.
        s.record_merge(now + 8 * DAY_MS, 1_000);
        assert_eq!(s.recent_waits.len(), 1);
        assert_eq!(s.waits(now + 8 * DAY_MS, WEEK_MS).max_ms, 1_000);
        // The count of samples is bounded.
        for i in 0..(WAITS_KEPT + 50) {
            s.record_merge(now + 8 * DAY_MS + i64::try_from(i).unwrap(), 5);
        }
        assert_eq!(s.recent_waits.len(), WAITS_KEPT);
        assert_eq!(s.merged, 11 + u64::try_from(WAITS_KEPT + 50).unwrap());
    }
}
