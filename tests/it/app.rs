//! The composition root (issue 13): `shepherd serve` and `shepherd run` mount the same
//! routes and answer them alike; `shepherd work` serves only its health and metrics.

use crate::support::QUIET_POLICY;
use crate::support::redis::RedisServer;
use crate::support::shepherd::{Builder, Shepherd};
use crate::support::webhook::{new_delivery, post, signed};
use crate::worker::pr_sync;

const ADMIN: &str = "app-admin-token";
const AGENT: &str = "app-agent-token";

/// One probe: what is asked, and the status every HTTP-serving process must give.
struct Probe {
    what: &'static str,
    method: reqwest::Method,
    path: &'static str,
    bearer: Option<&'static str>,
    body: &'static str,
    expected: u16,
}

fn probes() -> Vec<Probe> {
    use reqwest::Method;
    let p = |what, method, path, bearer, body, expected| Probe {
        what,
        method,
        path,
        bearer,
        body,
        expected,
    };
    vec![
        p("liveness", Method::GET, "/healthz", None, "", 200),
        p("readiness", Method::GET, "/readyz", None, "", 200),
        p("metrics", Method::GET, "/metrics", None, "", 200),
        p(
            "webhook GET",
            Method::GET,
            "/webhooks/forgejo",
            None,
            "",
            405,
        ),
        p(
            "gitea webhook GET",
            Method::GET,
            "/webhooks/gitea",
            None,
            "",
            405,
        ),
        p(
            "webhook unsigned",
            Method::POST,
            "/webhooks/forgejo",
            None,
            "{}",
            401,
        ),
        p(
            "result without token",
            Method::POST,
            "/api/v1/work/w1/result",
            None,
            "{}",
            401,
        ),
        p(
            "result for unknown work",
            Method::POST,
            "/api/v1/work/w1/result",
            Some(AGENT),
            r#"{"outcome":"succeeded"}"#,
            404,
        ),
        p(
            "admin without token",
            Method::GET,
            "/api/v1/admin/status",
            None,
            "",
            401,
        ),
        p(
            "admin status",
            Method::GET,
            "/api/v1/admin/status",
            Some(ADMIN),
            "",
            200,
        ),
        p(
            "admin dlq",
            Method::GET,
            "/api/v1/admin/dlq",
            Some(ADMIN),
            "",
            200,
        ),
        p("status page", Method::GET, "/", Some(ADMIN), "", 200),
        p("status page without token", Method::GET, "/", None, "", 401),
        p("nothing here", Method::GET, "/no-such-path", None, "", 404),
    ]
}

/// Each probe's status (and, for the signed webhook, 202) on `s`.
async fn answers(s: &Shepherd) -> Vec<(String, u16)> {
    let client = reqwest::Client::new();
    let mut out = Vec::new();
    for probe in probes() {
        let mut req = client
            .request(probe.method.clone(), s.url(probe.path))
            .header("content-type", "application/json")
            .body(probe.body);
        if let Some(token) = probe.bearer {
            req = req.bearer_auth(token);
        }
        let status = req.send().await.expect(probe.what).status().as_u16();
        out.push((probe.what.to_owned(), status));
    }
    let delivery = new_delivery();
    let answer = post(
        &client,
        &s.webhook_url(),
        &signed(&pr_sync(3, 1), "pull_request_sync", &delivery),
    )
    .await;
    out.push(("signed webhook".into(), answer.status().as_u16()));
    out
}

fn with_tokens(b: Builder) -> Builder {
    b.policy(QUIET_POLICY)
        .env("SHEPHERD_ADMIN_TOKEN", ADMIN)
        .env("SHEPHERD_AGENT_TOKEN", AGENT)
        .env("SHEPHERD_BOT_LOGIN", "agent-bot")
}

#[tokio::test]
async fn serve_and_run_mount_the_same_routes_and_work_only_health_and_metrics() {
    let redis = RedisServer::start();
    let mut expected: Vec<(String, u16)> = probes()
        .iter()
        .map(|p| (p.what.to_owned(), p.expected))
        .collect();
    expected.push(("signed webhook".into(), 202));

    let serve = with_tokens(Shepherd::builder(&redis)).start().await;
    assert_eq!(answers(&serve).await, expected, "shepherd serve");
    drop(serve);

    let run = with_tokens(Shepherd::builder(&redis).args(["run"]))
        .start()
        .await;
    assert_eq!(answers(&run).await, expected, "shepherd run");
    drop(run);

    // `work` serves its pod probes only: liveness and metrics, nothing else.
    let work = with_tokens(Shepherd::builder(&redis).args(["work"]))
        .start()
        .await;
    let client = reqwest::Client::new();
    for (path, status) in [
        ("/healthz", 200),
        ("/metrics", 200),
        ("/readyz", 404),
        ("/", 404),
        ("/api/v1/admin/status", 404),
    ] {
        let got = client
            .get(work.url(path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        assert_eq!(got, status, "shepherd work {path}");
    }
}

/// `shepherd send … | grep -q 202` must not fail when the reader stops early: the
/// delivery was made, and a closed stdout is not an error of it (seen as a panic in
/// `bench/ingest.sh`'s smoke test).
#[tokio::test]
async fn send_succeeds_when_its_reader_closes_the_pipe_early() {
    let redis = RedisServer::start();
    let serve = Shepherd::serve(&redis).await;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), pr_sync(4, 1)).unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["send"])
        .arg(file.path())
        .args(["--event-type", "pull_request_sync", "--url"])
        .arg(serve.webhook_url())
        .args(["--secret", crate::support::TEST_SECRET])
        .stdout(writer)
        .status()
        .unwrap();
    assert!(status.success(), "send with a closed stdout: {status}");
}
