//! The dispatch path's budget check on a real redis-server (`worker::dispatch::
//! budget_gate`, issue 28): it reads what the repository spent today from the ledger,
//! holds a PR's work back once the daily budget cannot pay for a run, lets another
//! repository's work go, lets it go again when the day resets (the clock is the
//! check's argument), and counts the PR's grant from its record.

use shepherd::core::budget::Stop;
use shepherd::core::effect::WorkItem;
use shepherd::core::ids::RepoName;
use shepherd::core::policy::Policy;
use shepherd::core::record::PrRecord;
use shepherd::core::usage::Usage;
use shepherd::store::ledger::{self, RunEntry};
use shepherd::store::{Keys, Store};
use shepherd::worker::dispatch::{Gate, budget_gate};

use crate::support::redis::RedisServer;

/// Now, unix ms.
fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A finished run of `repo`'s PR `number` that cost `usd` dollars, at `at_ms`.
fn spent(repo: &str, number: u64, seq: u64, usd: u64, at_ms: i64) -> RunEntry {
    let repo: RepoName = repo.parse().unwrap();
    RunEntry {
        work_id: format!("{}:{}:pr:{number}:{seq}", repo.owner(), repo.name()),
        repo,
        number,
        issue: false,
        kind: "ci-fix".into(),
        tier: 0,
        at_ms,
        outcome: "failed".into(),
        usage: Usage {
            input_tokens: 100,
            output_tokens: 10,
            cost_micros: usd * 1_000_000,
            ..Usage::default()
        },
    }
}

/// A `ci-fix` work item for `repo`'s PR `number`, as the record dispatched it.
fn item(repo: &str, number: u64) -> WorkItem {
    let (owner, name) = repo.split_once('/').unwrap();
    serde_json::from_value(serde_json::json!({
        "id": format!("{owner}:{name}:pr:{number}:9"),
        "kind": "ci-fix", "repo": repo, "number": number,
        "head_sha": "0123456789abcdef0123456789abcdef01234567",
        "tier": 0, "tier_name": "small", "attempt": 1, "priority": 50,
        "claim_expires_at": (chrono::Utc::now() + chrono::Duration::hours(2)).to_rfc3339(),
        "context": {"failing_checks": [], "change_requests": [], "attempts": []},
        "limits": {"max_steps": 40}
    }))
    .unwrap()
}

#[tokio::test]
async fn budget_gate_holds_work_back_once_the_days_budget_is_spent_and_lets_it_go_after_the_reset()
{
    let redis = RedisServer::start();
    let store = Store::connect(&redis.url(), Keys::new("bud1", 4))
        .await
        .unwrap();
    let keys = store.keys().clone();
    let mut conn = store.conn();
    let policy = Policy {
        budget_repo_daily_usd: 10.0,
        budget_run_usd: 5.0,
        ..Policy::default()
    };
    let now = now_ms();
    // Other PRs of acme/widgets spent nine of today's ten dollars.
    for (n, usd) in [(1, 4), (2, 5)] {
        let run = spent("acme/widgets", n, 1, usd, now);
        assert!(ledger::record(&mut conn, &keys, &run).await.unwrap());
    }
    let pr = item("acme/widgets", 12);
    let gate = budget_gate(&mut conn, &keys, &policy, &pr, now)
        .await
        .unwrap();
    let reset = shepherd::core::budget::next_utc_day(now);
    assert_eq!(
        gate,
        Gate::Stop(Stop {
            cap: "repo-daily-usd".into(),
            left: 1_000_000,
            needed: 5_000_000,
            tokens: false,
            resets_at_ms: reset,
        }),
        "one dollar left, a run needs five: held back"
    );
    // Another repository's budget is its own.
    let other = item("acme/gadgets", 3);
    let Gate::Go(sent) = budget_gate(&mut conn, &keys, &policy, &other, now)
        .await
        .unwrap()
    else {
        panic!("acme/gadgets has spent nothing");
    };
    assert_eq!(sent.limits.usd_micros, Some(5_000_000));
    assert_eq!(sent.limits.budget_scope.as_deref(), Some("run-usd"));
    assert_eq!(sent.limits.max_steps, Some(40), "the guards stay");
    // The next UTC day: nothing spent yet, the work goes with the run's cap.
    let tomorrow = reset.unwrap() + 60_000;
    let Gate::Go(sent) = budget_gate(&mut conn, &keys, &policy, &pr, tomorrow)
        .await
        .unwrap()
    else {
        panic!("the daily budget reset");
    };
    assert_eq!(sent.limits.usd_micros, Some(5_000_000));
    // A grant of five dollars in the PR's record lifts it today.
    let mut record = PrRecord::new("acme/widgets".parse().unwrap(), 12);
    record.work.budget.grant.usd_micros = 5_000_000;
    let _: () = redis::cmd("HSET")
        .arg(keys.pr_record("acme/widgets", 12))
        .arg("v")
        .arg(1)
        .arg("data")
        .arg(record.to_json())
        .query_async(&mut conn)
        .await
        .unwrap();
    let Gate::Go(sent) = budget_gate(&mut conn, &keys, &policy, &pr, now)
        .await
        .unwrap()
    else {
        panic!("the grant lifts the PR");
    };
    assert_eq!(sent.limits.usd_micros, Some(6_000_000));
    assert_eq!(sent.limits.budget_scope.as_deref(), Some("repo-daily-usd"));
    // Without caps, nothing is read and the item goes as it is.
    let free = budget_gate(&mut conn, &keys, &Policy::default(), &pr, now)
        .await
        .unwrap();
    assert_eq!(free, Gate::Go(Box::new(pr.clone())));
}
