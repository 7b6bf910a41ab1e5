//! The `cleveragents-v2` prompt profile through `shepherd agents` (issue 27, item 1):
//! the agent gets 004's parameter lines and sections with the agent user's token and
//! git identity, the same values in its environment for the worker's `printenv`
//! fallback, its pre-cloned working copy named in the prompt and configured with the
//! identity; never Shepherd's own token.

use std::time::Duration;

use super::runner::pr_on_a_git_branch;
use super::{REPO, Rig};

/// The claim of the dispatched work item.
const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test(flavor = "multi_thread")]
async fn a_v2_agent_gets_the_contract_its_credentials_and_a_configured_checkout() {
    let rig = Rig::start().await;
    let (_bare, _sha, n) = pr_on_a_git_branch(&rig);
    let script = rig.script(
        "v2.sh",
        r#"cat "$1" > "$DIR/prompt"
env > "$DIR/env"
pwd > "$DIR/pwd"
git config user.name > "$DIR/gitname"
git config user.email > "$DIR/gitemail""#,
    );
    let url = format!(
        "file://{}/git/{{owner}}/{{repo}}.git",
        rig.dir.path().display()
    );
    let _runner = rig
        .runner(&format!("{script} {{prompt_file}}"))
        .policy("[defaults]\nprompt_profile = \"cleveragents-v2\"\n")
        .env("SHEPHERD_AGENT_CHECKOUT", "true")
        .env("SHEPHERD_AGENT_CLONE_URL", url)
        .env("SHEPHERD_AGENT_FORGEJO_TOKEN", "agent-user-tok-4242")
        .env("SHEPHERD_AGENT_CREDENTIALS", "true")
        .env("SHEPHERD_AGENT_GIT_NAME", "HAL9000")
        .env("SHEPHERD_AGENT_GIT_EMAIL", "hal9000@example.org")
        .start()
        .await;
    rig.dispatch(REPO, n, "ci-fix", 0, HOUR).await;
    rig.wait_results(1).await;
    let read = |f: &str| std::fs::read_to_string(rig.path(f)).unwrap_or_default();
    let prompt = read("prompt");
    assert!(
        prompt.starts_with(&format!("forgejo_url: {}\n", rig.fake.url())),
        "{prompt}"
    );
    for line in [
        "forgejo_owner: acme\n",
        "forgejo_repo: agents\n",
        "work_type: pr_fix\n",
        &format!("work_number: {n}\n"),
        "git_user_name: HAL9000\n",
        "git_user_email: hal9000@example.org\n",
        "release_claim_on_exit: false\n",
        "\n## Worker credentials (use these instead of env vars)\nforgejo_pat: agent-user-tok-4242\n",
        "\n## Pre-fetched Epic\n",
        "\nImplement or fix the indicated issue or pull request.",
    ] {
        assert!(prompt.contains(line), "{line:?} missing: {prompt}");
    }
    assert!(prompt.contains("work_title: "), "{prompt}");
    assert!(
        !prompt.contains(rig.fake.token()),
        "never Shepherd's own token"
    );
    let pwd = read("pwd");
    let cloned = prompt
        .split("## Pre-cloned working copy\n")
        .nth(1)
        .and_then(|s| s.lines().next())
        .unwrap_or_default();
    assert!(cloned.starts_with(pwd.trim()), "{cloned} vs {pwd}");
    let env = read("env");
    for var in [
        "GIT_USER_NAME=HAL9000",
        "GIT_USER_EMAIL=hal9000@example.org",
        "FORGEJO_PAT=agent-user-tok-4242",
    ] {
        assert!(env.lines().any(|l| l == var), "{var} missing");
    }
    assert!(!env.contains(rig.fake.token()));
    assert_eq!(read("gitname").trim(), "HAL9000");
    assert_eq!(read("gitemail").trim(), "hal9000@example.org");
}
