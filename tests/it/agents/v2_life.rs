//! Seed 004's worker under `shepherd agents` for a PR's and an issue's whole life
//! (issue 27, first "Done when" bullet): `shepherd run`, `shepherd agents` with
//! `prompt_profile = "cleveragents-v2"`, the real opencode CLI in the real sandbox, the
//! stub model server driving it, and the fake Forgejo (v16, job logs) over a real git
//! repository ([`GitRemote`]).
//!
//! The agent is `v2_worker.py`, written from 004's rules (startup validation, the
//! credentials section or the `printenv` fallback, the claim through the label API,
//! the verbatim forward with its 80 % check, the dispatcher's output returned as the
//! last message). The stub model answers the agent's first turn with one `bash` tool
//! call running it on the prompt the model received, and its final answer is the
//! script's output verbatim. The task-implementor the script plays reads only the
//! forwarded task prompt, so a section lost on the way would starve it.
//!
//! 1. A red PR: the failing Actions job's log is in the prompt, the agent fixes the
//!    test it names and pushes the PR branch; CI goes green, a human approves, the PR
//!    merges.
//! 2. An issue labelled `auto/implement`: the agent (no claim: 004 step 5) pushes a
//!    branch and opens the PR that closes the issue; CI green, approval, merge, the
//!    issue closed.
//! 3. The same worker without a git identity: it stops at startup, each run is
//!    `no-changes`, the tiers climb, and the PR asks for a human.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::e2e::{REPO, attempts};
use super::open_to_agents;
use crate::support::fake_forgejo::NewPr;
use crate::support::fake_forgejo::actions::V16;
use crate::support::git_remote::GitRemote;
use crate::support::model_stub::ModelStub;
use crate::support::opencode::{OpencodeProject, opencode_root};
use crate::support::scenario::Scenario;
use crate::support::shepherd::Shepherd;

/// The agents' Forgejo user (policy `agent_logins`) and its token: the
/// `forgejo_pat` the worker gets, never Shepherd's own.
const AGENT_USER: &str = "implementer";
const AGENT_PAT: &str = "implementer-pat-7c1d04e9";

/// The git identity of the agents.
const GIT_NAME: &str = "HAL9000";
const GIT_EMAIL: &str = "hal9000@example.org";

/// The test agent's `User-Agent`: its calls among the fake's.
const WORKER_UA: &str = "v2-worker-test/1";

/// opencode takes seconds per run; this bounds a hang, it measures nothing.
const LIFE_DEADLINE: Duration = Duration::from_secs(240);

/// The scenario's `[defaults]`: the fast timers of the scenarios, the profile, the
/// agent user as a bot user and an agent login (its pushes are the agents' own), the
/// stub's model for tier 0.
const POLICY: &str = "\
bot_users = [\"agent-bot\", \"implementer\"]
agent_logins = [\"implementer\"]
stale_after_secs = 31536000
ci_poll_initial_secs = 1
ci_poll_max_secs = 1
mergeability_delay_secs = 1
merge_retry_secs = 1
prompt_profile = \"cleveragents-v2\"
models = { haiku = \"stub-haiku\" }
";

/// 004's sections, exact and in its order (CRITICAL RULE, contract 1), the
/// credentials section first since the runner opts in.
const HEADINGS: [&str; 12] = [
    "## Worker credentials (use these instead of env vars)",
    "## Pre-fetched description",
    "## Pre-fetched diff",
    "## Pre-fetched CI status",
    "## Pre-fetched CI per-check detail",
    "## Pre-fetched PR comments",
    "## Pre-fetched active REQUEST_CHANGES reviews",
    "## Pre-fetched linked issues",
    "## Pre-fetched Epic",
    "## Pre-cloned working copy",
    "## Compliance gap report",
    "## Pre-flight gate summary",
];

/// The failing job's log: the test the agent must find in its prompt.
const LOG: &str = "Run cargo test\n   Compiling widgets v0.1.0\nrunning 2 tests\n\
test parse_ok ... ok\ntest parse_empty ... FAILED\n\
thread 'parse_empty' panicked at src/lib.rs:3:5\n\
error: test failed, to rerun pass `--lib`\nProcess completed with exit code 101.\n";

/// The test agent's script; panics, naming what to install, when `python3` (which
/// runs it) is missing: no silent skip.
pub(super) fn worker_script() -> std::path::PathBuf {
    assert!(
        Path::new(PYTHON).exists(),
        "{PYTHON} is missing: the seed-004 test agent needs python3 (apt-get install python3; \
         Debian's npm package, which scripts/test installs, brings it)"
    );
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/agents/v2_worker.py")
}

/// The interpreter of the test agent.
pub(super) const PYTHON: &str = "/usr/bin/python3";

/// Everything one life needs.
struct Life {
    s: Scenario,
    stub: ModelStub,
    _project: OpencodeProject,
    /// The agent script, the prompts the stub wrote, the traces, the git remote.
    marks: tempfile::TempDir,
    remote: GitRemote,
    _runner: Shepherd,
    /// Every webhook the fake queued and [`Life::drive`] delivered: (event type,
    /// sender's login). The fake authenticates each write by its token, so the sender
    /// of the worker's writes shows whose token it used.
    delivered: std::sync::Mutex<Vec<(String, String)>>,
}

impl Life {
    async fn start() -> Self {
        Self::start_with(&["stub-haiku"], "", true).await
    }

    /// A life whose tiers use `models` (tier order), with `extra` policy lines, and
    /// with or without the agents' git identity (`SHEPHERD_AGENT_GIT_NAME`/`_EMAIL`).
    async fn start_with(models: &[&str], extra: &str, identity: bool) -> Self {
        let tiers = ["haiku", "codex", "sonnet", "opus"];
        let table: Vec<String> = tiers
            .iter()
            .zip(models)
            .map(|(t, m)| format!("{t} = \"{m}\""))
            .collect();
        let policy = POLICY.replace(
            "models = { haiku = \"stub-haiku\" }\n",
            &format!("models = {{ {} }}\n{extra}", table.join(", ")),
        );
        let s = Scenario::start_with_defaults(&policy).await;
        s.fake.set_forgejo_version(V16);
        s.fake.add_user_token(AGENT_USER, AGENT_PAT);
        let marks = tempfile::tempdir().unwrap();
        let m = marks.path().display().to_string();
        let worker = worker_script();
        std::fs::copy(worker, marks.path().join("v2_worker.py")).expect("copy the agent");
        let remote = GitRemote::create(marks.path(), &s.fake, REPO);
        let command = format!("{PYTHON} {m}/v2_worker.py {{prompt}} {m}");
        let stub = ModelStub::start_with_prompt_files(&command, marks.path()).await;
        let project = OpencodeProject::prepare(&stub, models);
        open_to_agents(project.root());
        open_to_agents(marks.path());
        let mut runner = s
            .agents(&project.command_line())
            .env("SHEPHERD_AGENT_SANDBOX", "on")
            .env(
                "SHEPHERD_AGENT_SANDBOX_WRITABLE",
                format!("{}:{m}", project.root().display()),
            )
            .env(
                "SHEPHERD_AGENT_SANDBOX_READABLE",
                opencode_root().display().to_string(),
            )
            .env("SHEPHERD_AGENT_CHECKOUT", "true")
            .env(
                "SHEPHERD_AGENT_CLONE_URL",
                GitRemote::clone_url(marks.path()),
            )
            .env("SHEPHERD_AGENT_FORGEJO_TOKEN", AGENT_PAT)
            .env("SHEPHERD_AGENT_CREDENTIALS", "true");
        if identity {
            runner = runner
                .env("SHEPHERD_AGENT_GIT_NAME", GIT_NAME)
                .env("SHEPHERD_AGENT_GIT_EMAIL", GIT_EMAIL);
        }
        let runner = runner.start().await;
        Self {
            s,
            stub,
            _project: project,
            marks,
            remote,
            _runner: runner,
            delivered: std::sync::Mutex::default(),
        }
    }

    /// Plays Forgejo after pushes and writes until `cond` holds: the git remote's new
    /// tips become branches and PR heads (with their `synchronized` webhooks), and
    /// every webhook the fake queued (the agent's label and PR writes, the bot's
    /// echoes, the merge) is delivered.
    async fn drive<F, Fut>(&self, what: &str, mut cond: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let end = Instant::now() + LIFE_DEADLINE;
        loop {
            for hook in self.remote.sync(&self.s.fake, AGENT_USER) {
                self.s.send(&hook).await;
            }
            for hook in self.s.fake.take_outbox() {
                let sender = hook.payload["sender"]["login"].as_str().unwrap_or("");
                let seen = (hook.event_type.to_owned(), sender.to_owned());
                self.delivered.lock().unwrap().push(seen);
                self.s.send(&hook).await;
            }
            if cond().await {
                return;
            }
            if Instant::now() > end {
                self.s.dump().await;
                for e in std::fs::read_dir(self.marks.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    if e.file_name().to_string_lossy().starts_with("trace-") {
                        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                        eprintln!("{}:\n{text}", e.path().display());
                    }
                }
                panic!("timed out waiting for: {what}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A file the agent left in the marks folder.
    fn mark(&self, name: &str) -> String {
        std::fs::read_to_string(self.marks.path().join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// The agent's trace of work `work_type` `number`.
    fn trace(&self, work_type: &str, number: u64) -> Value {
        serde_json::from_str(&self.mark(&format!("trace-{work_type}-{number}.json")))
            .expect("trace JSON")
    }

    /// The prompt the model received on its first agent turn (what opencode sent).
    fn prompt_seen(&self) -> String {
        let turns = self.stub.agent_turns();
        let first = turns.first().expect("the model was asked");
        first.user_texts().join("\n")
    }

    /// The test agent's calls to the fake: (method, path, status).
    fn worker_calls(&self) -> Vec<(String, String, u16)> {
        self.s
            .fake
            .all_calls()
            .into_iter()
            .filter(|c| c.user_agent == WORKER_UA)
            .map(|c| (c.method, c.path, c.status))
            .collect()
    }

    /// Whether the fake queued a webhook of `event_type` sent by `login`.
    fn delivered(&self, event_type: &str, login: &str) -> bool {
        let seen = (event_type.to_owned(), login.to_owned());
        self.delivered.lock().unwrap().contains(&seen)
    }

    /// A human approves the head; the PR's approval webhook is delivered.
    async fn approve(&self, n: u64) {
        let review = self.s.fake.add_review(REPO, n, "alice", "APPROVED");
        self.s.send(&self.s.fake.pr_reviewed(REPO, n, review)).await;
    }
}

/// The text of section `heading` of `prompt` (up to the next `## ` line).
fn section<'a>(prompt: &'a str, heading: &str) -> &'a str {
    let start = prompt
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no {heading} in {prompt}"))
        + 1;
    let rest = &prompt[start..];
    let end = rest[heading.len()..]
        .find("\n## ")
        .map_or(rest.len(), |e| e + heading.len() + 1);
    &rest[..end]
}

/// The verbatim-forward rule: the task prompt holds everything from the input's
/// first `##` heading to its end, unchanged, after the explicit parameter lines.
fn assert_forwarded_verbatim(prompt: &str, task_prompt: &str) {
    let from = prompt.find("\n## ").expect("a section") + 1;
    assert!(
        task_prompt.trim_end().ends_with(prompt[from..].trim_end()),
        "the task prompt forwards every section verbatim:\n{task_prompt}"
    );
    assert!(task_prompt.starts_with("forgejo_url: "), "{task_prompt}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_v2_worker_fixes_red_ci_from_the_job_log_and_the_pr_merges() {
    let life = Life::start().await;
    let s = &life.s;
    let issue = s.fake.create_issue(
        REPO,
        "dave",
        "Crash on empty input",
        "parse panics on \"\".\n\n- [x] reproduce\n- [ ] handle the empty input\n",
    );
    let sha0 = life
        .remote
        .branch_with("fix-parse", "parse.txt", "parse handles input\n");
    life.remote.sync(&s.fake, AGENT_USER);
    let n = s.fake.open_pr(
        REPO,
        NewPr::new("agent-bot", "Handle empty input")
            .body(&format!("Handles \"\".\n\nCloses #{issue}\n"))
            .head_sha(&sha0)
            .head_ref("fix-parse"),
    );
    let failing = s.fake.set_status(
        REPO,
        &sha0,
        "ci / test (pull_request)",
        "failure",
        "Failing after 1m2s",
    );
    s.fake.with_model(|m| {
        for st in m.repo_mut(REPO).statuses.get_mut(&sha0).unwrap() {
            if st.id == failing {
                st.target_url = format!("/{REPO}/actions/runs/7/jobs/0");
            }
        }
    });
    s.fake
        .add_action_run(REPO, 7, &[("test", "failure", Some(LOG))]);
    s.send(&s.fake.pr_opened(REPO, n)).await;

    // The agent's push reaches the PR; CI (the test) goes green on the new head.
    life.drive("the agent pushes the fix", || async {
        s.fake.head_sha(REPO, n) != sha0
    })
    .await;
    let fixed = s.fake.head_sha(REPO, n);
    // The worker exits after its push: its result lands on the attempt its own push
    // superseded.
    life.drive("the agent's result is recorded", || async {
        attempts(s, n)
            .await
            .first()
            .is_some_and(|a| a["outcome"] == "succeeded")
    })
    .await;
    // 004's release step is Shepherd's (`release_claim_on_exit: false`): the claim
    // label goes when the attempt ends.
    life.drive("Shepherd releases the claim", || async {
        !s.fake
            .labels_on(REPO, n)
            .contains(&"auto/claimed-implementer".to_owned())
    })
    .await;
    s.fake
        .set_status(REPO, &fixed, "ci / test (pull_request)", "success", "ok");
    life.drive("the PR waits for a review", || async {
        s.phase(REPO, n).await == "awaiting-review"
    })
    .await;
    life.approve(n).await;
    life.drive("the PR merges", || async {
        s.fake.issue(REPO, n).pull.is_some_and(|p| p.merged)
    })
    .await;
    s.wait_phase(REPO, n, "merged").await;

    // What the model saw: 004's contract, the log tail in the per-check detail.
    let prompt = life.prompt_seen();
    let detail = section(&prompt, "## Pre-fetched CI per-check detail");
    for line in [
        "test parse_empty ... FAILED",
        "thread 'parse_empty' panicked at src/lib.rs:3:5",
        "Process completed with exit code 101.",
    ] {
        assert!(
            detail.contains(line),
            "{line:?} not in the detail: {detail}"
        );
    }
    let creds = section(
        &prompt,
        "## Worker credentials (use these instead of env vars)",
    );
    assert!(
        creds.contains(&format!("forgejo_pat: {AGENT_PAT}\n")),
        "{creds}"
    );
    assert!(!prompt.contains(s.fake.token()), "never Shepherd's token");
    let gaps = section(&prompt, "## Compliance gap report");
    assert!(gaps.contains("handle the empty input"), "{gaps}");
    assert!(!gaps.contains("reproduce"), "{gaps}");

    // What the worker did, by 004's steps.
    let trace = life.trace("pr_fix", n);
    assert_eq!(trace["exit"], "dispatched", "{trace}");
    // The sections as the worker parsed them (outside fences), and as its
    // task-implementor parsed the forwarded task prompt: all twelve, in order.
    assert_eq!(trace["headings"], serde_json::json!(HEADINGS), "{trace}");
    assert_eq!(
        trace["task_headings"],
        serde_json::json!(HEADINGS),
        "{trace}"
    );
    assert_eq!(trace["credentials_section"], true);
    assert_eq!(
        trace["printenv"],
        serde_json::json!([]),
        "no printenv with the section"
    );
    assert_eq!(trace["params"]["release_claim_on_exit"], "false");
    assert!(trace.get("released").is_none(), "no release: {trace}");
    assert_eq!(
        trace["failing_tests_seen"],
        serde_json::json!(["parse_empty"])
    );
    assert!(trace["ratio"].as_f64().unwrap() >= 0.8, "{trace}");
    let task_prompt = life.mark(&format!("task-prompt-pr_fix-{n}.md"));
    assert_forwarded_verbatim(&prompt, &task_prompt);
    let dispatch = life.mark(&format!("dispatch-pr_fix-{n}.md"));
    for line in [
        "  task_agent: `task-implementor`\n",
        "  estimator_agent: `estimator-implementation`\n",
        "  escalation_tier_hint: `0`\n",
    ] {
        assert!(dispatch.contains(line), "{line:?}: {dispatch}");
    }
    // The claim: Forgejo's label API with the agent's token (a wrong token is a 401),
    // and no release.
    let calls = life.worker_calls();
    let claim = format!("/repos/{REPO}/issues/{n}/labels");
    assert_eq!(
        calls
            .iter()
            .filter(|(m, p, _)| m == "POST" && *p == claim)
            .map(|c| c.2)
            .collect::<Vec<_>>(),
        [200],
        "{calls:?}"
    );
    assert!(!calls.iter().any(|(m, _, _)| m == "DELETE"), "{calls:?}");
    assert!(
        life.delivered("pull_request_label", AGENT_USER),
        "Forgejo's label webhook names the agent user: {:?}",
        life.delivered.lock().unwrap()
    );
    // The fix, committed as the agents' identity on the PR branch, is what merged.
    let pushed = trace["pushed"].as_str().unwrap().to_owned();
    assert_eq!(fixed, pushed);
    assert_eq!(
        life.remote.commit_of(&pushed),
        (
            format!("{GIT_NAME} <{GIT_EMAIL}>"),
            format!("Fix parse_empty (PR #{n})")
        )
    );
    assert_eq!(s.fake.merges()[0].head_commit_id, Some(pushed.clone()));
    // The dispatcher's output came back verbatim as the agent's last message, which
    // Shepherd keeps as the attempt's summary.
    let a = attempts(s, n).await;
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0]["kind"], "ci-fix");
    assert_eq!(a[0]["outcome"], "succeeded", "{a:?}");
    let output = format!("task-implementor: fixed parse_empty; pushed {pushed} to the PR branch");
    assert_eq!(trace["output"], output.as_str());
    assert!(
        a[0]["summary"].as_str().unwrap_or("").contains(&output),
        "{a:?}"
    );
    let kinds: Vec<Value> = s
        .work_items()
        .await
        .iter()
        .map(|w| w["kind"].clone())
        .collect();
    assert_eq!(kinds, ["ci-fix"], "one work item in the whole life");
    s.assert_no_duplicate_dispatch().await;
    s.fake.assert_calls_match_openapi_v16();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_v2_worker_implements_a_labelled_issue_and_its_pr_merges() {
    let life = Life::start().await;
    let s = &life.s;
    let issue = s.fake.create_issue(
        REPO,
        "alice",
        "Count the widgets",
        "We need a counter.\n\n- [ ] count widgets\n",
    );
    s.fake.add_label(REPO, issue, "auto/implement");
    s.send(&s.fake.issue_label_updated(REPO, issue, "alice"))
        .await;
    let branch = format!("implementer/issue-{issue}");
    let open_pr = || {
        s.fake.with_model(|m| {
            m.repo_mut(REPO)
                .issues
                .values()
                .find(|i| i.pull.as_ref().is_some_and(|p| p.head_ref == branch))
                .map(|i| i.number)
        })
    };
    life.drive("the agent opens a PR", || async { open_pr().is_some() })
        .await;
    let n = open_pr().unwrap();
    let head = s.fake.head_sha(REPO, n);
    s.fake
        .set_status(REPO, &head, "ci / test (pull_request)", "success", "ok");
    life.drive("the PR waits for a review", || async {
        s.phase(REPO, n).await == "awaiting-review"
    })
    .await;
    life.approve(n).await;
    life.drive("the PR merges and closes the issue", || async {
        s.fake.issue(REPO, n).pull.is_some_and(|p| p.merged)
            && s.fake.issue(REPO, issue).state == "closed"
    })
    .await;

    let prompt = life.prompt_seen();
    assert!(prompt.contains("work_type: issue_impl\n"), "{prompt}");
    assert!(
        prompt.contains(&format!("work_number: {issue}\n")),
        "{prompt}"
    );
    assert!(
        prompt.contains("work_title: Count the widgets\n"),
        "{prompt}"
    );
    let gaps = section(&prompt, "## Compliance gap report");
    assert!(gaps.contains("count widgets"), "{gaps}");
    let trace = life.trace("issue_impl", issue);
    assert_eq!(trace["exit"], "dispatched", "{trace}");
    assert_eq!(trace["headings"], serde_json::json!(HEADINGS), "{trace}");
    assert_eq!(
        trace["task_headings"],
        serde_json::json!(HEADINGS),
        "{trace}"
    );
    assert_eq!(trace["opened_pr"], n);
    assert_forwarded_verbatim(
        &prompt,
        &life.mark(&format!("task-prompt-issue_impl-{issue}.md")),
    );
    // No claim for issue work (004 step 5); the PR opened with the agent's token.
    let calls = life.worker_calls();
    assert!(
        !calls.iter().any(|(_, p, _)| p.contains("/labels")),
        "{calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| *c == ("POST".to_owned(), format!("/repos/{REPO}/pulls"), 201)),
        "{calls:?}"
    );
    let pr = s.fake.issue(REPO, n);
    assert_eq!(pr.user, AGENT_USER);
    assert!(
        life.delivered("pull_request", AGENT_USER),
        "Forgejo's `opened` webhook names the agent user: {:?}",
        life.delivered.lock().unwrap()
    );
    assert!(pr.body.contains(&format!("Closes #{issue}")), "{}", pr.body);
    let pushed = trace["pushed"].as_str().unwrap().to_owned();
    assert_eq!(head, pushed);
    assert_eq!(
        life.remote.commit_of(&pushed),
        (
            format!("{GIT_NAME} <{GIT_EMAIL}>"),
            format!("Implement #{issue}: Count the widgets")
        )
    );
    assert_eq!(s.fake.merges()[0].head_commit_id, Some(pushed));
    assert!(
        !s.fake
            .labels_on(REPO, issue)
            .contains(&"auto/claimed-implementer".to_owned()),
        "the issue's claim is released"
    );
    let kinds: Vec<Value> = s
        .work_items()
        .await
        .iter()
        .map(|w| w["kind"].clone())
        .collect();
    assert_eq!(kinds, ["issue-impl"], "one work item in the whole life");
    s.assert_no_duplicate_dispatch().await;
    s.fake.assert_calls_match_openapi();
}

/// The same worker exiting early (issue 27, "Done when"): no git identity reaches it
/// (no `SHEPHERD_AGENT_GIT_NAME`/`_EMAIL`, so no `git_user_name` line and nothing for
/// its `printenv GIT_USER_NAME` fallback), so 004's startup stops it — exit 0, no
/// result file, nothing pushed. Shepherd reads the PR from Forgejo: `no-changes`, a
/// failed attempt; each next dispatch is one tier up, and after the top tier the PR
/// asks for a human — never a silent stall.
#[tokio::test(flavor = "multi_thread")]
async fn a_v2_worker_stopping_at_startup_climbs_every_tier_then_needs_a_human() {
    // Two tiers show the climb; each is one opencode run.
    let models = ["stub-haiku", "stub-codex"];
    let extra = "stuck_after = 1\ntiers = [\"haiku\", \"codex\"]\n";
    let life = Life::start_with(&models, extra, false).await;
    let s = &life.s;
    let sha0 = life
        .remote
        .branch_with("add-y", "y.txt", "y, not yet right\n");
    life.remote.sync(&s.fake, AGENT_USER);
    let n = s.fake.open_pr(
        REPO,
        NewPr::new("agent-bot", "Add y")
            .body("Adds y.")
            .head_sha(&sha0)
            .head_ref("add-y"),
    );
    s.fake
        .set_status(REPO, &sha0, "ci/test", "failure", "2 tests failed");
    s.send(&s.fake.pr_opened(REPO, n)).await;
    life.drive("the PR asks for a human", || async {
        s.fake
            .labels_on(REPO, n)
            .contains(&"needs feedback".to_owned())
    })
    .await;
    s.wait_idle().await;
    assert_eq!(s.fake.head_sha(REPO, n), sha0, "nothing was pushed");
    let a = attempts(s, n).await;
    assert_eq!(a.len(), models.len(), "{a:?}");
    for (i, attempt) in a.iter().enumerate() {
        assert_eq!(attempt["tier"], i, "{attempt}");
        assert_eq!(attempt["outcome"], "no-changes", "{attempt}");
        let summary = attempt["summary"].as_str().unwrap_or_default();
        assert!(summary.contains("git_user_name"), "{summary}");
    }
    let kinds: Vec<String> = s
        .work_items()
        .await
        .iter()
        .map(|w| w["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(kinds, ["ci-fix"; 2], "no dispatch once it needs a human");
    // Each tier's run used that tier's model: the worker really ran at both.
    let used: Vec<String> = life
        .stub
        .agent_turns()
        .iter()
        .map(|r| r.model().to_owned())
        .collect();
    for m in models {
        assert!(used.iter().any(|u| u.ends_with(m)), "{m} in {used:?}");
    }
    let trace = life.trace("pr_fix", n);
    assert!(
        trace["exit"]
            .as_str()
            .unwrap_or_default()
            .contains("git_user_name"),
        "{trace}"
    );
}
