//! Scenarios that end in (or refuse) a merge: (1) a bot PR from red CI to merged,
//! (2) a human PR needing two approvals, (4) the head moving between readiness and
//! merge, (5) a merge answered with 500 that did go through.

use serde_json::Value;

use super::{BOT_MARKER, REPO, labels_added, writes};
use crate::support::fake_forgejo::{Fault, NewPr};
use crate::support::scenario::Scenario;

/// The path of PR `n`'s merge endpoint.
fn merge_path(n: u64) -> String {
    format!("/repos/{REPO}/pulls/{n}/merge")
}

/// Opens a bot PR linking a new issue, with CI `state` on its head; returns
/// (issue, PR, head sha).
async fn open_bot_pr(s: &Scenario, state: &str) -> (u64, u64, String) {
    let fake = &s.fake;
    let issue = fake.create_issue(REPO, "alice", "Widgets need x", "Please add x.");
    let body = format!("Adds x.\n\nCloses #{issue}\n\n{BOT_MARKER}");
    let n = fake.open_pr(REPO, NewPr::new("agent-bot", "Add x").body(&body));
    let sha = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", state, "tests");
    s.send(&fake.pr_opened(REPO, n)).await;
    (issue, n, sha)
}

/// Approves PR `n` as `reviewer` and sends the review webhook.
async fn approve(s: &Scenario, n: u64, reviewer: &str) {
    let id = s.fake.add_review(REPO, n, reviewer, "APPROVED");
    s.send(&s.fake.pr_reviewed(REPO, n, id)).await;
}

/// Checks one merge request body: pinned head, style, branch deletion, no force.
fn assert_merge_body(body: &Value, head: &str, style: &str) {
    assert_eq!(body["Do"], style, "{body}");
    assert_eq!(body["head_commit_id"], head, "{body}");
    assert_eq!(body["delete_branch_after_merge"], true, "{body}");
    assert!(
        body.get("force_merge").is_none(),
        "never force_merge: {body}"
    );
    assert!(body.get("merge_when_checks_succeed").is_none(), "{body}");
}

/// (1) Bot PR: opened → CI pending (polled) → failing → `ci-fix` dispatched with the
/// failing checks and the claim label → the agent pushes and reports → CI green → one
/// approval → merged with `head_commit_id` and the configured style, never
/// `force_merge` → the linked issue gets a comment.
#[tokio::test(flavor = "multi_thread")]
async fn scenario_1_bot_pr_from_red_ci_to_merged() {
    let s = Scenario::start("merge_style = \"rebase\"\n").await;
    let _ = bot_pr_from_red_ci_to_merged(&s).await;
    // The executor's metrics: effects by kind and outcome, lag to "executed".
    let metrics = s.metrics().await;
    let has = |prefix: &str, parts: &[&str]| {
        metrics
            .lines()
            .any(|l| l.starts_with(prefix) && parts.iter().all(|p| l.contains(p)))
    };
    assert!(has(
        "shepherd_effects_total",
        &["kind=\"merge\"", "outcome=\"done\""]
    ));
    assert!(has(
        "shepherd_effects_total",
        &["kind=\"dispatch\"", "outcome=\"done\""]
    ));
    assert!(
        has("shepherd_lag_seconds_count", &["stage=\"executed\""]),
        "{metrics}"
    );
}

/// (1) again with `shepherd serve` and `shepherd work` as separate processes.
#[tokio::test(flavor = "multi_thread")]
async fn scenario_1_with_separate_serve_and_work_processes() {
    let s = Scenario::start_split("merge_style = \"rebase\"\n").await;
    let _ = bot_pr_from_red_ci_to_merged(&s).await;
}

/// The body of scenario (1).
/// Returns the PR's number.
pub(crate) async fn bot_pr_from_red_ci_to_merged(s: &Scenario) -> u64 {
    let fake = &s.fake;
    let (issue, n, sha1) = open_bot_pr(s, "pending").await;
    let status_path = format!("/repos/{REPO}/commits/{sha1}/status");
    s.wait_fake("the pending head's CI is polled again", |f| {
        f.calls("GET", &status_path).len() >= 2
    })
    .await;
    assert!(
        s.work_items().await.is_empty(),
        "nothing to fix while pending"
    );

    fake.set_status(REPO, &sha1, "ci/test", "failure", "3 tests failed");
    let items = s.wait_work_items(1).await;
    let item = &items[0];
    assert_eq!(item["kind"], "ci-fix");
    assert_eq!(item["repo"], REPO);
    assert_eq!(item["number"], n);
    assert_eq!(item["head_sha"], sha1.as_str());
    assert_eq!(
        (item["tier"].as_u64(), item["tier_name"].as_str()),
        (Some(0), Some("haiku"))
    );
    assert_eq!(item["attempt"], 1);
    let failing = &item["context"]["failing_checks"];
    assert_eq!(failing[0]["context"], "ci/test", "{item}");
    assert_eq!(failing[0]["description"], "3 tests failed");
    s.wait_fake("the PR is claimed", |f| {
        f.labels_on(REPO, n)
            .contains(&"auto/claimed-implementer".to_owned())
    })
    .await;
    assert!(
        fake.labels_on(REPO, n)
            .contains(&"auto/last-attempt-tier-0".to_owned())
    );

    // The agent pushes a fix and reports; the claim ends.
    let sha2 = "2222222222222222222222222222222222222222";
    fake.push(REPO, n, sha2);
    s.send(&fake.pr_synchronized(REPO, n, "agent-bot")).await;
    let work_id = item["id"].as_str().unwrap();
    let reported = s.report(work_id, "succeeded", None).await;
    assert!(matches!(reported, 202 | 409), "result answered {reported}");
    s.wait_fake("the claim label is removed", |f| {
        !f.labels_on(REPO, n)
            .contains(&"auto/claimed-implementer".to_owned())
    })
    .await;

    fake.set_status(REPO, sha2, "ci/test", "success", "all green");
    s.wait_phase(REPO, n, "awaiting-review").await;
    assert!(fake.merges().is_empty(), "no merge without an approval");
    approve(s, n, "bob").await;

    s.wait_fake("the PR is merged", |f| !f.merges().is_empty())
        .await;
    s.wait_fake("the linked issue gets a comment", |f| {
        f.comments_on(REPO, issue)
            .iter()
            .any(|c| c.body.contains(&format!("#{n}")))
    })
    .await;
    s.wait_phase(REPO, n, "merged").await;
    s.wait_idle().await;

    let merges = fake.merges();
    assert_eq!(merges.len(), 1);
    assert_eq!(merges[0].merged_sha, sha2);
    assert_merge_body(&merges[0].body, sha2, "rebase");
    assert_eq!(
        fake.calls("POST", &merge_path(n)).len(),
        1,
        "one merge call"
    );
    assert_eq!(s.work_items().await.len(), 1, "one dispatch in all");
    s.assert_no_duplicate_dispatch().await;
    s.assert_no_duplicate_comments(REPO, n);
    s.assert_no_duplicate_comments(REPO, issue);
    assert_eq!(s.comments_containing(REPO, issue, &format!("#{n}")), 1);
    let claimed = labels_added(fake, n)
        .iter()
        .filter(|l| *l == "auto/claimed-implementer")
        .count();
    assert_eq!(claimed, 1, "claimed once: {:?}", writes(fake));
    // Every write Shepherd made is one of: labels, comments, the merge.
    for w in writes(fake) {
        let known = w.contains("/labels") || w.contains("/comments") || w.ends_with("/merge");
        assert!(known, "unexpected write {w}");
    }
    for c in fake
        .comments_on(REPO, n)
        .iter()
        .chain(&fake.comments_on(REPO, issue))
    {
        assert_eq!(c.user, fake.bot_login());
        assert!(
            c.body.ends_with("---\n**Automated by Shepherd**"),
            "{}",
            c.body
        );
    }
    n
}

/// (2) Human PR: two approvals are needed; a change request dispatches
/// `review-feedback` and blocks the merge until the reviewer approves the new head.
#[tokio::test(flavor = "multi_thread")]
async fn scenario_2_human_pr_needs_two_approvals_and_no_change_requests() {
    let s = Scenario::start("").await;
    let fake = &s.fake;
    // alice has write access: her PR gets agent work (agent_authors = "writers").
    fake.set_permission(REPO, "alice", "write");
    let n = fake.open_pr(
        REPO,
        NewPr::new("alice", "Refactor widgets").body("By hand."),
    );
    let sha1 = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha1, "ci/test", "success", "green");
    s.send(&fake.pr_opened(REPO, n)).await;
    s.wait_phase(REPO, n, "awaiting-review").await;

    approve(&s, n, "bob").await;
    s.wait_idle().await;
    assert_eq!(
        s.phase(REPO, n).await,
        "awaiting-review",
        "one approval is not enough"
    );

    let rc = fake.add_review(REPO, n, "carol", "REQUEST_CHANGES");
    fake.update_review(REPO, rc, |r| r.body = "Please rename Widget::x".into());
    s.send(&fake.pr_reviewed(REPO, n, rc)).await;
    let items = s.wait_work_items(1).await;
    let item = &items[0];
    assert_eq!(item["kind"], "review-feedback");
    assert_eq!(item["head_sha"], sha1.as_str());
    let asks = &item["context"]["change_requests"];
    assert_eq!(asks[0]["reviewer"], "carol", "{item}");
    assert_eq!(asks[0]["body"], "Please rename Widget::x");
    s.wait_phase(REPO, n, "review-feedback").await;

    // A second approval does not merge while carol's change request stands.
    approve(&s, n, "dave").await;
    s.wait_idle().await;
    assert!(
        fake.merges().is_empty(),
        "a change request blocks the merge"
    );
    assert!(fake.calls("POST", &merge_path(n)).is_empty());

    // The agent pushes; the new head is green; everyone approves it.
    let sha2 = "3333333333333333333333333333333333333333";
    fake.push(REPO, n, sha2);
    fake.set_status(REPO, sha2, "ci/test", "success", "green");
    s.send(&fake.pr_synchronized(REPO, n, "agent-bot")).await;
    s.report(item["id"].as_str().unwrap(), "succeeded", None)
        .await;
    approve(&s, n, "carol").await;
    s.wait_phase(REPO, n, "awaiting-review").await;
    assert!(
        fake.merges().is_empty(),
        "approvals of the old head are stale"
    );
    approve(&s, n, "bob").await;

    s.wait_fake("the PR is merged", |f| !f.merges().is_empty())
        .await;
    s.wait_phase(REPO, n, "merged").await;
    s.wait_idle().await;
    assert_eq!(fake.calls("POST", &merge_path(n)).len(), 1);
    assert_merge_body(&fake.merges()[0].body, sha2, "squash");
    assert_eq!(
        s.work_items().await.len(),
        1,
        "one review-feedback dispatch"
    );
    s.assert_no_duplicate_dispatch().await;
    s.assert_no_duplicate_comments(REPO, n);
}

/// (4) The head moves between readiness and the merge call: Forgejo answers 409
/// "head out of date", the old head is not merged, and the new head goes through CI
/// (and review) before it is merged.
#[tokio::test(flavor = "multi_thread")]
async fn scenario_4_head_moves_between_readiness_and_merge() {
    let s = Scenario::start("").await;
    let fake = &s.fake;
    let (_issue, n, sha1) = open_bot_pr(&s, "success").await;
    s.wait_phase(REPO, n, "awaiting-review").await;
    // Hold the merge call long enough to push under it.
    fake.inject(
        Fault::on("POST", &merge_path(n))
            .delay(std::time::Duration::from_millis(1500))
            .times(1),
    );
    approve(&s, n, "bob").await;
    s.wait_fake("the merge call is in flight", |f| {
        f.calls("POST", &merge_path(n))
            .iter()
            .any(|c| c.status == 0)
    })
    .await;
    let sha2 = "4444444444444444444444444444444444444444";
    fake.set_status(REPO, sha2, "ci/test", "pending", "running");
    fake.push(REPO, n, sha2);
    s.send(&fake.pr_synchronized(REPO, n, "agent-bot")).await;
    s.wait_fake("Forgejo refused the old head with 409", |f| {
        f.calls("POST", &merge_path(n))
            .first()
            .is_some_and(|c| c.status == 409)
    })
    .await;
    let status2 = format!("/repos/{REPO}/commits/{sha2}/status");
    s.wait_fake("the new head's CI is read", |f| {
        !f.calls("GET", &status2).is_empty()
    })
    .await;
    s.wait_phase(REPO, n, "awaiting-ci").await;
    assert!(fake.merges().is_empty(), "the old head is never merged");

    fake.set_status(REPO, sha2, "ci/test", "success", "green");
    s.wait_phase(REPO, n, "awaiting-review").await;
    assert_eq!(
        fake.calls("POST", &merge_path(n)).len(),
        1,
        "no merge before re-review"
    );
    approve(&s, n, "bob").await;
    s.wait_fake("the new head is merged", |f| !f.merges().is_empty())
        .await;
    s.wait_idle().await;

    let calls = fake.calls("POST", &merge_path(n));
    assert_eq!(calls.len(), 2, "one refused, one merged");
    assert_merge_body(&calls[0].body, &sha1, "squash");
    assert_merge_body(&calls[1].body, sha2, "squash");
    assert_eq!(calls[1].status, 200);
    assert_eq!(fake.merges()[0].merged_sha, sha2);
    assert!(s.work_items().await.is_empty(), "nothing dispatched");
    s.assert_no_duplicate_comments(REPO, n);
}

/// (5) The merge call answers 500 although Forgejo merged: the executor re-reads the
/// PR, reports it merged, and never calls merge again.
#[tokio::test(flavor = "multi_thread")]
async fn scenario_5_merge_answers_500_but_merged() {
    let s = Scenario::start("").await;
    let fake = &s.fake;
    let (issue, n, sha) = open_bot_pr(&s, "success").await;
    s.wait_phase(REPO, n, "awaiting-review").await;
    fake.inject(Fault::on("POST", &merge_path(n)).apply_then(500).times(1));
    approve(&s, n, "bob").await;
    s.wait_phase(REPO, n, "merged").await;
    s.wait_fake("the linked issue gets a comment", |f| {
        f.comments_on(REPO, issue)
            .iter()
            .any(|c| c.body.contains(&format!("#{n}")))
    })
    .await;
    s.wait_idle().await;

    let calls = fake.calls("POST", &merge_path(n));
    assert_eq!(calls.len(), 1, "no second merge call");
    assert_eq!(calls[0].status, 500);
    assert_merge_body(&calls[0].body, &sha, "squash");
    assert_eq!(fake.merges().len(), 1);
    assert!(fake.issue(REPO, n).state == "closed");
    assert_eq!(s.comments_containing(REPO, issue, &format!("#{n}")), 1);
    s.assert_no_duplicate_comments(REPO, n);
}
