//! `shepherd run`: serve and work in one process; with nothing listening at
//! `SHEPHERD_REDIS_URL` it starts a durable redis-server of its own, uses it, and stops
//! it on shutdown.

use std::time::Duration;

use super::{REPO, history, pr_sync};
use crate::support::poll_until_named;
use crate::support::redis::free_port;
use crate::support::shepherd::Shepherd;
use crate::support::webhook::{new_delivery, post, signed};

#[tokio::test]
async fn run_starts_a_durable_redis_when_none_answers_and_stops_it() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let data = tempfile::tempdir().unwrap();
    let mut run = Shepherd::builder_url(&url)
        .args(["run"])
        .env("SHEPHERD_DATA_DIR", data.path().to_string_lossy())
        .start()
        .await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = crate::support::redis::TestConn::Single(
        client
            .get_multiplexed_async_connection()
            .await
            .expect("its redis answers"),
    );
    let config: Vec<String> = redis::cmd("CONFIG")
        .arg(&["GET", "append*"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let config: std::collections::HashMap<_, _> = config
        .chunks(2)
        .map(|c| (c[0].clone(), c[1].clone()))
        .collect();
    assert_eq!(config["appendonly"], "yes");
    assert_eq!(config["appendfsync"], "always");
    let dir: Vec<String> = redis::cmd("CONFIG")
        .arg(&["GET", "dir"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        std::path::Path::new(&dir[1]),
        data.path().canonicalize().unwrap()
    );
    // Webhook in, transition committed, by the one process.
    let delivery = new_delivery();
    let answer = post(
        &reqwest::Client::new(),
        &run.webhook_url(),
        &signed(&pr_sync(5, 1), "pull_request_sync", &delivery),
    )
    .await;
    assert_eq!(answer.status().as_u16(), 202);
    let key = run.keys().history(REPO, 5);
    poll_until_named(Duration::from_secs(20), "the delivery is committed", || {
        let (mut c, key, delivery) = (conn.clone(), key.clone(), delivery.clone());
        async move {
            history(&mut c, &key)
                .await
                .iter()
                .any(|f| f["delivery"] == delivery)
        }
    })
    .await;
    run.terminate();
    let status = run.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "{status}");
    assert!(
        client.get_multiplexed_async_connection().await.is_err(),
        "the redis-server it started is stopped with it"
    );
    assert!(
        data.path().join("appendonlydir").exists() || data.path().join("appendonly.aof").exists()
    );
}
