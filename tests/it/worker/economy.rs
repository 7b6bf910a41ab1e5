//! API economy (issue 17): the periodic resync reads only PRs that may have changed,
//! a full sweep at its own interval catches what the PR list cannot show, the
//! pre-merge re-check stays strict, and a lost webhook still converges. Real
//! `shepherd run`, real Redis, the fake Forgejo; changes are made in the fake *without*
//! the webhook Forgejo would send, as when a delivery is lost.

use serde_json::Value;

use crate::support::fake_forgejo::{Call, FakeForgejo, Fault, NewPr};
use crate::support::poll_until_named;
use crate::support::scenario::{DEADLINE, Scenario};

/// The repository of these tests.
const REPO: &str = "acme/widgets";
/// Bot marker in the PR bodies.
const BOT_MARKER: &str = "Automated by CleverAgents Bot";
/// A full-sweep interval no test run reaches (ten years).
const NEVER: &str = "315360000";

/// `shepherd run` resyncing every second, with full sweeps every `full` seconds.
async fn start(policy: &str, full: &str) -> Scenario {
    let env = [
        ("SHEPHERD_RESYNC_INTERVAL_SECS", "1"),
        ("SHEPHERD_RESYNC_FULL_INTERVAL_SECS", full),
    ];
    Scenario::start_with_env(policy, &env).await
}

/// Opens a bot PR with CI `state` on its head, sends `pull_request` opened and the
/// echoes of Shepherd's writes; returns its number.
async fn open_bot_pr(s: &Scenario, title: &str, state: &str) -> u64 {
    let body = format!("Adds a thing.\n\n{BOT_MARKER}");
    let n = s
        .fake
        .open_pr(REPO, NewPr::new("agent-bot", title).body(&body));
    let sha = s.fake.head_sha(REPO, n);
    s.fake.set_status(REPO, &sha, "ci/test", state, "tests");
    s.send(&s.fake.pr_opened(REPO, n)).await;
    n
}

/// Sends every webhook Forgejo would have sent after Shepherd's own writes.
async fn send_echoes(s: &Scenario) {
    for hook in s.fake.take_outbox() {
        s.send(&hook).await;
    }
}

/// Is `c` a resync listing of the open PRs?
fn is_listing(c: &Call) -> bool {
    c.method == "GET" && c.path == format!("/repos/{REPO}/pulls")
}

/// Is `c` a read of PR `n`'s reviews?
fn is_pr_read(c: &Call, n: u64) -> bool {
    c.method == "GET" && c.path == format!("/repos/{REPO}/pulls/{n}/reviews")
}

/// Is `c` a combined-status read?
fn is_status_read(c: &Call) -> bool {
    c.method == "GET"
        && c.path.starts_with(&format!("/repos/{REPO}/commits/"))
        && c.path.ends_with("/status")
}

/// The calls of the last `passes` complete resync passes (each from one listing to
/// the next), when that many have happened.
fn last_passes(fake: &FakeForgejo, passes: usize) -> Option<Vec<Call>> {
    let calls = fake.all_calls();
    let starts: Vec<usize> = (0..calls.len())
        .filter(|&i| is_listing(&calls[i]))
        .collect();
    if starts.len() < passes + 1 {
        return None;
    }
    let from = starts[starts.len() - passes - 1];
    let to = starts[starts.len() - 1];
    Some(calls[from..to].to_vec())
}

/// Is `c` a read of one PR (anything below `…/pulls/{n}`) or of a combined status?
fn reads_a_pr(c: &Call) -> bool {
    c.method == "GET" && (c.path.contains("/pulls/") || is_status_read(c))
}

/// Waits until `passes` resync passes in a row read nothing but the listing.
async fn wait_quiet(s: &Scenario, passes: usize) {
    poll_until_named(
        DEADLINE,
        "resync passes that read nothing but the PR list",
        || {
            let quiet =
                last_passes(&s.fake, passes).is_some_and(|calls| !calls.iter().any(reads_a_pr));
            async move { quiet }
        },
    )
    .await;
}

/// The stored record of PR `n` as JSON.
async fn record(s: &Scenario, n: u64) -> Value {
    let key = s.shepherd.keys().pr_record(REPO, n);
    let data: String = redis::cmd("HGET")
        .arg(&key)
        .arg("data")
        .query_async(&mut s.redis_conn())
        .await
        .expect("the PR's record");
    serde_json::from_str(&data).expect("record JSON")
}

/// Idle PRs cost one listing per pass and nothing more; each kind of change that the
/// list shows (a review, a pushed head, a label, mergeability) is read within one pass
/// although no webhook announced it; a PR that did not change is still not read; and
/// a bot PR whose approval webhook was lost is merged by the resync alone.
#[tokio::test(flavor = "multi_thread")]
async fn economy_unchanged_prs_are_not_reread_and_each_change_is() {
    let s = start("", NEVER).await;
    let prs = [
        open_bot_pr(&s, "Review me", "success").await,
        open_bot_pr(&s, "Push to me", "success").await,
        open_bot_pr(&s, "Label me", "success").await,
        open_bot_pr(&s, "Conflict me", "success").await,
        open_bot_pr(&s, "Leave me", "success").await,
    ];
    s.wait_idle().await;
    send_echoes(&s).await;
    wait_quiet(&s, 3).await;
    let quiet = last_passes(&s.fake, 3).expect("three passes");
    assert!(
        !quiet.iter().any(reads_a_pr),
        "idle PRs were read: {:?}",
        quiet
            .iter()
            .map(|c| format!("{} {}", c.method, c.path))
            .collect::<Vec<_>>()
    );

    // Changes without their webhooks.
    let mark = s.fake.all_calls().len();
    let [reviewed, pushed, labelled, conflicted, untouched] = prs;
    s.fake.add_review(REPO, reviewed, "bob", "APPROVED");
    let new_head = "feedbeef".repeat(5);
    s.fake.push(REPO, pushed, &new_head);
    s.fake
        .set_status(REPO, &new_head, "ci/test", "pending", "running");
    s.fake.add_label(REPO, labelled, "needs docs");
    s.fake.set_mergeable(REPO, conflicted, false);

    s.wait_fake("the approved PR is merged by the resync alone", |f| {
        f.merges().iter().any(|m| m.number == reviewed)
    })
    .await;
    let status_path = format!("/repos/{REPO}/commits/{new_head}/status");
    s.wait_fake("the new head's CI is read", |f| {
        !f.calls("GET", &status_path).is_empty()
    })
    .await;
    s.wait_fake("the labelled PR is read again", |f| {
        f.all_calls()[mark..]
            .iter()
            .any(|c| is_pr_read(c, labelled))
    })
    .await;
    s.wait_fake("the PR gone unmergeable is read again", |f| {
        f.all_calls()[mark..]
            .iter()
            .any(|c| is_pr_read(c, conflicted))
    })
    .await;
    // Two more passes after everything converged, then the untouched PR's reads.
    let listings = s.fake.all_calls().iter().filter(|c| is_listing(c)).count();
    s.wait_fake("two more resync passes", |f| {
        f.all_calls().iter().filter(|c| is_listing(c)).count() >= listings + 2
    })
    .await;
    let untouched_reads: Vec<String> = s.fake.all_calls()[mark..]
        .iter()
        .filter(|c| c.method == "GET" && c.path.contains(&format!("/pulls/{untouched}")))
        .map(|c| c.path.clone())
        .collect();
    assert!(
        untouched_reads.is_empty(),
        "the PR that did not change was read: {untouched_reads:?}"
    );
    let record = record(&s, labelled).await;
    assert!(
        record["pr"]["labels"].to_string().contains("needs docs"),
        "the label reached the record: {record}"
    );
    let metrics = s.metrics().await;
    for decision in ["skipped", "updated", "new-head"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("shepherd_resync_prs_total")
                    && l.contains(&format!("decision=\"{decision}\""))),
            "no resync decision {decision}: {metrics}"
        );
    }
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("shepherd_forgejo_api_calls_total")
                && l.contains("endpoint=\"GET /repos/{owner}/{repo}/pulls\"")
                && l.contains("cause=\"resync\"")),
        "{metrics}"
    );
    s.fake.assert_calls_match_openapi();
}

/// A dismissed approval moves neither the head nor (in this model) `updated_at`, so
/// changed-only passes cannot see it: the full sweep reads every open PR and brings the
/// dismissal into the record.
#[tokio::test(flavor = "multi_thread")]
async fn economy_full_sweep_catches_a_dismissed_review() {
    let s = start("approvals_bot = 2\n", "5").await;
    let n = open_bot_pr(&s, "Needs two", "success").await;
    let review = s.fake.add_review(REPO, n, "bob", "APPROVED");
    s.send(&s.fake.pr_reviewed(REPO, n, review)).await;
    s.wait_idle().await;
    send_echoes(&s).await;
    // Changed-only passes have stopped reading the PR before the dismissal.
    wait_quiet(&s, 2).await;
    let bob = |r: Value| r["reviews"]["latest"]["bob"].clone();
    assert_eq!(
        bob(record(&s, n).await)["dismissed"],
        false,
        "approval seen"
    );
    let before = full_reads(&s).await;
    s.fake.update_review(REPO, review, |r| r.dismissed = true);
    poll_until_named(DEADLINE, "the dismissal in the record", || async {
        bob(record(&s, n).await)["dismissed"] == true
    })
    .await;
    assert!(
        full_reads(&s).await > before,
        "a full sweep read the PR after the dismissal"
    );
    assert!(s.fake.merges().is_empty(), "one approval short: no merge");
}

/// PRs read by full resync passes so far (`shepherd_resync_prs_total{decision="full"}`).
async fn full_reads(s: &Scenario) -> u64 {
    let metrics = s.metrics().await;
    metrics
        .lines()
        .find(|l| l.starts_with("shepherd_resync_prs_total") && l.contains("decision=\"full\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or(0)
}

/// A dismissal Shepherd has not seen when the PR turns ready is caught right before
/// the merge: the reviews are read again and nothing is merged. The resync is off, so
/// only the CI poll and the pre-merge re-check read anything.
#[tokio::test(flavor = "multi_thread")]
async fn economy_merge_recheck_catches_a_dismissed_review() {
    let env = [("SHEPHERD_RESYNC_INTERVAL_SECS", "0")];
    let s = Scenario::start_with_env("", &env).await;
    let n = open_bot_pr(&s, "Pending first", "pending").await;
    let review = s.fake.add_review(REPO, n, "bob", "APPROVED");
    s.send(&s.fake.pr_reviewed(REPO, n, review)).await;
    let reviews_path = format!("/repos/{REPO}/pulls/{n}/reviews");
    s.wait_idle().await;
    // The approval webhook is noted, not read: the re-check before a merge reads it.
    let before = s.fake.calls("GET", &reviews_path).len();
    assert_eq!(before, 0, "an approval webhook costs no reviews read");
    s.fake.update_review(REPO, review, |r| r.dismissed = true);
    let sha = s.fake.head_sha(REPO, n);
    s.fake.set_status(REPO, &sha, "ci/test", "success", "green");
    s.wait_fake("the reviews are read again before merging", |f| {
        f.calls("GET", &reviews_path).len() > before
    })
    .await;
    s.wait_idle().await;
    assert!(
        s.fake.merges().is_empty(),
        "a dismissed approval never merges"
    );
    assert!(
        s.fake
            .calls("POST", &format!("/repos/{REPO}/pulls/{n}/merge"))
            .is_empty(),
        "no merge was even tried"
    );
}

/// The sticky status comment is found once: later edits go straight to its id
/// (no comment listing before each edit), and a deleted comment is created again.
#[tokio::test(flavor = "multi_thread")]
async fn economy_status_comment_id_is_cached_and_recovers_when_deleted() {
    let env = [("SHEPHERD_RESYNC_INTERVAL_SECS", "0")];
    let s = Scenario::start_with_env("", &env).await;
    let n = open_bot_pr(&s, "Watch my status", "pending").await;
    let comments = format!("/repos/{REPO}/issues/{n}/comments");
    s.wait_fake("the status comment is created", |f| {
        !f.calls("POST", &comments).is_empty()
    })
    .await;
    s.wait_idle().await;
    let lists = s.fake.calls("GET", &comments).len();
    let sha = s.fake.head_sha(REPO, n);
    s.fake
        .set_status(REPO, &sha, "ci/test", "failure", "1 test failed");
    s.wait_fake("the status comment is edited", |f| {
        !f.calls("PATCH", &format!("/repos/{REPO}/issues/comments/*"))
            .is_empty()
    })
    .await;
    s.wait_idle().await;
    assert_eq!(
        s.fake.calls("GET", &comments).len(),
        lists,
        "the edit went to the cached id without listing the comments"
    );
    // Someone deletes the status comment; the next status change (the agent pushes a
    // fix) creates it again.
    s.fake.with_model(|m| {
        m.repo_mut(REPO)
            .comments
            .retain(|c| !c.body.contains("SHEPHERD-STATE"))
    });
    let created = s.fake.calls("POST", &comments).len();
    let fix = "c0ffee00".repeat(5);
    s.fake.push(REPO, n, &fix);
    s.fake
        .set_status(REPO, &fix, "ci/test", "pending", "running");
    s.send(&s.fake.pr_synchronized(REPO, n, "agent-bot")).await;
    s.wait_fake("the deleted status comment is created again", |f| {
        f.calls("POST", &comments).len() > created
    })
    .await;
    s.wait_idle().await;
    let status_comments = s.fake.status_comments(REPO, n).len();
    assert_eq!(status_comments, 1, "exactly one status comment again");
    let patches = s
        .fake
        .calls("PATCH", &format!("/repos/{REPO}/issues/comments/*"));
    assert!(
        patches.iter().any(|c| c.status == 404),
        "the edit of the cached id found the comment gone: {:?}",
        patches.iter().map(|c| c.status).collect::<Vec<_>>()
    );
}

/// Once a Forgejo Actions event arrives for a head, its CI-poll backoff reads stop:
/// the poll's timer fires without a read and is not scheduled again while CI is still
/// pending, and the next Actions event triggers the read that settles it.
#[tokio::test(flavor = "multi_thread")]
async fn economy_actions_events_stop_the_ci_poll_of_their_head() {
    let env = [("SHEPHERD_RESYNC_INTERVAL_SECS", "0")];
    let s = Scenario::start_with_env("", &env).await;
    let n = open_bot_pr(&s, "Actions CI", "pending").await;
    let sha = s.fake.head_sha(REPO, n);
    let status_path = format!("/repos/{REPO}/commits/{sha}/status");
    s.wait_fake("a first backoff read", |f| {
        !f.calls("GET", &status_path).is_empty()
    })
    .await;
    s.send(&s.fake.action_run(REPO, &sha, "success", Some(n)))
        .await;
    poll_until_named(
        DEADLINE,
        "the poll of the head handed to events",
        || async { record(&s, n).await["ci_poll"]["events"] == true },
    )
    .await;
    let timers = s.shepherd.keys().timers(0);
    let conn = s.redis_conn();
    poll_until_named(DEADLINE, "no CI-poll timer left", || {
        let (timers, mut conn) = (timers.clone(), conn.clone());
        async move {
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(&timers)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            !members.iter().any(|m| m.contains("ci-poll"))
        }
    })
    .await;
    s.wait_idle().await;
    let reads = s.fake.calls("GET", &status_path).len();
    assert!(
        record(&s, n).await["ci"].to_string().contains("pending"),
        "CI still pending: no settle hid the stop"
    );
    // The run finishes: its event triggers the one read that settles CI.
    s.fake.set_status(REPO, &sha, "ci/test", "success", "green");
    s.send(&s.fake.action_run(REPO, &sha, "success", Some(n)))
        .await;
    s.wait_phase(REPO, n, "awaiting-review").await;
    assert_eq!(s.fake.calls("GET", &status_path).len(), reads + 1);
}

/// The phases of the status comment writes (creates and edits) on PR `n`, in order.
fn status_writes(fake: &FakeForgejo, n: u64) -> Vec<String> {
    let created = format!("/repos/{REPO}/issues/{n}/comments");
    fake.all_calls()
        .iter()
        .filter(|c| {
            (c.method == "POST" && c.path == created)
                || (c.method == "PATCH"
                    && c.path
                        .starts_with(&format!("/repos/{REPO}/issues/comments/")))
        })
        .filter_map(|c| c.body.get("body").and_then(Value::as_str))
        .filter_map(shepherd::core::texts::parse_status_comment)
        .map(|state| state.phase.as_str().to_owned())
        .collect()
}

/// The one status comment of PR `n` (asserting there is exactly one).
fn the_status_comment(s: &Scenario, n: u64) -> String {
    let status = s.fake.status_comments(REPO, n);
    assert_eq!(status.len(), 1, "exactly one status comment: {status:?}");
    status[0].clone()
}

/// A merge that goes through in a second (approval → ready → merging → merged) edits
/// the status comment once, to `merged`: the short-lived phases settle
/// (`status_settle_secs`, default 10 s) and are replaced before they are written, and
/// the comment ends with the true final phase. The PR had no comments, so its first
/// status comment was created without listing the comments; the approval webhook was
/// not read, and the reviews were read once, by the re-check before the merge.
#[tokio::test(flavor = "multi_thread")]
async fn economy_a_fast_merge_ends_the_status_comment_at_merged_in_one_edit() {
    let env = [("SHEPHERD_RESYNC_INTERVAL_SECS", "0")];
    let s = Scenario::start_with_env("", &env).await;
    let n = open_bot_pr(&s, "Quick one", "success").await;
    s.wait_fake("the first status comment is written", |f| {
        !status_writes(f, n).is_empty()
    })
    .await;
    s.wait_idle().await;
    send_echoes(&s).await;
    let review = s.fake.add_review(REPO, n, "bob", "APPROVED");
    s.send(&s.fake.pr_reviewed(REPO, n, review)).await;
    s.wait_fake("the PR is merged", |f| {
        f.merges().iter().any(|m| m.number == n)
    })
    .await;
    s.wait_fake("the status comment says merged", |f| {
        status_writes(f, n).last().map(String::as_str) == Some("merged")
    })
    .await;
    s.wait_idle().await;
    assert_eq!(
        status_writes(&s.fake, n),
        ["awaiting-review", "merged"],
        "the first status came from the first CI read, and ready-to-merge and merging \
         were never written"
    );
    let body = the_status_comment(&s, n);
    let state = shepherd::core::texts::parse_status_comment(&body).expect("state block");
    assert_eq!(state.phase.as_str(), "merged");
    let comments = format!("/repos/{REPO}/issues/{n}/comments");
    assert!(
        s.fake.calls("GET", &comments).is_empty(),
        "the PR had no comments: its status comment was created without a listing"
    );
    let reviews = format!("/repos/{REPO}/pulls/{n}/reviews");
    assert_eq!(
        s.fake.calls("GET", &reviews).len(),
        1,
        "one reviews read, the re-check's"
    );
}

/// A first status comment created without a listing whose answer is lost (Forgejo
/// created it, the answer was a 500) is found by the retry, which lists the comments
/// because of the note left before the create: never posted twice. A PR that already
/// had a comment lists before its first status comment.
#[tokio::test(flavor = "multi_thread")]
async fn economy_a_first_status_comment_whose_answer_is_lost_is_found_not_posted_again() {
    let env = [("SHEPHERD_RESYNC_INTERVAL_SECS", "0")];
    let s = Scenario::start_with_env("", &env).await;
    s.fake.inject(
        Fault::on("POST", &format!("/repos/{REPO}/issues/*/comments"))
            .apply_then(500)
            .times(1),
    );
    let n = open_bot_pr(&s, "Lost answer", "pending").await;
    let comments = format!("/repos/{REPO}/issues/{n}/comments");
    s.wait_fake("the retry lists the comments", |f| {
        !f.calls("GET", &comments).is_empty()
    })
    .await;
    s.wait_idle().await;
    let posts: Vec<u16> = s
        .fake
        .calls("POST", &comments)
        .iter()
        .map(|c| c.status)
        .collect();
    assert_eq!(
        posts,
        [500],
        "created once (answered 500), never posted again"
    );
    let body = the_status_comment(&s, n);
    assert!(body.contains("awaiting-ci"), "{body}");

    // A PR with a comment already: the first status comment is looked for first.
    let body = format!("Adds another thing.\n\n{BOT_MARKER}");
    let m = s
        .fake
        .open_pr(REPO, NewPr::new("agent-bot", "Discussed").body(&body));
    s.fake
        .add_comment(REPO, m, "alice", "Before you start: see #1");
    let sha = s.fake.head_sha(REPO, m);
    s.fake.set_status(REPO, &sha, "ci/test", "pending", "tests");
    s.send(&s.fake.pr_opened(REPO, m)).await;
    let listed = format!("/repos/{REPO}/issues/{m}/comments");
    s.wait_fake("the status comment of the commented PR is created", |f| {
        !f.calls("POST", &listed).is_empty()
    })
    .await;
    s.wait_idle().await;
    assert_eq!(
        s.fake.calls("GET", &listed).len(),
        1,
        "listed before creating"
    );
    the_status_comment(&s, m);
}
