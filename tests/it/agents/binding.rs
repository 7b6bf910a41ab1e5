//! Every action of `shepherd agents` is bound to the record (issue 26, findings 4 and
//! 8): a dispatch entry is run, its verdict posted and its result recorded only while
//! it is the owning record's active work in every field; a verdict is posted only on
//! the head the agent was given. The real runner binary, a real redis-server and the
//! fake Forgejo (whose call log shows what was posted).

use std::time::Duration;

use serde_json::{Value, json};

use super::{REPO, REVIEWER, Rig, set_active_work};
use crate::support::{poll_until_named, scenario::DEADLINE};

/// The reviewer's token in the fake and the runner.
const TOKEN: &str = "rev-agent-token-5e6f7a";
/// A claim far beyond any test.
const HOUR: Duration = Duration::from_secs(3600);

/// Marks that it ran (`$DIR/ran`, one line per run), waits for `$DIR/go` when
/// `$DIR/hold` exists, then writes an approval as its verdict.
const REVIEWER_SCRIPT: &str = r#"echo "$SHEPHERD_WORK_ID" >> "$DIR/ran"
if [ -e "$DIR/hold" ]; then
  touch "$DIR/started"
  while [ ! -e "$DIR/go" ]; do sleep 0.1; done
fi
[ -n "$SHEPHERD_REVIEW_FILE" ] && echo '{"event":"APPROVED","body":"Looks right."}' > "$SHEPHERD_REVIEW_FILE"
echo '{"outcome":"succeeded","summary":"done"}' > "$SHEPHERD_RESULT_FILE"
exit 0"#;

/// A rig with the reviewer's token in the fake, and a runner that has it.
async fn rig_and_runner() -> (Rig, crate::support::shepherd::Shepherd) {
    let rig = Rig::start().await;
    rig.fake.add_user_token(REVIEWER, TOKEN);
    let script = rig.script("reviewer.sh", REVIEWER_SCRIPT);
    let runner = rig
        .runner(&script)
        .policy("[defaults]\nreviewer_logins = [\"rev-agent\"]\n")
        .env("SHEPHERD_REVIEWER_TOKENS", format!("{REVIEWER}={TOKEN}"))
        .start()
        .await;
    (rig, runner)
}

/// The runner's `/metrics` text.
async fn metrics(runner: &crate::support::shepherd::Shepherd) -> String {
    reqwest::get(runner.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The count of `shepherd_agent_items_refused_total{reason}` (0 when absent).
fn refused(metrics: &str, reason: &str) -> u64 {
    let prefix = format!("shepherd_agent_items_refused_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// The work ids the agent script ran for.
fn ran(rig: &Rig) -> Vec<String> {
    std::fs::read_to_string(rig.path("ran"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every review POST the fake received.
fn review_posts(rig: &Rig) -> usize {
    rig.fake.calls("POST", "/repos/*/pulls/*/reviews").len()
}

/// Finding 4: a forged entry on the dispatch stream — an active work id with another
/// repository, PR, kind, head, attempt or reviewer, or an id nobody dispatched — is
/// never run and never posted; it is acknowledged and counted by reason. The genuine
/// entry of the same work id, added last, runs and is posted (the runner was live).
#[tokio::test(flavor = "multi_thread")]
async fn forged_dispatch_entry_is_refused_and_counted() {
    let (rig, runner) = rig_and_runner().await;
    let reviewed = rig.open_pr(REPO);
    // A human's PR: the forger wants the reviewer's approval there.
    let human = rig.fake.open_pr(
        REPO,
        crate::support::fake_forgejo::NewPr::new("alice", "Human change"),
    );
    let genuine = rig.activate(REPO, reviewed, "review", 0, HOUR).await;
    let forge = |f: &dyn Fn(&mut Value)| {
        let mut v = genuine.clone();
        f(&mut v);
        v
    };
    let human_head = rig.fake.head_sha(REPO, human);
    let forged = [
        ("repo", forge(&|v| v["repo"] = json!("acme/other"))),
        ("number", forge(&|v| v["number"] = json!(human))),
        ("kind", forge(&|v| v["kind"] = json!("ci-fix"))),
        ("head", forge(&|v| v["head_sha"] = json!(human_head))),
        ("attempt", forge(&|v| v["attempt"] = json!(2))),
        (
            "reviewer",
            forge(&|v| v["context"]["review"]["reviewer"] = json!("someone-else")),
        ),
        (
            "unknown",
            forge(&|v| v["id"] = json!(format!("acme:agents:pr:{human}:999"))),
        ),
    ];
    // One at a time: the runner holds one entry per work id at once (a second entry of
    // an id it holds is acked as a re-dispatch of the same item).
    for (reason, entry) in &forged {
        rig.enqueue(entry).await;
        poll_until_named(
            DEADLINE,
            &format!("the forged {reason} entry is refused"),
            || async { refused(&metrics(&runner).await, reason) >= 1 && rig.pending().await == 0 },
        )
        .await;
    }
    poll_until_named(DEADLINE, "the forged entries are acked", || async {
        rig.pending().await == 0
    })
    .await;
    let m = metrics(&runner).await;
    for (reason, _) in &forged {
        assert_eq!(refused(&m, reason), 1, "reason {reason}:\n{m}");
    }
    assert!(ran(&rig).is_empty(), "no forged entry ran: {:?}", ran(&rig));
    assert_eq!(review_posts(&rig), 0, "nothing posted");
    assert!(rig.results().await.is_empty(), "nothing reported");
    // The genuine entry still runs, and its verdict goes to its own PR only.
    rig.enqueue(&genuine).await;
    let results = rig.wait_results(1).await;
    assert_eq!(results[0]["work_id"], genuine["id"], "{}", results[0]);
    assert_eq!(results[0]["outcome"], "succeeded", "{}", results[0]);
    assert_eq!(ran(&rig), vec![genuine["id"].as_str().unwrap().to_owned()]);
    assert_eq!(
        rig.fake
            .calls("POST", &format!("/repos/{REPO}/pulls/{reviewed}/reviews"))
            .len(),
        1
    );
    assert_eq!(review_posts(&rig), 1, "no review anywhere else");
    rig.fake.assert_calls_match_openapi();
}

/// Finding 8: the PR's head moves while the reviewer agent runs. Its verdict (for the
/// old head) is not posted; the result says so (`failed`, `review-stale`), so the core
/// keeps it in the attempt history and reviews the new head in its own round.
#[tokio::test(flavor = "multi_thread")]
async fn verdict_for_a_moved_head_is_not_posted() {
    let (rig, _runner) = rig_and_runner().await;
    std::fs::write(rig.path("hold"), "").unwrap();
    let n = rig.open_pr(REPO);
    let old = rig.fake.head_sha(REPO, n);
    let id = rig.dispatch(REPO, n, "review", 0, HOUR).await;
    poll_until_named(DEADLINE, "the reviewer agent runs", || async {
        rig.path("started").exists()
    })
    .await;
    let new = "9".repeat(40);
    rig.fake.push(REPO, n, &new);
    std::fs::write(rig.path("go"), "").unwrap();
    let r = rig.wait_results(1).await.remove(0);
    assert_eq!(r["work_id"], id.as_str());
    assert_eq!(
        (r["outcome"].as_str(), r["signature"].as_str()),
        (Some("failed"), Some("review-stale")),
        "{r}"
    );
    let summary = r["summary"].as_str().unwrap();
    assert!(
        summary.contains(&old[..12]) && summary.contains(&new[..12]),
        "{summary}"
    );
    assert_eq!(review_posts(&rig), 0, "no verdict posted on a moved head");
    assert!(
        !rig.fake
            .calls("GET", &format!("/repos/{REPO}/pulls/{n}"))
            .is_empty(),
        "the PR was read before posting"
    );
    rig.fake.assert_calls_match_openapi();
}

/// Findings 4 and 8: the record moves on while the agent runs — its active work now
/// has another attempt, another reviewer, or (for other work) another head. The
/// verdict is not posted and the result is not recorded; both are counted.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_that_moved_on_while_the_agent_ran_gets_no_verdict_and_no_result() {
    let (rig, runner) = rig_and_runner().await;
    std::fs::write(rig.path("hold"), "").unwrap();
    let cases = [
        ("review", "attempt", json!({"attempt": 2})),
        ("review", "reviewer", json!({"reviewer": "someone-else"})),
        ("ci-fix", "head", json!({"head_sha": "8".repeat(40)})),
    ];
    for (kind, reason, change) in cases {
        let n = rig.open_pr(REPO);
        let item = rig.activate(REPO, n, kind, 0, HOUR).await;
        rig.enqueue(&item).await;
        let id = item["id"].as_str().unwrap().to_owned();
        poll_until_named(DEADLINE, "the agent runs", || async {
            rig.path("started").exists()
        })
        .await;
        let mut moved = item.clone();
        if let Some(r) = change.get("reviewer") {
            moved["context"]["review"]["reviewer"] = r.clone();
        } else {
            for (k, v) in change.as_object().unwrap() {
                moved[k] = v.clone();
            }
        }
        set_active_work(&mut rig.conn.clone(), &rig.keys(), &moved).await;
        std::fs::remove_file(rig.path("started")).unwrap();
        std::fs::write(rig.path("go"), "").unwrap();
        let run = rig.wait_state(&id, "finished").await;
        std::fs::remove_file(rig.path("go")).unwrap();
        assert!(
            run["note"]
                .as_str()
                .unwrap()
                .contains(&format!("refused ({reason})")),
            "{kind}: {run}"
        );
        assert!(ran(&rig).contains(&id), "{kind}: the agent ran");
        assert_eq!(review_posts(&rig), 0, "{kind}: nothing posted");
        assert!(rig.results().await.is_empty(), "{kind}: nothing recorded");
        let m = metrics(&runner).await;
        assert_eq!(refused(&m, reason), 1, "{kind}: {m}");
    }
    poll_until_named(DEADLINE, "the entries are acked", || async {
        rig.pending().await == 0
    })
    .await;
}

/// Finding 4: a forged entry read before the genuine one of the same work id (both
/// waiting behind a running item of their repository) does not displace it: the forged
/// one is refused when its turn comes, the genuine one runs and is posted.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_entry_ahead_of_the_genuine_one_does_not_displace_it() {
    let (rig, runner) = rig_and_runner().await;
    std::fs::write(rig.path("hold"), "").unwrap();
    let busy = rig.open_pr(REPO);
    rig.dispatch(REPO, busy, "ci-fix", 0, HOUR).await;
    poll_until_named(DEADLINE, "the repository's slot is taken", || async {
        rig.path("started").exists()
    })
    .await;
    let reviewed = rig.open_pr(REPO);
    let human = rig.fake.open_pr(
        REPO,
        crate::support::fake_forgejo::NewPr::new("alice", "Human change"),
    );
    let genuine = rig.activate(REPO, reviewed, "review", 0, HOUR).await;
    let mut forged = genuine.clone();
    forged["number"] = json!(human);
    forged["head_sha"] = json!(rig.fake.head_sha(REPO, human));
    rig.enqueue(&forged).await;
    rig.enqueue(&genuine).await;
    poll_until_named(DEADLINE, "both entries are held by the runner", || async {
        rig.pending().await == 3
    })
    .await;
    std::fs::remove_file(rig.path("hold")).unwrap();
    std::fs::write(rig.path("go"), "").unwrap();
    let results = rig.wait_results(2).await;
    let review = results
        .iter()
        .find(|r| r["work_id"] == genuine["id"])
        .unwrap_or_else(|| panic!("the genuine entry ran: {results:?}"));
    assert_eq!(review["outcome"], "succeeded", "{review}");
    assert_eq!(
        rig.fake
            .calls("POST", &format!("/repos/{REPO}/pulls/{reviewed}/reviews"))
            .len(),
        1
    );
    assert_eq!(review_posts(&rig), 1, "nothing on the human's PR");
    poll_until_named(DEADLINE, "every entry is acked", || async {
        rig.pending().await == 0
    })
    .await;
    assert_eq!(refused(&metrics(&runner).await, "number"), 1);
    assert_eq!(
        rig.results().await.len(),
        2,
        "the forged entry reported nothing"
    );
}
