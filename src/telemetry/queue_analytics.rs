//! The merge queues' analytics on `/metrics` (issue 29, docs/operations.md §6): per
//! branch, the time in queue over the last 24 h and 7 d, ejections by reason, the
//! batched queue's totals (batches, first-pass green, CI runs, flaky re-tests and
//! the checks they saved), and whether the queue is frozen. The percentiles are computed from the samples stored
//! with the queue (`core::queue::stats`) and the totals are the stored ones, so every
//! process shows the same figures (aggregate with `max`, not `sum`); the ejection counter counts what this process
//! applied, like the other counters.

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts};

use crate::core::queue::stats::{DAY_MS, WEEK_MS};
use crate::core::queue::{BranchQueue, QueueAction, QueueOp};

/// Families of the queues' analytics.
#[derive(Clone)]
pub struct QueueAnalytics {
    /// Time in queue of the PRs merged in a window (`window`: `24h`, `7d`; `stat`:
    /// `p50`, `p90`, `max`, seconds; `count`).
    pub time_in_queue: GaugeVec,
    /// Ejections by branch and reason (`merge_queue_ejections_total` has the reason
    /// only).
    pub ejections: IntCounterVec,
    /// 1 while a branch's queue is frozen (by hand, or a window seen at the last
    /// advance of its head), else 0.
    pub frozen: IntGaugeVec,
    /// The batched queue's stored totals per branch (`figure`: `batches_tested`,
    /// `batches_first_tested`, `batches_first_pass_green`, `ci_runs`, `flaky_retries`,
    /// `flaky_saved`), as of the last op.
    pub batches: IntGaugeVec,
    /// Suspected-flaky checks per branch: failed, then passed on a re-test.
    pub flaky_checks: IntGaugeVec,
}

impl QueueAnalytics {
    /// The families, not yet registered.
    pub(super) fn new() -> Self {
        Self {
            time_in_queue: GaugeVec::new(
                Opts::new(
                    "merge_queue_time_in_queue_seconds",
                    "Time in queue of the PRs merged in the last 24h or 7d: p50, p90, max (seconds) and count",
                ),
                &["repo", "branch", "window", "stat"],
            )
            .expect("valid metric"),
            ejections: IntCounterVec::new(
                Opts::new(
                    "merge_queue_branch_ejections_total",
                    "Merge queue ejections by branch and reason",
                ),
                &["repo", "branch", "reason"],
            )
            .expect("valid metric"),
            batches: IntGaugeVec::new(
                Opts::new(
                    "merge_queue_batch_figures",
                    "The batched merge queue's stored totals by branch and figure",
                ),
                &["repo", "branch", "figure"],
            )
            .expect("valid metric"),
            flaky_checks: IntGaugeVec::new(
                Opts::new(
                    "merge_queue_flaky_checks",
                    "Checks that failed and then passed on a re-test, by branch and context",
                ),
                &["repo", "branch", "context"],
            )
            .expect("valid metric"),
            frozen: IntGaugeVec::new(
                Opts::new("merge_queue_frozen", "1 while a branch's merge queue is frozen"),
                &["repo", "branch"],
            )
            .expect("valid metric"),
        }
    }

    /// The collectors to register.
    pub(super) fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.time_in_queue.clone()),
            Box::new(self.ejections.clone()),
            Box::new(self.frozen.clone()),
            Box::new(self.batches.clone()),
            Box::new(self.flaky_checks.clone()),
        ]
    }

    /// After an op changed (or not) `queue` at `now_ms`: the ejection counter and the
    /// time-in-queue figures.
    pub(super) fn op_applied(
        &self,
        repo: &str,
        op: &QueueOp,
        queue: &BranchQueue,
        changed: bool,
        now_ms: i64,
    ) {
        let branch = op.branch.as_str();
        if let (true, QueueAction::Park { reason } | QueueAction::Requeue { reason }) =
            (changed, &op.action)
        {
            (self.ejections)
                .with_label_values(&[repo, branch, reason.as_str()])
                .inc();
        }
        self.stored_figures(repo, branch, queue, now_ms);
    }

    /// Sets the gauges read from `queue`'s stored figures (totals, flaky checks, time
    /// in queue) as of `now_ms`: after every write of the queue, an op's or a batch
    /// step's, so a batch that landed shows at once and not at the next op.
    pub(super) fn stored_figures(
        &self,
        repo: &str,
        branch: &str,
        queue: &BranchQueue,
        now_ms: i64,
    ) {
        let s = &queue.stats;
        for (figure, n) in [
            ("batches_tested", s.batches_tested),
            ("batches_first_tested", s.batches_first_tested),
            ("batches_first_pass_green", s.batches_first_pass_green),
            ("ci_runs", s.ci_runs),
            ("flaky_retries", s.flaky_retries),
            ("flaky_saved", s.flaky_saved),
        ] {
            (self.batches)
                .with_label_values(&[repo, branch, figure])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        for (context, n) in &s.flaky_checks {
            (self.flaky_checks)
                .with_label_values(&[repo, branch, context])
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        for (window, ms) in [("24h", DAY_MS), ("7d", WEEK_MS)] {
            let w = queue.stats.waits(now_ms, ms);
            for (stat, value) in [
                ("p50", w.p50_ms as f64 / 1000.0),
                ("p90", w.p90_ms as f64 / 1000.0),
                ("max", w.max_ms as f64 / 1000.0),
                ("count", w.count as f64),
            ] {
                (self.time_in_queue)
                    .with_label_values(&[repo, branch, window, stat])
                    .set(value);
            }
        }
    }
}
