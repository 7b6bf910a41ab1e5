//! Scenario of issue 28's budgets, end to end (webhooks → worker → executor → dispatch
//! stream, the results API and the ledger): a repository's daily budget runs out → the
//! next PR shows `over-budget` and nothing is dispatched; `/shepherd budget +5` by a
//! user without write access is refused, by a writer it lifts that one PR. The reset
//! of the window is covered with a faked clock in `core::machine::tests::budget` and
//! `worker::budget` (the worker's clock is real here).

use serde_json::Value;

use super::{BOT_MARKER, REPO};
use crate::support::fake_forgejo::NewPr;
use crate::support::scenario::{AGENT_TOKEN, Scenario};

/// Opens a bot PR whose head fails CI.
async fn open_red_bot_pr(s: &Scenario) -> u64 {
    let body = format!("Adds y.\n\n{BOT_MARKER}");
    let n = s
        .fake
        .open_pr(REPO, NewPr::new("agent-bot", "Add y").body(&body));
    let sha = s.fake.head_sha(REPO, n);
    s.fake
        .set_status(REPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&s.fake.pr_opened(REPO, n)).await;
    n
}

/// Reports `item` failed through the results API, with a run that cost `usd` dollars.
async fn report_cost(s: &Scenario, item: &Value, usd: u64) {
    let id = item["id"].as_str().unwrap();
    let body = serde_json::json!({
        "outcome": "failed",
        "usage": {"input_tokens": 1000, "output_tokens": 100, "cost_micros": usd * 1_000_000, "steps": 2},
    });
    let status = reqwest::Client::new()
        .post(s.shepherd.url(&format!("/api/v1/work/{id}/result")))
        .bearer_auth(AGENT_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 202);
}

/// Comments `body` on PR `n` as `user`.
async fn command(s: &Scenario, n: u64, user: &str, body: &str) {
    let c = s.fake.add_comment(REPO, n, user, body);
    s.send(&s.fake.comment_created(REPO, c)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spent_daily_budget_holds_the_next_pr_and_a_writers_grant_lifts_one_pr() {
    let s = Scenario::start("budget_repo_daily_usd = 10.0\nbudget_run_usd = 5.0\n").await;
    let first = open_red_bot_pr(&s).await;
    let items = s.wait_work_items(1).await;
    assert_eq!(items[0]["limits"]["usd_micros"], 5_000_000, "{}", items[0]);
    assert_eq!(items[0]["limits"]["budget_scope"], "run-usd");
    // The run overshot to $6: $4 of the day's $10 are left, a run needs $5.
    report_cost(&s, &items[0], 6).await;
    s.wait_phase(REPO, first, "over-budget").await;
    let second = open_red_bot_pr(&s).await;
    s.wait_phase(REPO, second, "over-budget").await;
    s.wait_idle().await;
    assert_eq!(
        s.work_items().await.len(),
        1,
        "nothing dispatched over budget"
    );
    let why = "the spend cap `repo-daily-usd` has $4.00 left and a run needs $5.00";
    assert_eq!(
        s.comments_containing(REPO, second, why),
        1,
        "the status comment says"
    );
    assert_eq!(
        s.comments_containing(REPO, first, "Cost so far: $6.00 over 1 run"),
        1
    );

    // A user without write access cannot buy more.
    command(&s, second, "mallory", "/shepherd budget +5").await;
    s.wait_fake("mallory is refused", |f| {
        f.comments_on(REPO, second)
            .iter()
            .any(|c| c.body.contains("@mallory only users with write access"))
    })
    .await;
    s.wait_idle().await;
    assert_eq!(s.phase(REPO, second).await, "over-budget");
    assert_eq!(s.work_items().await.len(), 1);

    // A writer lifts this PR (only): its next run may spend the $4 left and the $5.
    s.fake.set_permission(REPO, "carol", "write");
    command(&s, second, "carol", "/shepherd budget +5").await;
    let items = s.wait_work_items(2).await;
    assert_eq!(items[1]["number"], second);
    assert_eq!(items[1]["limits"]["usd_micros"], 9_000_000, "{}", items[1]);
    assert_eq!(items[1]["limits"]["budget_scope"], "repo-daily-usd");
    s.wait_idle().await;
    assert_eq!(
        s.phase(REPO, first).await,
        "over-budget",
        "the other PR stays held"
    );
    assert_eq!(s.work_items().await.len(), 2);
}
