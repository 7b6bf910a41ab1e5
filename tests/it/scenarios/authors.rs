//! Who gets agents (issue 26), end to end: a PR by a read-only author with failing CI
//! gets no `ci-fix` (one permission read of the author says why) until a user with
//! write access comments `/shepherd agents on`; then it gets one. A stranger's
//! `/shepherd agents on` is refused first.

use super::REPO;
use crate::support::fake_forgejo::NewPr;
use crate::support::scenario::Scenario;

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_authors_pr_gets_agents_only_after_a_writer_says_so() {
    // The default policy (`agent_authors = "writers"`); carol has write access, dora
    // (the author) and mallory only read (the fake's default for non-owners, set here
    // explicitly).
    let s = Scenario::start("").await;
    let fake = &s.fake;
    fake.set_permission(REPO, "dora", "read");
    fake.set_permission(REPO, "mallory", "read");
    fake.set_permission(REPO, "carol", "write");
    let n = fake.open_pr(REPO, NewPr::new("dora", "Add y").body("By hand."));
    let sha = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&fake.pr_opened(REPO, n)).await;

    // The author's permission is read once; no work is dispatched; the sticky comment
    // says why and how to lift it.
    let dora = format!("/repos/{REPO}/collaborators/dora/permission");
    s.wait_fake("the sticky comment says agents are off", |f| {
        f.status_comments(REPO, n).iter().any(|b| {
            b.contains("agents off for this PR: its author has no write access")
                && b.contains("`/shepherd agents on`")
        })
    })
    .await;
    s.wait_idle().await;
    assert_eq!(s.phase(REPO, n).await, "ci-fix");
    assert!(s.work_items().await.is_empty(), "no ci-fix for dora's PR");
    assert_eq!(fake.calls("GET", &dora).len(), 1, "one read of the author");

    // A stranger cannot let the agents in: refused (the refusal is recorded).
    let c = fake.add_comment(REPO, n, "mallory", "/shepherd agents on");
    s.send(&fake.comment_created(REPO, c)).await;
    s.wait_fake("mallory is told", |f| {
        f.comments_on(REPO, n)
            .iter()
            .any(|c| c.body.contains("@mallory"))
    })
    .await;
    s.wait_idle().await;
    assert!(s.work_items().await.is_empty(), "still no ci-fix");

    // A writer's `/shepherd agents on`: one ci-fix, and the record says who.
    let c = fake.add_comment(REPO, n, "carol", "/shepherd agents on");
    s.send(&fake.comment_created(REPO, c)).await;
    let items = s.wait_work_items(1).await;
    assert_eq!(items[0]["kind"], "ci-fix");
    assert_eq!(items[0]["head_sha"], sha.as_str());
    // The author's text stays untrusted in the agent's prompt.
    assert_eq!(items[0]["context"]["author_trusted"], false);
    s.wait_fake("the sticky comment says who let the agents in", |f| {
        f.status_comments(REPO, n)
            .iter()
            .any(|b| b.contains("Agents: on for this PR (`/shepherd agents on` by `carol`)"))
    })
    .await;
    s.wait_idle().await;
    let out = s.cli(&["inspect", &format!("{REPO}#{n}")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("agents    on by @carol at ")
                && l.contains("refused for @mallory")),
        "{text}"
    );
    assert_eq!(
        fake.calls("GET", &dora).len(),
        1,
        "the author was read once"
    );
    s.assert_no_duplicate_dispatch().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writers_pr_gets_its_ci_fix_after_one_permission_read() {
    let s = Scenario::start("").await;
    let fake = &s.fake;
    fake.set_permission(REPO, "erin", "write");
    let n = fake.open_pr(REPO, NewPr::new("erin", "Add z").body("By hand."));
    let sha = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&fake.pr_opened(REPO, n)).await;
    let items = s.wait_work_items(1).await;
    assert_eq!(items[0]["kind"], "ci-fix");
    assert_eq!(items[0]["context"]["author_trusted"], true);
    s.wait_idle().await;
    let erin = format!("/repos/{REPO}/collaborators/erin/permission");
    assert_eq!(fake.calls("GET", &erin).len(), 1);
    assert!(
        fake.status_comments(REPO, n)
            .iter()
            .all(|b| !b.contains("agents off")),
        "a writer's PR never shows agents off"
    );
}
