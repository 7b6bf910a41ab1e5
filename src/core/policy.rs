//! Policy: what the state machine does, per repository. Loaded from the TOML file named
//! by `SHEPHERD_CONFIG`: a `[defaults]` table and `[repos."owner/name"]` (or
//! `[repos."owner"]` for a whole organisation) override tables. Every key has a
//! default; unknown keys are rejected with their name. `[webhooks."owner/name"]` (or
//! `."owner"`) tables name per-repository / per-organisation webhook secrets. `config.example.toml` at the
//! repository root lists every key with its default (a test keeps them equal).

use std::collections::BTreeMap;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use super::effect::WorkKind;
use super::ids::{Login, RepoName};

/// Why a policy file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Not TOML, an unknown key, or a value of the wrong type (the message names it).
    #[error("policy file: {0}")]
    Toml(#[from] toml::de::Error),
    /// A value is out of range.
    #[error("policy file: {key}: {problem}")]
    Invalid {
        /// The key, e.g. `repos."o/r".tiers`.
        key: String,
        /// What is wrong.
        problem: String,
    },
}

/// Merge style (`Do` in Forgejo's merge API).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MergeStyle {
    /// Merge commit.
    Merge,
    /// Rebase.
    Rebase,
    /// Rebase, then merge commit.
    RebaseMerge,
    /// Squash.
    Squash,
    /// Fast-forward only.
    FastForwardOnly,
}

/// How a PR branch is brought onto its base's tip (`style` of Forgejo's
/// `POST …/pulls/{index}/update`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpdateStyle {
    /// Merge the base into the head (the PR's commits stay as they are).
    Merge,
    /// Rebase the head onto the base (linear; the PR's commits are rewritten).
    Rebase,
}

impl UpdateStyle {
    /// The API's name of the style.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateStyle::Merge => "merge",
            UpdateStyle::Rebase => "rebase",
        }
    }
}

/// Who merges a ready PR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MergeMode {
    /// The executor merges (a `Merge` effect pinned to the head sha).
    Auto,
    /// An agent merges (a `ready-to-merge` work item).
    Dispatch,
}

/// Which PRs a reviewer-agent setting applies to (`agent_review`,
/// `reviewer_approvals_count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentScope {
    /// Bot PRs only.
    Bot,
    /// Every PR.
    All,
    /// No PR.
    Off,
}

impl AgentScope {
    /// Whether the setting applies to a PR that is (or is not) a bot PR.
    pub fn applies(self, bot_pr: bool) -> bool {
        match self {
            AgentScope::Bot => bot_pr,
            AgentScope::All => true,
            AgentScope::Off => false,
        }
    }
}

/// Whose PRs get agent work (`agent_authors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentAuthors {
    /// Bot PRs only.
    Bot,
    /// Bot PRs and PRs whose author has write access (or is a trusted user).
    Writers,
    /// Every PR.
    Anyone,
}

impl AgentAuthors {
    /// The setting's name.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentAuthors::Bot => "bot",
            AgentAuthors::Writers => "writers",
            AgentAuthors::Anyone => "anyone",
        }
    }
}

/// Declares [`Policy`] (every setting, with defaults) and [`PolicyOverride`] (every
/// setting optional) from one list, so the two cannot drift apart.
macro_rules! policy_settings {
    ($( $(#[$doc:meta])* $name:ident : $ty:ty = $default:expr ; )*) => {
        /// The effective policy of one repository.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct Policy {
            $( $(#[$doc])* pub $name: $ty, )*
            /// The bot user (`SHEPHERD_BOT_LOGIN`, set at run time, not from TOML):
            /// its events update facts but never start work.
            #[serde(skip)]
            pub bot_login: Option<Login>,
        }

        impl Default for Policy {
            fn default() -> Self {
                Self { $( $name: $default, )* bot_login: None }
            }
        }

        /// Per-repository or per-organisation overrides: any subset of the settings.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct PolicyOverride {
            $( $(#[$doc])* #[serde(default, skip_serializing_if = "Option::is_none")]
               pub $name: Option<$ty>, )*
        }

        impl PolicyOverride {
            /// Writes the settings this override sets into `policy`.
            fn apply_to(&self, policy: &mut Policy) {
                $( if let Some(v) = &self.$name { policy.$name = v.clone(); } )*
            }
        }
    };
}

policy_settings! {
    /// Model tier names, lowest first (the tier number is the index).
    tiers: Vec<String> = ["haiku", "codex", "sonnet", "opus"].map(String::from).to_vec();
    /// Approvals a bot PR needs.
    approvals_bot: u32 = 1;
    /// Approvals a human PR needs.
    approvals_human: u32 = 2;
    /// Which PRs reviewer agents review (`review` work): `bot` (bot PRs only), `all`,
    /// or `off`. Needs `reviewer_logins`.
    agent_review: AgentScope = AgentScope::Bot;
    /// The reviewer agents' Forgejo users: their formal reviews are the agents'
    /// verdicts, and a `review` work item names one of them that is not the PR's author.
    reviewer_logins: Vec<String> = Vec::new();
    /// The agent users' Forgejo logins (the user of `SHEPHERD_AGENT_FORGEJO_TOKEN`):
    /// their reviews, like the bot's, never count as approvals, whatever their state.
    agent_logins: Vec<String> = Vec::new();
    /// Whose PRs a reviewer agent's approval counts toward the required approvals for:
    /// `bot` (bot PRs), `all`, or `off` (never: humans must approve).
    reviewer_approvals_count: AgentScope = AgentScope::Bot;
    /// Review dispatches (review → feedback → push rounds) per PR before `needs-human`.
    max_review_rounds: u32 = 3;
    /// Label of a PR claimed by a reviewer agent (the implementer's is `label_claimed`).
    label_claimed_reviewer: String = "auto/claimed-reviewer".into();
    /// Text a bot PR's body must also contain when `require_bot_marker` is set. Never
    /// enough alone: anyone can paste it into a body (only the author decides).
    bot_marker: String = "Automated by CleverAgents Bot".into();
    /// A bot-authored PR counts as a bot PR only if its body also has `bot_marker`.
    require_bot_marker: bool = false;
    /// Authors whose PRs are bot PRs (the bot login always is).
    bot_users: Vec<String> = Vec::new();
    /// CI contexts that must be present and green; empty = every reported context.
    required_contexts: Vec<String> = Vec::new();
    /// Merge style.
    merge_style: MergeStyle = MergeStyle::Squash;
    /// Merge mode.
    merge_mode: MergeMode = MergeMode::Auto;
    /// Delete the head branch after merging.
    delete_branch: bool = true;
    /// Claim time-to-live of a work item, in seconds.
    claim_ttl_secs: u64 = 7200;
    /// Consecutive same-signature attempts at the top tier before `needs-human`.
    stuck_after: u32 = 3;
    /// Attempts (work items of every kind) per PR before it holds at `needs-human`
    /// until a user with write access acts (0 = no bound).
    max_attempts_total: u32 = 12;
    /// Whose PRs get agent work of any kind (ci-fix, review-feedback, merge-conflicts,
    /// stale-check, review): `bot` (bot PRs only), `writers` (bot PRs and PRs whose
    /// author has write access, or is in `trusted_users`), or `anyone`. A PR outside
    /// it gets none until a user with write access comments `/shepherd agents on`.
    agent_authors: AgentAuthors = AgentAuthors::Writers;
    /// Inactivity before a `stale-check`, in seconds.
    stale_after_secs: u64 = 86_400;
    /// First CI poll delay, in seconds (doubles while pending or missing).
    ci_poll_initial_secs: u64 = 5;
    /// Longest CI poll delay, in seconds.
    ci_poll_max_secs: u64 = 120;
    /// Delay before re-reading mergeability after a push, in seconds.
    mergeability_delay_secs: u64 = 10;
    /// Delay before retrying a merge Forgejo asked to try again later, in seconds.
    merge_retry_secs: u64 = 30;
    /// How long a short-lived status (`ready-to-merge`, `merging`, or `awaiting-ci`
    /// before the head's CI was read at all) waits before it is written to the status
    /// comment, in seconds: a status decided sooner (usually `merged`, or what the
    /// first CI read shows) replaces it, so a fast merge costs one edit instead of
    /// three. Every other status, and the last one, is written at once; 0 writes
    /// every status at once.
    status_settle_secs: u64 = 10;
    /// The merge queue (issue 16): a ready PR enters its target branch's queue and is
    /// merged only after CI passed on top of the branch tip. Off by default, so that
    /// turning Shepherd's new version on changes nothing for existing repositories.
    merge_queue: bool = false;
    /// How the queue brings its head onto the branch tip (`POST …/pulls/{n}/update`).
    merge_queue_update_style: UpdateStyle = UpdateStyle::Merge;
    /// Updates of the queue's head onto a moving tip in one turn at the head; when the
    /// tip moves again after that many, the PR goes to the back of the queue (reason
    /// `base-moving`). 0 = no bound.
    merge_queue_max_updates: u32 = 3;
    /// How long the queue's head may wait for its CI to settle on top of the tip, in
    /// seconds; then it leaves the head (reason `ci-timeout`) for the next PR.
    merge_queue_ci_timeout_secs: u64 = 7200;
    /// Freeze windows of the merge queue, UTC (`[{ branch, days, from, to, reason }]`,
    /// `core::queue::freeze`): nothing merges through the branch's queue while one lasts.
    merge_queue_freeze: Vec<super::queue::freeze::FreezeWindow> = Vec::new();
    /// A frozen queue keeps testing its head (update onto the tip, CI), so the head
    /// merges as soon as the freeze ends; off: it waits untested.
    merge_queue_freeze_test: bool = true;
    /// Label of a PR that goes to the front of its queue and merges through a freeze
    /// (empty: none).
    merge_queue_hotfix_label: String = "hotfix".into();
    /// PRs tested together on a temporary branch `shepherd/batch/<branch>/<id>` (issue
    /// 29); 1 = the serial queue (each head updated onto the tip and merged alone).
    merge_queue_batch_size: u32 = 1;
    /// How long a partial batch (fewer than `merge_queue_batch_size` PRs waiting) waits
    /// for more PRs before it is tested, in seconds, counted from the oldest PR's entry.
    merge_queue_batch_wait_secs: u64 = 0;
    /// Re-tests of a single batched PR about to be ejected whose failing checks all
    /// passed on the target's tip, unless the same check already failed in a red run
    /// that held it (reproduced); a red batch of several is bisected, never re-tested
    /// whole, and a check the tip does not know is never retried.
    merge_queue_flaky_retries: u32 = 1;
    /// Whether a red batch of several first reads the CI of its intermediate commits
    /// (the batch branch after each PR merged in, which CI tests as pushes): the
    /// longest green prefix lands at once and the first red one narrows the suspects,
    /// so a culprit is usually found without another run. `false` for a CI that
    /// cancels superseded runs and reports them as plain failures (Forgejo Actions'
    /// own cancellations, "Has been cancelled", are never read as red).
    merge_queue_step_results: bool = true;
    /// Spend caps (issue 28; 0 = no cap, the default), in US dollars: the most one run
    /// may cost. Every applicable cap is checked before dispatch and during the run,
    /// and the tightest remaining one decides (docs/costs.md).
    budget_run_usd: f64 = 0.0;
    /// The most one PR's runs may cost in all (its lifetime), in US dollars.
    budget_pr_usd: f64 = 0.0;
    /// The most one repository's runs may cost per UTC day, in US dollars.
    budget_repo_daily_usd: f64 = 0.0;
    /// The most one repository's runs may cost per UTC month, in US dollars.
    budget_repo_monthly_usd: f64 = 0.0;
    /// The most one organisation's (owner's) runs may cost per UTC day, in US dollars.
    budget_org_daily_usd: f64 = 0.0;
    /// The most one organisation's runs may cost per UTC month, in US dollars.
    budget_org_monthly_usd: f64 = 0.0;
    /// The most the whole instance's runs may cost per UTC day, in US dollars.
    budget_instance_daily_usd: f64 = 0.0;
    /// The most the whole instance's runs may cost per UTC month, in US dollars.
    budget_instance_monthly_usd: f64 = 0.0;
    /// The most input + output tokens one run may use (0 = no cap).
    budget_run_tokens: u64 = 0;
    /// The most input + output tokens one PR's runs may use in all (0 = no cap).
    budget_pr_tokens: u64 = 0;
    /// The most input + output tokens per repository per UTC day (0 = no cap).
    budget_repo_daily_tokens: u64 = 0;
    /// The most input + output tokens per repository per UTC month (0 = no cap).
    budget_repo_monthly_tokens: u64 = 0;
    /// The most input + output tokens per organisation per UTC day (0 = no cap).
    budget_org_daily_tokens: u64 = 0;
    /// The most input + output tokens per organisation per UTC month (0 = no cap).
    budget_org_monthly_tokens: u64 = 0;
    /// The most input + output tokens for the instance per UTC day (0 = no cap).
    budget_instance_daily_tokens: u64 = 0;
    /// The most input + output tokens for the instance per UTC month (0 = no cap).
    budget_instance_monthly_tokens: u64 = 0;
    /// Runaway guard: model steps per run before the runner stops the agent
    /// (outcome `over-steps`; 0 = off).
    max_steps_per_run: u32 = 0;
    /// Runaway guard: tool calls per run before the runner stops the agent (outcome
    /// `over-tool-calls`; 0 = off).
    max_tool_calls_per_run: u32 = 0;
    /// Runaway guard: seconds with no output and no usage before the runner stops the
    /// agent (outcome `idle`; 0 = off).
    agent_idle_timeout_secs: u64 = 0;
    /// Runaway guard: the same tool call with the same arguments this many times in a
    /// row is a loop, and the runner stops the agent (outcome `loop`; 0 = off).
    max_repeats_per_run: u32 = 0;
    /// Volume cap: no `issue-impl` work while the bot's open PRs in the repository are
    /// this many (0 = no cap).
    max_open_agent_prs: u32 = 0;
    /// Volume cap: agent runs started per repository per hour (0 = no cap).
    max_runs_per_hour: u32 = 0;
    /// Users allowed to use `/shepherd` commands without a permission lookup
    /// (others need write access to the repository).
    trusted_users: Vec<String> = Vec::new();
    /// Label of a claimed PR or issue.
    label_claimed: String = "auto/claimed-implementer".into();
    /// Label of a PR or issue that needs a human.
    label_needs_human: String = "needs feedback".into();
    /// Prefix of the tier label (`<prefix><N>`).
    label_tier_prefix: String = "auto/last-attempt-tier-".into();
    /// Label that asks for `issue-impl` on an issue.
    label_implement: String = "auto/implement".into();
    /// Footer ending every comment Shepherd posts.
    comment_footer: String = "---\n**Automated by Shepherd**".into();
    /// Prompt template files of the agent runner by work kind
    /// (`{ "ci-fix" = "/etc/shepherd/ci-fix.md.j2" }`), each replacing the built-in
    /// template of its kind; `shepherd agents` reads and checks them at start. A
    /// repository's table replaces the defaults' table as a whole.
    prompt_templates: BTreeMap<WorkKind, String> = BTreeMap::new();
    /// The agent (`{agent}` of `shepherd agents`) of each work kind, by kind name;
    /// a kind not listed gets [`DEFAULT_AGENT`].
    agents: BTreeMap<WorkKind, String> = BTreeMap::new();
    /// The model id (`{model}` of `shepherd agents`) of each tier, by tier name; a
    /// tier not listed uses its name as the model id.
    models: BTreeMap<String, String> = BTreeMap::new();
    /// The prompt contract: `shepherd` (Shepherd's sections) or `cleveragents-v2`
    /// (the `implementation-worker` v2 contract; docs/cleveragents-v2.md).
    prompt_profile: PromptProfile = PromptProfile::Shepherd;
    /// The agents estimate the first attempt's tier themselves: under
    /// `cleveragents-v2` a first attempt's prompt has no `escalation_tier_hint`.
    tier_estimator: bool = false;
    /// How long a `succeeded` result waits for the push it announces, in seconds;
    /// no push by then and the attempt counts as `no-changes` (issue 27).
    push_grace_secs: u64 = 300;
    /// Regular expressions (case-insensitive) over an agent's output tail that mark
    /// a failed run as transient (model 429/5xx, overload, timeouts): retried with
    /// backoff, no attempt counted, tier unchanged (issue 27).
    transient_patterns: Vec<String> = DEFAULT_TRANSIENT_PATTERNS.iter().map(|s| (*s).to_owned()).collect();
    /// Retries of a transient agent failure before it counts as a failed attempt.
    transient_retries: u32 = 3;
    /// First backoff before a transient retry, in seconds (doubles each retry).
    transient_backoff_secs: u64 = 30;
    /// The branch an `issue-impl` agent works on; `{number}` is the issue's number.
    issue_branch: String = "shepherd/issue-{number}".into();
    /// Labels that keep an issue from being dispatched (besides open dependencies).
    blocked_labels: Vec<String> = ["State/Paused", "Blocked"].map(String::from).to_vec();
    /// How often an issue blocked by an open dependency reads its dependencies again,
    /// in seconds (Forgejo sends the dependency's `closed` webhook, never one for the
    /// issue it blocks); also how long a dependency read may stay unanswered.
    dependency_recheck_secs: u64 = 300;
}

/// Which prompt contract the agents get (`prompt_profile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptProfile {
    /// Shepherd's own prompt (templates per work kind).
    Shepherd,
    /// The cleveragents `implementation-worker` v2 contract.
    #[serde(rename = "cleveragents-v2")]
    CleveragentsV2,
}

/// The default `transient_patterns`: how opencode and the model providers word a
/// failure that a later retry may not have (rate limits, overload, 5xx, timeouts).
///
/// opencode-ai 1.18.33 (`opencode run`), after its own retries of a failing model
/// request, prints `Error: <the provider's message>` last and exits 1 — e.g. `Error:
/// Rate limit reached for requests` (a 429), `Error: Overloaded` (a 529), `Error:
/// Internal server error` (a 500), `Error: Service Unavailable: Service Unavailable`
/// (a 503 with a plain body), `Error: Cannot connect to API: Unable to connect. …`
/// (connection refused); with `--format json` the last line is an `error` event whose
/// `data` has `"statusCode":429` and `"isRetryable":true`. A 400 prints its message
/// (`Error: Invalid model parameter`), which none of these match.
pub const DEFAULT_TRANSIENT_PATTERNS: &[&str] = &[
    r"\b429\b",
    r"rate[ _-]?limit",
    r"too many requests",
    r"overloaded",
    r"\b50[0234]\b",
    r"internal server error",
    r"service unavailable",
    r"bad gateway",
    r"gateway time-?out",
    r"timed? ?out",
    r"ETIMEDOUT|ECONNRESET|ECONNREFUSED",
    r"cannot connect to api",
    r"temporarily unavailable",
    r#""isRetryable":true"#,
];

/// Compiles one of `transient_patterns` as the runner matches it: case-insensitive,
/// with `regex-lite` (matching time linear in the output's length, whatever the
/// pattern). The error says why it does not compile.
pub fn transient_regex(pattern: &str) -> Result<regex_lite::Regex, String> {
    if pattern.trim().is_empty() {
        return Err("an empty pattern would match every output".into());
    }
    regex_lite::RegexBuilder::new(pattern)
        .case_insensitive(true)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| e.to_string())
}

/// The agent of a work kind the policy's `agents` table does not name.
pub const DEFAULT_AGENT: &str = "implementation-worker";

impl Policy {
    /// Index of the top tier.
    pub fn top_tier(&self) -> u8 {
        u8::try_from(self.tiers.len().saturating_sub(1)).unwrap_or(u8::MAX)
    }

    /// Name of tier `tier` (the top tier's name when out of range).
    pub fn tier_name(&self, tier: u8) -> String {
        let i = usize::from(tier).min(self.tiers.len().saturating_sub(1));
        self.tiers.get(i).cloned().unwrap_or_default()
    }

    /// The agent of work kind `kind` (policy `agents`, else [`DEFAULT_AGENT`]).
    pub fn agent_for(&self, kind: WorkKind) -> &str {
        self.agents.get(&kind).map_or(DEFAULT_AGENT, String::as_str)
    }

    /// The model id of tier `tier`: the policy's `models` entry for the tier's name,
    /// else the name itself.
    pub fn model_for(&self, tier: u8) -> String {
        let name = self.tier_name(tier);
        self.models.get(&name).cloned().unwrap_or(name)
    }

    /// The tier label for `tier`.
    pub fn tier_label(&self, tier: u8) -> String {
        format!("{}{tier}", self.label_tier_prefix)
    }

    /// Whether `login` is the bot user.
    pub fn is_bot(&self, login: Option<&Login>) -> bool {
        matches!((login, &self.bot_login), (Some(l), Some(b)) if l == b)
    }

    /// Whether `login` is one of the reviewer agents' users (`reviewer_logins`).
    pub fn is_reviewer(&self, login: &Login) -> bool {
        self.reviewer_logins
            .iter()
            .any(|r| r.eq_ignore_ascii_case(login.as_str()))
    }

    /// Whether `login` is one of the agent users (`agent_logins`).
    pub fn is_agent(&self, login: &Login) -> bool {
        self.agent_logins
            .iter()
            .any(|a| a.eq_ignore_ascii_case(login.as_str()))
    }

    /// Whether `login`'s approvals never count: the bot user or an agent user.
    pub fn is_bot_or_agent(&self, login: &Login) -> bool {
        self.is_bot(Some(login)) || self.is_agent(login)
    }

    /// Whether `login` is trusted for commands without a permission lookup.
    pub fn is_trusted(&self, login: &Login) -> bool {
        self.trusted_users
            .iter()
            .any(|t| t.eq_ignore_ascii_case(login.as_str()))
    }

    /// Whether `login` is a configured bot author (or the bot user).
    pub fn is_bot_author(&self, login: &Login) -> bool {
        self.is_bot(Some(login))
            || self
                .bot_users
                .iter()
                .any(|b| b.eq_ignore_ascii_case(login.as_str()))
    }

    /// Checks value ranges; `key` prefixes the names in errors.
    fn validate(&self, key: &str) -> Result<(), PolicyError> {
        let invalid = |name: &str, problem: &str| PolicyError::Invalid {
            key: format!("{key}{name}"),
            problem: problem.into(),
        };
        if self.tiers.is_empty() || self.tiers.len() > 16 {
            return Err(invalid("tiers", "needs 1 to 16 tier names"));
        }
        if self.stuck_after == 0 || self.stuck_after as usize > super::record::ATTEMPTS_KEPT {
            return Err(invalid(
                "stuck_after",
                "must be 1 to 10 (a record keeps its last 10 attempts)",
            ));
        }
        if !(1..=20).contains(&self.max_review_rounds) {
            return Err(invalid("max_review_rounds", "must be 1 to 20"));
        }
        if self
            .reviewer_logins
            .iter()
            .any(|l| l.parse::<Login>().is_err())
        {
            return Err(invalid("reviewer_logins", "has an empty or invalid login"));
        }
        if self
            .agent_logins
            .iter()
            .any(|l| l.parse::<Login>().is_err())
        {
            return Err(invalid("agent_logins", "has an empty or invalid login"));
        }
        if self.merge_queue_ci_timeout_secs == 0 {
            return Err(invalid("merge_queue_ci_timeout_secs", "must be at least 1"));
        }
        super::queue::freeze::validate(&self.merge_queue_freeze)
            .map_err(|problem| invalid("merge_queue_freeze", &problem))?;
        if self.merge_queue_batch_size == 0 {
            return Err(invalid("merge_queue_batch_size", "must be at least 1"));
        }
        if self.claim_ttl_secs == 0 {
            return Err(invalid("claim_ttl_secs", "must be at least 1"));
        }
        if let Some((kind, _)) = self
            .prompt_templates
            .iter()
            .find(|(_, path)| path.trim().is_empty())
        {
            return Err(invalid(
                &format!("prompt_templates.{}", kind.as_str()),
                "needs a file path",
            ));
        }
        if let Some(tier) = self.models.keys().find(|t| !self.tiers.contains(t)) {
            return Err(invalid(
                "models",
                &format!("{tier:?} is not one of the tiers {:?}", self.tiers),
            ));
        }
        if self
            .models
            .values()
            .chain(self.agents.values())
            .any(|v| v.trim().is_empty())
        {
            return Err(invalid("agents/models", "a name or model id is empty"));
        }
        if self.merge_queue && self.merge_mode == MergeMode::Dispatch {
            return Err(invalid(
                "merge_queue",
                "needs merge_mode = \"auto\" (the executor tests and merges the queue's head)",
            ));
        }
        for (i, pattern) in self.transient_patterns.iter().enumerate() {
            transient_regex(pattern).map_err(|why| {
                invalid(
                    &format!("transient_patterns[{i}]"),
                    &format!("{pattern:?} is not a valid pattern: {why}"),
                )
            })?;
        }
        if self.transient_retries > 20 {
            return Err(invalid(
                "transient_retries",
                "must be 0 to 20 (0: a transient failure is a failed attempt)",
            ));
        }
        if self.transient_backoff_secs > 86_400 {
            return Err(invalid(
                "transient_backoff_secs",
                "must be 0 to 86400 (a day)",
            ));
        }
        if let Err(problem) = issue_branch_problem(&self.issue_branch) {
            return Err(invalid("issue_branch", &problem));
        }
        if self.blocked_labels.iter().any(|l| l.trim().is_empty()) {
            return Err(invalid("blocked_labels", "has an empty label name"));
        }
        if self.dependency_recheck_secs == 0 {
            return Err(invalid("dependency_recheck_secs", "must be at least 1"));
        }
        if self.ci_poll_initial_secs == 0 || self.ci_poll_max_secs < self.ci_poll_initial_secs {
            return Err(invalid(
                "ci_poll_max_secs",
                "ci_poll_initial_secs must be ≥ 1 and ≤ ci_poll_max_secs",
            ));
        }
        Ok(())
    }
}

/// Why `template` (policy `issue_branch`) cannot name one branch per issue: it must
/// hold `{number}`, and with a number in its place be a name git accepts.
fn issue_branch_problem(template: &str) -> Result<(), String> {
    if !template.contains("{number}") {
        return Err("must contain {number} (one branch per issue)".into());
    }
    let example = template.replace("{number}", "7");
    match super::ids::branch_name_problem(&example) {
        Some(p) => Err(format!("{example:?} is not a branch name git accepts: {p}")),
        None => Ok(()),
    }
}

/// The whole policy file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// Settings for every repository.
    #[serde(default)]
    pub defaults: Policy,
    /// Overrides keyed by `owner/name` (one repository) or `owner` (an organisation);
    /// a repository's own table wins over its organisation's.
    #[serde(default)]
    pub repos: BTreeMap<String, PolicyOverride>,
    /// Webhook secrets of single repositories (`owner/name`) or organisations
    /// (`owner`). Where a table applies, its secrets *replace* `SHEPHERD_WEBHOOK_SECRETS`
    /// for that repository (a repository's own table wins over its organisation's).
    /// The ingest reads the named environment variables at start (the core stays pure).
    #[serde(default)]
    pub webhooks: BTreeMap<String, WebhookSecrets>,
    /// The bot user, copied into every [`Policy`] (set with [`PolicyFile::with_bot_login`]).
    #[serde(skip)]
    pub bot_login: Option<Login>,
}

/// Where the webhook secrets of one repository or organisation come from. Several
/// secrets (rotation) may be given; a delivery signed with any of them is accepted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSecrets {
    /// Names of environment variables holding the secrets (preferred: the policy file
    /// then holds no secret). A string or a list of strings.
    #[serde(default, deserialize_with = "one_or_many")]
    pub secret_env: Vec<String>,
    /// Secrets written in the file itself (a string or a list). Discouraged; never
    /// serialized back, never shown by `Debug`.
    #[serde(default, deserialize_with = "one_or_many", skip_serializing)]
    pub secret: Vec<InlineSecret>,
}

/// A secret written in the policy file: held as a [`SecretString`] from parsing on.
#[derive(Debug, Clone, Deserialize)]
#[serde(transparent)]
pub struct InlineSecret(pub SecretString);

impl PartialEq for InlineSecret {
    /// Equality of configuration values (tests, reload diffs), never used to
    /// authenticate anything.
    fn eq(&self, other: &Self) -> bool {
        self.0.expose_secret() == other.0.expose_secret()
    }
}

/// Accepts `"x"` as well as `["x", "y"]`.
fn one_or_many<'de, D, T>(de: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    /// Either spelling.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany<T> {
        /// A single value.
        One(T),
        /// A list.
        Many(Vec<T>),
    }
    Ok(match OneOrMany::deserialize(de)? {
        OneOrMany::One(v) => vec![v],
        OneOrMany::Many(v) => v,
    })
}

impl PolicyFile {
    /// Parses and validates a policy file.
    pub fn from_toml(text: &str) -> Result<PolicyFile, PolicyError> {
        let file: PolicyFile = toml::from_str(text)?;
        file.defaults.validate("defaults.")?;
        for key in file.repos.keys() {
            let policy = file.resolve(&key.to_lowercase());
            policy.validate(&format!("repos.\"{key}\"."))?;
        }
        for (key, w) in &file.webhooks {
            let invalid = |problem: &str| PolicyError::Invalid {
                key: format!("webhooks.\"{key}\""),
                problem: problem.into(),
            };
            let parts: Vec<&str> = key.split('/').collect();
            if parts.len() > 2 || parts.iter().any(|p| p.trim().is_empty()) {
                return Err(invalid("must be \"owner\" or \"owner/name\""));
            }
            if w.secret_env.is_empty() && w.secret.is_empty() {
                return Err(invalid("needs secret_env (or secret)"));
            }
            if w.secret.iter().any(|s| s.0.expose_secret().is_empty())
                || w.secret_env.iter().any(|n| n.trim().is_empty())
            {
                return Err(invalid("has an empty secret or variable name"));
            }
            let lower = key.to_lowercase();
            if file
                .webhooks
                .keys()
                .filter(|k| k.to_lowercase() == lower)
                .count()
                > 1
            {
                return Err(invalid("is listed twice (names are case-insensitive)"));
            }
        }
        Ok(file)
    }

    /// Sets the bot user (from `SHEPHERD_BOT_LOGIN`).
    pub fn with_bot_login(mut self, login: Option<Login>) -> PolicyFile {
        self.bot_login = login;
        self
    }

    /// The effective policy of `repo`: defaults, then its organisation's overrides,
    /// then its own.
    pub fn for_repo(&self, repo: &RepoName) -> Policy {
        self.resolve(repo.as_str())
    }

    /// Resolves a lower-case key (`owner/name` or `owner`).
    fn resolve(&self, key: &str) -> Policy {
        let mut policy = self.defaults.clone();
        let owner = key.split('/').next().unwrap_or(key);
        let find = |k: &str| {
            self.repos
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(k))
                .map(|(_, o)| o)
        };
        if let Some(o) = find(owner) {
            o.apply_to(&mut policy);
        }
        if key != owner
            && let Some(o) = find(key)
        {
            o.apply_to(&mut policy);
        }
        policy.bot_login = self.bot_login.clone();
        policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_file_lists_exactly_the_defaults() {
        let text = include_str!("../../config.example.toml");
        let file = PolicyFile::from_toml(text).expect("config.example.toml parses");
        assert_eq!(file, PolicyFile::default());
        // Every setting is spelled out in the example (none left to the defaults).
        let value: toml::Table = toml::from_str(text).unwrap();
        let defaults = value["defaults"].as_table().unwrap();
        let all = toml::Table::try_from(Policy::default()).unwrap();
        let missing: Vec<_> = all.keys().filter(|k| !defaults.contains_key(*k)).collect();
        assert!(missing.is_empty(), "config.example.toml lacks {missing:?}");
    }

    #[test]
    fn overrides_apply_org_then_repo() {
        let file = PolicyFile::from_toml(
            r#"
            [defaults]
            approvals_human = 3
            [repos."acme"]
            merge_mode = "dispatch"
            approvals_bot = 2
            [repos."Acme/Web"]
            approvals_bot = 0
            tiers = ["small", "large"]
            "#,
        )
        .unwrap()
        .with_bot_login(Some("bot".parse().unwrap()));
        let web = file.for_repo(&"acme/web".parse().unwrap());
        assert_eq!(web.approvals_human, 3);
        assert_eq!(web.approvals_bot, 0);
        assert_eq!(web.merge_mode, MergeMode::Dispatch);
        assert_eq!(web.top_tier(), 1);
        assert_eq!(web.bot_login.as_ref().unwrap().as_str(), "bot");
        let api = file.for_repo(&"acme/api".parse().unwrap());
        assert_eq!(api.approvals_bot, 2);
        let other = file.for_repo(&"x/y".parse().unwrap());
        assert_eq!(other.approvals_bot, 1);
        assert_eq!(other.merge_mode, MergeMode::Auto);
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = PolicyFile::from_toml("[defaults]\napprovals = 1\n").unwrap_err();
        assert!(err.to_string().contains("approvals"), "{err}");
        let err = PolicyFile::from_toml("[repos.\"a/b\"]\nmerge_stlye = \"squash\"\n").unwrap_err();
        assert!(err.to_string().contains("merge_stlye"), "{err}");
        let err = PolicyFile::from_toml("[defualts]\n").unwrap_err();
        assert!(err.to_string().contains("defualts"), "{err}");
    }

    #[test]
    fn webhook_secrets_by_env_or_inline() {
        let file = PolicyFile::from_toml(
            r#"
            [webhooks."acme"]
            secret_env = "ACME_SECRET"
            [webhooks."acme/web"]
            secret_env = ["WEB_NEW", "WEB_OLD"]
            secret = "inline-s3cret"
            "#,
        )
        .unwrap();
        assert_eq!(file.webhooks["acme"].secret_env, ["ACME_SECRET"]);
        let web = &file.webhooks["acme/web"];
        assert_eq!(web.secret_env, ["WEB_NEW", "WEB_OLD"]);
        assert_eq!(web.secret[0].0.expose_secret(), "inline-s3cret");
        assert!(!format!("{file:?}").contains("inline-s3cret"));
        let err = PolicyFile::from_toml("[webhooks.\"a/b\"]\nsecrets = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("secrets"), "{err}");
        let err = PolicyFile::from_toml("[webhooks.\"a/b\"]\n").unwrap_err();
        assert!(err.to_string().contains("webhooks.\"a/b\""), "{err}");
        let err = PolicyFile::from_toml("[webhooks.\"a/b/c\"]\nsecret_env = \"X\"\n").unwrap_err();
        assert!(err.to_string().contains("owner/name"), "{err}");
    }

    #[test]
    fn agents_and_models_per_kind_and_tier() {
        let file = PolicyFile::from_toml(
            r#"
            [defaults]
            models = { haiku = "stub/small", opus = "stub/large" }
            agents = { "issue-impl" = "issue-worker" }
            [repos."a/b"]
            tiers = ["one", "two"]
            models = { two = "m2" }
            "#,
        )
        .unwrap();
        let p = file.for_repo(&"x/y".parse().unwrap());
        assert_eq!(p.model_for(0), "stub/small");
        assert_eq!(
            p.model_for(1),
            "codex",
            "an unmapped tier's model is its name"
        );
        assert_eq!(p.model_for(3), "stub/large");
        assert_eq!(p.agent_for(WorkKind::IssueImpl), "issue-worker");
        assert_eq!(p.agent_for(WorkKind::CiFix), DEFAULT_AGENT);
        let ab = file.for_repo(&"a/b".parse().unwrap());
        assert_eq!(
            (ab.model_for(0).as_str(), ab.model_for(1).as_str()),
            ("one", "m2")
        );
        let err = PolicyFile::from_toml("[defaults]\nmodels = { sonet = \"x\" }\n").unwrap_err();
        assert!(
            err.to_string().contains("defaults.models") && err.to_string().contains("sonet"),
            "{err}"
        );
        let err = PolicyFile::from_toml("[defaults]\nagents = { fixing = \"x\" }\n").unwrap_err();
        assert!(err.to_string().contains("fixing"), "{err}");
    }

    #[test]
    fn reviewer_agents_settings() {
        let file = PolicyFile::from_toml(
            r#"
            [defaults]
            reviewer_logins = ["Rev-One", "rev-two"]
            [repos."a/b"]
            agent_review = "all"
            reviewer_approvals_count = "off"
            max_review_rounds = 5
            "#,
        )
        .unwrap();
        let d = file.for_repo(&"x/y".parse().unwrap());
        assert_eq!(d.agent_review, AgentScope::Bot);
        assert_eq!(d.reviewer_approvals_count, AgentScope::Bot);
        assert_eq!(d.max_review_rounds, 3);
        assert_eq!(d.label_claimed_reviewer, "auto/claimed-reviewer");
        assert!(d.is_reviewer(&"rev-one".parse().unwrap()));
        assert!(!d.is_reviewer(&"someone".parse().unwrap()));
        let ab = file.for_repo(&"a/b".parse().unwrap());
        assert!(ab.agent_review.applies(false) && ab.agent_review.applies(true));
        assert!(!ab.reviewer_approvals_count.applies(true));
        assert_eq!(ab.max_review_rounds, 5);
        let err = PolicyFile::from_toml("[defaults]\nmax_review_rounds = 0\n").unwrap_err();
        assert!(err.to_string().contains("max_review_rounds"), "{err}");
        let err = PolicyFile::from_toml("[defaults]\nagent_review = \"some\"\n").unwrap_err();
        assert!(err.to_string().contains("agent_review"), "{err}");
        let err = PolicyFile::from_toml("[defaults]\nreviewer_logins = [\"\"]\n").unwrap_err();
        assert!(err.to_string().contains("reviewer_logins"), "{err}");
    }

    #[test]
    fn issue_26_settings() {
        let d = PolicyFile::default().defaults;
        assert_eq!(
            (d.max_attempts_total, d.merge_queue_ci_timeout_secs),
            (12, 7200)
        );
        assert!(d.agent_logins.is_empty());
        let file = PolicyFile::from_toml("[defaults]\nagent_logins = [\"Agent-User\"]\n")
            .unwrap()
            .with_bot_login(Some("bot".parse().unwrap()));
        let p = file.for_repo(&"x/y".parse().unwrap());
        assert!(p.is_bot_or_agent(&"agent-user".parse().unwrap()));
        assert!(p.is_bot_or_agent(&"bot".parse().unwrap()));
        assert!(!p.is_bot_or_agent(&"alice".parse().unwrap()));
        for (text, key) in [
            ("agent_logins = [\" \"]", "agent_logins"),
            (
                "merge_queue_ci_timeout_secs = 0",
                "merge_queue_ci_timeout_secs",
            ),
            ("stuck_after = 11", "stuck_after"),
        ] {
            let err = PolicyFile::from_toml(&format!("[defaults]\n{text}\n")).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn issue_29_batch_settings() {
        let d = PolicyFile::default().defaults;
        assert_eq!(
            (
                d.merge_queue_batch_size,
                d.merge_queue_batch_wait_secs,
                d.merge_queue_flaky_retries
            ),
            (1, 0, 1)
        );
        let file = PolicyFile::from_toml(
            "[defaults]\nmerge_queue_batch_size = 8\nmerge_queue_batch_wait_secs = 30\n\
             merge_queue_flaky_retries = 0\n",
        )
        .unwrap();
        let p = file.for_repo(&"x/y".parse().unwrap());
        assert_eq!(
            (
                p.merge_queue_batch_size,
                p.merge_queue_batch_wait_secs,
                p.merge_queue_flaky_retries
            ),
            (8, 30, 0)
        );
        let err = PolicyFile::from_toml("[defaults]\nmerge_queue_batch_size = 0\n").unwrap_err();
        assert!(err.to_string().contains("merge_queue_batch_size"), "{err}");
    }

    #[test]
    fn out_of_range_values_are_named() {
        let err = PolicyFile::from_toml("[repos.\"a/b\"]\ntiers = []\n").unwrap_err();
        assert!(err.to_string().contains("repos.\"a/b\".tiers"), "{err}");
    }

    #[test]
    fn prompt_profile_and_tier_estimator() {
        let file = PolicyFile::from_toml(
            r#"
            [defaults]
            prompt_profile = "cleveragents-v2"
            tier_estimator = true
            [repos."o/plain"]
            prompt_profile = "shepherd"
            "#,
        )
        .expect("valid");
        let repo = "o/r".parse().expect("a repository");
        let p = file.for_repo(&repo);
        assert_eq!(p.prompt_profile, PromptProfile::CleveragentsV2);
        assert!(p.tier_estimator);
        let plain = file.for_repo(&"o/plain".parse().expect("a repository"));
        assert_eq!(plain.prompt_profile, PromptProfile::Shepherd);
        assert_eq!(Policy::default().prompt_profile, PromptProfile::Shepherd);
        assert!(!Policy::default().tier_estimator);
        assert!(PolicyFile::from_toml("[defaults]\nprompt_profile = \"v3\"").is_err());
    }

    #[test]
    fn prompt_templates_by_kind() {
        let file = PolicyFile::from_toml(
            r#"
            [defaults]
            prompt_templates = { "ci-fix" = "/etc/shepherd/ci-fix.md.j2" }
            [repos."acme/web"]
            prompt_templates = { "issue-impl" = "web-issue.md.j2" }
            "#,
        )
        .unwrap();
        let other = file.for_repo(&"x/y".parse().unwrap());
        assert_eq!(
            other
                .prompt_templates
                .get(&WorkKind::CiFix)
                .map(String::as_str),
            Some("/etc/shepherd/ci-fix.md.j2")
        );
        let web = file.for_repo(&"acme/web".parse().unwrap());
        assert_eq!(
            web.prompt_templates.len(),
            1,
            "the repository's table replaces"
        );
        assert!(web.prompt_templates.contains_key(&WorkKind::IssueImpl));
        let err = PolicyFile::from_toml("[defaults]\nprompt_templates = { \"ci-fx\" = \"a\" }\n")
            .unwrap_err();
        assert!(err.to_string().contains("ci-fx"), "{err}");
        let err =
            PolicyFile::from_toml("[repos.\"a/b\"]\nprompt_templates = { \"ci-fix\" = \" \" }\n")
                .unwrap_err();
        assert!(
            err.to_string()
                .contains("repos.\"a/b\".prompt_templates.ci-fix"),
            "{err}"
        );
    }
}
