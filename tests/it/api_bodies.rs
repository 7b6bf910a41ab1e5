//! Issue 12, finding 2, through the real `shepherd serve`: the results API and the
//! admin API check the bearer token from the headers before reading any body, read
//! at most their own small limit, within the webhook body timeout, and never
//! decompress. Raw TCP, so the test controls exactly what is sent and when.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::redis::RedisServer;
use crate::support::shepherd::Shepherd;

/// Bearer token of the results API in these tests.
const AGENT: &str = "api-bodies-agent-token";
/// Bearer token of the admin API in these tests.
const ADMIN: &str = "api-bodies-admin-token";
/// The two POST routes under test: a result and an admin operation, with their token.
const ROUTES: [(&str, &str); 2] = [
    ("/api/v1/work/o:r:pr:1:1/result", AGENT),
    ("/api/v1/admin/replay", ADMIN),
];
/// How long any of these answers may take: the 3 s body timeout plus slack.
const ANSWER_WITHIN: Duration = Duration::from_millis(4500);

async fn serve(redis: &RedisServer) -> Shepherd {
    Shepherd::builder(redis)
        .env("SHEPHERD_AGENT_TOKEN", AGENT)
        .env("SHEPHERD_ADMIN_TOKEN", ADMIN)
        .start()
        .await
}

/// Opens a connection and sends the head of a POST to `path` (with `extra` header
/// lines) and the first `body` bytes; returns the open stream.
async fn send_head(s: &Shepherd, path: &str, extra: &str, body: &[u8]) -> TcpStream {
    let addr = s.url("").trim_start_matches("http://").to_owned();
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head =
        format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}\r\n");
    stream.write_all(head.as_bytes()).await.expect("head");
    let _ = stream.write_all(body).await;
    stream
}

/// The status code of the answer on `stream`; panics when none comes in time.
async fn status(stream: &mut TcpStream) -> u16 {
    crate::support::read_status(stream, ANSWER_WITHIN).await
}

#[tokio::test]
async fn unauthenticated_api_bodies_are_refused_before_they_are_read() {
    let redis = RedisServer::start();
    let s = serve(&redis).await;
    for (path, _) in ROUTES {
        // A 4 MiB body announced (gzip or not) and never sent: the answer cannot
        // wait for it.
        for enc in ["", "Content-Encoding: gzip\r\n"] {
            let extra = format!("Content-Length: 4194304\r\n{enc}");
            let mut stream = send_head(&s, path, &extra, b"\x1f\x8b").await;
            assert_eq!(status(&mut stream).await, 401, "{path} {enc:?}");
        }
        let extra = "Content-Length: 10\r\nAuthorization: Bearer wrong\r\n";
        let mut stream = send_head(&s, path, extra, b"").await;
        let code = status(&mut stream).await;
        assert!(code == 401 || code == 403, "{path}: {code}");
    }
}

#[tokio::test]
async fn api_bodies_over_their_limit_get_413_and_compressed_ones_415() {
    let redis = RedisServer::start();
    let s = serve(&redis).await;
    // Above both APIs' 64 KiB limit, far below the 5 MiB webhook limit.
    let big = format!("{{\"summary\":\"{}\"}}", "x".repeat(100 * 1024));
    for (path, token) in ROUTES {
        let auth = format!("Authorization: Bearer {token}\r\n");
        let extra = format!("{auth}Content-Length: {}\r\n", big.len());
        let mut stream = send_head(&s, path, &extra, big.as_bytes()).await;
        assert_eq!(status(&mut stream).await, 413, "{path} declared");
        let extra = format!("{auth}Transfer-Encoding: chunked\r\n");
        let chunked = format!("{:x}\r\n{big}\r\n0\r\n\r\n", big.len());
        let mut stream = send_head(&s, path, &extra, chunked.as_bytes()).await;
        assert_eq!(status(&mut stream).await, 413, "{path} chunked");
        let extra = format!("{auth}Content-Encoding: gzip\r\nContent-Length: 2\r\n");
        let mut stream = send_head(&s, path, &extra, b"\x1f\x8b").await;
        assert_eq!(status(&mut stream).await, 415, "{path} gzip");
    }
}

#[tokio::test]
async fn slow_api_bodies_are_cut_within_the_body_timeout() {
    let redis = RedisServer::start();
    let s = serve(&redis).await;
    for (path, token) in ROUTES {
        let extra = format!("Authorization: Bearer {token}\r\nContent-Length: 1000\r\n");
        // Ten bytes of a thousand, then nothing: cut with 408 (`status` panics when
        // no answer comes within ANSWER_WITHIN).
        let mut stream = send_head(&s, path, &extra, b"{\"outcome\"").await;
        assert_eq!(status(&mut stream).await, 408, "{path}");
    }
}
