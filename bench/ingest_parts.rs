//! CPU cost of each step Shepherd runs on a webhook body before it reaches Redis,
//! on the ~15 KB `pull_request` payload of `webhooks/pull_request_opened.json` (or the
//! file given as the first argument): `cargo run --release --example ingest_parts [FILE]`.
//!
//! Prints nanoseconds per call, the median of 7 rounds of 2,000 calls each (20 with
//! `BENCH_SMOKE=1`, what tests/it/bench_smoke.rs runs). A measurement aid for
//! docs/benchmarks.md, not a test: it asserts nothing about time.

use std::hint::black_box;
use std::time::Instant;

use shepherd::ingest::delivery::repository_of;
use shepherd::ingest::probe::probe;
use shepherd::ingest::signature::sign_sha256;

/// A named step, run once per call.
type Row<'a> = (&'static str, Box<dyn FnMut() + 'a>);

fn median_ns(mut f: impl FnMut()) -> f64 {
    let smoke = std::env::var("BENCH_SMOKE").is_ok_and(|v| v == "1");
    let calls: u32 = if smoke { 20 } else { 2_000 };
    let mut rounds: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..calls {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(calls)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[3]
}

fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/webhooks/pull_request_opened.json"
        )
        .to_owned()
    });
    let body = std::fs::read(&path)?;
    println!("{path}: {} bytes", body.len());
    let rows: [Row<'_>; 5] = [
        (
            "utf-8 check",
            Box::new(|| _ = black_box(std::str::from_utf8(black_box(&body)))),
        ),
        (
            "probe (structure, nesting, names)",
            Box::new(|| _ = black_box(probe(black_box(&body)))),
        ),
        (
            "serde_json IgnoredAny (for comparison)",
            Box::new(|| {
                _ = black_box(serde_json::from_slice::<serde::de::IgnoredAny>(black_box(
                    &body,
                )))
            }),
        ),
        (
            "repository_of (UTF-8 + probe)",
            Box::new(|| _ = black_box(repository_of(black_box(&body)))),
        ),
        (
            "HMAC-SHA256",
            Box::new(|| _ = black_box(sign_sha256(b"bench-secret", black_box(&body)))),
        ),
    ];
    for (name, mut f) in rows {
        let ns = median_ns(&mut f);
        println!(
            "{name:<40} {:>8.2} µs  {:>6.2} GB/s",
            ns / 1000.0,
            body.len() as f64 / ns
        );
    }
    Ok(())
}
