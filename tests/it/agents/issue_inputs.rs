//! Issue work gets its inputs and its rules (issue 27, item 6): the `issue-impl`
//! prompt carries the issue's labels, milestone, branch and base under both profiles,
//! read from the fake over real HTTP; and, through `shepherd run` and `shepherd
//! agents`, an issue blocked by an open Forgejo dependency or a blocking label gets no
//! `issue-impl` until unblocked, with the reason in `inspect`.

use serde_json::Value;

use shepherd::agents::context;
use shepherd::agents::prompt::Templates;
use shepherd::core::effect::WorkKind;
use shepherd::core::policy::PolicyFile;

use super::context::{REPO, client, params, work_item};
use super::write_script;
use crate::support::fake_forgejo::{FakeForgejo, NewPr};
use crate::support::poll_until_named;
use crate::support::scenario::{DEADLINE, SCENARIO_ADMIN_TOKEN, Scenario};

#[tokio::test]
async fn the_issue_prompt_shows_labels_milestone_branch_and_default_base() {
    let fake = FakeForgejo::start().await;
    let n = fake.create_issue(REPO, "dave", "Crash on empty input", "It crashes.");
    fake.add_label(REPO, n, "Type/Bug");
    fake.add_label(REPO, n, "Priority/High");
    fake.set_milestone(REPO, n, "v1.2");
    let item = work_item(WorkKind::IssueImpl, n, None);
    let ctx = context::gather(&client(&fake), &item)
        .await
        .expect("context");
    let inputs = ctx.inputs.as_ref().expect("issue inputs");
    assert_eq!(inputs.labels, ["Type/Bug", "Priority/High"]);
    assert_eq!(inputs.milestone, "v1.2");
    assert_eq!(inputs.base, "main", "the fake's default branch, read");
    assert!(inputs.base_is_default);
    // A work item without `context.issue` (made before it existed) gets the default
    // branch name of policy `issue_branch`.
    assert_eq!(inputs.branch, format!("shepherd/issue-{n}"));
    for profile in ["shepherd", "cleveragents-v2"] {
        let policy =
            PolicyFile::from_toml(&format!("[defaults]\nprompt_profile = \"{profile}\"\n"))
                .expect("policy");
        let prompt = Templates::load(&policy)
            .expect("templates")
            .render(&item, &ctx, &params(&fake))
            .expect("prompt");
        for want in [
            format!("\nwork_branch: shepherd/issue-{n}\n"),
            "\nbase_branch: main\n".to_owned(),
            "\n- labels: Type/Bug, Priority/High\n".to_owned(),
            "\n- milestone: v1.2\n".to_owned(),
            format!("\n- branch: `shepherd/issue-{n}`"),
            "\n- base branch: `main`, the repository's default branch\n".to_owned(),
        ] {
            assert!(prompt.contains(&want), "{profile}: {want:?} in\n{prompt}");
        }
    }
    assert_eq!(fake.calls("GET", &format!("/repos/{REPO}")).len(), 1);
    fake.assert_calls_match_openapi();
}

/// The scenarios' repository.
const SREPO: &str = "acme/widgets";

/// `GET /api/v1/admin/inspect/{owner}/{repo}/{n}`.
async fn inspect(s: &Scenario, n: u64) -> Value {
    reqwest::Client::new()
        .get(
            s.shepherd
                .url(&format!("/api/v1/admin/inspect/{SREPO}/{n}")),
        )
        .bearer_auth(SCENARIO_ADMIN_TOKEN)
        .send()
        .await
        .expect("inspect answers")
        .json()
        .await
        .expect("inspect JSON")
}

/// An agent that keeps its prompt (`prompt-<number>`) and reports no changes.
fn prompt_keeper(dir: &std::path::Path) -> String {
    let script = write_script(
        dir,
        "keep.sh",
        // Written whole, then renamed: a later attempt never shows a half-written file.
        r#"cat "$1" > "$DIR/.prompt-$$" && mv "$DIR/.prompt-$$" "$DIR/prompt-$SHEPHERD_NUMBER"
printf '{"outcome":"no-changes"}' > "$SHEPHERD_RESULT_FILE""#,
    );
    format!("{script} {{prompt_file}}")
}

/// Issue A depends on B (open, no PR) and on C (open, with the agents' open PR): A
/// waits — its dependencies read again every second — and gets no `issue-impl` while
/// B is open; `inspect` says why. B closes (its webhook reaches B's record only): the
/// next read finds it closed and A is dispatched, based on C's PR head branch, which
/// the agent's prompt names.
#[tokio::test(flavor = "multi_thread")]
async fn an_issue_waits_for_its_open_dependency_then_starts_on_the_stacked_base() {
    let s = Scenario::start("dependency_recheck_secs = 1\n").await;
    let dir = tempfile::tempdir().unwrap();
    let _runner = s.agents(&prompt_keeper(dir.path())).start().await;
    let fake = &s.fake;
    let b = fake.create_issue(SREPO, "alice", "Part B", "First B.");
    let c = fake.create_issue(SREPO, "alice", "Part C", "Then C.");
    let a = fake.create_issue(SREPO, "alice", "Feature A", "Needs B and C.");
    fake.add_dependency(SREPO, b, a);
    fake.add_dependency(SREPO, c, a);
    let stacked = format!("shepherd/issue-{c}");
    let c_pr = fake.open_pr(
        SREPO,
        NewPr::new("agent-bot", "Part C")
            .body(&format!("Closes #{c}"))
            .head_ref(&stacked),
    );
    // Someone else's PR for B (a fork would look the same): it does not unblock A.
    fake.open_pr(
        SREPO,
        NewPr::new("mallory", "Part B, trust me")
            .body(&format!("Closes #{b}"))
            .head_ref("mallory/evil"),
    );
    fake.add_label(SREPO, a, "auto/implement");
    s.send(&fake.issue_label_updated(SREPO, a, "alice")).await;
    let deps = format!("/repos/{SREPO}/issues/{a}/dependencies");
    poll_until_named(
        DEADLINE,
        "A's dependencies are read three times",
        || async { fake.calls("GET", &deps).len() >= 3 },
    )
    .await;
    let view = inspect(&s, a).await;
    assert_eq!(view["phase"], "blocked", "{view}");
    let reason = view["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(&format!("#{b}")), "{reason}");
    assert!(
        !reason.contains(&format!("#{c}")),
        "C is stacked on: {reason}"
    );
    assert!(
        s.work_items().await.iter().all(|w| w["number"] != a),
        "no issue-impl while B is open"
    );
    fake.close(SREPO, b);
    s.send(&fake.issue_closed(SREPO, b, "alice")).await;
    let items = s.wait_work_items(1).await;
    let item = items.iter().find(|w| w["number"] == a).expect("A's work");
    assert_eq!(item["kind"], "issue-impl");
    assert_eq!(item["context"]["issue"]["base"], stacked.as_str());
    assert_eq!(
        item["context"]["issue"]["base_of"],
        serde_json::json!([c, c_pr])
    );
    let prompt_file = dir.path().join(format!("prompt-{a}"));
    poll_until_named(DEADLINE, "the agent kept A's prompt", || async {
        prompt_file.exists()
    })
    .await;
    let prompt = std::fs::read_to_string(&prompt_file).expect("prompt");
    assert!(
        prompt.contains(&format!("\nbase_branch: {stacked}\n")),
        "{prompt}"
    );
    assert!(
        prompt.contains(&format!("\nwork_branch: shepherd/issue-{a}\n")),
        "{prompt}"
    );
    assert!(
        prompt.contains(&format!(
            "the head branch of pull request #{c_pr}, the open pull request of issue #{c}"
        )),
        "{prompt}"
    );
    s.wait_idle().await;
    s.assert_no_duplicate_dispatch().await;
    fake.assert_calls_match_openapi();
}

/// A `Blocked` label holds a labelled issue with the reason in `inspect`, without even
/// reading its dependencies; removing the label dispatches it.
#[tokio::test(flavor = "multi_thread")]
async fn a_blocked_label_holds_the_issue_with_the_reason_in_inspect() {
    let s = Scenario::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let _runner = s.agents(&prompt_keeper(dir.path())).start().await;
    let fake = &s.fake;
    let n = fake.create_issue(SREPO, "alice", "Feature", "Do it.");
    fake.add_label(SREPO, n, "Blocked");
    fake.add_label(SREPO, n, "auto/implement");
    s.send(&fake.issue_label_updated(SREPO, n, "alice")).await;
    poll_until_named(DEADLINE, "inspect shows the issue blocked", || async {
        inspect(&s, n).await["phase"] == "blocked"
    })
    .await;
    s.wait_idle().await;
    let view = inspect(&s, n).await;
    let reason = view["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("`Blocked`"), "{view}");
    assert!(
        view["labels"].as_array().is_some_and(|l| l.len() == 2),
        "{view}"
    );
    assert!(s.work_items().await.is_empty());
    let deps = format!("/repos/{SREPO}/issues/{n}/dependencies");
    assert!(
        fake.calls("GET", &deps).is_empty(),
        "a held issue reads nothing"
    );
    fake.remove_label(SREPO, n, "Blocked");
    s.send(&fake.issue_label_updated(SREPO, n, "alice")).await;
    let items = s.wait_work_items(1).await;
    assert_eq!(items[0]["number"], n);
    assert_eq!(
        items[0]["context"]["issue"]["branch"],
        format!("shepherd/issue-{n}")
    );
    assert!(
        items[0]["context"]["issue"].get("base").is_none(),
        "the default branch"
    );
    // Read before the dispatch (and again before each later attempt).
    assert!(
        !fake.calls("GET", &deps).is_empty(),
        "read before the dispatch"
    );
    s.wait_idle().await;
    fake.assert_calls_match_openapi();
}
