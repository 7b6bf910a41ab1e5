//! Random failures for the merge-queue benchmark's simulated CI (issue 29,
//! `bench/merge_queue.sh`): each PR breaks with probability `p`, only on top of one
//! earlier PR drawn at random (a [`super::queue::SimCi::breaks`] pair, as in the
//! five-PR scenario), and every CI run fails on its own with probability `f` (a
//! flaky check: the same content passes on a re-run). Seeded, so a run can be
//! repeated and every batch size of one run meets the same breakages.

use super::queue::SimCi;

/// A small seeded generator (SplitMix64): enough for drawing test failures.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / ((1u64 << 53) as f64) < p
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The breakages of `prs` (in queue order): each PR after the first breaks with
/// probability `p` on top of one earlier PR drawn at random: `(culprit, other)`.
pub fn draw_breaks(prs: &[u64], p: f64, rng: &mut Rng) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for (i, &pr) in prs.iter().enumerate().skip(1) {
        if rng.chance(p) {
            let other = prs[usize::try_from(rng.below(i as u64)).unwrap_or(0)];
            out.push((pr, other));
        }
    }
    out
}

/// Flaky checks of a simulated CI: every run fails on its own with `rate`.
#[derive(Debug, Clone)]
pub struct Flaky {
    /// Chance that a run fails although its content is sound.
    pub rate: f64,
    /// The draws.
    pub rng: Rng,
    /// Runs that failed only by flakiness so far.
    pub failed: u64,
}

/// Whether the run the simulated CI starts now fails by flakiness (counted).
pub fn flaky_run(ci: &mut SimCi) -> bool {
    let Some(f) = ci.flaky.as_mut() else {
        return false;
    };
    let failed = f.rng.chance(f.rate);
    f.failed += u64::from(failed);
    failed
}
