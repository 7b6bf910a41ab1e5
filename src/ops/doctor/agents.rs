//! The agent runner's checks of `shepherd doctor` (with `SHEPHERD_AGENT_COMMAND`): its
//! settings, the program, the sandbox, the reviewer tokens.

use secrecy::SecretString;

use super::forgejo::Api;
use super::{Check, DoctorRequest, not_checked};
use crate::config::AgentsConfig;
use crate::core::policy::PolicyFile;

/// The agent runner's checks: its settings, the program, the sandbox, the reviewer
/// tokens.
pub(super) async fn agents(
    req: &DoctorRequest,
    policy: &PolicyFile,
    api: Option<&Api>,
) -> Vec<Check> {
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
    checks.push(sandbox_check(&agents).await);
    checks.push(reviewer_tokens(&agents.reviewer_tokens, policy, api).await);
    checks
}

/// The sandbox can start — the runner's own start-up probe
/// ([`crate::agents::sandbox::probe`]: a sandboxed shell in a throw-away folder of the
/// work dir, removed after) — unless `SHEPHERD_AGENT_SANDBOX=off`, which is reported as
/// a failure with a warning.
async fn sandbox_check(agents: &AgentsConfig) -> Check {
    const NAME: &str = "agent sandbox";
    if !agents.sandbox {
        return Check::fail(
            NAME,
            "sandbox off (SHEPHERD_AGENT_SANDBOX=off): agents run with the runner's own rights \
             and see its files and network",
            "warning: unset SHEPHERD_AGENT_SANDBOX unless the runner is isolated by other \
             means (its own container or VM, no other secrets in reach)",
        );
    }
    let agents = agents.clone();
    match tokio::task::spawn_blocking(move || crate::agents::sandbox::probe(&agents)).await {
        Ok(Ok(detail)) => Check::pass(NAME, detail),
        Ok(Err(why)) => Check::fail(
            NAME,
            why,
            "install bubblewrap (apt-get install bubblewrap); in a container, allow \
             unprivileged user namespaces (docs/operations.md, \"Deploying agents\")",
        ),
        Err(e) => Check::fail(NAME, format!("the check failed: {e}"), "run doctor again"),
    }
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
