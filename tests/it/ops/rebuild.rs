//! `shepherd rebuild` on a record corrupted by hand, and `shepherd inspect`.

use serde_json::Value;

use super::{REPO, Scenario};

/// Paths of `changes` other than times: the workers step at their own clock, the fold
/// at each event's receive time, so times may differ by the processing delay.
fn timeless(changes: &Value) -> Vec<String> {
    changes
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap().to_owned())
        .filter(|p| !p.ends_with("_ms"))
        .collect()
}

/// The record without its `*_ms` fields.
fn strip_times(mut v: Value) -> Value {
    match &mut v {
        Value::Object(m) => {
            m.retain(|k, _| !k.ends_with("_ms"));
            for x in m.values_mut() {
                *x = strip_times(x.take());
            }
        }
        Value::Array(a) => {
            for x in a.iter_mut() {
                *x = strip_times(x.take());
            }
        }
        _ => {}
    }
    v
}

#[tokio::test]
async fn rebuild_restores_a_hand_corrupted_record_with_compare_and_set() {
    let s = Scenario::start(&[]).await;
    let n = s.open_pr("alice", "Add the widget");
    let d1 = s.send(&s.fake.pr_opened(REPO, n)).await;
    s.fake.push(REPO, n, &format!("{:040x}", 0x5eed_u64));
    let d2 = s.send(&s.fake.pr_synchronized(REPO, n, "alice")).await;
    s.wait_delivery(n, &d1).await;
    s.wait_delivery(n, &d2).await;
    let mut s = s;
    s.stop_app();
    let (version, good) = s.record(n).await;
    let target = format!("{REPO}#{n}");

    let clean = s.cli_json(&["rebuild", &target, "--json"]);
    assert_eq!(clean["events_folded"], 2);
    assert_eq!(timeless(&clean["changes"]), Vec::<String>::new(), "{clean}");

    // Corrupt the record by hand.
    let mut bad = good.clone();
    bad["work"]["tier"] = 3.into();
    bad["pr"]["title"] = "garbage".into();
    bad["pr"]["head_sha"] = format!("{:040x}", 1).into();
    let key = s.keys().pr_record(REPO, n);
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("data")
        .arg(bad.to_string())
        .query_async(&mut s.conn.clone())
        .await
        .unwrap();

    let report = s.cli_json(&["rebuild", &target, "--json"]);
    let paths: Vec<&str> = report["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"work.tier"), "{paths:?}");
    assert!(paths.contains(&"pr.title"), "{paths:?}");
    assert!(paths.contains(&"pr.head_sha"), "{paths:?}");
    assert_eq!(report["applied"], false);
    assert_eq!(s.record(n).await.1, bad, "without --apply nothing changes");

    let human = s.cli(&["rebuild", &target]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("work.tier: 3 → 0"), "{text}");

    let applied = s.cli_json(&["rebuild", &target, "--apply", "--json"]);
    assert_eq!(applied["applied"], true);
    assert_eq!(applied["new_version"], version + 1);
    let (v, restored) = s.record(n).await;
    assert_eq!(v, version + 1);
    let mut expected = good.clone();
    expected["version"] = (version + 1).into();
    assert_eq!(
        strip_times(restored),
        strip_times(expected),
        "the folded state is the one processed live (up to processing delays)"
    );
    let last = s.history(n).await.pop().unwrap();
    assert_eq!(last["event"], "rebuild");
    assert_eq!(last["version"], (version + 1).to_string());

    let again = s.cli_json(&["rebuild", &target, "--json"]);
    assert_eq!(
        again["changes"],
        serde_json::json!([]),
        "a fold of the fold is itself"
    );
    let unknown = s.cli(&["rebuild", &format!("{REPO}#999"), "--apply"]);
    assert!(!unknown.status.success());
}

#[tokio::test]
async fn inspect_shows_the_record_phase_effects_and_history() {
    let s = Scenario::start(&[]).await;
    let n = s.open_pr("alice", "Add the widget");
    let m = s.open_pr("bob", "Another");
    let d = s.send(&s.fake.pr_opened(REPO, n)).await;
    let e = s.send(&s.fake.pr_opened(REPO, m)).await;
    s.wait_delivery(n, &d).await;
    s.wait_delivery(m, &e).await;

    let one = s.cli_json(&["inspect", &format!("{REPO}#{n}"), "--json"]);
    assert_eq!(one["summary"]["number"], n);
    assert_eq!(one["summary"]["title"], "Add the widget");
    assert!(!one["summary"]["phase"].as_str().unwrap().is_empty());
    assert!(!one["summary"]["reason"].as_str().unwrap().is_empty());
    assert_eq!(one["summary"]["tier_name"], "haiku");
    assert_eq!(one["head_sha"], s.fake.head_sha(REPO, n).as_str());
    let history = one["history"].as_array().unwrap();
    assert!(!history.is_empty() && history.len() <= 20);
    assert_eq!(history[0]["delivery"], d.as_str());
    let fx = s.effects_of(n).await;
    let pending = one["pending_effects"].as_array().unwrap();
    assert!(
        pending.len() <= fx.len()
            && pending
                .iter()
                .all(|p| fx.iter().any(|(_, id)| p["id"] == id.as_str())),
        "pending effects are this PR's: {pending:?} / {fx:?}"
    );
    assert!(one["record"]["version"].as_u64().unwrap() >= 1);

    let text =
        String::from_utf8_lossy(&s.cli(&["inspect", &format!("{REPO}#{n}")]).stdout).into_owned();
    for part in [
        "phase",
        "tier",
        "history (newest first)",
        "pending effects",
        "timers",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }

    let all = s.cli_json(&["inspect", REPO, "--json"]);
    let numbers: Vec<u64> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, [n, m]);
    let lines = String::from_utf8_lossy(&s.cli(&["inspect", REPO]).stdout).into_owned();
    assert_eq!(lines.lines().count(), 2, "{lines}");

    let none = s.cli(&["inspect", &format!("{REPO}#404")]);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no record"));
}

/// The active work id of the stored record of PR `n`, if any.
async fn active_work(s: &Scenario, n: u64) -> Option<String> {
    let (_, record) = s.record(n).await;
    record["work"]["active"]["item"]["id"]
        .as_str()
        .map(str::to_owned)
}

/// The owner the work index gives `work_id`.
async fn indexed(s: &Scenario, work_id: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(s.keys().work_index(0))
        .arg(work_id)
        .query_async(&mut s.conn.clone())
        .await
        .expect("HGET")
}

/// A PR whose CI fails, opened through the webhook, once its `ci-fix` is dispatched;
/// `shepherd run` then stopped. Returns the scenario, the PR and the opening delivery.
async fn dispatched_then_stopped() -> (Scenario, u64, String) {
    let mut s = Scenario::start(&[]).await;
    let n = s.open_pr("alice", "Add the widget");
    let sha = s.fake.head_sha(REPO, n);
    s.fake
        .set_status(REPO, &sha, "ci/test", "failure", "3 tests failed");
    let opened = s.send(&s.fake.pr_opened(REPO, n)).await;
    crate::support::poll_until_named(super::WAIT, "a ci-fix is dispatched", || async {
        active_work(&s, n).await.is_some()
    })
    .await;
    s.stop_app();
    (s, n, opened)
}

/// Issue 12 (by reading): `rebuild --apply` discarded the fold's effects and left the
/// work index alone, so the replaced record's work id stayed active in the index for
/// good (a result for it accepted although no record holds it). Here the archive has
/// lost the events after the PR's opening (as the replay window drops old ones), so
/// the fold holds no work while the stored record holds a dispatched ci-fix.
#[tokio::test]
async fn rebuild_apply_leaves_no_work_id_active_for_good() {
    let (s, n, opened) = dispatched_then_stopped().await;
    let work = active_work(&s, n).await.unwrap();
    assert!(
        indexed(&s, &work).await.is_some(),
        "dispatched work is indexed"
    );

    let events = s.keys().events(0);
    for (id, f) in s.entries(&events).await {
        if f.get("delivery") != Some(&opened) {
            let _: u64 = redis::cmd("XDEL")
                .arg(&events)
                .arg(&id)
                .query_async(&mut s.conn.clone())
                .await
                .unwrap();
        }
    }
    let report = s.cli_json(&["rebuild", &format!("{REPO}#{n}"), "--apply", "--json"]);
    assert_eq!(report["applied"], true, "{report}");
    assert_eq!(active_work(&s, n).await, None, "the fold holds no work");
    assert_eq!(
        indexed(&s, &work).await,
        None,
        "the replaced record's work id is still active in the work index"
    );
    let ended: bool = redis::cmd("EXISTS")
        .arg(s.keys().work_ended(0, &work))
        .query_async(&mut s.conn.clone())
        .await
        .unwrap();
    assert!(
        ended,
        "the replaced work is marked ended (a late result is refused)"
    );
}

/// Issue 12 (by reading), the other half: work that only the rebuilt record holds must
/// be tracked like dispatched work — an index entry (so its result is accepted) and a
/// claim-expiry timer (so the core ends it if no result comes). Here the stored record,
/// its index entry and its claim timer are lost, while the archive still holds every
/// event that led to the dispatch.
#[tokio::test]
async fn rebuild_apply_tracks_work_only_the_rebuilt_record_holds() {
    let (s, n, _) = dispatched_then_stopped().await;
    let work = active_work(&s, n).await.unwrap();
    let mut conn = s.conn.clone();
    let claim_timers = |conn: crate::support::redis::TestConn| {
        let key = s.keys().timers(0);
        async move {
            let mut conn = conn;
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .expect("ZRANGE");
            members
                .into_iter()
                .filter(|m| m.contains("claim:"))
                .collect::<Vec<_>>()
        }
    };
    let lost = claim_timers(conn.clone()).await;
    assert!(!lost.is_empty(), "the dispatch armed a claim timer");
    let _: () = redis::pipe()
        .cmd("DEL")
        .arg(s.keys().pr_record(REPO, n))
        .cmd("HDEL")
        .arg(s.keys().work_index(0))
        .arg(&work)
        .cmd("ZREM")
        .arg(s.keys().timers(0))
        .arg(&lost)
        .query_async(&mut conn)
        .await
        .expect("lose the record, its index entry and its claim timer");

    let report = s.cli_json(&["rebuild", &format!("{REPO}#{n}"), "--apply", "--json"]);
    assert_eq!(report["applied"], true, "{report}");
    let rebuilt = active_work(&s, n)
        .await
        .expect("the fold dispatches the ci-fix again");
    assert!(
        indexed(&s, &rebuilt).await.is_some(),
        "the rebuilt record's work is in the work index"
    );
    let timers = claim_timers(conn).await;
    assert!(
        timers
            .iter()
            .any(|m| m.contains(&format!("claim:{rebuilt}"))),
        "the rebuilt record's work has a claim-expiry timer: {timers:?}"
    );
}
