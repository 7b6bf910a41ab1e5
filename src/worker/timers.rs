//! The timer poller: turns due timers into internal events (see `store::timers`). Every
//! worker process runs one; the pop is atomic, so each timer fires exactly once however
//! many pollers there are.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Context;
use super::consumer::pause;
use crate::store::{streams, timers};

/// How often due timers are looked for (the resolution of every timer).
const POLL_EVERY: Duration = Duration::from_millis(200);
/// Timers popped per script call (the call repeats while it gets a full batch).
const POP_LIMIT: usize = 256;

/// Pops due timers of every shard until shutdown.
pub async fn poll_loop(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut conn = ctx.store.conn();
    while pause(POLL_EVERY, &shutdown).await {
        for shard in 0..ctx.config.shards {
            loop {
                match timers::pop_due(
                    &mut conn,
                    ctx.store.keys(),
                    shard,
                    streams::now_ms(),
                    POP_LIMIT,
                )
                .await
                {
                    Ok(n) if n == POP_LIMIT => continue,
                    Ok(0) => break,
                    Ok(n) => {
                        tracing::debug!(shard, fired = n, "timers fired");
                        break;
                    }
                    Err(e) => {
                        ctx.metrics
                            .redis_errors
                            .with_label_values(&["timers"])
                            .inc();
                        tracing::warn!(shard, error = %e, "popping due timers failed");
                        break;
                    }
                }
            }
        }
    }
    Ok(())
}
