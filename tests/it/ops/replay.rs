//! `shepherd replay` by delivery, by PR, by time range and from dead letters, and
//! `--dry-run`: replays are marked in history, cause no new effects, and a dry run
//! changes nothing anywhere.

use std::collections::HashMap;

use serde_json::Value;

use super::{REPO, Scenario};
use crate::support::fake_forgejo::NewPr;

/// The events-stream ids of PR `n`'s original (non-replay) history entries, in order.
async fn original_entries(s: &Scenario, n: u64) -> Vec<String> {
    s.history(n)
        .await
        .into_iter()
        .filter(|h| !h.contains_key("replay") && !h["entry"].is_empty())
        .map(|h| h["entry"].clone())
        .collect()
}

/// The `replay` fields of PR `n`'s history, in order.
async fn replays(s: &Scenario, n: u64) -> Vec<String> {
    s.history(n)
        .await
        .into_iter()
        .filter_map(|h| h.get("replay").cloned())
        .collect()
}

/// The `new_id` of every replayed item of a report.
fn new_ids(report: &Value) -> Vec<String> {
    report["replayed"]
        .as_array()
        .expect("replayed is a list")
        .iter()
        .map(|i| i["new_id"].as_str().expect("a new id").to_owned())
        .collect()
}

/// The `original` of every replayed item of a report.
fn originals(report: &Value) -> Vec<String> {
    report["replayed"]
        .as_array()
        .expect("replayed is a list")
        .iter()
        .map(|i| i["original"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn replay_by_delivery_is_marked_in_history_and_causes_no_new_effects() {
    let s = Scenario::start(&[]).await;
    let n = s.open_pr("alice", "Add the widget");
    let d = s.send(&s.fake.pr_opened(REPO, n)).await;
    s.wait_delivery(n, &d).await;
    let original = original_entries(&s, n).await[0].clone();

    let report = s.cli_json(&["replay", "--delivery", &d, "--json"]);
    assert_eq!(originals(&report), std::slice::from_ref(&original));
    assert!(report["replayed"][0]["new_id"].is_string());
    s.wait_history(n, "the replay is committed", |h| {
        h.get("replay") == Some(&original)
    })
    .await;

    let entry = s
        .history(n)
        .await
        .into_iter()
        .find(|h| h.get("replay") == Some(&original))
        .unwrap();
    assert_eq!(entry["delivery"], d, "the replay keeps the delivery id");
    assert_eq!(entry["effects"], "0", "{entry:?}");
    assert!(
        s.effects_caused_by(&new_ids(&report)).await.is_empty(),
        "no new effects"
    );
    s.assert_no_duplicate_writes();

    let missing = s.cli(&["replay", "--delivery", "no-such-delivery"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("not in the archive"));
}

#[tokio::test]
async fn replay_by_pr_replays_its_deliveries_in_original_order_and_only_them() {
    let s = Scenario::start(&[]).await;
    let n1 = s.open_pr("alice", "First");
    let n2 = s.open_pr("bob", "Second");
    // Opened well before the push: Forgejo's `updated_at` has second resolution, and
    // the core keeps the newer of two snapshots (a tie would let the replayed older
    // snapshot win — see docs/operations.md, "Replaying").
    let mut opened = s.fake.pr_opened(REPO, n1);
    opened.payload["pull_request"]["updated_at"] = crate::support::fixture_time(0).into();
    let d1 = s.send(&opened).await;
    let d2 = s.send(&s.fake.pr_opened(REPO, n2)).await;
    s.fake.push(REPO, n1, &format!("{:040x}", 0xabcdef_u64));
    let d3 = s.send(&s.fake.pr_synchronized(REPO, n1, "alice")).await;
    s.wait_delivery(n1, &d1).await;
    s.wait_delivery(n1, &d3).await;
    s.wait_delivery(n2, &d2).await;
    let order = original_entries(&s, n1).await;
    assert_eq!(order.len(), 2);

    let report = s.cli_json(&["replay", "--pr", &format!("{REPO}#{n1}"), "--json"]);
    assert_eq!(originals(&report), order);
    s.wait_history(n1, "both replays are committed", |h| {
        h.get("replay") == Some(&order[1])
    })
    .await;
    assert_eq!(replays(&s, n1).await, order, "replayed in original order");
    assert!(
        replays(&s, n2).await.is_empty(),
        "the other PR is untouched"
    );
    let caused = s.effects_caused_by(&new_ids(&report)).await;
    assert!(
        caused.is_empty(),
        "no new effects: {caused:?} {:?}",
        s.history(n1).await
    );
    s.assert_no_duplicate_writes();
}

#[tokio::test]
async fn replay_by_time_range_takes_the_repository_deliveries_in_the_window() {
    let s = Scenario::start(&[]).await;
    let n1 = s.open_pr("alice", "First");
    let n2 = s.open_pr("bob", "Second");
    let d1 = s.send(&s.fake.pr_opened(REPO, n1)).await;
    let d2 = s.send(&s.fake.pr_opened(REPO, n2)).await;
    s.wait_delivery(n1, &d1).await;
    s.wait_delivery(n2, &d2).await;

    let none = s.cli_json(&[
        "replay", "--repo", REPO, "--since", "2d", "--until", "1d", "--json",
    ]);
    assert_eq!(originals(&none).len(), 0, "nothing a day ago");
    let future = s.cli_json(&[
        "replay",
        "--repo",
        REPO,
        "--since",
        "2099-01-01T00:00:00Z",
        "--until",
        "2099-12-31T00:00:00Z",
        "--json",
    ]);
    assert_eq!(originals(&future).len(), 0);
    let other = s.cli_json(&["replay", "--repo", "acme/other", "--since", "1h", "--json"]);
    assert_eq!(originals(&other).len(), 0, "another repository");
    let bad = s.cli(&["replay", "--repo", REPO, "--since", "yesterday"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is neither RFC 3339"));

    let report = s.cli_json(&["replay", "--repo", REPO, "--since", "1h", "--json"]);
    let mut expected = original_entries(&s, n1).await;
    expected.extend(original_entries(&s, n2).await);
    expected.sort();
    assert_eq!(originals(&report), expected);
    s.wait_history(n2, "the replay of #2 is committed", |h| {
        h.contains_key("replay")
    })
    .await;
    s.wait_history(n1, "the replay of #1 is committed", |h| {
        h.contains_key("replay")
    })
    .await;
    assert!(
        s.effects_caused_by(&new_ids(&report)).await.is_empty(),
        "no new effects"
    );
    s.assert_no_duplicate_writes();
}

/// Writes a dead letter for events-stream entry `id` the way the workers do.
async fn dead_letter_of(s: &Scenario, id: &str, reason: &str) -> String {
    let keys = s.keys();
    let (_, fields) = s
        .entries(&keys.events(0))
        .await
        .into_iter()
        .find(|(i, _)| i == id)
        .expect("the archived entry");
    dead_letter_with(s, id, reason, &fields).await
}

/// Writes a dead letter with `fields` as the original entry's fields.
async fn dead_letter_with(
    s: &Scenario,
    id: &str,
    reason: &str,
    fields: &HashMap<String, String>,
) -> String {
    use shepherd::store::streams::dead_letter_fields as dl;
    let keys = s.keys();
    let mut cmd = redis::cmd("XADD");
    cmd.arg(keys.dead_letters(0))
        .arg("*")
        .arg(dl::REASON)
        .arg(reason)
        .arg(dl::STREAM)
        .arg(keys.events(0))
        .arg(dl::ID)
        .arg(id)
        .arg(dl::GROUP)
        .arg("workers")
        .arg(dl::DELIVERIES)
        .arg("6")
        .arg(dl::AT)
        .arg(chrono::Utc::now().timestamp_millis());
    for (k, v) in fields {
        cmd.arg(k).arg(v);
    }
    cmd.query_async(&mut s.conn.clone()).await.expect("XADD")
}

#[tokio::test]
async fn dead_letters_are_listed_replayed_once_and_dropped() {
    let s = Scenario::start(&[]).await;
    let n = s.open_pr("alice", "Add the widget");
    let d = s.send(&s.fake.pr_opened(REPO, n)).await;
    s.wait_delivery(n, &d).await;
    let original = original_entries(&s, n).await[0].clone();
    let dead = s.keys().dead_letters(0);
    let dl_id = dead_letter_of(&s, &original, "redis went away mid-commit").await;

    let list = s.cli_json(&["dlq", "list", "--json"]);
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["id"], dl_id.as_str());
    assert_eq!(list[0]["reason"], "redis went away mid-commit");
    assert_eq!(list[0]["delivery"], d.as_str());
    let shown = s.cli_json(&["dlq", "show", &dl_id, "--json"]);
    assert_eq!(shown["original_id"], original.as_str());
    assert!(
        shown["fields"]["body"]
            .as_str()
            .unwrap()
            .contains("pull_request")
    );

    let report = s.cli_json(&["replay", "--dead-letter", "--json"]);
    let marker = format!("dead-letter:{original}");
    assert_eq!(originals(&report), std::slice::from_ref(&marker));
    s.wait_history(n, "the dead letter's replay is committed", |h| {
        h.get("replay") == Some(&marker)
    })
    .await;
    assert!(s.entries(&dead).await.is_empty(), "removed once re-queued");
    assert!(
        s.effects_caused_by(&new_ids(&report)).await.is_empty(),
        "no new effects"
    );
    s.assert_no_duplicate_writes();
    let again = s.cli_json(&["replay", "--dead-letter", "--json"]);
    assert_eq!(originals(&again).len(), 0, "nothing is replayed twice");

    // retry ID and drop --all.
    let one = dead_letter_of(&s, &original, "first").await;
    let two = dead_letter_of(&s, &original, "second").await;
    let retried = s.cli_json(&["dlq", "retry", &one, "--json"]);
    assert_eq!(originals(&retried), std::slice::from_ref(&marker));
    let left: Vec<String> = s.entries(&dead).await.into_iter().map(|(i, _)| i).collect();
    assert_eq!(left, std::slice::from_ref(&two));
    let dropped = s.cli_json(&["dlq", "drop", "--all", "--json"]);
    assert_eq!(dropped["dropped"], 1);
    assert!(s.entries(&dead).await.is_empty());
    let gone = s.cli(&["dlq", "show", &two]);
    assert!(!gone.status.success());
}

/// Everything a dry run must leave alone.
async fn snapshot(s: &Scenario, prs: &[u64]) -> Vec<String> {
    let keys = s.keys();
    let mut out = Vec::new();
    for key in [keys.events(0), keys.effects(0), keys.dead_letters(0)] {
        let sorted: Vec<(String, std::collections::BTreeMap<String, String>)> = s
            .entries(&key)
            .await
            .into_iter()
            .map(|(i, f)| (i, f.into_iter().collect()))
            .collect();
        out.push(format!("{key}: {sorted:?}"));
    }
    for n in prs {
        out.push(format!("record {n}: {:?}", s.record(*n).await));
        let h: Vec<std::collections::BTreeMap<String, String>> = s
            .history(*n)
            .await
            .into_iter()
            .map(|f| f.into_iter().collect())
            .collect();
        out.push(format!("history {n}: {h:?}"));
    }
    out.push(format!("forgejo calls: {}", s.fake.all_calls().len()));
    out
}

#[tokio::test]
async fn dry_run_prints_transitions_and_changes_nothing() {
    let s = Scenario::start(&[]).await;
    let n = s.open_pr("alice", "Processed");
    let d = s.send(&s.fake.pr_opened(REPO, n)).await;
    s.wait_delivery(n, &d).await;
    // A delivery that never reached the workers: a dead letter of a PR with no record.
    let m = s.open_pr("bob", "Never processed");
    let w = s.fake.pr_opened(REPO, m);
    let fields: HashMap<String, String> = [
        ("kind", "webhook".to_owned()),
        ("delivery", "lost-delivery".to_owned()),
        ("event", w.event_type.to_owned()),
        ("repo", REPO.to_owned()),
        ("received", "1".to_owned()),
        ("body", String::from_utf8(w.body()).unwrap()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    dead_letter_with(&s, "1-1", "lost", &fields).await;
    // Nothing else may write meanwhile (timers would): the tools need no server.
    let mut s = s;
    s.stop_app();
    let before = snapshot(&s, &[n, m]).await;

    let dry = s.cli_json(&["replay", "--dead-letter", "--dry-run", "--json"]);
    assert_eq!(dry["dry_run"], true);
    let item = &dry["replayed"][0];
    assert!(item["new_id"].is_null());
    let t = &item["transitions"][0];
    assert_eq!(t["record"], format!("{REPO}#{m}"));
    assert_eq!(t["versions"], serde_json::json!([0, 1]));
    assert!(!t["phase_after"].as_str().unwrap().is_empty());
    assert!(
        !t["effects"].as_array().unwrap().is_empty(),
        "a new PR gets effects: {t}"
    );
    assert!(
        t["note"]
            .as_str()
            .unwrap()
            .starts_with("pull_request/opened")
    );

    let dry_pr = s.cli_json(&[
        "replay",
        "--pr",
        &format!("{REPO}#{n}"),
        "--dry-run",
        "--json",
    ]);
    let t = &dry_pr["replayed"][0]["transitions"][0];
    assert!(
        t["note"].as_str().unwrap().starts_with("no change"),
        "replaying a processed delivery is a no-op: {t}"
    );
    assert_eq!(t["effects"], serde_json::json!([]));

    let human = s.cli(&["replay", "--dead-letter", "--dry-run"]);
    assert!(human.status.success());
    let err = String::from_utf8_lossy(&human.stderr);
    assert!(err.contains(&format!("{REPO}#{m}")), "{err}");
    assert!(err.contains("would replay 1 entries"), "{err}");
    assert!(err.contains("effect "), "the effects are printed: {err}");

    let after = snapshot(&s, &[n, m]).await;
    for (a, b) in before.iter().zip(&after) {
        assert_eq!(a, b, "nothing changed");
    }
}

#[tokio::test]
async fn a_dead_lettered_effect_is_retried_onto_the_effects_stream_and_not_done_twice() {
    use shepherd::store::streams::dead_letter_fields as dl;
    let s = Scenario::start(&[]).await;
    let n = s.open_pr("alice", "Add the widget");
    let d = s.send(&s.fake.pr_opened(REPO, n)).await;
    s.wait_delivery(n, &d).await;
    let keys = s.keys();
    let effects = keys.effects(0);
    // The status comment effect, once the executor has carried it out.
    crate::support::poll_until_named(super::WAIT, "the status comment is posted", || async {
        !s.fake.comments_on(REPO, n).is_empty()
    })
    .await;
    let (id, fields) = s
        .entries(&effects)
        .await
        .into_iter()
        .find(|(_, f)| f["kind"] == "upsert-comment")
        .expect("a status comment effect");
    let mut cmd = redis::cmd("XADD");
    cmd.arg(keys.dead_letters(0))
        .arg("*")
        .arg(dl::REASON)
        .arg("executor crashed")
        .arg(dl::STREAM)
        .arg(&effects)
        .arg(dl::ID)
        .arg(&id)
        .arg(dl::GROUP)
        .arg("executors")
        .arg(dl::DELIVERIES)
        .arg("6")
        .arg(dl::AT)
        .arg(1);
    for (k, v) in &fields {
        cmd.arg(k).arg(v);
    }
    let dl_id: String = cmd.query_async(&mut s.conn.clone()).await.unwrap();
    let listed = s.cli_json(&["dlq", "list", "--json"]);
    assert_eq!(listed[0]["event"], "upsert-comment", "{listed}");

    let report = s.cli_json(&["dlq", "retry", &dl_id, "--json"]);
    let new_id = new_ids(&report)[0].clone();
    let (_, requeued) = s
        .entries(&effects)
        .await
        .into_iter()
        .find(|(i, _)| *i == new_id)
        .expect("re-queued on the effects stream");
    assert_eq!(
        requeued["id"], fields["id"],
        "same effect id: the executor's idempotency key"
    );
    assert_eq!(requeued["replay"], format!("dead-letter:{id}"));
    assert!(s.entries(&keys.dead_letters(0)).await.is_empty());
    crate::support::poll_until_named(super::WAIT, "the executor has consumed it", || async {
        consumed(&s, &effects, &new_id).await
    })
    .await;
    assert_eq!(s.fake.comments_on(REPO, n).len(), 1, "one status comment");
    s.assert_no_duplicate_writes();
}

/// Whether the `executors` group has read past `id` and holds nothing pending.
async fn consumed(s: &Scenario, stream: &str, id: &str) -> bool {
    let groups: redis::streams::StreamInfoGroupsReply = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(&mut s.conn.clone())
        .await
        .unwrap();
    groups.groups.iter().any(|g| {
        g.name == "executors" && g.pending == 0 && {
            let at = |x: &str| -> (u64, u64) {
                let (a, b) = x.split_once('-').unwrap_or((x, "0"));
                (a.parse().unwrap_or(0), b.parse().unwrap_or(0))
            };
            at(&g.last_delivered_id) >= at(id)
        }
    })
}

/// The record's hold (`null` when neither paused nor needing a human).
async fn hold(s: &Scenario, n: u64) -> Value {
    s.record(n).await.1["work"]["hold"].clone()
}

#[tokio::test]
async fn replayed_command_comment_does_not_run_again_after_64_newer_command_comments() {
    let s = Scenario::start(&[]).await;
    s.fake.set_permission(REPO, "carol", "write");
    let n = s.open_pr("alice", "Add the widget");
    let d = s.send(&s.fake.pr_opened(REPO, n)).await;
    s.wait_delivery(n, &d).await;
    let pause = s.fake.add_comment(REPO, n, "carol", "/shepherd pause");
    let pause_hook = s.fake.comment_created(REPO, pause);
    let paused = s.send(&pause_hook).await;
    crate::support::poll_until_named(super::WAIT, "the PR is paused", || async {
        hold(&s, n).await["hold"] == "paused"
    })
    .await;
    let resume = s.fake.add_comment(REPO, n, "carol", "/shepherd resume");
    let d = s.send(&s.fake.comment_created(REPO, resume)).await;
    s.wait_delivery(n, &d).await;
    assert_eq!(hold(&s, n).await, Value::Null, "resumed");
    // More newer command comments than the record's window of handled ids.
    let mut last = String::new();
    for _ in 0..70 {
        let c = s.fake.add_comment(REPO, n, "carol", "/shepherd status");
        last = s.send(&s.fake.comment_created(REPO, c)).await;
    }
    s.wait_delivery(n, &last).await;

    // The captured body again under a new delivery id, and an admin replay.
    let resent = s.send(&pause_hook).await;
    s.wait_delivery(n, &resent).await;
    let report = s.cli_json(&["replay", "--delivery", &paused, "--json"]);
    let original = originals(&report)[0].clone();
    s.wait_history(n, "the replay is committed", |h| {
        h.get("replay") == Some(&original)
    })
    .await;
    assert_eq!(hold(&s, n).await, Value::Null, "the old pause ran again");
    assert!(
        s.effects_caused_by(&new_ids(&report)).await.is_empty(),
        "no new effects"
    );
}

/// The records (as the dry run names them: `owner/repo#N`, `issue owner/repo#N`) whose
/// history has an entry for `delivery`.
async fn records_with_history_of(
    s: &Scenario,
    delivery: &str,
    prs: &[u64],
    issues: &[u64],
) -> Vec<String> {
    let keys = s.keys();
    let streams = prs
        .iter()
        .map(|n| (keys.history(REPO, *n), format!("{REPO}#{n}")))
        .chain(
            issues
                .iter()
                .map(|n| (keys.issue_history(REPO, *n), format!("issue {REPO}#{n}"))),
        );
    let mut out = Vec::new();
    for (stream, name) in streams {
        let hit = s
            .entries(&stream)
            .await
            .iter()
            .any(|(_, f)| f.get("delivery").map(String::as_str) == Some(delivery));
        if hit {
            out.push(name);
        }
    }
    out
}

/// Issue #13's bug: the dry run of a `pull_request` event left out the issues the PR
/// links, so `replay --dry-run` under-reported issue transitions. It now lists every
/// record a worker writes for that delivery — checked against what the worker then
/// does with it.
#[tokio::test]
async fn dry_run_of_a_pr_event_lists_the_linked_issue_as_the_worker_applies_it() {
    use shepherd::store::fields;
    let mut s = Scenario::start(&[]).await;
    // A processed delivery first: the workers' group exists when the app comes back.
    let other = s.open_pr("alice", "Unrelated");
    let d = s.send(&s.fake.pr_opened(REPO, other)).await;
    s.wait_delivery(other, &d).await;
    // The agents' PR for an issue: its link holds the issue, so the issue's record
    // changes (a human's open PR would leave it as it is).
    let issue = s
        .fake
        .create_issue(REPO, "alice", "Widgets need x", "Please add x.");
    let author = s.fake.bot_login().to_owned();
    let body = format!("Adds x.\n\nCloses #{issue}");
    let n = s
        .fake
        .open_pr(REPO, NewPr::new(&author, "Add x").body(&body));
    let hook = s.fake.pr_opened(REPO, n);
    // The delivery is in the archive but no worker has seen it yet: the app is down.
    s.stop_app();
    let delivery = "linking-delivery";
    let _: String = redis::cmd("XADD")
        .arg(s.keys().events(0))
        .arg("*")
        .arg(fields::KIND)
        .arg(fields::KIND_WEBHOOK)
        .arg(fields::DELIVERY)
        .arg(delivery)
        .arg(fields::EVENT)
        .arg(hook.event_type)
        .arg(fields::REPO)
        .arg(REPO)
        .arg(fields::RECEIVED)
        .arg(chrono::Utc::now().timestamp_millis())
        .arg(fields::BODY)
        .arg(hook.body())
        .query_async(&mut s.conn.clone())
        .await
        .expect("XADD");
    let before = snapshot(&s, &[n, other]).await;

    let dry = s.cli_json(&["replay", "--delivery", delivery, "--dry-run", "--json"]);
    let transitions = dry["replayed"][0]["transitions"]
        .as_array()
        .expect("transitions")
        .clone();
    let records: Vec<&str> = transitions
        .iter()
        .map(|t| t["record"].as_str().unwrap())
        .collect();
    let issue_record = format!("issue {REPO}#{issue}");
    assert_eq!(
        records,
        [format!("{REPO}#{n}"), issue_record.clone()],
        "the PR, then the issue it links: {dry}"
    );
    let t = &transitions[1];
    assert_eq!(t["versions"], serde_json::json!([0, 1]), "{t}");
    assert!(
        t["note"]
            .as_str()
            .unwrap()
            .starts_with("pull_request/opened"),
        "{t}"
    );
    let human = s.cli(&["replay", "--delivery", delivery, "--dry-run"]);
    let err = String::from_utf8_lossy(&human.stderr);
    assert!(
        err.contains(&issue_record),
        "the progress line names it: {err}"
    );
    let after = snapshot(&s, &[n, other]).await;
    assert_eq!(before, after, "the dry run changed nothing");
    let issue_key = s.keys().issue_record(REPO, issue);
    let exists: bool = redis::cmd("EXISTS")
        .arg(&issue_key)
        .query_async(&mut s.conn.clone())
        .await
        .unwrap();
    assert!(!exists, "no issue record was written");

    // The worker writes exactly the records the dry run listed.
    s.restart_app().await;
    crate::support::poll_until_named(super::WAIT, "the worker applied the delivery", || async {
        records_with_history_of(&s, delivery, &[n], &[issue])
            .await
            .len()
            == 2
    })
    .await;
    let written = records_with_history_of(&s, delivery, &[n, other], &[issue]).await;
    assert_eq!(written, records, "the worker and the dry run agree");
}
