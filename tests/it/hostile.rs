//! Hostile input through the real `shepherd serve` and a real redis-server: oversized
//! headers and bodies, deep JSON, invalid UTF-8, wrong content types, slow senders,
//! wrong methods and paths. Each gets its proper 4xx, the server stays up, and nothing
//! reaches the events stream. Raw TCP where reqwest would be too polite.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use shepherd::ingest::signature::sign_sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::read_status;
use crate::support::redis::{RedisServer, xlen};
use crate::support::shepherd::Shepherd;
use crate::support::webhook::{new_delivery, post, signed, with, without};
use crate::support::{TEST_SECRET, poll_until_named};

/// A small, valid pull_request payload.
const SMALL: &[u8] = br#"{"action":"opened","number":7,"repository":{"id":1,"full_name":"o/r"}}"#;

/// How long a refused request may take to be answered (Forgejo gives up after 5 s).
const ANSWER_WITHIN: Duration = Duration::from_millis(4500);

/// `host:port` of an instance.
fn addr(s: &Shepherd) -> String {
    s.url("").trim_start_matches("http://").to_owned()
}

/// Headers of a signed JSON delivery of `body`, as raw HTTP/1.1 lines (no blank line).
fn signed_head(body: &[u8], content_length: Option<usize>) -> String {
    let sig = sign_sha256(TEST_SECRET.as_bytes(), body);
    let mut head = format!(
        "POST /webhooks/forgejo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         X-Forgejo-Event-Type: pull_request\r\nX-Forgejo-Delivery: {}\r\n\
         X-Forgejo-Signature: {sig}\r\n",
        new_delivery()
    );
    if let Some(n) = content_length {
        head.push_str(&format!("Content-Length: {n}\r\n"));
    }
    head
}

/// Sends `request` whole on a fresh connection and returns the status code.
async fn raw(s: &Shepherd, request: &[u8]) -> u16 {
    let mut stream = TcpStream::connect(addr(s)).await.expect("connect");
    // The server may answer (and close) before everything is written.
    let _ = stream.write_all(request).await;
    read_status(&mut stream, ANSWER_WITHIN).await
}

/// Nothing was queued, and the server still answers.
async fn assert_nothing_queued(redis: &RedisServer, s: &Shepherd) {
    let mut conn = redis.conn().await;
    assert_eq!(
        xlen(&mut conn, &s.keys().events(0)).await,
        0,
        "events queued"
    );
    let health = reqwest::get(s.url("/healthz")).await.expect("healthz");
    assert_eq!(health.status(), StatusCode::OK);
}

#[tokio::test]
async fn bad_input_catalogue() {
    let redis = RedisServer::start();
    let s = Shepherd::serve(&redis).await;
    let client = reqwest::Client::new();
    let url = s.webhook_url();
    let ok = || signed(SMALL, "pull_request", &new_delivery());

    // 64 KiB of headers: refused by the HTTP layer before any handler runs.
    let big = "a".repeat(64 * 1024);
    let request = format!(
        "{}X-Junk: {big}\r\nContent-Length: 2\r\n\r\n{{}}",
        signed_head(b"{}", None)
    );
    let status = raw(&s, request.as_bytes()).await;
    assert_eq!(status, 431, "64 KiB header");
    // Past actix's own 128 KiB bound on a request head: refused or closed, never served.
    let huge = "a".repeat(200 * 1024);
    let request = format!(
        "{}X-Junk: {huge}\r\nContent-Length: 2\r\n\r\n{{}}",
        signed_head(b"{}", None)
    );
    let status = raw(&s, request.as_bytes()).await;
    assert!(status == 431 || status == 0, "200 KiB header: {status}");
    // Many small headers adding up to 64 KiB as well.
    let many: String = (0..2048)
        .map(|i| format!("X-H{i}: {}\r\n", "b".repeat(24)))
        .collect();
    let request = format!(
        "{}{many}Content-Length: 2\r\n\r\n{{}}",
        signed_head(b"{}", None)
    );
    let status = raw(&s, request.as_bytes()).await;
    assert!(status == 431 || status == 400, "many headers: {status}");

    // JSON nested 100,000 deep, validly signed: refused past the nesting limit → 400,
    // saying it was refused (not that it is not JSON).
    let deep = format!("{{\"a\":{}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let r = signed(deep.as_bytes(), "pull_request", &new_delivery());
    let answer = post(&client, &url, &r).await;
    assert_eq!(answer.status(), StatusCode::BAD_REQUEST, "deep JSON");
    let text = answer.text().await.unwrap();
    assert!(
        text.contains("payload refused: nested too deeply"),
        "{text}"
    );
    let deep_objects = format!("{}{}", "{\"a\":".repeat(100_000), "}".repeat(100_000));
    let r = signed(deep_objects.as_bytes(), "pull_request", &new_delivery());
    assert_eq!(
        post(&client, &url, &r).await.status(),
        StatusCode::BAD_REQUEST,
        "deep objects"
    );
    // The same unsigned: 401, whatever the body.
    let r = with(
        signed(deep.as_bytes(), "pull_request", &new_delivery()),
        "X-Forgejo-Signature",
        &"0".repeat(64),
    );
    assert_eq!(
        post(&client, &url, &r).await.status(),
        StatusCode::UNAUTHORIZED
    );

    // Invalid UTF-8, signed and unsigned; inside a string and as bare bytes.
    for body in [
        &b"{\"action\":\"\xff\xfe\",\"repository\":{\"full_name\":\"o/r\"}}"[..],
        b"\xc3\x28\xa0\xa1",
        b"\0\0\0",
    ] {
        let r = signed(body, "pull_request", &new_delivery());
        assert_eq!(
            post(&client, &url, &r).await.status(),
            StatusCode::BAD_REQUEST,
            "{body:?}"
        );
        let r = with(r, "X-Forgejo-Signature", "zz");
        assert_eq!(
            post(&client, &url, &r).await.status(),
            StatusCode::UNAUTHORIZED,
            "{body:?}"
        );
    }
    // Invalid UTF-8 in header values.
    let mut request = signed_head(SMALL, Some(SMALL.len()))
        .replace("X-Forgejo-Event-Type: pull_request\r\n", "")
        .into_bytes();
    request.extend_from_slice(b"X-Forgejo-Event-Type: \xff\xfe\r\n\r\n");
    request.extend_from_slice(SMALL);
    let status = raw(&s, &request).await;
    assert!(status == 400, "invalid UTF-8 header: {status}");

    // Wrong content types (the body is correctly signed): 415.
    for ct in [
        "text/plain",
        "multipart/form-data; boundary=x",
        "application/xml",
        "application/jsonx",
        "",
        "application/json\u{e9}",
    ] {
        let r = with(ok(), "Content-Type", ct);
        let got = post(&client, &url, &r).await.status();
        assert_eq!(got, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct}");
    }
    // Parameters and case do not matter for the two accepted types.
    let r = with(ok(), "Content-Type", "Application/JSON; charset=utf-8");
    assert_eq!(post(&client, &url, &r).await.status(), StatusCode::ACCEPTED);
    // A form content type over a JSON body: no `payload` field, nothing signed → 401.
    let r = with(ok(), "Content-Type", "application/x-www-form-urlencoded");
    assert_eq!(
        post(&client, &url, &r).await.status(),
        StatusCode::UNAUTHORIZED
    );
    // Empty bodies and bodies that are not one object.
    for body in [
        &b""[..],
        b"[]",
        b"\"x\"",
        b"null",
        b"{} {}",
        b"{\"repository\":1}",
    ] {
        let r = signed(body, "pull_request", &new_delivery());
        assert_eq!(
            post(&client, &url, &r).await.status(),
            StatusCode::BAD_REQUEST,
            "{body:?}"
        );
    }
    // Headers that cannot be a delivery id or event type.
    let r = with(ok(), "X-Forgejo-Delivery", &"d".repeat(4096));
    let r = without(
        r,
        &["X-Gitea-Delivery", "X-Gogs-Delivery", "X-GitHub-Delivery"],
    );
    assert_eq!(
        post(&client, &url, &r).await.status(),
        StatusCode::BAD_REQUEST
    );
    let r = without(
        ok(),
        &[
            "X-Forgejo-Event-Type",
            "X-Gitea-Event-Type",
            "X-Forgejo-Event",
            "X-Gitea-Event",
        ],
    );
    assert_eq!(
        post(&client, &url, &r).await.status(),
        StatusCode::BAD_REQUEST
    );
    // A malformed Content-Length.
    let request = format!(
        "{}Content-Length: 12abc\r\n\r\n{{}}",
        signed_head(b"{}", None)
    );
    assert_eq!(raw(&s, request.as_bytes()).await, 400, "bad Content-Length");

    // Methods other than POST on the webhook paths: 405.
    for path in ["/webhooks/forgejo", "/webhooks/gitea"] {
        for method in ["GET", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"] {
            let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
            let r = client
                .request(m, s.url(path))
                .body(SMALL)
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status(),
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path}"
            );
        }
    }
    // Paths that do not exist: 404, signed or not.
    for path in [
        "/",
        "/webhooks",
        "/webhooks/github",
        "/webhooks/forgejo/x",
        "/../etc/passwd",
        "/%00",
        "/webhooks/forgejo%2f",
    ] {
        let mut b = client.post(s.url(path));
        for (k, v) in &ok().headers {
            b = b.header(k, v);
        }
        let r = b.body(SMALL).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
    }
    // Only the one good delivery above was queued, and the server is still up.
    let mut conn = redis.conn().await;
    assert_eq!(
        xlen(&mut conn, &s.keys().events(0)).await,
        1,
        "events queued"
    );
    let health = reqwest::get(s.url("/healthz")).await.expect("healthz");
    assert_eq!(health.status(), StatusCode::OK);
}

/// Writes `total` bytes of body in 64 KiB chunks until done or the peer hangs up;
/// returns the bytes written through `written`.
fn drip_body(
    mut stream: tokio::net::tcp::OwnedWriteHalf,
    total: usize,
    written: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let chunk = vec![b' '; 64 * 1024];
        while written.load(Ordering::Relaxed) < total {
            let n = chunk.len().min(total - written.load(Ordering::Relaxed));
            if stream.write_all(&chunk[..n]).await.is_err() {
                return;
            }
            written.fetch_add(n, Ordering::Relaxed);
        }
    })
}

#[tokio::test]
async fn fifty_mib_bodies_are_refused_before_they_are_read() {
    let redis = RedisServer::start();
    let s = Shepherd::serve(&redis).await;
    const TOTAL: usize = 50 * 1024 * 1024;

    // Declared length: 413 at once, from the headers alone.
    let stream = TcpStream::connect(addr(&s)).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    wr.write_all(signed_head(b"", Some(TOTAL)).as_bytes())
        .await
        .unwrap();
    wr.write_all(b"\r\n").await.unwrap();
    let written = Arc::new(AtomicUsize::new(0));
    let writer = drip_body(wr, TOTAL, written.clone());
    let status = read_status_half(&mut rd).await;
    let sent = written.load(Ordering::Relaxed);
    assert_eq!(status, 413, "declared 50 MiB");
    assert!(sent < TOTAL, "answered only after the whole body was sent");
    writer.abort();

    // Chunked, no length: 413 once the limit (5 MiB) is passed, long before 50 MiB.
    let stream = TcpStream::connect(addr(&s)).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let head = signed_head(b"", None) + "Transfer-Encoding: chunked\r\n\r\n";
    wr.write_all(head.as_bytes()).await.unwrap();
    let written = Arc::new(AtomicUsize::new(0));
    let counter = written.clone();
    let writer = tokio::spawn(async move {
        let data = vec![b' '; 64 * 1024];
        let mut chunk = format!("{:x}\r\n", data.len()).into_bytes();
        chunk.extend_from_slice(&data);
        chunk.extend_from_slice(b"\r\n");
        while counter.load(Ordering::Relaxed) < TOTAL {
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
            counter.fetch_add(data.len(), Ordering::Relaxed);
        }
        let _ = wr.write_all(b"0\r\n\r\n").await;
    });
    let status = read_status_half(&mut rd).await;
    let sent = written.load(Ordering::Relaxed);
    assert_eq!(status, 413, "chunked 50 MiB");
    assert!(
        sent < TOTAL,
        "answered only after the whole chunked body was sent"
    );
    writer.abort();

    assert_nothing_queued(&redis, &s).await;
}

/// [`read_status`] on the read half of a split stream.
async fn read_status_half(rd: &mut tokio::net::tcp::OwnedReadHalf) -> u16 {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("an answer");
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn slow_senders_time_out_without_blocking_others() {
    let redis = RedisServer::start();
    let s = Shepherd::serve(&redis).await;
    let client = reqwest::Client::new();

    // Many slow-drip bodies at once: one byte every 200 ms of a 1 KiB body.
    let mut drips = Vec::new();
    for _ in 0..32 {
        let mut stream = TcpStream::connect(addr(&s)).await.unwrap();
        stream
            .write_all(signed_head(b"", Some(1024)).as_bytes())
            .await
            .unwrap();
        stream.write_all(b"\r\n{").await.unwrap();
        drips.push(tokio::spawn(async move {
            let start = Instant::now();
            let (mut rd, mut wr) = stream.into_split();
            let dripper = tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if wr.write_all(b" ").await.is_err() {
                        return;
                    }
                }
            });
            let status = read_status_half(&mut rd).await;
            dripper.abort();
            (status, start.elapsed())
        }));
    }
    // A slow head (headers never finished).
    let mut slow_head = TcpStream::connect(addr(&s)).await.unwrap();
    slow_head
        .write_all(b"POST /webhooks/forgejo HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let head_start = Instant::now();

    // Meanwhile good deliveries are answered at once.
    for _ in 0..5 {
        let start = Instant::now();
        let r = signed(SMALL, "pull_request", &new_delivery());
        assert_eq!(
            post(&client, &s.webhook_url(), &r).await.status(),
            StatusCode::ACCEPTED
        );
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "a good delivery waited {:?}",
            start.elapsed()
        );
    }
    for drip in drips {
        let (status, took) = drip.await.unwrap();
        assert_eq!(status, 408, "slow body");
        assert!(took < ANSWER_WITHIN, "slow body closed after {took:?}");
    }
    let status = read_status(&mut slow_head, ANSWER_WITHIN).await;
    assert!(status == 408 || status == 0, "slow head: {status}");
    assert!(head_start.elapsed() < ANSWER_WITHIN);

    let mut conn = redis.conn().await;
    // Only the five good deliveries were queued.
    poll_until_named(Duration::from_secs(5), "five entries", || {
        let key = s.keys().events(0);
        let mut conn = conn.clone();
        async move { xlen(&mut conn, &key).await == 5 }
    })
    .await;
    assert_eq!(xlen(&mut conn, &s.keys().events(0)).await, 5);
}
