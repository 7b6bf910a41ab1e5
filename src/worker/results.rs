//! Work results: agents report a result for a work item through the HTTP API
//! ([`super::results_api`]) or as an entry of the stream `<prefix>:results` (field
//! `result`: `{"id", "outcome", "signature"?, "summary"?}`). Both end in [`submit`],
//! which turns a result for an active work id into a `WorkResult` internal event on
//! the owner's shard — once: a second report, or a report for work that has ended,
//! is refused (409 on the API; acked and logged on the stream). One kind of ended
//! work still takes its result: work whose claim the agent's own push superseded
//! (the agent pushes, then reports), recorded on that attempt — once.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::instrument;

use super::Context;
use super::consumer::pause;
use crate::core::event::{Event, WorkOutcome};
use crate::core::ids::WorkId;
use crate::core::record::{MAX_REPORTED_SIGNATURE_BYTES, MAX_SUMMARY_BYTES, bounded_text};
use crate::store::keys::RESULTS_GROUP;
use crate::store::work::{self, ReportOutcome, ResultEvent, WorkState};
use crate::store::{Keys, StoreError, streams};

/// Field of a results-stream entry holding the JSON result.
pub const RESULT_FIELD: &str = "result";
/// Results read per `XREADGROUP`.
const BATCH: usize = 64;
/// Longest a results read blocks.
const BLOCK: Duration = Duration::from_millis(1000);

/// A result as agents send it (the API takes the id from the path).
#[derive(Debug, Clone, Deserialize)]
pub struct ResultReport {
    /// Work id (required on the stream; ignored by the API, which has it in the path).
    #[serde(default)]
    pub id: Option<String>,
    /// `succeeded`, `failed` or `no-changes`.
    pub outcome: WorkOutcome,
    /// The agent's failure signature.
    #[serde(default)]
    pub signature: Option<String>,
    /// One line for the history (cut to `MAX_SUMMARY_BYTES`, marked, when longer).
    #[serde(default)]
    pub summary: Option<String>,
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
    conn: &mut ConnectionManager,
    keys: &Keys,
    work_id: &str,
    report: &ResultReport,
    marker_ttl: Duration,
) -> Result<Submitted, StoreError> {
    let owner = match work::lookup(conn, keys, work_id).await? {
        WorkState::Active(owner) | WorkState::Superseded(owner) => owner,
        WorkState::Ended => return Ok(Submitted::Ended),
        WorkState::Unknown => return Ok(Submitted::Unknown),
    };
    let Ok(id) = work_id.parse::<WorkId>() else {
        return Ok(Submitted::Unknown);
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

/// Consumes `<prefix>:results` (group `results`) until shutdown.
#[instrument(skip_all, fields(consumer = %ctx.consumer))]
pub async fn intake_loop(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let keys = ctx.store.keys().clone();
    let stream = keys.results();
    let mut read = ctx.store.blocking_conn(BLOCK).await?;
    streams::ensure_group(&mut read, &stream, RESULTS_GROUP).await?;
    let mut conn = ctx.store.conn();
    let mut since_reclaim = Duration::ZERO;
    while !shutdown.is_cancelled() {
        let batch = match streams::read_group(
            &mut read,
            &stream,
            RESULTS_GROUP,
            &ctx.consumer,
            ">",
            BATCH,
            BLOCK,
        )
        .await
        {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "reading the results stream failed; retrying");
                if !pause(Duration::from_millis(500), &shutdown).await {
                    break;
                }
                continue;
            }
        };
        for entry in batch {
            handle_entry(&ctx, &mut conn, entry).await;
        }
        since_reclaim += BLOCK;
        if since_reclaim >= ctx.config.reclaim_idle {
            since_reclaim = Duration::ZERO;
            match streams::autoclaim(
                &mut conn,
                &stream,
                RESULTS_GROUP,
                &ctx.consumer,
                ctx.config.reclaim_idle,
                "0-0",
                BATCH,
            )
            .await
            {
                Ok((_, claimed)) => {
                    for entry in claimed {
                        handle_entry(&ctx, &mut conn, entry).await;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reclaiming results failed"),
            }
        }
    }
    Ok(())
}

/// Handles one results-stream entry: queue it, or ack a duplicate, or dead-letter it.
async fn handle_entry(ctx: &Context, conn: &mut ConnectionManager, entry: streams::Entry) {
    let keys = ctx.store.keys();
    let stream = keys.results();
    let dead = keys.dead_letters(0);
    let outcome: Result<Option<String>, StoreError> = async {
        if entry.deliveries > u64::from(ctx.config.max_deliveries) {
            return Ok(Some(format!("delivered {} times", entry.deliveries)));
        }
        let report: ResultReport = match entry.bytes(RESULT_FIELD).map(serde_json::from_slice) {
            Some(Ok(r)) => r,
            Some(Err(e)) => return Ok(Some(format!("undecodable result: {e}"))),
            None => return Ok(Some(format!("no `{RESULT_FIELD}` field"))),
        };
        let Some(id) = report.id.clone().filter(|id| !id.is_empty()) else {
            return Ok(Some("result without an id".into()));
        };
        match submit(conn, keys, &id, &report, ctx.config.retention).await? {
            Submitted::Queued(_) => {}
            Submitted::Unknown => return Ok(Some(format!("unknown work id {id:?}"))),
            Submitted::Ended | Submitted::AlreadyReported => {
                tracing::info!(work_id = %id, "result for work no longer active or already reported; ignored");
            }
        }
        streams::ack(conn, &stream, RESULTS_GROUP, &[entry.id.as_str()]).await?;
        Ok(None)
    }
    .await;
    match outcome {
        Ok(None) => {}
        Ok(Some(reason)) => {
            tracing::warn!(entry = %entry.id, %reason, "result dead-lettered");
            if let Err(e) = streams::dead_letter(
                conn,
                &stream,
                &dead,
                RESULTS_GROUP,
                &entry.id,
                &reason,
                entry.deliveries,
            )
            .await
            {
                tracing::warn!(error = %e, "dead-lettering a result failed; it stays pending");
            }
        }
        Err(e) => {
            tracing::warn!(entry = %entry.id, error = %e, "result not processed; it stays pending")
        }
    }
}
