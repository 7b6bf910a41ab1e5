//! Bounds every stream of Shepherd by the retention window (`SHEPHERD_RETENTION_HOURS`)
//! without ever dropping work: once a minute each stream loses the entries older than
//! the window that every consumer group has delivered and acknowledged
//! ([`streams::trim_acknowledged`]). The events stream (also the replay archive), the
//! effects, results, dispatch and dead-letter streams all go through it; nothing trims
//! at append time any more, so an entry still waiting for a worker is never trimmed.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Context;
use crate::store::streams;

/// How often the streams are trimmed.
const TRIM_EVERY: Duration = Duration::from_secs(60);

/// Trims until `shutdown`, first one period after start.
pub async fn trim_loop(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    while super::consumer::pause(TRIM_EVERY, &shutdown).await {
        trim_all(&ctx).await;
    }
    Ok(())
}

/// One pass over every stream; a failure is logged and retried at the next pass.
pub async fn trim_all(ctx: &Context) {
    let keys = ctx.store.keys();
    let retention = u64::try_from(ctx.config.retention.as_millis()).unwrap_or(u64::MAX);
    let older_than = streams::now_ms().saturating_sub(retention);
    let mut names = vec![keys.dispatch(), keys.results()];
    for shard in 0..ctx.config.shards {
        names.extend([
            keys.events(shard),
            keys.effects(shard),
            keys.dead_letters(shard),
        ]);
    }
    let mut conn = ctx.store.conn();
    for stream in names {
        match streams::trim_acknowledged(&mut conn, &stream, older_than).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(stream, trimmed = n, "stream trimmed"),
            Err(e) => tracing::warn!(stream, error = %e, "trimming a stream failed"),
        }
    }
}
