//! Executor fault drills (issue 7, items 3 and 4): an executor that dies between a
//! Forgejo call and recording the effect done, and a Forgejo that misbehaves (429
//! with `Retry-After`, an outage of 5xx, hanging and refused connections).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{BOT_MARKER, REPO};
use crate::support::fake_forgejo::{Fault, NewPr};
use crate::support::redis::stream_entries;
use crate::support::scenario::Scenario;

/// Opens a bot PR with green CI that links a new issue; returns (issue, PR).
async fn open_green_bot_pr(s: &Scenario) -> (u64, u64) {
    let fake = &s.fake;
    let issue = fake.create_issue(REPO, "alice", "Widgets need v", "");
    let body = format!("Closes #{issue}\n\n{BOT_MARKER}");
    let n = fake.open_pr(REPO, NewPr::new("agent-bot", "Add v").body(&body));
    let sha = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", "success", "green");
    s.send(&fake.pr_opened(REPO, n)).await;
    (issue, n)
}

/// (7.3) Every effect redelivered as if its executor had died after the Forgejo call
/// and before the done marker: the comments are found by their markers, the merge is
/// not attempted again (the re-read shows it merged), older status updates do not
/// overwrite the newer status comment, and Forgejo ends up unchanged.
#[tokio::test(flavor = "multi_thread")]
async fn executor_crash_before_done_marker_repeats_nothing() {
    let s = Scenario::start("").await;
    let fake = &s.fake;
    let (issue, n) = open_green_bot_pr(&s).await;
    s.wait_phase(REPO, n, "awaiting-review").await;
    let review = fake.add_review(REPO, n, "bob", "APPROVED");
    s.send(&fake.pr_reviewed(REPO, n, review)).await;
    s.wait_phase(REPO, n, "merged").await;
    s.wait_fake("the linked issue is told", |f| {
        !f.comments_on(REPO, issue).is_empty()
    })
    .await;
    s.wait_idle().await;
    let texts = |f: &crate::support::fake_forgejo::FakeForgejo| {
        [n, issue].map(|k| {
            f.comments_on(REPO, k)
                .into_iter()
                .map(|c| (c.id, c.body))
                .collect::<Vec<_>>()
        })
    };
    let comments_before = texts(fake);
    let edits = |f: &crate::support::fake_forgejo::FakeForgejo| {
        f.calls("PATCH", &format!("/repos/{REPO}/issues/comments/*"))
            .len()
    };
    let edits_before = edits(fake);
    let labels_before = fake.labels_on(REPO, n);
    let posts = |f: &crate::support::fake_forgejo::FakeForgejo| {
        f.calls("POST", &format!("/repos/{REPO}/issues/*/comments"))
            .len()
    };
    let (comment_posts, merge_posts) = (posts(fake), fake.calls("POST", "*/merge").len());
    assert_eq!(merge_posts, 1);

    // Forget every done marker and queue every effect again, as a reclaim would.
    let keys = s.shepherd.keys();
    let mut conn = s.redis_conn();
    let entries = stream_entries(&mut conn, &keys.effects(0)).await;
    assert!(
        entries.len() >= 5,
        "a whole PR life of effects: {}",
        entries.len()
    );
    let kinds: Vec<&str> = entries.iter().map(|(_, f)| f["kind"].as_str()).collect();
    for kind in ["merge", "comment", "upsert-comment", "observe"] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
    for (_, fields) in &entries {
        let _: i64 = redis::cmd("DEL")
            .arg(keys.effect_done(0, &fields["id"]))
            .query_async(&mut conn)
            .await
            .unwrap();
        requeue(&mut conn, &keys.effects(0), fields).await;
    }
    s.wait_idle().await;

    assert_eq!(posts(fake), comment_posts, "no comment posted twice");
    assert_eq!(
        fake.calls("POST", "*/merge").len(),
        1,
        "no second merge call"
    );
    assert_eq!(fake.merges().len(), 1);
    assert_eq!(texts(fake), comments_before);
    assert_eq!(
        edits(fake),
        edits_before,
        "older status effects never edit a newer status"
    );
    assert_eq!(fake.labels_on(REPO, n), labels_before);
    s.assert_no_duplicate_comments(REPO, n);
    s.assert_no_duplicate_comments(REPO, issue);
}

/// XADDs an entry with `fields` to `stream`.
async fn requeue(
    conn: &mut crate::support::redis::TestConn,
    stream: &str,
    fields: &HashMap<String, String>,
) {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (k, v) in fields {
        cmd.arg(k).arg(v);
    }
    let _: String = cmd.query_async(conn).await.expect("XADD");
}

/// (7.4) A 429 with `Retry-After: 2` is honoured: the refused comment (the merged
/// notice on the linked issue) is tried again no sooner, posted once, and nothing is
/// reported to the machine as failed.
#[tokio::test(flavor = "multi_thread")]
async fn retry_after_is_honoured() {
    let s = Scenario::start("").await;
    let fake = &s.fake;
    let (issue, n) = open_green_bot_pr(&s).await;
    let notices = format!("/repos/{REPO}/issues/{issue}/comments");
    fake.inject(
        Fault::on("POST", &notices)
            .status_retry_after(429, 2)
            .times(1),
    );
    s.wait_phase(REPO, n, "awaiting-review").await;
    let review = fake.add_review(REPO, n, "bob", "APPROVED");
    s.send(&fake.pr_reviewed(REPO, n, review)).await;
    s.wait_fake("the notice is refused with 429", |f| {
        f.calls("POST", &notices).iter().any(|c| c.status == 429)
    })
    .await;
    let refused = Instant::now();
    s.wait_fake("the notice is posted", |f| {
        f.calls("POST", &notices).iter().any(|c| c.status == 201)
    })
    .await;
    let waited = refused.elapsed();
    assert!(
        waited >= Duration::from_millis(1900),
        "retried after {waited:?}"
    );
    s.wait_idle().await;
    assert_eq!(fake.comments_on(REPO, issue).len(), 1);
    assert_eq!(
        fake.calls("POST", &notices).len(),
        2,
        "one refused, one posted"
    );
    let metrics = s.metrics().await;
    let line = |outcome: &str| {
        metrics.lines().any(|l| {
            l.starts_with("shepherd_effects_total")
                && l.contains("kind=\"comment\"")
                && l.contains(&format!("outcome=\"{outcome}\""))
        })
    };
    assert!(
        line("retried") && line("done") && !line("failed"),
        "{metrics}"
    );
}

/// (7.4) Forgejo down for a while (a hanging request, 30 s of 5xx, refused
/// connections): effects back off, the circuit breaker opens and stops the hammering,
/// and everything completes after recovery with no failure reported to the machine.
#[tokio::test(flavor = "multi_thread")]
async fn forgejo_outage_backs_off_and_recovers() {
    let s = Scenario::start_with_env("", &[("SHEPHERD_FORGEJO_TIMEOUT_MS", "500")]).await;
    let fake = &s.fake;
    // The first read hangs past the client's timeout; then everything answers 503.
    fake.inject(Fault::on("GET", "*").stall(Duration::from_secs(2)).times(1));
    // 30 s of 5xx, as in issue 7's drill 4.
    fake.inject(
        Fault::on("*", "*")
            .status(503)
            .for_duration(Duration::from_secs(30)),
    );
    let body = format!("Adds u.\n\n{BOT_MARKER}");
    let n = fake.open_pr(REPO, NewPr::new("agent-bot", "Add u").body(&body));
    let sha = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", "failure", "red");
    s.send(&fake.pr_opened(REPO, n)).await;
    s.wait_fake("a read hung and Forgejo answers 503", |f| {
        let calls = f.all_calls();
        calls.iter().any(|c| c.status == 504) && calls.iter().any(|c| c.status == 503)
    })
    .await;
    let metrics_during = s.wait_metric("shepherd_forgejo_circuit_open", " 1").await;
    assert!(metrics_during.contains("shepherd_forgejo_circuit_open"));
    // The status page (served by any process) shows the open breaker too.
    let start = Instant::now();
    loop {
        let page = s.status_page().await;
        if page.contains("circuit open, next try in") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the status page never showed the open circuit: {page}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fake.refuse_connections().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    fake.accept_connections().await;

    // Recovery: the dispatch, the claim and the status comment all happen once.
    let deadline = Duration::from_secs(90);
    let start = Instant::now();
    while s.work_items().await.is_empty() || fake.comments_on(REPO, n).is_empty() {
        assert!(
            start.elapsed() < deadline,
            "effects did not complete after recovery"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.wait_idle_for(deadline).await;
    let calls_503 = fake.all_calls().iter().filter(|c| c.status == 503).count();
    assert!(
        calls_503 <= 12,
        "the breaker stops the hammering: {calls_503} calls answered 503"
    );
    let items = s.work_items().await;
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["attempt"], 1, "transient failures are no attempts");
    assert!(
        items[0]["context"]["attempts"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(fake.comments_on(REPO, n).len(), 1);
    assert!(
        fake.labels_on(REPO, n)
            .contains(&"auto/claimed-implementer".to_owned())
    );
    let metrics = s.metrics().await;
    let failed = metrics
        .lines()
        .filter(|l| l.starts_with("shepherd_effects_total") && l.contains("\"failed\""))
        .count();
    assert_eq!(failed, 0, "nothing failed for good: {metrics}");
}
