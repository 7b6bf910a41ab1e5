//! Process configuration: every setting is an environment variable and a flag of the
//! same name (`SHEPHERD_LISTEN` ⇔ `--listen`), read once at start into [`Config`] and
//! validated loudly. Policy (what the state machine does per repository) lives in a
//! separate TOML file named by `SHEPHERD_CONFIG`, loaded by `core::policy`.
//!
//! Secrets (`SHEPHERD_WEBHOOK_SECRETS`, tokens) are held as [`SecretString`] from the
//! moment they are parsed: they never appear in `Debug` output, logs, errors, or as
//! `--help` defaults (`hide_env_values`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use secrecy::{ExposeSecret, SecretString};

use crate::core::ids::Login;

mod redis_target;
pub use redis_target::{RedisTarget, TlsFiles, Topology};

/// Log output format (`SHEPHERD_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Raw settings as clap parses them from flags and environment variables. Turned into a
/// validated [`Config`] by [`Settings::validate`].
#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// Address the HTTP server listens on.
    #[arg(
        long,
        env = "SHEPHERD_LISTEN",
        default_value = "127.0.0.1:8080",
        global = true
    )]
    pub listen: String,

    /// Redis URL: one server (`redis://`, `rediss://` for TLS, `redis+unix://`,
    /// `unix://`), a Sentinel-managed primary
    /// (`redis+sentinel://host1:26379,host2:26379/mymaster`, `rediss+sentinel://…`) or a
    /// Redis Cluster (`redis+cluster://host1:7000,host2:7001,…`, `rediss+cluster://…`).
    #[arg(
        long,
        env = "SHEPHERD_REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true,
        global = true
    )]
    pub redis_url: String,

    /// PEM file of the CA(s) a TLS Redis's certificate must chain to (default: the
    /// system roots). Only with a `rediss…` URL.
    #[arg(long, env = "SHEPHERD_REDIS_CA_FILE", global = true)]
    pub redis_ca_file: Option<PathBuf>,

    /// PEM client certificate for a TLS Redis that requires one (with
    /// SHEPHERD_REDIS_CLIENT_KEY_FILE).
    #[arg(long, env = "SHEPHERD_REDIS_CLIENT_CERT_FILE", global = true)]
    pub redis_client_cert_file: Option<PathBuf>,

    /// PEM private key of SHEPHERD_REDIS_CLIENT_CERT_FILE.
    #[arg(long, env = "SHEPHERD_REDIS_CLIENT_KEY_FILE", global = true)]
    pub redis_client_key_file: Option<PathBuf>,

    /// Prefix of every Redis key Shepherd writes (tests and tenants isolate with it).
    #[arg(
        long,
        env = "SHEPHERD_KEY_PREFIX",
        default_value = "shepherd",
        global = true
    )]
    pub key_prefix: String,

    /// Comma-separated webhook secrets; a delivery signed with any of them is accepted
    /// (rotation: add the new secret, switch Forgejo, remove the old one).
    #[arg(long, env = "SHEPHERD_WEBHOOK_SECRETS", hide_env_values = true, value_parser = parse_secret, global = true)]
    pub webhook_secrets: Option<SecretString>,

    /// Base URL of the Forgejo instance, without `/api/v1` (e.g. https://forge.example.org).
    #[arg(long, env = "SHEPHERD_FORGEJO_URL", global = true)]
    pub forgejo_url: Option<String>,

    /// API token of the bot user (scopes write:repository and write:issue).
    #[arg(long, env = "SHEPHERD_FORGEJO_TOKEN", hide_env_values = true, value_parser = parse_secret, global = true)]
    pub forgejo_token: Option<SecretString>,

    /// Login of the bot user; events it causes update facts but never start work.
    /// Required by `work` and `run` when the executor is on (Forgejo URL and token set).
    #[arg(long, env = "SHEPHERD_BOT_LOGIN", global = true)]
    pub bot_login: Option<String>,

    /// Bearer token for `/api/v1/admin/…` and the status page; the admin API is off
    /// when unset.
    #[arg(long, env = "SHEPHERD_ADMIN_TOKEN", hide_env_values = true, value_parser = parse_secret, global = true)]
    pub admin_token: Option<SecretString>,

    /// Bearer token agents use to report work results; the results API is off when unset.
    #[arg(long, env = "SHEPHERD_AGENT_TOKEN", hide_env_values = true, value_parser = parse_secret, global = true)]
    pub agent_token: Option<SecretString>,

    /// URL that work items are also POSTed to (signed with SHEPHERD_DISPATCH_SECRET).
    #[arg(long, env = "SHEPHERD_DISPATCH_URL", global = true)]
    pub dispatch_url: Option<String>,

    /// Secret for the `X-Shepherd-Signature` of dispatched work items.
    #[arg(long, env = "SHEPHERD_DISPATCH_SECRET", hide_env_values = true, value_parser = parse_secret, global = true)]
    pub dispatch_secret: Option<SecretString>,

    /// Log format.
    #[arg(
        long,
        env = "SHEPHERD_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,

    /// Log filter in `tracing` syntax (e.g. `info,shepherd=debug`).
    #[arg(long, env = "SHEPHERD_LOG", default_value = "info", global = true)]
    pub log: String,

    /// Policy file (TOML); built-in defaults when unset.
    #[arg(long, env = "SHEPHERD_CONFIG", global = true)]
    pub config: Option<PathBuf>,

    /// Largest accepted webhook body in bytes; larger bodies get 413.
    #[arg(long, env = "SHEPHERD_MAX_BODY_BYTES", default_value_t = 5 * 1024 * 1024, global = true)]
    pub max_body_bytes: usize,

    /// Per-command Redis timeout on the ingest path, in milliseconds (503 after it).
    #[arg(
        long,
        env = "SHEPHERD_REDIS_TIMEOUT_MS",
        default_value_t = 1000,
        global = true
    )]
    pub redis_timeout_ms: u64,

    /// Replicas that must hold an accepted delivery before the ingest answers 2xx
    /// (`WAIT` after the enqueue; 503 when fewer confirm within half the Redis
    /// timeout). 0: the primary's own acknowledgement suffices (with AOF `appendfsync
    /// always`, durable on its disk, but a failover may lose it).
    #[arg(
        long,
        env = "SHEPHERD_REDIS_WAIT_REPLICAS",
        default_value_t = 0,
        global = true
    )]
    pub redis_wait_replicas: u32,

    /// How long accepted deliveries are kept for replay and dedup, in hours.
    #[arg(
        long,
        env = "SHEPHERD_RETENTION_HOURS",
        default_value_t = 168,
        global = true
    )]
    pub retention_hours: u64,

    /// Number of event-stream shards (repositories are hashed onto shards).
    #[arg(long, env = "SHEPHERD_SHARDS", default_value_t = 1, global = true)]
    pub shards: u16,

    /// Seconds between periodic resyncs of every known repository (0 = off).
    #[arg(
        long,
        env = "SHEPHERD_RESYNC_INTERVAL_SECS",
        default_value_t = 600,
        global = true
    )]
    pub resync_interval_secs: u64,

    /// Seconds between full resync sweeps, which re-read every open PR's combined status
    /// and reviews even when nothing the PR list shows has changed (0 = every pass).
    #[arg(
        long,
        env = "SHEPHERD_RESYNC_FULL_INTERVAL_SECS",
        default_value_t = 86400,
        global = true
    )]
    pub resync_full_interval_secs: u64,

    /// Idle time after which a pending entry of a dead consumer is reclaimed, in seconds.
    #[arg(
        long,
        env = "SHEPHERD_RECLAIM_IDLE_SECS",
        default_value_t = 60,
        global = true
    )]
    pub reclaim_idle_secs: u64,

    /// Deliveries of one stream entry before it goes to the dead-letter stream.
    #[arg(
        long,
        env = "SHEPHERD_MAX_DELIVERIES",
        default_value_t = 5,
        global = true
    )]
    pub max_deliveries: u32,

    /// Timeout of one Forgejo API request, in milliseconds.
    #[arg(
        long,
        env = "SHEPHERD_FORGEJO_TIMEOUT_MS",
        default_value_t = 10_000,
        global = true
    )]
    pub forgejo_timeout_ms: u64,

    /// Data directory of the redis-server that `shepherd run` starts when none is running.
    #[arg(
        long,
        env = "SHEPHERD_DATA_DIR",
        default_value = ".shepherd-data",
        global = true
    )]
    pub data_dir: PathBuf,
}

/// Settings of `shepherd agents` (the agent runner, DESIGN §4), each an environment
/// variable and a flag. Validated into [`AgentsConfig`] by [`AgentSettings::validate`].
#[derive(Debug, Clone, Args)]
pub struct AgentSettings {
    /// The agent's command line (contract), split like a shell splits words but never
    /// run through a shell. Placeholders: {agent} {model} {tier} {tier_name} {kind}
    /// {prompt_file} {work_file}. The prompt also arrives on stdin.
    #[arg(long, env = "SHEPHERD_AGENT_COMMAND")]
    pub agent_command: Option<String>,

    /// Most agents this runner process runs at once.
    #[arg(long, env = "SHEPHERD_AGENTS_MAX", default_value_t = 2)]
    pub agents_max: usize,

    /// Most agents this runner process runs at once for one repository.
    #[arg(long, env = "SHEPHERD_AGENTS_PER_REPO", default_value_t = 1)]
    pub agents_per_repo: usize,

    /// Seconds between SIGTERM and SIGKILL when an agent's process group is stopped.
    #[arg(long, env = "SHEPHERD_AGENT_KILL_GRACE_SECS", default_value_t = 10)]
    pub agent_kill_grace_secs: u64,

    /// The agent is stopped (and `failed`/`timeout` reported) this many seconds before
    /// its claim expires, so the result arrives while the claim still holds.
    #[arg(
        long,
        env = "SHEPHERD_AGENT_DEADLINE_MARGIN_SECS",
        default_value_t = 60
    )]
    pub agent_deadline_margin_secs: u64,

    /// Bytes of an agent's output kept (the newest; secrets masked).
    #[arg(long, env = "SHEPHERD_AGENT_LOG_BYTES", default_value_t = 1024 * 1024)]
    pub agent_log_bytes: usize,

    /// Comma-separated names of further environment variables the agent may see (e.g.
    /// its model provider's API key). Names starting with SHEPHERD_ are refused.
    #[arg(long, env = "SHEPHERD_AGENT_ENV", default_value = "")]
    pub agent_env: String,

    /// Directory for the per-work-item folders (prompt, work item, result file);
    /// default: the system's temporary directory.
    #[arg(long, env = "SHEPHERD_AGENT_WORK_DIR")]
    pub agent_work_dir: Option<PathBuf>,

    /// A Forgejo token for the agents (best: a second token of the bot user, so their
    /// pushes count as the bot's). Shepherd's own token never reaches an agent; without
    /// this one an agent gets no token at all.
    #[arg(long, env = "SHEPHERD_AGENT_FORGEJO_TOKEN", hide_env_values = true, value_parser = parse_secret)]
    pub agent_forgejo_token: Option<SecretString>,

    /// Opt in to handing the agent token to the agent: in the prompt (`forgejo_pat`)
    /// and as `SHEPHERD_AGENT_FORGEJO_TOKEN` in its environment.
    #[arg(long, env = "SHEPHERD_AGENT_CREDENTIALS", default_value_t = false, action = clap::ArgAction::Set)]
    pub agent_credentials: bool,

    /// The git author name the agents commit as (`git_user_name` of the
    /// `cleveragents-v2` prompt, `GIT_USER_NAME`, and the checkout's `user.name`).
    #[arg(long, env = "SHEPHERD_AGENT_GIT_NAME")]
    pub agent_git_name: Option<String>,

    /// The git author e-mail the agents commit as (`git_user_email`,
    /// `GIT_USER_EMAIL`, the checkout's `user.email`).
    #[arg(long, env = "SHEPHERD_AGENT_GIT_EMAIL")]
    pub agent_git_email: Option<String>,

    /// The agent (`{agent}`) `review` work runs under the `cleveragents-v2` prompt
    /// profile: the implementation worker never reviews.
    #[arg(long, env = "SHEPHERD_REVIEW_AGENT")]
    pub review_agent: Option<String>,

    /// Run each agent in a fresh clone of the repository, on the PR's head branch
    /// (with SHEPHERD_AGENT_FORGEJO_TOKEN, git authenticates with it through the
    /// environment, and so does the agent's own `git push`).
    #[arg(long, env = "SHEPHERD_AGENT_CHECKOUT", default_value_t = false, action = clap::ArgAction::Set)]
    pub agent_checkout: bool,

    /// Clone URL of a repository for the checkout; {forgejo_url}, {owner}, {repo}.
    #[arg(
        long,
        env = "SHEPHERD_AGENT_CLONE_URL",
        default_value = "{forgejo_url}/{owner}/{repo}.git"
    )]
    pub agent_clone_url: String,

    /// The reviewer agents' Forgejo tokens, `login=token` pairs separated by commas
    /// (the users of the policy's `reviewer_logins`). The runner posts a reviewer
    /// agent's verdict with its user's token; no token ever reaches an agent.
    #[arg(long, env = "SHEPHERD_REVIEWER_TOKENS", hide_env_values = true, value_parser = parse_secret)]
    pub reviewer_tokens: Option<SecretString>,

    /// A file of `login=token` lines (`#` comments), read at start, instead of or
    /// besides SHEPHERD_REVIEWER_TOKENS.
    #[arg(long, env = "SHEPHERD_REVIEWER_TOKENS_FILE")]
    pub reviewer_tokens_file: Option<PathBuf>,

    /// `on`: every agent runs in a bubblewrap sandbox (own PID and user namespace,
    /// another uid when the runner is root, only its own folder and a private /tmp
    /// writable); `shepherd agents` refuses to start when the sandbox cannot start.
    /// `off`: agents run as the runner's user (a warning at every start, and "agents
    /// unsandboxed" on the status page).
    #[arg(long, env = "SHEPHERD_AGENT_SANDBOX", default_value = "on", value_parser = ["on", "off"])]
    pub agent_sandbox: String,

    /// Colon-separated paths the sandboxed agent may also write (shared caches: npm,
    /// cargo, pip); paths that do not exist are skipped.
    #[arg(long, env = "SHEPHERD_AGENT_SANDBOX_WRITABLE", default_value = "")]
    pub agent_sandbox_writable: String,

    /// Colon-separated paths under `/tmp` (which the sandbox replaces with a private
    /// tmpfs) that agents must still read: tools installed there (an opencode under
    /// `/tmp/…/node_modules`). Never a folder of the items.
    #[arg(long, env = "SHEPHERD_AGENT_SANDBOX_READABLE", default_value = "")]
    pub agent_sandbox_readable: String,

    /// `uid:gid` the sandboxed agents run as when the runner runs as root (never 0; the
    /// agents image's `shepherd-agent` user is 10002:10002). A non-root runner's agents
    /// keep its uid outside their user namespace.
    #[arg(long, env = "SHEPHERD_AGENT_UID", default_value = "65534:65534")]
    pub agent_uid: String,

    /// Live usage from the agent's output: `opencode-json` reads the events of
    /// `opencode run --format json` (tokens, cost, steps, tool calls) as the agent runs
    /// and enforces the work item's budget and runaway guards (`max_steps_per_run`, …);
    /// `off`: usage only from the result file, and only the idle guard applies.
    #[arg(long, env = "SHEPHERD_AGENT_USAGE", default_value = "off", value_parser = ["off", "opencode-json"])]
    pub agent_usage: String,
}

/// `uid:gid` (or a bare `uid`, the gid then equal) of `SHEPHERD_AGENT_UID`; root is
/// refused, since the point of the setting is a user other than the runner.
fn parse_uid_gid(text: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = text.split_once(':').unwrap_or((text, text));
    let number = |s: &str| {
        s.trim()
            .parse::<u32>()
            .map_err(|_| format!("{text:?} is not uid:gid (two numbers)"))
    };
    let (uid, gid) = (number(uid)?, number(gid)?);
    if uid == 0 || gid == 0 {
        return Err("agents never run as root (uid or gid 0)".into());
    }
    Ok((uid, gid))
}

/// Where live usage comes from (`SHEPHERD_AGENT_USAGE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UsageSource {
    /// None: usage only from the result file; only the idle guard applies.
    #[default]
    Off,
    /// `opencode run --format json` events on the agent's stdout.
    OpencodeJson,
}

impl UsageSource {
    /// Parses the setting's value (`off` or `opencode-json`).
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "" | "off" => Ok(UsageSource::Off),
            "opencode-json" => Ok(UsageSource::OpencodeJson),
            other => Err(format!("{other:?} is not `off` or `opencode-json`")),
        }
    }
}

/// Environment variables every agent may see (besides `SHEPHERD_AGENT_ENV` and the
/// work item's own `SHEPHERD_*` variables): nothing else of the runner's environment
/// reaches it, so none of Shepherd's secrets can.
pub const AGENT_ENV_ALLOWED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TZ",
    "TERM",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
];

/// The validated settings of `shepherd agents`.
#[derive(Debug, Clone)]
pub struct AgentsConfig {
    /// The command line's words (placeholders not yet filled in).
    pub command: Vec<String>,
    /// Total concurrency of this process (≥ 1).
    pub max: usize,
    /// Concurrency per repository (1..=max).
    pub per_repo: usize,
    /// SIGTERM → SIGKILL grace period.
    pub kill_grace: Duration,
    /// Stop this long before the claim expires.
    pub deadline_margin: Duration,
    /// Output bytes kept per work item.
    pub log_bytes: usize,
    /// Environment variables passed through to agents (allow-list plus extras).
    pub env_pass: Vec<String>,
    /// Parent directory of the per-work-item folders.
    pub work_dir: PathBuf,
    /// The agents' Forgejo token.
    pub forgejo_token: Option<SecretString>,
    /// Whether the agent token is handed to the agent (prompt and environment).
    pub credentials: bool,
    /// The agents' git identity (`SHEPHERD_AGENT_GIT_NAME`, `…_EMAIL`).
    pub git_identity: (Option<String>, Option<String>),
    /// The reviewer agent's name under `cleveragents-v2` (`SHEPHERD_REVIEW_AGENT`).
    pub review_agent: Option<String>,
    /// The clone URL template, when each agent gets a fresh checkout.
    pub checkout: Option<String>,
    /// The reviewer agents' tokens by login (`SHEPHERD_REVIEWER_TOKENS[_FILE]`).
    pub reviewer_tokens: Vec<(Login, SecretString)>,
    /// The reviewer tokens' file (hidden inside the agents' sandbox).
    pub reviewer_tokens_file: Option<PathBuf>,
    /// Agents run in the sandbox (`SHEPHERD_AGENT_SANDBOX=on`).
    pub sandbox: bool,
    /// Extra writable paths inside the sandbox (`SHEPHERD_AGENT_SANDBOX_WRITABLE`).
    pub sandbox_writable: Vec<PathBuf>,
    /// Paths under the private `/tmp` still readable inside the sandbox
    /// (`SHEPHERD_AGENT_SANDBOX_READABLE`).
    pub sandbox_readable: Vec<PathBuf>,
    /// The uid and gid a root runner's agents run as (`SHEPHERD_AGENT_UID`).
    pub agent_uid: (u32, u32),
    /// Where live usage comes from (`SHEPHERD_AGENT_USAGE`).
    pub usage: UsageSource,
}

#[cfg(test)]
impl AgentsConfig {
    /// The defaults of `shepherd agents --agent-command COMMAND`, for unit tests.
    pub fn for_tests(command: &str) -> Self {
        #[derive(clap::Parser)]
        struct A {
            #[command(flatten)]
            s: AgentSettings,
        }
        <A as clap::Parser>::try_parse_from(["t", "--agent-command", command])
            .expect("parse")
            .s
            .validate()
            .expect("valid agent settings")
    }
}

impl AgentSettings {
    /// Validates the runner's settings, failing with the name of the first bad one.
    pub fn validate(&self) -> Result<AgentsConfig, ConfigError> {
        let line = self
            .agent_command
            .as_deref()
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .ok_or_else(|| bad("SHEPHERD_AGENT_COMMAND", "is required by `shepherd agents`"))?;
        let command = shlex::split(line).ok_or_else(|| {
            bad(
                "SHEPHERD_AGENT_COMMAND",
                "cannot be split into words (an unclosed quote or a trailing backslash)",
            )
        })?;
        match command.first() {
            None => return Err(bad("SHEPHERD_AGENT_COMMAND", "has no program")),
            Some(p) if p.contains('{') => {
                return Err(bad(
                    "SHEPHERD_AGENT_COMMAND",
                    "the program (first word) cannot be a placeholder",
                ));
            }
            Some(_) => {}
        }
        if self.agents_max == 0 || self.agents_max > 256 {
            return Err(bad("SHEPHERD_AGENTS_MAX", "must be between 1 and 256"));
        }
        if self.agents_per_repo == 0 {
            return Err(bad("SHEPHERD_AGENTS_PER_REPO", "must be at least 1"));
        }
        if self.agent_log_bytes < 1024 || self.agent_log_bytes > 64 * 1024 * 1024 {
            return Err(bad(
                "SHEPHERD_AGENT_LOG_BYTES",
                "must be between 1 KiB and 64 MiB",
            ));
        }
        let mut env_pass: Vec<String> = AGENT_ENV_ALLOWED.iter().map(|s| (*s).to_owned()).collect();
        for name in self
            .agent_env
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
        {
            if name.to_ascii_uppercase().starts_with("SHEPHERD_") {
                return Err(bad(
                    "SHEPHERD_AGENT_ENV",
                    format!("{name} is Shepherd's own setting and never reaches an agent"),
                ));
            }
            if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(bad(
                    "SHEPHERD_AGENT_ENV",
                    format!("{name:?} is not a variable name"),
                ));
            }
            env_pass.push(name.to_owned());
        }
        if let Some(t) = &self.agent_forgejo_token
            && t.expose_secret().trim().is_empty()
        {
            return Err(bad("SHEPHERD_AGENT_FORGEJO_TOKEN", "is set but empty"));
        }
        if self.agent_checkout && !self.agent_clone_url.contains("{repo}") {
            return Err(bad("SHEPHERD_AGENT_CLONE_URL", "must contain {repo}"));
        }
        if self.agent_credentials && self.agent_forgejo_token.is_none() {
            return Err(bad(
                "SHEPHERD_AGENT_CREDENTIALS",
                "needs SHEPHERD_AGENT_FORGEJO_TOKEN (Shepherd's own token is never handed out)",
            ));
        }
        let reviewer_tokens = self.reviewer_tokens()?;
        let sandbox_writable: Vec<PathBuf> = std::env::split_paths(&self.agent_sandbox_writable)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        if let Some(p) = sandbox_writable.iter().find(|p| !p.is_absolute()) {
            return Err(bad(
                "SHEPHERD_AGENT_SANDBOX_WRITABLE",
                format!("{} is not an absolute path", p.display()),
            ));
        }
        let sandbox_readable: Vec<PathBuf> = std::env::split_paths(&self.agent_sandbox_readable)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        if let Some(p) = sandbox_readable.iter().find(|p| !p.is_absolute()) {
            return Err(bad(
                "SHEPHERD_AGENT_SANDBOX_READABLE",
                format!("{} is not an absolute path", p.display()),
            ));
        }
        let agent_uid = parse_uid_gid(&self.agent_uid).map_err(|e| bad("SHEPHERD_AGENT_UID", e))?;
        let usage =
            UsageSource::parse(&self.agent_usage).map_err(|e| bad("SHEPHERD_AGENT_USAGE", e))?;
        Ok(AgentsConfig {
            usage,
            reviewer_tokens,
            reviewer_tokens_file: self.reviewer_tokens_file.clone(),
            sandbox: self.agent_sandbox == "on",
            sandbox_writable,
            sandbox_readable,
            agent_uid,
            command,
            max: self.agents_max,
            per_repo: self.agents_per_repo.min(self.agents_max),
            kill_grace: Duration::from_secs(self.agent_kill_grace_secs),
            deadline_margin: Duration::from_secs(self.agent_deadline_margin_secs),
            log_bytes: self.agent_log_bytes,
            env_pass,
            work_dir: self
                .agent_work_dir
                .clone()
                .unwrap_or_else(std::env::temp_dir),
            forgejo_token: self.agent_forgejo_token.clone(),
            credentials: self.agent_credentials,
            git_identity: (self.agent_git_name.clone(), self.agent_git_email.clone()),
            review_agent: self.review_agent.clone(),
            checkout: self.agent_checkout.then(|| self.agent_clone_url.clone()),
        })
    }
}

impl AgentSettings {
    /// The reviewer tokens of `SHEPHERD_REVIEWER_TOKENS` and `…_FILE`: `login=token`
    /// pairs; a login given twice, an empty token or a malformed entry fails, naming
    /// the setting and the entry's position, never the token.
    fn reviewer_tokens(&self) -> Result<Vec<(Login, SecretString)>, ConfigError> {
        let mut out: Vec<(Login, SecretString)> = Vec::new();
        let mut add = |setting: &'static str, n: usize, entry: &str| {
            let (login, token) = entry
                .split_once('=')
                .map(|(l, t)| (l.trim(), t.trim()))
                .filter(|(l, t)| !l.is_empty() && !t.is_empty())
                .ok_or_else(|| bad(setting, format!("entry {n} is not login=token")))?;
            let login: Login = login
                .parse()
                .map_err(|_| bad(setting, format!("entry {n} has an invalid login")))?;
            if out.iter().any(|(l, _)| *l == login) {
                return Err(bad(setting, format!("{login} is given twice")));
            }
            out.push((login, SecretString::from(token.to_owned())));
            Ok(())
        };
        if let Some(list) = &self.reviewer_tokens {
            let entries = list.expose_secret().split(',').map(str::trim);
            for (i, entry) in entries.filter(|e| !e.is_empty()).enumerate() {
                add("SHEPHERD_REVIEWER_TOKENS", i + 1, entry)?;
            }
        }
        if let Some(path) = &self.reviewer_tokens_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                bad(
                    "SHEPHERD_REVIEWER_TOKENS_FILE",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            let lines = text.lines().map(str::trim).enumerate();
            for (i, line) in lines.filter(|(_, l)| !l.is_empty() && !l.starts_with('#')) {
                add("SHEPHERD_REVIEWER_TOKENS_FILE", i + 1, line)?;
            }
        }
        Ok(out)
    }
}

/// Parses a secret straight into a [`SecretString`] so it is never held as plain text.
fn parse_secret(s: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(s.to_owned()))
}

/// A configuration error, naming the setting at fault.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {setting}: {reason}")]
pub struct ConfigError {
    /// Environment variable name of the setting.
    pub setting: &'static str,
    /// What is wrong with it (never the secret value itself).
    pub reason: String,
}

fn bad(setting: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        setting,
        reason: reason.into(),
    }
}

/// The validated configuration, loaded once at start and shared read-only.
#[derive(Debug, Clone)]
pub struct Config {
    /// Socket address of the HTTP server.
    pub listen: SocketAddr,
    /// Redis connection URL (may hold a password: never log it).
    pub redis_url: String,
    /// The parsed URL and TLS material: topology, TLS, credentials.
    pub redis: RedisTarget,
    /// Prefix of every Redis key.
    pub key_prefix: String,
    /// Webhook secrets accepted for any repository (rotation: several).
    pub webhook_secrets: Vec<SecretString>,
    /// Forgejo base URL without a trailing slash and without `/api/v1`.
    pub forgejo_url: Option<String>,
    /// Bot API token.
    pub forgejo_token: Option<SecretString>,
    /// Bot login (lower-cased).
    pub bot_login: Option<String>,
    /// Admin bearer token.
    pub admin_token: Option<SecretString>,
    /// Agent bearer token.
    pub agent_token: Option<SecretString>,
    /// HTTP dispatch sink.
    pub dispatch_url: Option<String>,
    /// Secret signing HTTP dispatches.
    pub dispatch_secret: Option<SecretString>,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter.
    pub log: String,
    /// Policy file path.
    pub policy_path: Option<PathBuf>,
    /// Webhook body limit.
    pub max_body_bytes: usize,
    /// Redis timeout on the ingest path.
    pub redis_timeout: Duration,
    /// Replicas that must confirm an accepted delivery (`WAIT`; 0: none).
    pub redis_wait_replicas: u32,
    /// Replay window / dedup retention.
    pub retention: Duration,
    /// Event-stream shard count (≥ 1).
    pub shards: u16,
    /// Periodic resync interval; `None` when off.
    pub resync_interval: Option<Duration>,
    /// Interval of the full resync sweep (`Duration::ZERO`: every pass is full).
    pub resync_full_interval: Duration,
    /// Reclaim idle time for pending entries of dead consumers.
    pub reclaim_idle: Duration,
    /// Deliveries before dead-lettering.
    pub max_deliveries: u32,
    /// Per-request Forgejo timeout.
    pub forgejo_timeout: Duration,
    /// Data directory for a supervised redis-server (`shepherd run`).
    pub data_dir: PathBuf,
}

impl Settings {
    /// Validates every setting, failing with the name of the first bad one.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let listen = self.listen.parse::<SocketAddr>().map_err(|e| {
            bad(
                "SHEPHERD_LISTEN",
                format!("{:?} is not host:port ({e})", self.listen),
            )
        })?;
        let redis = RedisTarget::parse(&self.redis_url)
            .map_err(|reason| bad("SHEPHERD_REDIS_URL", reason))?
            .with_tls_files(
                self.redis_ca_file.as_deref(),
                self.redis_client_cert_file.as_deref(),
                self.redis_client_key_file.as_deref(),
            )
            .map_err(|(setting, reason)| bad(setting, reason))?;
        if self.key_prefix.is_empty()
            || !self
                .key_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
        {
            return Err(bad(
                "SHEPHERD_KEY_PREFIX",
                "must be non-empty and use only letters, digits, '-', '_', '.', ':'",
            ));
        }
        let webhook_secrets = match &self.webhook_secrets {
            None => Vec::new(),
            Some(all) => {
                let mut out = Vec::new();
                for (i, s) in all.expose_secret().split(',').enumerate() {
                    let s = s.trim();
                    if s.is_empty() {
                        return Err(bad(
                            "SHEPHERD_WEBHOOK_SECRETS",
                            format!("secret #{} is empty", i + 1),
                        ));
                    }
                    out.push(SecretString::from(s.to_owned()));
                }
                out
            }
        };
        let forgejo_url = match &self.forgejo_url {
            None => None,
            Some(u) => {
                let u = u.trim_end_matches('/');
                if !(u.starts_with("http://") || u.starts_with("https://")) {
                    return Err(bad(
                        "SHEPHERD_FORGEJO_URL",
                        "must start with http:// or https://",
                    ));
                }
                if u.ends_with("/api/v1") {
                    return Err(bad(
                        "SHEPHERD_FORGEJO_URL",
                        "give the instance's base URL, without /api/v1",
                    ));
                }
                Some(u.to_owned())
            }
        };
        let dispatch_url = match &self.dispatch_url {
            None => None,
            Some(u) if u.starts_with("http://") || u.starts_with("https://") => Some(u.clone()),
            Some(_) => {
                return Err(bad(
                    "SHEPHERD_DISPATCH_URL",
                    "must start with http:// or https://",
                ));
            }
        };
        if dispatch_url.is_some() && self.dispatch_secret.is_none() {
            return Err(bad(
                "SHEPHERD_DISPATCH_SECRET",
                "is required when SHEPHERD_DISPATCH_URL is set",
            ));
        }
        for (name, tok) in [
            ("SHEPHERD_FORGEJO_TOKEN", &self.forgejo_token),
            ("SHEPHERD_ADMIN_TOKEN", &self.admin_token),
            ("SHEPHERD_AGENT_TOKEN", &self.agent_token),
            ("SHEPHERD_DISPATCH_SECRET", &self.dispatch_secret),
        ] {
            if let Some(t) = tok
                && t.expose_secret().trim().is_empty()
            {
                return Err(bad(name, "is set but empty"));
            }
        }
        if self.max_body_bytes < 1024 {
            return Err(bad("SHEPHERD_MAX_BODY_BYTES", "must be at least 1024"));
        }
        if self.redis_timeout_ms == 0 || self.redis_timeout_ms > 4000 {
            return Err(bad(
                "SHEPHERD_REDIS_TIMEOUT_MS",
                "must be between 1 and 4000 (Forgejo gives up after 5 s)",
            ));
        }
        if self.retention_hours == 0 {
            return Err(bad("SHEPHERD_RETENTION_HOURS", "must be at least 1"));
        }
        if self.shards == 0 || self.shards > 1024 {
            return Err(bad("SHEPHERD_SHARDS", "must be between 1 and 1024"));
        }
        if self.reclaim_idle_secs == 0 {
            return Err(bad("SHEPHERD_RECLAIM_IDLE_SECS", "must be at least 1"));
        }
        if self.max_deliveries == 0 {
            return Err(bad("SHEPHERD_MAX_DELIVERIES", "must be at least 1"));
        }
        if self.forgejo_timeout_ms == 0 {
            return Err(bad("SHEPHERD_FORGEJO_TIMEOUT_MS", "must be at least 1"));
        }
        Ok(Config {
            listen,
            redis_url: self.redis_url.clone(),
            redis,
            key_prefix: self.key_prefix.clone(),
            webhook_secrets,
            forgejo_url,
            forgejo_token: self.forgejo_token.clone(),
            bot_login: self.bot_login.as_ref().map(|b| b.trim().to_lowercase()),
            admin_token: self.admin_token.clone(),
            agent_token: self.agent_token.clone(),
            dispatch_url,
            dispatch_secret: self.dispatch_secret.clone(),
            log_format: self.log_format,
            log: self.log.clone(),
            policy_path: self.config.clone(),
            max_body_bytes: self.max_body_bytes,
            redis_timeout: Duration::from_millis(self.redis_timeout_ms),
            redis_wait_replicas: self.redis_wait_replicas,
            retention: Duration::from_secs(self.retention_hours * 3600),
            shards: self.shards,
            resync_interval: (self.resync_interval_secs > 0)
                .then(|| Duration::from_secs(self.resync_interval_secs)),
            resync_full_interval: Duration::from_secs(self.resync_full_interval_secs),
            reclaim_idle: Duration::from_secs(self.reclaim_idle_secs),
            max_deliveries: self.max_deliveries,
            forgejo_timeout: Duration::from_millis(self.forgejo_timeout_ms),
            data_dir: self.data_dir.clone(),
        })
    }
}

/// Loads the policy file named by the configuration (defaults when none), with the bot
/// login applied.
pub fn load_policy(config: &Config) -> anyhow::Result<crate::core::policy::PolicyFile> {
    let file = match &config.policy_path {
        None => crate::core::policy::PolicyFile::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the policy file {}", path.display()))?;
            crate::core::policy::PolicyFile::from_toml(&text).with_context(|| {
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

impl Config {
    /// Fails naming `setting` when the serve command has no webhook secret: an
    /// unauthenticated webhook endpoint would accept forged deliveries.
    pub fn require_webhook_secrets(&self) -> Result<(), ConfigError> {
        if self.webhook_secrets.is_empty() {
            return Err(bad(
                "SHEPHERD_WEBHOOK_SECRETS",
                "at least one secret is required to accept webhooks",
            ));
        }
        Ok(())
    }

    /// Fails naming `SHEPHERD_BOT_LOGIN` when the executor would run (`work`/`run` with
    /// both `SHEPHERD_FORGEJO_URL` and `_TOKEN`) without it: Shepherd's own comments are
    /// recognised by their marker *and* their author, so without the bot login a marker
    /// pasted by anyone would be trusted (issue 12).
    pub fn require_bot_login_for_executor(&self) -> Result<(), ConfigError> {
        let executor_on = self.forgejo_url.is_some() && self.forgejo_token.is_some();
        let missing = self
            .bot_login
            .as_deref()
            .is_none_or(|l| l.trim().is_empty());
        if executor_on && missing {
            return Err(bad(
                "SHEPHERD_BOT_LOGIN",
                "is required when SHEPHERD_FORGEJO_URL and SHEPHERD_FORGEJO_TOKEN are set \
                 (the executor runs): without it, comment markers from anyone are trusted",
            ));
        }
        Ok(())
    }

    /// Fails naming the missing setting when Forgejo API access is not configured.
    pub fn require_forgejo(&self) -> Result<(&str, &SecretString), ConfigError> {
        let url = self
            .forgejo_url
            .as_deref()
            .ok_or_else(|| bad("SHEPHERD_FORGEJO_URL", "is required by this command"))?;
        let token = self
            .forgejo_token
            .as_ref()
            .ok_or_else(|| bad("SHEPHERD_FORGEJO_TOKEN", "is required by this command"))?;
        Ok((url, token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        s: Settings,
    }

    fn settings(args: &[&str]) -> Settings {
        let mut v = vec!["t"];
        v.extend_from_slice(args);
        T::try_parse_from(v).expect("parse").s
    }

    #[test]
    fn defaults_validate() {
        let c = settings(&[]).validate().expect("defaults are valid");
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.key_prefix, "shepherd");
        assert_eq!(c.max_body_bytes, 5 * 1024 * 1024);
        assert_eq!(c.retention, Duration::from_secs(7 * 24 * 3600));
    }

    #[test]
    fn errors_name_the_setting() {
        let e = settings(&["--listen", "nope"]).validate().unwrap_err();
        assert_eq!(e.setting, "SHEPHERD_LISTEN");
        let e = settings(&["--redis-url", "http://r:6380"])
            .validate()
            .unwrap_err();
        assert_eq!(e.setting, "SHEPHERD_REDIS_URL");
        assert!(e.reason.contains("rediss://"), "{e}");
        let e = settings(&["--redis-ca-file", "/nonexistent/ca.pem"])
            .validate()
            .unwrap_err();
        assert_eq!(e.setting, "SHEPHERD_REDIS_CA_FILE");
        assert!(e.reason.contains("TLS"), "{e}");
        let e = settings(&["--forgejo-url", "https://f.example/api/v1"])
            .validate()
            .unwrap_err();
        assert_eq!(e.setting, "SHEPHERD_FORGEJO_URL");
        let e = settings(&["--webhook-secrets", "a,,b"])
            .validate()
            .unwrap_err();
        assert_eq!(e.setting, "SHEPHERD_WEBHOOK_SECRETS");
        assert!(!e.to_string().contains('a'.to_string().repeat(2).as_str()));
        let e = settings(&["--dispatch-url", "http://x"])
            .validate()
            .unwrap_err();
        assert_eq!(e.setting, "SHEPHERD_DISPATCH_SECRET");
    }

    /// Issue 12: without the bot login, comment markers from anyone would be trusted.
    #[test]
    fn executor_without_bot_login_trusts_markers_from_anyone_so_it_is_refused() {
        let forgejo = [
            "--forgejo-url",
            "https://f.example",
            "--forgejo-token",
            "t0k",
        ];
        let c = settings(&forgejo).validate().unwrap();
        let e = c.require_bot_login_for_executor().unwrap_err();
        assert_eq!(e.setting, "SHEPHERD_BOT_LOGIN");
        let mut with_bot = forgejo.to_vec();
        with_bot.extend(["--bot-login", "shepherd-bot"]);
        let c = settings(&with_bot).validate().unwrap();
        assert!(c.require_bot_login_for_executor().is_ok());
        // No executor (no Forgejo access): nothing acts on markers, nothing required.
        let c = settings(&[]).validate().unwrap();
        assert!(c.require_bot_login_for_executor().is_ok());
    }

    #[derive(Parser)]
    struct A {
        #[command(flatten)]
        s: AgentSettings,
    }

    fn agents(args: &[&str]) -> Result<AgentsConfig, ConfigError> {
        let mut v = vec!["t"];
        v.extend_from_slice(args);
        A::try_parse_from(v).expect("parse").s.validate()
    }

    #[test]
    fn live_usage_is_off_by_default_and_opencode_json_on_request() {
        let c = agents(&["--agent-command", "a"]).unwrap();
        assert_eq!(c.usage, UsageSource::Off);
        let c = agents(&["--agent-command", "a", "--agent-usage", "opencode-json"]).unwrap();
        assert_eq!(c.usage, UsageSource::OpencodeJson);
        let bad = A::try_parse_from(["t", "--agent-command", "a", "--agent-usage", "claude"]);
        assert!(bad.is_err(), "an unknown source is refused");
    }

    #[test]
    fn the_agent_sandbox_is_on_by_default_and_its_writable_paths_are_absolute() {
        let c = agents(&["--agent-command", "a"]).unwrap();
        assert!(c.sandbox);
        assert!(c.sandbox_writable.is_empty());
        let c = agents(&[
            "--agent-command",
            "a",
            "--agent-sandbox",
            "off",
            "--agent-sandbox-writable",
            "/cache/npm:/cache/cargo",
        ])
        .unwrap();
        assert!(!c.sandbox);
        assert_eq!(
            c.sandbox_writable,
            [PathBuf::from("/cache/npm"), PathBuf::from("/cache/cargo")]
        );
        let e = agents(&["--agent-command", "a", "--agent-sandbox-writable", "cache"]).unwrap_err();
        assert_eq!(e.setting, "SHEPHERD_AGENT_SANDBOX_WRITABLE");
    }

    #[test]
    fn the_agents_uid_defaults_to_nobody_and_is_never_root() {
        let c = agents(&["--agent-command", "a"]).unwrap();
        assert_eq!(c.agent_uid, (65534, 65534));
        let c = agents(&["--agent-command", "a", "--agent-uid", "10002:10003"]).unwrap();
        assert_eq!(c.agent_uid, (10002, 10003));
        let c = agents(&["--agent-command", "a", "--agent-uid", "10002"]).unwrap();
        assert_eq!(c.agent_uid, (10002, 10002));
        for bad in ["0", "0:10002", "10002:0", "agent", "1:2:3", ""] {
            let e = agents(&["--agent-command", "a", "--agent-uid", bad]).unwrap_err();
            assert_eq!(e.setting, "SHEPHERD_AGENT_UID", "{bad}");
        }
    }

    #[test]
    fn reviewer_tokens_from_the_variable_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("reviewers");
        std::fs::write(&file, "# reviewer agents\nRev-Two = t2-secret\n\n").unwrap();
        let path = file.display().to_string();
        let c = agents(&[
            "--agent-command",
            "a",
            "--reviewer-tokens",
            "rev-one=t1-secret, ",
            "--reviewer-tokens-file",
            &path,
        ])
        .unwrap();
        let got: Vec<(&str, &str)> = c
            .reviewer_tokens
            .iter()
            .map(|(l, t)| (l.as_str(), t.expose_secret()))
            .collect();
        assert_eq!(got, [("rev-one", "t1-secret"), ("rev-two", "t2-secret")]);
        for (list, says) in [
            ("rev-one", "entry 1 is not login=token"),
            ("a=x,b=", "entry 2 is not login=token"),
            ("a=x,A=y", "a is given twice"),
        ] {
            let e = agents(&["--agent-command", "a", "--reviewer-tokens", list]).unwrap_err();
            assert_eq!(e.setting, "SHEPHERD_REVIEWER_TOKENS");
            assert!(e.reason.contains(says), "{list}: {e}");
            assert!(!e.to_string().contains('x') || !list.contains("=x,"), "{e}");
        }
        let e = agents(&[
            "--agent-command",
            "a",
            "--reviewer-tokens-file",
            "/nonexistent/r",
        ])
        .unwrap_err();
        assert_eq!(e.setting, "SHEPHERD_REVIEWER_TOKENS_FILE");
    }

    #[test]
    fn agent_settings_validate_and_name_the_setting() {
        let c = agents(&[
            "--agent-command",
            "opencode run -m '{model}' --agent {agent}",
        ])
        .unwrap();
        assert_eq!(
            c.command,
            ["opencode", "run", "-m", "{model}", "--agent", "{agent}"]
        );
        assert_eq!((c.max, c.per_repo), (2, 1));
        assert!(c.env_pass.iter().any(|v| v == "PATH"));
        let c = agents(&[
            "--agent-command",
            "a",
            "--agents-max",
            "3",
            "--agents-per-repo",
            "9",
        ])
        .unwrap();
        assert_eq!(c.per_repo, 3, "never above the total");
        for (args, setting) in [
            (vec![], "SHEPHERD_AGENT_COMMAND"),
            (
                vec!["--agent-command", "{agent} x"],
                "SHEPHERD_AGENT_COMMAND",
            ),
            (
                vec!["--agent-command", "a", "--agents-max", "0"],
                "SHEPHERD_AGENTS_MAX",
            ),
            (
                vec![
                    "--agent-command",
                    "a",
                    "--agent-env",
                    "SHEPHERD_FORGEJO_TOKEN",
                ],
                "SHEPHERD_AGENT_ENV",
            ),
            (
                vec!["--agent-command", "a", "--agent-env", "A B"],
                "SHEPHERD_AGENT_ENV",
            ),
            (
                vec!["--agent-command", "a", "--agent-credentials", "true"],
                "SHEPHERD_AGENT_CREDENTIALS",
            ),
            (
                vec![
                    "--agent-command",
                    "a",
                    "--agent-checkout",
                    "true",
                    "--agent-clone-url",
                    "https://x/y.git",
                ],
                "SHEPHERD_AGENT_CLONE_URL",
            ),
        ] {
            let e = agents(&args).unwrap_err();
            assert_eq!(e.setting, setting, "{args:?}: {e}");
        }
    }

    #[test]
    fn secrets_split_and_stay_hidden() {
        let c = settings(&["--webhook-secrets", "s3cret-one, s3cret-two"])
            .validate()
            .unwrap();
        assert_eq!(c.webhook_secrets.len(), 2);
        assert_eq!(c.webhook_secrets[1].expose_secret(), "s3cret-two");
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("s3cret"), "Debug leaks a secret: {dbg}");
    }
}
