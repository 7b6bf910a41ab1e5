//! Work results: agents report a result for a work item through the HTTP API
//! (`crate::ingest::results_api`) or as an entry of the stream `<prefix>:results` (field
//! `result`: `{"id", "outcome", "signature"?, "summary"?}`). Both end in [`submit`],
//! which turns a result for an active work id into a `WorkResult` internal event on
//! the owner's shard — once: a second report, or a report for work that has ended,
//! is refused (409 on the API; acked and logged on the stream). One kind of ended
//! work still takes its result: work whose claim the agent's own push superseded
//! (the agent pushes, then reports), recorded on that attempt — once.

use std::sync::Arc;
use std::time::Duration;

use crate::store::Conn;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::instrument;

use super::Context;
use crate::core::event::{Event, WorkOutcome};
use crate::core::ids::{RepoName, Scope, WorkId};
use crate::core::record::{
    MAX_REPORTED_SIGNATURE_BYTES, MAX_SUMMARY_BYTES, WorkState, bounded_text,
};
use crate::core::usage::Usage;
use crate::store::commit;
use crate::store::consumer::{self, Batch, Handled, Handler, Outcome, Source, Spec};
use crate::store::keys::RESULTS_GROUP;
use crate::store::ledger::{self, RunEntry};
use crate::store::streams::{self, Entry};
use crate::store::work::{self, ReportOutcome, ResultEvent, WorkLookup};
use crate::store::{Keys, StoreError};

/// Field of a results-stream entry holding the JSON result.
pub const RESULT_FIELD: &str = "result";
/// Results read per `XREADGROUP` (and per `XAUTOCLAIM`).
const BATCH: usize = 64;

/// A result as agents send it (the API takes the id from the path).
#[derive(Debug, Clone, Deserialize)]
pub struct ResultReport {
    /// Work id (required on the stream; ignored by the API, which has it in the path).
    #[serde(default)]
    pub id: Option<String>,
    /// `succeeded`, `failed`, `no-changes` or `transient`.
    pub outcome: WorkOutcome,
    /// The agent's failure signature.
    #[serde(default)]
    pub signature: Option<String>,
    /// One line for the history (cut to `MAX_SUMMARY_BYTES`, marked, when longer).
    #[serde(default)]
    pub summary: Option<String>,
    /// What the run consumed (issue 28), when the runner or the agent said.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Why the runner stopped the agent, when it did.
    #[serde(default)]
    pub stopped: Option<crate::core::usage::StopReason>,
}

/// What became of a submitted result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// Queued as an events-stream entry with this id.
    Queued(String),
    /// No such work id.
    Unknown,
    /// The work is no longer active.
    Ended,
    /// A result was already reported for it.
    AlreadyReported,
}

/// Queues `report` for `work_id` when that work is active (or superseded by the
/// agent's own push) and not yet reported.
#[instrument(skip_all, fields(work_id))]
pub async fn submit(
    conn: &mut Conn,
    keys: &Keys,
    work_id: &str,
    report: &ResultReport,
    marker_ttl: Duration,
) -> Result<Submitted, StoreError> {
    let lookup = work::lookup(conn, keys, work_id).await?;
    if matches!(lookup, WorkLookup::Unknown) {
        return Ok(Submitted::Unknown);
    }
    let Ok(id) = work_id.parse::<WorkId>() else {
        return Ok(Submitted::Unknown);
    };
    // The money was spent whatever becomes of the report: counted before it (and even
    // for work that has ended), once per work id.
    if let Some(usage) = &report.usage {
        count_usage(conn, keys, &id, &lookup, report.outcome, usage).await?;
    }
    let owner = match lookup {
        WorkLookup::Active(owner) | WorkLookup::Superseded(owner) => owner,
        WorkLookup::Ended | WorkLookup::Unknown => return Ok(Submitted::Ended),
    };
    let event = Event::WorkResult {
        work_id: id,
        outcome: report.outcome,
        // Bounded before it is queued, so an oversized report never reaches the events
        // stream (the core bounds it again where it enters the record).
        signature: report
            .signature
            .as_deref()
            .map(|s| bounded_text(s, MAX_REPORTED_SIGNATURE_BYTES)),
        summary: report
            .summary
            .as_deref()
            .map(|s| bounded_text(s, MAX_SUMMARY_BYTES)),
        usage: report.usage.clone(),
        stopped: report.stopped,
    };
    let body = serde_json::to_string(&event).map_err(|e| StoreError::Protocol {
        script: "report",
        reply: format!("cannot encode the result event: {e}"),
    })?;
    let result = ResultEvent {
        event: event.name(),
        body,
        received_ms: streams::now_ms(),
    };
    Ok(
        match work::report(conn, keys, &owner, work_id, &result, marker_ttl.as_secs()).await? {
            ReportOutcome::Queued(id) => Submitted::Queued(id),
            ReportOutcome::Unknown => Submitted::Unknown,
            ReportOutcome::Ended => Submitted::Ended,
            ReportOutcome::AlreadyReported => Submitted::AlreadyReported,
        },
    )
}

/// Adds a reported run's usage to the ledger (`store::ledger`), once per work id: a
/// re-reported result finds its run already counted. The record (when it still has the
/// work, active or among its attempts) gives the run's kind and tier for `costs`.
async fn count_usage(
    conn: &mut Conn,
    keys: &Keys,
    id: &WorkId,
    lookup: &WorkLookup,
    outcome: WorkOutcome,
    usage: &Usage,
) -> Result<(), StoreError> {
    let (issue, repo, number) = match lookup {
        WorkLookup::Active(o) | WorkLookup::Superseded(o) => match o.repo.parse::<RepoName>() {
            Ok(repo) => (o.issue, repo, o.number),
            Err(_) => return Ok(()),
        },
        // An ended claim's marker names no owner: the work id does.
        WorkLookup::Ended | WorkLookup::Unknown => match id.subject() {
            Some((repo, scope, number)) => (scope == Scope::Issue, repo, number),
            None => return Ok(()),
        },
    };
    let record_key = if issue {
        keys.issue_record(repo.as_str(), number)
    } else {
        keys.pr_record(repo.as_str(), number)
    };
    let (kind, tier) = match commit::load(conn, &record_key).await? {
        Some(stored) => kind_and_tier(&stored.data, id),
        None => None,
    }
    .unwrap_or_else(|| ("unknown".to_owned(), 0));
    let run = RunEntry {
        work_id: id.to_string(),
        repo,
        number,
        issue,
        kind,
        tier,
        at_ms: streams::now_ms() as i64,
        outcome: outcome_name(outcome).to_owned(),
        usage: usage.clone(),
    };
    if !ledger::record(conn, keys, &run).await? {
        tracing::info!(work_id = %id, "usage of this run already counted; not again");
    }
    Ok(())
}

/// The kind and tier of work `id` in a stored record's JSON: its active work item, or
/// the attempt that ran it.
fn kind_and_tier(data: &str, id: &WorkId) -> Option<(String, u8)> {
    /// The part of a PR or issue record this needs.
    #[derive(Deserialize)]
    struct Held {
        /// Its work bookkeeping.
        work: WorkState,
    }
    let held: Held = serde_json::from_str(data).ok()?;
    if let Some(a) = held.work.active.filter(|a| a.item.id == *id) {
        return Some((a.item.kind.as_str().to_owned(), a.item.tier));
    }
    held.work
        .attempts
        .iter()
        .find(|a| a.work_id == *id)
        .map(|a| (a.kind.as_str().to_owned(), a.tier))
}

/// A reported outcome's contract name.
fn outcome_name(o: WorkOutcome) -> &'static str {
    match o {
        WorkOutcome::Succeeded => "succeeded",
        WorkOutcome::Failed => "failed",
        WorkOutcome::NoChanges => "no-changes",
        WorkOutcome::Transient => "transient",
    }
}

/// The results stream's handler: each entry is a report for [`submit`].
struct Intake(Arc<Context>);

impl Handler for Intake {
    async fn handle(&self, batch: &Batch<'_>, entries: Vec<Entry>) -> Vec<Handled> {
        let mut conn = self.0.store.conn();
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            if batch.stop.is_cancelled() {
                out.push(Handled::new(entry, Outcome::NotStarted));
                continue;
            }
            let outcome = handle_entry(&self.0, &mut conn, &entry).await;
            out.push(Handled::new(entry, outcome));
        }
        out
    }

    fn dead_lettered(&self, _source: &Source, entry: &Entry, reason: &str) {
        tracing::warn!(entry = %entry.id, %reason, "result dead-lettered");
    }
}

/// Consumes `<prefix>:results` (group `results`) until shutdown, with the store's
/// consumer loop; its dead letters go to shard 0's dead-letter stream.
#[instrument(skip_all, fields(consumer = %ctx.consumer))]
pub async fn intake_loop(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let keys = ctx.store.keys();
    let spec = Spec {
        group: RESULTS_GROUP.to_owned(),
        consumer: ctx.consumer.clone(),
        sources: vec![Source::new(
            keys.results(),
            keys.dead_letters(0),
            0,
            "results",
        )],
        batch: BATCH,
        reclaim_idle: ctx.config.reclaim_idle,
        max_deliveries: ctx.config.max_deliveries,
        metrics: Some(consumer::Metrics {
            redis_errors: ctx.metrics.redis_errors.clone(),
            queue_gauges: ctx.metrics.queue_gauges.clone(),
        }),
    };
    let store = ctx.store.clone();
    consumer::run(&store, spec, Arc::new(Intake(ctx)), shutdown).await?;
    Ok(())
}

/// Handles one results-stream entry: queue it (ack), ack a duplicate, dead-letter what
/// cannot be a result, or leave it pending when Redis failed.
async fn handle_entry(ctx: &Context, conn: &mut Conn, entry: &Entry) -> Outcome {
    let keys = ctx.store.keys();
    let report: ResultReport = match entry.bytes(RESULT_FIELD).map(serde_json::from_slice) {
        Some(Ok(r)) => r,
        Some(Err(e)) => return Outcome::DeadLetter(format!("undecodable result: {e}")),
        None => return Outcome::DeadLetter(format!("no `{RESULT_FIELD}` field")),
    };
    let Some(id) = report.id.clone().filter(|id| !id.is_empty()) else {
        return Outcome::DeadLetter("result without an id".into());
    };
    match submit(conn, keys, &id, &report, ctx.config.retention).await {
        Ok(Submitted::Queued(_)) => Outcome::Ack,
        Ok(Submitted::Unknown) => Outcome::DeadLetter(format!("unknown work id {id:?}")),
        Ok(Submitted::Ended | Submitted::AlreadyReported) => {
            tracing::info!(work_id = %id, "result for work no longer active or already reported; ignored");
            Outcome::Ack
        }
        Err(e) => {
            tracing::warn!(entry = %entry.id, error = %e, "result not processed; it stays pending");
            Outcome::Retry
        }
    }
}
