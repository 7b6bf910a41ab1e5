//! Redis as operators run it (issue 18), drilled against real redis-server processes
//! on 127.0.0.1: TLS (`rediss://`, a CA made in the test, a wrong CA refused), a
//! Sentinel-managed primary killed under load, and a three-primary Redis Cluster
//! (`SHEPHERD_SHARDS=6`) running the end-to-end scenario, the worker-kill drill and a
//! slot migration under load. Each drill prints its figures (docs/reliability.md).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shepherd::app::send::ForgejoRequest;
use shepherd::store::Keys;

use crate::scenarios::REPO;
use crate::scenarios::merge::bot_pr_from_red_ci_to_merged;
use crate::support::fake_forgejo::FakeForgejo;
use crate::support::poll_until_named;
use crate::support::redis::{
    Backend, RedisCluster, RedisServer, SentinelSet, TestCa, TestConn, stream_entries,
    wait_blocking,
};
use crate::support::scenario::Scenario;
use crate::support::shepherd::Shepherd;
use crate::support::webhook::{post, signed};
use crate::worker::scale::{
    CONCURRENCY, Planned, Pr, assert_exactly_once, assert_no_duplicate_side_effects,
    fast_poll_policy, prepare, prepare_spread, start_worker, wait_committed, wait_settled,
};

/// `shepherd inspect REPO#n --json`, an operator command of its own, reads PR `n` as
/// merged through the scenario's Redis.
fn assert_inspect_says_merged(s: &Scenario, n: u64) {
    let out = s.cli(&["inspect", &format!("{REPO}#{n}"), "--json"]);
    assert!(
        out.status.success(),
        "inspect: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect JSON");
    assert_eq!(report["summary"]["phase"], "merged", "{report}");
}

/// `shepherd serve` (with `env`) and two `shepherd work` processes against `redis`,
/// on one fake Forgejo with the fast CI-poll policy.
struct Fleet {
    fake: FakeForgejo,
    serve: Shepherd,
    workers: [Shepherd; 2],
    keys: Keys,
    _policy: tempfile::NamedTempFile,
}

impl Fleet {
    async fn start(redis: &(impl Backend + ?Sized), env: &[(&str, &str)]) -> Self {
        let fake = FakeForgejo::start().await;
        let policy = fast_poll_policy();
        let policy_path = policy.path().display().to_string();
        let serve = env
            .iter()
            .fold(Shepherd::builder(redis), |b, (k, v)| b.env(k, *v))
            .start()
            .await;
        let (prefix, keys) = (serve.prefix().to_owned(), serve.keys());
        let workers = [
            start_worker(redis, &prefix, &fake, &policy_path).await,
            start_worker(redis, &prefix, &fake, &policy_path).await,
        ];
        Self {
            fake,
            serve,
            workers,
            keys,
            _policy: policy,
        }
    }

    /// Starts posting `plan` at `rate` per second to serve and returns once `first`
    /// deliveries are answered: the posting task, the clock its answer times are
    /// measured from, and the running count of answers.
    async fn load_until(
        &self,
        plan: Vec<Planned>,
        rate: u32,
        first: usize,
    ) -> (
        tokio::task::JoinHandle<Vec<Answered>>,
        Instant,
        Arc<AtomicUsize>,
    ) {
        let done = Arc::new(AtomicUsize::new(0));
        let t0 = Instant::now();
        let posting = post_paced(self.serve.webhook_url(), plan, rate, done.clone(), t0);
        poll_until_named(Duration::from_secs(60), "the first answers", || async {
            done.load(Ordering::Relaxed) >= first
        })
        .await;
        (posting, t0, done)
    }

    /// Whether serve and every worker are the processes started (none exited).
    fn all_running(&mut self) -> bool {
        self.serve.is_running() && self.workers.iter_mut().all(Shepherd::is_running)
    }
}

/// Over `rediss://` with the test's CA: the webhook path, `shepherd serve` and
/// `shepherd work` take a bot PR from red CI to merged, and an operator command reads
/// the record; the same command with another CA is refused with an error that names
/// the CA setting (and no secret).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_works_and_operates_over_rediss_and_refuses_a_wrong_ca() {
    let ca = TestCa::generate();
    let redis = RedisServer::start_tls(&ca);
    assert!(redis.url().starts_with("rediss://"));
    let conn = redis.conn().await;
    let s = Scenario::start_on(Box::new(redis), conn, "merge_style = \"rebase\"\n", &[]).await;
    let n = bot_pr_from_red_ci_to_merged(&s).await;

    assert_inspect_says_merged(&s, n);

    let other = TestCa::generate();
    let refused = s.cli_with(
        &["inspect", &format!("{REPO}#{n}")],
        &[("SHEPHERD_REDIS_CA_FILE", &other.ca_path())],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a wrong CA is refused");
    assert!(stderr.contains("SHEPHERD_REDIS_CA_FILE"), "{stderr}");
    assert!(
        stderr.to_lowercase().contains("certificate"),
        "the error says why: {stderr}"
    );
}

/// The end-to-end scenario (CI failure → work item → fix → green → approval → merge)
/// on a three-primary cluster with six shards, serve and work as separate processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_runs_the_end_to_end_scenario() {
    let started = Instant::now();
    let cluster = RedisCluster::start(3);
    let conn = cluster.conn().await;
    let s = Scenario::start_on(
        Box::new(cluster),
        conn,
        "merge_style = \"rebase\"\n",
        &[("SHEPHERD_SHARDS", "6")],
    )
    .await;
    let n = bot_pr_from_red_ci_to_merged(&s).await;
    assert_inspect_says_merged(&s, n);
    eprintln!("cluster scenario: merged after {:?}", started.elapsed());
}

/// The worker-kill drill (two workers, ten SIGKILLs at random moments, 2,000
/// deliveries over 200 PRs) on a three-primary cluster, the PRs spread over six
/// repositories and `SHEPHERD_SHARDS=6`: the same checks as on one node (every
/// delivery committed exactly once, no effect twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_worker_kill_drill() {
    let cluster = RedisCluster::start(3);
    let conn = cluster.conn().await;
    crate::drills::worker_kill_drill(&cluster, conn, 6).await;
}

/// One answered delivery: PR, delivery id, HTTP status, when it was answered, how
/// long the answer took.
type Answered = (Pr, String, u16, Duration, Duration);

/// Posts `plan` at about `rate` deliveries per second (at most [`CONCURRENCY`] in
/// flight), counting answers in `done`.
fn post_paced(
    url: String,
    plan: Vec<Planned>,
    rate: u32,
    done: Arc<AtomicUsize>,
    t0: Instant,
) -> tokio::task::JoinHandle<Vec<Answered>> {
    let requests: Vec<(Pr, String, ForgejoRequest)> = plan
        .into_iter()
        .map(|(n, d, t, b)| {
            let request = signed(&b, t, &d);
            (n, d, request)
        })
        .collect();
    tokio::spawn(async move {
        // Paced, most pooled connections sit idle between requests; actix closes an idle
        // keep-alive connection after 5 s, and a request sent on it at that moment fails
        // in the client (hyper's IncompleteMessage) without the server having read it.
        // Dropping idle connections after 2 s keeps the client out of that race.
        let client = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(2))
            .build()
            .expect("HTTP client");
        let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
        let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
        let mut tasks = Vec::new();
        for (pr, delivery, request) in requests {
            tick.tick().await;
            let permit = slots.clone().acquire_owned().await.expect("semaphore");
            let (client, url, done) = (client.clone(), url.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let sent = Instant::now();
                let status = post(&client, &url, &request).await.status().as_u16();
                done.fetch_add(1, Ordering::Relaxed);
                drop(permit);
                (pr, delivery, status, t0.elapsed(), sent.elapsed())
            }));
        }
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.expect("post task"));
        }
        answers
    })
}

/// Delivery ids in the events streams of every shard.
async fn delivered(conn: &mut TestConn, keys: &Keys) -> HashSet<String> {
    let mut ids = HashSet::new();
    for shard in 0..keys.shards() {
        for (_, f) in stream_entries(conn, &keys.events(shard)).await {
            if let Some(d) = f.get("delivery") {
                ids.insert(d.clone());
            }
        }
    }
    ids
}

/// Median of `xs` (0 when empty).
fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort_unstable();
    xs.get(xs.len() / 2).copied().unwrap_or_default()
}

/// Figures of a drill under load: what was answered how, and which accepted
/// deliveries are in the streams (`kept`) or missing from them (`lost`).
struct LoadFigures {
    accepted: HashMap<Pr, HashSet<String>>,
    total_accepted: usize,
    refused: usize,
    kept: HashMap<Pr, HashSet<String>>,
    lost: Vec<String>,
}

impl LoadFigures {
    /// Waits until every kept delivery is in its PR's history, exactly once.
    async fn assert_kept_committed_once(&self, conn: &mut TestConn, keys: &Keys) {
        let total = self.kept.values().map(HashSet::len).sum();
        wait_committed(conn, keys, &self.kept, Duration::from_secs(60)).await;
        assert_exactly_once(conn, keys, &self.kept, total).await;
    }
}

/// Sorts `answers` into accepted (202) and refused (503; anything else fails the
/// drill), and finds the accepted ones missing from the streams.
async fn account(answers: &[Answered], conn: &mut TestConn, keys: &Keys) -> LoadFigures {
    let mut accepted = HashMap::new();
    let (mut total_accepted, mut refused) = (0, 0);
    for (pr, d, status, _, _) in answers {
        match status {
            202 => {
                accepted
                    .entry(*pr)
                    .or_insert_with(HashSet::new)
                    .insert(d.clone());
                total_accepted += 1;
            }
            503 => refused += 1,
            other => panic!("delivery {d} answered {other}: only 202 or 503 are acceptable"),
        }
    }
    let present = delivered(conn, keys).await;
    let lost = accepted
        .values()
        .flatten()
        .filter(|d| !present.contains(*d))
        .cloned()
        .collect();
    let kept = accepted
        .iter()
        .map(|(pr, ds)| (*pr, ds.intersection(&present).cloned().collect()))
        .collect();
    LoadFigures {
        accepted,
        total_accepted,
        refused,
        kept,
        lost,
    }
}

/// The Sentinel failover drill: a primary, two replicas and three sentinels; `serve`
/// and two `work` processes on `redis+sentinel://`; 1,000 deliveries over 100 PRs
/// posted at 100 per second; the primary SIGKILLed after 300 answers. Returns the
/// figures after every process followed the new primary without a restart.
async fn sentinel_failover_drill(wait_replicas: u32) -> (LoadFigures, Duration) {
    const PRS: u64 = 100;
    let started = Instant::now();
    let mut set = SentinelSet::start();
    let wait = wait_replicas.to_string();
    let mut fleet = Fleet::start(&set, &[("SHEPHERD_REDIS_WAIT_REPLICAS", &wait)]).await;
    let keys = fleet.keys.clone();
    let plan = prepare(&fleet.fake, PRS, 10);
    let (posting, t0, _) = fleet.load_until(plan, 100, 300).await;
    let killed_at = t0.elapsed();
    let old = tokio::task::block_in_place(|| set.kill_primary());
    tokio::task::block_in_place(|| set.wait_failover(old, Duration::from_secs(30)));
    let promoted_at = t0.elapsed();
    let answers = posting.await.expect("posting task");
    let after_kill: Vec<&Answered> = answers.iter().filter(|a| a.3 > killed_at).collect();
    let refused_at: Vec<Duration> = after_kill
        .iter()
        .filter(|a| a.2 == 503)
        .map(|a| a.3)
        .collect();
    let first_ok = after_kill
        .iter()
        .filter(|a| a.2 == 202 && !refused_at.is_empty() && a.3 > refused_at[0])
        .map(|a| a.3)
        .min();
    let gap = first_ok.map_or(Duration::ZERO, |t| t.saturating_sub(killed_at));
    assert!(
        after_kill.iter().any(|a| a.2 == 202),
        "the ingest accepts deliveries again after the failover"
    );
    let mut conn = set.conn().await;
    let figures = account(&answers, &mut conn, &keys).await;
    // Whatever reached the new primary is committed exactly once, by workers that
    // were never restarted.
    figures.assert_kept_committed_once(&mut conn, &keys).await;
    assert!(
        fleet.all_running(),
        "every process followed the new primary"
    );
    let lost_at: Vec<u128> = answers
        .iter()
        .filter(|a| figures.lost.contains(&a.1))
        .map(|a| a.3.as_millis())
        .collect();
    eprintln!(
        "lost answered at (ms): first {:?} last {:?}",
        lost_at.iter().min(),
        lost_at.iter().max()
    );
    let accepted_latency = median(
        answers
            .iter()
            .filter(|a| a.2 == 202 && a.3 < killed_at)
            .map(|a| a.4)
            .collect(),
    );
    eprintln!(
        "sentinel drill (WAIT {wait_replicas}): {} deliveries, {} accepted, {} refused (503), \
         {} accepted but lost; median 202 before the kill {accepted_latency:?}; primary killed at {killed_at:?}, replica promoted at \
         {promoted_at:?}, first 202 after the 503s at {first_ok:?} (gap {gap:?}); all \
         committed exactly once after {:?}",
        answers.len(),
        figures.total_accepted,
        figures.refused,
        figures.lost.len(),
        started.elapsed()
    );
    (figures, gap)
}

/// With `SHEPHERD_REDIS_WAIT_REPLICAS=1` no acknowledged delivery is lost in a
/// failover: every 202 is in the new primary's stream, committed exactly once; during
/// the gap the ingest answers 503, never a false 202.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_with_wait_loses_no_acknowledged_delivery() {
    let (figures, _gap) = sentinel_failover_drill(1).await;
    assert!(
        figures.lost.is_empty(),
        "acknowledged deliveries lost: {:?}",
        figures.lost
    );
    assert!(figures.refused > 0, "the gap was answered 503");
}

/// Without `WAIT`, the processes still follow the failover and commit what reached
/// the new primary exactly once; what an asynchronous replica had not yet received
/// is counted (docs/reliability.md gives the figure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_without_wait_follows_the_new_primary() {
    let (figures, _gap) = sentinel_failover_drill(0).await;
    assert!(figures.total_accepted > 300, "deliveries were accepted");
    assert!(figures.refused > 0, "the gap was answered 503");
}

/// A slot migration under load on the cluster: six shards over six repositories (on
/// at least two nodes), deliveries posted at 150 per second while every slot of the
/// first node moves to the second (`redis-cli --cluster reshard`, MIGRATE and ASK
/// redirections): every accepted delivery is committed exactly once, no effect twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_resharding_under_load_loses_and_doubles_nothing() {
    const PRS: u64 = 120;
    let started = Instant::now();
    let cluster = RedisCluster::start(3);
    let fleet = Fleet::start(&cluster, &[("SHEPHERD_SHARDS", "6")]).await;
    let keys = fleet.keys.clone();
    let owners: HashSet<u16> = (0..keys.shards())
        .map(|s| cluster.owner_port(&keys.events(s)))
        .collect();
    assert!(
        owners.len() >= 2,
        "six shards land on different nodes: {owners:?}"
    );
    let plan = prepare_spread(&fleet.fake, 6, PRS, 10);
    let total = plan.len();
    let (posting, t0, done) = fleet.load_until(plan, 150, 200).await;
    let moving = (0..keys.shards())
        .filter(|s| cluster.owner_port(&keys.events(*s)) == cluster.nodes[0].port())
        .count();
    let reshard_started = t0.elapsed();
    tokio::task::block_in_place(|| cluster.reshard(0, 1, 5461));
    let reshard_took = t0.elapsed() - reshard_started;
    let answered_during = done.load(Ordering::Relaxed);
    let answers = posting.await.expect("posting task");
    cluster.wait_ok(Duration::from_secs(30));
    let mut conn = cluster.conn().await;
    let figures = account(&answers, &mut conn, &keys).await;
    assert!(
        figures.lost.is_empty(),
        "accepted but lost: {:?}",
        figures.lost
    );
    figures.assert_kept_committed_once(&mut conn, &keys).await;
    let prs: Vec<Pr> = figures.accepted.keys().copied().collect();
    wait_settled(&mut conn, &keys, prs.len() as u64).await;
    assert_no_duplicate_side_effects(&mut conn, &keys, &fleet.fake, &prs).await;
    eprintln!(
        "cluster resharding drill: {total} deliveries over {PRS} PRs in 6 repositories, \
         {} accepted, {} refused (503), 0 lost; {moving} of 6 shards moved with 5,461 slots \
         in {reshard_took:?} (started at {reshard_started:?}, {answered_during} answers \
         by its end); all committed exactly once, settled after {:?}",
        figures.total_accepted,
        figures.refused,
        started.elapsed()
    );
}

/// A cluster node failover under load: three primaries with one replica each (AOF
/// `always`), `SHEPHERD_REDIS_WAIT_REPLICAS=1` (`WAIT` routed to each delivery's
/// slot primary), deliveries over six repositories at 100 per second; after 300
/// answers the primary that owns shard 0 is SIGKILLed and its replica takes over.
/// Every 202 is in a stream and committed exactly once, the rest were 503, and no
/// process was restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_primary_failover_under_load_loses_no_acknowledged_delivery() {
    const PRS: u64 = 120;
    let started = Instant::now();
    let mut cluster = RedisCluster::start_replicated(3, 1);
    let env = [
        ("SHEPHERD_SHARDS", "6"),
        ("SHEPHERD_REDIS_WAIT_REPLICAS", "1"),
    ];
    let mut fleet = Fleet::start(&cluster, &env).await;
    let keys = fleet.keys.clone();
    let plan = prepare_spread(&fleet.fake, 6, PRS, 10);
    let (posting, t0, _) = fleet.load_until(plan, 100, 300).await;
    let victim = cluster.owner_port(&keys.events(0));
    let killed_at = t0.elapsed();
    cluster.kill_node(victim);
    tokio::task::block_in_place(|| {
        wait_blocking(
            Duration::from_secs(30),
            "a replica takes over shard 0's slot",
            || {
                cluster
                    .try_owner_port(&keys.events(0))
                    .is_some_and(|p| p != victim)
            },
        );
        cluster.wait_ok(Duration::from_secs(30));
    });
    let promoted_at = t0.elapsed();
    let answers = posting.await.expect("posting task");
    let mut conn = cluster.conn().await;
    let figures = account(&answers, &mut conn, &keys).await;
    assert!(
        figures.lost.is_empty(),
        "accepted but lost: {:?}",
        figures.lost
    );
    assert!(
        answers.iter().any(|a| a.2 == 202 && a.3 > promoted_at),
        "deliveries are accepted again after the failover"
    );
    figures.assert_kept_committed_once(&mut conn, &keys).await;
    assert!(fleet.all_running(), "every process followed the failover");
    eprintln!(
        "cluster failover drill (WAIT 1): {} deliveries, {} accepted, {} refused (503), 0 \
         lost; primary :{victim} killed at {killed_at:?}, its replica serving at \
         {promoted_at:?}; all committed exactly once after {:?}",
        answers.len(),
        figures.total_accepted,
        figures.refused,
        started.elapsed()
    );
}
