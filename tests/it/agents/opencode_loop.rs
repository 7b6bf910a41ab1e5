//! The whole loop with the real opencode CLI as the agent (issue 14): CI fails →
//! `shepherd run` dispatches a `ci-fix` work item → `shepherd agents` fetches its
//! context, renders the prompt and runs opencode → opencode (driven by the stub model)
//! runs a `bash` tool call that "pushes" and writes the result file → new head → CI
//! green → an approval → merged. Asserted too: what the model received (the prompt's
//! sections and parameter lines, the tier's mapped model id) and that no Forgejo
//! token reached the model or the agent's environment.

use std::time::Duration;

use super::e2e::{REPO, attempts};
use crate::support::fake_forgejo::NewPr;
use crate::support::model_stub::ModelStub;
use crate::support::opencode::OpencodeProject;
use crate::support::poll_until_named;
use crate::support::scenario::Scenario;

/// `shepherd agents` with opencode in the real sandbox (issue 26): the project (its
/// config and opencode's private `HOME`) and the test's marker folder are opened to
/// the agents' user and writable inside the sandbox.
fn sandboxed(
    runner: crate::support::shepherd::Builder,
    project: &OpencodeProject,
    marks: &std::path::Path,
) -> crate::support::shepherd::Builder {
    super::open_to_agents(project.root());
    super::open_to_agents(marks);
    runner
        .env("SHEPHERD_AGENT_SANDBOX", "on")
        .env(
            "SHEPHERD_AGENT_SANDBOX_WRITABLE",
            format!("{}:{}", project.root().display(), marks.display()),
        )
        // opencode itself, wherever the checkout is (under /tmp, it would be hidden).
        .env(
            "SHEPHERD_AGENT_SANDBOX_READABLE",
            crate::support::opencode::opencode_root()
                .display()
                .to_string(),
        )
}

/// opencode takes seconds per run; this bounds a hang, it measures nothing.
const AGENT_DEADLINE: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread")]
async fn opencode_fixes_a_failing_ci_through_shepherd_agents_and_the_pr_merges() {
    let s = Scenario::start("models = { haiku = \"stub-haiku\" }\n").await;
    let fake = &s.fake;
    let marks = tempfile::tempdir().unwrap();
    let pushed = marks.path().join("pushed");
    let agent_env = marks.path().join("agent-env");
    // The agent's one tool call: record its environment, "push" (the test plays the
    // git server below), and write the result file the runner reads.
    let stub = ModelStub::start(&format!(
        "env > {env}; echo \"sandbox_uid=$(id -u) sandbox_pid=$$\" >> {env}; touch {pushed}; \
         printf '{{\"outcome\":\"succeeded\",\"summary\":\"fixed ci/test\"}}' > \"$SHEPHERD_RESULT_FILE\"",
        env = agent_env.display(),
        pushed = pushed.display(),
    ))
    .await;
    let project = OpencodeProject::prepare(&stub, &["stub-haiku"]);
    let _runner = sandboxed(s.agents(&project.command_line()), &project, marks.path())
        .start()
        .await;

    let n = fake.open_pr(REPO, NewPr::new("agent-bot", "Add y").body("Adds y."));
    let sha1 = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha1, "ci/test", "failure", "2 tests failed");
    s.send(&fake.pr_opened(REPO, n)).await;
    let item = s.wait_work_items(1).await.remove(0);
    assert_eq!(item["kind"], "ci-fix");
    assert_eq!(item["tier_name"], "haiku");
    let work_id = item["id"].as_str().unwrap().to_owned();

    // opencode ran the tool call: the agent pushed. The forge moves the head and
    // tells Shepherd, as Forgejo would after a real push by the bot.
    poll_until_named(AGENT_DEADLINE, "the agent pushes", || async {
        pushed.exists()
    })
    .await;
    let sha2 = "5555555555555555555555555555555555555555";
    fake.push(REPO, n, sha2);
    fake.set_status(REPO, sha2, "ci/test", "pending", "running");
    s.send(&fake.pr_synchronized(REPO, n, fake.bot_login()))
        .await;
    poll_until_named(
        AGENT_DEADLINE,
        "the agent's result is recorded on its attempt",
        || async {
            attempts(&s, n)
                .await
                .first()
                .is_some_and(|a| a["outcome"] == "succeeded")
        },
    )
    .await;
    let a = attempts(&s, n).await;
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0]["work_id"], work_id.as_str(), "{a:?}");
    assert_eq!(a[0]["summary"], "fixed ci/test", "{a:?}");

    fake.set_status(REPO, sha2, "ci/test", "success", "all green");
    s.wait_phase(REPO, n, "awaiting-review").await;
    assert!(fake.merges().is_empty(), "no merge without an approval");
    let review = fake.add_review(REPO, n, "bob", "APPROVED");
    s.send(&fake.pr_reviewed(REPO, n, review)).await;
    s.wait_fake("the PR is merged", |f| !f.merges().is_empty())
        .await;
    s.wait_phase(REPO, n, "merged").await;
    s.wait_idle().await;
    let merges = fake.merges();
    assert_eq!(merges.len(), 1);
    assert_eq!(merges[0].merged_sha, sha2, "the pushed head is what merged");
    assert_eq!(s.work_items().await.len(), 1, "one dispatch in all");

    // What the model saw: the tier's mapped model id, the prompt with its parameter
    // lines and sections, and no token.
    let turns = stub.agent_turns();
    assert!(!turns.is_empty(), "opencode asked the model");
    for r in stub.requests() {
        assert_eq!(r.model(), "stub-haiku", "the policy's model id of tier 0");
        let text = r.body.to_string();
        assert!(
            !text.contains(fake.token()),
            "the Forgejo token reached the model"
        );
    }
    let prompt = turns[0].user_texts().join("\n");
    let lines: Vec<&str> = prompt.lines().collect();
    for line in [
        "work_type: pr_fix".to_owned(),
        format!("work_number: {n}"),
        "forgejo_owner: acme".to_owned(),
        "forgejo_repo: widgets".to_owned(),
        "escalation_tier_hint: 0".to_owned(),
        "release_claim_on_exit: false".to_owned(),
        "## PR description".to_owned(),
        "## Full diff".to_owned(),
        "## CI status".to_owned(),
    ] {
        assert!(
            lines.contains(&line.as_str()),
            "the model saw no line {line:?}:\n{prompt}"
        );
    }
    assert!(
        prompt.contains("2 tests failed"),
        "the failing check's detail:\n{prompt}"
    );
    let env = std::fs::read_to_string(&agent_env).expect("the tool call ran");
    assert!(
        env.contains(&format!("SHEPHERD_WORK_ID={work_id}")),
        "{env}"
    );
    assert!(env.contains("SHEPHERD_MODEL=stub-haiku"), "{env}");
    // opencode ran in the sandbox: its own PID namespace (the tool's shell has a
    // small pid there) and, under a root runner, the agents' user.
    let pid: u32 = env
        .split("sandbox_pid=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .expect("the tool call wrote its pid");
    assert!(pid < 100, "a pid of the agent's own namespace: {pid}");
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap();
    if root {
        assert!(env.contains("sandbox_uid=65534"), "{env}");
    }
    assert!(
        !env.contains(fake.token()),
        "no Forgejo token in the agent's environment"
    );
    assert!(!env.contains("SHEPHERD_FORGEJO_TOKEN"), "{env}");
}

/// A reviewer agent run by the real opencode CLI (issue 15): a green bot PR gets one
/// `review` work item; `shepherd agents` renders the review prompt and runs opencode
/// under the reviewer's model; the stub model's one `bash` tool call writes the
/// verdict file; the runner posts it as the reviewer's own formal review (with the
/// reviewer's token, which neither the model nor the agent ever sees); Forgejo's review
/// webhook comes back, the reviewer's approval counts for a bot PR and the PR merges.
#[tokio::test(flavor = "multi_thread")]
async fn opencode_reviews_a_bot_pr_as_its_own_user_and_its_approval_merges_it() {
    const REVIEWER: &str = "rev-agent";
    const REVIEWER_TOKEN: &str = "rev-agent-token-0c9d8e7f";
    let s =
        Scenario::start("models = { haiku = \"stub-haiku\" }\nreviewer_logins = [\"rev-agent\"]\n")
            .await;
    let fake = &s.fake;
    fake.add_user_token(REVIEWER, REVIEWER_TOKEN);
    let marks = tempfile::tempdir().unwrap();
    let agent_env = marks.path().join("agent-env");
    let stub = ModelStub::start(&format!(
        "env > {env}; \
         printf '{{\"event\":\"APPROVED\",\"body\":\"Reviewed the diff: parse() handles every case.\"}}' \
         > \"$SHEPHERD_REVIEW_FILE\"",
        env = agent_env.display(),
    ))
    .await;
    let project = OpencodeProject::prepare(&stub, &["stub-haiku"]);
    let _runner = sandboxed(s.agents(&project.command_line()), &project, marks.path())
        .env(
            "SHEPHERD_REVIEWER_TOKENS",
            format!("{REVIEWER}={REVIEWER_TOKEN}"),
        )
        .start()
        .await;

    let n = fake.open_pr(
        REPO,
        NewPr::new("agent-bot", "Add parse()").body("Adds parse()."),
    );
    let sha = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", "success", "all green");
    s.send(&fake.pr_opened(REPO, n)).await;
    let item = s.wait_work_items(1).await.remove(0);
    assert_eq!(item["kind"], "review");
    assert_eq!(item["head_sha"], sha.as_str());
    assert_eq!(item["context"]["review"]["reviewer"], REVIEWER);

    // The review posted by the runner comes back as Forgejo's webhook; the approval
    // counts and the PR merges.
    super::review_e2e::deliver_until(&s, "the PR is merged", || async {
        !fake.merges().is_empty()
    })
    .await;
    s.wait_phase(REPO, n, "merged").await;
    let reviews: Vec<(String, String, String)> = fake.with_model(|m| {
        m.repo_mut(REPO)
            .reviews
            .iter()
            .filter(|r| r.number == n)
            .map(|r| (r.user.clone(), r.state.clone(), r.commit_id.clone()))
            .collect()
    });
    assert_eq!(
        reviews,
        [(REVIEWER.to_owned(), "APPROVED".to_owned(), sha.clone())],
        "one formal review, by the reviewer, on the reviewed head"
    );
    assert_eq!(fake.merges()[0].merged_sha, sha);
    let items = s.work_items().await;
    assert_eq!(items.len(), 1, "one dispatch in all: {items:?}");

    // What the model saw: the review prompt, and no token of any kind.
    let turns = stub.agent_turns();
    assert!(!turns.is_empty(), "opencode asked the model");
    for r in stub.requests() {
        let text = r.body.to_string();
        assert!(
            !text.contains(REVIEWER_TOKEN),
            "the reviewer's token reached the model"
        );
        assert!(
            !text.contains(fake.token()),
            "the bot's token reached the model"
        );
    }
    let prompt = turns[0].user_texts().join("\n");
    let lines: Vec<&str> = prompt.lines().collect();
    for line in [
        "work_type: pr_review".to_owned(),
        format!("work_number: {n}"),
        "## Full diff".to_owned(),
    ] {
        assert!(
            lines.contains(&line.as_str()),
            "the model saw no line {line:?}:\n{prompt}"
        );
    }
    let env = std::fs::read_to_string(&agent_env).expect("the tool call ran");
    assert!(env.contains("SHEPHERD_REVIEW_FILE="), "{env}");
    assert!(
        !env.contains(REVIEWER_TOKEN),
        "the reviewer's token in the agent's environment"
    );
    assert!(!env.contains("SHEPHERD_REVIEWER_TOKENS"), "{env}");
}
