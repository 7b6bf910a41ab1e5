//! Live usage and the runaway guards with the real opencode CLI (issue 28): `shepherd
//! agents` runs `opencode run --format json` in the real sandbox against the stub model
//! server, whose every answer carries known token counts priced in `opencode.json`;
//! with `SHEPHERD_AGENT_USAGE=opencode-json` the runner meters opencode's events.
//!
//! - the usage the runner reports equals the stub's own sums (tokens by kind, cost,
//!   steps) for a run that ends by itself;
//! - an agent the stub keeps looping is stopped by `max_steps`, by the run's budget
//!   (the overshoot past the cap measured in steps and USD: [`overshoot`]), as a loop
//!   (`max_repeats`), and a silent one by the idle timeout; each stop ends the whole
//!   sandbox and is reported `failed`, signature and `stopped` the reason.
//! - script agents (no opencode): the idle guard without live usage, and a hostile
//!   agent's forged and garbled event lines, which never lower the reported usage.

use std::time::Duration;

use serde_json::{Value, json};

use super::{REPO, Rig, TAG_VAR, processes_of};
use crate::support::model_stub::{ModelStub, StubUsage};
use crate::support::opencode::{OpencodeProject, opencode_root};
use crate::support::poll_until_named;
use crate::support::shepherd::{Builder, Shepherd};

/// The model id of tier 1 (`codex`) in the runner's policy and the stub's provider.
const MODEL: &str = "stub-codex";

/// opencode takes seconds per run; this bounds a hang, it measures nothing.
const HOUR: Duration = Duration::from_secs(3600);

/// `shepherd agents` running opencode with `--format json` in the sandbox, metering
/// its events.
fn runner(rig: &Rig, project: &OpencodeProject) -> Builder {
    runner_of(rig, project, &project.json_command_line())
}

/// [`runner`] with its agent's command line `command` (opencode's, maybe wrapped).
fn runner_of(rig: &Rig, project: &OpencodeProject, command: &str) -> Builder {
    super::open_to_agents(project.root());
    rig.sandboxed_runner(command)
        .policy(&format!("[defaults]\nmodels = {{ codex = \"{MODEL}\" }}\n"))
        .env(
            "SHEPHERD_AGENT_SANDBOX_WRITABLE",
            format!("{}:{}", project.root().display(), rig.dir.path().display()),
        )
        .env(
            "SHEPHERD_AGENT_SANDBOX_READABLE",
            opencode_root().display().to_string(),
        )
        .env("SHEPHERD_AGENT_USAGE", "opencode-json")
}

/// Dispatches a `ci-fix` work item for a new PR, held to `limits`; returns its id.
async fn dispatch(rig: &Rig, limits: Value) -> String {
    let n = rig.open_pr(REPO);
    let mut item = rig.activate(REPO, n, "ci-fix", 1, HOUR).await;
    if !limits.is_null() {
        item["limits"] = limits;
        // The record's active work is the item with its limits, as the core commits it.
        super::set_active_work(&mut rig.conn.clone(), &rig.keys(), &item).await;
    }
    rig.enqueue(&item).await;
    item["id"].as_str().expect("id").to_owned()
}

/// The one result reported for the rig, and its `usage`.
async fn result(rig: &Rig) -> (Value, Value) {
    let results = rig.wait_results(1).await;
    assert_eq!(results.len(), 1, "{results:?}");
    let r = results[0].clone();
    let usage = r["usage"].clone();
    assert!(usage.is_object(), "the result carries usage: {r}");
    (r, usage)
}

/// The usage opencode reports for `served` (the stub's sums of its agent turns).
fn expected(served: &StubUsage) -> [(&'static str, u64); 4] {
    [
        ("input_tokens", served.prompt - served.cached),
        ("output_tokens", served.completion - served.reasoning),
        ("reasoning_tokens", served.reasoning),
        ("cache_read_tokens", served.cached),
    ]
}

/// The figures of a usage JSON as `(name, value)` pairs, like [`expected`].
fn figures(usage: &Value) -> [(&'static str, u64); 4] {
    [
        "input_tokens",
        "output_tokens",
        "reasoning_tokens",
        "cache_read_tokens",
    ]
    .map(|k| (k, usage[k].as_u64().unwrap_or(0)))
}

/// Asserts that the sandbox of work item `id` is gone: no process of it is left.
async fn sandbox_gone(rig: &Rig, id: &str) {
    poll_until_named(
        Duration::from_secs(30),
        "no process of the stopped agent is left",
        || async { processes_of(id, &rig.prefix).is_empty() },
    )
    .await;
}

/// Asserts a run stopped for `reason`: failed, signature and `stopped` the reason, its
/// whole sandbox gone.
async fn assert_stopped(rig: &Rig, id: &str, r: &Value, reason: &str) {
    assert_eq!(r["work_id"], id, "{r}");
    assert_eq!(r["outcome"], "failed", "{r}");
    assert_eq!(r["signature"], reason, "{r}");
    assert_eq!(r["stopped"], reason, "{r}");
    let summary = r["summary"].as_str().unwrap_or("");
    assert!(
        summary.starts_with(&format!("stopped by the runner ({reason})")),
        "{summary}"
    );
    sandbox_gone(rig, id).await;
}

/// The runner's metrics text.
async fn metrics(runner: &Shepherd) -> String {
    reqwest::get(runner.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn opencode_usage_reported_by_the_runner_equals_the_stub_models_sums() {
    let rig = Rig::start().await;
    let stub = ModelStub::start("echo working").await;
    let project = OpencodeProject::prepare(&stub, &[MODEL]);
    let runner = runner(&rig, &project).start().await;
    let id = dispatch(&rig, Value::Null).await;
    let (r, usage) = result(&rig).await;
    assert_eq!(r["work_id"], id.as_str());
    // opencode wrote no result file and pushed nothing: the outcome read from the
    // PR (agents/world.rs) is `no-changes`.
    assert_eq!(r["outcome"], "no-changes", "{r}");
    assert!(r.get("stopped").is_none(), "{r}");

    let (served, cost, turns) = stub.served();
    assert_eq!(turns, 2, "a tool call, then the final answer");
    assert_eq!(figures(&usage), expected(&served), "{usage}");
    assert_eq!(usage["cost_micros"], cost, "{usage}");
    assert_eq!(usage["steps"], turns, "{usage}");
    assert_eq!(usage["tool_calls"], 1, "{usage}");
    assert_eq!(usage["model"], MODEL, "{usage}");
    assert!(usage["wall_ms"].as_u64().unwrap() > 0, "{usage}");

    let text = metrics(&runner).await;
    let line = |name: &str, has: &[&str]| {
        text.lines()
            .find(|l| l.starts_with(name) && has.iter().all(|h| l.contains(h)))
            .unwrap_or_else(|| panic!("no {name} {has:?} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    let labels = [
        &format!("repo=\"{REPO}\"")[..],
        "kind=\"ci-fix\"",
        "model=\"stub-codex\"",
    ];
    let input = line(
        "shepherd_agent_tokens_total",
        &[&labels[..], &["type=\"input\""]].concat(),
    );
    assert_eq!(input as u64, served.prompt - served.cached);
    let usd = line("shepherd_agent_cost_usd_total", &labels);
    assert!((usd - cost as f64 / 1e6).abs() < 1e-9, "{usd}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_looping_opencode_is_stopped_by_max_steps() {
    let rig = Rig::start().await;
    let stub = ModelStub::start("echo step").await;
    stub.set_looping(true);
    let project = OpencodeProject::prepare(&stub, &[MODEL]);
    let runner = runner(&rig, &project).start().await;
    let id = dispatch(&rig, json!({"max_steps": 3})).await;
    let (r, usage) = result(&rig).await;
    assert_stopped(&rig, &id, &r, "over-steps").await;
    let steps = usage["steps"].as_u64().unwrap();
    let (_, _, turns) = stub.served();
    assert!(steps >= 3, "three steps are allowed: {usage}");
    assert!(
        turns <= 4,
        "stopped as the fourth step starts: the model served {turns} agent turns"
    );
    assert!(
        metrics(&runner)
            .await
            .lines()
            .any(|l| l.starts_with("shepherd_agent_runs_stopped_total{reason=\"over-steps\"} 1")),
        "counted"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_looping_opencode_is_stopped_by_its_run_budget_within_one_step() {
    let rig = Rig::start().await;
    let stub = ModelStub::start("echo spend").await;
    stub.set_looping(true);
    let project = OpencodeProject::prepare(&stub, &[MODEL]);
    let _runner = runner(&rig, &project).start().await;
    // About two and a half steps' worth (each costs about 3,900 micro-dollars).
    let cap = 10_000u64;
    let id = dispatch(
        &rig,
        json!({"usd_micros": cap, "budget_scope": "run", "max_steps": 50}),
    )
    .await;
    let (r, usage) = result(&rig).await;
    assert_stopped(&rig, &id, &r, "over-budget").await;
    let counted = usage["cost_micros"].as_u64().unwrap();
    assert!(counted >= cap, "stopped once the cap is reached: {usage}");
    let o = overshoot(&stub, cap);
    eprintln!(
        "budget overshoot: cap {cap} µ$, counted {counted} µ$, model served {} µ$ in {} steps; \
         the cap was reached at step {}: {} step(s) and {} µ$ past the cap",
        o.served_micros, o.turns, o.crossed_at, o.steps_past, o.micros_past
    );
    assert!(
        o.steps_past <= 1,
        "at most one model step after the one that reached the cap: {o:?}"
    );
    assert!(
        counted <= o.served_micros,
        "the runner never counts more than the model served: {usage}"
    );
    let summary = r["summary"].as_str().unwrap();
    eprintln!("summary: {}", summary.lines().next().unwrap_or(""));
    assert!(summary.contains("of $0.010000"), "{summary}");
}

/// How far a run went past its budget, by the stub model server's own figures.
#[derive(Debug)]
struct Overshoot {
    /// Agent turns the model served.
    turns: usize,
    /// What they cost, in micro-dollars.
    served_micros: u64,
    /// The turn whose cost reached the cap (1-based).
    crossed_at: usize,
    /// Turns served after it.
    steps_past: usize,
    /// Micro-dollars served past the cap.
    micros_past: u64,
}

/// The overshoot of a run capped at `cap` micro-dollars, from the stub's figures.
fn overshoot(stub: &ModelStub, cap: u64) -> Overshoot {
    let turns = stub.agent_turns();
    let mut sum = 0;
    let mut crossed_at = turns.len();
    for (i, t) in turns.iter().enumerate() {
        sum += t.usage.cost_micros();
        if sum >= cap && crossed_at == turns.len() {
            crossed_at = i + 1;
        }
    }
    Overshoot {
        turns: turns.len(),
        served_micros: sum,
        crossed_at,
        steps_past: turns.len() - crossed_at,
        micros_past: sum.saturating_sub(cap),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_looping_opencode_repeating_one_call_is_stopped_as_a_loop() {
    let rig = Rig::start().await;
    let stub = ModelStub::start("echo same").await;
    stub.set_looping(true);
    let project = OpencodeProject::prepare(&stub, &[MODEL]);
    let _runner = runner(&rig, &project).start().await;
    let id = dispatch(&rig, json!({"max_repeats": 3, "max_steps": 50})).await;
    let (r, usage) = result(&rig).await;
    assert_stopped(&rig, &id, &r, "loop").await;
    assert!(usage["tool_calls"].as_u64().unwrap() >= 3, "{usage}");
    let (_, _, turns) = stub.served();
    assert!(
        turns <= 5,
        "stopped soon after the third call: {turns} turns"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_opencode_is_stopped_by_the_idle_timeout_and_its_sandbox_ends() {
    let rig = Rig::start().await;
    let marks = rig.path("started");
    // The tool call says it started, then hangs without a word.
    let stub = ModelStub::start(&format!("touch {}; sleep 300", marks.display())).await;
    let project = OpencodeProject::prepare(&stub, &[MODEL]);
    // opencode says nothing while it starts, which can take longer than any fixed
    // timeout on a loaded machine (the guard counts from the agent's start, as it
    // should: a hang at startup is a hang too). So a line on stderr every second
    // stands for a start that is making progress, until the tool call has started:
    // from then on the agent is opencode alone, silent in its hanging call, and the
    // stop must come from the idle guard (without it, nothing ends the run before the
    // work item's hour).
    let wrapper = rig.script(
        "until-the-call.sh",
        &format!(
            "( while [ ! -e '{}' ] && kill -0 $$ 2>/dev/null; do echo 'opencode starting' >&2; sleep 1; done ) &\nexec \"$@\"",
            marks.display()
        ),
    );
    let command = format!("{wrapper} {}", project.json_command_line());
    let _runner = runner_of(&rig, &project, &command).start().await;
    let id = dispatch(&rig, json!({"idle_secs": 15})).await;
    poll_until_named(Duration::from_secs(180), "the tool call starts", || async {
        marks.exists()
    })
    .await;
    // The hanging `sleep` is in the sandbox now, with the work item's environment.
    assert!(
        !processes_of(&id, &rig.prefix).is_empty(),
        "the agent's processes are seen while it runs ({TAG_VAR})"
    );
    let (r, usage) = result(&rig).await;
    assert_stopped(&rig, &id, &r, "idle").await;
    assert_eq!(
        usage["tool_calls"], 0,
        "the hanging call never ended: {usage}"
    );
    let summary = r["summary"].as_str().unwrap();
    assert!(summary.contains("no output for 15 s"), "{summary}");
}

/// A script agent (no opencode) that prints nothing: the idle guard needs no live
/// usage.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_script_agent_is_stopped_idle_without_live_usage() {
    let rig = Rig::start().await;
    let script = rig.script("silent.sh", "echo started; sleep 300");
    let _runner = rig.runner(&script).start().await;
    let id = dispatch(&rig, json!({"idle_secs": 1})).await;
    let (r, usage) = result(&rig).await;
    assert_eq!(r["work_id"], id.as_str());
    assert_eq!(r["signature"], "idle", "{r}");
    assert_eq!(r["stopped"], "idle", "{r}");
    assert_eq!(usage["steps"], 0, "no live usage: {usage}");
    assert!(usage["wall_ms"].as_u64().unwrap() >= 1000, "{usage}");
}

/// A hostile agent's stdout: forged events with negative, absurd or missing figures,
/// garbage without a newline before a real event, and real events — only the real
/// ones (and the harmless forged additions) count; nothing is lowered.
#[tokio::test(flavor = "multi_thread")]
async fn forged_and_garbled_events_never_lower_the_usage_the_runner_reports() {
    let rig = Rig::start().await;
    let step = |input: i64, cost: f64| {
        format!(
            r#"{{"type":"step_finish","part":{{"type":"step-finish","tokens":{{"input":{input},"output":10,"reasoning":0,"cache":{{"read":0,"write":0}}}},"cost":{cost}}}}}"#
        )
    };
    let lines = [
        step(1000, 0.004),
        step(-1_000_000, -5.0),
        r#"{"type":"step_finish","part":{"cost":"free"}}"#.to_owned(),
        format!("\u{1}{{\"garbage\":\"{}", step(2000, 0.006)),
        r#"{"type":"usage_reset"}"#.to_owned(),
    ];
    let out = rig.path("events.jsonl");
    std::fs::write(&out, lines.join("\n") + "\n").unwrap();
    let script = rig.script(
        "forger.sh",
        &format!(
            "cat {}; printf '{{\"outcome\":\"succeeded\",\"tokens\":1,\"cost\":0.0}}' > \"$SHEPHERD_RESULT_FILE\"",
            out.display()
        ),
    );
    let _runner = rig
        .runner(&script)
        .env("SHEPHERD_AGENT_USAGE", "opencode-json")
        .start()
        .await;
    dispatch(&rig, Value::Null).await;
    let (r, usage) = result(&rig).await;
    assert_eq!(r["outcome"], "succeeded", "{r}");
    assert_eq!(usage["input_tokens"], 3000, "{usage}");
    assert_eq!(usage["cost_micros"], 10_000, "{usage}");
    // The forged step with negative figures still adds a step (and 10 output tokens).
    assert_eq!(usage["steps"], 3, "{usage}");
    assert_eq!(usage["output_tokens"], 30, "{usage}");
}
