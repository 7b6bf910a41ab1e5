//! Outcomes read from the world (issue 27, item 2): an agent that exits without a
//! result file is judged by what Forgejo shows — the PR's head moved (pushed), an agent
//! PR links the issue (opened-pr), or nothing (`no-changes`) — and the
//! `cleveragents-v2` worker's early stop (a required parameter missing, exit 0)
//! escalates to `needs-human` instead of waiting for a push forever.

use std::time::Duration;

use crate::support::fake_forgejo::{Fault, NewPr};
use crate::support::scenario::Scenario;

use super::e2e::{REPO as E2E_REPO, attempts};
use super::{REPO, Rig, write_script};

/// The claim of the dispatched work items.
const HOUR: Duration = Duration::from_secs(3600);

/// An agent that waits for the test's `release-<number>` marker, then exits with the
/// code in `code-<number>` without writing a result file.
const WAIT_THEN_EXIT: &str = r#"while [ ! -e "$DIR/release-$SHEPHERD_NUMBER" ]; do sleep 0.05; done
echo "done with $SHEPHERD_NUMBER"
exit "$(cat "$DIR/code-$SHEPHERD_NUMBER")""#;

/// Lets the agent of `number` exit with `code`.
fn release(rig: &Rig, number: u64, code: i32) {
    std::fs::write(rig.path(&format!("code-{number}")), code.to_string()).unwrap();
    std::fs::write(rig.path(&format!("release-{number}")), "").unwrap();
}

/// The queued result of work item `id`.
async fn result_of(rig: &Rig, id: &str) -> serde_json::Value {
    rig.results()
        .await
        .into_iter()
        .find(|r| r["work_id"] == id)
        .unwrap_or_else(|| panic!("no result for {id}"))
}

/// Pushes without a result file (exit 0, and exit 3 — pushed, then crashed): both are
/// recorded as success, the summary naming the moved head. A run that pushed nothing
/// and exited 0 is `no-changes`.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_without_a_result_file_is_success_and_no_push_is_no_changes() {
    let (rig, script) = Rig::with_script("wait.sh", WAIT_THEN_EXIT).await;
    let _runner = rig
        .runner(&script)
        .env("SHEPHERD_AGENTS_MAX", "3")
        .env("SHEPHERD_AGENTS_PER_REPO", "3")
        .start()
        .await;
    let (a, b, c) = (rig.open_pr(REPO), rig.open_pr(REPO), rig.open_pr(REPO));
    let ia = rig.dispatch(REPO, a, "ci-fix", 0, HOUR).await;
    let ib = rig.dispatch(REPO, b, "ci-fix", 0, HOUR).await;
    let ic = rig.dispatch(REPO, c, "review-feedback", 0, HOUR).await;
    for id in [&ia, &ib, &ic] {
        rig.wait_state(id, "running").await;
    }
    let (sha_a, sha_b) = ("a1".repeat(20), "b2".repeat(20));
    rig.fake.push(REPO, a, &sha_a);
    rig.fake.push(REPO, b, &sha_b);
    release(&rig, a, 0);
    release(&rig, b, 3);
    release(&rig, c, 0);
    rig.wait_results(3).await;
    for (id, sha) in [(&ia, &sha_a), (&ib, &sha_b)] {
        let r = result_of(&rig, id).await;
        assert_eq!(r["outcome"], "succeeded", "{r}");
        assert!(r["signature"].is_null(), "{r}");
        let summary = r["summary"].as_str().unwrap();
        assert!(
            summary.contains(&format!("to {} since dispatch: pushed", &sha[..10])),
            "{summary}"
        );
    }
    let r = result_of(&rig, &ic).await;
    assert_eq!(r["outcome"], "no-changes", "{r}");
    let summary = r["summary"].as_str().unwrap();
    assert!(
        summary.contains("the PR's head is the one it was dispatched on"),
        "{summary}"
    );
    assert!(
        summary.contains(&format!("done with {c}")),
        "the output's tail is kept: {summary}"
    );
    rig.fake.assert_calls_match_openapi();
}

/// `issue-impl` without a result file: an open PR by the bot's agent user that links
/// the issue is success (`opened-pr`); an outsider's linking PR is not, so that run is
/// `no-changes`.
#[tokio::test(flavor = "multi_thread")]
async fn an_issue_agents_pr_is_success_and_an_outsiders_is_not() {
    let (rig, script) = Rig::with_script("wait.sh", WAIT_THEN_EXIT).await;
    let _runner = rig
        .runner(&script)
        .env("SHEPHERD_AGENTS_MAX", "3")
        .env("SHEPHERD_AGENTS_PER_REPO", "3")
        .start()
        .await;
    let done = rig
        .fake
        .create_issue(REPO, "alice", "Implement y", "We need y.");
    let not_done = rig
        .fake
        .create_issue(REPO, "alice", "Implement z", "We need z.");
    let i_done = rig.dispatch(REPO, done, "issue-impl", 0, HOUR).await;
    let i_not = rig.dispatch(REPO, not_done, "issue-impl", 0, HOUR).await;
    for id in [&i_done, &i_not] {
        rig.wait_state(id, "running").await;
    }
    let pr = rig.fake.open_pr(
        REPO,
        NewPr::new(rig.fake.bot_login(), "Implement y").body(&format!("Closes #{done}")),
    );
    rig.fake.open_pr(
        REPO,
        NewPr::new("mallory", "Implement z").body(&format!("Closes #{not_done}")),
    );
    release(&rig, done, 0);
    release(&rig, not_done, 0);
    rig.wait_results(2).await;
    let r = result_of(&rig, &i_done).await;
    assert_eq!(r["outcome"], "succeeded", "{r}");
    let summary = r["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!("#{pr} is open and links the issue")),
        "{summary}"
    );
    let r = result_of(&rig, &i_not).await;
    assert_eq!(r["outcome"], "no-changes", "{r}");
    rig.fake.assert_calls_match_openapi();
}

/// Forgejo cannot be read when the agent exits: the exit status decides as before, the
/// result is still reported, and its summary says why.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_forgejo_falls_back_to_the_exit_status_and_says_so() {
    let (rig, script) = Rig::with_script("wait.sh", WAIT_THEN_EXIT).await;
    let _runner = rig
        .runner(&script)
        .env("SHEPHERD_AGENTS_MAX", "3")
        .env("SHEPHERD_AGENTS_PER_REPO", "3")
        .start()
        .await;
    let n = rig.open_pr(REPO);
    let id = rig.dispatch(REPO, n, "ci-fix", 0, HOUR).await;
    rig.wait_state(&id, "running").await;
    rig.fake
        .inject(Fault::on("GET", &format!("/repos/{REPO}/pulls/{n}")).status(500));
    release(&rig, n, 0);
    rig.wait_results(1).await;
    let r = result_of(&rig, &id).await;
    assert_eq!(r["outcome"], "succeeded", "{r}");
    let summary = r["summary"].as_str().unwrap();
    assert!(summary.contains("Forgejo could not be read"), "{summary}");
}

/// A worker written from 004's startup rules under `prompt_profile =
/// "cleveragents-v2"`: its required `git_user_name` is neither in the prompt nor in
/// its environment (no `SHEPHERD_AGENT_GIT_NAME`), so it stops at startup — exit 0, no
/// result file, no push. Each stop is `no-changes`, the next dispatch goes one tier
/// up, and after the top tier the PR asks for a human: never a silent stall.
#[tokio::test(flavor = "multi_thread")]
async fn a_v2_worker_that_stops_at_startup_escalates_to_needs_human() {
    let policy = "prompt_profile = \"cleveragents-v2\"\ntiers = [\"small\", \"medium\", \"large\"]\n\
                  stuck_after = 1\n";
    let s = Scenario::start(policy).await;
    let dir = tempfile::tempdir().unwrap();
    // 004, startup: every required parameter from the prompt's parameter lines, else
    // the worker's printenv fallback (the upper-case name); one missing → stop.
    let script = write_script(
        dir.path(),
        "v2-worker.sh",
        r#"for p in forgejo_url forgejo_owner forgejo_repo work_type work_number work_title git_user_name git_user_email; do
  v=$(sed -n "s/^$p: //p" "$1" | head -n 1)
  [ -n "$v" ] || v=$(printenv "$(echo "$p" | tr a-z A-Z)")
  if [ -z "$v" ]; then
    echo "tier $SHEPHERD_TIER: missing $p" >> "$DIR/stops"
    echo "ERROR: required parameter $p is missing; stopping"
    exit 0
  fi
done
echo "started" >> "$DIR/started""#,
    );
    let _runner = s.agents(&format!("{script} {{prompt_file}}")).start().await;
    let n = s
        .fake
        .open_pr(E2E_REPO, NewPr::new("agent-bot", "Add y").body("Adds y."));
    let sha = s.fake.head_sha(E2E_REPO, n);
    s.fake
        .set_status(E2E_REPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&s.fake.pr_opened(E2E_REPO, n)).await;
    s.wait_phase(E2E_REPO, n, "needs-human").await;
    s.wait_idle().await;
    let stops = std::fs::read_to_string(dir.path().join("stops")).unwrap();
    assert_eq!(
        stops.lines().collect::<Vec<_>>(),
        [
            "tier 0: missing git_user_name",
            "tier 1: missing git_user_name",
            "tier 2: missing git_user_name"
        ]
    );
    assert!(
        !dir.path().join("started").exists(),
        "it never got past startup"
    );
    let items = s.work_items().await;
    assert_eq!(items.len(), 3, "no dispatch once it needs a human");
    let a = attempts(&s, n).await;
    assert_eq!(a.len(), 3, "{a:?}");
    for (i, attempt) in a.iter().enumerate() {
        assert_eq!(attempt["tier"], i, "{attempt}");
        assert_eq!(attempt["outcome"], "no-changes", "{attempt}");
        let summary = attempt["summary"].as_str().unwrap();
        assert!(
            summary.contains("required parameter git_user_name is missing"),
            "{summary}"
        );
    }
    s.wait_fake("the PR asks for a human", |f| {
        f.labels_on(E2E_REPO, n)
            .contains(&"needs feedback".to_owned())
    })
    .await;
}

/// An agent that writes `succeeded` but never pushes: the record waits
/// `push_grace_secs` for the push (the worker's `push-grace` timer), then counts the
/// attempt as `no-changes`, dispatches at the next tier, and after the top tier asks
/// for a human.
#[tokio::test(flavor = "multi_thread")]
async fn a_success_that_no_push_follows_becomes_no_changes_after_the_grace() {
    let policy = "push_grace_secs = 1\ntiers = [\"small\", \"large\"]\nstuck_after = 1\n";
    let s = Scenario::start(policy).await;
    let dir = tempfile::tempdir().unwrap();
    let script = write_script(
        dir.path(),
        "claims.sh",
        r#"echo "tier $SHEPHERD_TIER" >> "$DIR/runs"
printf '{"outcome":"succeeded","summary":"fixed it, pushing now"}' > "$SHEPHERD_RESULT_FILE""#,
    );
    let _runner = s.agents(&script).start().await;
    let n = s
        .fake
        .open_pr(E2E_REPO, NewPr::new("agent-bot", "Add y").body("Adds y."));
    let sha = s.fake.head_sha(E2E_REPO, n);
    s.fake
        .set_status(E2E_REPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&s.fake.pr_opened(E2E_REPO, n)).await;
    s.wait_phase(E2E_REPO, n, "needs-human").await;
    s.wait_idle().await;
    let runs = std::fs::read_to_string(dir.path().join("runs")).unwrap();
    assert_eq!(runs.lines().collect::<Vec<_>>(), ["tier 0", "tier 1"]);
    let a = attempts(&s, n).await;
    assert_eq!(a.len(), 2, "{a:?}");
    for (i, attempt) in a.iter().enumerate() {
        assert_eq!(attempt["tier"], i, "{attempt}");
        assert_eq!(attempt["outcome"], "no-changes", "{attempt}");
        let summary = attempt["summary"].as_str().unwrap();
        assert!(summary.contains("push_grace_secs"), "{summary}");
        assert!(summary.contains("fixed it, pushing now"), "{summary}");
    }
}
