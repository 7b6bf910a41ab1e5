//! The outage drill: with Shepherd down, PRs change on Forgejo (CI fails, a review
//! approves, a PR is opened and another closed) and no webhook arrives; after the
//! restart `shepherd resync` — and the workers' periodic resync — bring every record
//! to the right phase, and the effects happen exactly once.

use std::collections::HashMap;

use super::{REPO, Scenario, WAIT};
use crate::support::fake_forgejo::NewPr;
use crate::support::poll_until_named;

/// The phase of PR `n`'s latest history entry.
async fn phase(s: &Scenario, n: u64) -> String {
    s.history(n)
        .await
        .last()
        .map(|h| h["phase"].clone())
        .unwrap_or_default()
}

/// Waits until PR `n`'s latest phase is one of `phases`.
async fn wait_phase(s: &Scenario, n: u64, phases: &[&str]) {
    poll_until_named(WAIT, &format!("#{n} reaches {phases:?}"), || async {
        phases.contains(&phase(s, n).await.as_str())
    })
    .await;
}

/// Effect kinds of PR `n` with their counts.
async fn kinds(s: &Scenario, n: u64) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for (k, _) in s.effects_of(n).await {
        *out.entry(k).or_default() += 1;
    }
    out
}

/// Number of `resync` events committed to PR `n`'s history.
async fn resyncs(s: &Scenario, n: u64) -> usize {
    s.history(n)
        .await
        .iter()
        .filter(|h| h["event"] == "resync")
        .count()
}

#[tokio::test]
async fn outage_drill_resync_brings_every_record_to_the_right_phase_once() {
    let mut s = Scenario::start(&[]).await;
    let red = s.open_pr("alice", "Goes red during the outage");
    let green = s.fake.open_pr(
        REPO,
        // A bot PR (one approval) by its author, the bot login; the marker alone is not enough.
        NewPr::new(s.fake.bot_login(), "Approved during the outage"),
    );
    let gone = s.open_pr("carol", "Closed during the outage");
    for n in [red, green, gone] {
        let d = s.send(&s.fake.pr_opened(REPO, n)).await;
        s.wait_delivery(n, &d).await;
    }
    for n in [red, green] {
        assert_eq!(phase(&s, n).await, "awaiting-ci", "#{n} before the outage");
    }

    // Outage: Shepherd is down; Forgejo changes and its webhooks are lost for good.
    s.stop_app();
    let red_sha = s.fake.head_sha(REPO, red);
    s.fake
        .set_status(REPO, &red_sha, "ci/test", "failure", "3 tests failed");
    let green_sha = s.fake.head_sha(REPO, green);
    s.fake
        .set_status(REPO, &green_sha, "ci/test", "success", "all good");
    s.fake.add_review(REPO, green, "bob", "APPROVED");
    s.fake.close(REPO, gone);
    let new = s.open_pr("dave", "Opened during the outage");
    s.restart_app().await;

    let report = s.cli_json(&["resync", "--repo", REPO]);
    let repo = &report["repos"][0];
    let mut open: Vec<u64> = repo["open_prs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    open.sort_unstable();
    assert_eq!(open, [red, green, new]);
    assert_eq!(repo["no_longer_open"], serde_json::json!([gone]));
    assert_eq!(repo["errors"], serde_json::json!([]));
    let listed = s.fake.calls("GET", &format!("/repos/{REPO}/pulls"));
    assert!(
        listed
            .iter()
            .all(|c| c.query_param("state") == Some("open")),
        "always state=open"
    );

    wait_phase(&s, red, &["ci-fix"]).await;
    // The executor re-reads the reviews and merges.
    wait_phase(&s, green, &["merged"]).await;
    wait_phase(&s, gone, &["closed"]).await;
    poll_until_named(
        WAIT,
        "the PR opened during the outage has a record",
        || async { s.record(new).await.0 > 0 },
    )
    .await;
    let red_fx = kinds(&s, red).await;
    assert_eq!(
        red_fx.get("dispatch"),
        Some(&1),
        "one ci-fix dispatched: {red_fx:?}"
    );

    // More resyncs change nothing: one ci-fix dispatched, one merge.
    for round in 2..=3 {
        let seen = resyncs(&s, red).await;
        let red_before = kinds(&s, red).await;
        s.cli_json(&["resync", "--all"]);
        poll_until_named(WAIT, &format!("resync {round} is processed"), || async {
            resyncs(&s, red).await > seen
        })
        .await;
        assert_eq!(
            kinds(&s, red).await,
            red_before,
            "no new effects for the red PR"
        );
    }
    assert_eq!(kinds(&s, red).await.get("dispatch"), Some(&1));
    let merges = s.fake.merges();
    assert_eq!(merges.len(), 1, "merged exactly once: {merges:?}");
    let dispatched: Vec<serde_json::Value> = s
        .entries(&s.keys().dispatch())
        .await
        .into_iter()
        .map(|(_, f)| serde_json::from_str(&f["work"]).unwrap())
        .collect();
    assert_eq!(dispatched.len(), 1, "{dispatched:?}");
    assert_eq!(dispatched[0]["number"], red);
    assert_eq!(dispatched[0]["kind"], "ci-fix");
    let last: Option<i64> = redis::cmd("GET")
        .arg(s.keys().last_resync())
        .query_async(&mut s.conn.clone())
        .await
        .unwrap();
    assert!(last.is_some(), "the last resync time is recorded");
    s.assert_no_duplicate_writes();
}

#[tokio::test]
async fn workers_resync_periodically_one_at_a_time() {
    let s = Scenario::start(&[("SHEPHERD_RESYNC_INTERVAL_SECS", "1")]).await;
    // One webhook makes the repository known; the other PR is never announced.
    let known = s.open_pr("alice", "Announced");
    let d = s.send(&s.fake.pr_opened(REPO, known)).await;
    s.wait_delivery(known, &d).await;
    let silent = s.open_pr("bob", "Never announced");
    let sha = s.fake.head_sha(REPO, silent);
    s.fake
        .set_status(REPO, &sha, "ci/test", "failure", "broken");
    wait_phase(&s, silent, &["ci-fix"]).await;
    // One read, so the lock cannot expire between two commands: -2 = no lock right
    // now, 0..=1000 = held with the interval as its expiry; -1 (a lock without expiry)
    // would stop every other worker forever.
    let pttl: i64 = redis::cmd("PTTL")
        .arg(s.keys().resync_lock())
        .query_async(&mut s.conn.clone())
        .await
        .unwrap();
    assert!(
        pttl == -2 || (0..=1000).contains(&pttl),
        "the resync lock expires: PTTL {pttl}"
    );
    // The pass records its end after queueing its observations, so the PR can reach
    // its phase a moment before the time is written.
    poll_until_named(WAIT, "the resync time is recorded", || {
        let mut conn = s.conn.clone();
        let key = s.keys().last_resync();
        async move {
            let last: Option<i64> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            last.is_some()
        }
    })
    .await;
}
