//! Ingest through the real binary and a real redis-server: the signature matrix, the
//! status matrix (including Redis down and back), concurrency and duplicates, and every
//! payload in `webhooks/`.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use shepherd::app::send::ContentType;
use shepherd::app::send::ForgejoRequest;
use shepherd::store::fields;

use crate::support::redis::{Aof, RedisServer, stream_entries, xlen};
use crate::support::shepherd::Shepherd;
use crate::support::webhook::{new_delivery, post, signed, with, without};
use crate::support::{TEST_SECRET, poll_until, poll_until_named};

/// A small, valid pull_request payload.
const SMALL: &[u8] = br#"{
  "action": "opened",
  "number": 7,
  "repository": {
    "id": 12,
    "full_name": "forgejo-bot-test/widgets"
  }
}"#;

/// The events stream of the instance (one shard).
fn events(s: &Shepherd) -> String {
    s.keys().events(0)
}

async fn status_of(client: &reqwest::Client, s: &Shepherd, r: &ForgejoRequest) -> StatusCode {
    post(client, &s.webhook_url(), r).await.status()
}

#[tokio::test]
async fn signature_matrix() {
    let redis = RedisServer::start();
    let s = Shepherd::builder(&redis)
        .env(
            "SHEPHERD_WEBHOOK_SECRETS",
            format!("old-secret,{TEST_SECRET}"),
        )
        .start()
        .await;
    let client = reqwest::Client::new();
    let ok = |d: &str| signed(SMALL, "pull_request", d);
    let sig = shepherd::ingest::signature::sign_sha256(TEST_SECRET.as_bytes(), SMALL);

    // Each signature header alone is enough.
    let all = [
        "X-Forgejo-Signature",
        "X-Gitea-Signature",
        "X-Gogs-Signature",
        "X-Hub-Signature",
        "X-Hub-Signature-256",
    ];
    for (header, value) in [
        ("X-Forgejo-Signature", sig.clone()),
        ("X-Gitea-Signature", sig.clone()),
        ("X-Hub-Signature-256", format!("sha256={sig}")),
    ] {
        let r = with(without(ok(&new_delivery()), &all), header, &value);
        assert_eq!(
            status_of(&client, &s, &r).await,
            StatusCode::ACCEPTED,
            "{header}"
        );
    }
    // Rotation: the old secret still works next to the new one.
    let old = ForgejoRequest::new(
        SMALL,
        "pull_request",
        &new_delivery(),
        b"old-secret",
        ContentType::Json,
    );
    assert_eq!(
        status_of(&client, &s, &old).await,
        StatusCode::ACCEPTED,
        "second secret"
    );

    let mut refused = Vec::new();
    let wrong = ForgejoRequest::new(
        SMALL,
        "pull_request",
        &new_delivery(),
        b"wrong",
        ContentType::Json,
    );
    refused.push(("wrong secret", wrong));
    refused.push((
        "empty header",
        with(
            without(ok(&new_delivery()), &all),
            "X-Forgejo-Signature",
            "",
        ),
    ));
    let unsigned = ForgejoRequest::new(
        SMALL,
        "pull_request",
        &new_delivery(),
        b"",
        ContentType::Json,
    );
    refused.push(("empty headers as Forgejo sends without a secret", unsigned));
    refused.push(("missing header", without(ok(&new_delivery()), &all)));
    refused.push((
        "non-hex",
        with(
            without(ok(&new_delivery()), &all),
            "X-Forgejo-Signature",
            &"zz".repeat(32),
        ),
    ));
    refused.push((
        "short hex",
        with(
            without(ok(&new_delivery()), &all),
            "X-Forgejo-Signature",
            &sig[..62],
        ),
    ));
    let mut tampered = ok(&new_delivery());
    let at = tampered
        .body
        .iter()
        .position(|b| *b == b'7')
        .expect("a 7 in the body");
    tampered.body[at] = b'8';
    refused.push(("body changed by one byte", tampered));
    for (what, r) in &refused {
        assert_eq!(
            status_of(&client, &s, r).await,
            StatusCode::UNAUTHORIZED,
            "{what}"
        );
    }

    // Form content type: the signature covers the URL-decoded payload field, and the
    // stream keeps the bare JSON.
    let form_id = new_delivery();
    let form = ForgejoRequest::new(
        SMALL,
        "pull_request",
        &form_id,
        TEST_SECRET.as_bytes(),
        ContentType::Form,
    );
    assert_eq!(
        status_of(&client, &s, &form).await,
        StatusCode::ACCEPTED,
        "form"
    );

    let mut conn = redis.conn().await;
    let entries = stream_entries(&mut conn, &events(&s)).await;
    assert_eq!(entries.len(), 5, "only the accepted deliveries are queued");
    let stored = &entries.last().expect("the form delivery").1;
    assert_eq!(stored[fields::DELIVERY], form_id);
    assert_eq!(stored[fields::BODY].as_bytes(), SMALL);

    let metrics = client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let failures = metrics
        .lines()
        .find(|l| l.starts_with("shepherd_signature_failures_total"))
        .expect("signature failures metric");
    assert!(
        failures.ends_with(&format!(" {}", refused.len())),
        "{failures}"
    );
}

#[tokio::test]
async fn status_matrix() {
    let mut redis = RedisServer::start();
    let s = Shepherd::builder(&redis)
        .env("SHEPHERD_MAX_BODY_BYTES", "4096")
        .start()
        .await;
    let client = reqwest::Client::new();
    let mut conn = redis.conn().await;

    // 202, then 200 for the same delivery id, one entry.
    let id = new_delivery();
    let first = post(
        &client,
        &s.webhook_url(),
        &signed(SMALL, "pull_request", &id),
    )
    .await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["delivery"], id.as_str());
    let stream_id = first["id"].as_str().expect("stream id").to_owned();
    let again = post(
        &client,
        &s.webhook_url(),
        &signed(SMALL, "pull_request", &id),
    )
    .await;
    assert_eq!(again.status(), StatusCode::OK);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["id"], stream_id.as_str());
    assert_eq!(xlen(&mut conn, &events(&s)).await, 1);

    // 400s name the missing header; not-JSON is refused after the signature check.
    let no_type = without(
        signed(SMALL, "pull_request", &new_delivery()),
        &[
            "X-Forgejo-Event-Type",
            "X-Gitea-Event-Type",
            "X-Gogs-Event-Type",
            "X-GitHub-Event-Type",
            "X-Forgejo-Event",
            "X-Gitea-Event",
            "X-Gogs-Event",
            "X-GitHub-Event",
        ],
    );
    let r = post(&client, &s.webhook_url(), &no_type).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("X-Forgejo-Event-Type"));
    let no_id = without(
        signed(SMALL, "pull_request", "x"),
        &[
            "X-Forgejo-Delivery",
            "X-Gitea-Delivery",
            "X-Gogs-Delivery",
            "X-GitHub-Delivery",
        ],
    );
    let r = post(&client, &s.webhook_url(), &no_id).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("X-Forgejo-Delivery"));
    let garbage = b"this is not { json".as_slice();
    let r = post(
        &client,
        &s.webhook_url(),
        &signed(garbage, "push", &new_delivery()),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("not a JSON object"));
    let unsigned_garbage = without(
        signed(garbage, "push", &new_delivery()),
        &[
            "X-Forgejo-Signature",
            "X-Gitea-Signature",
            "X-Hub-Signature-256",
        ],
    );
    assert_eq!(
        status_of(&client, &s, &unsigned_garbage).await,
        StatusCode::UNAUTHORIZED
    );

    // 413 above the configured limit.
    let big = format!(r#"{{"pad": "{}"}}"#, "x".repeat(5000));
    let r = signed(big.as_bytes(), "push", &new_delivery());
    assert_eq!(
        status_of(&client, &s, &r).await,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert_eq!(
        xlen(&mut conn, &events(&s)).await,
        1,
        "nothing else was queued"
    );

    // Redis busy for longer than the timeout: 503 with Retry-After.
    let mut blocker = redis.conn().await;
    let sleep = tokio::spawn(async move {
        let _: Result<(), _> = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("2")
            .query_async(&mut blocker)
            .await;
    });
    poll_until_named(Duration::from_secs(5), "a slow redis gives 503", || {
        let r = signed(SMALL, "pull_request", &new_delivery());
        let (client, url) = (client.clone(), s.webhook_url());
        async move {
            let resp = post(&client, &url, &r).await;
            resp.status() == StatusCode::SERVICE_UNAVAILABLE
                && resp.headers().contains_key("retry-after")
        }
    })
    .await;
    sleep.await.unwrap();

    // Redis gone: 503 with Retry-After, and /readyz says so.
    redis.stop();
    let r = post(
        &client,
        &s.webhook_url(),
        &signed(SMALL, "pull_request", &new_delivery()),
    )
    .await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    let ready = client.get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);

    // Redis back (empty: no persistence): deliveries are accepted again.
    redis.restart();
    let back = new_delivery();
    poll_until_named(
        Duration::from_secs(20),
        "deliveries are accepted after redis restarts",
        || {
            let r = signed(SMALL, "pull_request", &back);
            let (client, url) = (client.clone(), s.webhook_url());
            async move { post(&client, &url, &r).await.status() == StatusCode::ACCEPTED }
        },
    )
    .await;
    let mut conn = redis.conn().await;
    let entries = stream_entries(&mut conn, &events(&s)).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].1[fields::DELIVERY], back);
    let ready = client.get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
}

#[tokio::test]
async fn concurrent_deliveries_with_duplicates() {
    let redis = RedisServer::start();
    let s = Shepherd::serve(&redis).await;
    let client = reqwest::Client::new();
    let ids: Vec<String> = (0..150).map(|_| new_delivery()).collect();
    // 150 distinct deliveries plus 50 repeats of some of them, all at once.
    let sends = ids.iter().chain(ids.iter().step_by(3)).map(|id| {
        let r = signed(SMALL, "pull_request", id);
        let (client, url) = (client.clone(), s.webhook_url());
        tokio::spawn(async move { post(&client, &url, &r).await.status() })
    });
    let sends: Vec<_> = sends.collect();
    assert_eq!(sends.len(), 200);
    let mut statuses: HashMap<StatusCode, usize> = HashMap::new();
    for handle in sends {
        *statuses.entry(handle.await.unwrap()).or_default() += 1;
    }
    assert_eq!(
        statuses.get(&StatusCode::ACCEPTED),
        Some(&150),
        "{statuses:?}"
    );
    assert_eq!(statuses.get(&StatusCode::OK), Some(&50), "{statuses:?}");
    let mut conn = redis.conn().await;
    let entries = stream_entries(&mut conn, &events(&s)).await;
    assert_eq!(entries.len(), 150);
    let distinct: std::collections::HashSet<&str> = entries
        .iter()
        .map(|(_, f)| f[fields::DELIVERY].as_str())
        .collect();
    assert_eq!(distinct.len(), 150);
    let repos: Vec<String> = redis::cmd("SMEMBERS")
        .arg(s.keys().repos())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(repos, vec!["forgejo-bot-test/widgets".to_owned()]);
}

#[tokio::test]
async fn health_ready_and_metrics() {
    let redis = RedisServer::start();
    let s = Shepherd::serve(&redis).await;
    let client = reqwest::Client::new();
    for path in ["/healthz", "/readyz"] {
        let r = client.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
    }
    let r = post(
        &client,
        &s.webhook_url(),
        &signed(SMALL, "pull_request", &new_delivery()),
    )
    .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let text = client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#"shepherd_deliveries_total{event="pull_request",outcome="queued"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("shepherd_ingest_latency_seconds_bucket"),
        "{text}"
    );
}

#[tokio::test]
async fn acknowledged_deliveries_survive_a_redis_crash() {
    let mut redis = RedisServer::start_with(Aof::Always);
    let s = Shepherd::builder(&redis).args(["serve"]).start().await;
    assert!(
        events(&s).contains(s.prefix()),
        "keys carry the instance's prefix"
    );
    let client = reqwest::Client::new();
    let ids: Vec<String> = (0..20).map(|_| new_delivery()).collect();
    for id in &ids {
        let r = post(
            &client,
            &s.webhook_url(),
            &signed(SMALL, "pull_request", id),
        )
        .await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    // SIGKILL right after the last 202: with appendfsync always, nothing acknowledged
    // may be missing after the restart, and the dedup markers came back with it.
    redis.stop();
    redis.restart();
    let mut conn = redis.conn().await;
    let entries = stream_entries(&mut conn, &events(&s)).await;
    let stored: Vec<&str> = entries
        .iter()
        .map(|(_, f)| f[fields::DELIVERY].as_str())
        .collect();
    assert_eq!(stored, ids.iter().map(String::as_str).collect::<Vec<_>>());
    let repeat = signed(SMALL, "pull_request", &ids[0]);
    poll_until(Duration::from_secs(20), || {
        let (client, url, r) = (client.clone(), s.webhook_url(), repeat.clone());
        async move { post(&client, &url, &r).await.status() == StatusCode::OK }
    })
    .await;
    assert_eq!(xlen(&mut conn, &events(&s)).await, 20);
}

/// Every payload in `webhooks/` with the event type it is delivered as. The test below
/// fails when a file in `webhooks/` is missing here (or listed here but absent).
const FIXTURES: &[(&str, &str)] = &[
    ("pull_request_opened.json", "pull_request"),
    ("pull_request_closed_merged.json", "pull_request"),
    ("pull_request_closed.json", "pull_request"),
    ("pull_request_reopened.json", "pull_request"),
    ("pull_request_edited.json", "pull_request"),
    ("pull_request_sync.json", "pull_request_sync"),
    ("pull_request_label.json", "pull_request_label"),
    (
        "pull_request_review_approved.json",
        "pull_request_review_approved",
    ),
    (
        "pull_request_review_rejected.json",
        "pull_request_review_rejected",
    ),
    (
        "pull_request_review_comment.json",
        "pull_request_review_comment",
    ),
    ("pull_request_comment.json", "pull_request_comment"),
    ("issues_opened.json", "issues"),
    ("issues_closed.json", "issues"),
    ("issue_label.json", "issue_label"),
    ("issue_comment.json", "issue_comment"),
    ("action_run_success.json", "action_run_success"),
    ("action_run_failure.json", "action_run_failure"),
    ("action_run_recover.json", "action_run_recover"),
    ("status_success.json", "status"),
    ("status_failure.json", "status"),
    ("status_pending.json", "status"),
    ("push.json", "push"),
];

/// The `webhooks/` directory of the repository.
fn webhooks_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("webhooks")
}

#[test]
fn every_fixture_is_referenced() {
    let on_disk: std::collections::BTreeSet<String> = std::fs::read_dir(webhooks_dir())
        .expect("list webhooks/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json"))
        .collect();
    let listed: std::collections::BTreeSet<String> =
        FIXTURES.iter().map(|(f, _)| (*f).to_owned()).collect();
    assert_eq!(on_disk, listed, "webhooks/*.json and FIXTURES differ");
    let readme = std::fs::read_to_string(webhooks_dir().join("README.md")).expect("README");
    for file in &on_disk {
        assert!(
            readme.contains(&format!("`{file}`")),
            "webhooks/README.md misses {file}"
        );
    }
}

#[tokio::test]
async fn every_fixture_is_queued() {
    let redis = RedisServer::start();
    let s = Shepherd::serve(&redis).await;
    let client = reqwest::Client::new();
    let mut sent = Vec::new();
    for (file, event_type) in FIXTURES {
        let body = std::fs::read(webhooks_dir().join(file)).expect("read fixture");
        let payload: Value = serde_json::from_slice(&body).expect("fixture is JSON");
        let repo = payload["repository"]["full_name"]
            .as_str()
            .or_else(|| payload["run"]["repository"]["full_name"].as_str())
            .expect("fixture names its repository")
            .to_owned();
        assert_eq!(repo, "forgejo-bot-test/widgets", "{file}");
        let delivery = new_delivery();
        let mut request = signed(&body, event_type, &delivery);
        if *event_type == "status" {
            // Gitea sends this event, without any X-Forgejo-* header.
            request = without(
                request,
                &[
                    "X-Forgejo-Delivery",
                    "X-Forgejo-Event",
                    "X-Forgejo-Event-Type",
                    "X-Forgejo-Signature",
                ],
            );
        }
        let r = post(&client, &s.webhook_url(), &request).await;
        assert_eq!(r.status(), StatusCode::ACCEPTED, "{file}");
        sent.push((file, event_type, delivery, repo, body));
    }
    let mut conn = redis.conn().await;
    let entries = stream_entries(&mut conn, &events(&s)).await;
    assert_eq!(entries.len(), FIXTURES.len());
    for ((file, event_type, delivery, repo, body), (_, entry)) in sent.iter().zip(&entries) {
        assert_eq!(entry[fields::KIND], fields::KIND_WEBHOOK, "{file}");
        assert_eq!(entry[fields::EVENT], **event_type, "{file}");
        assert_eq!(entry[fields::DELIVERY], *delivery, "{file}");
        assert_eq!(entry[fields::REPO], *repo, "{file}");
        assert_eq!(entry[fields::BODY].as_bytes(), &body[..], "{file}");
        assert!(
            entry[fields::RECEIVED]
                .parse::<i64>()
                .is_ok_and(|ms| ms > 0),
            "{file}"
        );
    }
}

#[tokio::test]
async fn ignored_and_unknown_event_types_are_archived() {
    let redis = RedisServer::start();
    let s = Shepherd::serve(&redis).await;
    let client = reqwest::Client::new();
    // `package` has an empty X-Forgejo-Event (forgejo-facts.md §2); the last one is no
    // Forgejo event at all. All are accepted, archived, and left to the workers.
    let types = ["release", "package", "wiki", "fork", "some_future_event"];
    for event_type in types {
        let r = post(
            &client,
            &s.webhook_url(),
            &signed(SMALL, event_type, &new_delivery()),
        )
        .await;
        assert_eq!(r.status(), StatusCode::ACCEPTED, "{event_type}");
    }
    let mut conn = redis.conn().await;
    let stored: Vec<String> = stream_entries(&mut conn, &events(&s))
        .await
        .into_iter()
        .map(|(_, f)| f[fields::EVENT].clone())
        .collect();
    assert_eq!(stored, types);
    let text = client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#"shepherd_deliveries_total{event="other",outcome="queued"} 1"#),
        "{text}"
    );
}

/// A client that opens a new TCP connection per request: actix hands connections to
/// its worker threads in turn, so successive requests reach every thread.
fn fresh() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// After an outage, every server thread answers its first `/readyz` with 200 once Redis
/// is back: like the webhook path, the probe must not report the stale error of its
/// thread's connection (seen as a 503 from `status_matrix` under a CPU hog).
#[tokio::test]
async fn every_server_thread_is_ready_at_its_first_probe_after_redis_returns() {
    let mut redis = RedisServer::start();
    let s = Shepherd::serve(&redis).await;
    let probe = |client: reqwest::Client| {
        let url = s.url("/readyz");
        async move { client.get(url).send().await.unwrap().status() }
    };
    for _ in 0..8 {
        assert_eq!(probe(fresh()).await, StatusCode::OK);
    }
    redis.stop();
    for _ in 0..8 {
        assert_eq!(probe(fresh()).await, StatusCode::SERVICE_UNAVAILABLE);
    }
    // Long enough for every background reconnection attempt to give up.
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.restart();
    let back = new_delivery();
    poll_until_named(Duration::from_secs(20), "a delivery is accepted", || {
        let r = signed(SMALL, "pull_request", &back);
        let (client, s) = (fresh(), &s);
        async move { status_of(&client, s, &r).await == StatusCode::ACCEPTED }
    })
    .await;
    for n in 0..8 {
        assert_eq!(
            probe(fresh()).await,
            StatusCode::OK,
            "probe {n} after the restart"
        );
    }
}

/// After an outage, the first delivery on every server thread is accepted: each actix
/// worker holds its own Redis connection, and the one that failed during the outage
/// must not answer its next delivery with the stale error (the drill saw one 503 on
/// the first delivery reaching the second thread after the restart).
#[tokio::test]
async fn every_server_thread_accepts_its_first_delivery_after_redis_returns() {
    let mut redis = RedisServer::start();
    let s = Shepherd::serve(&redis).await;
    for _ in 0..8 {
        let r = signed(SMALL, "pull_request", &new_delivery());
        assert_eq!(status_of(&fresh(), &s, &r).await, StatusCode::ACCEPTED);
    }
    redis.stop();
    for _ in 0..8 {
        let r = signed(SMALL, "pull_request", &new_delivery());
        assert_eq!(
            status_of(&fresh(), &s, &r).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    // Long enough for every background reconnection attempt to give up.
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.restart();
    let client = reqwest::Client::new();
    poll_until_named(Duration::from_secs(20), "redis answers /readyz", || {
        let (client, url) = (client.clone(), s.url("/readyz"));
        async move { client.get(url).send().await.unwrap().status() == StatusCode::OK }
    })
    .await;
    let ids: Vec<String> = (0..8).map(|_| new_delivery()).collect();
    for id in &ids {
        let r = signed(SMALL, "pull_request", id);
        assert_eq!(
            status_of(&fresh(), &s, &r).await,
            StatusCode::ACCEPTED,
            "first deliveries after the restart"
        );
    }
    let mut conn = redis.conn().await;
    assert_eq!(xlen(&mut conn, &events(&s)).await, 8);
}

/// The server's log so far.
fn log_text(log: &tempfile::NamedTempFile) -> String {
    std::fs::read_to_string(log.path()).unwrap_or_default()
}

/// A `shepherd` process (`args`, or `serve`) whose log goes to a temporary file, read
/// with [`log_text`].
async fn logged(redis: &RedisServer, args: &[&str]) -> (tempfile::NamedTempFile, Shepherd) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut builder = Shepherd::builder(redis).stderr_to(log.reopen().unwrap());
    if !args.is_empty() {
        builder = builder.args(args.iter().copied());
    }
    (log, builder.start().await)
}

/// The lines of a log that hold `text`.
fn lines_with<'a>(log: &'a str, text: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains(text)).collect()
}

/// The `delivery queued` lines of a log.
fn queued_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" INFO ") && l.contains("delivery queued"))
        .collect()
}

/// The `summarised=N` figures of a log's summary lines.
fn summarised_counts(log: &str) -> Vec<u64> {
    lines_with(log, "deliveries summarised")
        .into_iter()
        .map(|l| {
            let n = l.split(" summarised=").nth(1).expect("a summarised= field");
            n.split_whitespace()
                .next()
                .unwrap()
                .parse()
                .expect("a number")
        })
        .collect()
}

#[tokio::test]
async fn accepted_deliveries_are_logged_one_line_each_at_a_low_rate() {
    let redis = RedisServer::start();
    let (log, s) = logged(&redis, &[]).await;
    let client = reqwest::Client::new();
    let pr = new_delivery();
    let push = new_delivery();
    let comment = new_delivery();
    let push_body = br#"{"ref": "refs/heads/main", "repository": {"full_name": "acme/Web"}}"#;
    let comment_body = br#"{"action": "created", "issue": {"number": 12},
        "comment": {"body": "hi"}, "repository": {"full_name": "acme/web"}}"#;
    for (body, event, id) in [
        (SMALL as &[u8], "pull_request", &pr),
        (push_body, "push", &push),
        (comment_body, "issue_comment", &comment),
    ] {
        let r = post(&client, &s.webhook_url(), &signed(body, event, id)).await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    // A redelivery is answered 200 and says so; a bad signature gets no such line.
    let r = post(
        &client,
        &s.webhook_url(),
        &signed(SMALL, "pull_request", &pr),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let forged = with(
        signed(SMALL, "pull_request", &new_delivery()),
        "X-Forgejo-Signature",
        "00",
    );
    assert_eq!(
        status_of(&client, &s, &forged).await,
        StatusCode::UNAUTHORIZED
    );
    poll_until_named(Duration::from_secs(10), "three queued lines", || {
        let text = log_text(&log);
        async move { queued_lines(&text).len() >= 3 && text.contains("already queued") }
    })
    .await;
    let text = log_text(&log);
    let lines = queued_lines(&text);
    assert_eq!(lines.len(), 3, "{text}");
    let line_of = |id: &str| {
        *lines
            .iter()
            .find(|l| l.contains(&format!("delivery={id}")))
            .unwrap_or_else(|| panic!("no line for {id}:\n{text}"))
    };
    let l = line_of(&pr);
    for part in [
        "event=pull_request",
        "repo=forgejo-bot-test/widgets",
        "number=7",
    ] {
        assert!(l.contains(part), "{part} in {l}");
    }
    let l = line_of(&push);
    assert!(
        l.contains("event=push") && l.contains("repo=acme/web"),
        "{l}"
    );
    assert!(!l.contains("number="), "a push has no number: {l}");
    let l = line_of(&comment);
    assert!(
        l.contains("event=issue_comment") && l.contains("number=12"),
        "{l}"
    );
    let again = lines_with(&text, "already queued");
    assert_eq!(again.len(), 1, "{text}");
    assert!(again[0].contains(&format!("delivery={pr}")), "{text}");
    assert!(!text.contains("deliveries summarised"), "{text}");
}

#[tokio::test]
async fn a_burst_above_fifty_a_second_is_summarised_not_logged_line_by_line() {
    const BURST: usize = 400;
    let redis = RedisServer::start();
    let (log, s) = logged(&redis, &[]).await;
    let client = reqwest::Client::new();
    let sends: Vec<_> = (0..BURST)
        .map(|_| {
            let r = signed(SMALL, "pull_request", &new_delivery());
            let (client, url) = (client.clone(), s.webhook_url());
            tokio::spawn(async move { post(&client, &url, &r).await.status() })
        })
        .collect();
    for send in sends {
        assert_eq!(send.await.unwrap(), StatusCode::ACCEPTED);
    }
    // Every delivery shows exactly once: on a line of its own or in a summary.
    poll_until_named(Duration::from_secs(15), "every delivery logged", || {
        let text = log_text(&log);
        async move {
            let summarised: u64 = summarised_counts(&text).iter().sum();
            queued_lines(&text).len() as u64 + summarised == BURST as u64
        }
    })
    .await;
    let text = log_text(&log);
    let singles = queued_lines(&text).len();
    let summaries = lines_with(&text, "deliveries summarised");
    eprintln!(
        "{singles} single lines; summaries:\n{}",
        summaries.join("\n")
    );
    assert!(!summaries.is_empty(), "a summary line:\n{text}");
    for line in &summaries {
        assert!(line.contains(" INFO "), "{line}");
        let per_event = line.split("per_event=").nth(1).expect("per_event");
        let counted: u64 = per_event
            .split_whitespace()
            .next()
            .unwrap()
            .split(',')
            .map(|pair| {
                let (event, n) = pair.split_once('=').expect("event=n");
                assert_eq!(event, "pull_request", "{line}");
                n.parse::<u64>().unwrap()
            })
            .sum();
        let summarised = line.split(" summarised=").nth(1).unwrap();
        assert!(summarised.starts_with(&format!("{counted} ")), "{line}");
    }
    // Lines of their own only for the start of the burst (at most the first 50 of
    // its first two seconds); the rest is in the summaries.
    assert!(
        singles <= 2 * 50,
        "{singles} single lines for a burst of {BURST}"
    );
}

#[tokio::test]
async fn a_start_without_forgejo_says_what_is_off_at_info_without_an_error() {
    let redis = RedisServer::start();
    let (log, _worker) = logged(&redis, &["work"]).await;
    poll_until_named(Duration::from_secs(10), "the no-Forgejo line", || {
        let text = log_text(&log);
        async move { text.contains("no Forgejo API access") }
    })
    .await;
    let text = log_text(&log);
    let line = lines_with(&text, "no Forgejo API access")[0];
    assert!(line.contains(" INFO "), "{line}");
    for part in [
        "executor",
        "periodic resync",
        "are off",
        "unset=SHEPHERD_FORGEJO_URL, SHEPHERD_FORGEJO_TOKEN",
    ] {
        assert!(line.contains(part), "{part} in {line}");
    }
    assert!(!text.contains("error="), "{text}");
    assert!(!text.contains("WARN"), "{text}");
}
