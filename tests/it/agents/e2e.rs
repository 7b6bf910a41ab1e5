//! The whole loop: `shepherd run` (ingest, worker, executor) with the fake Forgejo, and
//! `shepherd agents` running script agents for the work items it dispatches.

use serde_json::Value;

use super::{alive, read_pid, results_on, run_record_on, write_script};
use crate::support::fake_forgejo::NewPr;
use crate::support::poll_until_named;
use crate::support::scenario::{DEADLINE, Scenario};

/// The repository of the scenarios.
pub(super) const REPO: &str = "acme/widgets";

/// Opens a bot PR whose head fails CI; returns (PR, head sha).
async fn open_red_pr(s: &Scenario) -> (u64, String) {
    let n = s
        .fake
        .open_pr(REPO, NewPr::new("agent-bot", "Add y").body("Adds y."));
    let sha = s.fake.head_sha(REPO, n);
    s.fake
        .set_status(REPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&s.fake.pr_opened(REPO, n)).await;
    (n, sha)
}

/// The stored record of PR `n`.
pub(super) async fn record(s: &Scenario, n: u64) -> Value {
    let mut conn = s.redis_conn();
    let data: Option<String> = redis::cmd("HGET")
        .arg(s.shepherd.keys().pr_record(REPO, n))
        .arg("data")
        .query_async(&mut conn)
        .await
        .expect("HGET record");
    data.map_or(Value::Null, |d| {
        serde_json::from_str(&d).expect("record JSON")
    })
}

/// The finished attempts of PR `n`.
pub(super) async fn attempts(s: &Scenario, n: u64) -> Vec<Value> {
    record(s, n).await["work"]["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// A human pushes while the agent runs: the cancel notice kills the agent's whole
/// process group, and no result is counted (the attempt stays `superseded`).
#[tokio::test(flavor = "multi_thread")]
async fn a_human_push_cancels_the_running_agent() {
    let s = Scenario::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let script = write_script(
        dir.path(),
        "hang.sh",
        r#"sleep 600 & echo $! > "$DIR/child"; echo $$ > "$DIR/leader"; wait"#,
    );
    let _runner = s.agents(&script).start().await;
    let (n, _) = open_red_pr(&s).await;
    let item = s.wait_work_items(1).await.remove(0);
    let id = item["id"].as_str().unwrap().to_owned();
    let leader = read_pid(&dir.path().join("leader")).await;
    let child = read_pid(&dir.path().join("child")).await;
    s.fake
        .push(REPO, n, "3333333333333333333333333333333333333333");
    s.send(&s.fake.pr_synchronized(REPO, n, "alice")).await;
    poll_until_named(DEADLINE, "the agent's process group is gone", || async {
        !alive(leader) && !alive(child)
    })
    .await;
    let keys = s.shepherd.keys();
    let mut conn = s.redis_conn();
    poll_until_named(DEADLINE, "the runner records the cancel", || async {
        run_record_on(&mut s.redis_conn(), &keys, &id)
            .await
            .is_some_and(|r| r["state"] == "cancelled")
    })
    .await;
    s.wait_idle().await;
    assert!(s.cancels().await.iter().any(|c| c["id"] == id.as_str()));
    assert!(
        results_on(&mut conn, &keys).await.is_empty(),
        "no result counted"
    );
    let a = attempts(&s, n).await;
    assert_eq!(a.len(), 1);
    assert_eq!(a[0]["outcome"], "superseded");
    assert!(a[0]["summary"].is_null(), "{a:?}");
    // A result for the cancelled work item (an agent that outlived its runner's kill)
    // stays refused.
    assert_eq!(s.report(&id, "succeeded", None).await, 409);
}

/// The agent pushes (as the bot), which ends its claim without a cancel, then writes
/// its result and exits: the result is recorded on that superseded attempt, once.
#[tokio::test(flavor = "multi_thread")]
async fn the_agents_result_after_its_own_push_is_recorded_on_that_attempt() {
    let s = Scenario::start("").await;
    let dir = tempfile::tempdir().unwrap();
    let script = write_script(
        dir.path(),
        "push.sh",
        r#"echo $$ > "$DIR/leader"
echo "pushing the fix"
while [ ! -e "$DIR/release" ]; do sleep 0.05; done
printf '{"outcome":"succeeded","summary":"fixed the failing test"}' > "$SHEPHERD_RESULT_FILE""#,
    );
    let _runner = s.agents(&script).start().await;
    // An unsandboxed runner shows on the status page from its first heartbeat, before
    // it holds any work.
    poll_until_named(
        DEADLINE,
        "the status page names the idle unsandboxed runner",
        || async {
            let page = s.status_page().await;
            page.contains("agents unsandboxed") && page.contains("No agent runner holds work.")
        },
    )
    .await;
    let (n, _) = open_red_pr(&s).await;
    let item = s.wait_work_items(1).await.remove(0);
    let id = item["id"].as_str().unwrap().to_owned();
    read_pid(&dir.path().join("leader")).await;
    // Visible while it runs: the status page's table and `inspect`.
    poll_until_named(
        DEADLINE,
        "the status page lists the running agent",
        || async {
            let page = s.status_page().await;
            page.contains("Running agents (1)") && page.contains(&id)
        },
    )
    .await;
    // This runner's agents are unsandboxed (`SHEPHERD_AGENT_SANDBOX=off`): the page
    // says so.
    assert!(
        s.status_page().await.contains("agents unsandboxed"),
        "the status page warns of the unsandboxed runner"
    );
    // The output so far is stored while it runs.
    poll_until_named(
        DEADLINE,
        "inspect shows the running agent's output",
        || async {
            let view = inspect(&s, n).await;
            view["agent"]["log_tail"]
                .as_str()
                .is_some_and(|t| t.contains("pushing the fix"))
        },
    )
    .await;
    let view = inspect(&s, n).await;
    assert_eq!(view["agent"]["run"]["state"], "running", "{view}");
    assert_eq!(
        view["agent"]["run"]["model"], "haiku",
        "an unmapped tier's model is its name"
    );
    // The agent's push: the bot moves the head.
    let sha2 = "4444444444444444444444444444444444444444";
    s.fake.push(REPO, n, sha2);
    s.fake
        .set_status(REPO, sha2, "ci/test", "pending", "running");
    s.send(&s.fake.pr_synchronized(REPO, n, s.fake.bot_login()))
        .await;
    poll_until_named(DEADLINE, "the claim ends as superseded", || async {
        attempts(&s, n)
            .await
            .first()
            .is_some_and(|a| a["outcome"] == "superseded")
    })
    .await;
    assert!(
        s.cancels().await.is_empty(),
        "the agent's own push cancels nothing"
    );
    std::fs::write(dir.path().join("release"), "").unwrap();
    poll_until_named(
        DEADLINE,
        "the result is recorded on the attempt",
        || async {
            attempts(&s, n)
                .await
                .first()
                .is_some_and(|a| a["outcome"] == "succeeded")
        },
    )
    .await;
    let a = attempts(&s, n).await;
    assert_eq!(a.len(), 1);
    assert_eq!(a[0]["summary"], "fixed the failing test");
    assert_eq!(s.report(&id, "failed", None).await, 409, "recorded once");
    s.wait_idle().await;
    assert_eq!(attempts(&s, n).await[0]["outcome"], "succeeded");
    assert_eq!(
        results_on(&mut s.redis_conn(), &s.shepherd.keys())
            .await
            .len(),
        1
    );
    let view = inspect(&s, n).await;
    assert_eq!(view["agent"]["run"]["state"], "finished", "{view}");
    assert_eq!(view["agent"]["run"]["outcome"], "succeeded", "{view}");
    let tail = view["agent"]["log_tail"].as_str().unwrap_or_default();
    assert!(tail.contains("pushing the fix"), "{view}");
    assert!(s.status_page().await.contains("Running agents (0)"));
}

/// `GET /api/v1/admin/inspect/{owner}/{repo}/{n}` (what `shepherd inspect` shows).
async fn inspect(s: &Scenario, n: u64) -> Value {
    reqwest::Client::new()
        .get(s.shepherd.url(&format!("/api/v1/admin/inspect/{REPO}/{n}")))
        .bearer_auth(crate::support::scenario::SCENARIO_ADMIN_TOKEN)
        .send()
        .await
        .expect("inspect answers")
        .json()
        .await
        .expect("inspect JSON")
}

/// The runner is killed (SIGKILL) while its agent runs: the agent dies with it. After
/// the claim lapses the work is dispatched again as the next attempt, which another
/// runner runs — never two agents at once — and the dead runner's entry, reclaimed,
/// does not run again.
#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_runners_agent_dies_and_the_work_comes_back_as_the_next_attempt() {
    let s = Scenario::start("claim_ttl_secs = 8\n").await;
    let dir = tempfile::tempdir().unwrap();
    let script = write_script(
        dir.path(),
        "hang.sh",
        r#"echo $$ > "$DIR/leader-$SHEPHERD_WORK_ID"; exec sleep 600"#,
    );
    let margin = ("SHEPHERD_AGENT_DEADLINE_MARGIN_SECS", "1");
    let mut first = s.agents(&script).env(margin.0, margin.1).start().await;
    let (n, _) = open_red_pr(&s).await;
    let item = s.wait_work_items(1).await.remove(0);
    let id1 = item["id"].as_str().unwrap().to_owned();
    let agent1 = read_pid(&dir.path().join(format!("leader-{id1}"))).await;
    first.kill();
    poll_until_named(DEADLINE, "the agent dies with its runner", || async {
        !alive(agent1)
    })
    .await;

    let items = s.wait_work_items(2).await;
    let second = &items[1];
    assert_eq!(second["attempt"], 2, "{second}");
    assert_eq!(
        second["tier"], 1,
        "an expired claim is a failed attempt: {second}"
    );
    let id2 = second["id"].as_str().unwrap().to_owned();
    let _other = s
        .agents(&script)
        .env(margin.0, margin.1)
        .env("SHEPHERD_RECLAIM_IDLE_SECS", "2")
        .start()
        .await;
    let agent2 = read_pid(&dir.path().join(format!("leader-{id2}"))).await;
    assert!(alive(agent2) && !alive(agent1), "never two agents at once");
    let keys = s.shepherd.keys();
    poll_until_named(
        DEADLINE,
        "the dead runner's entry is reclaimed and skipped",
        || async {
            run_record_on(&mut s.redis_conn(), &keys, &id1)
                .await
                .is_some_and(|r| r["state"] == "skipped")
        },
    )
    .await;
    assert_eq!(
        read_pid(&dir.path().join(format!("leader-{id1}"))).await,
        agent1,
        "the first work item never started again"
    );
    let a = attempts(&s, n).await;
    assert_eq!(a[0]["outcome"], "expired", "{a:?}");
}

/// The same failing check three times through the runner: tiers 0, 1, 2 with the
/// mapped model ids on the agent's command line, then `needs-human` after the
/// configured attempts at the top tier.
#[tokio::test(flavor = "multi_thread")]
async fn the_same_failure_escalates_through_the_mapped_models_then_needs_a_human() {
    let policy = "tiers = [\"small\", \"medium\", \"large\"]\nstuck_after = 1\n\
                  models = { small = \"m-small\", medium = \"m-medium\", large = \"m-large\" }\n";
    let s = Scenario::start(policy).await;
    let dir = tempfile::tempdir().unwrap();
    let script = write_script(
        dir.path(),
        "fail.sh",
        r#"echo "$1 $SHEPHERD_TIER $SHEPHERD_MODEL" >> "$DIR/models"; echo "cannot fix it"; exit 1"#,
    );
    let _runner = s.agents(&format!("{script} {{model}}")).start().await;
    let (n, _) = open_red_pr(&s).await;
    s.wait_phase(REPO, n, "needs-human").await;
    s.wait_idle().await;
    let models = std::fs::read_to_string(dir.path().join("models")).unwrap();
    assert_eq!(
        models.lines().collect::<Vec<_>>(),
        [
            "m-small 0 m-small",
            "m-medium 1 m-medium",
            "m-large 2 m-large"
        ]
    );
    let items = s.work_items().await;
    assert_eq!(items.len(), 3, "no dispatch once it needs a human");
    let a = attempts(&s, n).await;
    assert_eq!(a.len(), 3);
    for (i, attempt) in a.iter().enumerate() {
        assert_eq!(attempt["tier"], i);
        assert_eq!(attempt["outcome"], "failed");
        assert_eq!(attempt["reported_signature"], "exit:1");
        assert!(
            attempt["summary"]
                .as_str()
                .unwrap()
                .contains("cannot fix it"),
            "{attempt}"
        );
    }
    s.wait_fake("the PR asks for a human", |f| {
        f.labels_on(REPO, n).contains(&"needs feedback".to_owned())
    })
    .await;
}
