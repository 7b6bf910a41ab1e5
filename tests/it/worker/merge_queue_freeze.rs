//! Freezes of the merge queue and its analytics end to end (issue 29): real
//! `shepherd run`, real Redis, the fake Forgejo with its simulated CI. A freeze by
//! command (a writer's, a reader's refused), a freeze window of the policy (times
//! in seconds from the harness clock), a hotfix through a freeze, and the time-in-queue figures on
//! `/metrics` and the status page against the merges the fake saw.

use std::time::{Duration, Instant};

use crate::support::fake_forgejo::NewPr;
use crate::support::fake_forgejo::queue::SimCi;
use crate::support::scenario::Scenario;

/// The repository.
const REPO: &str = "acme/widgets";
/// The simulated CI's context.
const CI: &str = "ci / test";
/// How long a scenario may take to get where it should.
const DEADLINE: Duration = Duration::from_secs(150);

/// A scenario with the queue on (plus `extra` policy lines) and a 300 ms CI.
async fn start(extra: &str) -> Scenario {
    let s = Scenario::start(&format!("merge_queue = true\n{extra}")).await;
    s.fake
        .simulate_ci(REPO, SimCi::new(CI, Duration::from_millis(300)));
    s
}

/// Opens a bot PR on `main` (with `labels`) and waits for its own CI to finish.
async fn open_green(s: &Scenario, title: &str, labels: &[&str]) -> u64 {
    let mut new = NewPr::new("agent-bot", title);
    for l in labels {
        new = new.label(l);
    }
    let pr = s.fake.open_pr(REPO, new);
    s.send(&s.fake.pr_opened(REPO, pr)).await;
    run_until(s, "the PR's own CI finished", |s| {
        s.fake
            .with_model(|m| m.repos[REPO].ci.as_ref().is_some_and(|c| c.runs.is_empty()))
    })
    .await;
    pr
}

/// A writer approves PR `n`.
async fn approve(s: &Scenario, n: u64) {
    let id = s
        .fake
        .with_model(|m| m.add_review(REPO, n, "reviewer", "APPROVED"));
    s.send(&s.fake.pr_reviewed(REPO, n, id)).await;
}

/// `user` comments `body` on PR `n`.
async fn comment(s: &Scenario, n: u64, user: &str, body: &str) {
    let id = s.fake.add_comment(REPO, n, user, body);
    s.send(&s.fake.comment_created(REPO, id)).await;
}

/// Delivers finished CI runs and the echoes of Shepherd's writes.
async fn pump(s: &Scenario) {
    let hooks: Vec<_> = (s.fake.finish_ci_runs().into_iter())
        .chain(s.fake.take_outbox())
        .collect();
    for hook in hooks {
        s.send(&hook).await;
    }
}

/// Runs the world until `cond` holds (a deadline, never a timed assertion).
async fn run_until(s: &Scenario, what: &str, cond: impl Fn(&Scenario) -> bool) {
    let end = Instant::now() + DEADLINE;
    loop {
        pump(s).await;
        if cond(s) {
            return;
        }
        if Instant::now() > end {
            s.dump().await;
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The PRs merged into `main`, in order.
fn merged(s: &Scenario) -> Vec<u64> {
    (s.fake.merges().into_iter())
        .filter(|m| m.repo == REPO)
        .map(|m| m.number)
        .collect()
}

/// Whether a bot comment on PR `n` contains `text`.
fn bot_said(s: &Scenario, n: u64, text: &str) -> bool {
    (s.fake.comments_on(REPO, n).iter())
        .any(|c| c.user == s.fake.bot_login() && c.body.contains(text))
}

/// `main`'s queue as stored in Redis.
async fn stored_queue(s: &Scenario) -> shepherd::core::queue::BranchQueue {
    let key = s.shepherd.keys().merge_queue(REPO, "main");
    let mut conn = s.redis_conn();
    let data: Option<String> = redis::cmd("HGET")
        .arg(&key)
        .arg("data")
        .query_async(&mut conn)
        .await
        .expect("HGET the queue");
    data.map_or_else(
        || shepherd::core::queue::BranchQueue::new("main"),
        |d| serde_json::from_str(&d).expect("queue JSON"),
    )
}

/// Waits until the stored queue satisfies `cond` (delivering meanwhile).
async fn wait_queue(
    s: &Scenario,
    what: &str,
    cond: impl Fn(&shepherd::core::queue::BranchQueue) -> bool,
) {
    let end = Instant::now() + DEADLINE;
    while !cond(&stored_queue(s).await) {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        pump(s).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of the metric line starting with `series` (labels sorted by name).
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// A reader's `/shepherd freeze` is refused and freezes nothing; a writer's freezes
/// the queue: the tested head is held (its status comment and the status page say
/// why and until when, `/metrics` shows the freeze) and nothing merges until the
/// writer's `/shepherd unfreeze`. Then the time in queue on `/metrics` and the status
/// page matches the merge the fake saw.
#[tokio::test(flavor = "multi_thread")]
async fn a_writer_freezes_and_unfreezes_the_queue_and_a_reader_is_refused() {
    let s = start("").await;
    s.fake.set_permission(REPO, "mallory", "read");
    let pr = open_green(&s, "Change", &[]).await;
    comment(&s, pr, "mallory", "/shepherd freeze main mine now").await;
    run_until(&s, "the refusal", |s| bot_said(s, pr, "mallory")).await;
    assert_eq!(
        stored_queue(&s).await.freeze,
        None,
        "a reader freezes nothing"
    );

    comment(&s, pr, "acme", "/shepherd freeze main release 2.0 is cut").await;
    run_until(&s, "the freeze's answer", |s| {
        bot_said(s, pr, "Freezing the merge queue of `main` (by @acme)")
    })
    .await;
    wait_queue(&s, "the freeze stored", |q| q.freeze.is_some()).await;
    approve(&s, pr).await;
    let note = "the merge queue of `main` is frozen (by @acme: release 2.0 is cut) until `/shepherd unfreeze main`";
    run_until(&s, "the head held by the freeze", |s| bot_said(s, pr, note)).await;
    assert!(merged(&s).is_empty(), "nothing merges while frozen");
    let page = s.status_page().await;
    assert!(page.contains(&format!("Frozen: {note}")), "{page}");
    let frozen = "shepherd_merge_queue_frozen{branch=\"main\",repo=\"acme/widgets\"}";
    s.metrics_until("the queue frozen", |m| metric(m, frozen) == Some(1.0))
        .await;

    comment(&s, pr, "acme", "/shepherd unfreeze main").await;
    run_until(&s, "the merge after the unfreeze", |s| merged(s) == [pr]).await;
    wait_queue(&s, "the merge counted", |q| q.stats.merged == 1).await;
    let q = stored_queue(&s).await;
    assert_eq!(q.freeze, None);
    let waited = q.stats.recent_waits.back().expect("a sample").wait_ms;
    assert_analytics_match(&s, 1, waited).await;
}

/// `/metrics` and the status page show `merges` merges in the last 24 h and 7 d,
/// the longest after `max_ms` in queue (as stored from the merges).
async fn assert_analytics_match(s: &Scenario, merges: u64, max_ms: u64) {
    let series = |window: &str, stat: &str| {
        format!(
            "shepherd_merge_queue_time_in_queue_seconds{{branch=\"main\",repo=\"acme/widgets\",stat=\"{stat}\",window=\"{window}\"}}"
        )
    };
    let metrics = s
        .metrics_until(&format!("{merges} merges in both windows"), |m| {
            ["24h", "7d"]
                .iter()
                .all(|w| metric(m, &series(w, "count")) == Some(merges as f64))
        })
        .await;
    for window in ["24h", "7d"] {
        let count = metric(&metrics, &series(window, "count"));
        assert_eq!(count, Some(merges as f64), "{metrics}");
        let max = metric(&metrics, &series(window, "max")).expect("max");
        assert!(
            (max - max_ms as f64 / 1000.0).abs() < 1e-6,
            "{max} vs {max_ms}"
        );
    }
    let page = s.status_page().await;
    let row = format!("<tr><td>last 24 h</td><td>{merges}</td>");
    assert!(page.contains(&row), "{page}");
    assert!(page.contains(&format!("{merges} merged")), "{page}");
}

/// `HH:MM:SS` (UTC) of the unix time `ms`.
fn hhmmss(ms: i64) -> String {
    let s = ms.div_euclid(1_000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", s / 3_600, s / 60 % 60, s % 60)
}

/// A freeze window of the policy (`HH:MM:SS`, from the harness clock) that began a
/// minute ago and ends 25 s from now (time for the processes to start and the PR to
/// become the tested head on a loaded machine) holds the tested head; at the window's
/// end the head merges, and not before.
#[tokio::test(flavor = "multi_thread")]
async fn a_freeze_window_holds_merges_and_releases_at_its_end() {
    let now_ms = chrono::Utc::now().timestamp_millis();
    let end_ms = (now_ms + 25_000).div_euclid(1_000) * 1_000;
    let window = format!(
        "merge_queue_freeze = [{{ branch = \"main\", from = \"{}\", to = \"{}\", reason = \"deploy window\" }}]\n",
        hhmmss(end_ms - 85_000),
        hhmmss(end_ms),
    );
    let s = start(&window).await;
    let pr = open_green(&s, "Change", &[]).await;
    approve(&s, pr).await;
    run_until(&s, "the head held by the window", |s| {
        bot_said(s, pr, "is frozen (policy window: deploy window) until")
    })
    .await;
    assert!(merged(&s).is_empty(), "nothing merges in the window");
    assert!(
        s.status_page()
            .await
            .contains("Frozen: the merge queue of `main` is frozen (policy window: deploy window)"),
        "the status page shows the window"
    );
    run_until(&s, "the merge after the window", |s| merged(s) == [pr]).await;
    let merged_at = chrono::Utc::now().timestamp_millis();
    assert!(
        merged_at >= end_ms,
        "merged at {merged_at}, before the window's end {end_ms}"
    );
}

/// While the queue is frozen, a PR labelled `hotfix` goes to the front (it takes the
/// head from the held PR), merges through the freeze, and the held PR merges after
/// the unfreeze on top of it.
#[tokio::test(flavor = "multi_thread")]
async fn a_hotfix_goes_through_a_freeze_at_the_front() {
    let s = start("").await;
    let held = open_green(&s, "Feature", &[]).await;
    let hotfix = open_green(&s, "Fix the outage", &["hotfix"]).await;
    comment(&s, held, "acme", "/shepherd freeze main incident").await;
    wait_queue(&s, "the freeze stored", |q| q.freeze.is_some()).await;
    approve(&s, held).await;
    run_until(&s, "the feature held", |s| {
        bot_said(s, held, "is frozen (by @acme: incident)")
    })
    .await;
    approve(&s, hotfix).await;
    run_until(&s, "the hotfix merged", |s| merged(s) == [hotfix]).await;
    let q = stored_queue(&s).await;
    assert!(q.freeze.is_some(), "still frozen");
    assert_eq!(merged(&s), [hotfix], "the feature still waits");
    comment(&s, held, "acme", "/shepherd unfreeze main").await;
    run_until(&s, "the feature merged after the unfreeze", |s| {
        merged(s) == [hotfix, held]
    })
    .await;
    wait_queue(&s, "both merges counted", |q| q.stats.merged == 2).await;
    let q = stored_queue(&s).await;
    let max = (q.stats.recent_waits.iter())
        .map(|w| w.wait_ms)
        .max()
        .expect("samples");
    assert_analytics_match(&s, 2, max).await;
}
