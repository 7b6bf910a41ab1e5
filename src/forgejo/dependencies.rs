//! Issue dependencies (forgejo-facts.md §4.2; Forgejo v15.0.3
//! `routers/api/v1/repo/issue_dependency.go`, `GetIssueBlocks` and
//! `GetIssueDependencies`): the issues an issue blocks, which is where its Epic is (an
//! Epic waits for its parts), and the issues that block it, which hold its
//! `issue-impl` until they close.

use tracing::instrument;

use super::client::{PAGE_LIMIT, repo_path};
use super::types::Issue;
use super::{ForgejoClient, ForgejoError};

impl ForgejoClient {
    /// `GET /repos/{o}/{r}/issues/{index}/blocks`: the first [`PAGE_LIMIT`] issues that
    /// issue `index` blocks (one page: `IssueListWithoutPagination`, no total).
    #[instrument(skip_all, fields(repo = %repo, issue = index))]
    pub async fn issue_blocks(&self, repo: &str, index: u64) -> Result<Vec<Issue>, ForgejoError> {
        let path = format!("{}/issues/{index}/blocks", repo_path(repo)?);
        let q = [("page", "1".to_owned()), ("limit", PAGE_LIMIT.to_string())];
        self.get_json(&path, &q).await
    }

    /// `GET /repos/{o}/{r}/issues/{index}/dependencies`: every issue that blocks issue
    /// `index`, open and closed, all pages (the answer has no total: pages until a
    /// short one). `None` when Forgejo answers 404: the repository has dependencies
    /// turned off (`IsDependenciesEnabled`), or the issue is gone.
    #[instrument(skip_all, fields(repo = %repo, issue = index))]
    pub async fn issue_dependencies(
        &self,
        repo: &str,
        index: u64,
    ) -> Result<Option<Vec<Issue>>, ForgejoError> {
        let path = format!("{}/issues/{index}/dependencies", repo_path(repo)?);
        match self.get_all(&path, &[]).await {
            Ok(list) => Ok(Some(list)),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
