//! What the merge queue needs of Forgejo beyond merging (forgejo-facts.md §4, the
//! v15 API definition): `POST …/pulls/{index}/update?style=merge|rebase` (bring a PR's
//! head onto its base's tip), `GET …/branches/{branch}` (a branch's tip) and the
//! repository's merge settings (`allow_fast_forward_only_merge`).

use reqwest::Method;
use serde::Deserialize;
use tracing::instrument;

use super::client::repo_path;
use super::{ForgejoClient, ForgejoError};
use crate::core::policy::UpdateStyle;

/// How a PR update ended.
#[derive(Debug)]
pub enum UpdateOutcome {
    /// 200: the head branch now contains the base's tip (a new head sha).
    Updated,
    /// 409: the base does not merge (or rebase) cleanly into the head.
    Conflict {
        /// Forgejo's message.
        message: String,
    },
    /// 403 (not allowed: the bot cannot push to the head branch, or the head is in a
    /// fork it cannot write), 404 (no such PR), 422 (closed or merged).
    Refused {
        /// The status.
        code: u16,
        /// Forgejo's message.
        message: String,
    },
    /// Timeout, transport failure after sending or a 5xx: the update may have happened.
    /// Forgejo v15 also answers 500 (empty message) to an update of a PR that is
    /// already on the tip ("up to date"): re-read the PR, never retry blindly.
    Ambiguous {
        /// What went wrong.
        error: ForgejoError,
    },
}

/// A branch (`GET …/branches/{branch}`): the fields the queue reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Branch {
    /// Branch name.
    pub name: String,
    /// Its tip.
    pub commit: BranchCommit,
}

/// The tip commit of a [`Branch`] (Forgejo's `PayloadCommit`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct BranchCommit {
    /// The sha.
    pub id: String,
}

/// A repository's merge settings and default branch (`GET /repos/{owner}/{repo}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RepoSettings {
    /// `Do: fast-forward-only` is allowed.
    pub allow_fast_forward_only_merge: bool,
    /// The default branch (`issue-impl` work starts from it unless it is stacked).
    pub default_branch: String,
}

/// A branch name as a path: each `/`-separated part percent-encoded (Forgejo's route
/// takes the rest of the path as the branch, slashes included).
pub(super) fn branch_path(branch: &str) -> Result<String, ForgejoError> {
    if branch.is_empty() || branch.split('/').any(str::is_empty) {
        return Err(ForgejoError::Invalid(format!(
            "{branch:?} is not a branch name"
        )));
    }
    let enc = |part: &str| -> String {
        part.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    char::from(b).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    Ok(branch.split('/').map(enc).collect::<Vec<_>>().join("/"))
}

impl ForgejoClient {
    /// `POST …/pulls/{index}/update?style=…`: merges or rebases the base's tip into
    /// the PR's head branch. Never call it for a PR already on the tip.
    #[instrument(skip_all, fields(repo = %repo, pr = number, style = style.as_str()))]
    pub async fn update_pull(
        &self,
        repo: &str,
        number: u64,
        style: UpdateStyle,
    ) -> Result<UpdateOutcome, ForgejoError> {
        let path = format!("{}/pulls/{number}/update", repo_path(repo)?);
        let query = [("style", style.as_str().to_owned())];
        match self.send(Method::POST, &path, &query, None).await {
            Ok(_) => Ok(UpdateOutcome::Updated),
            Err(e) => classify_update(e),
        }
    }

    /// `GET …/branches/{branch}`: the branch's tip sha.
    #[instrument(skip_all, fields(repo = %repo, branch = %branch))]
    pub async fn branch_tip(&self, repo: &str, branch: &str) -> Result<String, ForgejoError> {
        let path = format!("{}/branches/{}", repo_path(repo)?, branch_path(branch)?);
        let b: Branch = self.get_json(&path, &[]).await?;
        if b.commit.id.is_empty() {
            return Err(ForgejoError::Invalid(format!(
                "branch {branch:?} of {repo} has no tip commit"
            )));
        }
        Ok(b.commit.id)
    }

    /// `GET /repos/{owner}/{repo}`: the merge settings.
    #[instrument(skip_all, fields(repo = %repo))]
    pub async fn repo_settings(&self, repo: &str) -> Result<RepoSettings, ForgejoError> {
        self.get_json(&repo_path(repo)?, &[]).await
    }
}

/// Sorts a failed update into an outcome or a certain non-update.
fn classify_update(e: ForgejoError) -> Result<UpdateOutcome, ForgejoError> {
    let ForgejoError::Status { code, message, .. } = &e else {
        return match e {
            ForgejoError::Timeout { .. } | ForgejoError::Transport { .. } => {
                Ok(UpdateOutcome::Ambiguous { error: e })
            }
            other => Err(other),
        };
    };
    let (code, message) = (*code, message.clone());
    match code {
        409 => Ok(UpdateOutcome::Conflict { message }),
        403 | 404 | 422 => Ok(UpdateOutcome::Refused { code, message }),
        500..=599 => Ok(UpdateOutcome::Ambiguous { error: e }),
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names_become_paths() {
        assert_eq!(branch_path("main").unwrap(), "main");
        assert_eq!(branch_path("release/v1.2").unwrap(), "release/v1.2");
        assert_eq!(branch_path("a b#?").unwrap(), "a%20b%23%3F");
        for bad in ["", "/x", "x/", "a//b"] {
            assert!(branch_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn update_answers_are_classified() {
        let status = |code: u16| ForgejoError::Status {
            code,
            method: "POST".into(),
            path: "/repos/o/r/pulls/1/update".into(),
            message: String::new(),
            retry_after: None,
        };
        assert!(matches!(
            classify_update(status(409)),
            Ok(UpdateOutcome::Conflict { .. })
        ));
        assert!(matches!(
            classify_update(status(500)),
            Ok(UpdateOutcome::Ambiguous { .. })
        ));
        assert!(matches!(
            classify_update(status(422)),
            Ok(UpdateOutcome::Refused { code: 422, .. })
        ));
        assert!(classify_update(status(401)).is_err());
    }
}
