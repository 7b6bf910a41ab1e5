//! Logging and metrics. Logs go through `tracing` (text or JSON lines on stderr);
//! metrics are Prometheus families in one [`Metrics`] value, created once per process
//! and shared by reference, rendered at `GET /metrics`.

use prometheus::{
    CounterVec, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::config::LogFormat;

mod queue_analytics;
pub use queue_analytics::QueueAnalytics;

/// Installs the global tracing subscriber. Safe to call more than once (later calls
/// are ignored), so tests and `run` can share it.
pub fn init_logging(format: LogFormat, filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        // Colours only on a terminal: a log file or a pipe gets plain `key=value` text.
        LogFormat::Text => registry
            .with(
                fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_target(false)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
}

/// Every metric Shepherd exports. Label values are bounded (event types, outcomes,
/// effect kinds, stream names), never ids.
#[derive(Clone)]
pub struct Metrics {
    /// Registry the families below are registered in.
    pub registry: Registry,
    /// Webhook deliveries by fine-grained event type and outcome
    /// (`queued`, `duplicate`, `bad_signature`, `bad_request`, `too_large`, `unavailable`).
    pub deliveries: IntCounterVec,
    /// Deliveries refused for a missing, empty or wrong signature.
    pub signature_failures: IntCounter,
    /// Time from request start to answer on the webhook path, by outcome.
    pub ingest_latency: HistogramVec,
    /// Redis errors and timeouts by operation.
    pub redis_errors: IntCounterVec,
    /// Events processed by the workers, by event kind and outcome.
    pub events_processed: IntCounterVec,
    /// Compare-and-set conflicts when committing a transition.
    pub commit_conflicts: IntCounter,
    /// Effects executed, by kind and outcome.
    pub effects: IntCounterVec,
    /// End-to-end lag in seconds by stage (`committed`: delivery received → transition
    /// committed; `executed`: delivery received → effect executed).
    pub lag: HistogramVec,
    /// Pending (unacked) entries per stream/group, and dead letters, sampled.
    pub queue_gauges: IntGaugeVec,
    /// 1 while the circuit breaker for a Forgejo host is open.
    pub circuit_open: IntGaugeVec,
    /// Dollars left under each budget cap that is set, by scope (`instance-daily`,
    /// `org-monthly:<owner>`, `repo-daily:<owner/repo>`, …), sampled from the ledger;
    /// negative past a cap.
    pub budget_remaining_usd: GaugeVec,
    /// Forgejo API requests sent, by endpoint template and cause (`forgejo::Cause`).
    pub forgejo_calls: IntCounterVec,
    /// PRs the resync looked at, by what it did (`read` with the reason, or `skipped`).
    pub resync_prs: IntCounterVec,
    /// Combined-status reads of one head by the CI poll's backoff, observed when the
    /// poll of that head ends (settled, a new head, or an Actions event took over).
    pub ci_poll_reads: prometheus::Histogram,
    /// The agent runner's families (`shepherd agents`).
    pub agents: AgentMetrics,
    /// The merge queue's families (issue 16).
    pub merge_queue: QueueMetrics,
    /// The merge queues' analytics per branch (issue 29).
    pub queue_analytics: QueueAnalytics,
    /// Reviewer agents' rounds (`review` work), counted by the workers.
    pub reviews: ReviewMetrics,
}

/// Reviewer agents' rounds, counted where the workers commit a PR's step.
#[derive(Clone)]
pub struct ReviewMetrics {
    /// `review` work items dispatched (one per round).
    pub dispatched: IntCounter,
    /// Verdicts read from reviewer agents' formal reviews, by verdict
    /// (`approved`, `changes-requested`).
    pub verdicts: IntCounterVec,
    /// Review rounds of a PR when it merged.
    pub rounds_per_merged_pr: prometheus::Histogram,
}

impl ReviewMetrics {
    fn new() -> Self {
        Self {
            dispatched: IntCounter::new(
                "reviews_dispatched_total",
                "Review work items dispatched to reviewer agents (one per round)",
            )
            .expect("valid metric"),
            verdicts: IntCounterVec::new(
                Opts::new(
                    "review_verdicts_total",
                    "Reviewer agents' verdicts read from their formal reviews",
                ),
                &["verdict"],
            )
            .expect("valid metric"),
            rounds_per_merged_pr: prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "review_rounds_per_merged_pr",
                    "Reviewer-agent rounds a PR had when it merged",
                )
                .buckets(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0]),
            )
            .expect("valid metric"),
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.dispatched.clone()),
            Box::new(self.verdicts.clone()),
            Box::new(self.rounds_per_merged_pr.clone()),
        ]
    }
}

/// Metrics of the merge queues, updated by the executor as it applies queue ops and
/// advances heads. Labels: repository and branch (bounded by the repositories served),
/// ejection reason and update outcome (fixed sets). Updates per merge is
/// `merge_queue_updates_total{outcome="updated"} / merge_queue_merged_total`.
#[derive(Clone)]
pub struct QueueMetrics {
    /// PRs waiting to be tested (head included) per branch, after the last op.
    pub length: IntGaugeVec,
    /// PRs merged through the queue, per branch.
    pub merged: IntCounterVec,
    /// Time from first entering the queue to the merge.
    pub wait: HistogramVec,
    /// Ejections (parks and moves to the back) by reason.
    pub ejections: IntCounterVec,
    /// Updates of a head onto the tip by outcome (`updated`, `conflict`, `other`).
    pub updates: IntCounterVec,
}

impl QueueMetrics {
    fn new() -> Self {
        let rb = &["repo", "branch"];
        Self {
            length: IntGaugeVec::new(
                Opts::new(
                    "merge_queue_length",
                    "PRs waiting in a branch's merge queue",
                ),
                rb,
            )
            .expect("valid metric"),
            merged: IntCounterVec::new(
                Opts::new("merge_queue_merged_total", "PRs merged through the queue"),
                rb,
            )
            .expect("valid metric"),
            wait: HistogramVec::new(
                HistogramOpts::new(
                    "merge_queue_wait_seconds",
                    "Time in the merge queue, first entry to merge",
                )
                .buckets(vec![
                    1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0,
                ]),
                rb,
            )
            .expect("valid metric"),
            ejections: IntCounterVec::new(
                Opts::new(
                    "merge_queue_ejections_total",
                    "Merge queue ejections by reason",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            updates: IntCounterVec::new(
                Opts::new(
                    "merge_queue_updates_total",
                    "Updates of a queue head onto its branch tip by outcome",
                ),
                &["outcome"],
            )
            .expect("valid metric"),
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.length.clone()),
            Box::new(self.merged.clone()),
            Box::new(self.wait.clone()),
            Box::new(self.ejections.clone()),
            Box::new(self.updates.clone()),
        ]
    }
}

/// Metrics of the agent runner. Labels: work kind, tier name (bounded by the policy's
/// tier list) and outcome (`succeeded`, `failed`, `no-changes`, `transient`, `timeout`,
/// `cancelled`, `released`).
#[derive(Clone)]
pub struct AgentMetrics {
    /// Agents running now in this process.
    pub running: IntGauge,
    /// Agents started, by kind and tier.
    pub started: IntCounterVec,
    /// Agents finished, by kind, tier and outcome.
    pub finished: IntCounterVec,
    /// Run time of an agent (start → exit), by kind.
    pub duration: HistogramVec,
    /// Tokens agents used (live usage or result files), by repository, kind, model
    /// and type (`input`, `output`, `reasoning`, `cache_read`, `cache_write`).
    pub tokens: IntCounterVec,
    /// What agents cost in USD (live usage or result files), by repository, kind and
    /// model.
    pub cost: CounterVec,
    /// Agents the runner stopped for a limit, by reason (`over-budget`, `over-steps`,
    /// `over-tool-calls`, `idle`, `loop`).
    pub stopped: IntCounterVec,
    /// Work items refused by the binding check (`agents::binding`), by reason.
    pub refused: IntCounterVec,
    /// Runs reported `transient` (a model provider's 429/5xx, overload or timeout, by
    /// `transient_patterns` or the result file; issue 27), by kind.
    pub transient: IntCounterVec,
    /// CPU seconds the live usage meter spent parsing agent output
    /// (`SHEPHERD_AGENT_USAGE=opencode-json`), each feed of an output chunk timed with
    /// the reading thread's CPU clock (issue 28).
    pub usage_meter_cpu: prometheus::Counter,
}

impl AgentMetrics {
    fn new() -> Self {
        let kt = &["kind", "tier"];
        Self {
            running: IntGauge::new("agents_running", "Agents running now in this process")
                .expect("valid metric"),
            started: IntCounterVec::new(
                Opts::new("agents_started_total", "Agents started by kind and tier"),
                kt,
            )
            .expect("valid metric"),
            finished: IntCounterVec::new(
                Opts::new(
                    "agents_finished_total",
                    "Agents finished by kind, tier and outcome",
                ),
                &["kind", "tier", "outcome"],
            )
            .expect("valid metric"),
            duration: HistogramVec::new(
                HistogramOpts::new("agent_run_seconds", "Agent run time, start to exit").buckets(
                    vec![
                        0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0,
                    ],
                ),
                &["kind"],
            )
            .expect("valid metric"),
            tokens: IntCounterVec::new(
                Opts::new(
                    "agent_tokens_total",
                    "Tokens agents used, by repository, kind, model and type",
                ),
                &["repo", "kind", "model", "type"],
            )
            .expect("valid metric"),
            cost: CounterVec::new(
                Opts::new(
                    "agent_cost_usd_total",
                    "What agents cost in USD, by repository, kind and model",
                ),
                &["repo", "kind", "model"],
            )
            .expect("valid metric"),
            stopped: IntCounterVec::new(
                Opts::new(
                    "agent_runs_stopped_total",
                    "Agents the runner stopped for a limit, by reason",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            refused: IntCounterVec::new(
                Opts::new(
                    "agent_items_refused_total",
                    "Work items not run, posted or reported because they do not match \
                     the record's active work, by reason",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            transient: IntCounterVec::new(
                Opts::new(
                    "agent_transient_total",
                    "Agent runs reported transient (model provider 429/5xx, overload, \
                     timeout), retried without an attempt, by kind",
                ),
                &["kind"],
            )
            .expect("valid metric"),
            usage_meter_cpu: prometheus::Counter::new(
                "agent_usage_meter_cpu_seconds_total",
                "CPU seconds the live usage meter spent parsing agent output \
                 (thread CPU clock around each chunk fed)",
            )
            .expect("valid metric"),
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.running.clone()),
            Box::new(self.started.clone()),
            Box::new(self.finished.clone()),
            Box::new(self.duration.clone()),
            Box::new(self.tokens.clone()),
            Box::new(self.cost.clone()),
            Box::new(self.stopped.clone()),
            Box::new(self.refused.clone()),
            Box::new(self.transient.clone()),
            Box::new(self.usage_meter_cpu.clone()),
        ]
    }
}

impl Metrics {
    /// Creates and registers every family.
    pub fn new() -> Self {
        let registry =
            Registry::new_custom(Some("shepherd".into()), None).expect("a static prefix is valid");
        let deliveries = IntCounterVec::new(
            Opts::new(
                "deliveries_total",
                "Webhook deliveries by event type and outcome",
            ),
            &["event", "outcome"],
        )
        .expect("valid metric");
        let signature_failures = IntCounter::new(
            "signature_failures_total",
            "Deliveries refused for a missing, empty or wrong signature",
        )
        .expect("valid metric");
        let ingest_latency = HistogramVec::new(
            HistogramOpts::new("ingest_latency_seconds", "Webhook request latency").buckets(vec![
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["outcome"],
        )
        .expect("valid metric");
        let redis_errors = IntCounterVec::new(
            Opts::new(
                "redis_errors_total",
                "Redis errors and timeouts by operation",
            ),
            &["op"],
        )
        .expect("valid metric");
        let events_processed = IntCounterVec::new(
            Opts::new(
                "events_processed_total",
                "Events processed by kind and outcome",
            ),
            &["event", "outcome"],
        )
        .expect("valid metric");
        let commit_conflicts = IntCounter::new(
            "commit_conflicts_total",
            "Compare-and-set conflicts when committing a transition",
        )
        .expect("valid metric");
        let effects = IntCounterVec::new(
            Opts::new("effects_total", "Effects executed by kind and outcome"),
            &["kind", "outcome"],
        )
        .expect("valid metric");
        let lag = HistogramVec::new(
            HistogramOpts::new("lag_seconds", "Delivery received → stage reached").buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0,
            ]),
            &["stage"],
        )
        .expect("valid metric");
        let queue_gauges = IntGaugeVec::new(
            Opts::new("queue_entries", "Pending entries and dead letters, sampled"),
            &["stream", "kind"],
        )
        .expect("valid metric");
        let budget_remaining_usd = GaugeVec::new(
            Opts::new(
                "budget_remaining_usd",
                "Dollars left under each budget cap that is set (negative past it), sampled",
            ),
            &["scope"],
        )
        .expect("valid metric");
        let circuit_open = IntGaugeVec::new(
            Opts::new(
                "forgejo_circuit_open",
                "1 while the breaker for a Forgejo host is open",
            ),
            &["host"],
        )
        .expect("valid metric");
        let forgejo_calls = IntCounterVec::new(
            Opts::new(
                "forgejo_api_calls_total",
                "Forgejo API requests by endpoint and cause",
            ),
            &["endpoint", "cause"],
        )
        .expect("valid metric");
        let resync_prs = IntCounterVec::new(
            Opts::new(
                "resync_prs_total",
                "Open PRs the resync looked at, by decision (read reason or skipped)",
            ),
            &["decision"],
        )
        .expect("valid metric");
        let ci_poll_reads = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "ci_poll_reads_per_head",
                "Backoff reads of one head's combined status before its poll ended",
            )
            .buckets(vec![0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0]),
        )
        .expect("valid metric");
        let agents = AgentMetrics::new();
        let merge_queue = QueueMetrics::new();
        let queue_analytics = QueueAnalytics::new();
        let reviews = ReviewMetrics::new();
        for c in [
            Box::new(deliveries.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(signature_failures.clone()),
            Box::new(ingest_latency.clone()),
            Box::new(redis_errors.clone()),
            Box::new(events_processed.clone()),
            Box::new(commit_conflicts.clone()),
            Box::new(effects.clone()),
            Box::new(lag.clone()),
            Box::new(queue_gauges.clone()),
            Box::new(circuit_open.clone()),
            Box::new(budget_remaining_usd.clone()),
            Box::new(forgejo_calls.clone()),
            Box::new(resync_prs.clone()),
            Box::new(ci_poll_reads.clone()),
        ]
        .into_iter()
        .chain(agents.collectors())
        .chain(merge_queue.collectors())
        .chain(queue_analytics.collectors())
        .chain(reviews.collectors())
        {
            registry
                .register(c)
                .expect("each family is registered once");
        }
        Self {
            registry,
            deliveries,
            signature_failures,
            ingest_latency,
            redis_errors,
            events_processed,
            commit_conflicts,
            effects,
            lag,
            queue_gauges,
            circuit_open,
            budget_remaining_usd,
            forgejo_calls,
            resync_prs,
            ci_poll_reads,
            agents,
            merge_queue,
            queue_analytics,
            reviews,
        }
    }

    /// Counts a merge-queue op applied to `queue` (the queue after it) at `now_ms`.
    pub fn queue_op(
        &self,
        repo: &str,
        op: &crate::core::queue::QueueOp,
        queue: &crate::core::queue::BranchQueue,
        changed: bool,
        now_ms: i64,
    ) {
        use crate::core::queue::{Departure, QueueAction};
        (self.queue_analytics).op_applied(repo, op, queue, changed, now_ms);
        let m = &self.merge_queue;
        let labels = [repo, op.branch.as_str()];
        m.length
            .with_label_values(&labels)
            .set(i64::try_from(queue.order().len()).unwrap_or(i64::MAX));
        if !changed {
            // A redelivered or stale op: counted when it first changed the queue.
            return;
        }
        match &op.action {
            QueueAction::Park { reason } | QueueAction::Requeue { reason } => {
                m.ejections.with_label_values(&[reason.as_str()]).inc();
            }
            QueueAction::Leave {
                reason: Departure::Merged,
            } => m.merged.with_label_values(&labels).inc(),
            QueueAction::Join { .. }
            | QueueAction::Leave {
                reason: Departure::Closed | Departure::Dequeued | Departure::Retargeted,
            } => {}
        }
    }

    /// Counts the outcome of updating a queue head onto its tip.
    pub fn queue_update(
        &self,
        _repo: &str,
        _branch: &str,
        outcome: &crate::core::event::MergeOutcome,
    ) {
        use crate::core::event::MergeOutcome;
        let label = match outcome {
            MergeOutcome::Updated { .. } => "updated",
            MergeOutcome::Conflict => "conflict",
            MergeOutcome::Merged
            | MergeOutcome::HeadMoved
            | MergeOutcome::TryAgain
            | MergeOutcome::LockBusy { .. }
            | MergeOutcome::BaseMoved
            | MergeOutcome::Frozen { .. }
            | MergeOutcome::FailedPermanent { .. } => "other",
        };
        self.merge_queue.updates.with_label_values(&[label]).inc();
    }

    /// The stored figures of a branch's queue after a write that is not an op (a batch
    /// step).
    pub fn queue_written(
        &self,
        repo: &str,
        branch: &str,
        queue: &crate::core::queue::BranchQueue,
        now_ms: i64,
    ) {
        (self.queue_analytics).stored_figures(repo, branch, queue, now_ms);
    }

    /// Whether a branch's queue is frozen (seen at a freeze command or a head's advance).
    pub fn queue_frozen(&self, repo: &str, branch: &str, frozen: bool) {
        (self.queue_analytics.frozen)
            .with_label_values(&[repo, branch])
            .set(i64::from(frozen));
    }

    /// Observes the time in queue of a PR merged through it.
    pub fn queue_merged_after(&self, repo: &str, branch: &str, waited_ms: i64) {
        let secs = waited_ms.max(0) as f64 / 1000.0;
        self.merge_queue
            .wait
            .with_label_values(&[repo, branch])
            .observe(secs);
    }

    /// Renders every family in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("encoding to a Vec cannot fail");
        String::from_utf8(buf).expect("the text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
