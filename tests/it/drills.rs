//! Fault drills of issue 7 on the real binary and a real redis-server (items 1, 2 and
//! 5; items 3 and 4 are in `scenarios::faults`): Redis killed while deliveries pour
//! in, workers SIGKILLed again and again, and Redis unreachable for 10 s from the
//! workers. Each drill reuses the horizontal-scale harness (`worker::scale`): PRs with
//! red CI on the fake Forgejo, signed deliveries through `shepherd serve`, and its
//! exactly-once and no-duplicate-effect assertions. Each prints its figures (the
//! numbers in docs/reliability.md).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use rand::Rng;
use shepherd::app::send::ForgejoRequest;

use crate::support::fake_forgejo::FakeForgejo;
use crate::support::poll_until_named;
use crate::support::redis::{Aof, Backend, RedisServer, TestConn, stream_entries};
use crate::support::shepherd::Shepherd;
use crate::support::webhook::{post, signed};
use crate::worker::scale::{
    CONCURRENCY, Planned, Pr, REPO, assert_exactly_once, assert_no_duplicate_side_effects, by_pr,
    fast_poll_policy, is_cluster, prepare, prepare_spread, prs_of, shards, start_worker,
    wait_committed, wait_settled,
};

/// A delivery's answer: (PR, delivery id, HTTP status).
type Answer = (Pr, String, u16);

/// Posts `plan` with [`CONCURRENCY`] requests in flight, counting answers in `done`.
fn post_in_background(
    url: String,
    plan: Vec<Planned>,
    done: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Vec<Answer>> {
    // Signed up front: the task then holds no borrowed event names (and PRs travel as
    // indexes: a borrowed repository name in the stream trips the spawn's lifetimes).
    let prs: Vec<Pr> = plan.iter().map(|(n, _, _, _)| *n).collect();
    let requests: Vec<(usize, String, ForgejoRequest)> = plan
        .into_iter()
        .enumerate()
        .map(|(i, (_, d, t, b))| {
            let request = signed(&b, t, &d);
            (i, d, request)
        })
        .collect();
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let answers: Vec<(usize, String, u16)> = futures_util::stream::iter(requests)
            .map(|(i, delivery, request)| {
                let (client, url, done) = (client.clone(), url.clone(), done.clone());
                async move {
                    let status = post(&client, &url, &request).await.status().as_u16();
                    done.fetch_add(1, Ordering::Relaxed);
                    (i, delivery, status)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        answers
            .into_iter()
            .map(|(i, delivery, status)| (prs[i], delivery, status))
            .collect()
    })
}

/// Waits until `done` reaches `n`.
async fn wait_count(done: &AtomicUsize, n: usize) {
    poll_until_named(Duration::from_secs(60), "enough answers", || async {
        done.load(Ordering::Relaxed) >= n
    })
    .await;
}

/// Delivery ids in the events stream.
async fn in_stream(conn: &mut crate::support::redis::TestConn, key: &str) -> HashSet<String> {
    stream_entries(conn, key)
        .await
        .into_iter()
        .filter_map(|(_, f)| f.get("delivery").cloned())
        .collect()
}

/// (7.1) Redis is SIGKILLed (AOF, `appendfsync always`) while 1,000 deliveries are
/// being posted and comes back 1 s later on the same port: every 2xx delivery is in
/// the stream and committed exactly once, every other got a non-2xx, serve and worker
/// reconnect by themselves, and no effect is executed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_during_ingest_loses_nothing_acknowledged() {
    const PRS: u64 = 100;
    let started = Instant::now();
    let mut redis = RedisServer::start_with(Aof::Always);
    let fake = FakeForgejo::start().await;
    let policy = fast_poll_policy();
    let policy_path = policy.path().display().to_string();
    let serve = Shepherd::serve(&redis).await;
    let (prefix, keys) = (serve.prefix().to_owned(), serve.keys());
    let mut worker = start_worker(&redis, &prefix, &fake, &policy_path).await;
    // Ten rounds during the crash, an eleventh after it.
    let mut plan = prepare(&fake, PRS, 11);
    let after = plan.split_off(1000);
    let done = Arc::new(AtomicUsize::new(0));
    let posting = post_in_background(serve.webhook_url(), plan, done.clone());
    wait_count(&done, 400).await;
    redis.stop();
    let killed_at = Instant::now();
    let answered_at_kill = done.load(Ordering::Relaxed);
    // The outage (a modelled duration, not a wait for a result).
    tokio::time::sleep(Duration::from_secs(1)).await;
    redis.restart();
    let restarted_at = Instant::now();
    let answers = posting.await.expect("posting task");
    let accepted: Vec<&Answer> = answers
        .iter()
        .filter(|(_, _, s)| (200..300).contains(s))
        .collect();
    let refused = answers.len() - accepted.len();
    assert!(
        answers
            .iter()
            .all(|(_, _, s)| (200..300).contains(s) || *s == 503),
        "only 2xx or 503"
    );
    // Serve reconnects by itself: a later delivery is accepted again.
    let client = reqwest::Client::new();
    let (n0, d0, t0, b0) = &after[0];
    poll_until_named(Duration::from_secs(20), "serve accepts again", || async {
        post(&client, &serve.webhook_url(), &signed(b0, t0, d0))
            .await
            .status()
            .is_success()
    })
    .await;
    let serve_back = restarted_at.elapsed();
    for (_, d, t, b) in &after[1..] {
        let status = post(&client, &serve.webhook_url(), &signed(b, t, d))
            .await
            .status();
        assert!(status.is_success(), "after recovery: {status}");
    }
    let mut conn = redis.conn().await;
    let stream = in_stream(&mut conn, &keys.events(0)).await;
    let lost: Vec<&&Answer> = accepted
        .iter()
        .filter(|(_, d, _)| !stream.contains(d))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged but not in the stream: {lost:?}"
    );
    let refused_but_stored = answers
        .iter()
        .filter(|(_, d, s)| !(200..300).contains(s) && stream.contains(d))
        .count();
    let expected = by_pr(
        accepted
            .iter()
            .map(|(n, d, _)| (*n, d))
            .chain(std::iter::once((*n0, d0)))
            .chain(after[1..].iter().map(|(n, d, _, _)| (*n, d))),
    );
    let total = accepted.len() + after.len();
    wait_committed(&conn, &keys, &expected, Duration::from_secs(40)).await;
    let worker_back = restarted_at.elapsed();
    assert_exactly_once(&mut conn, &keys, &expected, total).await;
    wait_settled(&mut conn, &keys, PRS).await;
    assert_no_duplicate_side_effects(&mut conn, &keys, &fake, &prs_of(&expected)).await;
    assert!(worker.is_running(), "the worker survived the outage");
    eprintln!(
        "drill 1: 1000 posted, {} x 2xx, {refused} x 503 ({refused_but_stored} of them stored \
         anyway), {answered_at_kill} answered before the kill, 0 acknowledged lost; outage \
         {:?}; serve accepting {serve_back:?} after restart, worker committed all {total} \
         {worker_back:?} after restart; total {:?}",
        accepted.len(),
        restarted_at - killed_at,
        started.elapsed()
    );
}

/// (7.2) Two workers; ten times, at a random moment, one of them is SIGKILLed and a new
/// one started in its place, while 2,000 deliveries over 200 PRs are posted and
/// processed: every delivery is committed exactly once, no effect is duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_ten_times_commit_everything_exactly_once() {
    let redis = RedisServer::start();
    let conn = redis.conn().await;
    worker_kill_drill(&redis, conn, 1).await;
}

/// The worker-kill drill (7.2) against `redis` (one server, or a cluster where
/// `SHEPHERD_SHARDS` is 6), the PRs spread over `repos` repositories.
pub(crate) async fn worker_kill_drill(
    redis: &(impl Backend + ?Sized),
    mut conn: TestConn,
    repos: usize,
) {
    const PRS: u64 = 200;
    const KILLS: usize = 10;
    let started = Instant::now();
    let fake = FakeForgejo::start().await;
    let policy = fast_poll_policy();
    let policy_path = policy.path().display().to_string();
    let serve = Shepherd::builder(redis)
        .env("SHEPHERD_SHARDS", shards(is_cluster(redis)).to_string())
        .start()
        .await;
    let (prefix, keys) = (serve.prefix().to_owned(), serve.keys());
    let mut workers = [
        start_worker(redis, &prefix, &fake, &policy_path).await,
        start_worker(redis, &prefix, &fake, &policy_path).await,
    ];
    let plan = prepare_spread(&fake, repos, PRS, 10);
    let expected = by_pr(plan.iter().map(|(n, d, _, _)| (*n, d)));
    let total = plan.len();
    let done = Arc::new(AtomicUsize::new(0));
    let posting = post_in_background(serve.webhook_url(), plan, done.clone());
    // Random kill points: after this many answers (the workers lag behind the
    // answers, so every kill lands while they are committing and executing).
    let (points, victims): (Vec<usize>, Vec<usize>) = {
        let mut rng = rand::rng();
        let mut points: Vec<usize> = (0..KILLS)
            .map(|_| rng.random_range(100..total - 100))
            .collect();
        points.sort_unstable();
        let victims = (0..KILLS)
            .map(|_| rng.random_range(0..workers.len()))
            .collect();
        (points, victims)
    };
    let mut kills = Vec::new();
    for (point, victim) in points.into_iter().zip(victims) {
        wait_count(&done, point).await;
        kills.push((done.load(Ordering::Relaxed), victim));
        workers[victim].kill();
        workers[victim] = start_worker(redis, &prefix, &fake, &policy_path).await;
    }
    let answers = posting.await.expect("posting task");
    assert!(
        answers.iter().all(|(_, _, s)| *s == 202),
        "every delivery is accepted"
    );
    let sent_at = started.elapsed();
    wait_committed(&conn, &keys, &expected, Duration::from_secs(50)).await;
    assert_exactly_once(&mut conn, &keys, &expected, total).await;
    wait_settled(&mut conn, &keys, PRS).await;
    assert_no_duplicate_side_effects(&mut conn, &keys, &fake, &prs_of(&expected)).await;
    eprintln!(
        "drill 2 ({}): {total} deliveries over {PRS} PRs, {KILLS} SIGKILLs at (answered, worker) \
         {kills:?}; posted in {sent_at:?}; all committed exactly once and settled after {:?}",
        redis.url(),
        started.elapsed()
    );
}

/// (7.5) Redis is unreachable from the worker for 10 s (killed, restarted on the same
/// port with its AOF) while deliveries are in flight and CI poll timers are due: the
/// worker backs off without exiting, then commits everything exactly once, and the
/// timers due during the outage fire after it (CI turned red during the outage is
/// seen only through them, and dispatches `ci-fix`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unreachable_for_ten_seconds_then_workers_resume() {
    redis_outage_drill(Outage::Down).await;
}

/// (7.5, hung variant) As above, but Redis hangs for 10 s (SIGSTOP, then SIGCONT):
/// connections stay open and nothing answers, so calls time out on the client side
/// while Redis may still run them after it thaws.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_hung_for_ten_seconds_then_workers_resume() {
    redis_outage_drill(Outage::Hung).await;
}

/// How Redis goes away in the outage drill.
#[derive(Debug, Clone, Copy)]
enum Outage {
    /// Killed, restarted on the same port with its AOF.
    Down,
    /// Frozen with SIGSTOP, thawed with SIGCONT.
    Hung,
}

/// The drill of item 7.5 with the given kind of outage.
async fn redis_outage_drill(outage: Outage) {
    const PRS: u64 = 20;
    const OUTAGE: Duration = Duration::from_secs(10);
    let started = Instant::now();
    let mut redis = RedisServer::start_with(Aof::Always);
    let fake = FakeForgejo::start().await;
    let policy = fast_poll_policy();
    let policy_path = policy.path().display().to_string();
    let serve = Shepherd::serve(&redis).await;
    let (prefix, keys) = (serve.prefix().to_owned(), serve.keys());
    let mut worker = start_worker(&redis, &prefix, &fake, &policy_path).await;
    let mut plan = prepare(&fake, PRS, 5);
    // CI still running: the worker keeps CI poll timers for every PR.
    set_ci(&fake, PRS, "pending", "running");
    let last_round = plan.split_off(plan.len() - PRS as usize);
    let expected = by_pr(plan.iter().chain(&last_round).map(|(n, d, _, _)| (*n, d)));
    let client = reqwest::Client::new();
    for (_, d, t, b) in &plan {
        let status = post(&client, &serve.webhook_url(), &signed(b, t, d))
            .await
            .status();
        assert_eq!(status, 202);
    }
    let mut conn = redis.conn().await;
    let first = by_pr(plan.iter().map(|(n, d, _, _)| (*n, d)));
    wait_committed(&conn, &keys, &first, Duration::from_secs(30)).await;
    // The last round is queued, and Redis goes away at once: some of it is in flight.
    for (_, d, t, b) in &last_round {
        let status = post(&client, &serve.webhook_url(), &signed(b, t, d))
            .await
            .status();
        assert_eq!(status, 202);
    }
    let timers: usize = redis::cmd("ZCARD")
        .arg(keys.timers(0))
        .query_async(&mut conn)
        .await
        .expect("ZCARD");
    match outage {
        Outage::Down => redis.stop(),
        Outage::Hung => redis.pause(),
    }
    let killed_at = Instant::now();
    // CI fails while Redis is away; Forgejo sends no webhook for it.
    set_ci(&fake, PRS, "failure", "1 test failed");
    tokio::time::sleep(OUTAGE).await;
    assert!(worker.is_running(), "the worker outlives the outage");
    match outage {
        Outage::Down => redis.restart(),
        Outage::Hung => redis.resume(),
    }
    let restarted_at = Instant::now();
    let mut conn = redis.conn().await;
    wait_committed(&conn, &keys, &expected, Duration::from_secs(30)).await;
    let committed_after = restarted_at.elapsed();
    assert_exactly_once(
        &mut conn,
        &keys,
        &expected,
        expected.values().map(HashSet::len).sum(),
    )
    .await;
    wait_settled(&mut conn, &keys, PRS).await;
    let timers_fired_after = restarted_at.elapsed();
    assert_no_duplicate_side_effects(&mut conn, &keys, &fake, &prs_of(&expected)).await;
    assert!(worker.is_running(), "the worker kept running");
    eprintln!(
        "drill 5 ({outage:?}): {} deliveries over {PRS} PRs, {timers} timers pending at the kill, outage \
         {:?}; all committed exactly once {committed_after:?} after the outage, CI failure seen \
         through the timers and one ci-fix per PR {timers_fired_after:?} after it; \
         total {:?}",
        expected.values().map(HashSet::len).sum::<usize>(),
        restarted_at - killed_at,
        started.elapsed()
    );
}

/// Sets the `ci/test` status on the head of PRs 1..=prs.
fn set_ci(fake: &FakeForgejo, prs: u64, state: &str, description: &str) {
    for n in 1..=prs {
        let sha = fake.head_sha(REPO, n);
        fake.set_status(REPO, &sha, "ci/test", state, description);
    }
}

/// The figures of one merge-lease drill.
pub(crate) struct LeaseDrill {
    /// PRs opened (green, approved, one target branch).
    pub prs: u64,
    /// Each kill: seconds since the start, whether the victim held the merge lease.
    pub kills: Vec<(f64, bool)>,
    /// For each kill of a lease holder, the time until the next merge call, when one came.
    pub holder_gaps: Vec<Option<Duration>>,
    /// PRs merged 60 s after the kills stopped.
    pub merged_after_kills: usize,
    /// Successful merges per PR number (1 each when nothing was merged twice).
    pub merges_per_pr: HashMap<u64, usize>,
    /// Merge calls whose `head_commit_id` was not the PR's head.
    pub unpinned: usize,
}

/// (Issue 16) The merge lease under SIGKILL: 40 approved green bot PRs on one branch,
/// 3 workers; every 3 s the worker holding the branch's merge lease (any worker when
/// none holds it within 1.5 s) is SIGKILLed and a new one started, `kills` times, each
/// merge call taking 500 ms in the fake so that holders die mid-hold. Returns what
/// happened; [`merge_lease_holders_killed_every_three_seconds_all_prs_merge`] asserts.
pub(crate) async fn merge_lease_drill(kills: usize) -> LeaseDrill {
    const PRS: u64 = 40;
    let started = Instant::now();
    let redis = RedisServer::start();
    let fake = FakeForgejo::start().await;
    fake.create_repo(REPO);
    let mut reviews = Vec::new();
    for i in 0..PRS {
        let body = format!("Change {i}.\n\nAutomated by CleverAgents Bot");
        let n = fake.open_pr(
            REPO,
            crate::support::fake_forgejo::NewPr::new("agent-bot", &format!("Change {i}"))
                .body(&body),
        );
        let sha = fake.head_sha(REPO, n);
        fake.set_status(REPO, &sha, "ci/test", "success", "all green");
        reviews.push((n, fake.add_review(REPO, n, "alice", "APPROVED")));
    }
    fake.inject(
        crate::support::fake_forgejo::Fault::on("POST", &format!("/repos/{REPO}/pulls/*/merge"))
            .delay(Duration::from_millis(500)),
    );
    // The scenarios' policy: "agent-bot" is a bot user (one approval), fast retries.
    let mut policy = tempfile::NamedTempFile::new().expect("policy file");
    std::io::Write::write_all(
        &mut policy,
        format!("[defaults]\n{}", crate::support::scenario::FAST_POLICY).as_bytes(),
    )
    .expect("write policy");
    let policy_path = policy.path().display().to_string();
    let serve = Shepherd::serve(&redis).await;
    let (prefix, keys) = (serve.prefix().to_owned(), serve.keys());
    let lease_key = keys.merge_lock(REPO, "main");
    let mut spawned = 0usize;
    let start = |spawned: &mut usize| {
        *spawned += 1;
        let name = format!("drill-w{spawned}");
        let builder = Shepherd::builder(&redis)
            .args(["work", "--consumer", name.as_str()])
            .prefix(&prefix)
            .env("SHEPHERD_RECLAIM_IDLE_SECS", "2")
            .env("SHEPHERD_FORGEJO_URL", fake.url())
            .env("SHEPHERD_FORGEJO_TOKEN", fake.token())
            .env("SHEPHERD_BOT_LOGIN", fake.bot_login())
            .env("SHEPHERD_CONFIG", policy_path.as_str());
        async move { (name, builder.start().await) }
    };
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(start(&mut spawned).await);
    }
    let client = reqwest::Client::new();
    for (n, review) in reviews {
        for hook in [fake.pr_opened(REPO, n), fake.pr_reviewed(REPO, n, review)] {
            let delivery = crate::support::webhook::new_delivery();
            let request = signed(&hook.body(), hook.event_type, &delivery);
            assert_eq!(
                post(&client, &serve.webhook_url(), &request).await.status(),
                202
            );
        }
    }
    let mut conn = redis.conn().await;
    let merge_path = format!("/repos/{REPO}/pulls/*/merge");
    let mut kill_log = Vec::new();
    let mut holder_kills = Vec::new();
    for _ in 0..kills {
        tokio::time::sleep(Duration::from_secs(3)).await;
        if fake.merges().len() as u64 == PRS {
            break;
        }
        // The lease's holder, if one holds it within 1.5 s.
        let until = Instant::now() + Duration::from_millis(1500);
        let victim = loop {
            let holder: Option<String> = redis::cmd("GET")
                .arg(&lease_key)
                .query_async(&mut conn)
                .await
                .expect("GET");
            let found = holder.and_then(|token| {
                workers
                    .iter()
                    .position(|(name, _)| token.starts_with(&format!("{name}:")))
            });
            if found.is_some() || Instant::now() >= until {
                break found;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let held = victim.is_some();
        let i = victim.unwrap_or_else(|| rand::rng().random_range(0..workers.len()));
        workers[i].1.kill();
        let at = Instant::now();
        kill_log.push((started.elapsed().as_secs_f64(), held));
        if held {
            holder_kills.push(at);
        }
        workers[i] = start(&mut spawned).await;
    }
    let kills_over = Instant::now();
    let deadline = kills_over + Duration::from_secs(60);
    while (fake.merges().len() as u64) < PRS && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let merge_calls: Vec<Instant> = {
        let mut at: Vec<Instant> = fake
            .calls("POST", &merge_path)
            .iter()
            .map(|c| c.at)
            .collect();
        at.sort();
        at
    };
    let holder_gaps = holder_kills
        .iter()
        .map(|k| merge_calls.iter().find(|c| *c > k).map(|c| *c - *k))
        .collect();
    let merges = fake.merges();
    if std::env::var("DRILL_DEBUG").is_ok() {
        let mut by: HashMap<String, usize> = HashMap::new();
        for c in fake.all_calls() {
            *by.entry(format!("{} {} {}", c.method, c.path, c.status))
                .or_default() += 1;
        }
        eprintln!("calls: {by:#?}");
    }
    let mut merges_per_pr: HashMap<u64, usize> = HashMap::new();
    for m in &merges {
        *merges_per_pr.entry(m.number).or_default() += 1;
    }
    let unpinned = fake
        .calls("POST", &merge_path)
        .iter()
        .filter(|c| {
            let n: u64 = c
                .path
                .rsplit('/')
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            c.body.get("head_commit_id").and_then(|v| v.as_str()) != Some(&fake.head_sha(REPO, n))
        })
        .count();
    let drill = LeaseDrill {
        prs: PRS,
        kills: kill_log,
        holder_gaps,
        merged_after_kills: merges.len(),
        merges_per_pr,
        unpinned,
    };
    let gaps: Vec<String> = drill
        .holder_gaps
        .iter()
        .map(|g| g.map_or("none".into(), |g| format!("{:.2}", g.as_secs_f64())))
        .collect();
    eprintln!(
        "merge lease drill ({}): {} PRs, kills at (s, held the lease) {:?}; holder death → next \
         merge call (s): [{}]; merged {} of {} (60 s after the kills stopped at {:.1} s); total {:?}",
        std::env::var("BENCH_SHEPHERD_BIN").unwrap_or_else(|_| "this build".into()),
        drill.prs,
        drill.kills,
        gaps.join(", "),
        drill.merged_after_kills,
        drill.prs,
        (kills_over - started).as_secs_f64(),
        started.elapsed()
    );
    drill
}

/// The merge lease drill (issue 16) with 8 kills: every PR merges, none twice, each
/// pinned to its head, and every kill of a lease holder is followed by a merge call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_lease_holders_killed_every_three_seconds_all_prs_merge() {
    let drill = merge_lease_drill(8).await;
    assert!(
        drill.kills.iter().any(|(_, held)| *held),
        "the drill killed at least one lease holder: {:?}",
        drill.kills
    );
    assert_eq!(
        drill.merged_after_kills as u64, drill.prs,
        "every PR merged after the kills stopped"
    );
    assert!(
        drill.merges_per_pr.values().all(|&c| c == 1),
        "no PR merged twice: {:?}",
        drill.merges_per_pr
    );
    assert_eq!(
        drill.unpinned, 0,
        "every merge call pinned to the PR's head"
    );
    assert!(
        drill.holder_gaps.iter().all(Option::is_some),
        "a merge call followed every holder's death: {:?}",
        drill.holder_gaps
    );
}

/// The same drill for a benchmark (`bench/merge_lease.sh`): prints the figures for
/// this build or `BENCH_SHEPHERD_BIN` and asserts nothing about them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: bench/merge_lease.sh"]
async fn bench_merge_lease_drill() {
    let kills = std::env::var("BENCH_LEASE_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(8);
    let drill = merge_lease_drill(kills).await;
    let gaps: Vec<f64> = drill
        .holder_gaps
        .iter()
        .flatten()
        .map(Duration::as_secs_f64)
        .collect();
    println!(
        "BENCH_LEASE merged={} prs={} holder_kills={} gaps_found={} gap_max_s={:.2} gap_median_s={:.2}",
        drill.merged_after_kills,
        drill.prs,
        drill.holder_gaps.len(),
        gaps.len(),
        gaps.iter().copied().fold(0.0, f64::max),
        median(&gaps)
    );
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
