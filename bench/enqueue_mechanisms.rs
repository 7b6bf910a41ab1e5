//! Redis cost of the atomic dedup+append, by mechanism, through one multiplexed
//! connection as the server uses it (run by `bench/ingest.sh`; see docs/benchmarks.md):
//!
//! - `lua`: Shepherd's `src/store/lua/enqueue.lua` by `EVALSHA` (what ingest does);
//! - `multi`: `MULTI; SET seen 1 NX PX; XADD …; EXEC`, atomic as well: the marker and
//!   the entry are written together or not at all; a duplicate must then `XDEL` the
//!   entry it just added;
//! - `set+xadd`: `SET NX` then `XADD`, two round trips, *not* atomic (what the peers
//!   do; a crash in between loses the delivery) — for reference only;
//! - `xadd`: the append alone — the floor.
//!
//! Usage: `enqueue_mechanisms REDIS_URL PAYLOAD_FILE [SECONDS=4] [REPS=3]`. Prints a
//! Markdown table: deliveries/s and Redis CPU per delivery (from `INFO cpu`), medians.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use shepherd::store::enqueue::ENQUEUE_LUA;

/// Concurrent requests in flight, as wrk's 32 connections produce.
const CONCURRENCY: usize = 32;
/// Retention as the server sends it (7 days in ms).
const RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;

#[derive(Clone, Copy, Debug)]
enum Mechanism {
    Lua,
    Multi,
    SetThenXadd,
    Xadd,
}

impl Mechanism {
    fn name(self) -> &'static str {
        match self {
            Self::Lua => "lua (EVALSHA enqueue.lua)",
            Self::Multi => "multi (MULTI SET NX PX + XADD EXEC)",
            Self::SetThenXadd => "set+xadd (2 round trips, not atomic)",
            Self::Xadd => "xadd alone",
        }
    }
}

/// One delivery with `mechanism`; `n` makes the delivery id unique.
async fn one(
    conn: &mut MultiplexedConnection,
    mechanism: Mechanism,
    sha: &str,
    body: &[u8],
    n: u64,
) -> redis::RedisResult<()> {
    let delivery = format!("00000000-0000-4000-8000-{n:012x}");
    let seen = format!("{{bench:0}}:seen:{delivery}");
    let stream = "{bench:0}:events";
    let now_ms = u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0);
    // No trimming at append time: enqueue.lua does none (the workers trim what every
    // group has acknowledged), so neither do the mechanisms it is compared with.
    let mut xadd = redis::cmd("XADD");
    xadd.arg(stream).arg("*");
    let received = now_ms.to_string();
    let fields: [(&str, &[u8]); 6] = [
        ("kind", b"webhook"),
        ("delivery", delivery.as_bytes()),
        ("event", b"pull_request"),
        ("repo", b"forgejo-bot-test/widgets"),
        ("received", received.as_bytes()),
        ("body", body),
    ];
    match mechanism {
        Mechanism::Lua => {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(sha).arg(2).arg(&seen).arg(stream).arg(RETENTION_MS);
            for (k, v) in fields {
                cmd.arg(k).arg(v);
            }
            let _: (i64, String) = cmd.query_async(conn).await?;
        }
        Mechanism::Multi => {
            for (k, v) in fields {
                xadd.arg(k).arg(v);
            }
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("SET")
                .arg(&seen)
                .arg(1)
                .arg("NX")
                .arg("PX")
                .arg(RETENTION_MS)
                .add_command(xadd);
            let (set, id): (Option<String>, String) = pipe.query_async(conn).await?;
            if set.is_none() {
                let _: i64 = redis::cmd("XDEL")
                    .arg(stream)
                    .arg(id)
                    .query_async(conn)
                    .await?;
            }
        }
        Mechanism::SetThenXadd => {
            let set: Option<String> = redis::cmd("SET")
                .arg(&seen)
                .arg(1)
                .arg("NX")
                .arg("PX")
                .arg(RETENTION_MS)
                .query_async(conn)
                .await?;
            if set.is_some() {
                for (k, v) in fields {
                    xadd.arg(k).arg(v);
                }
                let _: String = xadd.query_async(conn).await?;
            }
        }
        Mechanism::Xadd => {
            for (k, v) in fields {
                xadd.arg(k).arg(v);
            }
            let _: String = xadd.query_async(conn).await?;
        }
    }
    Ok(())
}

/// Redis's own CPU time so far (user + sys), in seconds.
async fn redis_cpu(conn: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO cpu");
    info.lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum()
}

/// Runs one mechanism for `secs`; returns (deliveries/s, Redis CPU µs per delivery).
async fn run(
    conn: &MultiplexedConnection,
    m: Mechanism,
    sha: &str,
    body: Arc<Vec<u8>>,
    secs: u64,
) -> (f64, f64) {
    let mut admin = conn.clone();
    let _: () = redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query_async(&mut admin)
        .await
        .expect("FLUSHALL");
    let counter = Arc::new(AtomicU64::new(0));
    let cpu0 = redis_cpu(&mut admin).await;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (mut c, counter, body, sha) =
                (conn.clone(), counter.clone(), body.clone(), sha.to_owned());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    one(&mut c, m, &sha, &body, n).await.expect("redis command");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu1 = redis_cpu(&mut admin).await;
    let n = counter.load(Ordering::Relaxed) as f64;
    (n / elapsed, (cpu1 - cpu0) / n * 1e6)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = args.get(1).map_or("redis://127.0.0.1:6390", String::as_str);
    let body = Arc::new(std::fs::read(args.get(2).expect("PAYLOAD_FILE")).expect("read payload"));
    let secs: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(4);
    let reps: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(3);
    // No response timeout: FLUSHALL of a few GB of stream takes a while on a busy box.
    let no_timeout = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let conn = redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection_with_config(&no_timeout)
        .await
        .expect("connect");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(ENQUEUE_LUA)
        .query_async(&mut conn.clone())
        .await
        .expect("SCRIPT LOAD");
    let all = [
        Mechanism::Lua,
        Mechanism::Multi,
        Mechanism::SetThenXadd,
        Mechanism::Xadd,
    ];
    let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); all.len()];
    // Interleave mechanisms inside each repetition so drift hits all alike.
    for _ in 0..reps {
        for (i, m) in all.iter().enumerate() {
            let (rate, cpu) = run(&conn, *m, &sha, body.clone(), secs).await;
            results[i].0.push(rate);
            results[i].1.push(cpu);
        }
    }
    let mut flush = conn.clone();
    let _: () = redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query_async(&mut flush)
        .await
        .expect("FLUSHALL");
    println!(
        "| mechanism ({} B body, {CONCURRENCY} in flight on one multiplexed connection, median of {reps} × {secs} s) | deliveries/s | Redis CPU µs per delivery |",
        body.len()
    );
    println!("|---|---:|---:|");
    for (m, (rates, cpus)) in all.iter().zip(results) {
        println!(
            "| {} | {:.0} | {:.1} |",
            m.name(),
            median(rates),
            median(cpus)
        );
    }
}
