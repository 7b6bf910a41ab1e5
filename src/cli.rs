//! The `shepherd` command line: one binary, one subcommand per role or operator tool
//! (DESIGN §5). Global settings (`SHEPHERD_*` variables, each also a flag) come from
//! [`crate::config::Settings`]; subcommand arguments are defined here.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use secrecy::SecretString;

use crate::config::Settings;

/// Shepherd: drives Forgejo pull requests from signed webhooks to a safe merge.
#[derive(Debug, Parser)]
#[command(name = "shepherd", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Settings shared by every subcommand.
    #[command(flatten)]
    pub settings: Settings,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands (DESIGN §5, contract).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP server: webhook ingest, results API, admin API, status page.
    Serve,
    /// Run a worker: event consumer, effect executor, timers and periodic resync.
    Work(WorkArgs),
    /// Run serve and work in one process (the single-machine default); starts a local
    /// redis-server when none answers at SHEPHERD_REDIS_URL and one is on the PATH.
    Run(WorkArgs),
    /// Sign and POST a payload file exactly as Forgejo does, and print the response.
    Send(SendArgs),
    /// Re-inject archived deliveries through the normal path (bypassing delivery dedup).
    Replay(ReplayArgs),
    /// Show a PR's record, phase and reason, CI, reviews, work, effects, timers, history.
    Inspect(InspectArgs),
    /// Fold a PR's archived events from an empty record and diff with the stored one.
    Rebuild(RebuildArgs),
    /// Read open PRs from the Forgejo API and feed them in as observations.
    Resync(ResyncArgs),
    /// Inspect and act on dead-lettered entries.
    Dlq(DlqArgs),
    /// What the agents cost, from the ledger: per repository per UTC day, the PRs with
    /// runs in the range by lifetime cost, per work kind and tier.
    Costs(CostsArgs),
    /// Run the agent runner: consume work items (group `agents` on `<prefix>:dispatch`),
    /// run SHEPHERD_AGENT_COMMAND for each, report the results.
    Agents(AgentsArgs),
    /// Check the configuration as on a first deploy: a checklist, one line per check
    /// (✓/✗ and the fix); exit status 0 only when every check passes.
    ///
    /// The checks: the settings and policy file parse;
    /// Redis answers, its version, and whether its persistence can lose an acknowledged
    /// delivery; Forgejo answers at SHEPHERD_FORGEJO_URL; the token is valid, whose it
    /// is and whether that is SHEPHERD_BOT_LOGIN; its scopes cover what Shepherd calls
    /// (read probes only); webhook secrets are present. With SHEPHERD_AGENT_COMMAND,
    /// also the agent runner: its settings, the program, the sandbox, the reviewer
    /// tokens. Read only: nothing is written to Redis or Forgejo, no secret is
    /// printed. Exit status 0 only when every check passes.
    Doctor(DoctorArgs),
}

/// Arguments of `doctor`: the agent runner's settings, checked when
/// SHEPHERD_AGENT_COMMAND is set.
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// The runner's settings (as for `agents`).
    #[command(flatten)]
    pub agents: crate::config::AgentSettings,
}

/// Arguments of `agents`.
#[derive(Debug, Clone, Args)]
pub struct AgentsArgs {
    /// Consumer name in the `agents` group; unique per process (default:
    /// hostname-pid-random).
    #[arg(long, env = "SHEPHERD_CONSUMER")]
    pub consumer: Option<String>,
    /// The runner's settings.
    #[command(flatten)]
    pub settings: crate::config::AgentSettings,
}

/// Arguments of `work` and `run`.
#[derive(Debug, Clone, Args)]
pub struct WorkArgs {
    /// Consumer name in the Redis consumer groups; unique per process (default:
    /// hostname-pid-random).
    #[arg(long, env = "SHEPHERD_CONSUMER")]
    pub consumer: Option<String>,
}

/// Body encodings Forgejo can use for a webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum ContentType {
    /// `application/json`: the body is the JSON payload.
    #[default]
    Json,
    /// `application/x-www-form-urlencoded`: `payload=<url-encoded JSON>`.
    Form,
}

/// Arguments of `send`.
#[derive(Debug, Clone, Args)]
pub struct SendArgs {
    /// Payload file (JSON), sent byte for byte.
    pub file: PathBuf,
    /// Fine-grained event type (`X-Forgejo-Event-Type`), e.g. `pull_request_sync`.
    #[arg(long, alias = "event")]
    pub event_type: String,
    /// Webhook URL, e.g. http://127.0.0.1:8080/webhooks/forgejo.
    #[arg(long)]
    pub url: String,
    /// Webhook secret to sign with.
    #[arg(long, hide_env_values = true, value_parser = |s: &str| Ok::<_, String>(SecretString::from(s.to_owned())))]
    pub secret: SecretString,
    /// Delivery id (default: a fresh v4 UUID, as Forgejo does).
    #[arg(long)]
    pub delivery: Option<String>,
    /// Content type of the webhook.
    #[arg(long, value_enum, default_value = "json")]
    pub content_type: ContentType,
}

/// Arguments of `replay`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["delivery", "pr", "repo", "dead_letter"])))]
pub struct ReplayArgs {
    /// Replay one delivery by its id.
    #[arg(long)]
    pub delivery: Option<String>,
    /// Replay every delivery of a PR, in original order (`owner/repo#N`).
    #[arg(long)]
    pub pr: Option<String>,
    /// Replay a repository's deliveries in a time range (with --since/--until).
    #[arg(long)]
    pub repo: Option<String>,
    /// Start of the range: RFC 3339 or relative (`2h`, `30m`, `7d`).
    #[arg(long, requires = "repo")]
    pub since: Option<String>,
    /// End of the range: RFC 3339 or relative (default: now).
    #[arg(long, requires = "repo")]
    pub until: Option<String>,
    /// Replay dead-lettered entries (all, or the one with this id) and remove them from
    /// the dead-letter stream once re-queued.
    #[arg(long, num_args = 0..=1, default_missing_value = "")]
    pub dead_letter: Option<String>,
    /// Print the transitions and effects that would follow; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Machine-readable output on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `inspect`.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// `owner/repo#N` for one PR, `owner/repo` for every open PR of a repository.
    pub target: String,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `costs`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("format").args(["json", "csv"])))]
pub struct CostsArgs {
    /// First day, YYYY-MM-DD (UTC); default: --days days up to --to.
    #[arg(long, conflicts_with = "days")]
    pub from: Option<String>,
    /// Last day, YYYY-MM-DD (UTC); default: today.
    #[arg(long)]
    pub to: Option<String>,
    /// Days up to --to (today included) when --from is not given [default: 7].
    #[arg(long)]
    pub days: Option<u32>,
    /// Only this repository (`owner/name`).
    #[arg(long)]
    pub repo: Option<String>,
    /// Most PRs (and issues) listed, most expensive first; 0 lists all [default: 20].
    #[arg(long)]
    pub top: Option<usize>,
    /// Machine-readable output (JSON) on stdout.
    #[arg(long)]
    pub json: bool,
    /// CSV on stdout: one header, one row per figure (column `section`).
    #[arg(long)]
    pub csv: bool,
}

/// Arguments of `rebuild`.
#[derive(Debug, Clone, Args)]
pub struct RebuildArgs {
    /// `owner/repo#N`.
    pub target: String,
    /// Replace the stored record with the folded one (compare-and-set).
    #[arg(long)]
    pub apply: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `resync`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["repo", "all"])))]
pub struct ResyncArgs {
    /// Repository to resync (`owner/name`).
    #[arg(long)]
    pub repo: Option<String>,
    /// Resync every repository Shepherd has seen.
    #[arg(long)]
    pub all: bool,
}

/// Arguments of `dlq`.
#[derive(Debug, Clone, Args)]
pub struct DlqArgs {
    /// What to do with dead letters.
    #[command(subcommand)]
    pub action: DlqAction,
    /// Machine-readable output.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `dlq` actions.
#[derive(Debug, Clone, Subcommand)]
pub enum DlqAction {
    /// List dead-lettered entries with their reason.
    List,
    /// Show one dead-lettered entry in full.
    Show {
        /// Dead-letter entry id.
        id: String,
    },
    /// Re-queue entries onto their stream and remove them from the dead-letter stream.
    Retry {
        /// Dead-letter entry id.
        #[arg(required_unless_present = "all")]
        id: Option<String>,
        /// Every dead-lettered entry.
        #[arg(long, conflicts_with = "id")]
        all: bool,
    },
    /// Delete entries from the dead-letter stream.
    Drop {
        /// Dead-letter entry id.
        #[arg(required_unless_present = "all")]
        id: Option<String>,
        /// Every dead-lettered entry.
        #[arg(long, conflicts_with = "id")]
        all: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_shows_no_secret_values() {
        // SAFETY of the test: env vars are process-global; this test only reads them
        // through clap's rendering and uses a name no other test sets.
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("SHEPHERD_WEBHOOK_SECRETS"));
        assert!(!help.contains("[default: ") || !help.contains("secret="));
    }
}
