//! The cost ledger on a real redis-server (`store::ledger`): a run counted once per
//! work id, its figures per PR, repository, owner, instance, kind and tier for its
//! UTC day and month, the 13-month expiry, one hash slot, and the runs of the last hour.

use shepherd::core::ids::RepoName;
use shepherd::core::usage::Usage;
use shepherd::store::ledger::{self, Bucket, Figures, RunEntry, Scope, Spent, Window};
use shepherd::store::{Keys, Store};

use crate::support::redis::RedisServer;

/// Now, unix ms (figures are bucketed by the day of the run).
fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A run of PR (or issue) `number` of `repo` with `cost` micro-dollars and `input`
/// / `output` tokens.
fn run(repo: &str, number: u64, seq: u64, cost: u64, input: u64, output: u64) -> RunEntry {
    let repo: RepoName = repo.parse().unwrap();
    RunEntry {
        work_id: format!("{}:{}:pr:{number}:{seq}", repo.owner(), repo.name()),
        repo,
        number,
        issue: false,
        kind: "ci-fix".into(),
        tier: 1,
        at_ms: now_ms(),
        outcome: "failed".into(),
        usage: Usage {
            input_tokens: input,
            output_tokens: output,
            reasoning_tokens: 7,
            cache_read_tokens: 100,
            cost_micros: cost,
            model: Some("stub/model".into()),
            steps: 2,
            ..Usage::default()
        },
    }
}

async fn store(redis: &RedisServer, prefix: &str) -> Store {
    Store::connect(&redis.url(), Keys::new(prefix, 4))
        .await
        .unwrap()
}

#[tokio::test]
async fn ledger_counts_each_work_id_once_in_every_scope() {
    let redis = RedisServer::start();
    let store = store(&redis, "led1").await;
    let keys = store.keys().clone();
    let mut conn = store.conn();
    let a1 = run("acme/widgets", 12, 1, 1_500, 1_000, 200);
    let mut a2 = run("acme/widgets", 12, 2, 2_500, 3_000, 400);
    a2.kind = "review".into();
    a2.tier = 2;
    let b = run("acme/gadgets", 3, 1, 10_000, 50, 5);
    let other = run("zeta/tools", 1, 1, 7, 1, 1);
    // One time for every run and read, so the runs share a day even at midnight.
    let now = a1.at_ms;
    for r in [&a1, &a2, &b, &other] {
        let mut r = r.clone();
        r.at_ms = now;
        assert!(ledger::record(&mut conn, &keys, &r).await.unwrap(), "first");
    }
    // The same work id again (a re-reported result), even with other figures: nothing.
    let mut again = a1.clone();
    again.usage.cost_micros = 999_999;
    assert!(!ledger::record(&mut conn, &keys, &again).await.unwrap());

    let widgets: RepoName = "acme/widgets".parse().unwrap();
    let pr = Scope::Pr {
        repo: widgets.clone(),
        number: 12,
    };
    let expect_pr = Spent {
        usd_micros: 4_000,
        tokens: 4_600,
        runs: 2,
    };
    for w in [Window::Lifetime, Window::Day, Window::Month] {
        let got = ledger::spent(&mut conn, &keys, &pr, w, now).await.unwrap();
        assert_eq!(got, expect_pr, "PR over {w:?}");
    }
    let repo = ledger::spent(
        &mut conn,
        &keys,
        &Scope::Repo(widgets.clone()),
        Window::Day,
        now,
    )
    .await
    .unwrap();
    assert_eq!(repo, expect_pr, "the repository has only PR 12");
    let org = ledger::spent(
        &mut conn,
        &keys,
        &Scope::Org("ACME".into()),
        Window::Month,
        now,
    )
    .await
    .unwrap();
    assert_eq!(
        org,
        Spent {
            usd_micros: 14_000,
            tokens: 4_655,
            runs: 3
        }
    );
    let all = ledger::spent(&mut conn, &keys, &Scope::Instance, Window::Day, now)
        .await
        .unwrap();
    assert_eq!(all.usd_micros, 14_007);
    assert_eq!(all.runs, 4);
    // Another day (far from today) has nothing.
    let far = now - 400 * 86_400_000;
    let none = ledger::spent(&mut conn, &keys, &Scope::Instance, Window::Day, far)
        .await
        .unwrap();
    assert_eq!(none, Spent::default());
    assert!(
        ledger::spent(&mut conn, &keys, &Scope::Instance, Window::Lifetime, now)
            .await
            .is_err(),
        "no lifetime figure for the instance: an error, not a zero"
    );

    // The day's buckets: kinds and tiers of the repository, every figure summed.
    let day = ledger::buckets(&mut conn, &ledger::day_key(&keys, ledger::day_of(now)))
        .await
        .unwrap();
    let fig = |b: Bucket| day.get(&b).copied().unwrap_or_default();
    assert_eq!(
        fig(Bucket::Kind("acme/widgets".into(), "ci-fix".into())).usd_micros,
        1_500
    );
    assert_eq!(
        fig(Bucket::Tier("acme/widgets".into(), 2)).usd_micros,
        2_500
    );
    let widgets_day = fig(Bucket::Repo("acme/widgets".into()));
    assert_eq!(
        widgets_day,
        Figures {
            usd_micros: 4_000,
            input_tokens: 4_000,
            output_tokens: 600,
            reasoning_tokens: 14,
            cache_read_tokens: 200,
            cache_write_tokens: 0,
            runs: 2,
        }
    );

    // The PR's runs, with their usage, oldest first.
    let (lifetime, runs) = ledger::subject(&mut conn, &keys, false, &widgets, 12)
        .await
        .unwrap();
    assert_eq!(lifetime, widgets_day);
    let ids: Vec<&str> = runs.iter().map(|r| r.work_id.as_str()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&a1.work_id.as_str()) && ids.contains(&a2.work_id.as_str()));
    assert_eq!(
        runs.iter()
            .find(|r| r.work_id == a1.work_id)
            .unwrap()
            .usage
            .cost_micros,
        1_500,
        "the first report's usage, not the re-report's"
    );
    let prs = ledger::subject_figures(
        &mut conn,
        &keys,
        false,
        &[(widgets.clone(), 12), ("acme/gadgets".parse().unwrap(), 3)],
    )
    .await
    .unwrap();
    assert_eq!(prs[0].usd_micros, 4_000);
    assert_eq!(prs[1].usd_micros, 10_000);
}

#[tokio::test]
async fn ledger_keys_share_one_slot_and_expire_after_thirteen_months() {
    let redis = RedisServer::start();
    let store = store(&redis, "led2").await;
    let keys = store.keys().clone();
    let mut conn = store.conn();
    ledger::record(&mut conn, &keys, &run("acme/widgets", 4, 1, 10, 1, 1))
        .await
        .unwrap();
    let mut test = redis.conn().await;
    let found: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut test)
        .await
        .unwrap();
    assert_eq!(found.len(), 3, "PR, day and month hashes: {found:?}");
    // Redis Cluster hashes only a key's `{…}` tag: one tag, one slot.
    let mut tags = std::collections::HashSet::new();
    for key in &found {
        assert!(key.starts_with("{led2:ledger}:"), "{key}");
        tags.insert(key[..=key.find('}').unwrap()].to_owned());
        let ttl: i64 = redis::cmd("TTL")
            .arg(key)
            .query_async(&mut test)
            .await
            .unwrap();
        assert!(
            ttl > 12 * 31 * 86_400 && ttl <= 13 * 31 * 86_400,
            "{key} expires in {ttl}s"
        );
    }
    assert_eq!(tags.len(), 1, "one hash tag: {tags:?}");
}

#[tokio::test]
async fn runs_of_the_last_hour_slide_and_count_a_work_id_once() {
    let redis = RedisServer::start();
    let store = store(&redis, "led3").await;
    let keys = store.keys().clone();
    let mut conn = store.conn();
    let repo: RepoName = "acme/widgets".parse().unwrap();
    let other: RepoName = "acme/gadgets".parse().unwrap();
    let now = now_ms();
    let hour = 3_600_000;
    ledger::note_start(&mut conn, &keys, &repo, "w1", now - hour - 1)
        .await
        .unwrap();
    ledger::note_start(&mut conn, &keys, &repo, "w2", now - hour + 10)
        .await
        .unwrap();
    ledger::note_start(&mut conn, &keys, &repo, "w3", now)
        .await
        .unwrap();
    // A redelivered dispatch of w3 later on: still one run, at its first time.
    ledger::note_start(&mut conn, &keys, &repo, "w3", now + 5)
        .await
        .unwrap();
    ledger::note_start(&mut conn, &keys, &other, "x1", now)
        .await
        .unwrap();
    assert_eq!(
        ledger::runs_last_hour(&mut conn, &keys, &repo, now)
            .await
            .unwrap(),
        2,
        "w1 started more than an hour ago"
    );
    assert_eq!(
        ledger::runs_last_hour(&mut conn, &keys, &repo, now + 20)
            .await
            .unwrap(),
        1,
        "w2's hour has passed"
    );
    assert_eq!(
        ledger::runs_last_hour(&mut conn, &keys, &other, now)
            .await
            .unwrap(),
        1
    );
}
