//! Work results: `POST /api/v1/work/{id}/result` on `shepherd serve` (the 401/404/409/
//! 422/202 matrix) and the `<prefix>:results` stream consumed by `shepherd work`.

use std::time::Duration;

use serde_json::json;
use shepherd::store::commit::{self, CommitPlan};
use shepherd::store::work::WorkOwner;
use shepherd::store::{Keys, Store};

use super::REPO;
use crate::support::poll_until_named;
use crate::support::redis::{RedisServer, stream_entries};
use crate::support::shepherd::Shepherd;

/// The agent token the tests configure.
const TOKEN: &str = "agent-token-for-tests";

/// Makes `work_id` active for PR `number` (what committing a `Dispatch` does).
async fn activate(redis: &RedisServer, keys: &Keys, work_id: &str, number: u64) {
    let store = Store::connect(&redis.url(), keys.clone()).await.unwrap();
    let plan = CommitPlan {
        work_add: vec![(work_id.to_owned(), WorkOwner::encode(false, REPO, number))],
        ..CommitPlan::default()
    };
    commit::commit(&mut store.conn(), keys, &plan)
        .await
        .unwrap();
}

/// Ends `work_id` (what committing the transition that ends it does).
async fn end(redis: &RedisServer, keys: &Keys, work_id: &str) {
    let store = Store::connect(&redis.url(), keys.clone()).await.unwrap();
    let plan = CommitPlan {
        work_end: vec![work_id.to_owned()],
        ended_ttl_secs: 60,
        ..CommitPlan::default()
    };
    commit::commit(&mut store.conn(), keys, &plan)
        .await
        .unwrap();
}

/// The work id format of the core for PR `number` of the fixture repository.
fn work_id(number: u64, seq: u64) -> String {
    format!("forgejo-bot-test:widgets:pr:{number}:{seq}")
}

#[tokio::test]
async fn results_api_answers_401_404_409_422_and_202() {
    let redis = RedisServer::start();
    let serve = Shepherd::builder(&redis)
        .env("SHEPHERD_AGENT_TOKEN", TOKEN)
        .start()
        .await;
    let keys = serve.keys();
    let active = work_id(12, 1);
    activate(&redis, &keys, &active, 12).await;
    let http = reqwest::Client::new();
    let post = |id: &str, token: Option<&str>, body: String| {
        let mut r = http
            .post(serve.url(&format!("/api/v1/work/{id}/result")))
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        async move { r.send().await.expect("an answer") }
    };
    let ok = json!({"outcome": "failed", "signature": "ci:test", "summary": "tests still fail"})
        .to_string();
    let status = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(
        status(post(&active, None, ok.clone()).await),
        401,
        "no token"
    );
    assert_eq!(
        status(post(&active, Some("wrong"), ok.clone()).await),
        401,
        "wrong token"
    );
    assert_eq!(
        status(post("nobody:nothing:pr:1:1", Some(TOKEN), ok.clone()).await),
        404,
        "unknown id"
    );
    let bad_json = post(&active, Some(TOKEN), "{nope".into()).await;
    assert_eq!(bad_json.status().as_u16(), 422);
    let bad_outcome = post(
        &active,
        Some(TOKEN),
        json!({"outcome": "maybe"}).to_string(),
    )
    .await;
    assert_eq!(bad_outcome.status().as_u16(), 422);
    let message = bad_outcome.text().await.unwrap();
    assert!(
        message.contains("outcome"),
        "the message names the field: {message}"
    );
    let accepted = post(&active, Some(TOKEN), ok.clone()).await;
    assert_eq!(accepted.status().as_u16(), 202);
    let again = post(&active, Some(TOKEN), ok.clone()).await;
    assert_eq!(again.status().as_u16(), 409, "already reported");
    assert!(again.text().await.unwrap().contains("already reported"));
    // The accepted result is queued once, as an internal WorkResult event.
    let mut conn = redis.conn().await;
    let entries = stream_entries(&mut conn, &keys.events(0)).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    let f = &entries[0].1;
    assert_eq!(f["kind"], "internal");
    assert_eq!(f["delivery"], format!("result:{active}"));
    let event: serde_json::Value = serde_json::from_str(&f["body"]).unwrap();
    assert_eq!(event["type"], "work-result");
    assert_eq!(event["work_id"], active.as_str());
    assert_eq!(event["outcome"], "failed");
    assert_eq!(event["signature"], "ci:test");
    // Work that has ended: 409.
    let ended = work_id(12, 2);
    activate(&redis, &keys, &ended, 12).await;
    end(&redis, &keys, &ended).await;
    let late = post(&ended, Some(TOKEN), ok.clone()).await;
    assert_eq!(late.status().as_u16(), 409);
    assert!(late.text().await.unwrap().contains("no longer active"));
}

#[tokio::test]
async fn results_stream_entries_become_work_result_events() {
    let redis = RedisServer::start();
    let prefix = "resstream";
    let keys = Keys::new(prefix, 1);
    let active = work_id(4, 1);
    activate(&redis, &keys, &active, 4).await;
    let _w = Shepherd::builder(&redis)
        .args(["work"])
        .prefix(prefix)
        .start()
        .await;
    let mut conn = redis.conn().await;
    let report = |v: serde_json::Value| v.to_string();
    for result in [
        report(json!({"id": active, "outcome": "succeeded", "summary": "fixed"})),
        report(json!({"id": active, "outcome": "succeeded"})),
        report(json!({"id": "nobody:x:pr:1:1", "outcome": "failed"})),
        "not json".to_owned(),
    ] {
        super::xadd(&mut conn, &keys.results(), &[("result", result.as_str())]).await;
    }
    poll_until_named(
        Duration::from_secs(20),
        "the result is queued and the rest dead-lettered",
        || {
            let mut c = conn.clone();
            let (events, dead) = (keys.events(0), keys.dead_letters(0));
            async move {
                let queued = stream_entries(&mut c, &events).await;
                let dead = stream_entries(&mut c, &dead).await;
                queued.len() == 1 && dead.len() == 2
            }
        },
    )
    .await;
    let queued = stream_entries(&mut conn, &keys.events(0)).await;
    assert_eq!(queued[0].1["delivery"], format!("result:{active}"));
    let dead = stream_entries(&mut conn, &keys.dead_letters(0)).await;
    let reasons: Vec<&str> = dead.iter().map(|(_, f)| f["dl_reason"].as_str()).collect();
    assert!(
        reasons.iter().any(|r| r.starts_with("unknown work id")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.starts_with("undecodable result")),
        "{reasons:?}"
    );
}
