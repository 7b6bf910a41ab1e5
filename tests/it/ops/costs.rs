//! The cost ledger end to end (issue 28): results with usage reported through the
//! HTTP results API and the results stream of the real `shepherd run` are counted once
//! per work id — a re-reported result and a replayed result event change no counter —
//! and `shepherd costs` (`--json`, `--csv`) and `GET /api/v1/admin/costs` show figures
//! equal to the sums of the usages reported.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{ADMIN, REPO, Scenario, WAIT};
use crate::support::poll_until_named;

/// The agent token of these scenarios.
const AGENT: &str = "it-agent-token-0123456789";

/// The active work id of PR `n`'s stored record, if any.
async fn active_work(s: &Scenario, n: u64) -> Option<String> {
    let (_, record) = s.record(n).await;
    record["work"]["active"]["item"]["id"]
        .as_str()
        .map(str::to_owned)
}

/// Opens a PR whose CI fails and waits for its `ci-fix`; returns (PR, work id).
async fn pr_with_work(s: &Scenario, title: &str) -> (u64, String) {
    let n = s.open_pr("alice", title);
    let sha = s.fake.head_sha(REPO, n);
    s.fake
        .set_status(REPO, &sha, "ci/test", "failure", "3 tests failed");
    s.send(&s.fake.pr_opened(REPO, n)).await;
    poll_until_named(WAIT, "a ci-fix is dispatched", || async {
        active_work(s, n).await.is_some()
    })
    .await;
    (n, active_work(s, n).await.unwrap())
}

/// A usage as the runner reports it.
fn usage(input: u64, output: u64, cost_micros: u64) -> Value {
    json!({
        "input_tokens": input,
        "output_tokens": output,
        "reasoning_tokens": 3,
        "cache_read_tokens": 40,
        "cost_micros": cost_micros,
        "model": "stub/model",
        "steps": 2,
        "tool_calls": 1,
        "wall_ms": 900
    })
}

/// POSTs a result with `usage` to the results API; returns the status.
async fn report(s: &Scenario, work_id: &str, usage: &Value) -> u16 {
    s.http
        .post(s.app.url(&format!("/api/v1/work/{work_id}/result")))
        .bearer_auth(AGENT)
        .json(&json!({"outcome": "failed", "signature": "ci:test", "usage": usage}))
        .send()
        .await
        .expect("results API answers")
        .status()
        .as_u16()
}

/// Every ledger hash of the scenario, field by field (the counters and the runs).
async fn ledger_snapshot(s: &Scenario) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut conn = s.conn.clone();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{}:ledger}}:*", s.prefix))
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for k in keys {
        let all: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
        out.insert(k, all);
    }
    out
}

/// Waits until PR `n`'s active work is no longer `work_id` (its result was folded).
async fn wait_folded(s: &Scenario, n: u64, work_id: &str) {
    poll_until_named(WAIT, "the result is folded into the record", || async {
        active_work(s, n).await.as_deref() != Some(work_id)
    })
    .await;
}

#[tokio::test]
async fn ledger_counts_reported_usage_once_and_costs_shows_the_sums() {
    let s = Scenario::start(&[("SHEPHERD_AGENT_TOKEN", AGENT)]).await;
    let (n, w1) = pr_with_work(&s, "First").await;
    let (m, w2) = pr_with_work(&s, "Second").await;

    // PR n through the HTTP results API, PR m through the results stream.
    assert_eq!(report(&s, &w1, &usage(1_000, 200, 1_500)).await, 202);
    let entry = json!({"id": w2, "outcome": "failed", "usage": usage(3_000, 400, 2_500)});
    let _: String = redis::cmd("XADD")
        .arg(s.keys().results())
        .arg("*")
        .arg("result")
        .arg(entry.to_string())
        .query_async(&mut s.conn.clone())
        .await
        .unwrap();
    wait_folded(&s, n, &w1).await;
    wait_folded(&s, m, &w2).await;
    let counted = ledger_snapshot(&s).await;

    // A re-reported result, even with other figures: refused and not counted.
    assert_eq!(report(&s, &w1, &usage(9_999, 9_999, 999_999)).await, 409);
    // A replayed result event goes through the core again, not through the ledger.
    let replay = s.cli_json(&["replay", "--delivery", &format!("result:{w1}"), "--json"]);
    let original = replay["replayed"][0]["original"]
        .as_str()
        .unwrap()
        .to_owned();
    s.wait_history(n, "the replayed result is committed", |h| {
        h.get("replay") == Some(&original)
    })
    .await;
    assert_eq!(
        ledger_snapshot(&s).await,
        counted,
        "a re-report and a replay change no counter"
    );

    let costs = s.cli_json(&["costs", "--days", "1", "--json"]);
    let prs = costs["prs"].as_array().unwrap();
    let pr = |k: u64| {
        prs.iter()
            .find(|p| p["number"] == k)
            .unwrap_or_else(|| panic!("PR {k} in {costs}"))
    };
    assert_eq!(prs.len(), 2, "{costs}");
    assert_eq!(prs[0]["number"], m, "the most expensive first");
    for (k, input, output, micros) in [(n, 1_000, 200, 1_500), (m, 3_000, 400, 2_500)] {
        let p = pr(k);
        assert_eq!(p["repo"], REPO);
        assert_eq!(p["input_tokens"], input);
        assert_eq!(p["output_tokens"], output);
        assert_eq!(p["usd_micros"], micros);
        assert_eq!(p["usd"].as_f64().unwrap(), micros as f64 / 1e6);
        assert_eq!(p["runs"], 1);
    }
    let repos = costs["repos"].as_array().unwrap();
    assert_eq!(repos.len(), 1, "one repository, one day: {costs}");
    let day = &repos[0];
    assert_eq!(day["repo"], REPO);
    assert_eq!(day["day"], costs["to"]);
    assert_eq!(day["input_tokens"], 4_000);
    assert_eq!(day["output_tokens"], 600);
    assert_eq!(day["reasoning_tokens"], 6);
    assert_eq!(day["cache_read_tokens"], 80);
    assert_eq!(day["usd_micros"], 4_000);
    assert_eq!(day["runs"], 2);
    assert_eq!(costs["total"]["usd_micros"], 4_000);
    let kinds = costs["kinds"].as_array().unwrap();
    assert_eq!(kinds.len(), 1, "{costs}");
    assert_eq!(kinds[0]["group"], "ci-fix");
    assert_eq!(kinds[0]["runs"], 2);
    assert_eq!(costs["tiers"][0]["group"], "0");

    // The admin API serves the same report; CSV too; only with the admin token.
    let admin = |q: &str| {
        s.http
            .get(s.app.url(&format!("/api/v1/admin/costs{q}")))
            .bearer_auth(ADMIN)
            .send()
    };
    let served: Value = admin("?days=1").await.unwrap().json().await.unwrap();
    assert_eq!(served, costs);
    let csv = admin("?days=1&format=csv")
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let cli_csv = String::from_utf8(s.cli(&["costs", "--days", "1", "--csv"]).stdout).unwrap();
    assert_eq!(csv, cli_csv);
    assert!(
        csv.lines()
            .any(|l| l.starts_with(&format!("pr,{REPO},,{m},,0.002500,3000,400,"))),
        "{csv}"
    );
    assert_eq!(admin("?days=nope").await.unwrap().status().as_u16(), 400);
    assert_eq!(
        admin("?days=1&bogus=1").await.unwrap().status().as_u16(),
        400
    );
    let anonymous = s
        .http
        .get(s.app.url("/api/v1/admin/costs"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);

    // `inspect` shows the PR's runs with their usage.
    let inspected = s.cli_json(&["inspect", &format!("{REPO}#{m}"), "--json"]);
    let runs = inspected["costs"]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{inspected}");
    assert_eq!(runs[0]["work_id"], w2);
    assert_eq!(runs[0]["kind"], "ci-fix");
    assert_eq!(runs[0]["usage"]["input_tokens"], 3_000);
    assert_eq!(runs[0]["usage"]["model"], "stub/model");
    assert_eq!(inspected["costs"]["total"]["usd_micros"], 2_500);
    let text = String::from_utf8(s.cli(&["inspect", &format!("{REPO}#{m}")]).stdout).unwrap();
    assert!(
        text.contains("cost      $0.002500 so far, 1 runs"),
        "{text}"
    );
    assert!(
        text.contains(&format!("{w2} ci-fix tier 0 failed")) && text.contains("3000 in / 400 out"),
        "{text}"
    );

    // The status page's figures: the repository today and this month, the open PRs by
    // cost.
    let status: Value = s
        .http
        .get(s.app.url("/api/v1/admin/status"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let spend = &status["spend"][0];
    assert_eq!(spend["repo"], REPO, "{status}");
    assert_eq!(spend["today"]["usd_micros"], 4_000);
    assert_eq!(spend["month"]["runs"], 2);
    assert_eq!(spend["budget_left"], Value::Null, "no cap in this policy");
    let expensive: Vec<u64> = status["expensive_prs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["number"].as_u64().unwrap())
        .collect();
    assert_eq!(expensive, [m, n]);

    // Another repository filtered out, a day range with nothing.
    let other = s.cli_json(&["costs", "--repo", "other/repo", "--json"]);
    assert!(other["repos"].as_array().unwrap().is_empty());
    assert_eq!(other["total"]["runs"], 0);
    let long_ago = s.cli_json(&[
        "costs",
        "--from",
        "2001-01-01",
        "--to",
        "2001-01-31",
        "--json",
    ]);
    assert!(long_ago["prs"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn budget_left_shows_on_the_status_page_and_in_the_remaining_budget_gauge() {
    use std::io::Write as _;
    let mut policy = tempfile::NamedTempFile::new().unwrap();
    write!(
        policy,
        "{}budget_repo_daily_usd = 1.0\nbudget_instance_monthly_usd = 50.0\n",
        crate::support::QUIET_POLICY
    )
    .unwrap();
    let config = policy.path().to_str().unwrap().to_owned();
    let s = Scenario::start(&[
        ("SHEPHERD_AGENT_TOKEN", AGENT),
        ("SHEPHERD_CONFIG", config.as_str()),
    ])
    .await;
    let (n, w) = pr_with_work(&s, "Costly").await;
    assert_eq!(report(&s, &w, &usage(10, 10, 250_000)).await, 202);
    wait_folded(&s, n, &w).await;

    let metrics = || async {
        s.http
            .get(s.app.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let repo_line = format!("shepherd_budget_remaining_usd{{scope=\"repo-daily:{REPO}\"}} 0.75");
    poll_until_named(WAIT, "the gauge is sampled after the run", || async {
        metrics().await.contains(&repo_line)
    })
    .await;
    let text = metrics().await;
    assert!(
        text.contains("shepherd_budget_remaining_usd{scope=\"instance-monthly\"} 49.75"),
        "{text}"
    );
    assert!(
        !text.contains("scope=\"repo-monthly"),
        "no series for a cap that is not set"
    );

    let status: Value = s
        .http
        .get(s.app.url("/api/v1/admin/status"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let left = &status["spend"][0]["budget_left"];
    assert_eq!(left["usd_micros"], 750_000, "{status}");
    assert_eq!(left["usd_scope"], "repo-daily");
    drop(policy);
}
