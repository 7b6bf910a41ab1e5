//! The events consumer: the store's consumer loop (`store::consumer`) on every
//! events-stream shard in group `workers`, with [`process`] as its handler, and the
//! sampler of the shard gauges the loop does not own (dead letters, timers).
//!
//! Shutdown: the loop's readers stop between batches, and processing checks the token
//! between the entries of a batch and between the records one entry fans out to. An
//! entry not finished when the token fires is left pending, never acked, so the next
//! reader of the shard (this consumer after a restart, or the reclaimer of another)
//! processes it; entries never started are handed back uncounted. Stopping takes at
//! most one block time plus one record's step and commit, and loses nothing.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Context, process};
pub(crate) use crate::store::consumer::pause;
use crate::store::consumer::{self, Batch, Handled, Handler, Source, Spec};
use crate::store::fields;
use crate::store::keys::WORKERS_GROUP;
use crate::store::streams::{self, Entry};

/// Entries per `XREADGROUP` (and per `XAUTOCLAIM`).
const BATCH: usize = 128;
/// How often the shard gauges are sampled.
const GAUGE_INTERVAL: Duration = Duration::from_secs(5);

/// The events streams' handler: decode, route, step, commit ([`process`]).
struct Events(Arc<Context>);

impl Handler for Events {
    async fn handle(&self, batch: &Batch<'_>, entries: Vec<Entry>) -> Vec<Handled> {
        process::process_batch(&self.0, batch.source.shard, entries, batch.stop).await
    }

    fn dead_lettered(&self, _source: &Source, entry: &Entry, reason: &str) {
        tracing::warn!(
            entry = %entry.id,
            event = %entry.text(fields::EVENT),
            delivery = %entry.text(fields::DELIVERY),
            %reason,
            "dead-lettered a poison entry"
        );
        self.0
            .metrics
            .events_processed
            .with_label_values(&["other", "dead_lettered"])
            .inc();
    }
}

/// The loop's settings for the events streams of every shard.
fn spec(ctx: &Context) -> Spec {
    let keys = ctx.store.keys();
    Spec {
        group: WORKERS_GROUP.to_owned(),
        consumer: ctx.consumer.clone(),
        sources: (0..ctx.config.shards)
            .map(|s| {
                Source::new(
                    keys.events(s),
                    keys.dead_letters(s),
                    s,
                    format!("events:{s}"),
                )
            })
            .collect(),
        batch: BATCH,
        reclaim_idle: ctx.config.reclaim_idle,
        max_deliveries: ctx.config.max_deliveries,
        metrics: Some(consumer::Metrics {
            redis_errors: ctx.metrics.redis_errors.clone(),
            queue_gauges: ctx.metrics.queue_gauges.clone(),
        }),
    }
}

/// Consumes every events shard until shutdown: readers, reclaimer, pending gauges;
/// leaves the group on the way out when it holds nothing.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let spec = spec(&ctx);
    let store = ctx.store.clone();
    consumer::run(&store, spec, Arc::new(Events(ctx)), shutdown).await?;
    Ok(())
}

/// Samples the shard gauges the consumer loop does not own (dead letters, timers)
/// until shutdown.
pub async fn gauge_loop(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    loop {
        sample_gauges(&ctx).await;
        if !pause(GAUGE_INTERVAL, &shutdown).await {
            return Ok(());
        }
    }
}

async fn sample_gauges(ctx: &Context) {
    super::budget_gauge::sample(ctx, streams::now_ms() as i64).await;
    let mut conn = ctx.store.conn();
    let keys = ctx.store.keys();
    let g = &ctx.metrics.queue_gauges;
    for shard in 0..ctx.config.shards {
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
