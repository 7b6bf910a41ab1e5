//! The cost ledger with the real opencode CLI (issue 28): `shepherd run` dispatches a
//! `ci-fix` for each of two PRs, `shepherd agents` runs opencode (metering its JSON
//! events) against the stub model server, whose answers carry known token counts
//! priced in `opencode.json`; the results go through the worker into the ledger, and
//! `shepherd costs --json` shows, per PR (lifetime) and for the repository's day, the
//! stub's own sums exactly.

use std::time::Duration;

use serde_json::Value;

use super::e2e::{REPO, attempts};
use crate::support::fake_forgejo::NewPr;
use crate::support::model_stub::{ModelStub, StubUsage};
use crate::support::opencode::{OpencodeProject, opencode_root};
use crate::support::poll_until_named;
use crate::support::scenario::Scenario;

/// opencode takes seconds per run; this bounds a hang, it measures nothing.
const AGENT_DEADLINE: Duration = Duration::from_secs(180);

/// What the ledger should hold for some agent turns of the stub: input, output
/// tokens (as opencode reports them: cached input and reasoning apart) and cost.
fn ledger_figures(u: &StubUsage, cost: u64) -> [u64; 3] {
    [u.prompt - u.cached, u.completion - u.reasoning, cost]
}

/// The stub's sums of every agent turn so far.
fn served(stub: &ModelStub) -> (StubUsage, u64) {
    let (u, cost, _) = stub.served();
    (u, cost)
}

/// Opens a PR whose CI fails, lets the ci-fix run and waits until its attempt is
/// recorded; returns the PR's number.
async fn run_one(s: &Scenario, title: &str) -> u64 {
    let n = s
        .fake
        .open_pr(REPO, NewPr::new("agent-bot", title).body("Adds it."));
    let sha = s.fake.head_sha(REPO, n);
    s.fake
        .set_status(REPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&s.fake.pr_opened(REPO, n)).await;
    poll_until_named(
        AGENT_DEADLINE,
        "the agent's attempt is recorded",
        || async {
            attempts(s, n)
                .await
                .first()
                .is_some_and(|a| a["outcome"].is_string() && a["outcome"] != "superseded")
        },
    )
    .await;
    n
}

/// `shepherd costs --days 1 --json` of the scenario.
fn costs(s: &Scenario) -> Value {
    let out = s.cli(&["costs", "--days", "1", "--json"]);
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("costs JSON")
}

/// `(input, output, usd_micros, runs)` of an entry of `shepherd costs --json`.
fn entry(v: &Value) -> [u64; 4] {
    ["input_tokens", "output_tokens", "usd_micros", "runs"]
        .map(|k| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}")))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_of_two_opencode_runs_equals_the_stub_models_sums() {
    // One tier and `stuck_after = 1`: opencode pushes nothing (`no-changes`), and the
    // PR then asks for a human instead of running again, so each PR has one run.
    let s = Scenario::start(
        "models = { haiku = \"stub-haiku\" }\ntiers = [\"haiku\"]\nstuck_after = 1\n",
    )
    .await;
    let marks = tempfile::tempdir().unwrap();
    let stub = ModelStub::start("echo working").await;
    let project = OpencodeProject::prepare(&stub, &["stub-haiku"]);
    super::open_to_agents(project.root());
    super::open_to_agents(marks.path());
    let _runner = s
        .agents(&project.json_command_line())
        .env("SHEPHERD_AGENT_SANDBOX", "on")
        .env(
            "SHEPHERD_AGENT_SANDBOX_WRITABLE",
            format!("{}:{}", project.root().display(), marks.path().display()),
        )
        .env(
            "SHEPHERD_AGENT_SANDBOX_READABLE",
            opencode_root().display().to_string(),
        )
        .env("SHEPHERD_AGENT_USAGE", "opencode-json")
        .start()
        .await;

    // One run at a time, so the stub's turns split between them.
    let a = run_one(&s, "First").await;
    let (first, first_cost) = served(&stub);
    let b = run_one(&s, "Second").await;
    let (all, all_cost) = served(&stub);
    let second = StubUsage {
        prompt: all.prompt - first.prompt,
        completion: all.completion - first.completion,
        cached: all.cached - first.cached,
        reasoning: all.reasoning - first.reasoning,
    };
    assert!(
        first_cost > 0 && all_cost > first_cost,
        "both runs asked the model"
    );

    poll_until_named(AGENT_DEADLINE, "both runs are in the ledger", || async {
        costs(&s)["repos"][0]["runs"].as_u64() >= Some(2)
    })
    .await;
    let costs = costs(&s);
    let prs = costs["prs"].as_array().expect("prs");
    assert_eq!(prs.len(), 2, "{costs}");
    for (n, usage, cost) in [(a, &first, first_cost), (b, &second, all_cost - first_cost)] {
        let pr = prs
            .iter()
            .find(|p| p["number"] == n && p["repo"] == REPO)
            .unwrap_or_else(|| panic!("PR {n} in {costs}"));
        let [i, o, c] = ledger_figures(usage, cost);
        assert_eq!(entry(pr), [i, o, c, 1], "PR {n}: {pr}");
    }
    let repos = costs["repos"].as_array().expect("repos");
    assert_eq!(repos.len(), 1, "one repository, one day: {costs}");
    assert_eq!(repos[0]["repo"], REPO);
    assert_eq!(repos[0]["day"], costs["to"]);
    let [i, o, c] = ledger_figures(&all, all_cost);
    assert_eq!(entry(&repos[0]), [i, o, c, 2], "{costs}");
    assert_eq!(costs["total"]["usd_micros"], all_cost, "{costs}");
}
