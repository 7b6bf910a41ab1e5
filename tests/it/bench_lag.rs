//! End-to-end lag benchmark (issue 4, "Benchmark"): webhook POST → the first Forgejo
//! call it causes, as seen by the fake Forgejo. Ignored by default; run it on a quiet
//! machine with the release binary:
//!
//! ```sh
//! cargo build --release
//! cargo nextest run --release --test it --run-ignored only bench_lag --no-capture
//! BENCH_LAG_RATES="200" BENCH_LAG_SECS=5 cargo nextest run --release --test it \
//!     --run-ignored only bench_lag --no-capture
//! ```
//!
//! Per rate it starts a fresh redis-server (no persistence), the fake Forgejo,
//! `shepherd serve` and one `shepherd work` (separate processes, one key prefix), opens
//! one human PR per delivery in the fake, and sends each PR's signed
//! `pull_request`/`opened` webhook at a fixed pace. The first effect of an opened PR is
//! the sticky status comment, carried out at once (its first call reads the PR's
//! comments); the policy pushes every timer (CI poll, mergeability re-check, stale
//! check) and the periodic resync far beyond the run, so nothing else competes. A
//! delivery's lag is the fake's arrival time of the first call naming that PR minus the
//! instant just before its POST was sent (both clocks are this process's `Instant`).
//!
//! It asserts correctness only: every delivery answered 202 and produced its call.
//! Timing is printed, never asserted. The fake and the load generator run in this
//! process, on the same cores as Shepherd and Redis.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shepherd::app::send::ForgejoRequest;

use crate::support::fake_forgejo::{FakeForgejo, NewPr};
use crate::support::redis::RedisServer;
use crate::support::shepherd::Shepherd;
use crate::support::{poll_until_named, webhook};

/// The repository every PR lives in.
const REPO: &str = "bench/lag";
/// Deliveries sent (and waited for) before the measured run.
const WARM_UP: usize = 50;
/// How long every call may take to show up after the last send.
const DRAIN_DEADLINE: Duration = Duration::from_secs(120);
/// A policy whose only immediate effect on an opened human PR is the status comment.
const POLICY: &str = "\
[defaults]
ci_poll_initial_secs = 86400
ci_poll_max_secs = 86400
mergeability_delay_secs = 86400
merge_retry_secs = 86400
stale_after_secs = 864000
";

/// A signed delivery, shared with the task that sends it.
type Request = Arc<ForgejoRequest>;

/// One delivery of the measured run.
struct Sent {
    /// The PR it opens.
    pr: u64,
    /// Just before the POST.
    at: Instant,
    /// HTTP status answered.
    status: u16,
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run on a quiet machine with --release (see the module docs)"]
async fn bench_lag() {
    let rates = std::env::var("BENCH_LAG_RATES").unwrap_or_else(|_| "200 1000".into());
    let secs: f64 = std::env::var("BENCH_LAG_SECS")
        .ok()
        .map_or(10.0, |s| s.parse().expect("BENCH_LAG_SECS is a number"));
    for rate in rates.split_whitespace() {
        let rate: u32 = rate.parse().expect("BENCH_LAG_RATES holds integers");
        run_rate(rate, secs).await;
    }
}

/// Starts everything afresh, sends `rate` deliveries/s for `secs` s, prints the lags.
async fn run_rate(rate: u32, secs: f64) {
    let redis = RedisServer::start();
    let fake = FakeForgejo::start().await;
    let mut policy = tempfile::NamedTempFile::new().expect("policy file");
    policy.write_all(POLICY.as_bytes()).expect("write policy");
    let logs = tempfile::tempdir().expect("a log directory");
    let log = |name: &str| std::fs::File::create(logs.path().join(name)).expect("log file");
    let serve = Shepherd::builder(&redis)
        .env("SHEPHERD_LOG", "warn")
        .stderr_to(log("serve.log"))
        .start()
        .await;
    let _work = Shepherd::builder(&redis)
        .args(["work"])
        .prefix(serve.prefix())
        .env("SHEPHERD_FORGEJO_URL", fake.url())
        .env("SHEPHERD_FORGEJO_TOKEN", fake.token())
        .env("SHEPHERD_BOT_LOGIN", fake.bot_login())
        .env("SHEPHERD_CONFIG", policy.path().display().to_string())
        .env("SHEPHERD_RESYNC_INTERVAL_SECS", "0")
        .env("SHEPHERD_LOG", "warn")
        .stderr_to(log("work.log"))
        .start()
        .await;

    let total = (f64::from(rate) * secs).round() as usize;
    let requests = prepare(&fake, WARM_UP + total);
    let (warm, measured) = requests.split_at(WARM_UP);
    let http = reqwest::Client::new();
    let url = serve.webhook_url();

    // Warm-up: connections, scripts, caches; its PRs are not counted.
    let warm_sent = send_paced(&http, &url, warm, rate).await;
    wait_for_calls(&fake, &warm_sent, WARM_UP).await;

    let started = Instant::now();
    let sent = send_paced(&http, &url, measured, rate).await;
    let send_secs = started.elapsed().as_secs_f64();
    let accepted = sent.iter().filter(|s| s.status == 202).count();
    let first = wait_for_calls(&fake, &sent, WARM_UP + total).await;

    let mut lags: Vec<Duration> = sent
        .iter()
        .map(|s| first[&s.pr].0.saturating_duration_since(s.at))
        .collect();
    lags.sort_unstable();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for s in &sent {
        *kinds.entry(first[&s.pr].1.clone()).or_default() += 1;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "bench_lag rate={rate}/s sent={} in {send_secs:.2}s ({:.0}/s) accepted(202)={accepted} \
         matched={} p50={:.2}ms p90={:.2}ms p99={:.2}ms max={:.2}ms",
        sent.len(),
        sent.len() as f64 / send_secs,
        lags.len(),
        ms(percentile(&lags, 0.50)),
        ms(percentile(&lags, 0.90)),
        ms(percentile(&lags, 0.99)),
        ms(lags[lags.len() - 1]),
    );
    for (kind, n) in &kinds {
        println!("bench_lag rate={rate}/s   first call {kind}: {n}");
    }
    assert_eq!(accepted, sent.len(), "every delivery is answered 202");
    assert_eq!(lags.len(), total, "every delivery produced its call");
}

/// Opens `n` human PRs; returns each one's number and signed `opened` delivery.
fn prepare(fake: &FakeForgejo, n: usize) -> Vec<(u64, Request)> {
    fake.create_repo(REPO);
    (0..n)
        .map(|i| {
            let pr = fake.open_pr(REPO, NewPr::new("alice", &format!("Change {i}")));
            let hook = fake.pr_opened(REPO, pr);
            let request = webhook::signed(&hook.body(), hook.event_type, &webhook::new_delivery());
            (pr, Arc::new(request))
        })
        .collect()
}

/// Sends `requests` at `rate` per second (each POST in its own task, started on
/// schedule whatever the earlier ones are doing); returns what was sent, in order.
async fn send_paced(
    http: &reqwest::Client,
    url: &str,
    requests: &[(u64, Request)],
    rate: u32,
) -> Vec<Sent> {
    let period = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(requests.len());
    for (i, (pr, request)) in requests.iter().enumerate() {
        let due = start + period.mul_f64(i as f64);
        tokio::time::sleep_until(due).await;
        let (http, url, request, pr) = (http.clone(), url.to_owned(), request.clone(), *pr);
        tasks.push(tokio::spawn(async move {
            let at = Instant::now();
            let status = webhook::post(&http, &url, &request).await.status().as_u16();
            Sent { pr, at, status }
        }));
    }
    let mut sent = Vec::with_capacity(tasks.len());
    for task in tasks {
        sent.push(task.await.expect("a send task"));
    }
    sent
}

/// Waits until every PR of `sent` has its status comment (`comments` in the repository
/// in all), then returns, per PR, the arrival of the first call naming it and that
/// call's kind (`METHOD path` with the number as `{n}`). The wait counts comments in
/// the model instead of copying the call log on every poll, which would hold the
/// fake's lock and burn the CPU the run is measuring.
async fn wait_for_calls(
    fake: &FakeForgejo,
    sent: &[Sent],
    comments: usize,
) -> HashMap<u64, (Instant, String)> {
    let what = format!("{comments} status comments");
    poll_until_named(DRAIN_DEADLINE, &what, || {
        let done = fake.with_model(|m| m.repo_mut(REPO).comments.len()) >= comments;
        async move { done }
    })
    .await;
    let first = first_calls(fake);
    let missing = sent.iter().filter(|s| !first.contains_key(&s.pr)).count();
    assert_eq!(missing, 0, "every delivery produced a call naming its PR");
    first
}

/// The first call naming each PR (`/repos/o/r/issues|pulls/{n}[/…]`).
fn first_calls(fake: &FakeForgejo) -> HashMap<u64, (Instant, String)> {
    let mut first: HashMap<u64, (Instant, String)> = HashMap::new();
    for call in fake.all_calls() {
        let segs: Vec<&str> = call.path.split('/').filter(|s| !s.is_empty()).collect();
        let ["repos", _, _, kind @ ("issues" | "pulls"), n, rest @ ..] = segs.as_slice() else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        let earlier = first.get(&n).is_some_and(|(at, _)| *at <= call.at);
        if !earlier {
            let tail: String = rest.iter().map(|s| format!("/{s}")).collect();
            let name = format!("{} /repos/{{repo}}/{kind}/{{n}}{tail}", call.method);
            first.insert(n, (call.at, name));
        }
    }
    first
}

/// Nearest-rank percentile of sorted `lags`.
fn percentile(lags: &[Duration], q: f64) -> Duration {
    let rank = (q * lags.len() as f64).ceil() as usize;
    lags[rank.clamp(1, lags.len()) - 1]
}
