//! Batches of the merge queue (issue 29, policy `merge_queue_batch_size` > 1): pure
//! rules, no IO.
//!
//! The head of the queue leads a batch of up to k PRs. The executor builds it on a
//! temporary branch `shepherd/batch/<branch>/<id>` made at the target's tip (each PR
//! merged in pinned to the head it was queued with), observes CI on the batch's tip,
//! and asks [`decide`] what the result means:
//! - green, target tip still the batch's base → land (fast-forward the target to the
//!   tested tip, then mark each PR merged): guarantees G1–G3 of the serial queue hold,
//!   since the landed commit is the tested one and it is built on the tip it replaces;
//! - the target moved meanwhile → the batch is dropped and built again on the new tip
//!   (never landed: it was not tested on top of it);
//! - red, several PRs → bisection (never a whole re-test: testing the parts is the
//!   re-test): the first half is tested alone (the rest waits), recursively; a green
//!   half lands; a bisection that ends with every part green was a flake, not a
//!   culprit;
//! - red, one PR, a failing check that already failed in an enclosing red run of the
//!   bisection (so it failed twice) → that PR is the culprit (ejected to `ci-fix`);
//!   the last suspect left after every other PR of the red runs landed green, whose
//!   check failed on two of them, is ejected without a run of its own
//!   ([`NextBatch::Eject`]): its run would re-test what already failed twice;
//! - red, one PR, every failing check passed on the target's tip and re-tests remain
//!   → the same PR is tested again on a new branch (suspected flake);
//! - red, one PR otherwise → the culprit.
//!
//! The serial queue (`merge_queue_batch_size` = 1) uses the same rule ([`Retest`]) for
//! its head red on top of the tip: a re-test is a batch of one
//! ([`BranchQueue::start_retest`]), landed like any batch.
//!
//! Every state change goes through [`BranchQueue`]'s methods here, stored with the
//! queue under compare-and-set, so a restart resumes the batch where it was.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::{BranchQueue, Ejection};
use crate::core::ids::Sha;

/// The prefix of every temporary batch branch (PRs from or into such a branch are
/// the queue's own and are not managed as PRs).
pub const BATCH_BRANCH_PREFIX: &str = "shepherd/batch/";

/// Whether a branch is one of the queue's temporary batch branches.
pub fn is_batch_branch(branch: &str) -> bool {
    branch.starts_with(BATCH_BRANCH_PREFIX)
}

/// The batch settings of a repository's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// `merge_queue_batch_size` (≥ 1; 1 is the serial queue).
    pub size: usize,
    /// `merge_queue_batch_wait_secs` in ms.
    pub wait_ms: i64,
    /// `merge_queue_flaky_retries`.
    pub flaky_retries: u32,
    /// `merge_queue_step_results`: a red batch reads its intermediate commits' CI.
    pub step_results: bool,
}

/// One PR of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchPr {
    /// The PR.
    pub number: u64,
    /// The head it is merged into the batch with (`head_commit_id`).
    pub head: Sha,
    /// Its head branch (the head of the PR into the batch branch).
    pub head_ref: String,
}

/// Where a batch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BatchStage {
    /// The branch is being made and the PRs merged into it.
    Building,
    /// CI runs on the batch's tip.
    Testing,
    /// Green: the target is being fast-forwarded and the PRs marked merged.
    Landing,
}

/// The batch under test.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Names the temporary branch.
    pub id: u64,
    /// The target's tip the branch was made at.
    pub base: Sha,
    /// Its PRs, in queue order (a PR that conflicted while building is removed).
    pub prs: Vec<BatchPr>,
    /// How many of `prs` (a prefix) are merged into the branch.
    pub built: usize,
    /// The branch's tip once built: the commit CI tests and that lands.
    pub tip: Option<Sha>,
    /// Stage.
    pub stage: BatchStage,
    /// Flaky re-tests of this content so far.
    pub retries: u32,
    /// A half of a bisection (never counted as a first pass).
    pub bisecting: bool,
    /// During a bisection, the checks that failed on the red runs enclosing this
    /// batch (each held every PR of it): one failing again reproduces the failure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_before: Vec<String>,
    /// The checks that failed on the first red result of this content (recorded as
    /// suspected flaky when a re-test passes).
    #[serde(default)]
    pub failing: Vec<String>,
    /// When it was formed (unix ms).
    pub started_ms: i64,
    /// The PR batch branch → target that lands it (set once created, so a restart
    /// reads whether the fast-forward happened instead of doing it again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landing_pr: Option<u64>,
    /// Each PR → its helper PR into the batch branch (recorded once created, so a
    /// restart reads whether it was merged instead of opening another).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub helpers: std::collections::BTreeMap<u64, u64>,
    /// The branch's tip after each PR merged in (`steps[i]` holds `prs[..=i]`): CI
    /// tests each as a push, so a red batch reads which prefixes passed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Sha>,
    /// A green prefix of a red batch, landed without a run of its own: its branch is
    /// made at this commit (the intermediate commit CI passed) instead of being built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made_at: Option<Sha>,
}

impl Batch {
    /// The temporary branch of the batch for target `branch`.
    pub fn branch_name(&self, branch: &str) -> String {
        format!("{BATCH_BRANCH_PREFIX}{branch}/{}", self.id)
    }

    /// The PR numbers, in order.
    pub fn numbers(&self) -> Vec<u64> {
        self.prs.iter().map(|p| p.number).collect()
    }
}

/// A red batch being bisected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bisection {
    /// PRs not cleared yet, in queue order: the next batch tests the first half.
    pub suspects: Vec<u64>,
    /// The PRs of the red batch that started it.
    pub tested_with: Vec<u64>,
    /// The checks that failed on it and on its red halves (every red run of the
    /// bisection held every suspect).
    pub failing: Vec<String>,
    /// The checks among them that failed on two red runs of the bisection (each held
    /// every suspect): a lone suspect left after the others landed green has failed
    /// twice already and is ejected without a run of its own ([`NextBatch::Eject`]).
    /// Emptied when a suspect leaves otherwise (closed, pushed to, conflicting) or
    /// the target moves under the bisection: then the lone suspect is tested.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reproduced: Vec<String>,
}

/// The CI result of a batch's tip, as the executor read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchCi {
    /// Pending or missing.
    Pending,
    /// Every check passed.
    Green,
    /// Some checks failed.
    Red {
        /// The failing contexts.
        failing: Vec<String>,
        /// Contexts that passed on the target's tip (a failing check among them is
        /// known there; one that is not is a new test, never retried).
        tip_green: BTreeSet<String>,
        /// The CI of the intermediate commits (`Batch::steps` but the last: the
        /// prefixes of 1 … k − 1 PRs), read when the batch has several PRs and
        /// `merge_queue_step_results` is on; empty otherwise.
        steps: Vec<StepCi>,
    },
}

/// The CI of one intermediate commit of a batch branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepCi {
    /// No result to use: still running, never run (a CI that tests only the tip),
    /// or cancelled (Forgejo Actions reports a cancelled job as `failure` with the
    /// description "Has been cancelled": not a test result).
    Unknown,
    /// Every check passed.
    Green,
    /// Some checks failed.
    Red {
        /// The failing contexts.
        failing: Vec<String>,
    },
}

/// What a red batch's intermediate results say ([`narrow`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Narrowed {
    /// The longest prefix (number of PRs) whose commit passed: it lands (0: none).
    pub green: usize,
    /// The shortest prefix longer than `green` that failed (the whole batch when no
    /// intermediate one did): its PRs after `green` are the suspects; the PRs after
    /// it wait for the next batch.
    pub red: usize,
    /// The checks that failed on prefix `red` when it is an intermediate one (a
    /// second red run holding every suspect: a check failing on both is reproduced).
    pub red_failing: Vec<String>,
    /// Checks that failed on a prefix shorter than one that passed: they passed
    /// with more on top, so they are counted as suspected flaky.
    pub flaky: Vec<String>,
}

/// Narrows a red batch of `n` PRs by its intermediate results `steps` (prefixes of 1
/// … n − 1 PRs; unknown ones are skipped): the longest green prefix, and the first
/// red prefix above it. Without usable results: nothing lands, every PR is a suspect.
pub fn narrow(n: usize, steps: &[StepCi]) -> Narrowed {
    let known = steps.iter().take(n.saturating_sub(1));
    let green = known
        .clone()
        .enumerate()
        .filter(|(_, s)| **s == StepCi::Green)
        .map(|(i, _)| i + 1)
        .max()
        .unwrap_or(0);
    let mut out = Narrowed {
        green,
        red: n,
        ..Narrowed::default()
    };
    for (i, s) in known.enumerate() {
        let StepCi::Red { failing } = s else {
            continue;
        };
        let len = i + 1;
        if len < green {
            for f in failing {
                if !out.flaky.contains(f) {
                    out.flaky.push(f.clone());
                }
            }
        } else if len < out.red {
            out.red = len;
            out.red_failing = failing.clone();
        }
    }
    out
}

/// What to do with the batch under test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchDecision {
    /// CI is still running: read again later.
    Wait,
    /// Green on the tip it replaces: land it.
    Land,
    /// The target moved: drop the batch, build again on the new tip.
    Rebuild,
    /// Red, one PR, not reproduced, every failing check known green on the tip: test
    /// it again.
    Retry,
    /// Red, one PR, reproduced or a new check or no re-test left: eject it.
    Eject {
        /// The culprit.
        number: u64,
    },
    /// Red, several PRs: land the green prefix its intermediate results show (if
    /// any), and test the first half of the suspects they leave.
    Bisect(Narrowed),
}

/// What the next batch would be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextBatch {
    /// Nobody waits.
    Empty,
    /// A partial batch waits for more PRs this long (ms).
    Wait(i64),
    /// Test these PRs (queue order).
    Form(Vec<u64>),
    /// The last suspect of a bisection, alone after every other PR of the red runs
    /// landed green, whose failure was reproduced (the same check failed on two red
    /// runs that held it): its own run would test what already failed twice, so it
    /// is the culprit without one (`BranchQueue::batch_eject`).
    Eject {
        /// The culprit.
        number: u64,
        /// The checks that failed twice.
        failing: Vec<String>,
    },
}

/// The next batch of `q`: the suspects' first half during a bisection, else the first
/// `size` PRs waiting (a partial batch waits `wait_ms` from the head's entry).
pub fn next_batch(q: &BranchQueue, cfg: &BatchConfig, now_ms: i64) -> NextBatch {
    let order = q.order();
    let active: Vec<u64> = order.iter().map(|e| e.number).collect();
    if let Some(b) = &q.bisect {
        let suspects: Vec<u64> = b
            .suspects
            .iter()
            .copied()
            .filter(|n| active.contains(n))
            .collect();
        // Every other suspect landed green (a drop or a moved target empties
        // `reproduced`), so this one's content is what failed twice.
        if let ([one], [only], false) = (
            b.suspects.as_slice(),
            suspects.as_slice(),
            b.reproduced.is_empty(),
        ) && one == only
        {
            return NextBatch::Eject {
                number: *one,
                failing: b.reproduced.clone(),
            };
        }
        if !suspects.is_empty() {
            let half = suspects.len().div_ceil(2);
            return NextBatch::Form(suspects[..half].to_vec());
        }
    }
    let Some(first) = order.first() else {
        return NextBatch::Empty;
    };
    let size = cfg.size.max(1);
    if active.len() < size && cfg.wait_ms > 0 {
        let due = first.since_ms.saturating_add(cfg.wait_ms);
        if due > now_ms {
            return NextBatch::Wait(due - now_ms);
        }
    }
    NextBatch::Form(active.into_iter().take(size).collect())
}

/// A red result of a single PR (tested alone in a batch, or the serial queue's head
/// tested on the tip), for the flaky rule.
#[derive(Debug, Clone, Copy)]
pub struct Retest<'a> {
    /// The failing checks.
    pub failing: &'a [String],
    /// The checks that passed on the target's tip.
    pub tip_green: &'a BTreeSet<String>,
    /// Checks that already failed on a red run that held the PR.
    pub failed_before: &'a [String],
    /// Re-tests of this content so far.
    pub retries: u32,
    /// `merge_queue_flaky_retries`.
    pub max: u32,
}

impl Retest<'_> {
    /// Whether the PR is tested again instead of ejected: every failing check passed
    /// on the tip (a check the tip does not know is a new test, never re-tested), none
    /// failed before (failed twice: a flake does that with probability f², so it is
    /// the culprit without another run), and re-tests are left.
    pub fn wanted(&self) -> bool {
        let reproduced = self.failing.iter().any(|f| self.failed_before.contains(f));
        let known =
            !self.failing.is_empty() && self.failing.iter().all(|f| self.tip_green.contains(f));
        !reproduced && known && self.retries < self.max
    }
}

/// What the CI result `ci` of the batch under test means, with the target's tip now.
pub fn decide(batch: &Batch, cfg: &BatchConfig, ci: &BatchCi, tip: &Sha) -> BatchDecision {
    if *tip != batch.base {
        return BatchDecision::Rebuild;
    }
    match ci {
        BatchCi::Pending => BatchDecision::Wait,
        BatchCi::Green => BatchDecision::Land,
        BatchCi::Red {
            failing,
            tip_green,
            steps,
        } => {
            // Several PRs: their parts are tested anyway, which re-tests them.
            let [one] = batch.prs.as_slice() else {
                let steps: &[StepCi] = match cfg.step_results {
                    true => steps,
                    false => &[],
                };
                return BatchDecision::Bisect(narrow(batch.prs.len(), steps));
            };
            let retest = Retest {
                failing,
                tip_green,
                failed_before: &batch.failed_before,
                retries: batch.retries,
                max: cfg.flaky_retries,
            };
            match retest.wanted() {
                true => BatchDecision::Retry,
                false => BatchDecision::Eject { number: one.number },
            }
        }
    }
}

impl BranchQueue {
    /// Starts a batch of `prs` at the target's tip `base` (led by the queue's head). A
    /// bisection none of whose suspects is in it is over (every suspect left the queue:
    /// [`next_batch`] forms from the suspects while one waits), so what it knew, its
    /// reproduced failures above all, never reaches PRs it did not test.
    pub fn start_batch(&mut self, prs: Vec<BatchPr>, base: Sha, now_ms: i64) {
        if let Some(bi) = &self.bisect
            && !prs.iter().any(|p| bi.suspects.contains(&p.number))
        {
            self.bisect = None;
        }
        self.open_batch(prs, base, now_ms);
    }

    /// [`Self::start_batch`] within the bisection as it is (a green prefix of a red
    /// batch landing while its suspects wait).
    fn open_batch(&mut self, prs: Vec<BatchPr>, base: Sha, now_ms: i64) {
        let id = self.next_batch.max(1);
        self.next_batch = id + 1;
        let bisecting = self.bisect.is_some();
        // Only PRs all inside the bisection's red runs share their failures.
        let failed_before = match &self.bisect {
            Some(bi) if prs.iter().all(|p| bi.suspects.contains(&p.number)) => bi.failing.clone(),
            _ => Vec::new(),
        };
        self.batch = Some(Batch {
            id,
            base,
            prs,
            built: 0,
            tip: None,
            stage: BatchStage::Building,
            retries: 0,
            bisecting,
            failed_before,
            failing: Vec::new(),
            started_ms: now_ms,
            landing_pr: None,
            helpers: std::collections::BTreeMap::new(),
            steps: Vec::new(),
            made_at: None,
        });
    }

    /// The next PR of the batch is merged into its branch, whose tip is now `step`.
    pub fn batch_merged_one(&mut self, step: Sha) {
        if let Some(b) = &mut self.batch {
            b.built = (b.built + 1).min(b.prs.len());
            b.steps.truncate(b.built.saturating_sub(1));
            b.steps.push(step);
        }
    }

    /// PR `number` conflicted while the batch was built: it is parked (`conflict`)
    /// and the batch goes on without it (an empty batch ends).
    pub fn batch_conflict(&mut self, number: u64) {
        if let Some(b) = &mut self.batch {
            b.prs.retain(|p| p.number != number);
            b.built = b.built.min(b.prs.len());
            b.steps.truncate(b.built);
        }
        if let Some(bi) = &mut self.bisect {
            bi.suspects.retain(|n| *n != number);
            bi.reproduced.clear();
        }
        self.park_by_queue(number, Ejection::Conflict);
        if self.batch.as_ref().is_some_and(|b| b.prs.is_empty()) {
            self.end_batch();
        }
    }

    /// The batch is built: CI tests `tip`.
    pub fn batch_built(&mut self, tip: Sha) {
        if let Some(b) = &mut self.batch {
            b.tip = Some(tip);
            b.stage = BatchStage::Testing;
            self.stats.batches_tested += 1;
            if b.retries == 0 && !b.bisecting {
                self.stats.batches_first_tested += 1;
            }
            self.stats.ci_runs += 1;
        }
    }

    /// Green on its base: landing starts (written before the fast-forward, so a
    /// restart finishes the landing instead of testing again).
    pub fn batch_landing(&mut self) {
        if let Some(b) = &mut self.batch {
            b.stage = BatchStage::Landing;
        }
    }

    /// PR `number`'s helper PR into the batch branch is `helper`.
    pub fn batch_helper(&mut self, number: u64, helper: u64) {
        if let Some(b) = &mut self.batch {
            b.helpers.insert(number, helper);
        }
    }

    /// The landing PR `number` exists.
    pub fn batch_landing_pr(&mut self, number: u64) {
        if let Some(b) = &mut self.batch {
            b.landing_pr = Some(number);
        }
    }

    /// The batch landed and its PRs are marked merged: they leave the queue
    /// (their records' own `Leave` ops find them gone), and the counters move.
    pub fn batch_landed(&mut self, now_ms: i64) {
        let Some(b) = self.batch.clone() else {
            return;
        };
        if b.retries == 0 && !b.bisecting {
            self.stats.batches_first_pass_green += 1;
        }
        if b.retries > 0 {
            self.count_flake(&b.failing);
        }
        for n in b.numbers() {
            self.depart_merged(n, now_ms);
        }
        if let Some(bi) = &mut self.bisect {
            bi.suspects
                .retain(|n| !b.prs.iter().any(|p| p.number == *n));
            if bi.suspects.is_empty() {
                // Every part of the red batch was green: a flake, not a culprit.
                let failing = bi.failing.clone();
                self.bisect = None;
                self.count_flake(&failing);
            }
        }
        self.end_batch();
    }

    /// Red, one PR, known checks, not reproduced: the same PR again on a new branch.
    pub fn batch_retry(&mut self, failing: Vec<String>, base: Sha, now_ms: i64) {
        let Some(old) = self.batch.clone() else {
            return;
        };
        self.end_batch();
        let prs = old.prs.clone();
        self.start_batch(prs, base, now_ms);
        self.stats.flaky_retries += 1;
        if let Some(b) = &mut self.batch {
            b.retries = old.retries + 1;
            b.bisecting = old.bisecting;
            b.failing = match old.failing.is_empty() {
                true => failing,
                false => old.failing,
            };
        }
    }

    /// Red with several PRs (`failing` on the whole batch), narrowed by its
    /// intermediate results `n` ([`narrow`]): the green prefix `..n.green` lands next
    /// (a batch of its own, its branch made at that intermediate commit, no new run),
    /// the PRs `n.green..n.red` are the suspects (the first half is tested next), and
    /// the PRs after `n.red` wait for the bisection to end. A check that failed on two
    /// red runs holding every suspect (an enclosing one, or prefix `n.red` and the
    /// whole batch) is reproduced.
    pub fn batch_bisect(&mut self, failing: Vec<String>, n: Narrowed, now_ms: i64) {
        let Some(b) = self.batch.clone() else {
            return;
        };
        let failing = match b.failing.is_empty() {
            true => failing,
            false => b.failing.clone(),
        };
        let numbers = b.numbers();
        let red = n.red.min(numbers.len());
        let green = n.green.min(red.saturating_sub(1));
        let suspects = numbers[green..red].to_vec();
        let mut twice: Vec<String> = Vec::new();
        for f in &failing {
            let enclosing = b.failed_before.contains(f);
            let on_prefix = red < numbers.len() && n.red_failing.contains(f);
            if (enclosing || on_prefix) && !twice.contains(f) {
                twice.push(f.clone());
            }
        }
        match &mut self.bisect {
            Some(bi) => {
                bi.suspects = suspects;
                for f in twice {
                    if !bi.reproduced.contains(&f) {
                        bi.reproduced.push(f);
                    }
                }
                for f in failing {
                    if !bi.failing.contains(&f) {
                        bi.failing.push(f);
                    }
                }
            }
            None => {
                self.bisect = Some(Bisection {
                    suspects,
                    tested_with: numbers,
                    failing,
                    reproduced: twice,
                });
            }
        }
        // Not a re-test that saved a PR: only the checks are counted.
        self.count_flaky_checks(&n.flaky);
        self.end_batch();
        let made_at = green.checked_sub(1).and_then(|i| b.steps.get(i)).cloned();
        if let Some(tip) = made_at {
            // The green prefix lands on the same base: tested there by CI already.
            self.open_batch(b.prs[..green].to_vec(), b.base.clone(), now_ms);
            if let Some(x) = &mut self.batch {
                x.built = green;
                x.steps = b.steps[..green].to_vec();
                x.tip = Some(tip.clone());
                x.made_at = Some(tip);
                x.stage = BatchStage::Landing;
                x.bisecting = true;
            }
        }
    }

    /// Red with one PR: it is the culprit, parked `ci-failed`; the bisection ends and
    /// the others are batched again in their order. Returns the PRs it was tested
    /// with (the rest of the red batch that started the bisection).
    pub fn batch_eject(&mut self, number: u64) -> Vec<u64> {
        let with = self
            .bisect
            .take()
            .map(|b| b.tested_with)
            .unwrap_or_default()
            .into_iter()
            .filter(|n| *n != number)
            .collect();
        self.park_by_queue(number, Ejection::CiFailed);
        self.end_batch();
        with
    }

    /// PR `number` of the batch was closed, pushed to or parked since it was batched:
    /// what was tested is no longer what it asks to merge. The batch is dropped (never
    /// landed) and the next one is built without it.
    pub fn batch_drop(&mut self, number: u64) {
        if let Some(bi) = &mut self.bisect {
            bi.suspects.retain(|n| *n != number);
            bi.tested_with.retain(|n| *n != number);
            bi.reproduced.clear();
        }
        self.end_batch();
    }

    /// The PRs of the batch no longer waiting in the queue (parked or gone).
    pub fn batch_left(&self) -> Vec<u64> {
        let Some(b) = &self.batch else {
            return Vec::new();
        };
        let active: Vec<u64> = self.order().iter().map(|e| e.number).collect();
        b.numbers()
            .into_iter()
            .filter(|n| !active.contains(n))
            .collect()
    }

    /// The target moved under the batch: it is dropped (its branch deleted) and the
    /// next advance builds a new one on the new tip.
    pub fn batch_rebuild(&mut self) {
        if let Some(bi) = &mut self.bisect {
            // The lone suspect's content on the new tip has not failed yet.
            bi.reproduced.clear();
        }
        self.end_batch();
    }

    /// The serial queue's head (`merge_queue_batch_size` = 1) failed `failing` on top
    /// of the tip and [`Retest::wanted`] says re-test: it is tested again as a batch of
    /// one on a new branch at `base` (a new commit of the same content, so CI runs
    /// again), with its re-test spent and its failure remembered, so a second red of
    /// the same check ejects it and a green lands it as a flake.
    pub fn start_retest(&mut self, pr: BatchPr, base: Sha, failing: Vec<String>, now_ms: i64) {
        self.end_batch();
        self.start_batch(vec![pr], base, now_ms);
        self.stats.flaky_retries += 1;
        if let Some(b) = &mut self.batch {
            b.retries = 1;
            b.failed_before = failing.clone();
            b.failing = failing;
        }
    }

    /// The serial queue updated its head onto the tip: one CI run the queue asked
    /// for (counted like a batch's, so CI runs per merged PR compare across k).
    pub fn serial_ci_run(&mut self) {
        self.stats.ci_runs += 1;
    }

    /// Drops the batch; its branch is listed for deletion.
    pub fn end_batch(&mut self) {
        if let Some(b) = self.batch.take() {
            let name = b.branch_name(&self.branch);
            if !self.stale_branches.contains(&name) {
                self.stale_branches.push(name);
            }
        }
        self.promote();
    }

    /// A stale batch branch was deleted (or was already gone).
    pub fn branch_deleted(&mut self, name: &str) {
        self.stale_branches.retain(|b| b != name);
    }

    /// Counts a red result that turned out flaky.
    fn count_flake(&mut self, failing: &[String]) {
        self.stats.flaky_saved += 1;
        self.count_flaky_checks(failing);
    }

    /// Counts checks that failed and then passed (suspected flaky).
    fn count_flaky_checks(&mut self, failing: &[String]) {
        for f in failing {
            *self.stats.flaky_checks.entry(f.clone()).or_default() += 1;
        }
    }

    /// Parks `number` on the queue's own decision (its record parks too once told; its
    /// op version is kept so the record's next op applies).
    fn park_by_queue(&mut self, number: u64, reason: Ejection) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.number == number)
            && e.parked.is_none()
        {
            e.parked = Some(reason);
            *self.stats.ejections.entry(reason).or_default() += 1;
        }
        self.promote();
    }

    /// A batched PR landed: it leaves the queue as merged.
    fn depart_merged(&mut self, number: u64, now_ms: i64) {
        let Some(i) = self.entries.iter().position(|e| e.number == number) else {
            return;
        };
        let e = self.entries.remove(i);
        let waited = now_ms.saturating_sub(e.entered_ms).max(0);
        (self.stats).record_merge(now_ms, u64::try_from(waited).unwrap_or(0));
        self.remember_departure(number, e.op_version);
    }
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
