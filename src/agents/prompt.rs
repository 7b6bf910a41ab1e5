// PLACEHOLDER: replaced by the context helper's version on merge
//! The prompt of one work item (placeholder: fixed sections and the parameter lines
//! the agents expect, no templates).

use std::fmt::Write as _;

use secrecy::{ExposeSecret, SecretString};

use super::context::AgentContext;
use crate::core::effect::{WorkItem, WorkKind};
use crate::core::policy::PolicyFile;

/// What the prompt needs besides the work item and its context.
pub struct PromptParams {
    /// `SHEPHERD_FORGEJO_URL`.
    pub forgejo_url: String,
    /// The agents' token, only when the operator opted in.
    pub forgejo_pat: Option<SecretString>,
}

/// Why a prompt could not be rendered.
#[derive(Debug, thiserror::Error)]
#[error("prompt: {0}")]
pub struct PromptError(pub String);

/// The prompt templates.
pub struct Templates {}

impl Templates {
    /// Built-in templates plus per-repository overrides from the policy; fails at start
    /// on a missing or invalid template file.
    pub fn load(_policy: &PolicyFile) -> anyhow::Result<Self> {
        Ok(Self {})
    }

    /// The prompt of `item`.
    pub fn render(
        &self,
        item: &WorkItem,
        ctx: &AgentContext,
        params: &PromptParams,
    ) -> Result<String, PromptError> {
        let (owner, repo) = item.repo.as_str().split_once('/').unwrap_or(("", ""));
        let work_type = match item.kind {
            WorkKind::IssueImpl => "issue_impl",
            _ => "pr_fix",
        };
        let mut p = String::new();
        let _ = writeln!(
            p,
            "## Work item\n\n{} on {}#{}: {}\n",
            item.kind.as_str(),
            item.repo,
            item.number,
            ctx.title
        );
        let _ = writeln!(p, "## Description\n\n{}\n", ctx.body);
        let _ = writeln!(p, "## Parameters\n");
        let _ = writeln!(p, "work_type: {work_type}");
        let _ = writeln!(p, "work_number: {}", item.number);
        let _ = writeln!(p, "forgejo_url: {}", params.forgejo_url);
        let _ = writeln!(p, "forgejo_owner: {owner}");
        let _ = writeln!(p, "forgejo_repo: {repo}");
        let _ = writeln!(p, "escalation_tier_hint: {}", item.tier);
        let _ = writeln!(p, "release_claim_on_exit: false");
        if let Some(pat) = &params.forgejo_pat {
            let _ = writeln!(p, "forgejo_pat: {}", pat.expose_secret());
        }
        Ok(p)
    }
}
