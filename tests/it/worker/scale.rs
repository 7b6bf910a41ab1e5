//! Horizontal scale (issue 4): one `shepherd serve` and three `shepherd work`
//! processes of the real binary; 2,000 signed deliveries over 200 PRs; one worker is
//! SIGKILLed mid-run and another started in its place. At the end every delivery is
//! committed exactly once in its PR's history, nothing is pending and nothing was
//! dead-lettered.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::{REPO, history, pending, pr_sync};
use crate::support::poll_until_named;
use crate::support::redis::{RedisServer, xlen};
use crate::support::shepherd::Shepherd;
use crate::support::webhook::{new_delivery, post, signed};

/// PRs in the run.
const PRS: u64 = 200;
/// Deliveries per PR.
const PER_PR: u32 = 10;
/// Concurrent webhook POSTs.
const CONCURRENCY: usize = 32;

async fn start_worker(redis: &RedisServer, prefix: &str) -> Shepherd {
    Shepherd::builder(redis)
        .args(["work"])
        .prefix(prefix)
        .env("SHEPHERD_RECLAIM_IDLE_SECS", "2")
        .start()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_one_killed_commit_every_delivery_exactly_once() {
    let started = Instant::now();
    let redis = RedisServer::start();
    let serve = Shepherd::serve(&redis).await;
    let prefix = serve.prefix().to_owned();
    let keys = serve.keys();
    let mut workers = [
        start_worker(&redis, &prefix).await,
        start_worker(&redis, &prefix).await,
        start_worker(&redis, &prefix).await,
    ];
    // Every delivery: (PR, delivery id, prepared request), interleaved across PRs.
    let mut plan = Vec::new();
    for seq in 0..PER_PR {
        for n in 1..=PRS {
            let delivery = new_delivery();
            let request = signed(&pr_sync(n, seq), "pull_request_sync", &delivery);
            plan.push((n, delivery, request));
        }
    }
    let expected: HashMap<u64, HashSet<String>> =
        plan.iter().fold(HashMap::new(), |mut m, (n, d, _)| {
            m.entry(*n).or_default().insert(d.clone());
            m
        });
    let client = reqwest::Client::new();
    let url = serve.webhook_url();
    let total = plan.len();
    let mut sent = 0usize;
    let mut responses = futures_util::stream::iter(plan.iter())
        .map(|(_, _, request)| {
            let (client, url) = (client.clone(), url.clone());
            async move { post(&client, &url, request).await.status().as_u16() }
        })
        .buffer_unordered(CONCURRENCY);
    let mut killed = false;
    let mut restarted = false;
    while let Some(status) = responses.next().await {
        assert_eq!(status, 202, "every delivery is accepted");
        sent += 1;
        if !killed && sent >= total / 3 {
            workers[0].kill();
            killed = true;
        }
        if !restarted && sent >= 2 * total / 3 {
            workers[0] = start_worker(&redis, &prefix).await;
            restarted = true;
        }
    }
    let sent_at = started.elapsed();
    let mut conn = redis.conn().await;
    let events = keys.events(0);
    poll_until_named(
        Duration::from_secs(45),
        "every delivery is in its PR's history",
        || {
            let mut c = conn.clone();
            let keys = keys.clone();
            let expected = &expected;
            async move {
                for (n, ds) in expected {
                    let h = history(&mut c, &keys.history(REPO, *n)).await;
                    let seen: HashSet<&str> = h.iter().map(|f| f["delivery"].as_str()).collect();
                    if !ds.iter().all(|d| seen.contains(d.as_str())) {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
    let mut duplicates = Vec::new();
    let mut committed = 0;
    for (n, ds) in &expected {
        let h = history(&mut conn, &keys.history(REPO, *n)).await;
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
    poll_until_named(Duration::from_secs(10), "nothing pending", || {
        let mut c = conn.clone();
        let events = events.clone();
        async move { pending(&mut c, &events).await == 0 }
    })
    .await;
    assert_eq!(
        xlen(&mut conn, &keys.dead_letters(0)).await,
        0,
        "nothing dead-lettered"
    );
    eprintln!(
        "scale: {total} deliveries over {PRS} PRs sent in {sent_at:?}, all committed after {:?}",
        started.elapsed()
    );
}
