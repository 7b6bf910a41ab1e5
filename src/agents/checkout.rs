//! The optional working copy (`SHEPHERD_AGENT_CHECKOUT=true`): a fresh clone of the
//! work item's repository in the item's folder, on the PR's head branch at its head
//! commit (`issue-impl`: the branch it is to push, made at its base — a dependency's
//! PR branch, else the default branch), so the agent can commit and
//! `git push origin HEAD` at once. Removed with the folder afterwards.
//!
//! The clone URL comes from `SHEPHERD_AGENT_CLONE_URL` (default
//! `{forgejo_url}/{owner}/{repo}.git`; an SSH or mirror URL works too). The token, when
//! the operator gave agents one (`SHEPHERD_AGENT_FORGEJO_TOKEN`), reaches git only
//! through the environment: a credential helper configured by `GIT_CONFIG_*` variables
//! that reads `SHEPHERD_GIT_TOKEN` — never in an argument, the clone's `.git/config`,
//! a log line or the prompt. The agent inherits the same variables, so its own
//! `git push` authenticates; that is why a checkout with a token hands the agent the
//! token (docs/security.md §6). Without a token the clone is anonymous.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use secrecy::{ExposeSecret as _, SecretString};

use crate::core::effect::{WorkItem, WorkKind};
use crate::forgejo::ForgejoClient;

/// Variable holding the token for the credential helper.
pub const TOKEN_VAR: &str = "SHEPHERD_GIT_TOKEN";
/// The default clone URL.
pub const DEFAULT_CLONE_URL: &str = "{forgejo_url}/{owner}/{repo}.git";
/// History fetched (enough for an agent to look back a little, cheap to fetch).
const DEPTH: &str = "50";
/// The local branch of a PR whose head branch is not in the repository (a fork's PR).
const LOCAL_BRANCH: &str = "shepherd-work";

/// The environment git needs (and the agent inherits): no prompts, and the credential
/// helper reading the token from [`TOKEN_VAR`] when there is one.
pub fn git_env(token: Option<&SecretString>) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = vec![("GIT_TERMINAL_PROMPT".into(), "0".into())];
    if let Some(token) = token {
        let helper =
            format!("!f() {{ echo username=shepherd-agent; echo \"password=${TOKEN_VAR}\"; }}; f");
        for (k, v) in [
            ("GIT_CONFIG_COUNT", "1".to_owned()),
            ("GIT_CONFIG_KEY_0", "credential.helper".to_owned()),
            ("GIT_CONFIG_VALUE_0", helper),
            (TOKEN_VAR, token.expose_secret().to_owned()),
        ] {
            env.push((k.into(), v.into()));
        }
    }
    env
}

/// The clone URL of `repo` (`owner/name`) from the template.
pub fn clone_url(template: &str, forgejo_url: &str, repo: &str) -> String {
    let (owner, name) = repo.split_once('/').unwrap_or((repo, ""));
    template
        .replace("{forgejo_url}", forgejo_url)
        .replace("{owner}", owner)
        .replace("{repo}", name)
}

/// Sets the agents' git identity (`SHEPHERD_AGENT_GIT_NAME`, `…_EMAIL`) as
/// `user.name` / `user.email` in the working copy's own config, so the agent's commits
/// carry it whatever its environment; returns git's output.
pub async fn set_identity(
    env: &[(OsString, OsString)],
    work: &Path,
    identity: &(Option<String>, Option<String>),
) -> anyhow::Result<String> {
    let mut log = String::new();
    for (key, value) in [("user.name", &identity.0), ("user.email", &identity.1)] {
        if let Some(v) = value {
            git(env, work, &["config", key, v], &mut log).await?;
        }
    }
    Ok(log)
}

/// Where [`checkout`] puts the working copy of the work item whose folder is `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join("checkout")
}

/// Makes the working copy of `item` in `dir/checkout`; returns its path and git's
/// output (for the agent's log).
pub async fn checkout(
    forgejo: &ForgejoClient,
    item: &WorkItem,
    url: &str,
    dir: &Path,
    env: &[(OsString, OsString)],
) -> anyhow::Result<(PathBuf, String)> {
    let work = path(dir);
    let mut log = String::new();
    let w = work.display().to_string();
    git(env, dir, &["init", "-q", &w], &mut log).await?;
    git(env, &work, &["remote", "add", "origin", url], &mut log).await?;
    if item.kind == WorkKind::IssueImpl {
        // The base the work item names (a dependency's PR branch: stacked work), else
        // the default branch; the agent starts on the branch it is to push (policy
        // `issue_branch`), made there. Both names come from Shepherd's own work item,
        // checked when the policy loads (`issue_branch`) or taken only from the
        // agents' own PRs (`base`); as full ref names they never read as options.
        let issue = item.context.issue.as_deref();
        let base = match issue.and_then(|w| w.base.as_deref()) {
            Some(b) => format!("refs/heads/{b}"),
            None => "HEAD".to_owned(),
        };
        git(
            env,
            &work,
            &["fetch", "-q", "--depth", DEPTH, "origin", &base],
            &mut log,
        )
        .await?;
        match issue {
            Some(w) => {
                git(
                    env,
                    &work,
                    &["checkout", "-q", "-B", &w.branch, "FETCH_HEAD"],
                    &mut log,
                )
                .await?;
            }
            None => git(env, &work, &["checkout", "-q", "FETCH_HEAD"], &mut log).await?,
        }
        return Ok((work, log));
    }
    let pr = forgejo.get_pull(item.repo.as_str(), item.number).await?;
    let head = pr.head.ref_name;
    match head.starts_with("refs/") {
        false => {
            let spec = format!("+refs/heads/{head}:refs/remotes/origin/{head}");
            git(
                env,
                &work,
                &["fetch", "-q", "--depth", DEPTH, "origin", &spec],
                &mut log,
            )
            .await?;
            let upstream = format!("origin/{head}");
            git(
                env,
                &work,
                &["checkout", "-q", "-B", &head, "--track", &upstream],
                &mut log,
            )
            .await?;
        }
        true => {
            git(
                env,
                &work,
                &["fetch", "-q", "--depth", DEPTH, "origin", &head],
                &mut log,
            )
            .await?;
            git(
                env,
                &work,
                &["checkout", "-q", "-B", LOCAL_BRANCH, "FETCH_HEAD"],
                &mut log,
            )
            .await?;
        }
    }
    if let Some(sha) = &item.head_sha {
        // The head the work item is for, when the branch moved meanwhile and the
        // commit is in the fetched history.
        let sha = sha.to_string();
        if git(env, &work, &["reset", "-q", "--hard", &sha], &mut log)
            .await
            .is_err()
        {
            tracing::info!(head = %sha, "the work item's head is not on the branch any more; working on its tip");
        }
    }
    Ok((work, log))
}

/// Runs one git command in `cwd` with exactly `env` (plus the runner's `PATH` and
/// `HOME`, which the caller's `env` already holds); fails with git's output.
async fn git(
    env: &[(OsString, OsString)],
    cwd: &Path,
    args: &[&str],
    log: &mut String,
) -> anyhow::Result<()> {
    let out = tokio::process::Command::new("git")
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    log.push_str(&text);
    match out.status.success() {
        true => Ok(()),
        // The subcommand only (arguments may hold a URL); git's output says the rest.
        false => anyhow::bail!("git {} failed ({}): {}", args[0], out.status, text.trim()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_the_token_only_in_the_environment() {
        assert_eq!(
            clone_url(DEFAULT_CLONE_URL, "https://f.example", "acme/web"),
            "https://f.example/acme/web.git"
        );
        assert_eq!(
            clone_url("git@f.example:{owner}/{repo}.git", "", "a/b"),
            "git@f.example:a/b.git"
        );
        let token = SecretString::from("tok-123456".to_owned());
        let env = git_env(Some(&token));
        let get = |k: &str| {
            env.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        assert_eq!(get(TOKEN_VAR).as_deref(), Some("tok-123456"));
        let helper = get("GIT_CONFIG_VALUE_0").unwrap();
        assert!(
            helper.contains("$SHEPHERD_GIT_TOKEN") && !helper.contains("tok-123456"),
            "{helper}"
        );
        assert_eq!(git_env(None).len(), 1, "no token, no helper");
    }
}
