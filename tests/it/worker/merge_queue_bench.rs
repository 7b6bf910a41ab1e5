//! The merge queue's throughput by batch size and failure rate (`bench/merge_queue.sh`,
//! figures in docs/benchmarks.md): the real `shepherd run` on a real redis-server and
//! the fake Forgejo with a simulated CI of fixed duration D, where each PR breaks with
//! probability p (only on top of one earlier PR) and each CI run fails on its own
//! with probability f (`support::fake_forgejo::sim_failures`). For every mix (p, f)
//! and batch size k, n green PRs are approved at once; measured: merged PRs per hour,
//! CI runs per merged PR, time in queue p50/p90, batch first-pass success, PRs
//! ejected for a flaky failure alone, each beside the model of docs/benchmarks.md,
//! and the ratios against k = 1 of the same run. Asserts only the queue's guarantees.

use std::time::{Duration, Instant};

use shepherd::core::queue::Ejection;

use crate::support::fake_forgejo::FakeForgejo;
use crate::support::fake_forgejo::queue::SimCi;
use crate::support::fake_forgejo::sim_failures::{Flaky, Rng, draw_breaks};
use crate::support::scenario::Scenario;

use super::merge_queue::{CI, REPO, approve, ci_state, merges, open_green, pump, stored_queue};

/// The benchmark's settings, from the environment.
struct Settings {
    /// CI duration per run, ms.
    ci_ms: u64,
    /// PRs per run.
    prs: usize,
    /// Batch sizes.
    ks: Vec<usize>,
    /// (p, f) mixes.
    mixes: Vec<(f64, f64)>,
    /// Seed of the draws.
    seed: u64,
}

/// An environment variable parsed, or `default`.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

impl Settings {
    /// `BENCH_QUEUE_CI_MS` (2000), `BENCH_QUEUE_PRS` (32), `BENCH_QUEUE_KS` (1,4,8),
    /// `BENCH_QUEUE_MIXES` (`0.1:0,0.02:0.05`: p:f pairs), `BENCH_QUEUE_SEED` (29).
    fn from_env() -> Settings {
        let ks = std::env::var("BENCH_QUEUE_KS").unwrap_or_else(|_| "1,4,8".into());
        let mixes = std::env::var("BENCH_QUEUE_MIXES").unwrap_or_else(|_| "0.1:0,0.02:0.05".into());
        Settings {
            ci_ms: env_or("BENCH_QUEUE_CI_MS", 2_000),
            prs: env_or("BENCH_QUEUE_PRS", 32),
            ks: ks
                .split(',')
                .filter_map(|x| x.trim().parse().ok())
                .collect(),
            mixes: mixes
                .split(',')
                .filter_map(|m| {
                    let (p, f) = m.split_once(':')?;
                    Some((p.trim().parse().ok()?, f.trim().parse().ok()?))
                })
                .collect(),
            seed: env_or("BENCH_QUEUE_SEED", 29),
        }
    }
}

/// What one run measured (or the model predicts).
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    /// Merged PRs per hour.
    per_hour: f64,
    /// CI runs the queue asked for, per merged PR (its `ci_runs`: one per batch tip
    /// tested, one per update of the serial head).
    runs_per_merged: f64,
    /// Time in queue, median, s.
    p50_s: f64,
    /// Time in queue, 90th percentile, s.
    p90_s: f64,
    /// Batch first-pass success (0..1).
    first_pass: f64,
}

/// The model of docs/benchmarks.md ("Next step"), with the rules of
/// docs/merge-queue.md: a red batch of k > 1 reads its intermediate commits' CI (each
/// PR merged into the batch branch is a push CI tests), so with the first culprit at
/// position i the i − 1 PRs before it land at once, it is ejected without a run of its
/// own (two red runs held it: its prefix's and the batch's) unless it is the last PR
/// (one more run, alone), and the k − i after it wait for the next batch; a flake on
/// the batch's tip costs the last PR's run alone. A batch costs
/// D (1 + (1 − p)^(k−1) p + f) + r o and resolves r = (1 − p)^k k + Σ i (1 − p)^(i−1) p PRs, of which one is
/// ejected when red (o = 0.08 s per PR, measured). The serial queue (k = 1):
/// D (1 + p + f) + o per PR (a red run on the tip is re-tested once, a culprit's and a
/// flake's alike), merging 1 − p. n PRs ready at once wait about i / rate each; a
/// batch passes first with (1 − p)^k (1 − f).
fn model(d_s: f64, p: f64, f: f64, k: usize, n: usize) -> Figures {
    let kf = k as f64;
    let red = 1.0 - (1.0 - p).powf(kf);
    if k == 1 {
        let runs = 1.0 + p + f;
        let rate = (1.0 - p) / (d_s * runs + 0.08);
        return Figures {
            per_hour: rate * 3600.0,
            runs_per_merged: runs / (1.0 - p),
            p50_s: 0.5 * n as f64 / rate,
            p90_s: 0.9 * n as f64 / rate,
            first_pass: (1.0 - p) * (1.0 - f),
        };
    }
    // The first culprit is PR i with (1 − p)^(i − 1) p: the i − 1 before it land, it
    // is ejected, the k − i after it wait for the next batch.
    let at = |i: usize| (1.0 - p).powf(i as f64 - 1.0) * p;
    let resolved = (1.0 - red) * kf + (1..=k).map(|i| at(i) * i as f64).sum::<f64>();
    let runs = 1.0 + at(k) + f;
    let merged = resolved - red;
    let rate = merged / (d_s * runs + resolved * 0.08);
    Figures {
        per_hour: rate * 3600.0,
        runs_per_merged: runs / merged,
        p50_s: 0.5 * n as f64 / rate,
        p90_s: 0.9 * n as f64 / rate,
        first_pass: (1.0 - p).powf(kf) * (1.0 - f),
    }
}

/// The value at `pct` of sorted `v` (nearest rank).
fn rank(v: &[f64], pct: usize) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v[((pct * v.len()).div_ceil(100)).clamp(1, v.len()) - 1]
}

/// CI runs the simulated CI finished so far.
fn runs_finished(fake: &FakeForgejo) -> (usize, usize) {
    fake.with_model(|m| {
        m.repos[REPO].ci.as_ref().map_or((0, 0), |c| {
            (c.finished.len(), c.finished.iter().filter(|r| r.1).count())
        })
    })
}

/// When PR `pr` was merged (its successful merge call), if it was.
fn merged_at(fake: &FakeForgejo, pr: u64) -> Option<Instant> {
    let calls = fake.calls("POST", &format!("/repos/{REPO}/pulls/{pr}/merge"));
    calls.iter().find(|c| c.status == 200).map(|c| c.at)
}

/// Runs n PRs through the queue with batch size `k` and the failure mix (p, f).
async fn one_run(set: &Settings, k: usize, p: f64, f: f64) -> Figures {
    let policy = format!(
        "merge_queue = true\nmerge_queue_batch_size = {k}\nmerge_queue_batch_wait_secs = 0\nmerge_queue_flaky_retries = 1\n"
    );
    let s = Scenario::start(&policy).await;
    s.fake
        .simulate_ci(REPO, SimCi::new(CI, Duration::from_millis(set.ci_ms)));
    let prs = open_green(&s, set.prs).await;
    // The same breakages for every k of a mix; flakiness from now on only.
    let breaks = draw_breaks(&prs, p, &mut Rng::new(set.seed));
    s.fake.with_model(|m| {
        let ci = m.repo_mut(REPO).ci.as_mut().expect("the simulated CI");
        ci.breaks = breaks.clone();
        ci.flaky = Some(Flaky {
            rate: f,
            rng: Rng::new(set.seed ^ 0xF1A4),
            failed: 0,
        });
    });
    let (runs_before, green_before) = runs_finished(&s.fake);
    let t0 = Instant::now();
    for &pr in &prs {
        approve(&s, pr).await;
    }
    let end = t0 + Duration::from_secs(1_800);
    let (merged, parked) = loop {
        pump(&s).await;
        let q = stored_queue(&s).await;
        let merged: Vec<u64> = (prs.iter().copied())
            .filter(|&n| merged_at(&s.fake, n).is_some())
            .collect();
        // Ejected for good in this run: CI failed or a conflict (a `not-ready` park is
        // a record waiting a moment; it joins again).
        let parked: Vec<u64> = (q.parked().iter())
            .filter(|e| matches!(e.parked, Some(Ejection::CiFailed | Ejection::Conflict)))
            .map(|e| e.number)
            .collect();
        if q.order().is_empty() && merged.len() + parked.len() == prs.len() {
            break (merged, parked);
        }
        assert!(
            Instant::now() < end,
            "k={k}: the queue did not drain: {q:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut waits: Vec<f64> = (merged.iter())
        .filter_map(|&n| merged_at(&s.fake, n))
        .map(|at| at.duration_since(t0).as_secs_f64())
        .collect();
    waits.sort_by(f64::total_cmp);
    let span = waits.last().copied().unwrap_or(1e-3).max(1e-3);
    let (runs_after, green_after) = runs_finished(&s.fake);
    let runs = runs_after - runs_before;
    let q = stored_queue(&s).await;
    let first_pass = match q.stats.first_pass() {
        Some((green, tested)) => green as f64 / tested.max(1) as f64,
        // The serial queue: the share of its CI runs that passed.
        None => (green_after - green_before) as f64 / runs.max(1) as f64,
    };
    // A pair breaks whichever of the two is tested on top of the other: the one
    // ejected while its partner merged is a culprit, any other ejection is a flake's.
    let culprits: Vec<u64> = (breaks.iter())
        .flat_map(|&(a, b)| [(a, b), (b, a)])
        .filter(|(_, other)| merged.contains(other))
        .map(|(c, _)| c)
        .collect();
    let flaky_alone = parked.iter().filter(|n| !culprits.contains(n)).count();
    let flaky_runs = s.fake.with_model(|m| {
        (m.repos[REPO].ci.as_ref()).map_or(0, |c| c.flaky.as_ref().map_or(0, |x| x.failed))
    });
    // The queue's own count for every k (k = 1: one per update, one per re-test).
    let tested_runs = q.stats.ci_runs;
    let measured = Figures {
        per_hour: merged.len() as f64 / span * 3600.0,
        runs_per_merged: tested_runs as f64 / merged.len().max(1) as f64,
        p50_s: rank(&waits, 50),
        p90_s: rank(&waits, 90),
        first_pass,
    };
    let m = model(set.ci_ms as f64 / 1000.0, p, f, k, set.prs);
    let own = q
        .stats
        .waits(chrono::Utc::now().timestamp_millis(), 86_400_000);
    println!(
        "BENCH merge_queue k={k} p={p} f={f} n={} ci_ms={} merged={} ejected={} ejected_flaky_alone={flaky_alone} \
         prs_per_hour={:.0} (model {:.0}) ci_runs_per_merged={:.2} (model {:.2}) all_ci_runs_per_merged={:.2} \
         time_in_queue_s p50={:.1} (model {:.1}) p90={:.1} (model {:.1}) first_pass={:.2} (model {:.2}) \
         flaky_runs={flaky_runs} flaky_retries={} flaky_saved={} shepherd_p50_s={:.1} shepherd_p90_s={:.1} \
         breaks={breaks:?} ejected_prs={parked:?}",
        set.prs,
        set.ci_ms,
        merged.len(),
        parked.len(),
        measured.per_hour,
        m.per_hour,
        measured.runs_per_merged,
        m.runs_per_merged,
        runs as f64 / merged.len().max(1) as f64,
        measured.p50_s,
        m.p50_s,
        measured.p90_s,
        m.p90_s,
        measured.first_pass,
        m.first_pass,
        q.stats.flaky_retries,
        q.stats.flaky_saved,
        own.p50_ms as f64 / 1000.0,
        own.p90_ms as f64 / 1000.0,
    );
    // G1: every commit that landed on main was green.
    for landed in merges(&s.fake)
        .iter()
        .filter(|m| m.style != "manually-merged")
    {
        assert_eq!(
            ci_state(&s.fake, &landed.merged_sha),
            "success",
            "{landed:?}"
        );
    }
    measured
}

/// See the module's documentation.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: bench/merge_queue.sh"]
async fn bench_merge_queue_batches() {
    let set = Settings::from_env();
    for &(p, f) in &set.mixes {
        let mut serial: Option<(Figures, Figures)> = None;
        for &k in &set.ks {
            let measured = one_run(&set, k, p, f).await;
            let m = model(set.ci_ms as f64 / 1000.0, p, f, k, set.prs);
            match serial {
                None if k == 1 => serial = Some((measured, m)),
                None => {}
                Some((base, base_model)) => println!(
                    "BENCH merge_queue ratio p={p} f={f} k={k} vs k=1: prs_per_hour x{:.2} (model x{:.2}) \
                     ci_runs_per_merged x{:.2} (model x{:.2}) p50 x{:.2} (model x{:.2})",
                    measured.per_hour / base.per_hour.max(1e-9),
                    m.per_hour / base_model.per_hour,
                    measured.runs_per_merged / base.runs_per_merged.max(1e-9),
                    m.runs_per_merged / base_model.runs_per_merged,
                    measured.p50_s / base.p50_s.max(1e-9),
                    m.p50_s / base_model.p50_s,
                ),
            }
        }
    }
}
