//! Horizontal scale (issue 4): one `shepherd serve` and three `shepherd work`
//! processes of the real binary (consumers, executors, timers) against the fake
//! Forgejo; 2,000 signed deliveries over 200 bot PRs whose CI fails; one worker is
//! SIGKILLed mid-run and another started in its place. At the end every delivery is
//! committed exactly once in its PR's history, nothing is pending or dead-lettered,
//! and the fake Forgejo and the dispatch stream saw no duplicate comment, dispatch or
//! merge: exactly one `ci-fix` per PR and at most one status comment per PR.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use shepherd::store::Keys;

use super::{history, pending};
use crate::support::fake_forgejo::{FakeForgejo, NewPr};
use crate::support::poll_until_named;
use crate::support::redis::{Backend, RedisServer, stream_entries};
use crate::support::shepherd::Shepherd;
use crate::support::webhook::{new_delivery, post, signed};

/// PRs in the run.
const PRS: u64 = 200;
/// Deliveries per PR: opened, then title edits.
const PER_PR: usize = 10;
/// Concurrent webhook POSTs.
pub const CONCURRENCY: usize = 32;
/// The repository.
pub const REPO: &str = "fleet/scale";
/// The repositories of a run spread over shards ([`prepare_spread`]); the first is
/// [`REPO`].
pub const REPOS: [&str; 8] = [
    REPO,
    "fleet/alpha",
    "fleet/bravo",
    "fleet/charlie",
    "fleet/delta",
    "fleet/echo",
    "fleet/foxtrot",
    "fleet/golf",
];

/// A pull request: repository and number.
pub type Pr = (&'static str, u64);

/// A `shepherd work` process on the shared prefix, talking to the fake (also used by
/// the fault drills).
pub async fn start_worker(
    redis: &(impl Backend + ?Sized),
    prefix: &str,
    fake: &FakeForgejo,
    policy: &str,
) -> Shepherd {
    Shepherd::builder(redis)
        .args(["work"])
        .prefix(prefix)
        .env("SHEPHERD_RECLAIM_IDLE_SECS", "2")
        .env("SHEPHERD_FORGEJO_URL", fake.url())
        .env("SHEPHERD_FORGEJO_TOKEN", fake.token())
        .env("SHEPHERD_BOT_LOGIN", fake.bot_login())
        .env("SHEPHERD_CONFIG", policy)
        .env("SHEPHERD_SHARDS", shards(is_cluster(redis)).to_string())
        .start()
        .await
}

/// The shards of a run against `redis`: 6 on a cluster (so they land on different
/// nodes), 1 otherwise.
pub fn is_cluster(redis: &(impl Backend + ?Sized)) -> bool {
    redis.url().starts_with("redis+cluster://")
}

/// `SHEPHERD_SHARDS` for a run ([`is_cluster`]).
pub fn shards(cluster: bool) -> u16 {
    if cluster { 6 } else { 1 }
}

/// One planned delivery: (PR, delivery id, event type, body).
pub type Planned = (Pr, String, &'static str, Vec<u8>);

/// A policy file with a fast CI poll (1 s, capped at 2 s).
pub fn fast_poll_policy() -> tempfile::NamedTempFile {
    let mut policy = tempfile::NamedTempFile::new().unwrap();
    write!(
        policy,
        // agent_authors = "anyone": the PRs' author (`agent-bot`, not a bot user here)
        // gets its ci-fix without a permission read; these tests count work, not its
        // gate (see `scenarios::authors`).
        "[defaults]\nstale_after_secs = 31536000\nci_poll_initial_secs = 1\nci_poll_max_secs = 2\nagent_authors = \"anyone\"\n"
    )
    .unwrap();
    policy
}

/// Opens `prs` PRs (red CI on their heads) and prepares `per_pr` deliveries for each
/// (opened, then title edits), interleaved across PRs.
pub fn prepare(fake: &FakeForgejo, prs: u64, per_pr_count: usize) -> Vec<Planned> {
    prepare_spread(fake, 1, prs, per_pr_count)
}

/// [`prepare`] with the PRs spread round-robin over the first `repos` of [`REPOS`].
pub fn prepare_spread(
    fake: &FakeForgejo,
    repos: usize,
    prs: u64,
    per_pr_count: usize,
) -> Vec<Planned> {
    for repo in &REPOS[..repos] {
        fake.create_repo(repo);
    }
    let mut per_pr = Vec::new();
    for i in 0..prs {
        let repo = REPOS[i as usize % repos];
        let body = format!("Change {i}.\n\nAutomated by CleverAgents Bot");
        let n = fake.open_pr(
            repo,
            NewPr::new("agent-bot", &format!("Change {i}")).body(&body),
        );
        let sha = fake.head_sha(repo, n);
        fake.set_status(repo, &sha, "ci/test", "failure", "1 test failed");
        let mut hooks = vec![fake.pr_opened(repo, n)];
        let mut title = format!("Change {i}");
        for k in 1..per_pr_count {
            let old = std::mem::replace(&mut title, format!("Change {i}, take {k}"));
            fake.set_title(repo, n, &title);
            hooks.push(fake.pr_edited(repo, n, "agent-bot", &old));
        }
        per_pr.push(((repo, n), hooks));
    }
    let mut plan = Vec::new();
    for k in 0..per_pr_count {
        for (n, hooks) in &per_pr {
            plan.push((*n, new_delivery(), hooks[k].event_type, hooks[k].body()));
        }
    }
    plan
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_one_killed_commit_every_delivery_exactly_once() {
    let started = Instant::now();
    let redis = RedisServer::start();
    let fake = FakeForgejo::start().await;
    let policy = fast_poll_policy();
    let policy_path = policy.path().display().to_string();
    let serve = Shepherd::serve(&redis).await;
    let prefix = serve.prefix().to_owned();
    let keys = serve.keys();
    let mut workers = [
        start_worker(&redis, &prefix, &fake, &policy_path).await,
        start_worker(&redis, &prefix, &fake, &policy_path).await,
        start_worker(&redis, &prefix, &fake, &policy_path).await,
    ];
    let plan = prepare(&fake, PRS, PER_PR);
    let expected = by_pr(plan.iter().map(|(n, d, _, _)| (*n, d)));
    let (client, url, total) = (reqwest::Client::new(), serve.webhook_url(), plan.len());
    let mut responses = futures_util::stream::iter(plan.iter())
        .map(|(_, delivery, event_type, body)| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                post(&client, &url, &signed(body, event_type, delivery))
                    .await
                    .status()
                    .as_u16()
            }
        })
        .buffer_unordered(CONCURRENCY);
    let (mut sent, mut killed, mut restarted) = (0usize, false, false);
    while let Some(status) = responses.next().await {
        assert_eq!(status, 202, "every delivery is accepted");
        sent += 1;
        if !killed && sent >= total / 3 {
            workers[0].kill();
            killed = true;
        }
        if !restarted && sent >= 2 * total / 3 {
            workers[0] = start_worker(&redis, &prefix, &fake, &policy_path).await;
            restarted = true;
        }
    }
    let sent_at = started.elapsed();
    let mut conn = redis.conn().await;
    wait_committed(&conn, &keys, &expected, Duration::from_secs(40)).await;
    assert_exactly_once(&mut conn, &keys, &expected, total).await;
    wait_settled(&mut conn, &keys, PRS).await;
    assert_no_duplicate_side_effects(&mut conn, &keys, &fake, &prs_of(&expected)).await;
    eprintln!(
        "scale: {total} deliveries over {PRS} PRs sent in {sent_at:?}, all committed and dispatched after {:?}",
        started.elapsed()
    );
}

/// Delivery ids grouped by PR.
pub fn by_pr<'a>(
    deliveries: impl Iterator<Item = (Pr, &'a String)>,
) -> HashMap<Pr, HashSet<String>> {
    deliveries.fold(HashMap::new(), |mut m, (n, d)| {
        m.entry(n).or_default().insert(d.clone());
        m
    })
}

/// Waits until one `ci-fix` per PR is dispatched and nothing is pending; asserts that
/// nothing was dead-lettered.
pub async fn wait_settled(conn: &mut crate::support::redis::TestConn, keys: &Keys, prs: u64) {
    poll_until_named(
        Duration::from_secs(20),
        "one ci-fix dispatched per PR",
        || {
            let mut c = conn.clone();
            let key = keys.dispatch();
            async move {
                stream_entries(&mut c, &key)
                    .await
                    .iter()
                    .filter(|(_, f)| f.contains_key("work"))
                    .count()
                    >= prs as usize
            }
        },
    )
    .await;
    poll_until_named(Duration::from_secs(10), "nothing pending", || {
        let mut c = conn.clone();
        async move {
            for shard in 0..keys.shards() {
                if pending(&mut c, &keys.events(shard)).await != 0 {
                    return false;
                }
            }
            true
        }
    })
    .await;
    let mut dead: Vec<(String, Option<String>)> = Vec::new();
    for shard in 0..keys.shards() {
        dead.extend(
            stream_entries(conn, &keys.dead_letters(shard))
                .await
                .into_iter()
                .map(|(id, f)| (id, f.get("dl_reason").cloned())),
        );
    }
    assert!(dead.is_empty(), "nothing dead-lettered: {dead:?}");
}

/// Waits until every delivery is in its PR's history.
pub async fn wait_committed(
    conn: &crate::support::redis::TestConn,
    keys: &Keys,
    expected: &HashMap<Pr, HashSet<String>>,
    deadline: Duration,
) {
    poll_until_named(deadline, "every delivery is in its PR's history", || {
        let mut c = conn.clone();
        async move {
            for ((repo, n), ds) in expected {
                let h = history(&mut c, &keys.history(repo, *n)).await;
                let seen: HashSet<&str> = h.iter().map(|f| f["delivery"].as_str()).collect();
                if !ds.iter().all(|d| seen.contains(d.as_str())) {
                    return false;
                }
            }
            true
        }
    })
    .await;
}

/// Asserts that each delivery appears exactly once in its PR's history.
pub async fn assert_exactly_once(
    conn: &mut crate::support::redis::TestConn,
    keys: &Keys,
    expected: &HashMap<Pr, HashSet<String>>,
    total: usize,
) {
    let mut duplicates = Vec::new();
    let mut committed = 0;
    for ((repo, n), ds) in expected {
        let h = history(conn, &keys.history(repo, *n)).await;
        let mut count: HashMap<&str, usize> = HashMap::new();
        for f in &h {
            *count.entry(f["delivery"].as_str()).or_default() += 1;
        }
        for d in ds {
            match count.get(d.as_str()) {
                Some(1) => committed += 1,
                other => duplicates.push((n, d.clone(), other.copied())),
            }
        }
    }
    assert!(
        duplicates.is_empty(),
        "deliveries not committed exactly once: {duplicates:?}"
    );
    assert_eq!(committed, total);
}

/// One work item per PR, no comment posted twice, at most one status comment per PR,
/// no merge.
pub async fn assert_no_duplicate_side_effects(
    conn: &mut crate::support::redis::TestConn,
    keys: &Keys,
    fake: &FakeForgejo,
    prs: &[Pr],
) {
    let items: Vec<serde_json::Value> = stream_entries(conn, &keys.dispatch())
        .await
        .into_iter()
        .filter_map(|(_, f)| {
            f.get("work")
                .map(|w| serde_json::from_str(w).expect("work JSON"))
        })
        .collect();
    let mut per_pr: HashMap<(String, u64), usize> = HashMap::new();
    let mut ids = HashSet::new();
    for item in &items {
        assert!(
            ids.insert(item["id"].as_str().unwrap().to_owned()),
            "work item dispatched twice: {item}"
        );
        assert_eq!(item["kind"], "ci-fix");
        let repo = item["repo"].as_str().expect("work item repo").to_owned();
        *per_pr
            .entry((repo, item["number"].as_u64().unwrap()))
            .or_default() += 1;
    }
    assert_eq!(per_pr.len(), prs.len());
    assert!(
        per_pr.values().all(|c| *c == 1),
        "one dispatch per PR: {per_pr:?}"
    );
    for &(repo, n) in prs {
        let comments: Vec<_> = fake
            .comments_on(repo, n)
            .into_iter()
            .filter(|c| c.user == fake.bot_login())
            .collect();
        let bodies: HashSet<&str> = comments.iter().map(|c| c.body.as_str()).collect();
        assert_eq!(
            bodies.len(),
            comments.len(),
            "a comment posted twice on {repo}#{n}"
        );
        let sticky = comments
            .iter()
            .filter(|c| c.body.contains("<!-- SHEPHERD-STATE: "))
            .count();
        assert!(sticky <= 1, "{sticky} status comments on {repo}#{n}");
    }
    assert!(fake.merges().is_empty(), "red CI: no merge");
}

/// The PRs of a run's expected deliveries.
pub fn prs_of(expected: &HashMap<Pr, HashSet<String>>) -> Vec<Pr> {
    expected.keys().copied().collect()
}
