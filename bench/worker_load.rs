//! Writes Redis protocol (for `redis-cli --pipe`) that queues events-stream entries the
//! way ingest and the executor do, for `bench/worker.sh`:
//!
//! ```sh
//! worker_load warmup PREFIX PRS FIXTURE   # one pull_request_sync webhook per PR
//! worker_load status PREFIX PRS EVENTS    # CI observations (internal ObservedStatus)
//! ```
//!
//! Every entry goes to shard 0 (`{PREFIX:0}:events`), repository
//! `forgejo-bot-test/widgets`. A PR's head sha in the warm-up equals the sha its
//! observations are about.

use std::io::{BufWriter, Write};

use serde_json::{Value, json};

const REPO: &str = "forgejo-bot-test/widgets";

/// One command in RESP.
fn resp(out: &mut impl Write, args: &[&[u8]]) -> std::io::Result<()> {
    write!(out, "*{}\r\n", args.len())?;
    for a in args {
        write!(out, "${}\r\n", a.len())?;
        out.write_all(a)?;
        out.write_all(b"\r\n")?;
    }
    Ok(())
}

/// The head sha of PR `n` (40 hex digits).
fn sha(n: u64) -> String {
    format!("{:040x}", u128::from(n) << 32)
}

fn now_ms() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0)
}

/// `XADD stream * kind … delivery … event … repo … received … body …`.
fn entry(
    out: &mut impl Write,
    stream: &str,
    kind: &str,
    delivery: &str,
    event: &str,
    body: &Value,
) -> std::io::Result<()> {
    let (received, body) = (now_ms().to_string(), body.to_string());
    resp(
        out,
        &[
            b"XADD",
            stream.as_bytes(),
            b"*",
            b"kind",
            kind.as_bytes(),
            b"delivery",
            delivery.as_bytes(),
            b"event",
            event.as_bytes(),
            b"repo",
            REPO.as_bytes(),
            b"received",
            received.as_bytes(),
            b"body",
            body.as_bytes(),
        ],
    )
}

fn warmup(out: &mut impl Write, stream: &str, prs: u64, fixture: &str) -> anyhow::Result<()> {
    let mut base: Value = serde_json::from_slice(&std::fs::read(fixture)?)?;
    for n in 1..=prs {
        base["number"] = n.into();
        let pr = &mut base["pull_request"];
        pr["number"] = n.into();
        pr["id"] = (10_000 + n).into();
        pr["body"] = "bench PR".into();
        pr["head"]["sha"] = sha(n).into();
        entry(
            out,
            stream,
            "webhook",
            &format!("warm-{n}"),
            "pull_request_sync",
            &base,
        )?;
    }
    Ok(())
}

fn status(out: &mut impl Write, stream: &str, prs: u64, events: u64) -> anyhow::Result<()> {
    const STATES: [&str; 6] = [
        "pending", "success", "pending", "failure", "pending", "success",
    ];
    let t0 = now_ms();
    for i in 0..events {
        let (n, k) = (i % prs + 1, i / prs);
        let body = json!({
            "type": "observed-status",
            "repo": REPO,
            "number": n,
            "sha": sha(n),
            "contexts": [
                {"context": "ci / test (pull_request)", "state": STATES[(k % 6) as usize],
                 "description": format!("step {k}"),
                 "target_url": format!("https://ci.example/run/{k}"), "updated_ms": t0 + k},
                {"context": "ci / lint (pull_request)", "state": "success",
                 "description": "ok", "target_url": "https://ci.example/lint", "updated_ms": t0},
            ],
            "at_ms": t0 + k,
        });
        entry(
            out,
            stream,
            "internal",
            &format!("obs-{i}"),
            "observed/status",
            &body,
        )?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 5,
        "usage: worker_load warmup PREFIX PRS FIXTURE | status PREFIX PRS EVENTS"
    );
    let stream = format!("{{{}:0}}:events", args[2]);
    let prs: u64 = args[3].parse()?;
    anyhow::ensure!(prs > 0, "PRS must be at least 1");
    let mut out = BufWriter::new(std::io::stdout().lock());
    match args[1].as_str() {
        "warmup" => warmup(&mut out, &stream, prs, &args[4])?,
        "status" => status(&mut out, &stream, prs, args[4].parse()?)?,
        other => anyhow::bail!("unknown mode {other:?}: warmup or status"),
    }
    out.flush()?;
    Ok(())
}
