// PLACEHOLDER: replaced by the context helper's version on merge
//! Everything the prompt shows, fetched from Forgejo for one work item (placeholder:
//! the PR's or issue's title, body and author only).

use serde::Serialize;

use crate::core::effect::{WorkItem, WorkKind};
use crate::forgejo::{ForgejoClient, ForgejoError};

/// Everything the prompt shows, fetched from Forgejo for one work item.
#[derive(Debug, Clone, Serialize)]
pub struct AgentContext {
    /// Title of the PR or issue.
    pub title: String,
    /// Its description.
    pub body: String,
    /// Its author's login.
    pub author: String,
}

/// Reads the PR (or, for `issue-impl`, the issue) of `item`.
pub async fn gather(
    forgejo: &ForgejoClient,
    item: &WorkItem,
) -> Result<AgentContext, ForgejoError> {
    let repo = item.repo.as_str();
    if item.kind == WorkKind::IssueImpl {
        let issue = forgejo.get_issue(repo, item.number).await?;
        return Ok(AgentContext {
            title: issue.title,
            body: issue.body,
            author: issue.user.login,
        });
    }
    let pr = forgejo.get_pull(repo, item.number).await?;
    Ok(AgentContext {
        title: pr.title,
        body: pr.body,
        author: pr.user.login,
    })
}
