//! The composition root: the only place Shepherd's processes are assembled. `main.rs`
//! parses the command line and calls [`run`]; everything a subcommand starts is
//! decided here, from building blocks the layers below export.
//!
//! | command | what it starts |
//! |---|---|
//! | `serve` | the HTTP server with every route ([`http::routes`]) |
//! | `work` | the worker tasks ([`worker_tasks`]) and the small health/metrics endpoint ([`health`]) |
//! | `agents` | the agent runner (`crate::agents::run`) and the health/metrics endpoint |
//! | `run` | a local `redis-server` when none answers ([`local_redis`]), then `serve` and the worker tasks in one process |
//! | `send` | nothing: signs and POSTs one payload ([`send`]) |
//! | `replay`, `inspect`, `rebuild`, `resync`, `dlq` | nothing: one `ops` function, printed ([`commands`]) |
//! | `doctor` | nothing: the checks of `ops::doctor`, printed as a checklist ([`doctor`]); run from `main.rs` before the configuration is validated, since that is its first check |
//!
//! Dependencies run one way (`docs/development.md`): `core` ← `store`, `forgejo` ←
//! `worker` ← `ops` ← `ingest` ← `app`. `crate::cli` is imported only here and by
//! `main.rs`; `tests/it/core_purity.rs` checks both rules.

pub mod commands;
pub mod doctor;
pub mod health;
pub mod http;
pub mod local_redis;
pub mod send;

use std::sync::Arc;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::cli::Command;
use crate::config::Config;
use crate::ingest::AppState;
use crate::ops::Ops;
use crate::store::{Keys, Store};
use crate::telemetry::Metrics;
use crate::worker::{self, consumer, executor, results, resync, timers, trim};

/// Runs one subcommand to completion.
pub async fn run(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::Serve => serve(config, crate::shutdown::on_signals()).await,
        Command::Work(args) => work(config, args.consumer).await,
        Command::Run(args) => run_both(config, args.consumer).await,
        Command::Send(args) => send::run(&args).await,
        Command::Replay(args) => commands::replay_cmd(&operator(config)?, &args).await,
        Command::Inspect(args) => commands::inspect_cmd(&operator(config)?, &args).await,
        Command::Rebuild(args) => commands::rebuild_cmd(&operator(config)?, &args).await,
        Command::Resync(args) => commands::resync_cmd(&operator(config)?, &args).await,
        Command::Dlq(args) => commands::dlq_cmd(&operator(config)?, &args).await,
        Command::Costs(args) => commands::costs_cmd(&operator(config)?, &args).await,
        Command::Agents(args) => {
            let agents = args.settings.validate()?;
            agents_process(config, agents, args.consumer).await
        }
        // `main.rs` runs `doctor::main` instead (it checks the configuration itself).
        Command::Doctor(_) => anyhow::bail!("`doctor` runs before the configuration is read"),
    }
}

/// `shepherd agents`: the agent runner plus its health/metrics endpoint, until
/// SIGINT/SIGTERM.
pub async fn agents_process(
    config: Config,
    agents: crate::config::AgentsConfig,
    consumer: Option<String>,
) -> anyhow::Result<()> {
    let shutdown = crate::shutdown::on_signals();
    let metrics = Metrics::new();
    let config = Arc::new(config);
    let runner = async {
        let r = crate::agents::run(
            config.clone(),
            agents,
            consumer,
            metrics.clone(),
            shutdown.clone(),
        )
        .await;
        shutdown.cancel();
        r
    };
    let watchdog = health::Watchdog::start(shutdown.clone());
    let (result, ()) = tokio::join!(
        runner,
        health::serve_watched(&config, metrics.clone(), Some(watchdog), shutdown.clone())
    );
    result
}

/// The operator tools on a connection of their own.
fn operator(config: Config) -> anyhow::Result<Ops> {
    Ops::connect(Arc::new(config))
}

/// `shepherd serve`: the HTTP server alone (webhooks, health, metrics, results API,
/// admin API, status page) until `shutdown`.
pub async fn serve(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    // AppState::new refuses to start without any webhook secret (global or scoped).
    let state = AppState::new(Arc::new(config), Metrics::new())?;
    http::serve(state, shutdown).await
}

/// `shepherd work`: the worker tasks plus the worker's health/metrics endpoint, until
/// SIGINT/SIGTERM.
pub async fn work(config: Config, consumer: Option<String>) -> anyhow::Result<()> {
    config.require_bot_login_for_executor()?;
    let shutdown = crate::shutdown::on_signals();
    let metrics = Metrics::new();
    let config = Arc::new(config);
    let worker = async {
        let r = worker_tasks(config.clone(), metrics.clone(), consumer, shutdown.clone()).await;
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
/// when none answers at `SHEPHERD_REDIS_URL` (see [`local_redis`]).
pub async fn run_both(config: Config, consumer: Option<String>) -> anyhow::Result<()> {
    config.require_webhook_secrets()?;
    config.require_bot_login_for_executor()?;
    let shutdown = crate::shutdown::on_signals();
    let supervised = local_redis::ensure(&config.redis_url, &config.data_dir).await?;
    let metrics = Metrics::new();
    let config = Arc::new(config);
    let state = AppState::new(config.clone(), metrics.clone())?;
    let server = async {
        let r = http::serve(state, shutdown.clone()).await;
        shutdown.cancel();
        r
    };
    let worker = async {
        let r = worker_tasks(config.clone(), metrics.clone(), consumer, shutdown.clone()).await;
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

/// The Forgejo settings the executor and the periodic resync lack, named for the
/// start line (`None` when both are set).
fn forgejo_missing(config: &Config) -> Option<&'static str> {
    match (config.forgejo_url.is_some(), config.forgejo_token.is_some()) {
        (true, true) => None,
        (false, true) => Some("SHEPHERD_FORGEJO_URL"),
        (true, false) => Some("SHEPHERD_FORGEJO_TOKEN"),
        (false, false) => Some("SHEPHERD_FORGEJO_URL, SHEPHERD_FORGEJO_TOKEN"),
    }
}

/// The worker tasks of `work` and `run`, until `shutdown` is cancelled: the events
/// consumer (`store::consumer`: a reader per shard and the reclaimer), the timer
/// poller, the results intake, the periodic resync, the gauge sampler, the stream
/// trimmer and the executor. Returns once every task has finished its in-flight work
/// (each consumer loop leaves its group on the way out); the first task that fails
/// stops the others.
pub async fn worker_tasks(
    config: Arc<Config>,
    metrics: Metrics,
    consumer: Option<String>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let policy = Arc::new(crate::config::load_policy(&config)?);
    let keys = Keys::new(config.key_prefix.clone(), config.shards);
    let store = Store::connect(&config.redis, keys)
        .await
        .with_context(|| "connecting to Redis at SHEPHERD_REDIS_URL")?;
    let consumer = consumer.unwrap_or_else(worker::consumer_name);
    if config.reclaim_idle < worker::worst_case_processing() {
        tracing::warn!(
            reclaim_idle_ms = config.reclaim_idle.as_millis() as u64,
            worst_case_ms = worker::worst_case_processing().as_millis() as u64,
            "SHEPHERD_RECLAIM_IDLE_SECS is shorter than the worst-case processing time: \
             entries of slow but live consumers may be reclaimed and processed twice \
             (commits stay exactly-once; the work is wasted)"
        );
    }
    let ctx = Arc::new(worker::Context {
        store,
        config,
        metrics,
        policy,
        consumer,
        known_repos: Default::default(),
    });
    tracing::info!(consumer = %ctx.consumer, shards = ctx.config.shards, "worker started");
    if let Some(missing) = forgejo_missing(&ctx.config) {
        tracing::info!(
            unset = %missing,
            "no Forgejo API access, so the executor (comments, labels, merges, work \
             dispatch) and the periodic resync are off; deliveries are still verified, \
             queued and folded into each PR's record, and their effects wait in the \
             effects stream for a worker that has Forgejo access. To turn them on, set \
             SHEPHERD_FORGEJO_URL, SHEPHERD_FORGEJO_TOKEN and SHEPHERD_BOT_LOGIN \
             (`shepherd doctor` checks them)"
        );
    }
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(consumer::run(ctx.clone(), shutdown.clone()));
    tasks.spawn(timers::poll_loop(ctx.clone(), shutdown.clone()));
    tasks.spawn(results::intake_loop(ctx.clone(), shutdown.clone()));
    tasks.spawn(resync::run_periodic_resync(
        ctx.config.clone(),
        resync::Resync {
            conn: ctx.store.conn(),
            keys: ctx.store.keys().clone(),
            policy: ctx.policy.clone(),
        },
        ctx.consumer.clone(),
        Some(ctx.metrics.clone()),
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
