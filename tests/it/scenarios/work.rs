//! Scenarios about work items and claims: (3) stuck at the top tier and resumed, (6)
//! claim expiry, (7) duplicated and replayed deliveries, (8) issue implementation.

use serde_json::Value;

use super::{BOT_MARKER, REPO, labels_added};
use crate::support::fake_forgejo::NewPr;
use crate::support::scenario::Scenario;
use crate::support::webhook;

/// Opens a bot PR whose head fails CI; returns (PR, head sha).
async fn open_red_bot_pr(s: &Scenario) -> (u64, String) {
    let fake = &s.fake;
    let body = format!("Adds y.\n\n{BOT_MARKER}");
    let n = fake.open_pr(REPO, NewPr::new("agent-bot", "Add y").body(&body));
    let sha = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&fake.pr_opened(REPO, n)).await;
    (n, sha)
}

/// The id of a work item.
fn id(item: &Value) -> &str {
    item["id"].as_str().expect("work id")
}

/// (3) The same CI failure three times at the top tier → `needs feedback` and one
/// comment with the history, no more dispatch; `/shepherd resume` from a stranger is
/// refused after a permission lookup, from a trusted user it resumes.
#[tokio::test(flavor = "multi_thread")]
async fn scenario_3_stuck_at_top_tier_then_resumed() {
    let s = Scenario::start("tiers = [\"small\", \"large\"]\ntrusted_users = [\"carol\"]\n").await;
    let fake = &s.fake;
    let (n, sha) = open_red_bot_pr(&s).await;
    // Tier 0 fails, then the same failure escalates to the top tier and fails 3 times.
    let mut tiers = Vec::new();
    for k in 1..=4 {
        let items = s.wait_work_items(k).await;
        let item = &items[k - 1];
        assert_eq!(item["kind"], "ci-fix");
        assert_eq!(item["head_sha"], sha.as_str());
        tiers.push(item["tier"].as_u64().unwrap());
        assert_eq!(s.report(id(item), "failed", None).await, 202);
    }
    assert_eq!(tiers, [0, 1, 1, 1], "escalates once, never goes down");
    s.wait_fake("the PR asks for a human", |f| {
        f.labels_on(REPO, n).contains(&"needs feedback".to_owned())
    })
    .await;
    s.wait_phase(REPO, n, "needs-human").await;
    s.wait_idle().await;
    assert_eq!(s.work_items().await.len(), 4, "no dispatch while stuck");
    assert_eq!(s.comments_containing(REPO, n, "needs a human"), 1);
    assert!(
        fake.labels_on(REPO, n)
            .contains(&"auto/last-attempt-tier-1".to_owned())
    );

    // A stranger's resume: the permission is looked up, the command refused.
    let c = fake.add_comment(REPO, n, "mallory", "/shepherd resume");
    s.send(&fake.comment_created(REPO, c)).await;
    let perm = format!("/repos/{REPO}/collaborators/mallory/permission");
    s.wait_fake("mallory's permission is read", |f| {
        !f.calls("GET", &perm).is_empty()
    })
    .await;
    s.wait_fake("the stranger is told", |f| {
        f.comments_on(REPO, n)
            .iter()
            .any(|c| c.body.contains("@mallory"))
    })
    .await;
    s.wait_idle().await;
    assert_eq!(s.phase(REPO, n).await, "needs-human");
    assert_eq!(s.work_items().await.len(), 4);

    // A trusted user's resume: no lookup needed, work starts again.
    let c = fake.add_comment(REPO, n, "carol", "/shepherd resume");
    s.send(&fake.comment_created(REPO, c)).await;
    let items = s.wait_work_items(5).await;
    assert_eq!(items[4]["kind"], "ci-fix");
    s.wait_fake("the needs-human label is removed", |f| {
        !f.labels_on(REPO, n).contains(&"needs feedback".to_owned())
    })
    .await;
    assert!(
        fake.calls(
            "GET",
            &format!("/repos/{REPO}/collaborators/carol/permission")
        )
        .is_empty()
    );
    s.wait_idle().await;
    assert_eq!(s.comments_containing(REPO, n, "needs a human"), 1);
    s.assert_no_duplicate_dispatch().await;
    s.assert_no_duplicate_comments(REPO, n);
}

/// Issue 26 finding 6: `max_attempts_total` attempts, then `needs-human`; a push by
/// a user without write access (the fake's default for others) neither clears it nor
/// buys another attempt; a push by a user with write access does.
#[tokio::test(flavor = "multi_thread")]
async fn attempts_are_bounded_and_only_a_writers_push_clears_needs_human() {
    let s = Scenario::start(
        "max_attempts_total = 2
",
    )
    .await;
    let fake = &s.fake;
    let (n, _) = open_red_bot_pr(&s).await;
    for k in 1..=2 {
        let items = s.wait_work_items(k).await;
        assert_eq!(s.report(id(&items[k - 1]), "failed", None).await, 202);
    }
    s.wait_phase(REPO, n, "needs-human").await;
    s.wait_idle().await;
    assert_eq!(s.work_items().await.len(), 2, "no third attempt");
    let why = "needs a human here.** 2 attempts on this PR (max_attempts_total = 2)";
    assert_eq!(s.comments_containing(REPO, n, why), 1);

    // mallory (read access) pushes; CI fails on her head too.
    let sha = fake.push_fix(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&fake.pr_synchronized(REPO, n, "mallory")).await;
    let perm = format!("/repos/{REPO}/collaborators/mallory/permission");
    s.wait_fake("mallory's permission is read", |f| {
        !f.calls("GET", &perm).is_empty()
    })
    .await;
    s.wait_idle().await;
    assert_eq!(s.phase(REPO, n).await, "needs-human");
    assert_eq!(s.work_items().await.len(), 2, "her push bought nothing");

    // carol (write access) pushes: the hold ends and work starts on her head.
    fake.set_permission(REPO, "carol", "write");
    let sha = fake.push_fix(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&fake.pr_synchronized(REPO, n, "carol")).await;
    let items = s.wait_work_items(3).await;
    assert_eq!(items[2]["head_sha"], sha.as_str());
    assert_eq!(items[2]["attempt"], 3);
    s.assert_no_duplicate_dispatch().await;
}

/// (6) A claim whose TTL runs out counts as a failed attempt: the next dispatch names
/// it in the history (and escalates, the problem being the same).
#[tokio::test(flavor = "multi_thread")]
async fn scenario_6_claim_expiry_counts_a_failed_attempt() {
    let s = Scenario::start("claim_ttl_secs = 2\n").await;
    let (n, _sha) = open_red_bot_pr(&s).await;
    let first = s.wait_work_items(1).await[0].clone();
    assert_eq!(first["attempt"], 1);
    let items = s.wait_work_items(2).await;
    let second = &items[1];
    assert_eq!(second["kind"], "ci-fix");
    assert_eq!(second["attempt"], 2);
    assert_eq!(second["tier"], 1, "the same problem escalates");
    let history = &second["context"]["attempts"];
    assert_eq!(history[0]["outcome"], "expired", "{second}");
    // The expired work item's late result is refused.
    assert_eq!(s.report(id(&first), "succeeded", None).await, 409);
    s.wait_fake("the claim is held by the new item", |f| {
        f.labels_on(REPO, n)
            .contains(&"auto/claimed-implementer".to_owned())
    })
    .await;
    s.assert_no_duplicate_dispatch().await;
    s.assert_no_duplicate_comments(REPO, n);
}

/// (7) The same delivery twice and a UI-style replay (same body, new delivery id)
/// cause no duplicate comment, label or dispatch.
#[tokio::test(flavor = "multi_thread")]
async fn scenario_7_duplicate_and_replayed_deliveries() {
    let s = Scenario::start("").await;
    let fake = &s.fake;
    let body = format!("Adds z.\n\n{BOT_MARKER}");
    let n = fake.open_pr(REPO, NewPr::new("agent-bot", "Add z").body(&body));
    let sha = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", "failure", "red");
    let hook = fake.pr_opened(REPO, n);
    let delivery = webhook::new_delivery();
    assert_eq!(s.send_as(&hook, &delivery).await, 202);
    assert_eq!(
        s.send_as(&hook, &delivery).await,
        200,
        "duplicate delivery id"
    );
    s.wait_work_items(1).await;
    s.wait_idle().await;
    assert_eq!(
        s.send_as(&hook, &webhook::new_delivery()).await,
        202,
        "UI replay"
    );
    assert_eq!(
        s.send_as(&hook, &webhook::new_delivery()).await,
        202,
        "UI replay"
    );
    s.wait_idle().await;

    assert_eq!(s.work_items().await.len(), 1, "one dispatch");
    let comment_posts = fake.calls("POST", &format!("/repos/{REPO}/issues/{n}/comments"));
    assert_eq!(comment_posts.len(), 1, "one status comment created");
    assert_eq!(fake.comments_on(REPO, n).len(), 1);
    let claimed = labels_added(fake, n)
        .iter()
        .filter(|l| *l == "auto/claimed-implementer")
        .count();
    assert_eq!(claimed, 1, "claim label added once");
    let mut labels = fake.labels_on(REPO, n);
    labels.sort();
    assert_eq!(
        labels,
        ["auto/claimed-implementer", "auto/last-attempt-tier-0"]
    );
    s.assert_no_duplicate_dispatch().await;
    s.assert_no_duplicate_comments(REPO, n);
}

/// (8) An issue labelled `auto/implement` gets one `issue-impl` work item and a claim;
/// a PR saying `Closes #N` releases the issue's claim; closing an issue cancels its
/// work (a cancel notice on the dispatch stream).
#[tokio::test(flavor = "multi_thread")]
async fn scenario_8_issue_implementation_claims_and_cancels() {
    let s = Scenario::start("").await;
    let fake = &s.fake;
    let issue = fake.create_issue(REPO, "alice", "Implement y", "We need y.");
    fake.add_label(REPO, issue, "auto/implement");
    s.send(&fake.issue_label_updated(REPO, issue, "alice"))
        .await;
    let items = s.wait_work_items(1).await;
    let item = &items[0];
    assert_eq!(item["kind"], "issue-impl");
    assert_eq!(item["number"], issue);
    assert!(item["head_sha"].is_null());
    s.wait_fake("the issue is claimed", |f| {
        f.labels_on(REPO, issue)
            .contains(&"auto/claimed-implementer".to_owned())
    })
    .await;
    // The same label event again (a replay) dispatches nothing new.
    s.send(&fake.issue_label_updated(REPO, issue, "alice"))
        .await;
    s.wait_idle().await;
    assert_eq!(s.work_items().await.len(), 1);

    // The agent opens a PR that closes the issue: the issue's claim is released.
    let body = format!("Implements y.\n\nCloses #{issue}\n\n{BOT_MARKER}");
    let pr = fake.open_pr(REPO, NewPr::new("agent-bot", "Implement y").body(&body));
    let sha = fake.head_sha(REPO, pr);
    fake.set_status(REPO, &sha, "ci/test", "pending", "running");
    s.send(&fake.pr_opened(REPO, pr)).await;
    s.wait_fake("the issue's claim is released", |f| {
        !f.labels_on(REPO, issue)
            .contains(&"auto/claimed-implementer".to_owned())
    })
    .await;

    // Another issue: closing it cancels its work.
    let other = fake.create_issue(REPO, "alice", "Implement w", "We need w.");
    fake.add_label(REPO, other, "auto/implement");
    s.send(&fake.issue_label_updated(REPO, other, "alice"))
        .await;
    let items = s.wait_work_items(2).await;
    let second = items
        .iter()
        .find(|i| i["number"] == other)
        .expect("work for #other");
    fake.close(REPO, other);
    s.send(&fake.issue_closed(REPO, other, "alice")).await;
    let what = "a cancel notice for the closed issue's work";
    crate::support::poll_until_named(crate::support::scenario::DEADLINE, what, || async {
        s.cancels().await.iter().any(|c| c["id"] == second["id"])
    })
    .await;
    s.wait_idle().await;
    let cancels = s.cancels().await;
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["kind"], "cancel");
    assert_eq!(cancels[0]["repo"], REPO);
    assert_eq!(cancels[0]["number"], other);
    assert_eq!(s.work_items().await.len(), 2, "one issue-impl per issue");
    assert!(
        !fake
            .labels_on(REPO, other)
            .contains(&"auto/claimed-implementer".to_owned())
    );
    s.assert_no_duplicate_dispatch().await;
    s.assert_no_duplicate_comments(REPO, issue);
}
