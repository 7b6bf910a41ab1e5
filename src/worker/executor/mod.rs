//! The executor: carries out the effects the workers commit, against Forgejo's REST
//! API and the dispatch sinks, and feeds what it learns back to the machine.
//!
//! ```text
//! effects(shard) ──XREADGROUP "executors"──▶ handle ─▶ done marker set? → ack only
//!        ▲                                     │  act (act.rs, merge.rs)
//!        │                                     ├─ ok        → finish: events + done marker + XACK (one Lua call)
//!        │                                     ├─ transient → park in effect-retries (ZADD + XACK), backoff + jitter
//!        │                                     └─ permanent / budget spent → finish with an EffectOutcome event
//!        ├── retry mover: due retries back onto the stream (atomic)
//!        └── reclaimer: XAUTOCLAIM entries of dead executors
//! ```
//!
//! Reading, reclaim, dead letters and shutdown are the store's consumer loop
//! (`store::consumer`, group `executors`); this module is its handler: an effect not
//! started when the stop comes is handed back uncounted.
//!
//! Every effect is idempotent on its own (labels by name, comments found by marker,
//! dispatches appended once per effect id, merges re-read first), so an executor that
//! dies anywhere — even between a Forgejo call and the done marker — leaves nothing
//! that a redelivery would do twice. Transient failures are retried here and never
//! reach the machine as failed agent attempts; only a spent budget is reported.

mod act;
mod batch;
mod merge;
mod observe;
mod queue;
mod queue_freeze;
pub mod retry;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use self::act::Failure;
use self::retry::{Next, RetryPolicy};
use super::Context;
use super::consumer::pause;
use super::dispatch::Sinks;
use crate::core::effect::{Effect, EffectKind};
use crate::core::event::{EffectOutcome, Event, MergeOutcome};
use crate::forgejo::BreakerState;
use crate::forgejo::{Cause, ForgejoClient};
use crate::store::commit::effect_fields;
use crate::store::consumer::{self, Batch, Handled, Handler, Outcome, Source, Spec};
use crate::store::effects::{self, FIRST_TRY, InternalEvent};
use crate::store::keys::EXECUTORS_GROUP;
use crate::store::markers;
use crate::store::streams::{self, Entry};

/// Entries per `XREADGROUP` (and per `XAUTOCLAIM`).
const BATCH: usize = 64;
/// How often due retries are moved back onto the streams.
const RETRY_POLL: Duration = Duration::from_millis(200);
/// Retries moved per script call.
const RETRY_POP_LIMIT: usize = 256;
/// Forgejo calls a merge effect makes at most (PR, status, reviews, merge, re-read).
const MERGE_CALLS: u32 = 6;

/// Everything the executor tasks share.
pub struct Executor {
    /// The worker context (store, config, metrics, policy, consumer name).
    ctx: Arc<Context>,
    /// The Forgejo client (one circuit breaker per host, label caches).
    forgejo: ForgejoClient,
    /// Dispatch sinks.
    sinks: Sinks,
    /// Budget of transient failures.
    retry: RetryPolicy,
}

/// Runs the executor until `shutdown`: the consumer loop on every effects-stream shard
/// (a reader per shard and the reclaimer) and the retry mover. Without `SHEPHERD_FORGEJO_URL`/`_TOKEN` it logs that
/// effects wait and returns (the effects stay queued for an executor that can run).
pub async fn run_executor(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    if ctx.config.forgejo_url.is_none() || ctx.config.forgejo_token.is_none() {
        // Said once at `info` by the worker's start line (`app::worker_tasks`).
        tracing::debug!(
            "executor disabled: SHEPHERD_FORGEJO_URL and SHEPHERD_FORGEJO_TOKEN are not both \
             set; effects stay queued"
        );
        return Ok(());
    }
    let worst_case = ctx.config.forgejo_timeout * MERGE_CALLS;
    if ctx.config.reclaim_idle < worst_case {
        tracing::warn!(
            reclaim_idle_ms = ctx.config.reclaim_idle.as_millis() as u64,
            worst_case_ms = worst_case.as_millis() as u64,
            "SHEPHERD_RECLAIM_IDLE_SECS is shorter than a merge effect's worst case \
             ({MERGE_CALLS} Forgejo calls at SHEPHERD_FORGEJO_TIMEOUT_MS): a slow but live \
             executor's effect may be reclaimed and run twice (effects stay idempotent)"
        );
    }
    let forgejo = ForgejoClient::from_config(&ctx.config, Some(ctx.metrics.clone()))?;
    let sinks = Sinks::new(&ctx.config, ctx.store.keys().clone())?;
    let exec = Arc::new(Executor {
        ctx,
        forgejo,
        sinks,
        retry: RetryPolicy::default(),
    });
    let mut tasks = tokio::task::JoinSet::new();
    let spec = exec.spec();
    let (store, handler, stop) = (exec.ctx.store.clone(), exec.clone(), shutdown.clone());
    tasks.spawn(async move { Ok(consumer::run(&store, spec, handler, stop).await?) });
    tasks.spawn(exec.clone().retry_loop(shutdown.clone()));
    let mut first_error = None;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                shutdown.cancel();
                first_error.get_or_insert(e);
            }
            Err(e) => {
                shutdown.cancel();
                first_error.get_or_insert(anyhow::anyhow!("executor task panicked: {e}"));
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

impl Handler for Executor {
    async fn handle(&self, batch: &Batch<'_>, entries: Vec<Entry>) -> Vec<Handled> {
        self.run_batch(batch.source.shard, entries, batch.stop)
            .await
    }

    fn dead_lettered(&self, _source: &Source, entry: &Entry, reason: &str) {
        let kind = entry.text(effect_fields::KIND);
        tracing::warn!(effect = %entry.text(effect_fields::ID), kind = %kind, entry = %entry.id, %reason, "dead-lettered a poison effect");
        self.ctx
            .metrics
            .effects
            .with_label_values(&[kind.as_str(), "dead_lettered"])
            .inc();
    }
}

impl Executor {
    /// The consumer loop's settings: every shard's effects stream, group `executors`.
    fn spec(&self) -> Spec {
        let keys = self.ctx.store.keys();
        Spec {
            group: EXECUTORS_GROUP.to_owned(),
            consumer: self.ctx.consumer.clone(),
            sources: (0..self.ctx.config.shards)
                .map(|s| {
                    Source::new(
                        keys.effects(s),
                        keys.dead_letters(s),
                        s,
                        format!("effects:{s}"),
                    )
                })
                .collect(),
            batch: BATCH,
            reclaim_idle: self.ctx.config.reclaim_idle,
            max_deliveries: self.ctx.config.max_deliveries,
            metrics: Some(consumer::Metrics {
                redis_errors: self.ctx.metrics.redis_errors.clone(),
                queue_gauges: self.ctx.metrics.queue_gauges.clone(),
            }),
        }
    }

    /// Runs a batch: effects of one record in stream order, records concurrently.
    /// Once `stop` fires, effects not yet started are answered `NotStarted`.
    async fn run_batch(
        &self,
        shard: u16,
        batch: Vec<Entry>,
        stop: &CancellationToken,
    ) -> Vec<Handled> {
        let mut groups: HashMap<String, Vec<Entry>> = HashMap::new();
        for entry in batch {
            groups
                .entry(entry.text(effect_fields::RECORD))
                .or_default()
                .push(entry);
        }
        let runs = groups.into_values().map(|entries| async move {
            let mut handled = Vec::with_capacity(entries.len());
            for entry in entries {
                if stop.is_cancelled() {
                    tracing::info!(entry = %entry.id, "shutting down; the effect stays pending");
                    handled.push(Handled::new(entry, Outcome::NotStarted));
                    continue;
                }
                handled.push(self.handle(shard, entry).await);
            }
            handled
        });
        join_all(runs).await.into_iter().flatten().collect()
    }

    /// While the Forgejo circuit breaker is open, records it in Redis (expiring when
    /// the next probe may go through) so the status page of every process shows it.
    /// Best effort: the breaker works the same without it.
    async fn publish_open_circuit(&self, conn: &mut crate::store::Conn) {
        let BreakerState::Open { until } = self.forgejo.breaker().state() else {
            return;
        };
        let ttl = until.saturating_duration_since(std::time::Instant::now());
        let url = self.ctx.config.forgejo_url.as_deref().unwrap_or_default();
        let keys = self.ctx.store.keys();
        if let Err(e) = markers::publish_open_circuit(conn, keys, url, ttl).await {
            tracing::debug!(error = %e, "could not record the open circuit for the status page");
        }
    }

    /// Moves due retries of every shard back onto the effects streams until shutdown.
    async fn retry_loop(self: Arc<Self>, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut conn = self.ctx.store.conn();
        let keys = self.ctx.store.keys();
        while pause(RETRY_POLL, &shutdown).await {
            for shard in 0..self.ctx.config.shards {
                let now = streams::now_ms();
                match effects::pop_due_retries(&mut conn, keys, shard, now, RETRY_POP_LIMIT).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(shard, moved = n, "effect retries due"),
                    Err(e) => {
                        self.ctx
                            .metrics
                            .redis_errors
                            .with_label_values(&["effect_retries"])
                            .inc();
                        tracing::warn!(shard, error = %e, "moving due effect retries failed");
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs one entry to its end: done, parked for a retry, reported as failed, to be
    /// dead-lettered, or left pending after a Redis failure.
    async fn handle(&self, shard: u16, entry: Entry) -> Handled {
        let effect_id = entry.text(effect_fields::ID);
        let kind = entry.text(effect_fields::KIND);
        let span =
            tracing::info_span!("effect", effect = %effect_id, kind = %kind, entry = %entry.id);
        let outcome = async {
            let (outcome, label) = match self.handle_inner(shard, &entry).await {
                Ok(Step::Done(label)) => (Outcome::Finished, label),
                Ok(Step::Duplicate) => (Outcome::Ack, "duplicate"),
                // Counted where the loop has moved it (`dead_lettered`).
                Ok(Step::Poison(reason)) => return Outcome::DeadLetter(reason),
                Err(e) => {
                    self.ctx
                        .metrics
                        .redis_errors
                        .with_label_values(&["executor"])
                        .inc();
                    tracing::warn!(error = %e, "redis failed; the effect stays pending");
                    (Outcome::Retry, "error")
                }
            };
            self.ctx
                .metrics
                .effects
                .with_label_values(&[kind.as_str(), label])
                .inc();
            outcome
        }
        .instrument(span)
        .await;
        Handled::new(entry, outcome)
    }

    /// [`Executor::handle`]; returns what became of the entry.
    async fn handle_inner(
        &self,
        shard: u16,
        entry: &Entry,
    ) -> Result<Step, crate::store::StoreError> {
        let decoded = entry
            .bytes(effect_fields::EFFECT)
            .map(serde_json::from_slice::<Effect>);
        let effect = match decoded {
            Some(Ok(effect)) => effect,
            Some(Err(e)) => return Ok(Step::Poison(format!("undecodable effect: {e}"))),
            None => return Ok(Step::Poison("no effect field".into())),
        };
        let mut conn = self.ctx.store.conn();
        let keys = self.ctx.store.keys();
        if effects::is_done(&mut conn, keys, shard, effect.id.as_str()).await? {
            return Ok(Step::Duplicate);
        }
        let now = streams::now_ms();
        let first_try = entry.text(FIRST_TRY).parse().unwrap_or(now);
        let tries = entry.text(effects::ATTEMPT).parse::<u32>().unwrap_or(0) + 1;
        let queued_ms = entry_ms(&entry.id).unwrap_or(now);
        let reads = read_cause(entry, &effect);
        let (events, label) = match self.act(&effect, queued_ms, reads).await {
            Ok(events) => (events, "done"),
            Err(Failure::Store(e)) => return Err(e),
            Err(Failure::Permanent(message)) => {
                tracing::warn!(%message, "effect failed permanently");
                (vec![failure_event(&effect, message, false)], "failed")
            }
            Err(Failure::Transient {
                message,
                retry_after,
            }) => {
                let elapsed = Duration::from_millis(now.saturating_sub(first_try));
                match self.retry.next_random(tries, elapsed, retry_after) {
                    Next::RetryIn(delay) => {
                        tracing::info!(%message, tries, delay_ms = delay.as_millis() as u64, "transient failure; retrying later");
                        let fields = retry_fields(entry, tries, first_try);
                        let due = now + u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                        effects::park_for_retry(&mut conn, keys, shard, &entry.id, &fields, due)
                            .await?;
                        self.publish_open_circuit(&mut conn).await;
                        return Ok(Step::Done("retried"));
                    }
                    Next::GiveUp => {
                        tracing::warn!(%message, tries, "retry budget spent; reporting the failure");
                        (vec![failure_event(&effect, message, true)], "failed")
                    }
                }
            }
        };
        let received = entry.text(effect_fields::RECEIVED).parse().unwrap_or(now);
        let internal: Vec<InternalEvent> = events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                InternalEvent::new(effect.id.as_str(), i, effect.repo.as_str(), e, received)
            })
            .collect();
        let ttl = self.ctx.config.retention;
        effects::finish(
            &mut conn,
            keys,
            shard,
            &entry.id,
            effect.id.as_str(),
            &internal,
            ttl,
        )
        .await?;
        let lag = streams::now_ms().saturating_sub(received);
        self.ctx
            .metrics
            .lag
            .with_label_values(&["executed"])
            .observe(lag as f64 / 1000.0);
        Ok(Step::Done(label))
    }
}

/// Why the reads of an `Observe` effect are made, from the event that caused it (named
/// in the entry at commit time): a CI-poll timer, the resync, or (anything else) a
/// webhook and what followed it. Other effects are writes ([`Cause::Effect`]).
fn read_cause(entry: &Entry, effect: &Effect) -> Cause {
    if !matches!(effect.kind, EffectKind::Observe(_)) {
        return Cause::Effect;
    }
    match entry.text(effect_fields::CAUSE_EVENT).as_str() {
        "timer/ci-poll" => Cause::CiPoll,
        "resync" => Cause::Resync,
        _ => Cause::Webhook,
    }
}

/// What became of one effects-stream entry.
enum Step {
    /// Finished in Redis (done, reported as failed, or parked for a retry; the script
    /// acked it); the metric outcome.
    Done(&'static str),
    /// Its done marker was set already: ack only.
    Duplicate,
    /// Cannot be run: dead-letter it with this reason.
    Poison(String),
}

/// The time part of a stream entry id (`<ms>-<seq>`).
fn entry_ms(id: &str) -> Option<u64> {
    id.split('-').next()?.parse().ok()
}

/// The entry's fields for its next try: everything but the retry bookkeeping, then the
/// updated bookkeeping.
fn retry_fields(entry: &Entry, tries: u32, first_try: u64) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = entry
        .fields
        .iter()
        .filter(|(k, _)| k.as_str() != effects::ATTEMPT && k.as_str() != FIRST_TRY)
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    fields.sort();
    fields.push((effects::ATTEMPT.to_owned(), tries.to_string()));
    fields.push((FIRST_TRY.to_owned(), first_try.to_string()));
    fields
}

/// The event that tells the machine an effect failed for good. A merge whose budget
/// ran out (Forgejo down) is "try again later"; one refused for good a permanent
/// failure; a dispatch names its work item so the claim ends.
fn failure_event(effect: &Effect, message: String, budget_spent: bool) -> Event {
    let outcome = match &effect.kind {
        EffectKind::Merge { .. } | EffectKind::QueueAdvance { .. } if budget_spent => {
            EffectOutcome::Merge(MergeOutcome::TryAgain)
        }
        EffectKind::Merge { .. } | EffectKind::QueueAdvance { .. } => {
            EffectOutcome::Merge(MergeOutcome::FailedPermanent { message })
        }
        EffectKind::Dispatch(item) => EffectOutcome::Failed {
            kind: effect.kind.name(),
            work_id: Some(item.id.clone()),
            message,
        },
        EffectKind::CancelWork { .. }
        | EffectKind::AddLabels { .. }
        | EffectKind::RemoveLabels { .. }
        | EffectKind::UpsertComment { .. }
        | EffectKind::Comment { .. }
        | EffectKind::Queue(_)
        | EffectKind::QueueFreeze(_)
        | EffectKind::Observe(_)
        | EffectKind::Schedule(_) => EffectOutcome::Failed {
            kind: effect.kind.name(),
            work_id: None,
            message,
        },
    };
    Event::EffectOutcome {
        repo: effect.repo.clone(),
        scope: effect.scope,
        number: effect.number,
        effect_id: effect.id.clone(),
        outcome,
    }
}
