//! The consume loops: one reader per events-stream shard (batched `XREADGROUP` with
//! `BLOCK` on a dedicated connection), the reclaimer (`XAUTOCLAIM` of entries left
//! pending by dead consumers), and the gauge sampler.
//!
//! Shutdown: a reader checks the token between batches, and processing checks it
//! between the entries of a batch and between the records one entry fans out to. An
//! entry not finished when the token fires is left pending, never acked, so the next
//! reader of the shard (this consumer after a restart, or the reclaimer of another)
//! processes it: stopping takes at most one block time plus one record's step and
//! commit, and loses nothing.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::instrument;

use super::{Context, process};
use crate::store::keys::WORKERS_GROUP;
use crate::store::streams;

/// Entries per `XREADGROUP`.
const BATCH: usize = 128;
/// Longest a read blocks (bounds how long shutdown waits for a reader).
const BLOCK: Duration = Duration::from_millis(1000);
/// Pause after a failed read before trying again.
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Entries per `XAUTOCLAIM`.
const CLAIM_BATCH: usize = 100;
/// How often queue gauges are sampled.
const GAUGE_INTERVAL: Duration = Duration::from_secs(5);
/// Consumers idle (and empty) for this long are removed from the groups.
const PRUNE_IDLE: Duration = Duration::from_secs(3600);

/// Sleeps `d` unless `shutdown` fires first; returns false when it did.
pub(crate) async fn pause(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => true,
        () = shutdown.cancelled() => false,
    }
}

/// Reads and processes one shard's events until shutdown. Starts with this consumer's
/// own pending entries (a restart under the same `--consumer` name), then new ones.
#[instrument(skip_all, fields(shard, consumer = %ctx.consumer))]
pub async fn consume_shard(
    ctx: Arc<Context>,
    shard: u16,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let stream = ctx.store.keys().events(shard);
    let mut conn = ctx.store.blocking_conn(BLOCK).await?;
    let mut group_ready = false;
    // Own pending entries first, paging by id so that an entry that keeps failing is
    // left to the reclaimer instead of being re-read forever.
    let mut from = "0-0".to_owned();
    let mut own_pending = true;
    while !shutdown.is_cancelled() {
        if !group_ready {
            // (Re)create the group: at start, and after the stream was deleted.
            match streams::ensure_group(&mut conn, &stream, WORKERS_GROUP).await {
                Ok(()) => group_ready = true,
                Err(e) => {
                    tracing::warn!(error = %e, "creating the consumer group failed; retrying");
                    if !pause(RETRY_PAUSE, &shutdown).await {
                        break;
                    }
                    continue;
                }
            }
        }
        let cursor = if own_pending { from.as_str() } else { ">" };
        let batch = match streams::read_group(
            &mut conn,
            &stream,
            WORKERS_GROUP,
            &ctx.consumer,
            cursor,
            BATCH,
            BLOCK,
        )
        .await
        {
            Ok(b) => b,
            Err(e) => {
                ctx.metrics
                    .redis_errors
                    .with_label_values(&["xreadgroup"])
                    .inc();
                tracing::warn!(error = %e, "reading the events stream failed; retrying");
                group_ready = !e.is_missing_group();
                if !pause(RETRY_PAUSE, &shutdown).await {
                    break;
                }
                continue;
            }
        };
        if own_pending {
            match batch.last() {
                Some(last) => from = last.id.clone(),
                None => {
                    own_pending = false;
                    continue;
                }
            }
        }
        if !batch.is_empty() {
            process::process_batch(&ctx, shard, batch, &shutdown).await;
        }
    }
    Ok(())
}

/// Reclaims entries of dead consumers from every shard, every half reclaim idle time
/// (at least every second, at most every 30 s), and prunes long-gone consumers.
pub async fn reclaim_loop(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let every =
        (ctx.config.reclaim_idle / 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
    let mut since_prune = Duration::ZERO;
    while pause(every, &shutdown).await {
        for shard in 0..ctx.config.shards {
            if shutdown.is_cancelled() {
                break;
            }
            if let Err(e) = reclaim_shard(&ctx, shard, &shutdown).await {
                ctx.metrics
                    .redis_errors
                    .with_label_values(&["xautoclaim"])
                    .inc();
                tracing::warn!(shard, error = %e, "reclaiming pending entries failed");
            }
        }
        since_prune += every;
        if since_prune >= PRUNE_IDLE / 4 {
            since_prune = Duration::ZERO;
            prune(&ctx).await;
        }
    }
    Ok(())
}

/// One full `XAUTOCLAIM` scan of a shard; claimed entries are processed at once (or
/// dead-lettered when delivered too often).
#[instrument(skip_all, fields(shard))]
async fn reclaim_shard(
    ctx: &Context,
    shard: u16,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let stream = ctx.store.keys().events(shard);
    let mut conn = ctx.store.conn();
    let mut cursor = "0-0".to_owned();
    loop {
        let (next, claimed) = streams::autoclaim(
            &mut conn,
            &stream,
            WORKERS_GROUP,
            &ctx.consumer,
            ctx.config.reclaim_idle,
            &cursor,
            CLAIM_BATCH,
        )
        .await?;
        if !claimed.is_empty() {
            tracing::info!(
                count = claimed.len(),
                "reclaimed entries of a dead or slow consumer"
            );
            process::process_batch(ctx, shard, claimed, shutdown).await;
        }
        if next == "0-0" || shutdown.is_cancelled() {
            return Ok(());
        }
        cursor = next;
    }
}

/// Removes consumers that have held nothing for [`PRUNE_IDLE`].
async fn prune(ctx: &Context) {
    let mut conn = ctx.store.conn();
    for shard in 0..ctx.config.shards {
        let stream = ctx.store.keys().events(shard);
        match streams::prune_consumers(&mut conn, &stream, WORKERS_GROUP, PRUNE_IDLE).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(shard, removed = n, "pruned idle consumers"),
            Err(e) => tracing::debug!(shard, error = %e, "pruning consumers failed"),
        }
    }
}

/// On a graceful exit: leave the groups (only when nothing is pending for us, so no
/// entry is dropped) to keep the consumer lists short.
pub async fn leave_groups(ctx: &Context) {
    let mut conn = ctx.store.conn();
    for shard in 0..ctx.config.shards {
        let stream = ctx.store.keys().events(shard);
        if let Err(e) =
            streams::remove_consumer_if_idle(&mut conn, &stream, WORKERS_GROUP, &ctx.consumer).await
        {
            tracing::debug!(shard, error = %e, "leaving the consumer group failed");
        }
    }
}

/// Samples the queue gauges (pending entries per shard, dead letters, timers) until
/// shutdown.
pub async fn gauge_loop(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    loop {
        sample_gauges(&ctx).await;
        if !pause(GAUGE_INTERVAL, &shutdown).await {
            return Ok(());
        }
    }
}

async fn sample_gauges(ctx: &Context) {
    let mut conn = ctx.store.conn();
    let keys = ctx.store.keys();
    let g = &ctx.metrics.queue_gauges;
    for shard in 0..ctx.config.shards {
        let label = format!("events:{shard}");
        if let Ok(n) = streams::pending_count(&mut conn, &keys.events(shard), WORKERS_GROUP).await {
            g.with_label_values(&[label.as_str(), "pending"])
                .set(n as i64);
        }
        if let Ok(n) = streams::length(&mut conn, &keys.dead_letters(shard)).await {
            g.with_label_values(&[format!("dead:{shard}").as_str(), "dead_letters"])
                .set(n as i64);
        }
        if let Ok(n) = crate::store::timers::count(&mut conn, keys, shard).await {
            g.with_label_values(&[format!("timers:{shard}").as_str(), "timers"])
                .set(n as i64);
        }
    }
}
