//! The agent's prompt: a `minijinja` template per work kind, rendered over the work
//! item, its [`AgentContext`] and the parameter lines. The built-in templates
//! (`src/agents/templates/`, compiled in) produce the named `## ` sections and the
//! parameter lines the agents expect; the policy's `prompt_templates` replaces them per
//! kind and repository with files read and checked once, at start.
//!
//! Untrusted text (PR bodies, comments, reviews, the diff) only ever reaches the
//! engine as *values*: it is never compiled as template source, so `{{ … }}` in a PR
//! body is printed as it is. The built-in templates put every multi-line untrusted
//! text in a code fence longer than any backtick run inside it (the `fence` filter),
//! and [`super::context`] flattens one-line texts, so a body cannot close its block or
//! forge a section heading or a parameter line.

use std::collections::BTreeSet;

use anyhow::Context as _;
use minijinja::{AutoEscape, Environment, ErrorKind, UndefinedBehavior, Value, context};
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;

use super::context::AgentContext;
use crate::core::effect::{WorkItem, WorkKind};
use crate::core::policy::{PolicyFile, PromptProfile};

/// The built-in templates: their names (as `{% extends %}`/`{% include %}` see them)
/// and sources.
const BUILTIN: [(&str, &str); 14] = [
    (
        "builtin/issue-inputs.md.j2",
        include_str!("templates/issue-inputs.md.j2"),
    ),
    (
        "builtin/cleveragents-v2.md.j2",
        include_str!("templates/cleveragents-v2.md.j2"),
    ),
    (
        "builtin/v2-task.md.j2",
        include_str!("templates/v2-task.md.j2"),
    ),
    (
        "builtin/parameters.md.j2",
        include_str!("templates/parameters.md.j2"),
    ),
    (
        "builtin/ci-logs.md.j2",
        include_str!("templates/ci-logs.md.j2"),
    ),
    (
        "builtin/data-note.md.j2",
        include_str!("templates/data-note.md.j2"),
    ),
    ("builtin/pr.md.j2", include_str!("templates/pr.md.j2")),
    (
        "builtin/ci-fix.md.j2",
        include_str!("templates/ci-fix.md.j2"),
    ),
    (
        "builtin/review-feedback.md.j2",
        include_str!("templates/review-feedback.md.j2"),
    ),
    (
        "builtin/merge-conflicts.md.j2",
        include_str!("templates/merge-conflicts.md.j2"),
    ),
    (
        "builtin/stale-check.md.j2",
        include_str!("templates/stale-check.md.j2"),
    ),
    (
        "builtin/ready-to-merge.md.j2",
        include_str!("templates/ready-to-merge.md.j2"),
    ),
    (
        "builtin/issue-impl.md.j2",
        include_str!("templates/issue-impl.md.j2"),
    ),
    (
        "builtin/review.md.j2",
        include_str!("templates/review.md.j2"),
    ),
];

/// The template of every work kind but `review` under the `cleveragents-v2` profile.
pub const V2_TEMPLATE: &str = "builtin/cleveragents-v2.md.j2";

/// The standing instruction line that ends a `cleveragents-v2` prompt (004's example
/// prompt and its tier-dispatcher template).
pub const V2_STANDING_LINE: &str = "Implement or fix the indicated issue or pull request.";

/// Prefix of the built-in templates' names; no override file may be named so.
const BUILTIN_PREFIX: &str = "builtin/";

/// Every work kind, for checking that each has a template that renders.
const KINDS: [WorkKind; 7] = [
    WorkKind::CiFix,
    WorkKind::ReviewFeedback,
    WorkKind::MergeConflicts,
    WorkKind::StaleCheck,
    WorkKind::IssueImpl,
    WorkKind::ReadyToMerge,
    WorkKind::Review,
];

/// What the prompt needs besides the work item and its context.
#[derive(Debug, Clone)]
pub struct PromptParams {
    /// `SHEPHERD_FORGEJO_URL`: the `forgejo_url` parameter line.
    pub forgejo_url: String,
    /// The `forgejo_pat` parameter line: only when the operator opted in to hand the
    /// agents a token; otherwise no token is anywhere in the prompt.
    pub forgejo_pat: Option<SecretString>,
    /// The agents' git author name (`SHEPHERD_AGENT_GIT_NAME`).
    pub git_user_name: Option<String>,
    /// The agents' git author e-mail (`SHEPHERD_AGENT_GIT_EMAIL`).
    pub git_user_email: Option<String>,
    /// The path of the agent's pre-cloned working copy (`SHEPHERD_AGENT_CHECKOUT`).
    pub checkout: Option<String>,
}

impl PromptParams {
    /// Parameters with only the instance's URL (no token, identity or checkout).
    pub fn new(forgejo_url: &str) -> Self {
        Self {
            forgejo_url: forgejo_url.to_owned(),
            forgejo_pat: None,
            git_user_name: None,
            git_user_email: None,
            checkout: None,
        }
    }
}

/// Why a prompt could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The template failed on this work item (an override that uses a value this
    /// item does not have, for example).
    #[error("prompt template {template} ({kind} work): {message}")]
    Render {
        /// The work kind.
        kind: &'static str,
        /// The template's name (`builtin/…` or the override's path).
        template: String,
        /// minijinja's message, naming the template line.
        message: String,
    },
}

/// The compiled templates: the built-in ones and every override the policy names.
pub struct Templates {
    /// The engine holding every template.
    env: Environment<'static>,
    /// The policy, to resolve a repository's override of a kind.
    policy: PolicyFile,
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.env.templates().map(|(name, _)| name).collect();
        f.debug_struct("Templates")
            .field("templates", &names)
            .finish_non_exhaustive()
    }
}

/// The parameter lines, as the templates see them (`params.…`).
#[derive(Serialize)]
struct Params<'a> {
    /// `pr_fix`, `pr_review` or `issue_impl`.
    work_type: &'static str,
    /// PR or issue number.
    work_number: u64,
    /// The instance's base URL.
    forgejo_url: &'a str,
    /// Repository owner.
    forgejo_owner: &'a str,
    /// Repository name.
    forgejo_repo: &'a str,
    /// The tier index the agent starts at.
    escalation_tier_hint: u8,
    /// Always `"false"` (text, as the parameter line says it): Shepherd owns and
    /// releases the claim.
    release_claim_on_exit: &'static str,
    /// The token, only when opted in.
    forgejo_pat: Option<&'a str>,
    /// The PR's or issue's title (one line).
    work_title: String,
    /// The git author name (one line), when configured.
    git_user_name: Option<String>,
    /// The git author e-mail (one line), when configured.
    git_user_email: Option<String>,
    /// `escalation_tier_hint` of the `cleveragents-v2` profile: `None` on a first
    /// attempt when the policy lets the agents estimate the tier.
    tier_hint: Option<u8>,
    /// The pre-cloned working copy's path.
    checkout: Option<String>,
}

/// The merge gates' figures the `cleveragents-v2` pre-flight summary shows.
#[derive(Serialize)]
struct Gates {
    /// Current approvals (official, not stale, not dismissed; one per reviewer).
    approvals_had: usize,
    /// Approvals the PR needs (the policy's, for a bot or a human PR).
    approvals_needed: u32,
    /// CI contexts that are green.
    checks_green: usize,
}

impl Templates {
    /// Built-in templates plus per-repository overrides from the policy; fails at start
    /// on a missing or invalid template file.
    ///
    /// Every override file is read once, compiled, and rendered over two sample work
    /// items of its kind (one with every piece of context, one where every optional
    /// piece could not be read), so a syntax error, an unknown filter or a misspelt
    /// variable is found now, with the file and line, rather than on the first work
    /// item.
    pub fn load(policy: &PolicyFile) -> anyhow::Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(true);
        env.set_undefined_behavior(UndefinedBehavior::SemiStrict);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.add_filter("fence", fence);
        env.add_filter("one_line", |s: String| super::context::one_line(&s));
        env.add_filter("unticked", unticked);
        for (name, source) in BUILTIN {
            env.add_template(name, source)
                .with_context(|| format!("built-in prompt template {name}"))?;
        }
        let mut tables = vec![("defaults".to_owned(), &policy.defaults.prompt_templates)];
        for (repo, o) in &policy.repos {
            if let Some(t) = &o.prompt_templates {
                tables.push((format!("repos.\"{repo}\""), t));
            }
        }
        let mut checked: BTreeSet<(String, WorkKind)> = BTreeSet::new();
        let mut templates = Self {
            env,
            policy: policy.clone(),
        };
        for (scope, table) in tables {
            for (kind, path) in table {
                let key = format!("{scope}.prompt_templates.{}", kind.as_str());
                if !checked.insert((path.clone(), *kind)) {
                    continue;
                }
                templates
                    .add_override(path)
                    .with_context(|| format!("policy {key}"))?;
                templates
                    .check(*kind, path)
                    .with_context(|| format!("policy {key}"))?;
            }
        }
        for kind in KINDS {
            templates.check(kind, &builtin_name(kind))?;
            templates.check(kind, &builtin_for(kind, PromptProfile::CleveragentsV2))?;
        }
        Ok(templates)
    }

    /// Reads and compiles the override file `path` (once, whatever uses it).
    fn add_override(&mut self, path: &str) -> anyhow::Result<()> {
        if path.starts_with(BUILTIN_PREFIX) {
            anyhow::bail!(
                "{path:?}: names starting with {BUILTIN_PREFIX:?} are the built-in templates'"
            );
        }
        if self.env.get_template(path).is_ok() {
            return Ok(());
        }
        let source = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the prompt template {path:?}"))?;
        self.env
            .add_template_owned(path.to_owned(), source)
            .map_err(|e| anyhow::anyhow!("prompt template {path:?}: {e}"))?;
        Ok(())
    }

    /// Renders `template` over the sample work items of `kind`.
    fn check(&self, kind: WorkKind, template: &str) -> anyhow::Result<()> {
        let params = PromptParams::new("https://forgejo.example");
        for (item, ctx) in samples::items(kind) {
            self.render_with(template, &item, &ctx, &params)
                .map_err(anyhow::Error::new)?;
        }
        Ok(())
    }

    /// The prompt of `item`: its repository's template for its kind (the policy's
    /// override, else the built-in one) over the item, its context and the parameters.
    pub fn render(
        &self,
        item: &WorkItem,
        ctx: &AgentContext,
        params: &PromptParams,
    ) -> Result<String, PromptError> {
        let policy = self.policy.for_repo(&item.repo);
        let name = policy
            .prompt_templates
            .get(&item.kind)
            .cloned()
            .unwrap_or_else(|| builtin_for(item.kind, policy.prompt_profile));
        let ctx = mark_commenters(ctx, item, &policy);
        self.render_with(&name, item, &ctx, params)
    }

    fn render_with(
        &self,
        name: &str,
        item: &WorkItem,
        ctx: &AgentContext,
        params: &PromptParams,
    ) -> Result<String, PromptError> {
        let fail = |e: minijinja::Error| PromptError::Render {
            kind: item.kind.as_str(),
            template: name.to_owned(),
            message: error_text(&e),
        };
        let work_type = match item.kind {
            WorkKind::IssueImpl => "issue_impl",
            WorkKind::CiFix
            | WorkKind::ReviewFeedback
            | WorkKind::MergeConflicts
            | WorkKind::StaleCheck
            | WorkKind::ReadyToMerge => "pr_fix",
            WorkKind::Review => "pr_review",
        };
        let values = Params {
            work_type,
            work_number: item.number,
            forgejo_url: params.forgejo_url.trim_end_matches('/'),
            forgejo_owner: item.repo.owner(),
            forgejo_repo: item.repo.name(),
            escalation_tier_hint: item.tier,
            release_claim_on_exit: "false",
            forgejo_pat: params.forgejo_pat.as_ref().map(|t| t.expose_secret()),
            work_title: work_title(ctx),
            git_user_name: params
                .git_user_name
                .as_deref()
                .map(super::context::one_line),
            git_user_email: params
                .git_user_email
                .as_deref()
                .map(super::context::one_line),
            tier_hint: self.tier_hint(item),
            checkout: params.checkout.as_deref().map(super::context::one_line),
        };
        let gates = self.gates(item, ctx);
        let template = self.env.get_template(name).map_err(fail)?;
        template
            .render(context! { work => item, ctx => ctx, params => values, gates => gates })
            .map_err(fail)
    }

    /// `escalation_tier_hint` under `cleveragents-v2`: the item's tier, except on a
    /// first attempt when the policy's `tier_estimator` lets the worker estimate it.
    fn tier_hint(&self, item: &WorkItem) -> Option<u8> {
        let estimator = self.policy.for_repo(&item.repo).tier_estimator;
        let first = item.attempt <= 1 && item.context.attempts.is_empty();
        (!(estimator && first)).then_some(item.tier)
    }

    /// The merge gates' figures of `item`'s PR.
    fn gates(&self, item: &WorkItem, ctx: &AgentContext) -> Gates {
        let policy = self.policy.for_repo(&item.repo);
        let bot_pr = ctx
            .pr
            .as_ref()
            .and_then(|p| p.author.parse::<crate::core::ids::Login>().ok())
            .is_some_and(|l| policy.is_bot_author(&l));
        let mut approvers: Vec<&str> = ctx
            .reviews
            .iter()
            .filter(|r| r.state == "APPROVED" && !r.stale && !r.dismissed)
            .map(|r| r.reviewer.as_str())
            .collect();
        approvers.sort_unstable();
        approvers.dedup();
        Gates {
            approvals_had: approvers.len(),
            approvals_needed: if bot_pr {
                policy.approvals_bot
            } else {
                policy.approvals_human
            },
            checks_green: ctx.checks.iter().filter(|c| c.state == "success").count(),
        }
    }
}

/// `ctx` with each comment marked by its author's trust: trusted (no mark) when the
/// author is the PR's author and the work item says that author is trusted, or the
/// policy names them (the bot, a bot user, an agent or reviewer user, a trusted user);
/// everyone else's comment is marked as from an untrusted author, since Shepherd does
/// not read every commenter's permission.
fn mark_commenters(
    ctx: &AgentContext,
    item: &WorkItem,
    policy: &crate::core::policy::Policy,
) -> AgentContext {
    let mut ctx = ctx.clone();
    let author = ctx.pr.as_ref().map(|p| p.author.clone());
    let author_trusted = item.context.author_trusted == Some(true);
    for c in &mut ctx.comments {
        let trusted = match c.author.parse::<crate::core::ids::Login>() {
            Ok(login) => {
                (author_trusted && author.as_deref() == Some(c.author.as_str()))
                    || policy.is_bot_author(&login)
                    || policy.is_agent(&login)
                    || policy.is_reviewer(&login)
                    || policy.is_trusted(&login)
            }
            Err(_) => false,
        };
        c.untrusted = if trusted {
            String::new()
        } else {
            super::context::UNTRUSTED_COMMENTER.into()
        };
    }
    ctx
}

/// The built-in template of `kind`.
fn builtin_name(kind: WorkKind) -> String {
    format!("{BUILTIN_PREFIX}{}.md.j2", kind.as_str())
}

/// The built-in template of `kind` under `profile`: `review` work keeps Shepherd's
/// reviewer prompt (it goes to the reviewer agent, never to the v2 worker).
pub fn builtin_for(kind: WorkKind, profile: PromptProfile) -> String {
    match profile {
        PromptProfile::CleveragentsV2 if kind != WorkKind::Review => V2_TEMPLATE.to_owned(),
        PromptProfile::CleveragentsV2 | PromptProfile::Shepherd => builtin_name(kind),
    }
}

/// The agent of `item` under `profile`: under `cleveragents-v2`, `review` work goes to
/// the reviewer agent (`SHEPHERD_REVIEW_AGENT`) when one is named; otherwise the
/// policy's agent of the kind.
pub fn agent_for<'a>(
    policy: &'a crate::core::policy::Policy,
    kind: WorkKind,
    review_agent: Option<&'a str>,
) -> &'a str {
    match (policy.prompt_profile, kind, review_agent) {
        (PromptProfile::CleveragentsV2, WorkKind::Review, Some(agent)) => agent,
        _ => policy.agent_for(kind),
    }
}

/// The title of the PR, or of the issue of `issue-impl` work (one line).
fn work_title(ctx: &AgentContext) -> String {
    ctx.pr
        .as_ref()
        .map(|p| p.title.clone())
        .or_else(|| ctx.issue.as_ref().map(|i| i.title.clone()))
        .unwrap_or_default()
}

/// The `unticked` filter: the unticked task-list items (`- [ ] …`, `* [ ] …`) of a
/// text, each flattened to one line.
pub fn unticked(text: Option<String>) -> Vec<String> {
    text.unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            l.strip_prefix("- [ ]")
                .or_else(|| l.strip_prefix("* [ ]"))
                .map(super::context::one_line)
        })
        .collect()
}

/// minijinja's message with the chain of causes (an include's failure names the
/// included template's line).
fn error_text(e: &minijinja::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The `fence` filter: `text` in a Markdown code fence (with an optional info string
/// such as `diff`) of more backticks than any run inside it, so the text cannot close
/// the fence early and everything it says stays inside the block.
pub fn fence(text: &Value, lang: Option<String>) -> Result<String, minijinja::Error> {
    let Some(text) = text.as_str() else {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("fence needs a text, not {}", text.kind()),
        ));
    };
    Ok(fence_text(text, lang.as_deref()))
}

/// [`fence`] on a Rust string.
pub fn fence_text(text: &str, lang: Option<&str>) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let marks = "`".repeat((longest + 1).max(3));
    let info = lang.map(super::context::one_line).unwrap_or_default();
    let end = if text.ends_with('\n') { "" } else { "\n" };
    format!("{marks}{info}\n{text}{end}{marks}")
}

/// The sample work items overrides are checked against at start.
#[path = "prompt_samples.rs"]
mod samples;

#[cfg(test)]
#[path = "prompt_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "profile_tests.rs"]
mod profile_tests;
