//! The API-economy benchmark (issue 17), run by `bench/api_calls.sh`; ignored by
//! default. Figures are printed as `BENCH …` lines, never asserted: the test asserts
//! only that each phase reached its end state (merged PRs, a converged drill).
//!
//! 1. **Idle PRs**: `BENCH_ECONOMY_PRS` (40) bot PRs with green CI waiting for review,
//!    the resync every second, calls counted by the fake over `BENCH_ECONOMY_PASSES`
//!    (20) passes, three ways: changed-only passes (the default between full sweeps),
//!    every pass full (`SHEPHERD_RESYNC_FULL_INTERVAL_SECS=0`), and the binary named by
//!    `BENCH_SHEPHERD_BIN_BEFORE` when set (the previous behaviour). Scaled to the
//!    default interval (600 s, a full sweep once a day) as calls per idle PR-hour.
//! 2. **Whole life**: a bot PR opened → CI fails → `ci-fix` → the agent pushes a fix →
//!    green → approved → merged, plus a human PR merged after two approvals, with
//!    Forgejo Actions events announcing the runs and Forgejo's echoes of Shepherd's own
//!    writes sent on; calls by endpoint (the fake's log) and by cause (Shepherd's
//!    metrics), for each binary; each PR's one status comment must end at `merged`.
//! 3. **Lost webhook**: an approval added without its webhook, the resync every
//!    `BENCH_ECONOMY_DRILL_SECS` (5) seconds: the time until the PR is merged.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::fake_forgejo::{Call, NewPr};
use crate::support::scenario::Scenario;

/// The repository of the benchmark.
const REPO: &str = "acme/widgets";
/// Bot marker in the PR bodies.
const BOT_MARKER: &str = "Automated by CleverAgents Bot";
/// What polling agents spend (PR, reviews and combined status every 5 minutes).
const POLLING_PER_PR_HOUR: f64 = 36.0;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `f` with `BENCH_SHEPHERD_BIN` set to `bin` (or unset).
fn with_binary(bin: Option<&str>) {
    // Safety of the environment: this ignored test runs alone (`bench/api_calls.sh`
    // runs it as the only test of its process).
    match bin {
        // SAFETY: no other thread reads the environment while the benchmark sets it.
        Some(b) => unsafe { std::env::set_var("BENCH_SHEPHERD_BIN", b) },
        // SAFETY: as above.
        None => unsafe { std::env::remove_var("BENCH_SHEPHERD_BIN") },
    }
}

/// Sends on every webhook Forgejo would have sent after Shepherd's writes.
async fn send_echoes(s: &Scenario) {
    for hook in s.fake.take_outbox() {
        s.send(&hook).await;
    }
}

fn is_listing(c: &Call) -> bool {
    c.method == "GET" && c.path == format!("/repos/{REPO}/pulls")
}

fn listings(s: &Scenario) -> usize {
    s.fake.all_calls().iter().filter(|c| is_listing(c)).count()
}

/// Waits (polling) until `n` more resync listings have been made.
async fn wait_passes(s: &Scenario, n: usize) {
    let start = listings(s);
    let end = Instant::now() + Duration::from_secs(120);
    while listings(s) < start + n {
        assert!(Instant::now() < end, "resync passes did not come");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Calls per PR and pass of `passes` resync passes over `prs` idle PRs.
async fn idle_run(label: &str, bin: Option<&str>, full: &str, prs: u64, passes: usize) -> f64 {
    with_binary(bin);
    let env = [
        ("SHEPHERD_RESYNC_INTERVAL_SECS", "1"),
        ("SHEPHERD_RESYNC_FULL_INTERVAL_SECS", full),
    ];
    let s = Scenario::start_with_env("", &env).await;
    for i in 0..prs {
        let body = format!("Change {i}.\n\n{BOT_MARKER}");
        let n = s.fake.open_pr(
            REPO,
            NewPr::new("agent-bot", &format!("Change {i}")).body(&body),
        );
        let sha = s.fake.head_sha(REPO, n);
        s.fake.set_status(REPO, &sha, "ci/test", "success", "green");
        s.send(&s.fake.pr_opened(REPO, n)).await;
    }
    s.wait_idle().await;
    send_echoes(&s).await;
    s.wait_idle().await;
    // Warm-up: the first passes read PRs whose reviews were never read.
    wait_passes(&s, 3).await;
    s.fake.clear_calls();
    wait_passes(&s, passes + 1).await;
    let calls = s.fake.all_calls();
    let starts: Vec<usize> = (0..calls.len())
        .filter(|&i| is_listing(&calls[i]))
        .collect();
    let window = &calls[starts[0]..starts[passes]];
    let per = window.len() as f64 / passes as f64 / prs as f64;
    let by = by_endpoint(window);
    println!(
        "BENCH idle {label}: {prs} PRs, {passes} passes, {} calls, {per:.4} calls per PR-pass; by endpoint {by:?}",
        window.len()
    );
    per
}

/// Calls by endpoint template.
fn by_endpoint(calls: &[Call]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for c in calls {
        *out.entry(shepherd::forgejo::endpoint(&c.method, &c.path))
            .or_insert(0) += 1;
    }
    out
}

/// `shepherd_forgejo_api_calls_total` summed by cause.
fn by_cause(metrics: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("shepherd_forgejo_api_calls_total{"))
    {
        let cause = line
            .split("cause=\"")
            .nth(1)
            .and_then(|t| t.split('"').next())
            .unwrap_or("?");
        let n: u64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        *out.entry(cause.to_owned()).or_insert(0) += n;
    }
    out
}

/// One bot PR from a CI failure through an agent's fix to a merge, and a human PR
/// merged after two approvals. Returns the calls made.
async fn life(label: &str, bin: Option<&str>) -> usize {
    with_binary(bin);
    let env = [("SHEPHERD_RESYNC_INTERVAL_SECS", "0")];
    let s = Scenario::start_with_env("", &env).await;
    let fake = &s.fake;
    // The bot PR: CI runs, then fails.
    let body = format!("Adds x.\n\n{BOT_MARKER}");
    let n = fake.open_pr(REPO, NewPr::new("agent-bot", "Add x").body(&body));
    let sha1 = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha1, "ci/test", "pending", "running");
    s.send(&fake.pr_opened(REPO, n)).await;
    s.wait_idle().await;
    send_echoes(&s).await;
    fake.set_status(REPO, &sha1, "ci/test", "failure", "3 tests failed");
    s.send(&fake.action_run(REPO, &sha1, "failure", Some(n)))
        .await;
    let items = s.wait_work_items(1).await;
    let work_id = items[0]["id"].as_str().expect("work id").to_owned();
    s.wait_idle().await;
    send_echoes(&s).await;
    // The agent pushes a fix and reports; CI runs and passes.
    let sha2 = "f1f1f1f1".repeat(5);
    fake.push(REPO, n, &sha2);
    fake.set_status(REPO, &sha2, "ci/test", "pending", "running");
    s.send(&fake.pr_synchronized(REPO, n, "agent-bot")).await;
    s.report(&work_id, "succeeded", None).await;
    s.wait_idle().await;
    send_echoes(&s).await;
    fake.set_status(REPO, &sha2, "ci/test", "success", "green");
    s.send(&fake.action_run(REPO, &sha2, "success", Some(n)))
        .await;
    s.wait_idle().await;
    send_echoes(&s).await;
    let review = fake.add_review(REPO, n, "bob", "APPROVED");
    s.send(&fake.pr_reviewed(REPO, n, review)).await;
    s.wait_fake("the bot PR is merged", |f| {
        f.merges().iter().any(|m| m.number == n)
    })
    .await;
    s.wait_idle().await;
    send_echoes(&s).await;
    s.wait_idle().await;
    // The human PR: green, two approvals.
    let h = fake.open_pr(REPO, NewPr::new("alice", "Fix y"));
    let sha = fake.head_sha(REPO, h);
    fake.set_status(REPO, &sha, "ci/test", "success", "green");
    s.send(&fake.pr_opened(REPO, h)).await;
    s.wait_idle().await;
    send_echoes(&s).await;
    for reviewer in ["bob", "carol"] {
        let r = fake.add_review(REPO, h, reviewer, "APPROVED");
        s.send(&fake.pr_reviewed(REPO, h, r)).await;
        s.wait_idle().await;
        send_echoes(&s).await;
    }
    s.wait_fake("the human PR is merged", |f| {
        f.merges().iter().any(|m| m.number == h)
    })
    .await;
    s.wait_idle().await;
    send_echoes(&s).await;
    s.wait_idle().await;
    if std::env::var_os("BENCH_ECONOMY_TRACE").is_some() {
        // Every record's history and every call in order: where the calls go.
        s.dump().await;
    }
    // The end state, not a figure: each PR has one status comment, and it says merged.
    for pr in [n, h] {
        assert_eq!(status_phases(&s, pr), ["merged"], "{label}: PR #{pr}");
    }
    let calls = fake.all_calls();
    let causes = match bin {
        None => format!("{:?}", by_cause(&s.metrics().await)),
        Some(_) => "(no cause metrics in this build)".to_owned(),
    };
    println!(
        "BENCH life {label}: {} calls; by endpoint {:?}; by cause {causes}",
        calls.len(),
        by_endpoint(&calls)
    );
    calls.len()
}

/// The phases of PR `n`'s status comments (Shepherd keeps exactly one).
fn status_phases(s: &Scenario, n: u64) -> Vec<String> {
    s.fake
        .comments_on(REPO, n)
        .iter()
        .filter_map(|c| shepherd::core::texts::parse_status_comment(&c.body))
        .map(|state| state.phase.as_str().to_owned())
        .collect()
}

/// An approval added without its webhook: seconds until the PR is merged.
async fn drill(secs: u64) -> f64 {
    with_binary(None);
    let interval = secs.to_string();
    let env = [
        ("SHEPHERD_RESYNC_INTERVAL_SECS", interval.as_str()),
        ("SHEPHERD_RESYNC_FULL_INTERVAL_SECS", "315360000"),
    ];
    let s = Scenario::start_with_env("", &env).await;
    let body = format!("Adds z.\n\n{BOT_MARKER}");
    let n = s
        .fake
        .open_pr(REPO, NewPr::new("agent-bot", "Add z").body(&body));
    let sha = s.fake.head_sha(REPO, n);
    s.fake.set_status(REPO, &sha, "ci/test", "success", "green");
    s.send(&s.fake.pr_opened(REPO, n)).await;
    s.wait_idle().await;
    send_echoes(&s).await;
    wait_passes(&s, 2).await;
    let t0 = Instant::now();
    s.fake.add_review(REPO, n, "bob", "APPROVED");
    let end = t0 + Duration::from_secs(secs * 4 + 30);
    while !s.fake.merges().iter().any(|m| m.number == n) {
        assert!(Instant::now() < end, "the lost approval never converged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = t0.elapsed().as_secs_f64();
    println!(
        "BENCH drill lost-approval-webhook: resync every {secs} s, merged {took:.2} s after the approval ({:.2} intervals)",
        took / secs as f64
    );
    took
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run by bench/api_calls.sh"]
async fn bench_api_calls() {
    let prs = env_or("BENCH_ECONOMY_PRS", 40);
    let passes = env_or("BENCH_ECONOMY_PASSES", 20) as usize;
    let before = std::env::var("BENCH_SHEPHERD_BIN_BEFORE").ok();
    let parts = std::env::var("BENCH_ECONOMY_PARTS").unwrap_or_else(|_| "idle,life,drill".into());
    if parts.contains("idle") {
        idle(prs, passes, before.as_deref()).await;
    }
    if parts.contains("life") {
        let now_life = life("now", None).await;
        if let Some(b) = &before {
            let old_life = life("before (previous build)", Some(b)).await;
            println!(
                "BENCH life: {now_life} calls now, {old_life} before ({:.2} of before)",
                now_life as f64 / old_life as f64
            );
        }
    }
    if parts.contains("drill") {
        drill(env_or("BENCH_ECONOMY_DRILL_SECS", 5)).await;
    }
    with_binary(None);
}

/// Part 1: idle PRs, changed-only and full passes, and the previous build's.
async fn idle(prs: u64, passes: usize, before: Option<&str>) {
    let changed = idle_run("changed-only passes", None, "315360000", prs, passes).await;
    let full = idle_run("every pass full", None, "0", prs, passes).await;
    // At the defaults: 6 passes an hour, one of the 144 passes of a day full.
    let passes_per_hour = 3600.0 / 600.0;
    let new_hour = passes_per_hour * (changed + (full - changed) / 144.0);
    println!(
        "BENCH idle per PR-hour at the defaults (600 s, full sweep daily): {new_hour:.3} calls; polling {POLLING_PER_PR_HOUR}: {:.0}x fewer",
        POLLING_PER_PR_HOUR / new_hour
    );
    if let Some(b) = before {
        let old = idle_run("before (previous build)", Some(b), "0", prs, passes).await;
        let old_hour = passes_per_hour * old;
        println!(
            "BENCH idle per PR-hour before: {old_hour:.3} calls; now {:.0}x fewer",
            old_hour / new_hour
        );
    }
}
