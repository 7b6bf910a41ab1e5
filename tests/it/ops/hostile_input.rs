//! Issue 12, the findings of the store, executor and operator tools: events and pages
//! that reach no record, a 403 from the merge endpoint, and the stream bounds.

use redis::streams::StreamInfoGroupsReply;

use super::{ADMIN, REPO, Scenario, WAIT};
use crate::support::fake_forgejo::{Fault, NewPr};
use crate::support::poll_until_named;
use crate::support::redis::xlen;

/// True when the workers' group has read and acknowledged every events-stream entry
/// (processed, or moved to the dead letters).
async fn events_drained(s: &Scenario) -> bool {
    let groups: StreamInfoGroupsReply = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(s.keys().events(0))
        .query_async(&mut s.conn.clone())
        .await
        .expect("XINFO GROUPS");
    groups
        .groups
        .iter()
        .find(|g| g.name == "workers")
        .is_some_and(|g| g.pending == 0 && g.lag == Some(0))
}

/// Finding 6: a repository Shepherd knows but holds no open PR record for. Its push
/// used to fail with Redis's "empty command" (an empty pipeline) on every delivery and
/// end in the dead letters; the status page, the admin status and `inspect` answered
/// 503. The push must be a no-op and every view must answer.
#[tokio::test]
async fn repository_without_open_prs_poisons_neither_events_nor_status_pages() {
    // Redelivered quickly, and dead-lettered at the second delivery: the bug shows
    // within seconds.
    let s = Scenario::start(&[
        ("SHEPHERD_RECLAIM_IDLE_SECS", "1"),
        ("SHEPHERD_MAX_DELIVERIES", "2"),
    ])
    .await;
    let push = s
        .fake
        .push_event(REPO, "main", &"0".repeat(40), &"a".repeat(40), "alice");
    s.send(&push).await;
    poll_until_named(WAIT, "the push is read and acknowledged", || {
        events_drained(&s)
    })
    .await;
    let dead = xlen(&mut s.conn.clone(), &s.keys().dead_letters(0)).await;
    assert_eq!(dead, 0, "a valid push reaching no record was dead-lettered");

    let get = |path: &str| s.http.get(s.app.url(path)).bearer_auth(ADMIN).send();
    let status = get("/api/v1/admin/status").await.expect("an answer");
    assert_eq!(status.status().as_u16(), 200, "admin status");
    let body: serde_json::Value = status.json().await.expect("JSON");
    assert_eq!(body["dead_letters"], 0);
    let page = get("/").await.expect("an answer");
    assert_eq!(page.status().as_u16(), 200, "status page");
    let repo = get(&format!("/api/v1/admin/inspect/{REPO}"))
        .await
        .expect("an answer");
    assert_eq!(
        repo.status().as_u16(),
        200,
        "admin inspect of the repository"
    );
    assert_eq!(
        s.cli_json(&["inspect", REPO, "--json"]),
        serde_json::json!([])
    );
}

/// By reading (issue 12): any 403 from `POST …/merge` was taken as "merged". Forgejo
/// answers 403 after a merge that could not delete the branch, but also when the
/// token or user may not merge at all: the PR must be re-read, and a PR that is not
/// merged is not recorded as merged (a human is asked instead).
#[tokio::test(flavor = "multi_thread")]
async fn merge_refused_with_403_is_not_recorded_as_merged() {
    let s = crate::support::scenario::Scenario::start("").await;
    let fake = &s.fake;
    let n = fake.open_pr(
        REPO,
        NewPr::new("alice", "Refactor widgets").body("By hand."),
    );
    let sha = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", "success", "green");
    let merge = format!("/repos/{REPO}/pulls/{n}/merge");
    // What Forgejo's token-scope check answers before the merge handler runs.
    fake.inject(Fault::on("POST", &merge).status_message(
        403,
        "token does not have at least one of required scope(s): [write:repository]",
    ));
    s.send(&fake.pr_opened(REPO, n)).await;
    s.wait_phase(REPO, n, "awaiting-review").await;
    for reviewer in ["bob", "dave"] {
        let id = fake.add_review(REPO, n, reviewer, "APPROVED");
        s.send(&fake.pr_reviewed(REPO, n, id)).await;
    }
    s.wait_fake("the merge is attempted", |f| {
        !f.calls("POST", &merge).is_empty()
    })
    .await;
    s.wait_phase(REPO, n, "needs-human").await;
    s.wait_idle().await;
    assert!(
        !fake.issue(REPO, n).pull.unwrap().merged,
        "the fake never merged"
    );
    assert_eq!(
        s.phase(REPO, n).await,
        "needs-human",
        "not recorded as merged"
    );
    assert!(fake.merges().is_empty());
}

/// By reading (issue 12): without `SHEPHERD_BOT_LOGIN`, Shepherd's comment markers
/// from anyone were trusted. `work` and `run` with the executor on (Forgejo URL and
/// token) must refuse to start, naming the setting.
#[test]
fn executor_without_bot_login_would_trust_anyones_markers_so_it_does_not_start() {
    for command in ["work", "run"] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"));
        for (key, _) in std::env::vars() {
            if key.starts_with("SHEPHERD_") {
                cmd.env_remove(key);
            }
        }
        let data = tempfile::tempdir().expect("a data dir");
        cmd.arg(command)
            // Nothing listens here: the refusal must come before any connection.
            .env("SHEPHERD_REDIS_URL", "redis://127.0.0.1:9")
            .env("SHEPHERD_DATA_DIR", data.path())
            .env("SHEPHERD_LISTEN", "127.0.0.1:0")
            .env("SHEPHERD_WEBHOOK_SECRETS", crate::support::TEST_SECRET)
            .env("SHEPHERD_FORGEJO_URL", "http://127.0.0.1:9")
            .env("SHEPHERD_FORGEJO_TOKEN", "a-token")
            .env("SHEPHERD_LOG", "warn")
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("run the shepherd binary");
        let end = std::time::Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for shepherd") {
                break status;
            }
            if std::time::Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                panic!("`{command}` started without SHEPHERD_BOT_LOGIN and kept running");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr)
            .expect("stderr");
        assert!(!status.success(), "`{command}` started: {stderr}");
        assert!(
            stderr.contains("SHEPHERD_BOT_LOGIN"),
            "`{command}`: {stderr}"
        );
    }
}

/// By reading (issue 12): every accepted delivery trimmed the events stream by age
/// (`XADD MINID ~ now-retention`), also the entries no worker had processed yet (a
/// worker outage longer than the window lost them). An accepted delivery is never
/// dropped: ingest no longer trims, and the workers trim only acknowledged entries.
#[tokio::test]
async fn ingest_never_trims_events_no_worker_has_processed() {
    let redis = crate::support::redis::RedisServer::start();
    let app = crate::support::shepherd::Shepherd::serve(&redis).await;
    let events = app.keys().events(0);
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&events)
        .arg("workers")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .unwrap();
    // 300 entries from long before the retention window, never delivered to a worker.
    for seq in 1..=300 {
        let _: String = redis::cmd("XADD")
            .arg(&events)
            .arg(format!("1000-{seq}"))
            .arg(&["kind", "internal", "event", "old-but-unprocessed"])
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let fake = crate::support::fake_forgejo::FakeForgejo::start().await;
    fake.create_repo(REPO);
    let push = fake.push_event(REPO, "main", &"0".repeat(40), &"b".repeat(40), "alice");
    let delivery = crate::support::webhook::new_delivery();
    let answer = crate::support::webhook::post(
        &reqwest::Client::new(),
        &app.webhook_url(),
        &crate::support::webhook::signed(&push.body(), push.event_type, &delivery),
    )
    .await;
    assert_eq!(answer.status().as_u16(), 202);
    assert_eq!(
        xlen(&mut conn, &events).await,
        301,
        "unprocessed entries were trimmed"
    );
}
