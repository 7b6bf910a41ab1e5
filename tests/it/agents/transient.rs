//! Transient agent failures (issue 27, item 3) through the whole loop — `shepherd run`
//! and the real `shepherd agents` runner: an agent that fails the way opencode does
//! when the model provider answers 429 is retried at the same tier without an attempt
//! (`shepherd_agent_transient_total` counts it), and an agent that claims `transient`
//! on every run cannot stall the work: past `transient_retries` each claim is a failed
//! attempt, and escalation runs on to a human.

use serde_json::Value;

use super::e2e::{REPO, attempts};
use super::{results_on, write_script};
use crate::support::fake_forgejo::NewPr;
use crate::support::scenario::Scenario;

/// Opens a bot PR whose head fails CI; returns its number.
async fn open_red_pr(s: &Scenario) -> u64 {
    let n = s
        .fake
        .open_pr(REPO, NewPr::new("agent-bot", "Add y").body("Adds y."));
    let sha = s.fake.head_sha(REPO, n);
    s.fake
        .set_status(REPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&s.fake.pr_opened(REPO, n)).await;
    n
}

/// The value of `shepherd_agent_transient_total{kind}` in a `/metrics` text (0 when
/// absent).
fn transient_total(metrics: &str, kind: &str) -> u64 {
    let prefix = format!("shepherd_agent_transient_total{{kind=\"{kind}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().expect("a count"))
}

/// The runner's `/metrics` text.
async fn metrics(runner: &crate::support::shepherd::Shepherd) -> String {
    reqwest::get(runner.url("/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text")
}

/// What opencode-ai 1.18.33 (`opencode run`) prints on stderr, and then exits 1, when
/// its model server keeps answering 429 with an OpenAI-style error body (seen against
/// a local server answering so; its own retries come first).
const OPENCODE_429: &str = r#"printf '\033[0m\n> implementation-worker \302\267 m1\n\033[0m\n\033[91m\033[1mError: \033[0mRate limit reached for requests\n' >&2
exit 1"#;

/// Two runs fail with the provider's rate limit, the third succeeds: three work items
/// of the same kind at tier 0, all attempt 1; one attempt recorded (the success), the
/// tier label never moves, and the runner counted two transient runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_rate_limited_agent_is_retried_at_the_same_tier_without_an_attempt() {
    let s = Scenario::start("transient_backoff_secs = 1\n").await;
    let dir = tempfile::tempdir().unwrap();
    let script = write_script(
        dir.path(),
        "limited.sh",
        &format!(
            r#"echo "$SHEPHERD_TIER $SHEPHERD_WORK_ID" >> "$DIR/runs"
if [ "$(wc -l < "$DIR/runs")" -le 2 ]; then
{OPENCODE_429}
fi
echo "fixed the failing test"
printf '{{"outcome":"succeeded","summary":"fixed the failing test"}}' > "$SHEPHERD_RESULT_FILE""#
        ),
    );
    let runner = s.agents(&script).start().await;
    let n = open_red_pr(&s).await;
    s.wait_phase(REPO, n, "ci-fix").await;
    crate::support::poll_until_named(
        crate::support::scenario::DEADLINE,
        "the third run's success is recorded",
        || async { attempts(&s, n).await.len() == 1 },
    )
    .await;
    s.wait_idle().await;
    let runs = std::fs::read_to_string(dir.path().join("runs")).unwrap();
    let runs: Vec<&str> = runs.lines().collect();
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert!(
        runs.iter().all(|r| r.starts_with("0 ")),
        "same tier: {runs:?}"
    );
    let items = s.work_items().await;
    assert_eq!(items.len(), 3);
    for item in &items {
        assert_eq!(
            (item["kind"].as_str(), item["tier"].as_u64()),
            (Some("ci-fix"), Some(0))
        );
        assert_eq!(item["attempt"], 1, "no attempt counted: {item}");
        assert!(
            item["context"]["attempts"]
                .as_array()
                .is_none_or(Vec::is_empty),
            "{item}"
        );
    }
    let a = attempts(&s, n).await;
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(
        (a[0]["outcome"].as_str(), a[0]["tier"].as_u64()),
        (Some("succeeded"), Some(0))
    );
    let outcomes: Vec<Value> = results_on(&mut s.redis_conn(), &s.shepherd.keys())
        .await
        .into_iter()
        .map(|r| r["outcome"].clone())
        .collect();
    assert_eq!(outcomes, ["transient", "transient", "succeeded"]);
    let m = metrics(&runner).await;
    assert_eq!(transient_total(&m, "ci-fix"), 2, "{m}");
    let labels = s.fake.labels_on(REPO, n);
    assert!(
        labels.contains(&"auto/last-attempt-tier-0".to_owned()),
        "{labels:?}"
    );
    assert!(
        !labels.iter().any(|l| l == "auto/last-attempt-tier-1"),
        "{labels:?}"
    );
}

/// An agent that says `transient` on every run (a result file, exit 0): with
/// `transient_retries = 1` every second claim in a row is a failed attempt, so the
/// same failure escalates small → large and, at the top tier, needs a human — four
/// runs, two attempts, never a stall.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_that_always_claims_transient_escalates_to_a_human() {
    let policy = "tiers = [\"small\", \"large\"]\nstuck_after = 1\ntransient_retries = 1\n\
                  transient_backoff_secs = 1\n";
    let s = Scenario::start(policy).await;
    let dir = tempfile::tempdir().unwrap();
    let script = write_script(
        dir.path(),
        "liar.sh",
        r#"echo "$SHEPHERD_TIER_NAME" >> "$DIR/runs"
echo "Error: 429 Too Many Requests"
printf '{"outcome":"transient","summary":"the provider is busy, honest"}' > "$SHEPHERD_RESULT_FILE""#,
    );
    let runner = s.agents(&script).start().await;
    let n = open_red_pr(&s).await;
    s.wait_phase(REPO, n, "needs-human").await;
    s.wait_idle().await;
    let runs = std::fs::read_to_string(dir.path().join("runs")).unwrap();
    assert_eq!(
        runs.lines().collect::<Vec<_>>(),
        ["small", "small", "large", "large"]
    );
    let a = attempts(&s, n).await;
    assert_eq!(a.len(), 2, "{a:?}");
    for (i, attempt) in a.iter().enumerate() {
        assert_eq!(attempt["tier"], i, "{attempt}");
        assert_eq!(attempt["outcome"], "failed", "{attempt}");
    }
    assert_eq!(
        s.work_items().await.len(),
        4,
        "no dispatch once it needs a human"
    );
    let m = metrics(&runner).await;
    assert_eq!(
        transient_total(&m, "ci-fix"),
        4,
        "the runner reports each claim: {m}"
    );
    s.wait_fake("the PR asks for a human", |f| {
        f.labels_on(REPO, n).contains(&"needs feedback".to_owned())
    })
    .await;
}

/// The results API takes `transient` too (an agent of another runner reporting over
/// HTTP): accepted once, no attempt, the same work again after the back-off; a second
/// report of the same id is refused.
#[tokio::test(flavor = "multi_thread")]
async fn the_results_api_accepts_transient_and_the_work_comes_back_at_the_same_tier() {
    let s = Scenario::start("transient_backoff_secs = 1\n").await;
    let n = open_red_pr(&s).await;
    let first = s.wait_work_items(1).await.remove(0);
    let id = first["id"].as_str().unwrap().to_owned();
    assert_eq!(s.report(&id, "transient", Some("exit:1")).await, 202);
    let items = s.wait_work_items(2).await;
    let again = &items[1];
    assert_ne!(again["id"], first["id"]);
    assert_eq!(
        (again["tier"].as_u64(), again["attempt"].as_u64()),
        (Some(0), Some(1)),
        "{again}"
    );
    assert_eq!(s.report(&id, "transient", None).await, 409, "once");
    s.wait_idle().await;
    assert!(attempts(&s, n).await.is_empty(), "no attempt counted");
}
