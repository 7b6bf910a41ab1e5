//! Every `bench/` script in smoke mode (`BENCH_SMOKE=1`: every step it has, briefly),
//! so that a benchmark that no longer runs fails the suite. Each run uses the debug
//! `shepherd` binary cargo built for this test run (`BIN`) and, for the scripts that
//! run an ignored benchmark test, this test binary (`BENCH_IT_BIN`); the cargo examples
//! the scripts run are built by the script (`cargo build --example …`, nothing to do
//! after `cargo nextest run --all-targets`). Ports are free ones, the work folder a
//! temporary one, and no peers' harness is given (the scripts say they skip the peers).
//! Only the exit status and the summary lines are checked: the figures of a smoke run
//! mean nothing and stay out of the assertions.
//!
//! Tools the scripts need besides the shepherd binaries: bash, redis-server, redis-cli,
//! redis-benchmark, curl, openssl (ingest.sh), awk, and the usual procps/coreutils
//! (pgrep, getconf, nproc, lscpu, free); no python3, no wrk, no node.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;

/// A script gets this long before it is stopped (TERM, then KILL) and the test fails.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(240);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A base port such that every `base + offset` is free now.
fn free_base(offsets: &[u16]) -> u16 {
    for _ in 0..500 {
        let base: u16 = rand::rng().random_range(20_000..40_000);
        if offsets
            .iter()
            .all(|o| std::net::TcpListener::bind(("127.0.0.1", base + o)).is_ok())
        {
            return base;
        }
    }
    panic!("no free block of ports for {offsets:?}");
}

/// Runs `bench/<script>` in smoke mode with `env`; returns its combined output. Panics
/// (with the output) when it fails or outlives [`SCRIPT_DEADLINE`].
fn run_smoke(script: &str, env: &[(&str, String)]) -> String {
    let work = tempfile::tempdir().expect("a temp dir");
    let log = work.path().join("output.log");
    let out = std::fs::File::create(&log).expect("the output file");
    let it_bin = std::env::current_exe().expect("this test binary");
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("bench").join(script))
        .current_dir(root())
        .env("BENCH_SMOKE", "1")
        .env("BIN", env!("CARGO_BIN_EXE_shepherd"))
        .env("BENCH_IT_BIN", &it_bin)
        .env("WORK", work.path().join("work"))
        .env_remove("PEERS_SRC")
        .env_remove("EXAMPLES")
        .env_remove("BEFORE")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("a second handle"))
        .stderr(out);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("bash runs");
    let end = Instant::now() + SCRIPT_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the script") {
            break Some(status);
        }
        if Instant::now() >= end {
            // TERM first: the scripts stop what they started on exit.
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    match status {
        None => panic!("bench/{script} (smoke) ran past {SCRIPT_DEADLINE:?}:\n{output}"),
        Some(s) => assert!(
            s.success(),
            "bench/{script} (smoke) failed ({s}):\n{output}"
        ),
    }
    output
}

/// Asserts that `output` has every one of `lines` (substrings) and no panic.
fn assert_summary(script: &str, output: &str, lines: &[&str]) {
    for l in lines {
        assert!(
            output.contains(l),
            "bench/{script} (smoke): no {l:?} in its output:\n{output}"
        );
    }
    assert!(
        !output.contains("panicked"),
        "bench/{script} (smoke): a panic in its output:\n{output}"
    );
}

#[test]
fn bench_smoke_floor() {
    let base = free_base(&[0, 1]);
    let out = run_smoke(
        "floor.sh",
        &[
            ("PORT", base.to_string()),
            ("BENCH_REDIS_PORT", (base + 1).to_string()),
        ],
    );
    let mut want = vec![
        "peers: skipped (PEERS_SRC not set",
        "| receiver | conns | req/s (median) |",
        "results in ",
    ];
    let modes = ["answer", "hmac", "xadd", "evalsha", "full", "shepherd"];
    let rows: Vec<String> = modes.iter().map(|m| format!("| {m} | 4 |")).collect();
    want.extend(rows.iter().map(String::as_str));
    assert_summary("floor.sh", &out, &want);
    // the evalsha and full modes ran enqueue.lua: every request answered 202
    for m in ["evalsha", "full", "shepherd"] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(m) && l.contains("202s"))
            .unwrap_or_else(|| panic!("no run line for {m}:\n{out}"));
        let tail = line.split("202s ").nth(1).unwrap_or("");
        let mut nums = tail
            .split(" of ")
            .map(|s| s.split_whitespace().next().unwrap_or(""));
        let (ok, all) = (nums.next(), nums.next());
        assert!(
            ok.is_some() && ok == all && ok != Some("0"),
            "{m}: every request accepted: {line}"
        );
    }
}

#[test]
fn bench_smoke_ingest() {
    let base = free_base(&[0, 1]);
    let out = run_smoke(
        "ingest.sh",
        &[
            ("PORT", base.to_string()),
            ("BENCH_REDIS_PORT", (base + 1).to_string()),
        ],
    );
    assert_summary(
        "ingest.sh",
        &out,
        &[
            "peers: skipped (PEERS_SRC not set",
            "shepherd contract smoke test passed",
            "| Shepherd's enqueue.lua via EVALSHA",
            "| lua (EVALSHA enqueue.lua) |",
            "| multi (MULTI SET NX PX + XADD EXEC) |",
            "| receiver | conns | server CPU µs per accepted delivery (median) |",
            "stream ok  badsig ok",
            "(runs with failed checks: 0)",
        ],
    );
    // redis-benchmark prints a rate, not an error, for the EVALSHA line
    let evalsha = out
        .lines()
        .find(|l| l.starts_with("| Shepherd's enqueue.lua via EVALSHA"))
        .unwrap_or_default();
    let rate = evalsha.split('|').nth(2).unwrap_or("").trim();
    assert!(
        rate.parse::<u64>().is_ok_and(|r| r > 0),
        "the EVALSHA ceiling ran: {evalsha}"
    );
}

#[test]
fn bench_smoke_topology() {
    let base = free_base(&[0, 1, 2, 3, 80, 81, 82, 10_001, 10_002, 10_003]);
    let out = run_smoke("topology.sh", &[("BASE_PORT", base.to_string())]);
    assert_summary(
        "topology.sh",
        &out,
        &[
            "| topology | rep | deliveries |",
            "| single | 1 | 20 |",
            "| cluster | 1 | 20 |",
        ],
    );
}

#[test]
fn bench_smoke_worker() {
    let base = free_base(&[0, 11, 12]);
    let out = run_smoke("worker.sh", &[("BENCH_REDIS_PORT", base.to_string())]);
    assert_summary(
        "worker.sh",
        &out,
        &["| workers | events read |", "| 1 | ", "| 2 | "],
    );
}

#[test]
fn bench_smoke_agents() {
    let out = run_smoke("agents.sh", &[]);
    assert_summary(
        "agents.sh",
        &out,
        &[
            "machine: ",
            "BENCH overhead items=2 ",
            "BENCH usage_parser events_per_item=400 ",
            "BENCH usage_cpu events_per_sec=1000 secs=1 rounds=2 ",
            "BENCH ledger runs=20 ",
            "BENCH throughput runners=1 items=2 ",
            "BENCH throughput runners=2 items=2 ",
            "BENCH webhook_to_start webhooks=2 ",
            "load after: ",
        ],
    );
}

#[test]
fn bench_smoke_api_calls() {
    let out = run_smoke("api_calls.sh", &[]);
    assert_summary(
        "api_calls.sh",
        &out,
        &[
            "machine: ",
            "BENCH idle changed-only passes: 2 PRs, 2 passes",
            "BENCH idle every pass full: 2 PRs, 2 passes",
            "BENCH idle per PR-hour",
            "BENCH life now: ",
            "BENCH drill lost-approval-webhook: resync every 1 s",
            "load after: ",
        ],
    );
}

#[test]
fn bench_smoke_merge_lease() {
    let out = run_smoke("merge_lease.sh", &[]);
    assert_summary(
        "merge_lease.sh",
        &out,
        &[
            "-- run 1, this build",
            "merge lease drill (this build)",
            "BENCH_LEASE merged=",
            "load after: ",
        ],
    );
}

#[test]
fn bench_smoke_merge_queue() {
    let out = run_smoke("merge_queue.sh", &[]);
    assert_summary(
        "merge_queue.sh",
        &out,
        &[
            "-- run 1",
            "BENCH merge_queue k=1 p=0.1 f=0 n=3 ci_ms=200 ",
            "BENCH merge_queue k=2 p=0.1 f=0 n=3 ci_ms=200 ",
            "BENCH merge_queue ratio p=0.1 f=0 k=2 vs k=1: prs_per_hour x",
            "load after: ",
        ],
    );
}

/// The one bench example no script runs, `ingest_parts` (CPU per step of the webhook
/// path): built as the scripts build theirs, run in smoke mode on the default payload.
#[test]
fn bench_smoke_ingest_parts_example() {
    let build = Command::new("cargo")
        .args(["build", "--quiet", "--example", "ingest_parts"])
        .current_dir(root())
        .output()
        .expect("cargo runs");
    assert!(
        build.status.success(),
        "cargo build --example ingest_parts: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let out = Command::new(root().join("target/debug/examples/ingest_parts"))
        .env("BENCH_SMOKE", "1")
        .current_dir(root())
        .output()
        .expect("ingest_parts runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "ingest_parts (smoke) failed:\n{text}");
    assert_summary(
        "ingest_parts.rs",
        &text,
        &[
            "webhooks/pull_request_opened.json: ",
            "utf-8 check",
            "repository_of (UTF-8 + probe)",
            "HMAC-SHA256",
        ],
    );
}

/// The scripts with a smoke test here (each `bench_smoke_<stem>`).
const SCRIPTS: [&str; 8] = [
    "agents.sh",
    "api_calls.sh",
    "floor.sh",
    "ingest.sh",
    "merge_lease.sh",
    "merge_queue.sh",
    "topology.sh",
    "worker.sh",
];

/// Every script under `bench/` has a smoke mode and a test here, and no file under
/// `bench/` names a path outside the repository.
#[test]
fn bench_smoke_covers_every_script_and_reads_nothing_outside() {
    let this = include_str!("bench_smoke.rs");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root().join("bench")).expect("bench/ is readable") {
        let p = entry.expect("an entry").path();
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&p).expect("a bench file");
        // The only climbs allowed: a script's own folder up to the repository root, and
        // an example's `include_str!` of a file under `src/`. Any other `..` could leave
        // the repository.
        let rest = text
            .replace("\"${BASH_SOURCE[0]}\")/..\"", "")
            .replace("\"../src/", "");
        if let Some(line) = rest
            .lines()
            .find(|l| l.contains("../") || l.contains("/.."))
        {
            panic!("bench/{name} climbs out of its folder: {line:?}: outside the repository");
        }
        if let Some(stem) = name.strip_suffix(".sh").filter(|s| *s != "lib") {
            assert!(text.contains("smoke"), "bench/{name} has no smoke mode");
            assert!(
                this.contains(&format!("fn bench_smoke_{stem}()")),
                "bench/{name} has no smoke test in tests/it/bench_smoke.rs"
            );
            found.push(name);
        }
    }
    found.sort();
    assert_eq!(found, SCRIPTS, "the scripts under bench/");
}
