//! `shepherd agents`: the agent runner (DESIGN §4). It consumes the work items of
//! `<prefix>:dispatch` in the consumer group `agents` — any number of runner processes
//! share the stream, and each work item runs on one of them — fetches each item's
//! context from Forgejo, renders its prompt, runs `SHEPHERD_AGENT_COMMAND` for it and
//! reports the result through the results path, exactly once per work id.
//!
//! ```text
//! <prefix>:dispatch ──group "agents"──▶ consume (reader, reclaim, renew, ack)
//!        │                                   │
//!        └──every runner: cancel notices     ▼
//!                         └──────────▶ runner (caps, priority, heartbeat, stop)
//!                                            │ one job per work item
//!                                            ▼
//!       job: bound to the record? (work index + the record's active work: repo,
//!            number, kind, head, attempt, reviewer) → context (Forgejo) → prompt → files
//!                         → launch (exec: own process group, parent-death signal,
//!                           allow-listed environment) → wait | deadline | cancel
//!                           | a runaway guard or the budget (live usage)
//!                         → outcome (result file / exit status / timeout)
//!                         → log (Redis, TTL) → bound to the record again (before a
//!                           verdict is posted, pinned and only on the same head, and
//!                           before the result) → worker::results::submit (once)
//! ```
//!
//! | file | owns |
//! |---|---|
//! | `consume.rs` | everything that touches the dispatch stream |
//! | `runner.rs` | which held item runs next, caps, heartbeat, cancel, shutdown |
//! | `job.rs` | one work item from the check to the report |
//! | `binding.rs` | the check that an entry is the record's active work (refusals) |
//! | `workdir.rs` | the item's folder, files, command line and environment |
//! | `launch.rs` | the `exec` launcher: placeholders, process group, parent-death signal |
//! | `outcome.rs` | result file, exit status, deadline → the reported result; masking |
//! | `transient.rs` | which failed runs are `transient` (policy `transient_patterns` over the output's end, or the result file) |
//! | `checkout.rs` | the optional fresh clone the agent works in |
//! | `context.rs`, `prompt.rs` | what the agent is told |
//! | `epic.rs` | the Epic: an open issue the work's issue blocks (issue dependencies) |
//! | `ci_logs.rs` | the tails and error lines of the failing Actions jobs' logs (Forgejo v16+) |
//! | `review.rs` | `review` work: the verdict file, posted as the reviewer's own review |
//! | `usage.rs` | live usage from the agent's output (`SHEPHERD_AGENT_USAGE`), the runaway guards and the run's budget |
//! | `sandbox.rs` | the bubblewrap sandbox each agent runs in (own PID and user namespace, own folder) |
//!
//! The `shepherd agents` process (`crate::app`) also serves `GET /healthz` and
//! `GET /metrics` on `SHEPHERD_LISTEN`.

pub mod binding;
pub mod checkout;
pub mod ci_logs;
pub mod consume;
pub mod context;
pub mod epic;
pub mod fair;
pub mod job;
pub mod launch;
pub mod outcome;
pub mod prompt;
pub mod review;
pub mod runner;
pub mod sandbox;
pub mod transient;
pub mod usage;
pub mod workdir;
pub mod world;

use std::ffi::OsString;
use std::sync::Arc;

use anyhow::Context as _;
use secrecy::ExposeSecret as _;
use tokio_util::sync::CancellationToken;

use crate::config::{AgentsConfig, Config};
use crate::forgejo::ForgejoClient;
use crate::store::{Keys, Store};
use crate::telemetry::Metrics;

/// Runs the agent runner until `shutdown`: checks the command and the settings first
/// (a program that does not exist fails here, naming the setting). `crate::app`
/// starts it, beside the health and metrics endpoint, for `shepherd agents`.
pub async fn run(
    config: Arc<Config>,
    agents: AgentsConfig,
    consumer: Option<String>,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let program = agents
        .command
        .first()
        .map(String::as_str)
        .unwrap_or_default();
    launch::resolve_program(program, std::env::var_os("PATH").as_deref())
        .map_err(|e| anyhow::anyhow!("invalid configuration: SHEPHERD_AGENT_COMMAND: {e}"))?;
    if agents.checkout.is_some() {
        launch::resolve_program("git", std::env::var_os("PATH").as_deref()).map_err(|e| {
            anyhow::anyhow!("invalid configuration: SHEPHERD_AGENT_CHECKOUT needs git: {e}")
        })?;
    }
    std::fs::create_dir_all(&agents.work_dir).with_context(|| {
        format!(
            "SHEPHERD_AGENT_WORK_DIR: cannot create {}",
            agents.work_dir.display()
        )
    })?;
    let sandbox = start_sandbox(&agents)?;
    let forgejo = ForgejoClient::from_config(&config, Some(metrics.clone()))
        .context("shepherd agents reads each work item's context from Forgejo")?
        .with_cause(crate::forgejo::Cause::Agent);
    // The version decides once whether job logs can be read (`ci_logs`); a failed
    // read is tried again on the first failing Actions check.
    match forgejo.forgejo_version().await {
        Ok(v) => tracing::info!(
            version = %v.text,
            job_logs = v.serves_job_logs(),
            "Forgejo version read"
        ),
        Err(e) => tracing::warn!(error = %e, "the Forgejo version could not be read"),
    }
    let policy = Arc::new(crate::config::load_policy(&config)?);
    let reviewers = reviewer_clients(&config, &agents, &policy, &metrics)?;
    let templates = prompt::Templates::load(&policy)?;
    warn_short_claims(&policy, &agents);
    let keys = Keys::new(config.key_prefix.clone(), config.shards);
    let store = Store::connect(&config.redis, keys)
        .await
        .context("connecting to Redis at SHEPHERD_REDIS_URL")?;
    let name = consumer.unwrap_or_else(crate::worker::consumer_name);
    let spawner = launch::Spawner::start(tokio::runtime::Handle::current())
        .context("starting the agent spawning thread")?;
    let shared = Arc::new(job::Shared {
        base_env: base_env(&agents),
        secrets: outcome::masked_forms(&secrets(&config, &agents)),
        store: store.clone(),
        forgejo,
        policy,
        templates,
        config: config.clone(),
        agents,
        spawner,
        sandbox,
        metrics: metrics.clone(),
        runner: name.clone(),
        reviewers,
    });
    let consumer = Arc::new(consume::Consumer::new(
        store,
        name.clone(),
        config.reclaim_idle,
    ));
    tracing::info!(
        consumer = %name,
        max = shared.agents.max,
        per_repo = shared.agents.per_repo,
        "agent runner started"
    );
    let result = runner::run(shared, consumer, shutdown).await;
    tracing::info!(consumer = %name, "agent runner stopped");
    result
}

/// Makes the runner not dumpable, then probes the sandbox: refuses to start when it
/// cannot start (saying why), or warns when the operator turned it off.
fn start_sandbox(agents: &AgentsConfig) -> anyhow::Result<sandbox::Sandbox> {
    if let Err(e) = sandbox::make_runner_undumpable() {
        tracing::warn!(error = %e, "the runner could not make itself not dumpable");
    }
    if !agents.sandbox {
        tracing::warn!(
            "SHEPHERD_AGENT_SANDBOX=off: agents run unsandboxed, as the runner's user; an \
             injected agent can read the runner's secrets and outlive its work item"
        );
        return Ok(sandbox::Sandbox::Off);
    }
    let what = sandbox::probe(agents).map_err(|e| {
        anyhow::anyhow!("the agent sandbox cannot start (SHEPHERD_AGENT_SANDBOX=on): {e}")
    })?;
    tracing::info!(sandbox = %what, "agent sandbox ready");
    let sb = sandbox::Sandbox::from_config(agents, sandbox::secret_files(agents))
        .map_err(|e| anyhow::anyhow!("the agent sandbox: {e}"))?;
    sandbox::prepare_work_dir(&sb, &agents.work_dir).with_context(|| {
        format!(
            "SHEPHERD_AGENT_WORK_DIR: {} cannot be made passable for the agents' user",
            agents.work_dir.display()
        )
    })?;
    Ok(sb)
}

/// A client per reviewer token (same URL and timeout as the runner's own), and a
/// warning for every reviewer login of the policy without one (its `review` work
/// fails at once, saying so).
fn reviewer_clients(
    config: &Config,
    agents: &AgentsConfig,
    policy: &crate::core::policy::PolicyFile,
    metrics: &Metrics,
) -> anyhow::Result<std::collections::BTreeMap<crate::core::ids::Login, ForgejoClient>> {
    let mut out = std::collections::BTreeMap::new();
    let url = config.forgejo_url.as_deref().unwrap_or_default();
    for (login, token) in &agents.reviewer_tokens {
        let options = crate::forgejo::ClientOptions {
            timeout: Some(config.forgejo_timeout),
            metrics: Some(metrics.clone()),
            ..Default::default()
        };
        let client = ForgejoClient::new(url, token.clone(), options)
            .with_context(|| format!("the Forgejo client of reviewer {login}"))?
            .with_cause(crate::forgejo::Cause::Agent);
        out.insert(login.clone(), client);
    }
    let logins = std::iter::once(&policy.defaults.reviewer_logins)
        .chain(
            policy
                .repos
                .values()
                .filter_map(|o| o.reviewer_logins.as_ref()),
        )
        .flatten();
    for login in logins {
        if !out.keys().any(|l| l.as_str().eq_ignore_ascii_case(login)) {
            tracing::warn!(
                reviewer = %login,
                "a reviewer login of the policy has no token in SHEPHERD_REVIEWER_TOKENS (its review work fails)"
            );
        }
    }
    Ok(out)
}

/// Warns when a policy's claim TTL leaves the agent no time before its deadline.
fn warn_short_claims(policy: &crate::core::policy::PolicyFile, agents: &AgentsConfig) {
    let margin = agents.deadline_margin.as_secs();
    let mut ttls = vec![("defaults".to_owned(), policy.defaults.claim_ttl_secs)];
    ttls.extend(
        policy
            .repos
            .iter()
            .filter_map(|(k, o)| o.claim_ttl_secs.map(|t| (k.clone(), t))),
    );
    for (scope, ttl) in ttls.into_iter().filter(|(_, ttl)| *ttl <= margin) {
        tracing::warn!(
            scope,
            claim_ttl_secs = ttl,
            margin_secs = margin,
            "claim_ttl_secs is not longer than SHEPHERD_AGENT_DEADLINE_MARGIN_SECS: \
             agents of these work items are stopped before they start"
        );
    }
}

/// The allow-listed variables of the runner's own environment (read once, here).
fn base_env(agents: &AgentsConfig) -> Vec<(OsString, OsString)> {
    agents
        .env_pass
        .iter()
        .filter_map(|name| std::env::var_os(name).map(|v| (OsString::from(name), v)))
        .collect()
}

/// Every secret value the runner knows, masked in agents' output and summaries.
fn secrets(config: &Config, agents: &AgentsConfig) -> Vec<String> {
    let mut out: Vec<String> = config
        .webhook_secrets
        .iter()
        .chain(&config.forgejo_token)
        .chain(&config.admin_token)
        .chain(&config.agent_token)
        .chain(&config.dispatch_secret)
        .chain(&agents.forgejo_token)
        .chain(agents.reviewer_tokens.iter().map(|(_, t)| t))
        .map(|s| s.expose_secret().to_owned())
        .collect();
    // The password as the URL spells it and as it is sent (percent-decoded), for every
    // URL form (`redis+sentinel://`, `rediss+cluster://`…).
    out.extend(redis_password(&config.redis_url));
    if let Some(decoded) = config.redis.password()
        && !out.iter().any(|s| s == decoded)
    {
        out.push(decoded.to_owned());
    }
    out
}

/// The password in a Redis URL (`redis://user:password@host`), if any.
fn redis_password(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.rsplit_once('@')?.0;
    let password = userinfo.split_once(':').map_or(userinfo, |(_, p)| p);
    (!password.is_empty()).then(|| password.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_passwords_are_found() {
        assert_eq!(
            redis_password("redis://:pw-1@h:6379/0").as_deref(),
            Some("pw-1")
        );
        assert_eq!(redis_password("redis://u:pw-2@h").as_deref(), Some("pw-2"));
        assert_eq!(redis_password("redis://h:6379"), None);
    }
}
