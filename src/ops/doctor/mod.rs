//! `shepherd doctor`: the configuration checked the way an operator would on a first
//! deploy, one [`Check`] per question, each with what was found and, when it fails,
//! the fix. Read only: Redis gets `INFO` and `CONFIG GET`, Forgejo gets `GET` requests
//! (`/version`, `/user`, two searches), nothing is ever written. No secret (token,
//! webhook secret, Redis password) reaches a report.
//!
//! | check | passes when |
//! |---|---|
//! | configuration | the settings validate and the policy file parses |
//! | redis | Redis answers at `SHEPHERD_REDIS_URL` (its version is shown) |
//! | redis persistence | AOF with `appendfsync always`: an acknowledged delivery survives a crash |
//! | forgejo url | `GET /api/v1/version` answers |
//! | forgejo token | `GET /api/v1/user` with the token answers its user |
//! | bot login | that user is `SHEPHERD_BOT_LOGIN` |
//! | token scopes | read probes of the `repository` and `issue` scope categories pass |
//! | webhook secrets | a global secret or `[webhooks]` tables whose variables are set |
//! | agent … | with `SHEPHERD_AGENT_COMMAND`: its settings, the program, the sandbox, the reviewer tokens |
//!
//! The Forgejo checks are in [`forgejo`], the agent runner's in [`agents`].

mod agents;
mod forgejo;

pub use forgejo::{SCOPE_PROBES, Token};

use std::time::Duration;

use serde::Serialize;

use crate::config::{AgentSettings, Config, Settings};
use crate::core::policy::PolicyFile;
use crate::store::client::LazyOptions;
use crate::store::server::Persistence;

/// Longest a Redis check may take.
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);

/// One line of the checklist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked (`redis persistence`).
    pub name: &'static str,
    /// Whether it passed.
    pub ok: bool,
    /// What was found (never a secret).
    pub detail: String,
    /// What to do about it, when it failed.
    pub fix: Option<String>,
}

impl Check {
    pub(crate) fn pass(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            ok: true,
            detail: one_line(&detail.into()),
            fix: None,
        }
    }

    pub(crate) fn fail(
        name: &'static str,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            name,
            ok: false,
            detail: one_line(&detail.into()),
            fix: Some(one_line(&fix.into())),
        }
    }
}

/// Longest detail shown (a parser's error can run over many lines).
const MAX_DETAIL: usize = 400;

/// `text` on one line (whitespace runs, newlines and a parser's `|` gutters folded to
/// one space), at most [`MAX_DETAIL`] characters.
fn one_line(text: &str) -> String {
    let folded = text
        .lines()
        .map(|l| {
            l.trim()
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .trim()
        })
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '|' || c == '^' || c == ' '))
        .map(|l| l.trim_start_matches('|').trim())
        .collect::<Vec<_>>()
        .join(" ");
    let folded = folded.split_whitespace().collect::<Vec<_>>().join(" ");
    match folded.char_indices().nth(MAX_DETAIL) {
        Some((cut, _)) => format!("{}…", &folded[..cut]),
        None => folded,
    }
}

/// What `shepherd doctor` checks: the raw settings (so that a configuration that does
/// not validate is itself a failed check) and the agent runner's.
#[derive(Debug, Clone)]
pub struct DoctorRequest {
    /// The process settings as given.
    pub settings: Settings,
    /// The agent runner's settings (checked when `SHEPHERD_AGENT_COMMAND` is set).
    pub agents: AgentSettings,
}

/// The checklist.
#[derive(Debug, Clone, Serialize)]
pub struct DoctorReport {
    /// Every check, in the order run.
    pub checks: Vec<Check>,
}

impl DoctorReport {
    /// True when every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

/// Runs every check. A configuration that does not validate stops the list there:
/// the other checks need it.
pub async fn doctor(req: &DoctorRequest) -> DoctorReport {
    let mut checks = Vec::new();
    let (config, policy) = match configuration(&req.settings) {
        Ok((config, policy, check)) => {
            checks.push(check);
            (config, policy)
        }
        Err(check) => {
            checks.push(check);
            return DoctorReport { checks };
        }
    };
    checks.extend(redis(&config).await);
    let api = forgejo::Api::new(&config);
    checks.push(forgejo::forgejo_url(&config, api.as_ref()).await);
    let (check, token) = forgejo::forgejo_token(&config, api.as_ref()).await;
    checks.push(check);
    checks.push(forgejo::bot_login(&config, &token));
    checks.push(forgejo::token_scopes(&config, api.as_ref(), &token).await);
    checks.push(webhook_secrets(&config, &policy, |name| {
        std::env::var(name).ok()
    }));
    if req.agents.agent_command.is_some() {
        checks.extend(agents::agents(req, &policy, api.as_ref()).await);
    }
    DoctorReport { checks }
}

/// The settings validate and the policy file parses.
pub fn configuration(settings: &Settings) -> Result<(Config, PolicyFile, Check), Check> {
    const NAME: &str = "configuration";
    let config = settings.validate().map_err(|e| {
        Check::fail(
            NAME,
            e.to_string(),
            format!(
                "correct {} (`shepherd --help` describes every setting)",
                e.setting
            ),
        )
    })?;
    let policy = crate::config::load_policy(&config).map_err(|e| {
        Check::fail(
            NAME,
            format!("{e:#}"),
            "correct the policy file named by SHEPHERD_CONFIG (docs/state-machine.md lists \
             its settings)",
        )
    })?;
    let source = match &config.policy_path {
        Some(path) => format!("policy file {}", path.display()),
        None => "built-in policy (SHEPHERD_CONFIG unset)".to_owned(),
    };
    let check = Check::pass(NAME, format!("the settings are valid; {source}"));
    Ok((config, policy, check))
}

/// Where Redis is, with any password replaced by `***`.
pub fn redacted_redis_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(not a URL)".to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or_default();
            let user = if rest[..at].contains(':') {
                format!("{user}:***")
            } else {
                "***".to_owned()
            };
            format!("{scheme}://{user}@{}", &rest[at + 1..])
        }
        None => url.to_owned(),
    }
}

/// Redis answers (and its version), and whether its persistence can lose an
/// acknowledged delivery.
pub async fn redis(config: &Config) -> Vec<Check> {
    let at = redacted_redis_url(config.redis.url());
    let options = LazyOptions {
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(3),
        retries: 0,
        delays: None,
        pipeline_buffer: None,
    };
    let mut conn = match crate::store::client::connect_lazy(&config.redis, options) {
        Ok(conn) => conn,
        Err(e) => {
            return vec![
                Check::fail(
                    "redis",
                    format!("{at} is not usable: {e}"),
                    "correct SHEPHERD_REDIS_URL",
                ),
                not_checked("redis persistence", "Redis is not reachable", "redis"),
            ];
        }
    };
    let version = tokio::time::timeout(REDIS_TIMEOUT, crate::store::server::version(&mut conn));
    let version = match version.await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return unreachable_redis(&at, &e.to_string()),
        Err(_) => return unreachable_redis(&at, "no answer within 5 s"),
    };
    let reachable = Check::pass("redis", format!("{at} answers: Redis {version}"));
    let persistence =
        tokio::time::timeout(REDIS_TIMEOUT, crate::store::server::persistence(&mut conn));
    let persistence = match persistence.await {
        Ok(Ok(p)) => judge_persistence(&p),
        Ok(Err(e)) => Check::fail(
            "redis persistence",
            format!("cannot read the persistence settings (CONFIG GET: {e})"),
            "check by hand that the server runs with appendonly yes and appendfsync always \
             (docs/operations.md §4)",
        ),
        Err(_) => Check::fail(
            "redis persistence",
            "CONFIG GET did not answer within 5 s",
            "check by hand that the server runs with appendonly yes and appendfsync always \
             (docs/operations.md §4)",
        ),
    };
    vec![reachable, persistence]
}

fn unreachable_redis(at: &str, why: &str) -> Vec<Check> {
    vec![
        Check::fail(
            "redis",
            format!("cannot reach Redis at {at}: {why}"),
            "start Redis there or correct SHEPHERD_REDIS_URL (`shepherd run` starts a local \
             redis-server when none answers)",
        ),
        not_checked("redis persistence", "Redis is not reachable", "redis"),
    ]
}

/// A check that needs another one to pass first (`first`, by name).
pub(crate) fn not_checked(name: &'static str, why: &str, first: &str) -> Check {
    Check::fail(
        name,
        format!("not checked: {why}"),
        format!("fix the {first} check first"),
    )
}

/// Whether these persistence settings can lose a delivery Shepherd acknowledged (a 202
/// is sent once Redis holds it, and Forgejo never redelivers by itself), and what
/// loses what.
pub fn judge_persistence(p: &Persistence) -> Check {
    const NAME: &str = "redis persistence";
    const FIX: &str = "run Redis with appendonly yes and appendfsync always (docker/redis.conf \
                       does; or CONFIG SET appendonly yes, CONFIG SET appendfsync always, \
                       CONFIG REWRITE); docs/operations.md §4";
    let aof = p.appendonly.eq_ignore_ascii_case("yes");
    let save = p.save.trim();
    match (aof, p.appendfsync.to_ascii_lowercase().as_str()) {
        (true, "always") => Check::pass(
            NAME,
            "AOF with appendfsync always: an acknowledged delivery is on disk before the 202 \
             and survives a crash of Redis or of its host",
        ),
        (true, "everysec") => Check::fail(
            NAME,
            "AOF with appendfsync everysec: a crash of the host (power loss, kernel panic) can \
             lose the last second of acknowledged deliveries (a crash of Redis alone loses \
             nothing)",
            format!(
                "{FIX}; everysec is acceptable only where §4 says so (replicated or \
                 battery-backed storage)"
            ),
        ),
        (true, other) => Check::fail(
            NAME,
            format!(
                "AOF with appendfsync {other}: the kernel writes when it likes (about every \
                 30 s), so a crash of the host can lose that much of acknowledged deliveries"
            ),
            FIX,
        ),
        (false, _) if save.is_empty() => Check::fail(
            NAME,
            "no persistence at all (appendonly no, save \"\"): a restart of Redis loses every \
             queued delivery and every PR's record",
            FIX,
        ),
        (false, _) => Check::fail(
            NAME,
            format!(
                "no AOF, only RDB snapshots (save \"{save}\"): a crash or restart of Redis loses \
                 every delivery acknowledged since the last snapshot"
            ),
            FIX,
        ),
    }
}

/// At least one webhook secret, and every variable the policy's `[webhooks]` tables
/// name is set (`env` reads one).
pub fn webhook_secrets(
    config: &Config,
    policy: &PolicyFile,
    env: impl Fn(&str) -> Option<String>,
) -> Check {
    const NAME: &str = "webhook secrets";
    let unset: Vec<String> = policy
        .webhooks
        .iter()
        .flat_map(|(key, table)| {
            table
                .secret_env
                .iter()
                .filter(|name| env(name).is_none_or(|v| v.is_empty()))
                .map(move |name| format!("{name} (webhooks.\"{key}\")"))
        })
        .collect();
    if !unset.is_empty() {
        return Check::fail(
            NAME,
            format!("not set: {}", unset.join(", ")),
            "set these variables in the environment of `serve` and `run` (or remove the tables)",
        );
    }
    let global = config.webhook_secrets.len();
    let tables = policy.webhooks.len();
    if global == 0 && tables == 0 {
        return Check::fail(
            NAME,
            "none: `serve` and `run` refuse to start (an unsigned endpoint would accept forged \
             deliveries)",
            "set SHEPHERD_WEBHOOK_SECRETS to the secret of Forgejo's webhook \
             (docs/operations.md §1.2)",
        );
    }
    let mut found = vec![format!("{global} in SHEPHERD_WEBHOOK_SECRETS")];
    if tables > 0 {
        found.push(format!("{tables} [webhooks] table(s) in the policy file"));
    }
    Check::pass(NAME, found.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn persistence(appendonly: &str, appendfsync: &str, save: &str) -> Check {
        judge_persistence(&Persistence {
            appendonly: appendonly.into(),
            appendfsync: appendfsync.into(),
            save: save.into(),
        })
    }

    #[test]
    fn only_aof_always_keeps_every_acknowledged_delivery() {
        assert!(persistence("yes", "always", "").ok);
        let everysec = persistence("yes", "everysec", "3600 1");
        assert!(!everysec.ok);
        assert!(everysec.detail.contains("last second"), "{everysec:?}");
        let no = persistence("yes", "no", "");
        assert!(!no.ok && no.detail.contains("30 s"), "{no:?}");
        let rdb = persistence("no", "everysec", "3600 1 300 100");
        assert!(
            !rdb.ok && rdb.detail.contains("since the last snapshot"),
            "{rdb:?}"
        );
        let none = persistence("no", "everysec", "");
        assert!(
            !none.ok && none.detail.contains("no persistence at all"),
            "{none:?}"
        );
    }

    #[test]
    fn the_redis_password_is_never_shown() {
        assert_eq!(
            redacted_redis_url("redis://:hunter2@r.example:6379/0"),
            "redis://:***@r.example:6379/0"
        );
        assert_eq!(
            redacted_redis_url("rediss+sentinel://app:hunter2@s1:26379,s2:26379/mymaster"),
            "rediss+sentinel://app:***@s1:26379,s2:26379/mymaster"
        );
        assert_eq!(
            redacted_redis_url("redis://hunter2@r:6379"),
            "redis://***@r:6379"
        );
        assert_eq!(
            redacted_redis_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }

    #[test]
    fn details_are_one_line() {
        let toml_error = "SHEPHERD_CONFIG: invalid policy file /p: TOML parse error at line 2\n  |\n2 | x = 1\n  | ^^^^^\nunknown field `x`";
        assert_eq!(
            one_line(toml_error),
            "SHEPHERD_CONFIG: invalid policy file /p: TOML parse error at line 2 x = 1 unknown field `x`"
        );
        let long = "word ".repeat(200);
        assert_eq!(one_line(&long).chars().count(), MAX_DETAIL + 1);
    }

    #[test]
    fn webhook_secrets_name_unset_variables_and_never_values() {
        let settings = |secrets: &[&str]| {
            use clap::Parser;
            #[derive(Parser)]
            struct T {
                #[command(flatten)]
                s: Settings,
            }
            let mut args = vec!["t".to_owned()];
            if !secrets.is_empty() {
                args.push("--webhook-secrets".into());
                args.push(secrets.join(","));
            }
            T::try_parse_from(args)
                .expect("parse")
                .s
                .validate()
                .expect("valid")
        };
        let none = PolicyFile::default();
        let c = webhook_secrets(&settings(&["s3cret-value"]), &none, |_| None);
        assert!(c.ok && !c.detail.contains("s3cret"), "{c:?}");
        assert!(!webhook_secrets(&settings(&[]), &none, |_| None).ok);
        let tables =
            PolicyFile::from_toml("[webhooks.\"acme\"]\nsecret_env = \"ACME_HOOK\"\n").unwrap();
        let unset = webhook_secrets(&settings(&[]), &tables, |_| None);
        assert!(!unset.ok && unset.detail.contains("ACME_HOOK"), "{unset:?}");
        let set = webhook_secrets(&settings(&[]), &tables, |_| Some("v4lue".into()));
        assert!(set.ok && !set.detail.contains("v4lue"), "{set:?}");
    }
}
