//! The worker side of Shepherd (`shepherd work`): stateless consumers of the events
//! streams that run the pure state machine and commit its transitions, the timer
//! poller, the results intake, and the sampled queue gauges.
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

pub mod consumer;
pub mod dispatch;
pub mod executor;
pub mod health;
pub mod plan;
pub mod process;
pub mod redis_server;
pub mod results;
pub mod results_api;
pub mod resync;
pub mod timers;
pub mod trim;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::core::policy::PolicyFile;
use crate::store::{Keys, Store};
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

/// Loads the policy file named by the configuration (defaults when none), with the bot
/// login applied.
pub fn load_policy(config: &Config) -> anyhow::Result<PolicyFile> {
    let file = match &config.policy_path {
        None => PolicyFile::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the policy file {}", path.display()))?;
            PolicyFile::from_toml(&text).with_context(|| {
                format!("SHEPHERD_CONFIG: invalid policy file {}", path.display())
            })?
        }
    };
    let bot = match &config.bot_login {
        None => None,
        Some(login) => Some(
            login
                .parse()
                .map_err(|e| anyhow::anyhow!("SHEPHERD_BOT_LOGIN: {e}"))?,
        ),
    };
    Ok(file.with_bot_login(bot))
}

/// Runs `shepherd work` until `shutdown` is cancelled: the events consumer (a reader per
/// shard and the reclaimer), the timer poller, the results intake, the executor and
/// the gauge sampler. Returns once every task has finished its in-flight work (each
/// consumer loop leaves its groups on the way out).
pub async fn run(
    config: Arc<Config>,
    metrics: Metrics,
    consumer: Option<String>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let policy = Arc::new(load_policy(&config)?);
    let keys = Keys::new(config.key_prefix.clone(), config.shards);
    let store = Store::connect(&config.redis_url, keys)
        .await
        .with_context(|| "connecting to Redis at SHEPHERD_REDIS_URL")?;
    let consumer = consumer.unwrap_or_else(consumer_name);
    if config.reclaim_idle < worst_case_processing() {
        tracing::warn!(
            reclaim_idle_ms = config.reclaim_idle.as_millis() as u64,
            worst_case_ms = worst_case_processing().as_millis() as u64,
            "SHEPHERD_RECLAIM_IDLE_SECS is shorter than the worst-case processing time: \
             entries of slow but live consumers may be reclaimed and processed twice \
             (commits stay exactly-once; the work is wasted)"
        );
    }
    let ctx = Arc::new(Context {
        store,
        config,
        metrics,
        policy,
        consumer,
        known_repos: Default::default(),
    });
    tracing::info!(consumer = %ctx.consumer, shards = ctx.config.shards, "worker started");
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(consumer::run(ctx.clone(), shutdown.clone()));
    tasks.spawn(timers::poll_loop(ctx.clone(), shutdown.clone()));
    tasks.spawn(results::intake_loop(ctx.clone(), shutdown.clone()));
    tasks.spawn(resync::run_periodic_resync(
        ctx.config.clone(),
        ctx.consumer.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(consumer::gauge_loop(ctx.clone(), shutdown.clone()));
    tasks.spawn(trim::trim_loop(ctx.clone(), shutdown.clone()));
    tasks.spawn(executor::run_executor(ctx.clone(), shutdown.clone()));
    let mut first_error = None;
    while let Some(done) = tasks.join_next().await {
        let err = match done {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(e) => anyhow::anyhow!("worker task panicked: {e}"),
        };
        tracing::error!(error = format!("{err:#}"), "worker task failed; stopping");
        shutdown.cancel();
        first_error.get_or_insert(err);
    }
    tracing::info!(consumer = %ctx.consumer, "worker stopped");
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `shepherd work`: the worker plus its health/metrics endpoint, until SIGINT/SIGTERM.
pub async fn work(config: Config, consumer: Option<String>) -> anyhow::Result<()> {
    config.require_bot_login_for_executor()?;
    let shutdown = crate::shutdown::on_signals();
    let metrics = Metrics::new();
    let config = Arc::new(config);
    let worker = async {
        let r = run(config.clone(), metrics.clone(), consumer, shutdown.clone()).await;
        shutdown.cancel();
        r
    };
    let (result, ()) = tokio::join!(
        worker,
        health::serve(&config, metrics.clone(), shutdown.clone())
    );
    result
}

/// `shepherd run`: serve and work in one process, starting a local redis-server first
/// when none answers at `SHEPHERD_REDIS_URL` (see [`redis_server`]).
pub async fn run_all(config: Config, consumer: Option<String>) -> anyhow::Result<()> {
    config.require_webhook_secrets()?;
    config.require_bot_login_for_executor()?;
    let shutdown = crate::shutdown::on_signals();
    let supervised = redis_server::ensure(&config.redis_url, &config.data_dir).await?;
    let metrics = Metrics::new();
    let config = Arc::new(config);
    let state = crate::ingest::AppState::new(config.clone(), metrics.clone())?;
    let admin = crate::ingest::admin::routes(&state)?;
    let server = async {
        let r = crate::ingest::serve_with(
            actix_web::web::Data::new(state),
            shutdown.clone(),
            move |cfg| {
                results_api::configure(cfg);
                admin(cfg);
            },
        )
        .await;
        shutdown.cancel();
        r
    };
    let worker = async {
        let r = run(config.clone(), metrics.clone(), consumer, shutdown.clone()).await;
        shutdown.cancel();
        r
    };
    let (served, worked) = tokio::join!(server, worker);
    if let Some(redis) = supervised {
        redis.stop().await;
    }
    worked?;
    served
}
