//! Worker tests: the store's scripts and its consumer loop, the real `shepherd work`
//! binary consuming, dead-lettering, reclaiming and stopping gracefully, the results
//! API and stream, and the horizontal-scale run (serve + three workers, one SIGKILLed
//! mid-run).

mod bounds;
mod budget;
mod consume;
mod consumer_loop;
mod economy;
mod economy_bench;
mod entry_layout;
mod ledger;
mod merge_queue;
mod merge_queue_batch;
mod merge_queue_bench;
mod merge_queue_freeze;
mod results;
mod run;
pub mod scale;
mod store;

use std::collections::HashMap;

use crate::support::redis::{Entry, stream_entries};

/// The fixture `webhooks/pull_request_sync.json` rewritten for PR `number` of the
/// fixture's repository, with head sha and `updated_at` derived from `seq` (so each
/// delivery is a newer observation; times relative to the test run, never a calendar
/// date) and no linked issue.
pub fn pr_sync(number: u64, seq: u32) -> Vec<u8> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/webhooks/pull_request_sync.json"
    ))
    .expect("read the pull_request_sync fixture");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    v["number"] = number.into();
    let pr = &mut v["pull_request"];
    pr["number"] = number.into();
    pr["id"] = (10_000 + number).into();
    pr["body"] = "Load test PR".into();
    pr["head"]["sha"] = format!("{:040x}", (u128::from(number) << 32) | u128::from(seq)).into();
    pr["updated_at"] = crate::support::fixture_time(i64::from(seq)).into();
    serde_json::to_vec_pretty(&v).expect("serialize")
}

/// The repository of the fixtures.
pub const REPO: &str = "forgejo-bot-test/widgets";

/// An events-stream entry's fields for an internal event (body verbatim).
pub fn internal_fields<'a>(event: &'a str, body: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("kind", "internal"),
        ("delivery", "test"),
        ("event", event),
        ("repo", REPO),
        ("received", "0"),
        ("body", body),
    ]
}

/// A webhook entry's fields as ingest writes them.
pub fn webhook_fields<'a>(
    event_type: &'a str,
    delivery: &'a str,
    body: &'a str,
) -> Vec<(&'a str, &'a str)> {
    vec![
        ("kind", "webhook"),
        ("delivery", delivery),
        ("event", event_type),
        ("repo", REPO),
        ("received", "0"),
        ("body", body),
    ]
}

/// XADDs an entry; returns its id.
pub async fn xadd(
    conn: &mut crate::support::redis::TestConn,
    stream: &str,
    fields: &[(&str, &str)],
) -> String {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (k, v) in fields {
        cmd.arg(*k).arg(*v);
    }
    cmd.query_async(conn).await.expect("XADD")
}

/// Entries of the group pending in `stream` (0 when the group does not exist yet).
pub async fn pending(conn: &mut crate::support::redis::TestConn, stream: &str) -> u64 {
    let v: redis::Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg("workers")
        .query_async(conn)
        .await
        .unwrap_or(redis::Value::Nil);
    match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => *n as u64,
            _ => 0,
        },
        _ => 0,
    }
}

/// The history entries of a PR, each as its field map.
pub async fn history(
    conn: &mut crate::support::redis::TestConn,
    key: &str,
) -> Vec<HashMap<String, String>> {
    stream_entries(conn, key)
        .await
        .into_iter()
        .map(|(_, f): Entry| f)
        .collect()
}
