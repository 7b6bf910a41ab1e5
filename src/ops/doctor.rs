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

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use serde_json::Value;

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
    fn pass(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            ok: true,
            detail: one_line(&detail.into()),
            fix: None,
        }
    }

    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
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
    /// `SHEPHERD_AGENT_SANDBOX` as set (`off`: the sandbox is off).
    pub sandbox: Option<String>,
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
    let api = Api::new(&config);
    checks.push(forgejo_url(&config, api.as_ref()).await);
    let (check, token) = forgejo_token(&config, api.as_ref()).await;
    checks.push(check);
    checks.push(bot_login(&config, &token));
    checks.push(token_scopes(&config, api.as_ref(), &token).await);
    checks.push(webhook_secrets(&config, &policy, |name| {
        std::env::var(name).ok()
    }));
    if req.agents.agent_command.is_some() {
        checks.extend(agents(req, &policy, api.as_ref()).await);
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
fn not_checked(name: &'static str, why: &str, first: &str) -> Check {
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

/// What Forgejo answered to one request.
#[derive(Debug)]
enum Answer {
    /// 2xx with this JSON body.
    Json(Value),
    /// Another status, with the `message` of Forgejo's error body (or the start of
    /// the body).
    Status(u16, String),
    /// No answer: connection, TLS or timeout failure.
    Unreachable(String),
}

impl Answer {
    /// The scopes a 403 says the token lacks (`token does not have at least one of
    /// required scope(s): [read:issue]`, from Forgejo's `tokenRequiresScopes`).
    fn missing_scopes(&self) -> Option<String> {
        match self {
            Answer::Status(403, message) if message.contains("required scope") => {
                let scopes = message
                    .split_once('[')
                    .and_then(|(_, rest)| rest.split_once(']'))
                    .map_or(message.as_str(), |(scopes, _)| scopes);
                Some(scopes.to_owned())
            }
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Answer::Json(_) => "answered".to_owned(),
            Answer::Status(code, message) if message.is_empty() => format!("answered {code}"),
            Answer::Status(code, message) => format!("answered {code} ({message})"),
            Answer::Unreachable(why) => format!("did not answer: {why}"),
        }
    }
}

/// Forgejo's API at `SHEPHERD_FORGEJO_URL`, read only.
struct Api {
    http: reqwest::Client,
    /// `<base>/api/v1`.
    base: String,
}

impl Api {
    fn new(config: &Config) -> Option<Self> {
        let url = config.forgejo_url.as_deref()?;
        let timeout = config.forgejo_timeout.min(Duration::from_secs(10));
        let http = reqwest::Client::builder()
            .user_agent(concat!("shepherd-doctor/", env!("CARGO_PKG_VERSION")))
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .build()
            .ok()?;
        Some(Self {
            http,
            base: format!("{url}/api/v1"),
        })
    }

    /// `GET <base><path>`, with `token` when given.
    async fn get(&self, path: &str, token: Option<&SecretString>) -> Answer {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(token) = token {
            let mut value = match reqwest::header::HeaderValue::from_str(&format!(
                "token {}",
                token.expose_secret()
            )) {
                Ok(v) => v,
                Err(_) => {
                    return Answer::Unreachable("the token is not a valid header value".into());
                }
            };
            value.set_sensitive(true);
            request = request.header(reqwest::header::AUTHORIZATION, value);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => return Answer::Unreachable(error_chain(&e.without_url())),
        };
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        if (200..300).contains(&status) {
            return match serde_json::from_str(&text) {
                Ok(v) => Answer::Json(v),
                Err(_) => Answer::Status(status, "the body is not JSON".to_owned()),
            };
        }
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| text.chars().take(200).collect());
        Answer::Status(status, message.trim().to_owned())
    }

    /// The login of the token's user (`GET /user`).
    async fn user(&self, token: &SecretString) -> Result<String, Answer> {
        match self.get("/user", Some(token)).await {
            Answer::Json(v) => match v.get("login").and_then(Value::as_str) {
                Some(login) => Ok(login.to_owned()),
                None => Err(Answer::Status(200, "no login in the answer".into())),
            },
            other => Err(other),
        }
    }
}

/// An error and its causes, on one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// `SHEPHERD_FORGEJO_URL` answers `GET /api/v1/version` (no token needed).
async fn forgejo_url(config: &Config, api: Option<&Api>) -> Check {
    const NAME: &str = "forgejo url";
    let (Some(url), Some(api)) = (config.forgejo_url.as_deref(), api) else {
        return Check::fail(
            NAME,
            "SHEPHERD_FORGEJO_URL is not set: the executor (comments, labels, merges, work \
             dispatch) and the periodic resync are off",
            "set SHEPHERD_FORGEJO_URL to the instance's base URL (e.g. https://forge.example.org)",
        );
    };
    match api.get("/version", None).await {
        Answer::Json(v) => match v.get("version").and_then(Value::as_str) {
            Some(version) => Check::pass(NAME, format!("{url} answers: Forgejo {version}")),
            None => Check::fail(
                NAME,
                format!("{url}/api/v1/version answered without a version: not a Forgejo API"),
                "set SHEPHERD_FORGEJO_URL to the Forgejo instance's base URL, without /api/v1",
            ),
        },
        Answer::Unreachable(why) => Check::fail(
            NAME,
            format!("cannot reach {url}: {why}"),
            "check the URL, and that this machine reaches it (DNS, firewall, TLS certificate)",
        ),
        other => Check::fail(
            NAME,
            format!("{url}/api/v1/version {}", other.describe()),
            "set SHEPHERD_FORGEJO_URL to the Forgejo instance's base URL, without /api/v1",
        ),
    }
}

/// What the token check learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// Not checked (no URL or no token) or refused.
    Unusable,
    /// Forgejo accepted it; its user, when the token may read it.
    Accepted(Option<String>),
}

/// The token is valid and whose it is (`GET /api/v1/user`).
async fn forgejo_token(config: &Config, api: Option<&Api>) -> (Check, Token) {
    const NAME: &str = "forgejo token";
    let Some(token) = &config.forgejo_token else {
        let check = Check::fail(
            NAME,
            "SHEPHERD_FORGEJO_TOKEN is not set",
            "as the bot user, create a token with write:repository and write:issue (User \
             settings → Applications; docs/operations.md §1.1) and set SHEPHERD_FORGEJO_TOKEN",
        );
        return (check, Token::Unusable);
    };
    let Some(api) = api else {
        return (
            not_checked(NAME, "SHEPHERD_FORGEJO_URL is not set", "forgejo url"),
            Token::Unusable,
        );
    };
    match api.user(token).await {
        Ok(login) => (
            Check::pass(NAME, format!("valid; it belongs to {login}")),
            Token::Accepted(Some(login)),
        ),
        Err(answer) => match answer.missing_scopes() {
            Some(scopes) => (
                Check::fail(
                    NAME,
                    format!(
                        "valid, but whose it is cannot be read: GET /user needs {scopes}, \
                         which the token lacks"
                    ),
                    "add read:user to the token (Shepherd's own calls do not need it; \
                     without it the token's user cannot be checked)",
                ),
                Token::Accepted(None),
            ),
            None if matches!(answer, Answer::Status(401, _)) => (
                Check::fail(
                    NAME,
                    format!("Forgejo refuses it: GET /user {}", answer.describe()),
                    "as the bot user, create a new token (User settings → Applications) and \
                     set SHEPHERD_FORGEJO_TOKEN",
                ),
                Token::Unusable,
            ),
            None => (
                Check::fail(
                    NAME,
                    format!("not verified: GET /user {}", answer.describe()),
                    "fix the forgejo url check, then run doctor again",
                ),
                Token::Unusable,
            ),
        },
    }
}

/// The token's user is `SHEPHERD_BOT_LOGIN`.
fn bot_login(config: &Config, token: &Token) -> Check {
    const NAME: &str = "bot login";
    let user = match token {
        Token::Accepted(Some(user)) => Some(user.as_str()),
        _ => None,
    };
    match (config.bot_login.as_deref(), user) {
        (None, user) => Check::fail(
            NAME,
            "SHEPHERD_BOT_LOGIN is not set: `work` and `run` refuse to start with a Forgejo \
             URL and token, since Shepherd recognises its own comments by their author",
            match user {
                Some(u) => format!("set SHEPHERD_BOT_LOGIN={u} (the token's user)"),
                None => "set SHEPHERD_BOT_LOGIN to the bot user's login".to_owned(),
            },
        ),
        (Some(bot), Some(user)) if bot.eq_ignore_ascii_case(user) => {
            Check::pass(NAME, format!("{bot} is the token's user"))
        }
        (Some(bot), Some(user)) => Check::fail(
            NAME,
            format!(
                "the token belongs to {user}, not to SHEPHERD_BOT_LOGIN={bot}: Shepherd's \
                 comments and labels would come from {user}, and it would not recognise them \
                 as its own"
            ),
            format!("use a token of {bot}, or set SHEPHERD_BOT_LOGIN={user} if {user} is the bot"),
        ),
        (Some(bot), None) => not_checked(
            NAME,
            &format!("SHEPHERD_BOT_LOGIN={bot}, but the token's user is unknown"),
            "forgejo token",
        ),
    }
}

/// Read probes of the scope categories Shepherd's calls need. Forgejo checks a token's
/// scope per route group before the handler runs, and answers 403 `token does not have
/// at least one of required scope(s): [read:issue]` when the category is missing; a
/// `GET` needs `read:<category>`, which `write:<category>` includes.
pub const SCOPE_PROBES: [(&str, &str, &str); 2] = [
    (
        "repository",
        "/repos/search?limit=1",
        "pull requests, commit statuses, reviews, merges, branches",
    ),
    (
        "issue",
        "/repos/issues/search?limit=1",
        "comments and labels",
    ),
];

/// The token's scopes cover the categories Shepherd calls.
async fn token_scopes(config: &Config, api: Option<&Api>, token: &Token) -> Check {
    const NAME: &str = "token scopes";
    const FIX: &str = "as the bot user, create a token with write:repository and write:issue \
                       (docs/operations.md §1.1) and set SHEPHERD_FORGEJO_TOKEN";
    let (Some(api), Some(secret), Token::Accepted(_)) = (api, &config.forgejo_token, token) else {
        return not_checked(NAME, "the token is not usable", "forgejo token");
    };
    let mut present = Vec::new();
    let mut missing = Vec::new();
    let mut unknown = Vec::new();
    for (category, path, what) in SCOPE_PROBES {
        let endpoint = path.split('?').next().unwrap_or(path);
        let answer = api.get(path, Some(secret)).await;
        match answer {
            Answer::Json(_) => present.push(category),
            ref a if a.missing_scopes().is_some() => missing.push(format!(
                "{category} (needed for {what}: GET {endpoint} answered 403, missing {})",
                a.missing_scopes().unwrap_or_default()
            )),
            other => unknown.push(format!("{category} (GET {endpoint} {})", other.describe())),
        }
    }
    if !missing.is_empty() {
        return Check::fail(NAME, format!("the token lacks {}", missing.join("; ")), FIX);
    }
    if !unknown.is_empty() {
        return Check::fail(
            NAME,
            format!("could not verify {}", unknown.join("; ")),
            "run doctor again once Forgejo answers",
        );
    }
    Check::pass(
        NAME,
        format!(
            "{} readable (GET /repos/search, GET /repos/issues/search); the write half \
             (write:repository, write:issue) cannot be verified without writing, which doctor \
             never does",
            present.join(" and ")
        ),
    )
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

/// The agent runner's checks: its settings, the program, the sandbox, the reviewer
/// tokens.
async fn agents(req: &DoctorRequest, policy: &PolicyFile, api: Option<&Api>) -> Vec<Check> {
    let agents = match req.agents.validate() {
        Ok(a) => a,
        Err(e) => {
            return vec![Check::fail(
                "agent settings",
                e.to_string(),
                format!("correct {}", e.setting),
            )];
        }
    };
    let mut checks = vec![Check::pass(
        "agent settings",
        format!(
            "valid: up to {} agents, {} per repository",
            agents.max, agents.per_repo
        ),
    )];
    let program = agents.command.first().cloned().unwrap_or_default();
    let path = std::env::var_os("PATH");
    checks.push(
        match crate::agents::launch::resolve_program(&program, path.as_deref()) {
            Ok(found) => Check::pass("agent command", format!("{program}: {}", found.display())),
            Err(e) => Check::fail(
                "agent command",
                e,
                "install it on the runner's PATH, or give its full path in \
                 SHEPHERD_AGENT_COMMAND",
            ),
        },
    );
    checks.push(sandbox_check(req.sandbox.as_deref()).await);
    checks.push(reviewer_tokens(&agents.reviewer_tokens, policy, api).await);
    checks
}

/// The sandbox can start, unless `SHEPHERD_AGENT_SANDBOX=off`, which is reported as a
/// failure with a warning.
async fn sandbox_check(setting: Option<&str>) -> Check {
    const NAME: &str = "agent sandbox";
    if setting.is_some_and(|s| s.trim().eq_ignore_ascii_case("off")) {
        return Check::fail(
            NAME,
            "sandbox off (SHEPHERD_AGENT_SANDBOX=off): agents run with the runner's own rights \
             and see its files and network",
            "warning: unset SHEPHERD_AGENT_SANDBOX unless the runner is isolated by other \
             means (its own container or VM, no other secrets in reach)",
        );
    }
    match tokio::task::spawn_blocking(sandbox_can_start).await {
        Ok(Ok(detail)) => Check::pass(NAME, detail),
        Ok(Err(why)) => Check::fail(
            NAME,
            why,
            "install bubblewrap (apt-get install bubblewrap); in a container, allow \
             unprivileged user namespaces (docs/operations.md)",
        ),
        Err(e) => Check::fail(NAME, format!("the check failed: {e}"), "run doctor again"),
    }
}

/// Whether a bubblewrap sandbox starts here: runs `/bin/true` in one with every
/// namespace unshared.
pub fn sandbox_can_start() -> Result<String, String> {
    let output = std::process::Command::new("bwrap")
        .args(["--unshare-all", "--die-with-parent"])
        .args(["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"])
        .args(["--", "/bin/true"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("bwrap (bubblewrap) cannot run: {e}"))?;
    if output.status.success() {
        return Ok("bubblewrap starts a sandbox (bwrap --unshare-all)".to_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let why = stderr.lines().next().unwrap_or("no message").trim();
    Err(format!(
        "bwrap cannot start a sandbox ({}): {why}",
        output.status
    ))
}

/// Every reviewer login of the policy (defaults and overrides), lower-cased.
fn reviewer_logins(policy: &PolicyFile) -> Vec<String> {
    let mut logins: Vec<String> = policy
        .defaults
        .reviewer_logins
        .iter()
        .chain(
            policy
                .repos
                .values()
                .filter_map(|o| o.reviewer_logins.as_ref())
                .flatten(),
        )
        .map(|l| l.to_lowercase())
        .collect();
    logins.sort();
    logins.dedup();
    logins
}

/// Each reviewer token belongs to the login it is given for, that login is one of the
/// policy's `reviewer_logins`, and every reviewer login has a token.
async fn reviewer_tokens(
    tokens: &[(crate::core::ids::Login, SecretString)],
    policy: &PolicyFile,
    api: Option<&Api>,
) -> Check {
    const NAME: &str = "reviewer tokens";
    let logins = reviewer_logins(policy);
    if tokens.is_empty() && logins.is_empty() {
        return Check::pass(
            NAME,
            "no reviewer agents (no reviewer_logins in the policy, no SHEPHERD_REVIEWER_TOKENS)",
        );
    }
    let Some(api) = api else {
        return not_checked(NAME, "SHEPHERD_FORGEJO_URL is not set", "forgejo url");
    };
    let mut problems = Vec::new();
    let mut good = Vec::new();
    for (login, token) in tokens {
        let login = login.as_str().to_lowercase();
        match api.user(token).await {
            Ok(user) if !user.eq_ignore_ascii_case(&login) => {
                problems.push(format!("the token given for {login} belongs to {user}"));
            }
            Ok(_) if !logins.contains(&login) => {
                problems.push(format!(
                    "{login} is not one of the policy's reviewer_logins"
                ));
            }
            Ok(_) => good.push(login),
            Err(answer) => match answer.missing_scopes() {
                Some(scopes) => problems.push(format!(
                    "{login}'s token lacks {scopes}: whose it is cannot be checked"
                )),
                None => problems.push(format!("{login}'s token: GET /user {}", answer.describe())),
            },
        }
    }
    for login in &logins {
        if !tokens
            .iter()
            .any(|(l, _)| l.as_str().eq_ignore_ascii_case(login))
        {
            problems.push(format!(
                "no token for {login}: its reviews cannot be posted"
            ));
        }
    }
    if problems.is_empty() {
        return Check::pass(NAME, format!("each reviewer's own: {}", good.join(", ")));
    }
    Check::fail(
        NAME,
        problems.join("; "),
        "give each login of the policy's reviewer_logins its own user's token in \
         SHEPHERD_REVIEWER_TOKENS (login=token, comma-separated) or SHEPHERD_REVIEWER_TOKENS_FILE",
    )
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
    fn a_scope_refusal_names_the_scopes() {
        let refusal = Answer::Status(
            403,
            "token does not have at least one of required scope(s): [read:issue]".into(),
        );
        assert_eq!(refusal.missing_scopes().as_deref(), Some("read:issue"));
        assert_eq!(
            Answer::Status(403, "forbidden".into()).missing_scopes(),
            None
        );
        assert_eq!(
            Answer::Status(401, "token is required".into()).missing_scopes(),
            None
        );
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
