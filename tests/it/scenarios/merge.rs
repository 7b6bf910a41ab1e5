//! Scenarios that end in (or refuse) a merge: (1) a bot PR from red CI to merged,
//! (2) a human PR needing two approvals, (4) the head moving between readiness and
//! merge, (5) a merge answered with 500 that did go through.

use serde_json::Value;

use super::{BOT_MARKER, REPO, labels_added, writes};
use crate::support::fake_forgejo::NewPr;
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
    assert!(body.get("force_merge").is_none(), "never force_merge: {body}");
    assert!(body.get("merge_when_checks_succeed").is_none(), "{body}");
}

/// (1) Bot PR: opened → CI pending (polled) → failing → `ci-fix` dispatched with the
/// failing checks and the claim label → the agent pushes and reports → CI green → one
/// approval → merged with `head_commit_id` and the configured style, never
/// `force_merge` → the linked issue gets a comment.
#[tokio::test(flavor = "multi_thread")]
async fn scenario_1_bot_pr_from_red_ci_to_merged() {
    let s = Scenario::start("merge_style = \"rebase\"\n").await;
    let fake = &s.fake;
    let (issue, n, sha1) = open_bot_pr(&s, "pending").await;
    let status_path = format!("/repos/{REPO}/commits/{sha1}/status");
    s.wait_fake("the pending head's CI is polled again", |f| {
        f.calls("GET", &status_path).len() >= 2
    })
    .await;
    assert!(s.work_items().await.is_empty(), "nothing to fix while pending");

    fake.set_status(REPO, &sha1, "ci/test", "failure", "3 tests failed");
    let items = s.wait_work_items(1).await;
    let item = &items[0];
    assert_eq!(item["kind"], "ci-fix");
    assert_eq!(item["repo"], REPO);
    assert_eq!(item["number"], n);
    assert_eq!(item["head_sha"], sha1.as_str());
    assert_eq!((item["tier"].as_u64(), item["tier_name"].as_str()), (Some(0), Some("haiku")));
    assert_eq!(item["attempt"], 1);
    let failing = &item["context"]["failing_checks"];
    assert_eq!(failing[0]["context"], "ci/test", "{item}");
    assert_eq!(failing[0]["description"], "3 tests failed");
    s.wait_fake("the PR is claimed", |f| {
        f.labels_on(REPO, n).contains(&"auto/claimed-implementer".to_owned())
    })
    .await;
    assert!(fake.labels_on(REPO, n).contains(&"auto/last-attempt-tier-0".to_owned()));

    // The agent pushes a fix and reports; the claim ends.
    let sha2 = "2222222222222222222222222222222222222222";
    fake.push(REPO, n, sha2);
    s.send(&fake.pr_synchronized(REPO, n, "agent-bot")).await;
    let work_id = item["id"].as_str().unwrap();
    let reported = s.report(work_id, "succeeded", None).await;
    assert!(matches!(reported, 202 | 409), "result answered {reported}");
    s.wait_fake("the claim label is removed", |f| {
        !f.labels_on(REPO, n).contains(&"auto/claimed-implementer".to_owned())
    })
    .await;

    fake.set_status(REPO, sha2, "ci/test", "success", "all green");
    s.wait_phase(REPO, n, "awaiting-review").await;
    assert!(fake.merges().is_empty(), "no merge without an approval");
    approve(&s, n, "bob").await;

    s.wait_fake("the PR is merged", |f| !f.merges().is_empty()).await;
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
    assert_eq!(fake.calls("POST", &merge_path(n)).len(), 1, "one merge call");
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
    for c in fake.comments_on(REPO, n).iter().chain(&fake.comments_on(REPO, issue)) {
        assert_eq!(c.user, fake.bot_login());
        assert!(c.body.ends_with("---\n**Automated by Shepherd**"), "{}", c.body);
    }
}
