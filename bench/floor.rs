//! The floor of a webhook receiver on this machine: the least CPU any receiver must
//! spend per delivery, measured with the same load as Shepherd (bench/floor.sh).
//!
//! `cargo run --release --example floor -- MODE ADDR [REDIS_ADDR]`
//!
//! A hand-rolled HTTP/1.1 keep-alive server on Tokio (two worker threads, as
//! `shepherd serve` has on two cores) that does only the named work per request and no
//! more: no framework, no routing, no header map, no metrics, no timeouts, no error
//! answers. Each mode adds one step to the one before:
//!
//! - `answer`  read the request (headers and Content-Length body), answer 202;
//! - `hmac`    also verify `X-Forgejo-Signature` (HMAC-SHA256 of the body, the secret
//!   `bench-secret`), answering 401 on a mismatch;
//! - `xadd`    also `XADD {bench:0}:events * delivery <id> body <body>` on a Redis
//!   connection of its own per HTTP connection (raw RESP, one write per command);
//! - `evalsha` instead of the XADD, Shepherd's own `enqueue.lua` by EVALSHA with the
//!   arguments Shepherd sends (the same Redis work as `shepherd serve`);
//! - `full`    also Shepherd's own check of the body before the EVALSHA
//!   ([`repository_of`]: UTF-8, the validating JSON scan, the repository's name): all
//!   the work `shepherd serve` does per delivery, without its framework (actix-web,
//!   redis-rs, metrics, timeouts, logging).
//!
//! It is a measuring stick, not a server: it trusts its input (wrk's requests) and
//! exits on the first malformed one.

use std::io;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use shepherd::ingest::delivery::repository_of;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SECRET: &[u8] = b"bench-secret";
const SCRIPT: &str = include_str!("../src/store/lua/enqueue.lua");

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    Answer,
    Hmac,
    Xadd,
    Evalsha,
    Full,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (mode, addr) = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("answer"), Some(a)) => (Mode::Answer, a.clone()),
        (Some("hmac"), Some(a)) => (Mode::Hmac, a.clone()),
        (Some("xadd"), Some(a)) => (Mode::Xadd, a.clone()),
        (Some("evalsha"), Some(a)) => (Mode::Evalsha, a.clone()),
        (Some("full"), Some(a)) => (Mode::Full, a.clone()),
        _ => anyhow::bail!("usage: floor answer|hmac|xadd|evalsha|full ADDR [REDIS_ADDR]"),
    };
    let redis = args
        .get(3)
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:6390".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let sha = if mode >= Mode::Evalsha {
            let mut r = TcpStream::connect(&redis).await?;
            let reply = call(
                &mut r,
                &mut Vec::new(),
                &command(&[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()]),
            )
            .await?;
            reply
                .get(reply.len() - 42..reply.len() - 2)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| anyhow::anyhow!("SCRIPT LOAD answered {reply:?}"))?
        } else {
            Vec::new()
        };
        let listener = TcpListener::bind(&addr).await?;
        eprintln!("floor: listening on {addr}");
        loop {
            let (socket, _) = listener.accept().await?;
            socket.set_nodelay(true)?;
            let (redis, sha) = (redis.clone(), sha.clone());
            tokio::spawn(async move {
                if let Err(e) = connection(socket, mode, &redis, &sha).await
                    && e.kind() != io::ErrorKind::UnexpectedEof
                {
                    eprintln!("floor: {e}");
                }
            });
        }
    })
}

/// One HTTP connection: requests in order until the client closes.
async fn connection(mut socket: TcpStream, mode: Mode, redis: &str, sha: &[u8]) -> io::Result<()> {
    let mut r = if mode >= Mode::Xadd {
        Some(TcpStream::connect(redis).await?)
    } else {
        None
    };
    let (mut buf, mut rbuf) = (Vec::with_capacity(64 * 1024), Vec::with_capacity(256));
    loop {
        let head = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i + 4;
            }
            read_more(&mut socket, &mut buf).await?;
        };
        let len: usize = header(&buf[..head], b"content-length")
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
            .ok_or_else(|| bad("no Content-Length"))?;
        while buf.len() < head + len {
            read_more(&mut socket, &mut buf).await?;
        }
        let body = &buf[head..head + len];
        let mut answer: &[u8] = b"HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\n{}";
        if mode >= Mode::Hmac && !signed(&buf[..head], body) {
            answer = b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n";
        } else if let Some(r) = r.as_mut() {
            let delivery =
                header(&buf[..head], b"x-forgejo-delivery").ok_or_else(|| bad("no delivery"))?;
            let cmd = if mode == Mode::Xadd {
                command(&[
                    b"XADD",
                    b"{bench:0}:events",
                    b"*",
                    b"delivery",
                    delivery,
                    b"body",
                    body,
                ])
            } else {
                let repo = if mode == Mode::Full {
                    repository_of(body).map_err(|e| bad(&e.to_string()))?
                } else {
                    "forgejo-bot-test/widgets".to_owned()
                };
                let seen = [b"{bench:0}:seen:".as_slice(), delivery].concat();
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis();
                let received = now.to_string();
                command(&[
                    b"EVALSHA",
                    sha,
                    b"2",
                    &seen,
                    b"{bench:0}:events",
                    b"604800000",
                    b"kind",
                    b"webhook",
                    b"delivery",
                    delivery,
                    b"event",
                    b"pull_request",
                    b"repo",
                    repo.as_bytes(),
                    b"received",
                    received.as_bytes(),
                    b"body",
                    body,
                ])
            };
            call(r, &mut rbuf, &cmd).await?;
        }
        socket.write_all(answer).await?;
        buf.drain(..head + len);
    }
}

async fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<()> {
    if buf.capacity() - buf.len() < 16 * 1024 {
        buf.reserve(64 * 1024);
    }
    if s.read_buf(buf).await? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

fn signed(head: &[u8], body: &[u8]) -> bool {
    let Some(sig) = header(head, b"x-forgejo-signature") else {
        return false;
    };
    let Ok(expected) = hex::decode(sig) else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(SECRET) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&expected).is_ok()
}

/// The value of a header (name in lowercase), searched line by line.
fn header<'a>(head: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    head.split(|&b| b == b'\n').find_map(|line| {
        let colon = line.iter().position(|&b| b == b':')?;
        line[..colon]
            .eq_ignore_ascii_case(name)
            .then(|| line[colon + 1..].trim_ascii())
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// A RESP array of bulk strings, in one buffer (one write).
fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(args.iter().map(|a| a.len() + 16).sum::<usize>() + 16);
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Sends one command and reads its whole reply (exits the connection on an error reply).
async fn call(r: &mut TcpStream, buf: &mut Vec<u8>, cmd: &[u8]) -> io::Result<Vec<u8>> {
    r.write_all(cmd).await?;
    buf.clear();
    loop {
        if let Some(n) = complete(buf, 0) {
            if buf.first() == Some(&b'-') {
                return Err(bad(&String::from_utf8_lossy(buf)));
            }
            return Ok(buf[..n].to_vec());
        }
        if r.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// The length of the RESP reply starting at `at`, if it is all in `buf`.
fn complete(buf: &[u8], at: usize) -> Option<usize> {
    let end = at + find(buf.get(at..)?, b"\r\n")?;
    let n = || {
        std::str::from_utf8(&buf[at + 1..end])
            .ok()?
            .parse::<i64>()
            .ok()
    };
    match buf[at] {
        b'+' | b'-' | b':' => Some(end + 2 - at),
        b'$' => {
            let len = n()?;
            let total = end + 2 + usize::try_from(len).map_or(0, |l| l + 2);
            (buf.len() >= total).then_some(total - at)
        }
        b'*' => {
            let mut pos = end + 2;
            for _ in 0..n()?.max(0) {
                pos += complete(buf, pos)?;
            }
            Some(pos - at)
        }
        _ => None,
    }
}
