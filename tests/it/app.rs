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

/// Issue 26, finding 8: a Redis password in `SHEPHERD_REDIS_URL` is in no `--help`
/// output (clap would print the variable's current value beside it).
#[test]
fn redis_password_is_not_shown_by_help() {
    let secret = "pw-in-help-3f9e1c";
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["agents", "--help"],
        &["serve", "--help"],
        &["work", "--help"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(args)
            .env(
                "SHEPHERD_REDIS_URL",
                format!("redis://:{secret}@127.0.0.1:6379"),
            )
            .output()
            .expect("run shepherd");
        assert!(out.status.success(), "{args:?}");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("SHEPHERD_REDIS_URL"), "{args:?}: {text}");
        assert!(
            !text.contains(secret),
            "{args:?} shows the password:\n{text}"
        );
    }
}

/// The pid and NUL-separated command line of the redis-server listening on `port`
/// (its command line, or the title it sets itself: `redis-server 127.0.0.1:<port>`).
fn redis_server_on(port: u16) -> Option<(u32, String)> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let raw = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&raw).into_owned();
        let port = port.to_string();
        let ours = cmdline.contains("redis-server")
            && (cmdline.contains(&format!(":{port}"))
                || cmdline.contains(&format!("--port\0{port}\0")));
        ours.then_some((pid, cmdline))
    })
}

/// Issue 26, finding 8: the redis-server `shepherd run` starts gets its password on
/// its standard input, not in its argv (`/proc/<pid>/cmdline` is world-readable), and
/// inherits none of the runner's environment; it still requires the password. A
/// wrapper first on the `PATH` records the argv and environment it was started with
/// (redis-server rewrites its own title later), then execs the real server.
#[tokio::test(flavor = "multi_thread")]
async fn run_gives_its_redis_server_the_password_off_its_command_line() {
    use std::os::unix::fs::PermissionsExt as _;
    let secret = "pw-argv-7c2d9b \"quoted\"";
    let encoded = "pw-argv-7c2d9b%20%22quoted%22";
    let port = crate::support::redis::free_port();
    let url = format!("redis://:{encoded}@127.0.0.1:{port}");
    let data = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    let real = std::env::split_paths(&path)
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
        .expect("redis-server on the PATH");
    let seen = bin.path().join("seen");
    let wrapper = bin.path().join("redis-server");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > '{seen}.argv'\nenv > '{seen}.env'\nexec '{real}' \"$@\"\n",
            seen = seen.display(),
            real = real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut run = Shepherd::builder_url(&url)
        .args(["run"])
        .env("SHEPHERD_DATA_DIR", data.path().to_string_lossy())
        .env("PATH", format!("{}:{path}", bin.path().display()))
        .start()
        .await;
    let argv = std::fs::read_to_string(seen.with_extension("argv")).expect("the wrapper ran");
    assert!(argv.contains(&port.to_string()), "{argv}");
    let env = std::fs::read_to_string(seen.with_extension("env")).unwrap();
    let (pid, cmdline) = redis_server_on(port).expect("the redis-server shepherd run started");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ).into_owned();
    for (what, text) in [
        ("argv", &argv),
        ("environment", &env),
        ("cmdline", &cmdline),
        ("environ", &environ),
    ] {
        assert!(
            !text.contains("pw-argv-7c2d9b"),
            "{what} has the password: {text:?}"
        );
        assert!(
            !text.contains("SHEPHERD_"),
            "{what} has shepherd's settings: {text:?}"
        );
    }
    assert!(!argv.contains(secret) && !argv.contains(encoded));
    // It requires the password: refused without it, answered with it.
    let open = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let refused: redis::RedisResult<String> = match open.get_multiplexed_async_connection().await {
        Ok(mut c) => redis::cmd("PING").query_async(&mut c).await,
        Err(e) => Err(e),
    };
    assert!(refused.is_err(), "{refused:?}");
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut c).await.unwrap();
    assert_eq!(pong, "PONG");
    run.terminate();
    let status = run.wait_exit(std::time::Duration::from_secs(10)).await;
    assert!(status.success(), "{status}");
}
