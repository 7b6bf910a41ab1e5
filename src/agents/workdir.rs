//! The per-work-item folder and what the agent is given: `prompt.md`, `work.json`,
//! the result file's path, the command line with its placeholders filled in, and the
//! environment (the allow-listed part of the runner's, plus the item's variables).

use std::ffi::OsString;
use std::path::PathBuf;

use secrecy::SecretString;

use super::job::Shared;
use super::launch::{Invocation, Placeholders, expand};
use super::sandbox::Sandbox;
use crate::core::effect::WorkItem;
use crate::store::agent_runs::AgentRun;

/// The variables the runner sets for every agent (the contract's and a few more);
/// `SHEPHERD_AGENT_FORGEJO_TOKEN` comes on top when credentials are opted in, and
/// git's (`checkout::TOKEN_VAR`, …) with a checkout.
pub const AGENT_VARS: &[&str] = &[
    "SHEPHERD_WORK_ID",
    "SHEPHERD_REPO",
    "SHEPHERD_NUMBER",
    "SHEPHERD_HEAD_SHA",
    "SHEPHERD_TIER",
    "SHEPHERD_TIER_NAME",
    "SHEPHERD_KIND",
    "SHEPHERD_AGENT",
    "SHEPHERD_MODEL",
    "SHEPHERD_PROMPT_FILE",
    "SHEPHERD_WORK_FILE",
    "SHEPHERD_RESULT_FILE",
    "SHEPHERD_FORGEJO_URL",
];

/// The variable naming the file where a reviewer agent writes its verdict (`review`
/// work only; [`super::review`]).
pub const REVIEW_FILE_VAR: &str = "SHEPHERD_REVIEW_FILE";

/// The files of one run.
pub struct Files {
    /// The prompt.
    pub prompt: PathBuf,
    /// The work item JSON.
    pub work: PathBuf,
    /// Where the agent may write its result.
    pub result: PathBuf,
    /// Where a reviewer agent writes its verdict (`review` work only:
    /// `SHEPHERD_REVIEW_FILE`).
    pub review: PathBuf,
}

/// Writes the prompt and the work item into `dir`, all private to the agent (the
/// folder 0700, its files 0600, owned by the agent's uid under a root runner's
/// sandbox), with an empty `home` folder (the sandboxed agent's `HOME`).
pub fn write_files(
    sandbox: &Sandbox,
    dir: &std::path::Path,
    item: &WorkItem,
    prompt: &str,
) -> std::io::Result<Files> {
    let files = Files {
        prompt: dir.join("prompt.md"),
        work: dir.join("work.json"),
        result: dir.join("result.json"),
        review: dir.join("review.json"),
    };
    sandbox.make_private(dir)?;
    write_private(&files.prompt, prompt.as_bytes())?;
    let work = serde_json::to_vec_pretty(item).map_err(std::io::Error::other)?;
    write_private(&files.work, &work)?;
    for f in [&files.prompt, &files.work] {
        sandbox.make_private(f)?;
    }
    let home = dir.join("home");
    std::fs::create_dir(&home)?;
    sandbox.make_private(&home)?;
    Ok(files)
}

/// Creates `path` (0600 from the start: never readable by others, even briefly).
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// Puts `inv` into the sandbox: bwrap's command line around it, the agent's user,
/// `HOME` in the item's folder `dir`. Nothing changes with the sandbox off.
pub fn sandboxed(sandbox: &Sandbox, inv: &mut Invocation, dir: &std::path::Path) {
    if !sandbox.is_on() {
        return;
    }
    sandbox.adjust_env(&mut inv.env, &dir.join("home"));
    let wrapped = sandbox.wrap(&inv.argv, dir, &inv.dir);
    inv.argv = wrapped.argv;
    inv.run_as = wrapped.run_as;
    inv.dir = PathBuf::from("/");
}

/// The command line and environment of one run.
pub fn invocation(
    shared: &Shared,
    item: &WorkItem,
    run: &AgentRun,
    files: &Files,
    prompt: String,
) -> Invocation {
    let path = |p: &PathBuf| p.display().to_string();
    let placeholders = Placeholders {
        agent: run.agent.clone(),
        model: run.model.clone(),
        tier: item.tier.to_string(),
        tier_name: item.tier_name.clone(),
        kind: item.kind.as_str().to_owned(),
        prompt_file: path(&files.prompt),
        work_file: path(&files.work),
    };
    let mut env = shared.base_env.clone();
    let vars = agent_vars(item, run, files, shared.config.forgejo_url.as_deref());
    env.extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
    if item.kind == crate::core::effect::WorkKind::Review {
        env.push((REVIEW_FILE_VAR.into(), path(&files.review).into()));
    }
    if shared.agents.credentials
        && let Some(token) = &shared.agents.forgejo_token
    {
        env.push(("SHEPHERD_AGENT_FORGEJO_TOKEN".into(), expose(token).into()));
    }
    if shared.policy.for_repo(&item.repo).prompt_profile
        == crate::core::policy::PromptProfile::CleveragentsV2
    {
        env.extend(worker_env(&shared.agents));
    }
    Invocation {
        argv: expand(&shared.agents.command, &placeholders),
        env,
        dir: files.prompt.parent().map(PathBuf::from).unwrap_or_default(),
        stdin: prompt,
        run_as: None,
    }
}

/// The variables the `cleveragents-v2` worker's `printenv` fallback reads (seed 004,
/// "Fallback to environment variables"): `GIT_USER_NAME` and `GIT_USER_EMAIL` when
/// configured, `FORGEJO_PAT` (the agent user's token, never Shepherd's) only when
/// credentials are opted in.
pub fn worker_env(agents: &crate::config::AgentsConfig) -> Vec<(OsString, OsString)> {
    let (name, email) = &agents.git_identity;
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    if let Some(n) = name {
        env.push(("GIT_USER_NAME".into(), n.into()));
    }
    if let Some(e) = email {
        env.push(("GIT_USER_EMAIL".into(), e.into()));
    }
    if agents.credentials
        && let Some(token) = &agents.forgejo_token
    {
        env.push(("FORGEJO_PAT".into(), expose(token).into()));
    }
    env
}

/// The work item's variables ([`AGENT_VARS`], in that order).
fn agent_vars(
    item: &WorkItem,
    run: &AgentRun,
    files: &Files,
    forgejo_url: Option<&str>,
) -> Vec<(&'static str, String)> {
    let path = |p: &PathBuf| p.display().to_string();
    // One value per name: the array's length is the list's, checked by the compiler.
    let values: [String; AGENT_VARS.len()] = [
        item.id.to_string(),
        item.repo.to_string(),
        item.number.to_string(),
        item.head_sha
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        item.tier.to_string(),
        item.tier_name.clone(),
        item.kind.as_str().to_owned(),
        run.agent.clone(),
        run.model.clone(),
        path(&files.prompt),
        path(&files.work),
        path(&files.result),
        forgejo_url.unwrap_or_default().to_owned(),
    ];
    AGENT_VARS.iter().copied().zip(values).collect()
}

/// The token's text, for the opted-in environment variable only.
fn expose(token: &SecretString) -> String {
    use secrecy::ExposeSecret as _;
    token.expose_secret().to_owned()
}
