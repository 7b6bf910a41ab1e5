//! `review` work in `shepherd agents` alone (work items injected into the dispatch
//! stream): the verdict a reviewer agent writes is posted once, as the reviewer's own
//! review of the item's head, with the reviewer's token; each way it can fail is
//! reported as `failed` with its own signature and reason.

use super::{REPO, REVIEWER, Rig};
use std::time::Duration;

/// The reviewer's token in the fake and the runner.
const TOKEN: &str = "rev-agent-token-9a8b7c";
/// A claim far beyond any test.
const HOUR: Duration = Duration::from_secs(3600);

/// Writes `$DIR/verdict` (when present) as the review file; marks that it ran.
const REVIEWER_SCRIPT: &str = r#"touch "$DIR/ran-$SHEPHERD_WORK_ID"
[ -e "$DIR/verdict" ] && cp "$DIR/verdict" "$SHEPHERD_REVIEW_FILE"
exit 0"#;

/// A rig whose fake knows the reviewer's token, and a runner that has it.
async fn rig_and_runner(with_token: bool) -> (Rig, impl Drop) {
    let rig = Rig::start().await;
    rig.fake.add_user_token(REVIEWER, TOKEN);
    let script = rig.script("reviewer.sh", REVIEWER_SCRIPT);
    let mut runner = rig
        .runner(&script)
        .policy("[defaults]\nreviewer_logins = [\"rev-agent\"]\n");
    if with_token {
        runner = runner.env("SHEPHERD_REVIEWER_TOKENS", format!("{REVIEWER}={TOKEN}"));
    }
    let runner = runner.start().await;
    (rig, runner)
}

/// The reviewer's reviews in the fake: (state, commit, body).
fn reviews_by_reviewer(rig: &Rig, n: u64) -> Vec<(String, String, String)> {
    rig.fake.with_model(|m| {
        m.repo_mut(REPO)
            .reviews
            .iter()
            .filter(|r| r.number == n && r.user == REVIEWER)
            .map(|r| (r.state.clone(), r.commit_id.clone(), r.body.clone()))
            .collect()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn the_verdict_is_posted_as_the_reviewer_on_the_items_head_once() {
    let (rig, _runner) = rig_and_runner(true).await;
    std::fs::write(
        rig.path("verdict"),
        r#"{"event":"REQUEST_CHANGES","body":"Handle empty input.","comments":[{"path":"src/lib.rs","line":7,"body":"panics here"}]}"#,
    )
    .unwrap();
    let n = rig.open_pr(REPO);
    let head = rig.fake.head_sha(REPO, n);
    let id = rig.dispatch(REPO, n, "review", 0, HOUR).await;
    let results = rig.wait_results(1).await;
    assert_eq!(results[0]["work_id"], id.as_str());
    assert_eq!(results[0]["outcome"], "succeeded", "{}", results[0]);
    assert_eq!(
        results[0]["summary"],
        "Review posted: requested changes. Handle empty input."
    );
    let posted = reviews_by_reviewer(&rig, n);
    assert_eq!(posted.len(), 1);
    assert_eq!(
        (posted[0].0.as_str(), posted[0].1.as_str()),
        ("REQUEST_CHANGES", head.as_str())
    );
    assert!(
        posted[0].2.starts_with("Handle empty input."),
        "{}",
        posted[0].2
    );
    assert!(
        posted[0]
            .2
            .contains(&format!("<!-- shepherd-review: {id} -->"))
    );
    let inline = rig
        .fake
        .with_model(|m| m.repo_mut(REPO).review_comments.clone());
    assert_eq!((inline[0].path.as_str(), inline[0].line), ("src/lib.rs", 7));
    // Posted with the reviewer's token: the runner's own token never wrote a review.
    let log = rig.log(&id).await.unwrap_or_default();
    assert!(!log.contains(TOKEN), "{log}");
    rig.fake.assert_calls_match_openapi();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_review_already_posted_for_the_item_is_not_posted_again() {
    let rig = Rig::start().await;
    rig.fake.add_user_token(REVIEWER, TOKEN);
    std::fs::write(rig.path("verdict"), r#"{"event":"APPROVED"}"#).unwrap();
    let n = rig.open_pr(REPO);
    let head = rig.fake.head_sha(REPO, n);
    // A runner posted this item's review and died before reporting: the item runs again.
    let id = rig.dispatch(REPO, n, "review", 0, HOUR).await;
    let body = format!("Fine.\n\n<!-- shepherd-review: {id} -->");
    rig.fake
        .with_model(|m| m.submit_review(REPO, n, REVIEWER, "APPROVED", &body, &head));
    let script = rig.script("reviewer.sh", REVIEWER_SCRIPT);
    let _runner = rig
        .runner(&script)
        .policy("[defaults]\nreviewer_logins = [\"rev-agent\"]\n")
        .env("SHEPHERD_REVIEWER_TOKENS", format!("{REVIEWER}={TOKEN}"))
        .start()
        .await;
    let results = rig.wait_results(1).await;
    assert_eq!(results[0]["outcome"], "succeeded", "{}", results[0]);
    assert!(rig.path(&format!("ran-{id}")).exists(), "the agent ran");
    assert_eq!(reviews_by_reviewer(&rig, n).len(), 1, "not posted twice");
    assert!(
        rig.fake
            .calls("POST", &format!("/repos/{REPO}/pulls/{n}/reviews"))
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn each_failure_is_reported_with_its_signature_and_nothing_is_posted() {
    let (rig, _runner) = rig_and_runner(true).await;
    // No review file.
    let n = rig.open_pr(REPO);
    rig.dispatch(REPO, n, "review", 0, HOUR).await;
    let r = rig.wait_results(1).await.remove(0);
    assert_eq!(
        (r["outcome"].as_str(), r["signature"].as_str()),
        (Some("failed"), Some("review-file"))
    );
    assert!(
        r["summary"].as_str().unwrap().contains("no review file"),
        "{r}"
    );
    // A change request without a body.
    std::fs::write(rig.path("verdict"), r#"{"event":"REQUEST_CHANGES"}"#).unwrap();
    rig.dispatch(REPO, n, "review", 0, HOUR).await;
    let r = rig.wait_results(2).await.remove(1);
    assert_eq!(r["signature"], "review-file", "{r}");
    assert!(
        r["summary"].as_str().unwrap().contains("needs a body"),
        "{r}"
    );
    // The reviewer is the PR's author: Forgejo refuses (422), and it is said so.
    std::fs::write(rig.path("verdict"), r#"{"event":"APPROVED"}"#).unwrap();
    let own = rig.fake.open_pr(
        REPO,
        crate::support::fake_forgejo::NewPr::new(REVIEWER, "Mine"),
    );
    rig.dispatch(REPO, own, "review", 0, HOUR).await;
    let r = rig.wait_results(3).await.remove(2);
    assert_eq!(r["signature"], "review-post", "{r}");
    assert!(r["summary"].as_str().unwrap().contains("422"), "{r}");
    assert!(reviews_by_reviewer(&rig, n).is_empty());
    assert!(reviews_by_reviewer(&rig, own).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reviewer_without_a_token_fails_before_its_agent_runs() {
    let (rig, _runner) = rig_and_runner(false).await;
    std::fs::write(rig.path("verdict"), r#"{"event":"APPROVED"}"#).unwrap();
    let n = rig.open_pr(REPO);
    let id = rig.dispatch(REPO, n, "review", 0, HOUR).await;
    let r = rig.wait_results(1).await.remove(0);
    assert_eq!(r["signature"], "reviewer-token", "{r}");
    assert!(
        r["summary"]
            .as_str()
            .unwrap()
            .contains("SHEPHERD_REVIEWER_TOKENS"),
        "{r}"
    );
    assert!(
        !rig.path(&format!("ran-{id}")).exists(),
        "the agent never ran"
    );
    assert!(reviews_by_reviewer(&rig, n).is_empty());
}
