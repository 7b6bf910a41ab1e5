//! The real opencode CLI as the agent: a prompt rendered from the fake Forgejo's state
//! (`gather` + `render`) goes on opencode's stdin; opencode talks to the stub model
//! server through an `opencode.json` custom provider, runs the `bash` tool call the
//! stub streams back, and exits. What the model received is asserted: the prompt
//! verbatim (its sections and parameter lines), the model id, and no token.

use std::process::Stdio;
use std::time::Duration;

use shepherd::agents::context;
use shepherd::agents::prompt::Templates;
use shepherd::core::policy::PolicyFile;
use tokio::io::AsyncWriteExt;

use super::context::{FAILING, UNOFFICIAL_TEXT, client, params, seed_ci_fix};
use crate::support::fake_forgejo::FakeForgejo;
use crate::support::model_stub::{FINAL_TEXT, ModelStub};
use crate::support::opencode::{AGENT, OpencodeProject, opencode_bin};

/// How long one opencode run may take before the test gives up (it takes seconds;
/// this is a deadline against a hang, not a measurement).
const RUN_DEADLINE: Duration = Duration::from_secs(300);

#[tokio::test]
async fn opencode_runs_a_ci_fix_prompt_against_the_stub_model() {
    let bin = opencode_bin();
    let fake = FakeForgejo::start().await;
    let item = seed_ci_fix(&fake);
    let ctx = context::gather(&client(&fake), &item)
        .await
        .expect("gather");
    let prompt = Templates::load(&PolicyFile::default())
        .unwrap()
        .render(&item, &ctx, &params(&fake))
        .unwrap();

    let stub = ModelStub::start("false").await;
    // The stub's tool call writes the result file the runner would read.
    stub.set_command(
        r#"printf '{"outcome":"succeeded","summary":"fixed %s"}' "$SHEPHERD_WORK_ID" > "$SHEPHERD_RESULT_FILE""#,
    );
    let project = OpencodeProject::prepare(&stub, &["codex", "opus"]);
    let work = tempfile::tempdir().unwrap();
    let result_file = work.path().join("result.json");
    let model = item.tier_name.as_str();
    let mut cmd = project.command(AGENT, model);
    cmd.current_dir(work.path())
        .env("SHEPHERD_WORK_ID", item.id.as_str())
        .env("SHEPHERD_RESULT_FILE", &result_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(prompt.as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(RUN_DEADLINE, child.wait_with_output())
        .await
        .expect("opencode finishes")
        .expect("opencode runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "opencode failed ({}):\n{stdout}\n{stderr}",
        out.status
    );

    // The bash tool call ran, in the agent's environment.
    let result = std::fs::read_to_string(&result_file).expect("the tool call wrote the result");
    let result: serde_json::Value = serde_json::from_str(&result).unwrap();
    assert_eq!(result["outcome"], "succeeded");
    assert_eq!(result["summary"], format!("fixed {}", item.id));

    // What the model saw: a title request, then the agent's turn with the prompt
    // verbatim, then the turn with the tool's result.
    let requests = stub.requests();
    assert!(
        requests.iter().any(|r| !r.is_agent_turn()),
        "opencode asks for a title without tools"
    );
    let turns = stub.agent_turns();
    assert_eq!(turns.len(), 2, "one tool call, one final answer");
    for r in &requests {
        assert_eq!(r.model(), model, "the tier's model id");
        assert_eq!(r.authorization.as_deref(), Some("Bearer not-a-secret"));
    }
    let shown = turns[0].user_texts();
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(
        shown[0].trim_end(),
        prompt.trim_end(),
        "the prompt reaches the model verbatim"
    );
    let lines: Vec<&str> = shown[0].lines().collect();
    for line in [
        "work_type: pr_fix",
        "work_number: 2",
        &format!("forgejo_url: {}", fake.url()),
        "forgejo_owner: acme",
        "forgejo_repo: web",
        "escalation_tier_hint: 1",
        "release_claim_on_exit: false",
        "## PR description",
        "## Full diff",
        "## CI status",
        "## PR comments",
        "## Active REQUEST_CHANGES reviews",
        "## Linked issues",
    ] {
        assert!(lines.contains(&line), "the model saw no line {line:?}");
    }
    assert!(shown[0].contains(FAILING));
    let second = &turns[1].body["messages"];
    let tool_result = second
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the second turn carries the tool result");
    assert!(
        tool_result["tool_call_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_"))
    );
    assert!(
        stdout.contains(FINAL_TEXT),
        "opencode prints the final answer:\n{stdout}"
    );

    // No token anywhere the model could see it.
    for r in &requests {
        let text = r.body.to_string();
        assert!(
            !text.contains(fake.token()),
            "the Forgejo token reached the model"
        );
        assert!(
            !text.contains(UNOFFICIAL_TEXT),
            "an unofficial review reached the model"
        );
    }
    fake.assert_calls_match_openapi();
}
