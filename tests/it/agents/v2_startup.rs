//! Seed 004's startup against Shepherd's `cleveragents-v2` prompt, with the test agent
//! `v2_worker.py` run directly on a prompt rendered from the fake Forgejo (real HTTP,
//! real templates): without the credentials section the worker reads its token with
//! `printenv FORGEJO_PAT` and stops when there is none (Shepherd without
//! `SHEPHERD_AGENT_CREDENTIALS`); with the variable set it claims with it and never
//! passes the fetched token downstream; a prompt without a required parameter line
//! (`work_title`, as Shepherd's prompt before the profile) stops it before any call.

use std::path::Path;

use serde_json::Value;
use shepherd::agents::context;
use shepherd::agents::prompt::Templates;
use shepherd::core::policy::PolicyFile;

use super::context::{REPO, client, params, seed_ci_fix};
use crate::support::fake_forgejo::FakeForgejo;

/// The agent user's token in the fake.
const PAT: &str = "implementer-pat-0b5e";

/// The test agent's `User-Agent`.
const WORKER_UA: &str = "v2-worker-test/1";

/// Renders the `ci-fix` prompt of the seeded PR under the profile, with the git
/// identity and no token; returns it and the PR's number.
async fn v2_prompt(fake: &FakeForgejo) -> (String, u64) {
    let item = seed_ci_fix(fake);
    let ctx = context::gather(&client(fake), &item)
        .await
        .expect("context");
    let policy = PolicyFile::from_toml("[defaults]\nprompt_profile = \"cleveragents-v2\"\n")
        .expect("policy");
    let mut p = params(fake);
    p.git_user_name = Some("HAL9000".into());
    p.git_user_email = Some("hal9000@example.org".into());
    let text = Templates::load(&policy)
        .expect("templates")
        .render(&item, &ctx, &p)
        .expect("prompt");
    (text, item.number)
}

/// Runs the worker on `prompt` with only `PATH` and `env` in its environment;
/// returns its output and its trace.
fn run_worker(dir: &Path, prompt: &str, env: &[(&str, &str)]) -> (String, Value) {
    let file = dir.join("prompt.md");
    std::fs::write(&file, prompt).unwrap();
    let script = super::v2_life::worker_script();
    let out = std::process::Command::new(super::v2_life::PYTHON)
        .arg(script)
        .arg(&file)
        .arg(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .envs(env.iter().copied())
        .output()
        .expect("run the worker");
    assert!(out.status.success(), "{out:?}");
    let traces: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("trace-"))
        .collect();
    assert_eq!(traces.len(), 1, "one trace");
    let trace = serde_json::from_str(&std::fs::read_to_string(traces[0].path()).unwrap())
        .expect("trace JSON");
    std::fs::remove_file(traces[0].path()).unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), trace)
}

/// The worker's calls to the fake so far.
fn worker_calls(fake: &FakeForgejo) -> Vec<(String, String, u16)> {
    fake.all_calls()
        .into_iter()
        .filter(|c| c.user_agent == WORKER_UA)
        .map(|c| (c.method, c.path, c.status))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_v2_worker_falls_back_to_printenv_and_stops_without_its_parameters() {
    let fake = FakeForgejo::start().await;
    fake.add_user_token("implementer", PAT);
    let (prompt, n) = v2_prompt(&fake).await;
    fake.create_label(REPO, "auto/claimed-implementer");
    assert!(
        !prompt.contains("## Worker credentials"),
        "no token, no section"
    );
    let dir = tempfile::tempdir().unwrap();

    // No credentials section, no FORGEJO_PAT: 004 startup 4 — report and stop.
    let (out, trace) = run_worker(dir.path(), &prompt, &[]);
    assert_eq!(
        trace["exit"], "required environment variable FORGEJO_PAT is not set",
        "{trace}"
    );
    assert_eq!(trace["printenv"], serde_json::json!(["FORGEJO_PAT"]));
    assert!(out.contains("FORGEJO_PAT is not set"), "{out}");
    assert!(worker_calls(&fake).is_empty(), "no call before the stop");

    // A required line missing (Shepherd's prompt before the profile had no
    // `work_title`): stopped before any call, whatever the environment holds.
    let without_title: String = prompt
        .split_inclusive('\n')
        .filter(|l| !l.starts_with("work_title: "))
        .collect();
    let (_, trace) = run_worker(dir.path(), &without_title, &[("FORGEJO_PAT", PAT)]);
    assert_eq!(
        trace["exit"], "missing required parameter(s): work_title",
        "{trace}"
    );
    assert!(worker_calls(&fake).is_empty(), "no call before the stop");

    // FORGEJO_PAT in the environment (what `worker_env` sets with credentials on):
    // the fallback claims with it, and the fetched token never goes downstream.
    let (out, trace) = run_worker(dir.path(), &prompt, &[("FORGEJO_PAT", PAT)]);
    assert_eq!(trace["exit"], "dispatched", "{trace}");
    assert_eq!(trace["printenv"], serde_json::json!(["FORGEJO_PAT"]));
    assert_eq!(trace["fetched"], serde_json::json!(["forgejo_pat"]));
    let claim = format!("/repos/{REPO}/issues/{n}/labels");
    assert!(
        worker_calls(&fake).contains(&("POST".into(), claim, 200)),
        "{:?}",
        worker_calls(&fake)
    );
    let dispatch = std::fs::read_to_string(dir.path().join(format!("dispatch-pr_fix-{n}.md")))
        .expect("the dispatcher call");
    assert!(!dispatch.contains(PAT), "a fetched token is not propagated");
    assert!(
        dispatch.contains("  git_user_name: `HAL9000`\n"),
        "{dispatch}"
    );
    assert!(
        out.contains("no pre-cloned working copy"),
        "the dispatcher's output, verbatim: {out}"
    );
}
