//! Hostile users (issue 12) through the real binary, Redis and the fake Forgejo: a
//! pasted bot marker, a PR that links someone else's issue, a change request from a
//! user without write access, and a pause racing a merge parked for retry.

use super::{BOT_MARKER, REPO};
use crate::support::fake_forgejo::{Fault, NewPr};
use crate::support::scenario::{DEADLINE, Scenario};

/// The path of PR `n`'s merge endpoint.
fn merge_path(n: u64) -> String {
    format!("/repos/{REPO}/pulls/{n}/merge")
}

/// Opens a PR by `author` with `body` and green CI; waits for `awaiting-review`.
async fn open_green_pr(s: &Scenario, author: &str, body: &str) -> u64 {
    let n = s.fake.open_pr(REPO, NewPr::new(author, "Add x").body(body));
    let sha = s.fake.head_sha(REPO, n);
    s.fake.set_status(REPO, &sha, "ci/test", "success", "green");
    s.send(&s.fake.pr_opened(REPO, n)).await;
    s.wait_phase(REPO, n, "awaiting-review").await;
    n
}

/// Adds a review by `reviewer` and sends its webhook.
async fn review(s: &Scenario, n: u64, reviewer: &str, state: &str) {
    let id = s.fake.add_review(REPO, n, reviewer, state);
    s.send(&s.fake.pr_reviewed(REPO, n, id)).await;
}

/// Comments `body` on `n` as `user` and sends the webhook.
async fn comment(s: &Scenario, n: u64, user: &str, body: &str) {
    let id = s.fake.add_comment(REPO, n, user, body);
    s.send(&s.fake.comment_created(REPO, id)).await;
}

/// Finding 3: a human pastes the bot marker into the body; one approval must not merge.
#[tokio::test(flavor = "multi_thread")]
async fn pasted_bot_marker_does_not_merge_a_human_pr_with_one_approval() {
    let s = Scenario::start("").await;
    let body = format!("Totally an agent PR.\n\n{BOT_MARKER}");
    let n = open_green_pr(&s, "mallory", &body).await;
    review(&s, n, "bob", "APPROVED").await;
    s.wait_idle().await;
    assert_eq!(s.phase(REPO, n).await, "awaiting-review");
    assert!(
        s.fake.calls("POST", &merge_path(n)).is_empty(),
        "one approval does not merge a human PR"
    );
    // The second approval a human PR needs does merge it.
    review(&s, n, "dave", "APPROVED").await;
    s.wait_fake("the PR is merged", |f| !f.merges().is_empty())
        .await;
}

/// Finding 5: anyone's PR linking an issue, closed unmerged, must not end its work.
#[tokio::test(flavor = "multi_thread")]
async fn linking_pr_closed_unmerged_does_not_mark_the_issue_done() {
    let s = Scenario::start("").await;
    let fake = &s.fake;
    let issue = fake.create_issue(REPO, "alice", "Implement y", "We need y.");
    fake.add_label(REPO, issue, "auto/implement");
    s.send(&fake.issue_label_updated(REPO, issue, "alice"))
        .await;
    let first = s.wait_work_items(1).await[0].clone();
    assert_eq!(first["kind"], "issue-impl");

    let body = format!("Closes #{issue}");
    let pr = fake.open_pr(REPO, NewPr::new("mallory", "Not really").body(&body));
    s.send(&fake.pr_opened(REPO, pr)).await;
    s.wait_idle().await;
    assert!(
        fake.labels_on(REPO, issue)
            .contains(&"auto/claimed-implementer".to_owned()),
        "someone else's PR does not end the agent's claim"
    );
    // The agent gives up while mallory's PR is still open: that PR holds nothing, so
    // the next attempt goes out at once.
    s.report(first["id"].as_str().unwrap(), "failed", None)
        .await;
    let items = s.wait_work_items(2).await;
    assert_eq!(items[1]["kind"], "issue-impl");
    assert_eq!(items[1]["number"], issue);
    assert_eq!(items[1]["attempt"], 2);
    // Closed unmerged, it neither marks the issue done nor ends attempt 2's claim.
    fake.close(REPO, pr);
    s.send(&fake.pr_closed(REPO, pr, "mallory")).await;
    s.wait_idle().await;
    assert!(
        fake.labels_on(REPO, issue)
            .contains(&"auto/claimed-implementer".to_owned()),
        "attempt 2 still holds the issue"
    );
    s.assert_no_duplicate_dispatch().await;
}

/// Finding 7: a change request from a user without write access (Forgejo marks it
/// `official: false`) neither blocks the merge nor becomes `review-feedback` work.
#[tokio::test(flavor = "multi_thread")]
async fn unofficial_change_request_neither_blocks_the_merge_nor_reaches_the_agents() {
    let s = Scenario::start("").await;
    let fake = &s.fake;
    let n = open_green_pr(&s, "agent-bot", "Adds x.").await;
    fake.set_permission(REPO, "mallory", "read");
    review(&s, n, "mallory", "REQUEST_CHANGES").await;
    s.wait_idle().await;
    assert!(s.work_items().await.is_empty(), "no review-feedback work");
    review(&s, n, "bob", "APPROVED").await;
    s.wait_fake("the PR is merged", |f| !f.merges().is_empty())
        .await;
    s.wait_idle().await;
    assert!(s.work_items().await.is_empty(), "nothing dispatched");
    assert!(
        s.comments_containing(REPO, n, "changes requested by `mallory`") >= 1,
        "the status comment shows the uncounted change request"
    );
}

/// Finding P: `/shepherd pause` arrives while the Merge effect is parked for retry
/// (its first read failed); the retried merge must not merge.
#[tokio::test(flavor = "multi_thread")]
async fn pause_wins_over_a_merge_parked_for_retry() {
    let s = Scenario::start("trusted_users = [\"carol\"]\n").await;
    let fake = &s.fake;
    let n = open_green_pr(&s, "agent-bot", "Adds x.").await;
    let pull = format!("/repos/{REPO}/pulls/{n}");
    // Every read of the PR fails until cleared: the Merge effect's first step.
    fake.inject(Fault::on("GET", &pull).status(500));
    review(&s, n, "bob", "APPROVED").await;
    // `merging`: the Merge effect is out (the record is InFlight).
    s.wait_phase(REPO, n, "merging").await;
    s.wait_fake("the merge's PR read failed (parked for retry)", |f| {
        f.calls("GET", &pull).iter().any(|c| c.status == 500)
    })
    .await;
    comment(&s, n, "carol", "/shepherd pause").await;
    // The phase stays `merging` while the merge is in flight: read the hold itself.
    crate::support::poll_until_named(DEADLINE, "the pause is in the record", || async {
        paused(&s, n).await
    })
    .await;
    fake.clear_faults();
    s.wait_fake("the parked merge ran again", |f| {
        f.calls("GET", &pull).iter().any(|c| c.status == 200)
    })
    .await;
    s.wait_idle_for(DEADLINE * 2).await;
    assert!(
        fake.calls("POST", &merge_path(n)).is_empty(),
        "no merge call while paused"
    );
    assert_eq!(s.phase(REPO, n).await, "paused");
    // Resumed, the same PR merges: the pause was what stopped it.
    comment(&s, n, "carol", "/shepherd resume").await;
    s.wait_fake("the PR is merged after resume", |f| !f.merges().is_empty())
        .await;
}

/// Whether PR `n`'s stored record holds a pause.
async fn paused(s: &Scenario, n: u64) -> bool {
    let key = s.shepherd.keys().pr_record(REPO, n);
    let data: Option<String> = redis::cmd("HGET")
        .arg(&key)
        .arg("data")
        .query_async(&mut s.redis_conn())
        .await
        .unwrap_or(None);
    data.and_then(|d| serde_json::from_str::<serde_json::Value>(&d).ok())
        .is_some_and(|v| v["work"]["hold"]["hold"] == "paused")
}

/// Issue 26 finding 5: the bot's own approval, and an agent user's, never count: a
/// human PR that needs two approvals, with one person's and the bot's (and an agent
/// user's), is not merged, and the status comment says why; a second person merges it.
#[tokio::test(flavor = "multi_thread")]
async fn bot_and_agent_approvals_do_not_merge_a_human_pr() {
    let s = Scenario::start("agent_logins = [\"agent-user\"]\n").await;
    let bot = s.fake.bot_login().to_owned();
    let n = open_green_pr(&s, "mallory", "Adds z.").await;
    review(&s, n, "bob", "APPROVED").await;
    review(&s, n, &bot, "APPROVED").await;
    s.wait_idle().await;
    assert_eq!(s.phase(REPO, n).await, "awaiting-review");
    assert!(
        s.fake.calls("POST", &merge_path(n)).is_empty(),
        "one person's and the bot's approvals do not merge a human PR"
    );
    s.wait_fake("the status comment names the uncounted approval", |f| {
        f.status_comments(REPO, n).iter().any(|b| {
            b.contains(&format!("Approval by `{bot}` (bot/agent) not counted"))
                && b.contains("waiting for 1 more approval")
        })
    })
    .await;
    review(&s, n, "agent-user", "APPROVED").await;
    s.wait_idle().await;
    assert!(
        s.fake.calls("POST", &merge_path(n)).is_empty(),
        "nor does an agent user's"
    );
    s.wait_fake("the agent user's approval is named too", |f| {
        f.status_comments(REPO, n)
            .iter()
            .any(|b| b.contains("Approval by `agent-user` (bot/agent) not counted"))
    })
    .await;
    review(&s, n, "dave", "APPROVED").await;
    s.wait_fake("the PR is merged", |f| !f.merges().is_empty())
        .await;
}
