//! Reviewer agents end to end (issue 15): `shepherd run`, `shepherd agents` with one
//! script agent for both roles, and the fake Forgejo. The script reviews (writes its
//! verdict to `SHEPHERD_REVIEW_FILE`; the runner posts it as the reviewer's own
//! formal review with the reviewer's token) and answers review feedback (the test then
//! pushes the fix as the bot, as an implementer agent would). The review webhooks
//! Forgejo sends for those reviews (the fake's outbox) are delivered to the ingest.

use std::future::Future;
use std::time::Instant;

use serde_json::Value;

use super::e2e::{REPO, attempts, record};
use super::write_script;
use crate::support::fake_forgejo::NewPr;
use crate::support::scenario::{DEADLINE, Scenario};

/// The reviewer agent's Forgejo user and token.
const REVIEWER: &str = "rev-agent";
const REVIEWER_TOKEN: &str = "rev-agent-token-5f1e2d3c";

/// The policy lines of the scenarios: one reviewer agent.
const POLICY: &str = "reviewer_logins = [\"rev-agent\"]\n";

/// One script for every kind. `review`: REQUEST_CHANGES with the same text each round,
/// unless `$DIR/approve-from` holds a round number it has reached (then APPROVED).
/// `review-feedback`: reports success (the test pushes). It keeps each prompt and its
/// environment, to check that the reviewer's token is in neither.
const AGENT: &str = r#"cp "$SHEPHERD_PROMPT_FILE" "$DIR/prompt-$SHEPHERD_WORK_ID"
env > "$DIR/env-$SHEPHERD_WORK_ID"
echo "$SHEPHERD_KIND $SHEPHERD_TIER" >> "$DIR/kinds"
case "$SHEPHERD_KIND" in
review)
  n=$(grep -c '^review ' "$DIR/kinds")
  if [ -e "$DIR/approve-from" ] && [ "$n" -ge "$(cat "$DIR/approve-from")" ]; then
    printf '{"event":"APPROVED","body":"Looks right now."}' > "$SHEPHERD_REVIEW_FILE"
  else
    printf '{"event":"REQUEST_CHANGES","body":"Handle the empty list in parse().","comments":[{"path":"src/lib.rs","line":3,"body":"empty input panics here"}]}' > "$SHEPHERD_REVIEW_FILE"
  fi
  echo "reviewed round $n";;
review-feedback)
  printf '{"outcome":"succeeded","summary":"handled the empty list"}' > "$SHEPHERD_RESULT_FILE";;
*) exit 3;;
esac"#;

/// Delivers the webhooks the fake queued (reviews by the reviewer, the bot's label
/// and comment echoes, the merge) until `cond` holds.
pub(super) async fn deliver_until<F, Fut>(s: &Scenario, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + DEADLINE;
    loop {
        for hook in s.fake.take_outbox() {
            s.send(&hook).await;
        }
        if cond().await {
            return;
        }
        if Instant::now() > end {
            s.dump().await;
            panic!("timed out waiting for: {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Starts the scenario, the reviewer's token in the fake and the runner; opens a
/// green bot PR. Returns (scenario, script folder, runner, PR).
async fn start() -> (Scenario, tempfile::TempDir, impl Drop, u64) {
    let s = Scenario::start(POLICY).await;
    s.fake.add_user_token(REVIEWER, REVIEWER_TOKEN);
    let dir = tempfile::tempdir().unwrap();
    let script = write_script(dir.path(), "agent.sh", AGENT);
    let runner = s
        .agents(&script)
        .env(
            "SHEPHERD_REVIEWER_TOKENS",
            format!("{REVIEWER}={REVIEWER_TOKEN}"),
        )
        .start()
        .await;
    let n = s.fake.open_pr(
        REPO,
        NewPr::new("agent-bot", "Add parse()").body("Closes #1"),
    );
    let sha = s.fake.head_sha(REPO, n);
    s.fake.set_status(REPO, &sha, "ci/test", "success", "ok");
    s.send(&s.fake.pr_opened(REPO, n)).await;
    (s, dir, runner, n)
}

/// Work items of `kind` dispatched so far.
async fn items_of(s: &Scenario, kind: &str) -> Vec<Value> {
    s.work_items()
        .await
        .into_iter()
        .filter(|w| w["kind"] == kind)
        .collect()
}

/// Finished `review-feedback` attempts of PR `n` that succeeded.
async fn feedback_done(s: &Scenario, n: u64) -> usize {
    attempts(s, n)
        .await
        .iter()
        .filter(|a| a["kind"] == "review-feedback" && a["outcome"] == "succeeded")
        .count()
}

/// The implementer's push after feedback round `round`: a new head, green, as the bot.
async fn push_fix(s: &Scenario, n: u64, round: usize) {
    let sha = format!("{:040x}", 0xf1_0000 + round);
    s.fake.push(REPO, n, &sha);
    s.fake.set_status(REPO, &sha, "ci/test", "success", "ok");
    s.send(&s.fake.pr_synchronized(REPO, n, s.fake.bot_login()))
        .await;
}

/// Reviews the fake holds by the reviewer agent: (state, commit).
fn agent_reviews(s: &Scenario, n: u64) -> Vec<(String, String)> {
    s.fake.with_model(|m| {
        m.repo_mut(REPO)
            .reviews
            .iter()
            .filter(|r| r.number == n && r.user == REVIEWER)
            .map(|r| (r.state.clone(), r.commit_id.clone()))
            .collect()
    })
}

/// Nothing of the reviewer's token in any prompt, agent environment or agent log.
async fn assert_token_kept(s: &Scenario, dir: &std::path::Path, n: u64) {
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("prompt-") || name.starts_with("env-") {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains(REVIEWER_TOKEN), "{name} has the token");
            seen += 1;
        }
    }
    assert!(
        seen >= 2,
        "the agents ran and left their prompt and environment"
    );
    let view = inspect(s, n).await;
    assert!(!view.to_string().contains(REVIEWER_TOKEN), "{view}");
}

/// `inspect` as JSON.
async fn inspect(s: &Scenario, n: u64) -> Value {
    reqwest::Client::new()
        .get(s.shepherd.url(&format!("/api/v1/admin/inspect/{REPO}/{n}")))
        .bearer_auth(crate::support::scenario::SCENARIO_ADMIN_TOKEN)
        .send()
        .await
        .expect("inspect answers")
        .json()
        .await
        .expect("inspect JSON")
}

/// A bot PR with green CI gets one review; the reviewer requests changes; the
/// feedback is dispatched to an implementer and pushed; the new head, green, gets one
/// new review, which approves; the reviewer's approval counts for a bot PR and the PR
/// merges.
#[tokio::test(flavor = "multi_thread")]
async fn a_reviewer_requests_changes_then_approves_the_fix_and_the_pr_merges() {
    let (s, dir, _runner, n) = start().await;
    std::fs::write(dir.path().join("approve-from"), "2").unwrap();
    let first_head = s.fake.head_sha(REPO, n);
    deliver_until(&s, "the reviewer's change request is answered", || async {
        feedback_done(&s, n).await == 1
    })
    .await;
    let reviews = items_of(&s, "review").await;
    assert_eq!(reviews.len(), 1);
    assert_eq!(reviews[0]["head_sha"], first_head.as_str());
    assert_eq!(reviews[0]["context"]["review"]["reviewer"], REVIEWER);
    assert_eq!(reviews[0]["context"]["review"]["round"], 1);
    assert_eq!(
        agent_reviews(&s, n),
        [("REQUEST_CHANGES".to_owned(), first_head.clone())]
    );
    let feedback = items_of(&s, "review-feedback").await;
    assert_eq!(feedback.len(), 1);
    let asked = &feedback[0]["context"]["change_requests"][0];
    assert_eq!(asked["reviewer"], REVIEWER);
    assert!(
        asked["body"]
            .as_str()
            .unwrap()
            .starts_with("Handle the empty list in parse()."),
        "{asked}"
    );
    // The reviewer held the PR under its own claim label, never with the implementer's.
    let claims: Vec<Value> = s
        .fake
        .calls("POST", &format!("/repos/{REPO}/issues/{n}/labels"))
        .into_iter()
        .map(|c| c.body)
        .collect();
    assert!(
        claims
            .iter()
            .any(|b| b.to_string().contains("auto/claimed-reviewer")),
        "{claims:?}"
    );
    assert!(
        !claims.iter().any(|b| {
            let t = b.to_string();
            t.contains("auto/claimed-reviewer") && t.contains("auto/claimed-implementer")
        }),
        "{claims:?}"
    );
    push_fix(&s, n, 1).await;
    deliver_until(&s, "the PR merges", || async {
        s.fake.issue(REPO, n).pull.is_some_and(|p| p.merged)
    })
    .await;
    s.wait_phase(REPO, n, "merged").await;
    let second_head = format!("{:040x}", 0xf1_0001);
    let reviews = items_of(&s, "review").await;
    assert_eq!(reviews.len(), 2, "one review per head");
    assert_eq!(reviews[1]["head_sha"], second_head.as_str());
    assert_eq!(reviews[1]["context"]["review"]["round"], 2);
    assert_eq!(
        agent_reviews(&s, n),
        [
            ("REQUEST_CHANGES".to_owned(), first_head),
            ("APPROVED".to_owned(), second_head.clone())
        ]
    );
    assert_eq!(s.fake.merges()[0].head_commit_id, Some(second_head));
    let rounds = record(&s, n).await["agent_review"]["rounds"].clone();
    let verdicts: Vec<&str> = rounds
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["verdict"].as_str().unwrap_or("none"))
        .collect();
    assert_eq!(verdicts, ["changes-requested", "approved"]);
    let lines = [
        "shepherd_reviews_dispatched_total 2",
        "shepherd_review_verdicts_total{verdict=\"approved\"} 1",
        "shepherd_review_verdicts_total{verdict=\"changes-requested\"} 1",
        "shepherd_review_rounds_per_merged_pr_sum 2",
        "shepherd_review_rounds_per_merged_pr_count 1",
    ];
    // The merged PR's figures are counted when the worker steps the `merged` event,
    // which may come after the merge the fake recorded: wait for them (bounded).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut metrics = s.metrics().await;
    while !lines.iter().all(|l| metrics.contains(l)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        metrics = s.metrics().await;
    }
    for line in lines {
        assert!(metrics.contains(line), "no {line:?} in\n{metrics}");
    }
    let view = inspect(&s, n).await;
    assert_eq!(view["review_rounds"].as_array().unwrap().len(), 2, "{view}");
    assert_eq!(view["summary"]["review"]["verdict"], "approved", "{view}");
    // The status comment is written after the record is merged (`merging` settles
    // instead of being written, issue 17): wait for it.
    let approved = "Agent review: round 2 of 3 by `rev-agent` · verdict: approved";
    s.wait_fake(
        "the status comment says merged, with the approved round",
        |f| {
            f.comments_on(REPO, n).iter().any(|c| {
                c.body.contains(approved)
                    && shepherd::core::texts::parse_status_comment(&c.body)
                        .is_some_and(|st| st.phase.as_str() == "merged")
            })
        },
    )
    .await;
    let status = s.fake.status_comments(REPO, n);
    assert_eq!(status.len(), 1, "one status comment: {status:?}");
    assert_token_kept(&s, dir.path(), n).await;
    s.assert_no_duplicate_dispatch().await;
    s.fake.assert_calls_match_openapi();
}

/// A reviewer that always requests the same change: exactly three rounds (review →
/// feedback → push), the implementer one tier up each time (the same change request
/// came back after a fix), then `needs-human` with the round history in one comment and
/// no fourth review.
#[tokio::test(flavor = "multi_thread")]
async fn a_reviewer_that_always_requests_changes_gets_three_rounds_then_a_human() {
    let (s, dir, _runner, n) = start().await;
    for round in 1..=3 {
        deliver_until(
            &s,
            &format!("feedback round {round} is answered"),
            || async { feedback_done(&s, n).await == round },
        )
        .await;
        push_fix(&s, n, round).await;
    }
    deliver_until(&s, "the PR needs a human", || async {
        s.phase(REPO, n).await == "needs-human"
    })
    .await;
    s.wait_idle().await;
    for hook in s.fake.take_outbox() {
        s.send(&hook).await;
    }
    s.wait_idle().await;
    assert_eq!(
        items_of(&s, "review").await.len(),
        3,
        "exactly three rounds"
    );
    let tiers: Vec<u64> = items_of(&s, "review-feedback")
        .await
        .iter()
        .map(|w| w["tier"].as_u64().unwrap())
        .collect();
    assert_eq!(tiers, [0, 1, 2], "the same change request escalates");
    assert_eq!(agent_reviews(&s, n).len(), 3);
    let history = s.comments_containing(REPO, n, "Review rounds by reviewer agents");
    assert_eq!(history, 1, "one comment with the round history");
    let comment = s
        .fake
        .comments_on(REPO, n)
        .into_iter()
        .find(|c| c.body.contains("Review rounds by reviewer agents"))
        .unwrap();
    assert!(comment.body.contains("3 review rounds"), "{}", comment.body);
    assert_eq!(
        comment
            .body
            .matches("| `rev-agent` | changes-requested |")
            .count(),
        3,
        "{}",
        comment.body
    );
    assert!(
        s.fake
            .labels_on(REPO, n)
            .contains(&"needs feedback".to_owned())
    );
    assert!(!s.fake.issue(REPO, n).pull.is_some_and(|p| p.merged));
    assert_token_kept(&s, dir.path(), n).await;
    s.assert_no_duplicate_dispatch().await;
    s.fake.assert_calls_match_openapi();
}
