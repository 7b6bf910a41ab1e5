//! Security through the real binary: per-repository and per-organisation webhook
//! secrets (they replace the global ones), start-up failures naming a missing secret
//! variable, and no configured secret or token ever appearing in logs (trace level,
//! JSON), `/metrics` or any HTTP answer.

use std::io::Read;

use reqwest::StatusCode;
use shepherd::app::send::ContentType;
use shepherd::app::send::ForgejoRequest;

use crate::support::TEST_SECRET;
use crate::support::redis::{RedisServer, stream_entries, xlen};
use crate::support::shepherd::Shepherd;
use crate::support::webhook::{new_delivery, post};

/// Secret of the `acme` organisation (from the environment).
const ORG_SECRET: &str = "org-secret-7f3a9c";
/// Secret of `acme/web` (from the environment).
const WEB_SECRET: &str = "web-secret-51be02";
/// A second secret of `acme/web`, written inline in the policy file.
const WEB_INLINE: &str = "web-inline-c0ffee";

/// The policy file: `acme` by environment variable, `acme/web` by variable and inline.
fn policy_file() -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let text = format!(
        "[webhooks.\"acme\"]\nsecret_env = \"IT_ORG_SECRET\"\n\n\
         [webhooks.\"Acme/Web\"]\nsecret_env = [\"IT_WEB_SECRET\"]\nsecret = \"{WEB_INLINE}\"\n"
    );
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    f
}

/// A pull_request payload of `repo`.
fn pr_of(repo: &str) -> Vec<u8> {
    format!(r#"{{"action":"opened","number":1,"repository":{{"id":1,"full_name":"{repo}"}}}}"#)
        .into_bytes()
}

/// An Actions run payload of `repo` (the repository is inside `run`).
fn run_of(repo: &str) -> Vec<u8> {
    format!(r#"{{"action":"success","run":{{"id":3,"commit_sha":"0123456789abcdef0123456789abcdef01234567","repository":{{"id":1,"full_name":"{repo}"}}}}}}"#)
        .into_bytes()
}

async fn send(
    client: &reqwest::Client,
    s: &Shepherd,
    body: &[u8],
    event: &str,
    secret: &str,
) -> StatusCode {
    let r = ForgejoRequest::new(
        body,
        event,
        &new_delivery(),
        secret.as_bytes(),
        ContentType::Json,
    );
    post(client, &s.webhook_url(), &r).await.status()
}

/// `shepherd serve` with the policy file's organisation and repository secrets (the
/// file is kept alive by the second value).
async fn serve_with_scoped_secrets(redis: &RedisServer) -> (Shepherd, tempfile::NamedTempFile) {
    let policy = policy_file();
    let s = Shepherd::builder(redis)
        .env("SHEPHERD_CONFIG", policy.path().to_str().unwrap())
        .env("IT_ORG_SECRET", ORG_SECRET)
        .env("IT_WEB_SECRET", WEB_SECRET)
        .start()
        .await;
    (s, policy)
}

#[tokio::test]
async fn repository_and_organisation_secrets_replace_the_global_ones() {
    let redis = RedisServer::start();
    let (s, _policy) = serve_with_scoped_secrets(&redis).await;
    let c = reqwest::Client::new();
    let (ok, no) = (StatusCode::ACCEPTED, StatusCode::UNAUTHORIZED);
    let pr = "pull_request";
    // acme/web: its own secrets only (either of them), in any case of the name.
    assert_eq!(send(&c, &s, &pr_of("acme/web"), pr, WEB_SECRET).await, ok);
    assert_eq!(send(&c, &s, &pr_of("ACME/Web"), pr, WEB_INLINE).await, ok);
    assert_eq!(send(&c, &s, &pr_of("acme/web"), pr, ORG_SECRET).await, no);
    assert_eq!(send(&c, &s, &pr_of("acme/web"), pr, TEST_SECRET).await, no);
    // acme/api: the organisation's secret, not the global one nor another repo's.
    assert_eq!(send(&c, &s, &pr_of("acme/api"), pr, ORG_SECRET).await, ok);
    assert_eq!(send(&c, &s, &pr_of("acme/api"), pr, TEST_SECRET).await, no);
    assert_eq!(send(&c, &s, &pr_of("acme/api"), pr, WEB_SECRET).await, no);
    // Any other repository: the global secret only.
    assert_eq!(send(&c, &s, &pr_of("other/x"), pr, TEST_SECRET).await, ok);
    assert_eq!(send(&c, &s, &pr_of("other/x"), pr, WEB_SECRET).await, no);
    assert_eq!(send(&c, &s, &pr_of("other/x"), pr, ORG_SECRET).await, no);
    // Actions run events name their repository inside `run`.
    let run = "action_run_success";
    assert_eq!(send(&c, &s, &run_of("acme/web"), run, WEB_SECRET).await, ok);
    assert_eq!(
        send(&c, &s, &run_of("acme/web"), run, TEST_SECRET).await,
        no
    );
    // A payload naming two repositories cannot pick one's secret and be routed to the
    // other: refused (400 under the global secret, 401 under the repository's).
    let both = br#"{"action":"success","repository":{"full_name":"other/x"},"run":{"commit_sha":"0123456789abcdef0123456789abcdef01234567","repository":{"full_name":"acme/web"}}}"#;
    assert_eq!(
        send(&c, &s, both, run, TEST_SECRET).await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(send(&c, &s, both, run, WEB_SECRET).await, no);
    // Exactly the five accepted deliveries were queued.
    let mut conn = redis.conn().await;
    assert_eq!(xlen(&mut conn, &s.keys().events(0)).await, 5);
}

/// Issue 12, finding 1: the secret used to be picked by the raw `full_name` and the
/// event routed by the trimmed one, so `" acme/web"` signed with the global secret
/// landed in `acme/web`'s records. Now one canonical name decides both, and a name
/// Forgejo could never send is refused after the signature check (400 under the
/// secrets of its nearest canonical name, 401 under any other), leaving no stream
/// entry, dedup key or `repos` member behind.
#[tokio::test]
async fn a_non_canonical_repository_name_cannot_bypass_the_repository_secret() {
    let redis = RedisServer::start();
    let (s, _policy) = serve_with_scoped_secrets(&redis).await;
    let c = reqwest::Client::new();
    let pr = "pull_request";
    // JSON text of each name (escapes included), as it appears in the payload.
    let names = [
        " acme/web",
        "acme/web ",
        r"\tacme/web",
        r"acme/web\r\n",
        r"acme/web\u0000",
        "acme /web",
        "acme/*",
        "acme/{web}",
        "acme/web#1",
        "acme/web/x",
        "acme/..",
    ];
    // The secret each name is checked with: the scope of its nearest canonical name
    // (the allowed characters, lower-cased), like any delivery; 400 under it, 401
    // under every other secret, and never anything queued.
    let scope_of = |name: &str| match name {
        " acme/web" | "acme/web " | r"\tacme/web" | r"acme/web\r\n" | r"acme/web\u0000"
        | "acme /web" | "acme/{web}" => WEB_SECRET,
        _ => ORG_SECRET,
    };
    for name in names {
        for secret in [TEST_SECRET, ORG_SECRET, WEB_SECRET] {
            let status = send(&c, &s, &pr_of(name), pr, secret).await;
            let expected = match secret == scope_of(name) {
                true => StatusCode::BAD_REQUEST,
                false => StatusCode::UNAUTHORIZED,
            };
            assert_eq!(status, expected, "{name:?} signed with {secret}");
        }
        // Unsigned (wrong secret): still 401, the name is not even looked at.
        let status = send(&c, &s, &pr_of(name), pr, "not-a-secret").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{name:?}");
    }
    // Any case of the canonical name still works, and is stored lower-cased.
    let accepted = send(&c, &s, &pr_of("Acme/WEB"), pr, WEB_SECRET).await;
    assert_eq!(accepted, StatusCode::ACCEPTED);
    let mut conn = redis.conn().await;
    let entries = stream_entries(&mut conn, &s.keys().events(0)).await;
    let repos: Vec<&str> = entries.iter().map(|(_, f)| f["repo"].as_str()).collect();
    assert_eq!(repos, ["acme/web"]);
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg(s.keys().repos())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(members, ["acme/web"]);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{}:*:seen:*", s.prefix()))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        keys.len(),
        1,
        "one dedup key, for the accepted delivery: {keys:?}"
    );
}

#[tokio::test]
async fn a_missing_secret_variable_fails_the_start_by_name() {
    let redis = RedisServer::start();
    let policy = policy_file();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("serve")
        .env_clear()
        .env("SHEPHERD_LISTEN", "127.0.0.1:0")
        .env("SHEPHERD_REDIS_URL", redis.url())
        .env("SHEPHERD_WEBHOOK_SECRETS", TEST_SECRET)
        .env("SHEPHERD_CONFIG", policy.path())
        .env("IT_ORG_SECRET", ORG_SECRET)
        .output()
        .expect("run shepherd");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("IT_WEB_SECRET"), "{stderr}");
    assert!(!stderr.contains(ORG_SECRET), "{stderr}");
}

/// Every secret the leak test configures.
const SECRETS: [&str; 7] = [
    TEST_SECRET,
    ORG_SECRET,
    WEB_SECRET,
    WEB_INLINE,
    "admin-token-9d8e7f",
    "agent-token-a1b2c3",
    "forgejo-token-445566",
];

/// Panics when `text` (named `what`) contains any configured secret.
fn assert_clean(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(
            !text.contains(secret),
            "{what} contains the secret {secret:?}"
        );
    }
}

#[tokio::test]
async fn secrets_never_appear_in_logs_metrics_or_answers() {
    let redis = RedisServer::start();
    let policy = policy_file();
    let log = tempfile::NamedTempFile::new().unwrap();
    let s = Shepherd::builder(&redis)
        .env("SHEPHERD_CONFIG", policy.path().to_str().unwrap())
        .env("IT_ORG_SECRET", ORG_SECRET)
        .env("IT_WEB_SECRET", WEB_SECRET)
        .env("SHEPHERD_LOG", "trace")
        .env("SHEPHERD_LOG_FORMAT", "json")
        .env("SHEPHERD_ADMIN_TOKEN", SECRETS[4])
        .env("SHEPHERD_AGENT_TOKEN", SECRETS[5])
        .env("SHEPHERD_FORGEJO_TOKEN", SECRETS[6])
        .env("SHEPHERD_FORGEJO_URL", "http://127.0.0.1:9")
        .env("SHEPHERD_BOT_LOGIN", "shepherd-bot")
        .stderr_to(log.reopen().unwrap())
        .start()
        .await;
    let c = reqwest::Client::new();
    let mut answers = Vec::new();
    let record = |r: reqwest::Response| async move {
        let head = format!("{} {:?}", r.status(), r.headers());
        head + &r.text().await.unwrap_or_default()
    };
    // Deliveries: good, wrong secret, each scoped secret, malformed.
    for (body, secret) in [
        (pr_of("other/x"), TEST_SECRET),
        (pr_of("other/x"), WEB_SECRET),
        (pr_of("acme/web"), WEB_SECRET),
        (pr_of("acme/web"), TEST_SECRET),
        (pr_of("acme/api"), ORG_SECRET),
        (b"{not json".to_vec(), TEST_SECRET),
    ] {
        let r = ForgejoRequest::new(
            &body,
            "pull_request",
            &new_delivery(),
            secret.as_bytes(),
            ContentType::Json,
        );
        answers.push(record(post(&c, &s.webhook_url(), &r).await).await);
    }
    // A secret sent as if it were a signature or a delivery id.
    let r = c
        .post(s.webhook_url())
        .header("X-Forgejo-Signature", WEB_SECRET)
        .header("X-Forgejo-Delivery", ORG_SECRET)
        .header("X-Forgejo-Event-Type", "push")
        .body(pr_of("acme/web"))
        .send()
        .await
        .unwrap();
    answers.push(record(r).await);
    // The results API with the right token, a wrong one, and a token as the work id.
    for (path, token) in [
        ("/api/v1/work/w1/result", SECRETS[5]),
        ("/api/v1/work/w1/result", SECRETS[4]),
        ("/api/v1/work/w1/result", "wrong"),
    ] {
        let r = c
            .post(s.url(path))
            .bearer_auth(token)
            .json(&serde_json::json!({"outcome": "failed", "summary": "x"}))
            .send()
            .await
            .unwrap();
        answers.push(record(r).await);
    }
    // The admin API, the status page and the other endpoints, with the admin token,
    // with the agent token in its place, and the status page's token in the query.
    for token in [SECRETS[4], SECRETS[5]] {
        for path in [
            "/api/v1/admin/status",
            "/api/v1/admin/dlq",
            "/api/v1/admin/inspect/acme/web",
            "/api/v1/admin/inspect/acme/web/1",
            "/",
            "/metrics",
            "/healthz",
            "/readyz",
            "/nope",
        ] {
            let r = c.get(s.url(path)).bearer_auth(token).send().await.unwrap();
            answers.push(record(r).await);
        }
        let r = c
            .get(s.url(&format!("/?token={token}")))
            .send()
            .await
            .unwrap();
        answers.push(record(r).await);
        let r = c
            .post(s.url("/api/v1/admin/resync"))
            .bearer_auth(token)
            .json(&serde_json::json!({"repo": "acme/web"}))
            .send()
            .await
            .unwrap();
        answers.push(record(r).await);
    }
    let metrics = c
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_clean("/metrics", &metrics);
    for (i, a) in answers.iter().enumerate() {
        assert_clean(&format!("answer #{i}"), a);
    }
    drop(s);
    let mut logs = String::new();
    std::fs::File::open(log.path())
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();
    // The logs are trace-level JSON and really cover the requests.
    assert!(logs.lines().count() > 20, "too few log lines: {logs}");
    assert!(
        logs.lines()
            .all(|l| l.trim().is_empty() || serde_json::from_str::<serde_json::Value>(l).is_ok()),
        "non-JSON log lines"
    );
    assert!(logs.contains("delivery refused"), "refusals are logged");
    assert_clean("the logs", &logs);
}
