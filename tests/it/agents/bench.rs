//! The agent runner's benchmark (issue 14), run by `bench/agents.sh`; ignored by
//! default. Figures are printed, never asserted (the test asserts only that every work
//! item ran once and reported once):
//!
//! 1. **Overhead per item**: one runner with one slot and the instant agent `true`
//!    works through `BENCH_AGENTS_ITEMS` work items one after another; per item, its
//!    wall time. Baseline, measured in the same run by this process, one after
//!    another: the same Forgejo reads (`agents::context::gather` against the same fake)
//!    plus spawning and waiting for `true`. Overhead = per item − baseline: the
//!    runner's own cost (stream read, work-index check, render, files, run record,
//!    log, report, ack).
//! 2. **Throughput**: `BENCH_AGENTS_ITEMS` items queued at once for 1 and 2 runner
//!    processes (2 slots each): items per second until the last result is queued.
//! 4. **The sandbox's cost** (issue 26): one runner, one slot, the agent `true`,
//!    `BENCH_AGENTS_ITEMS` items one after another, with `SHEPHERD_AGENT_SANDBOX=off`
//!    and `on` in the same run (off, on, off, on; the means of each): the difference
//!    per item is the sandbox's cost (bwrap, namespaces, the folder's ownership).
//!    `BENCH_AGENTS_ONLY=sandbox` runs this part alone.
//! 5. **Live usage** (issue 28): the parser of `SHEPHERD_AGENT_USAGE=opencode-json`.
//!    (a) its cost per item in this process: a typical opencode run's output (100
//!    steps: `step_start`, `step_finish`, a `tool_use` with 2 KiB of output, a `text`
//!    each) fed to `agents::usage::Meter`, per item and per event; (b) the runner's CPU
//!    at 1,000 events per second of agent output: one runner, one agent printing
//!    opencode-shaped events (the same mix, 1,000 a second) for
//!    `BENCH_AGENTS_USAGE_SECS`, with the setting `off` (the runner's baseline: capture,
//!    masking, log saves) and `opencode-json`, alternating (off, on, off, on) in the
//!    same run (`BENCH_AGENTS_USAGE_ROUNDS` rounds, 6 by default); the runner
//!    process's user + system CPU from `/proc/<pid>/stat` (10 ms ticks) and, to the
//!    nanosecond, summed over its threads' `/proc/<pid>/task/<tid>/schedstat`, sampled
//!    every 100 ms; and, in place, in the same `opencode-json` rounds, the meter's own
//!    CPU as the runner counts it (`shepherd_agent_usage_meter_cpu_seconds_total` on its
//!    `/metrics`: the thread CPU clock around each output chunk fed to the meter) over
//!    the runner's schedstat CPU of the round. (c) The ledger's cost per item: `store::ledger::record` (one Lua
//!    call on a real redis-server) for `10 × BENCH_AGENTS_ITEMS` runs, new then replayed
//!    (the work id already counted), against the runner's own wall time per item
//!    measured in the same run (one slot, the agent `true`, `BENCH_AGENTS_ITEMS` items).
//!    `BENCH_AGENTS_ONLY=usage` runs this part alone.
//! 3. **Webhook → agent start**: `shepherd run` and one runner; per PR (CI already
//!    red, the poll pushed a day away), the signed `action_run_failure` webhook, then
//!    the time until the agent process writes its start time (p50/p99), at
//!    `BENCH_AGENTS_RATE` webhooks per second.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{REPO, Rig, write_script};
use crate::support::fake_forgejo::NewPr;
use crate::support::poll_until_named;
use crate::support::scenario::Scenario;

/// An hour: claims that never expire during the run.
const HOUR: Duration = Duration::from_secs(3600);
/// How long one phase may take.
const PHASE_DEADLINE: Duration = Duration::from_secs(600);

/// A setting from the environment, or its default.
fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Percentile `p` (0..=100) of sorted `v`.
fn pct(v: &[f64], p: usize) -> f64 {
    v[(v.len() * p / 100).min(v.len() - 1)]
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: bench/agents.sh runs it"]
async fn bench_agents() {
    let items = setting("BENCH_AGENTS_ITEMS", 200);
    let hooks = setting("BENCH_AGENTS_WEBHOOKS", 100);
    let rate = setting("BENCH_AGENTS_RATE", 20);
    let usage_secs = setting("BENCH_AGENTS_USAGE_SECS", 20);
    match std::env::var("BENCH_AGENTS_ONLY").as_deref() {
        Ok("sandbox") => return sandbox_cost(items).await,
        Ok("usage") => {
            live_usage(usage_secs).await;
            return ledger_cost(items).await;
        }
        _ => {}
    }
    live_usage(usage_secs).await;
    ledger_cost(items).await;
    overhead(items).await;
    sandbox_cost(items).await;
    for runners in [1, 2] {
        throughput(items, runners).await;
    }
    webhook_to_start(hooks, rate).await;
}

/// Starts `runner` with one slot (logging warnings only), dispatches a `ci-fix` for
/// each of `prs` and waits for every result: the runner, and the wall time per item
/// in ms.
async fn one_at_a_time(
    rig: &Rig,
    runner: crate::support::shepherd::Builder,
    prs: &[u64],
) -> (crate::support::shepherd::Shepherd, f64) {
    let runner = runner
        .env("SHEPHERD_AGENTS_MAX", "1")
        .env("SHEPHERD_LOG", "warn")
        .start()
        .await;
    let started = Instant::now();
    for n in prs {
        rig.dispatch(REPO, *n, "ci-fix", 0, HOUR).await;
    }
    wait_results(rig, prs.len()).await;
    let per_item = started.elapsed().as_secs_f64() * 1000.0 / prs.len() as f64;
    (runner, per_item)
}

/// Part 1.
async fn overhead(items: usize) {
    let rig = Rig::start().await;
    let prs: Vec<u64> = (0..items).map(|_| rig.open_pr(REPO)).collect();
    let (_runner, per_item) = one_at_a_time(&rig, rig.runner("true"), &prs).await;

    // Baseline: the same reads and the same spawn, done directly.
    let forgejo = shepherd::forgejo::ForgejoClient::new(
        &rig.fake.url(),
        secrecy::SecretString::from(rig.fake.token().to_owned()),
        Default::default(),
    )
    .expect("client");
    let sample: serde_json::Value = {
        let mut conn = rig.conn.clone();
        let raw: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(rig.keys().dispatch())
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .expect("XRANGE");
        serde_json::from_str(&raw[0].1[0].1).expect("work JSON")
    };
    let item: shepherd::core::effect::WorkItem = serde_json::from_value(sample).expect("work item");
    let base_start = Instant::now();
    for _ in 0..items {
        shepherd::agents::context::gather(&forgejo, &item)
            .await
            .expect("context");
        let status = tokio::process::Command::new("true")
            .status()
            .await
            .expect("spawn true");
        assert!(status.success());
    }
    let baseline = base_start.elapsed().as_secs_f64() * 1000.0 / items as f64;
    println!(
        "BENCH overhead items={items} per_item_ms={per_item:.2} baseline_ms={baseline:.2} \
         overhead_ms={:.2} ratio={:.2}",
        per_item - baseline,
        per_item / baseline
    );
}

/// Part 4: per-item wall time with the sandbox off and on, alternating.
async fn sandbox_cost(items: usize) {
    let mut off = Vec::new();
    let mut on = Vec::new();
    for round in 0..4 {
        let sandboxed = round % 2 == 1;
        let rig = Rig::start().await;
        let prs: Vec<u64> = (0..items).map(|_| rig.open_pr(REPO)).collect();
        let builder = match sandboxed {
            true => rig.sandboxed_runner("true"),
            false => rig.runner("true"),
        };
        let (_runner, per_item) = one_at_a_time(&rig, builder, &prs).await;
        match sandboxed {
            true => on.push(per_item),
            false => off.push(per_item),
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (off, on) = (mean(&off), mean(&on));
    println!(
        "BENCH sandbox items={items} off_per_item_ms={off:.2} on_per_item_ms={on:.2} \
         sandbox_cost_ms={:.2}",
        on - off
    );
}

/// Part 2.
async fn throughput(items: usize, runners: usize) {
    let rig = Rig::start().await;
    let repos = ["bench/a", "bench/b"];
    let prs: Vec<(&str, u64)> = (0..items)
        .map(|i| {
            let repo = repos[i % 2];
            (repo, rig.open_pr(repo))
        })
        .collect();
    let mut procs = Vec::new();
    for _ in 0..runners {
        let p = rig
            .runner("true")
            .env("SHEPHERD_AGENTS_MAX", "2")
            .env("SHEPHERD_AGENTS_PER_REPO", "2")
            .env("SHEPHERD_LOG", "warn")
            .start()
            .await;
        procs.push(p);
    }
    let started = Instant::now();
    for (repo, n) in &prs {
        rig.dispatch(repo, *n, "ci-fix", 0, HOUR).await;
    }
    let results = wait_results(&rig, items).await;
    let secs = started.elapsed().as_secs_f64();
    let ids: HashSet<String> = results.iter().map(|r| r["work_id"].to_string()).collect();
    assert_eq!(
        (results.len(), ids.len()),
        (items, items),
        "each item reported once"
    );
    println!(
        "BENCH throughput runners={runners} items={items} secs={secs:.2} items_per_sec={:.1}",
        items as f64 / secs
    );
}

/// Waits for `n` results (polling every 50 ms, so the wait costs little CPU).
async fn wait_results(rig: &Rig, n: usize) -> Vec<serde_json::Value> {
    let end = Instant::now() + PHASE_DEADLINE;
    loop {
        let r = rig.results().await;
        if r.len() >= n {
            return r;
        }
        assert!(
            Instant::now() < end,
            "{} of {n} results after {PHASE_DEADLINE:?}",
            r.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Part 3.
async fn webhook_to_start(hooks: usize, rate: usize) {
    let policy = "bot_users = [\"agent-bot\"]\nstale_after_secs = 31536000\n\
                  ci_poll_initial_secs = 86400\nci_poll_max_secs = 86400\n\
                  mergeability_delay_secs = 86400\n";
    let s = Scenario::start_with_defaults(policy).await;
    let dir = tempfile::tempdir().unwrap();
    let script = write_script(
        dir.path(),
        "start.sh",
        // It says it succeeded (the record then waits for the push, past the bench's
        // end): one start per webhook, none for a `no-changes` retry.
        r#"echo "$SHEPHERD_NUMBER $(date +%s%N)" >> "$DIR/started"
echo '{"outcome":"succeeded"}' > "$SHEPHERD_RESULT_FILE""#,
    );
    let _runner = s
        .agents(&script)
        .env("SHEPHERD_AGENTS_MAX", "4")
        .env("SHEPHERD_AGENTS_PER_REPO", "4")
        .env("SHEPHERD_LOG", "warn")
        .start()
        .await;
    let repo = "bench/lag";
    let mut prs = Vec::new();
    for _ in 0..hooks {
        let n = s
            .fake
            .open_pr(repo, NewPr::new("agent-bot", "Bench").body("b"));
        let sha = s.fake.head_sha(repo, n);
        s.fake.set_status(repo, &sha, "ci/test", "failure", "red");
        s.send(&s.fake.pr_opened(repo, n)).await;
        prs.push((n, sha));
    }
    s.wait_idle_for(PHASE_DEADLINE).await;
    let gap = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let mut sent = std::collections::HashMap::new();
    let begin = Instant::now();
    for (i, (n, sha)) in prs.iter().enumerate() {
        let hook = s.fake.action_run(repo, sha, "failure", Some(*n));
        tokio::time::sleep_until((begin + gap * i as u32).into()).await;
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        s.send(&hook).await;
        sent.insert(*n, at);
    }
    let path = dir.path().join("started");
    poll_until_named(PHASE_DEADLINE, "every agent started", || async {
        std::fs::read_to_string(&path).is_ok_and(|t| t.lines().count() >= hooks)
    })
    .await;
    let mut lags: Vec<f64> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (n, at) = l.split_once(' ')?;
            let t0 = sent.get(&n.parse::<u64>().ok()?)?;
            Some((at.parse::<u128>().ok()?.saturating_sub(*t0)) as f64 / 1e6)
        })
        .collect();
    lags.sort_by(f64::total_cmp);
    assert_eq!(lags.len(), hooks, "one agent start per webhook");
    println!(
        "BENCH webhook_to_start webhooks={hooks} rate={rate}/s p50_ms={:.1} p90_ms={:.1} p99_ms={:.1} max_ms={:.1}",
        pct(&lags, 50),
        pct(&lags, 90),
        pct(&lags, 99),
        lags[lags.len() - 1]
    );
}

/// One second of opencode-shaped agent output for part 5: 1,000 events, 250 each of
/// `step_start`, `step_finish` (1,000 input and 100 output tokens, $0.0045), `tool_use`
/// (2 KiB of output) and `text`.
fn events_second() -> String {
    let output = "x".repeat(2048);
    let mut text = String::new();
    for i in 0..250 {
        text.push_str(&format!(
            "{{\"type\":\"step_start\",\"timestamp\":{i},\"sessionID\":\"ses_b\",\"part\":{{\"id\":\"prt_{i}a\",\"type\":\"step-start\"}}}}\n"
        ));
        text.push_str(&format!(
            "{{\"type\":\"tool_use\",\"timestamp\":{i},\"sessionID\":\"ses_b\",\"part\":{{\"id\":\"prt_{i}b\",\"type\":\"tool\",\"tool\":\"bash\",\"callID\":\"call_{i}\",\"state\":{{\"status\":\"completed\",\"input\":{{\"command\":\"ls {i}\"}},\"output\":\"{output}\",\"title\":\"ls\",\"metadata\":{{}},\"time\":{{\"start\":1,\"end\":2}}}}}}}}\n"
        ));
        text.push_str(&format!(
            "{{\"type\":\"step_finish\",\"timestamp\":{i},\"sessionID\":\"ses_b\",\"part\":{{\"id\":\"prt_{i}c\",\"type\":\"step-finish\",\"reason\":\"tool-calls\",\"tokens\":{{\"total\":1100,\"input\":1000,\"output\":100,\"reasoning\":0,\"cache\":{{\"read\":0,\"write\":0}}}},\"cost\":0.0045}}}}\n"
        ));
        text.push_str(&format!(
            "{{\"type\":\"text\",\"timestamp\":{i},\"sessionID\":\"ses_b\",\"part\":{{\"id\":\"prt_{i}d\",\"type\":\"text\",\"text\":\"Step {i} done.\"}}}}\n"
        ));
    }
    text
}

/// User + system CPU seconds of process `pid` so far (`/proc/<pid>/stat`): every
/// thread, exited ones too, but in clock ticks of 10 ms.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("stat has a command name")
        .1
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of stat(5); 13 and 14 after the name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // `/proc` counts in USER_HZ, 100 a second on Linux whatever the kernel's HZ.
    ticks as f64 / 100.0
}

/// The CPU time so far of each live thread of `pid`, in nanoseconds: the first field
/// of `/proc/<pid>/task/<tid>/schedstat` (the scheduler's `sum_exec_runtime`).
fn thread_cpu_ns(pid: u32) -> HashMap<u32, u64> {
    let mut out = HashMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let ns = std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()));
        if let Some(ns) = ns {
            out.insert(tid, ns);
        }
    }
    out
}

/// Samples [`thread_cpu_ns`] of `pid` every 100 ms until `stop` is set, keeping each
/// thread's last value (a thread that exits loses at most its last 100 ms); returns
/// the CPU seconds used since the call, with nanosecond resolution (the ticks of
/// [`cpu_secs`] are 10 ms: at 0.7 % of a core a 15 s round is only ~10 of them).
fn sample_cpu(
    pid: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<f64> {
    let start = thread_cpu_ns(pid);
    std::thread::spawn(move || {
        let mut last = start.clone();
        loop {
            let done = stop.load(std::sync::atomic::Ordering::Relaxed);
            for (tid, ns) in thread_cpu_ns(pid) {
                last.insert(tid, ns);
            }
            if done {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let ns: u64 = last
            .iter()
            .map(|(tid, ns)| ns - start.get(tid).copied().unwrap_or(0))
            .sum();
        ns as f64 / 1e9
    })
}

/// Part 5.
async fn live_usage(secs: usize) {
    // (a) The parser alone, per item.
    let second = events_second();
    let item: String = second.lines().take(400).map(|l| format!("{l}\n")).collect();
    let rounds = 200;
    let started = Instant::now();
    for _ in 0..rounds {
        let mut meter = shepherd::agents::usage::Meter::new(Default::default());
        for chunk in item.as_bytes().chunks(16 * 1024) {
            meter.feed(chunk);
        }
        assert_eq!(meter.usage().steps, 100);
    }
    let per_item_us = started.elapsed().as_secs_f64() * 1e6 / rounds as f64;
    println!(
        "BENCH usage_parser events_per_item=400 item_bytes={} per_item_us={per_item_us:.1} per_event_ns={:.0}",
        item.len(),
        per_item_us * 1000.0 / 400.0
    );
    // The same per event type: 100 lines of one type (a step_start, tool_use,
    // step_finish or text line of the mix), fed the same way.
    let mut types = Vec::new();
    for (k, name) in ["step_start", "tool_use", "step_finish", "text"]
        .iter()
        .enumerate()
    {
        let lines: String = item
            .lines()
            .skip(k)
            .step_by(4)
            .map(|l| format!("{l}\n"))
            .collect();
        let started = Instant::now();
        for _ in 0..rounds {
            let mut meter = shepherd::agents::usage::Meter::new(Default::default());
            for chunk in lines.as_bytes().chunks(16 * 1024) {
                meter.feed(chunk);
            }
        }
        let ns = started.elapsed().as_secs_f64() * 1e9 / (rounds * 100) as f64;
        types.push(format!("{name}_ns={ns:.0}"));
    }
    println!("BENCH usage_parser_by_type {}", types.join(" "));
    runner_cpu(&second, secs, rounds_setting()).await;
}

/// Rounds of part 5 (b): off, on, off, on, … (`BENCH_AGENTS_USAGE_ROUNDS`, at least 2).
fn rounds_setting() -> usize {
    setting("BENCH_AGENTS_USAGE_ROUNDS", 6).max(2)
}

/// Part 5 (b): the runner's CPU at 1,000 events a second (`second` once a second for
/// `secs`), setting off and on alternately for `rounds` rounds; both the `/proc/<pid>/stat`
/// ticks and the threads' nanosecond `schedstat` sums.
async fn runner_cpu(second: &str, secs: usize, rounds: usize) {
    // [off, on] × [ticks, schedstat], percent of a core per round.
    let mut cpu = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    // Per `on` round: the meter's own CPU (its counter on the runner's `/metrics`), in
    // percent of a core and in percent of the runner's CPU (schedstat) in that round.
    let (mut meter_core, mut meter_share) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let on = round % 2 == 1;
        let rig = Rig::start().await;
        std::fs::write(rig.path("events.jsonl"), second).expect("events file");
        let script = rig.script(
            "events.sh",
            // A result file, so the outcome is the agent's word, not read from Forgejo
            // (the agent pushes nothing: that would be `no-changes`).
            r#"i=0; while [ "$i" -lt "$1" ]; do cat "$DIR/events.jsonl"; sleep 1; i=$((i+1)); done
echo '{"outcome":"succeeded"}' > "$SHEPHERD_RESULT_FILE""#,
        );
        let n = rig.open_pr(REPO);
        let runner = rig
            .runner(&format!("{script} {secs}"))
            .env("SHEPHERD_AGENTS_MAX", "1")
            .env("SHEPHERD_LOG", "warn")
            .env(
                "SHEPHERD_AGENT_USAGE",
                if on { "opencode-json" } else { "off" },
            )
            .start()
            .await;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = sample_cpu(runner.pid(), stop.clone());
        let before = cpu_secs(runner.pid());
        let wall = Instant::now();
        rig.dispatch(REPO, n, "ci-fix", 0, HOUR).await;
        let results = wait_results(&rig, 1).await;
        let used = cpu_secs(runner.pid()) - before;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let fine = sampler.join().expect("sampler");
        let wall = wall.elapsed().as_secs_f64();
        assert_eq!(results[0]["outcome"], "succeeded", "{:?}", results[0]);
        if on {
            assert_eq!(
                results[0]["usage"]["steps"],
                250 * secs,
                "every step counted"
            );
        }
        let meter = meter_cpu_secs(&runner).await;
        if on {
            meter_core.push(100.0 * meter / wall);
            meter_share.push(100.0 * meter / fine);
        } else {
            assert_eq!(meter, 0.0, "no meter runs with the setting off");
        }
        cpu[usize::from(on)][0].push(100.0 * used / wall);
        cpu[usize::from(on)][1].push(100.0 * fine / wall);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let share = |off: f64, on: f64| {
        if off > 0.0 {
            100.0 * (on - off) / off
        } else {
            0.0
        }
    };
    let (off, on) = (mean(&cpu[0][0]), mean(&cpu[1][0]));
    let (off_ns, on_ns) = (mean(&cpu[0][1]), mean(&cpu[1][1]));
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    println!(
        "BENCH usage_cpu events_per_sec=1000 secs={secs} rounds={rounds} runner_cpu_off_pct={off:.2} \
         runner_cpu_on_pct={on:.2} parser_pct_of_runner={:.1} schedstat_off_pct={off_ns:.3} \
         schedstat_on_pct={on_ns:.3} schedstat_parser_pct_of_runner={:.1} \
         schedstat_off_rounds={} schedstat_on_rounds={}",
        share(off, on),
        share(off_ns, on_ns),
        fmt(&cpu[0][1]),
        fmt(&cpu[1][1]),
    );
    // In place: the same `on` rounds, the meter's CPU over the runner's (no A/B).
    let (lo, hi) = meter_share
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
    println!(
        "BENCH usage_meter_in_place events_per_sec=1000 secs={secs} on_rounds={} \
         meter_cpu_pct_of_core={:.4} meter_pct_of_runner={:.2} min={lo:.2} max={hi:.2} \
         meter_pct_of_runner_rounds={} meter_pct_of_core_rounds={}",
        meter_share.len(),
        mean(&meter_core),
        mean(&meter_share),
        fmt(&meter_share),
        meter_core
            .iter()
            .map(|x| format!("{x:.4}"))
            .collect::<Vec<_>>()
            .join(","),
    );
}

/// The CPU seconds the runner's usage meter spent so far, from its `/metrics`
/// (`shepherd_agent_usage_meter_cpu_seconds_total`, the thread CPU clock around each
/// output chunk fed to the meter).
async fn meter_cpu_secs(runner: &crate::support::shepherd::Shepherd) -> f64 {
    let text = reqwest::get(runner.url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix("shepherd_agent_usage_meter_cpu_seconds_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the meter's CPU counter on /metrics")
}

/// Part 5 (c): the ledger's cost per item (`store::ledger::record`, the Lua script that
/// counts a run once per work id, against the rig's real redis-server), against the
/// runner's own cost per item measured in the same run (one runner, one slot, the agent
/// `true`, `items` items one after another, as part 1).
async fn ledger_cost(items: usize) {
    let rig = Rig::start().await;
    let prs: Vec<u64> = (0..items).map(|_| rig.open_pr(REPO)).collect();
    let (_runner, runner_ms) = one_at_a_time(&rig, rig.runner("true"), &prs).await;
    let store = shepherd::store::Store::connect(&rig.redis.url(), rig.keys())
        .await
        .expect("store");
    let keys = store.keys().clone();
    let mut conn = store.conn();
    let runs = items * 10;
    let repo: shepherd::core::ids::RepoName = REPO.parse().expect("repo");
    let now_ms = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_millis(),
    )
    .expect("ms");
    let entry = |i: usize| shepherd::store::ledger::RunEntry {
        work_id: format!("bench:ledger:pr:{}:{i}", i % 50),
        repo: repo.clone(),
        number: (i % 50) as u64 + 1,
        issue: false,
        kind: "ci-fix".into(),
        tier: 1,
        at_ms: now_ms,
        outcome: "succeeded".into(),
        usage: shepherd::core::usage::Usage {
            input_tokens: 100_000,
            output_tokens: 10_000,
            cost_micros: 450_000,
            model: Some("stub/model".into()),
            steps: 100,
            tool_calls: 100,
            ..Default::default()
        },
    };
    let mut per_item_us = [0.0; 2];
    // First the new runs (counted), then the same work ids again (a re-reported result:
    // the script finds the marker and changes nothing).
    for (pass, expect) in [(0, true), (1, false)] {
        let started = Instant::now();
        for i in 0..runs {
            let counted = shepherd::store::ledger::record(&mut conn, &keys, &entry(i))
                .await
                .expect("record");
            assert_eq!(counted, expect, "run {i}, pass {pass}");
        }
        per_item_us[pass] = started.elapsed().as_secs_f64() * 1e6 / runs as f64;
    }
    println!(
        "BENCH ledger runs={runs} per_item_us={:.1} replayed_per_item_us={:.1} \
         runner_items={items} runner_per_item_ms={runner_ms:.2} ledger_pct_of_runner_item={:.2}",
        per_item_us[0],
        per_item_us[1],
        per_item_us[0] / 10.0 / runner_ms,
    );
}
