//! The worker side of Shepherd (`shepherd work`): stateless consumers of the events
//! streams that run the pure state machine and commit its transitions, the timer
//! poller, the results intake, and the sampled queue and budget gauges.
//!
//! ```text
//! events(shard) ──XREADGROUP (batch, BLOCK)──▶ consumer ─▶ decode → route → load
//!        ▲                                          │        → core::step → commit (Lua, CAS, XACK)
//!        │  XAUTOCLAIM after reclaim_idle ◀─ reclaimer (dead consumers' entries)
//!        ├── timers poller (Lua: due timers → internal events)
//!        └── results intake (<prefix>:results, POST /api/v1/work/{id}/result)
//! ```
//!
//! Every process picks a unique consumer name, so any number of them can run; the
//! compare-and-set commit makes concurrent processing of one PR safe, and the commit
//! script refuses an entry another consumer already committed, so each entry is
//! committed exactly once.

pub mod budget_gauge;
pub mod consumer;
pub mod dispatch;
pub mod executor;
pub mod legacy;
pub mod plan;
pub mod process;
pub mod results;
pub mod resync;
pub mod review_metrics;
pub mod timers;
pub mod trim;

use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::core::policy::PolicyFile;
use crate::store::Store;
use crate::telemetry::Metrics;

/// Everything the worker tasks share.
pub struct Context {
    /// Redis.
    pub store: Store,
    /// Validated configuration.
    pub config: Arc<Config>,
    /// Metrics families.
    pub metrics: Metrics,
    /// The policy file (per-repository policies via `for_repo`).
    pub policy: Arc<PolicyFile>,
    /// This process's consumer name in every group.
    pub consumer: String,
    /// Repositories already added to `Keys::repos` by this process.
    pub known_repos: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// Worst-case time to process one events-stream entry: a few commit attempts, each a
/// load and a commit bounded by the Redis command timeout. The reclaim idle time must
/// exceed it, or entries of live consumers get reclaimed (harmless for correctness —
/// the commit script refuses a second commit — but wasted work).
pub fn worst_case_processing() -> Duration {
    crate::store::client::COMMAND_TIMEOUT * 2
}

/// A consumer name unique to this process: `hostname-pid-random`.
pub fn consumer_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    let suffix: u32 = rand::random();
    format!("{host}-{}-{suffix:08x}", std::process::id())
}
