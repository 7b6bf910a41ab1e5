//! What a polling system leaves behind (issue 27 item 5, docs/migrating.md), through
//! the real `shepherd run`, Redis and the fake Forgejo: a PR carried over with an
//! `auto/last-attempt-tier-2` label and an `ESCALATION-STATE` comment is first
//! dispatched at tier 2 with its attempts counted on; a PR carrying a claim label
//! another dispatcher set gets no work until `claim_ttl_secs` after the label event in
//! its timeline, and `inspect` and the status comment say "claimed elsewhere"; a forged
//! state comment by a user who is neither the bot nor an agent changes nothing.

use serde_json::Value;

use super::{BOT_MARKER, REPO, labels_added};
use crate::support::fake_forgejo::{FakeForgejo, NewPr};
use crate::support::poll_until_named;
use crate::support::scenario::{DEADLINE, Scenario};

/// The agent user of these scenarios (policy `agent_logins`): the old dispatcher's
/// workers posted their state comments as it.
const AGENT: &str = "agent-user";
/// The claim label (policy default `label_claimed`).
const CLAIM: &str = "auto/claimed-implementer";
/// The claim TTL of the claim scenario (seconds): small, so the test waits it out.
const TTL_SECS: i64 = 6;

/// A state block in seed 000's format.
fn block(tier: &str, attempts: u64) -> String {
    format!(
        "<!-- ESCALATION-STATE: START -->\n{{\n  \"subtask\": \"add y\",\n  \
         \"current_tier\": \"{tier}\",\n  \"attempt_count\": {attempts},\n  \
         \"last_updated\": \"earlier\",\n  \"quality_gates_status\": {{\"lint\": \"FAIL\"}},\n  \
         \"escalation_trigger\": \"quality_gates\"\n}}\n<!-- ESCALATION-STATE: END -->\n\n\
         🤖 **Escalation Update**: Now attempting **Tier {tier}** (attempt #{attempts})"
    )
}

/// A bot PR with failing CI, `labels` on it as the old dispatcher (`old-dispatcher`)
/// put them, and `comments` (author, body); returns its number.
fn carried_over_pr(fake: &FakeForgejo, labels: &[&str], comments: &[(&str, String)]) -> u64 {
    let body = format!("Adds y.\n\n{BOT_MARKER}");
    let n = fake.open_pr(REPO, NewPr::new("agent-bot", "Add y").body(&body));
    for l in labels {
        fake.add_label_by(REPO, n, l, "old-dispatcher");
    }
    for (who, text) in comments {
        fake.add_comment(REPO, n, who, text);
    }
    let sha = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", "failure", "2 tests failed");
    n
}

/// `shepherd inspect acme/widgets#n` as text.
fn inspect(s: &Scenario, n: u64) -> String {
    let out = s.cli(&["inspect", &format!("{REPO}#{n}")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `shepherd inspect acme/widgets#n --json`.
fn inspect_json(s: &Scenario, n: u64) -> Value {
    let out = s.cli(&["inspect", &format!("{REPO}#{n}"), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("inspect --json")
}

/// The work items dispatched so far for PR `n`.
async fn items_for(s: &Scenario, n: u64) -> Vec<Value> {
    s.work_items()
        .await
        .into_iter()
        .filter(|i| i["number"].as_u64() == Some(n))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_carried_over_pr_is_first_dispatched_at_its_tier_with_its_attempts() {
    let s = Scenario::start(&format!("agent_logins = [\"{AGENT}\"]\n")).await;
    let fake = &s.fake;
    // A human's chatter and an older state block by the agent come before the last one.
    let comments = [
        ("alice", "Looks hard.".to_owned()),
        (AGENT, block("codex", 1)),
        (AGENT, block("sonnet", 3)),
    ];
    let n = carried_over_pr(fake, &["auto/last-attempt-tier-2"], &comments);
    s.send(&fake.pr_opened(REPO, n)).await;
    let items = s.wait_work_items(1).await;
    let item = &items[0];
    assert_eq!(item["kind"], "ci-fix");
    assert_eq!(item["tier"], 2, "{item}");
    assert_eq!(item["attempt"], 4, "three attempts carried over: {item}");
    let read = format!("/repos/{REPO}/issues/{n}/comments");
    assert!(
        !fake.calls("GET", &read).is_empty(),
        "the comments were read"
    );
    s.wait_idle().await;
    let text = inspect(&s, n);
    assert!(
        text.contains("carried over: tier 2, 3 attempt(s)"),
        "{text}"
    );
    assert_eq!(items_for(&s, n).await.len(), 1);
    // `rebuild` folds the archived read's answer: the same seeded record.
    let out = s.cli_as_workers(&["rebuild", &format!("{REPO}#{n}"), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("rebuild --json");
    // Only the times differ (a fold steps each event at its arrival, the workers a
    // moment later); the seeding does not.
    let changes = report["changes"].as_array().expect("changes");
    assert!(
        changes.iter().all(|c| {
            let path = c["path"].as_str().unwrap_or_default();
            !["legacy", "tier", "attempt"]
                .iter()
                .any(|w| path.contains(w))
        }),
        "{report}"
    );
    assert_eq!(report["folded"]["work"]["active"]["item"]["attempt"], 4);
    assert_eq!(report["folded"]["work"]["tier"], 2);
    assert_eq!(report["folded"]["work"]["legacy"]["carried"]["attempts"], 3);
    fake.assert_calls_match_openapi();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_state_comment_by_a_stranger_changes_nothing() {
    let s = Scenario::start(&format!("agent_logins = [\"{AGENT}\"]\n")).await;
    let fake = &s.fake;
    // The attacker's block is the newest and well-formed; the agent's is garbage.
    let comments = [
        (
            AGENT,
            "<!-- ESCALATION-STATE: START --> {\"current_tier\": \"opus\"".to_owned(),
        ),
        ("mallory", block("opus", 50)),
    ];
    // A tier-0 label: the old dispatcher worked the PR, so its comments are read.
    let n = carried_over_pr(fake, &["auto/last-attempt-tier-0"], &comments);
    s.send(&fake.pr_opened(REPO, n)).await;
    let items = s.wait_work_items(1).await;
    let read = format!("/repos/{REPO}/issues/{n}/comments");
    assert!(
        !fake.calls("GET", &read).is_empty(),
        "the comments were read"
    );
    assert_eq!(items[0]["tier"], 0, "{}", items[0]);
    assert_eq!(items[0]["attempt"], 1, "{}", items[0]);
    s.wait_idle().await;
    let text = inspect(&s, n);
    assert!(!text.contains("ESCALATION-STATE"), "{text}");
    assert!(
        text.contains("carried over: tier 0, 0 attempt(s)"),
        "{text}"
    );
    fake.assert_calls_match_openapi();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_claim_holds_the_pr_until_its_ttl_then_shepherd_takes_over() {
    let extra = format!("claim_ttl_secs = {TTL_SECS}\nstatus_settle_secs = 0\n");
    let s = Scenario::start(&extra).await;
    let fake = &s.fake;
    let n = carried_over_pr(fake, &[CLAIM], &[]);
    s.send(&fake.pr_opened(REPO, n)).await;
    let timeline = format!("/repos/{REPO}/issues/{n}/timeline");
    s.wait_fake("the timeline is read", |f| {
        !f.calls("GET", &timeline).is_empty()
    })
    .await;
    // While held: inspect and the status comment say so, and nothing is dispatched.
    poll_until_named(DEADLINE, "inspect says claimed elsewhere", || async {
        inspect(&s, n).contains("claimed elsewhere")
    })
    .await;
    s.wait_fake("the status comment says claimed elsewhere", |f| {
        f.status_comments(REPO, n)
            .iter()
            .any(|b| b.contains("Claimed elsewhere") && b.contains(CLAIM))
    })
    .await;
    let record = inspect_json(&s, n);
    let claim = &record["record"]["work"]["legacy"]["foreign_claim"];
    let until = claim["until_ms"].as_i64().expect("until");
    assert_eq!(
        claim["timed"], true,
        "timed from the timeline's label event: {claim}"
    );
    assert_eq!(until - claim["since_ms"].as_i64().unwrap(), TTL_SECS * 1000);
    assert!(
        items_for(&s, n).await.is_empty(),
        "no work while claimed elsewhere"
    );

    // The timer at the TTL: the first dispatch, never before `until`.
    let items = s.wait_work_items(1).await;
    assert_eq!(items[0]["number"].as_u64(), Some(n));
    let record = inspect_json(&s, n);
    let active = &record["record"]["work"]["active"];
    let dispatched = active["dispatched_ms"].as_i64().expect("dispatched_ms");
    assert!(
        dispatched >= until,
        "dispatched at {dispatched}, claim held until {until}"
    );
    // Shepherd holds the label as its own claim now (it asked for it with the dispatch).
    s.wait_fake("Shepherd claims the PR", |f| {
        labels_added(f, n).contains(&CLAIM.to_owned())
    })
    .await;
    let legacy = inspect_json(&s, n)["legacy"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        legacy.contains("expired") && legacy.contains("took over"),
        "{legacy}"
    );
    assert!(!legacy.contains("claimed elsewhere"), "{legacy}");
    fake.assert_calls_match_openapi();
}
