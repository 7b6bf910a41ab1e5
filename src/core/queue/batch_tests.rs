//! Batch rules: table tests and a property test driving whole batched queues with a
//! model CI (which PRs break it, flaky runs, base moves).

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::super::{Priority, QueueAction, QueueOp};
use super::*;

fn sha(n: u64) -> Sha {
    format!("{n:040x}").parse().unwrap()
}

fn cfg(size: usize) -> BatchConfig {
    BatchConfig {
        size,
        wait_ms: 0,
        flaky_retries: 1,
        step_results: true,
    }
}

fn queue_of(numbers: &[u64]) -> BranchQueue {
    let mut q = BranchQueue::new("main");
    for n in numbers {
        let op = QueueOp {
            branch: "main".into(),
            number: *n,
            version: 1,
            action: QueueAction::Join {
                priority: Priority::Normal,
            },
        };
        q.apply(&op, 0);
    }
    q
}

fn pr(n: u64) -> BatchPr {
    BatchPr {
        number: n,
        head: sha(100 + n),
        head_ref: format!("pr-{n}"),
    }
}

/// Forms the next batch at `base`, builds it and returns its PRs.
fn form(q: &mut BranchQueue, c: &BatchConfig, base: &Sha) -> Vec<u64> {
    let NextBatch::Form(numbers) = next_batch(q, c, 0) else {
        return Vec::new();
    };
    q.start_batch(numbers.iter().map(|n| pr(*n)).collect(), base.clone(), 0);
    for n in &numbers {
        q.batch_merged_one(sha(500 + n));
    }
    q.batch_built(sha(999));
    numbers
}

fn red(failing: &[&str], tip_green: &[&str]) -> BatchCi {
    BatchCi::Red {
        failing: failing.iter().map(|s| s.to_string()).collect(),
        tip_green: tip_green.iter().map(|s| s.to_string()).collect(),
        steps: Vec::new(),
    }
}

/// A bisection of the whole red batch of `n` (no intermediate result used).
fn whole(n: usize) -> Narrowed {
    Narrowed {
        red: n,
        ..Narrowed::default()
    }
}

#[test]
fn three_prs_are_tested_together_and_land_together() {
    let mut q = queue_of(&[1, 2, 3, 4]);
    let c = cfg(3);
    let base = sha(1);
    assert_eq!(form(&mut q, &c, &base), vec![1, 2, 3]);
    let b = q.batch.clone().unwrap();
    assert_eq!(b.branch_name("main"), "shepherd/batch/main/1");
    assert_eq!(
        decide(&b, &c, &BatchCi::Pending, &base),
        BatchDecision::Wait
    );
    assert_eq!(decide(&b, &c, &BatchCi::Green, &base), BatchDecision::Land);
    q.batch_landing();
    q.batch_landed(10);
    assert_eq!(q.order().iter().map(|e| e.number).collect::<Vec<_>>(), [4]);
    assert_eq!(q.head, Some(4));
    assert_eq!(q.stats.merged, 3);
    assert_eq!(
        (
            q.stats.batches_tested,
            q.stats.batches_first_pass_green,
            q.stats.ci_runs
        ),
        (1, 1, 1)
    );
    assert_eq!(q.stale_branches, ["shepherd/batch/main/1"]);
    q.branch_deleted("shepherd/batch/main/1");
    assert!(q.stale_branches.is_empty());
}

#[test]
fn a_green_batch_on_a_moved_tip_is_never_landed() {
    let mut q = queue_of(&[1, 2]);
    let c = cfg(2);
    form(&mut q, &c, &sha(1));
    let b = q.batch.clone().unwrap();
    assert_eq!(
        decide(&b, &c, &BatchCi::Green, &sha(2)),
        BatchDecision::Rebuild
    );
    q.batch_rebuild();
    assert!(q.batch.is_none());
    assert_eq!(form(&mut q, &c, &sha(2)), vec![1, 2]);
    assert_eq!(q.batch.as_ref().unwrap().id, 2);
}

/// A red batch is bisected at once, never re-tested whole (its parts re-test it), even
/// with re-tests left and a check the tip knows; the culprit alone failing the same
/// check again has failed twice and is ejected without a re-test.
#[test]
fn a_red_batch_is_bisected_until_the_culprit_is_alone() {
    let mut q = queue_of(&[1, 2, 3, 4, 5]);
    let c = cfg(4);
    let base = sha(1);
    assert_eq!(form(&mut q, &c, &base), vec![1, 2, 3, 4]);
    let ci = red(&["ci"], &["ci"]);
    let b = q.batch.clone().unwrap();
    assert_eq!(
        decide(&b, &c, &ci, &base),
        BatchDecision::Bisect(whole(b.prs.len()))
    );
    let n = q.batch.as_ref().map_or(0, |b| b.prs.len());
    q.batch_bisect(vec!["ci".into()], whole(n), 0);
    // First half green: lands; the culprit is among 3 and 4.
    assert_eq!(form(&mut q, &c, &base), vec![1, 2]);
    q.batch_landed(5);
    let base = sha(2);
    assert_eq!(form(&mut q, &c, &base), vec![3]);
    let b = q.batch.clone().unwrap();
    assert_eq!(b.failed_before, ["ci"]);
    assert_eq!(
        decide(&b, &c, &ci, &base),
        BatchDecision::Eject { number: 3 }
    );
    assert_eq!(q.batch_eject(3), vec![1, 2, 4]);
    assert_eq!(q.stats.flaky_retries, 0);
    assert_eq!(q.stats.ci_runs, 3);
    assert_eq!(q.stats.ejections[&Ejection::CiFailed], 1);
    assert!(q.bisect.is_none());
    // The others are batched again, in their order.
    assert_eq!(form(&mut q, &c, &base), vec![4, 5]);
    assert_eq!(q.stats.batches_first_pass_green, 0);
    assert_eq!(q.stats.flaky_saved, 0);
}

/// A PR tested alone (no enclosing red run) whose failing checks passed on the tip is
/// re-tested once; green, it lands and the check is counted flaky; a second red would
/// eject it.
#[test]
fn a_single_pr_flake_is_retried_once_and_counted_flaky() {
    let mut q = queue_of(&[1]);
    let c = cfg(2);
    let base = sha(1);
    form(&mut q, &c, &base);
    let ci = red(&["ci/test"], &["ci/test", "lint"]);
    let b = q.batch.clone().unwrap();
    assert_eq!(decide(&b, &c, &ci, &base), BatchDecision::Retry);
    q.batch_retry(vec!["ci/test".into()], base.clone(), 0);
    let b = q.batch.clone().unwrap();
    assert_eq!((b.id, b.retries, b.numbers()), (2, 1, vec![1]));
    assert_eq!(q.stale_branches, ["shepherd/batch/main/1"]);
    // A second red is no longer retried: the PR failed twice.
    assert_eq!(
        decide(&b, &c, &ci, &base),
        BatchDecision::Eject { number: 1 }
    );
    q.batch_merged_one(sha(600));
    q.batch_built(sha(5));
    q.batch_landed(0);
    assert_eq!(q.stats.flaky_retries, 1);
    assert_eq!(q.stats.flaky_saved, 1);
    assert_eq!(q.stats.flaky_checks["ci/test"], 1);
    assert_eq!(q.stats.batches_first_pass_green, 0);
    assert!(q.stats.ejections.is_empty());
}

#[test]
fn a_new_check_is_never_retried() {
    let mut q = queue_of(&[1]);
    let c = cfg(2);
    form(&mut q, &c, &sha(1));
    let b = q.batch.clone().unwrap();
    // `new-test` does not exist on the tip (only `ci` passed there).
    let ci = red(&["ci", "new-test"], &["ci"]);
    assert_eq!(
        decide(&b, &c, &ci, &sha(1)),
        BatchDecision::Eject { number: 1 }
    );
    // Nothing known on the tip at all: no retry either.
    assert_eq!(
        decide(&b, &c, &red(&["ci"], &[]), &sha(1)),
        BatchDecision::Eject { number: 1 }
    );
}

/// During a bisection, a PR alone failing only checks that did not fail in the red
/// runs that held it has not reproduced anything: it is re-tested (a flake of its
/// own), and saved when green; the bisection then ends with every part green.
#[test]
fn a_bisected_pr_failing_another_check_is_re_tested_and_saved() {
    let mut q = queue_of(&[1, 2]);
    let c = cfg(2);
    let base = sha(1);
    form(&mut q, &c, &base);
    let b = q.batch.clone().unwrap();
    let ci = red(&["ci"], &["ci", "lint"]);
    assert_eq!(
        decide(&b, &c, &ci, &base),
        BatchDecision::Bisect(whole(b.prs.len()))
    );
    let n = q.batch.as_ref().map_or(0, |b| b.prs.len());
    q.batch_bisect(vec!["ci".into()], whole(n), 0);
    assert_eq!(form(&mut q, &c, &base), vec![1]);
    let b = q.batch.clone().unwrap();
    let lint = red(&["lint"], &["ci", "lint"]);
    assert_eq!(decide(&b, &c, &lint, &base), BatchDecision::Retry);
    q.batch_retry(vec!["lint".into()], base.clone(), 0);
    q.batch_merged_one(sha(600));
    q.batch_built(sha(5));
    // The re-test is still inside the bisection: `ci` failing now would reproduce.
    let b = q.batch.clone().unwrap();
    assert_eq!(
        decide(&b, &c, &ci, &base),
        BatchDecision::Eject { number: 1 }
    );
    q.batch_landed(0);
    assert_eq!(form(&mut q, &c, &sha(2)), vec![2]);
    q.batch_landed(0);
    assert!(q.bisect.is_none());
    assert_eq!((q.stats.flaky_retries, q.stats.merged), (1, 2));
    assert_eq!(
        (q.stats.flaky_checks["lint"], q.stats.flaky_checks["ci"]),
        (1, 1)
    );
    assert!(q.stats.ejections.is_empty());
}

/// A red batch whose halves are all green was a flake: nobody is ejected and no run
/// is spent re-testing the whole batch.
#[test]
fn a_bisection_with_every_part_green_is_a_flake() {
    let mut q = queue_of(&[1, 2]);
    let c = cfg(2);
    form(&mut q, &c, &sha(1));
    let b = q.batch.clone().unwrap();
    assert_eq!(
        decide(&b, &c, &red(&["ci"], &["ci"]), &sha(1)),
        BatchDecision::Bisect(whole(b.prs.len()))
    );
    let n = q.batch.as_ref().map_or(0, |b| b.prs.len());
    q.batch_bisect(vec!["ci".into()], whole(n), 0);
    assert_eq!(form(&mut q, &c, &sha(1)), vec![1]);
    q.batch_landed(0);
    assert_eq!(form(&mut q, &c, &sha(2)), vec![2]);
    q.batch_landed(0);
    assert!(q.bisect.is_none());
    assert_eq!(q.stats.flaky_saved, 1);
    assert_eq!(q.stats.flaky_checks["ci"], 1);
    assert_eq!((q.stats.flaky_retries, q.stats.ci_runs), (0, 3));
    assert!(q.stats.ejections.is_empty());
}

#[test]
fn a_conflicting_pr_is_parked_and_the_batch_goes_on() {
    let mut q = queue_of(&[1, 2, 3]);
    let c = cfg(3);
    let NextBatch::Form(numbers) = next_batch(&q, &c, 0) else {
        panic!("a batch")
    };
    q.start_batch(numbers.iter().map(|n| pr(*n)).collect(), sha(1), 0);
    q.batch_merged_one(sha(600));
    q.batch_conflict(2);
    let b = q.batch.clone().unwrap();
    assert_eq!((b.numbers(), b.built), (vec![1, 3], 1));
    assert_eq!(q.stats.ejections[&Ejection::Conflict], 1);
    assert_eq!(q.parked()[0].number, 2);
    // A batch whose every PR conflicted ends, its branch listed for deletion.
    q.batch_conflict(1);
    q.batch_conflict(3);
    assert!(q.batch.is_none());
    assert_eq!(q.stale_branches, ["shepherd/batch/main/1"]);
}

#[test]
fn a_partial_batch_waits_for_more_prs() {
    let q = queue_of(&[1, 2]);
    let c = BatchConfig {
        wait_ms: 30_000,
        ..cfg(4)
    };
    assert_eq!(next_batch(&q, &c, 10_000), NextBatch::Wait(20_000));
    assert_eq!(next_batch(&q, &c, 30_000), NextBatch::Form(vec![1, 2]));
    assert_eq!(next_batch(&queue_of(&[]), &c, 0), NextBatch::Empty);
    assert!(is_batch_branch("shepherd/batch/main/3") && !is_batch_branch("main"));
}

/// The last suspect of a bisection, left after the PRs before it landed green, whose
/// check failed on two red runs that held it (the batch and its red half), is ejected
/// without a run of its own; once a suspect leaves otherwise (closed), the lone one
/// is tested instead.
#[test]
fn a_lone_suspect_whose_failure_was_reproduced_is_ejected_without_a_run() {
    for close_first in [false, true] {
        let mut q = queue_of(&[1, 2, 3, 4, 5]);
        let c = cfg(4);
        let base = sha(1);
        let ci = red(&["ci"], &["ci"]);
        assert_eq!(form(&mut q, &c, &base), vec![1, 2, 3, 4]);
        let n = q.batch.as_ref().map_or(0, |b| b.prs.len());
        q.batch_bisect(vec!["ci".into()], whole(n), 0);
        assert_eq!(form(&mut q, &c, &base), vec![1, 2]);
        let b = q.batch.clone().unwrap();
        assert_eq!(
            decide(&b, &c, &ci, &base),
            BatchDecision::Bisect(whole(b.prs.len()))
        );
        let n = q.batch.as_ref().map_or(0, |b| b.prs.len());
        q.batch_bisect(vec!["ci".into()], whole(n), 0);
        assert_eq!(q.bisect.as_ref().unwrap().reproduced, ["ci"]);
        assert_eq!(form(&mut q, &c, &base), vec![1]);
        if close_first {
            // #1 is closed before it lands: #2 alone is no longer what failed.
            q.batch_drop(1);
            assert_eq!(form(&mut q, &c, &base), vec![2]);
            continue;
        }
        q.batch_landed(5);
        assert_eq!(
            next_batch(&q, &c, 0),
            NextBatch::Eject {
                number: 2,
                failing: vec!["ci".into()]
            }
        );
        assert_eq!(q.batch_eject(2), vec![1, 3, 4]);
        assert_eq!(q.stats.ci_runs, 3, "no run of #2 alone");
        assert_eq!(q.stats.ejections[&Ejection::CiFailed], 1);
        assert_eq!(form(&mut q, &c, &sha(2)), vec![3, 4, 5]);
    }
}

/// The serial queue's head red on top of the tip: re-tested once (a batch of one)
/// when every failing check passed on the tip; a check the tip does not know is never
/// re-tested; the re-test red on the same check ejects it, green lands it as a flake.
#[test]
fn the_serial_head_is_re_tested_once_unless_its_check_is_new() {
    let green: BTreeSet<String> = ["ci".to_string(), "lint".to_string()].into();
    let ask = |failing: &[String], max| {
        Retest {
            failing,
            tip_green: &green,
            failed_before: &[],
            retries: 0,
            max,
        }
        .wanted()
    };
    let ci = vec!["ci".to_string()];
    assert!(ask(&ci, 1));
    assert!(!ask(&ci, 0), "no re-tests configured");
    assert!(!ask(&["new-test".to_string()], 1), "a new test");
    assert!(!ask(&["ci".into(), "new-test".into()], 1));
    assert!(!ask(&[], 1));
    for second_green in [true, false] {
        let mut q = queue_of(&[1, 2]);
        let c = cfg(1);
        q.start_retest(pr(1), sha(1), ci.clone(), 0);
        q.batch_merged_one(sha(600));
        q.batch_built(sha(50));
        let b = q.batch.clone().unwrap();
        assert_eq!((b.numbers(), b.retries), (vec![1], 1));
        let result = match second_green {
            true => BatchCi::Green,
            false => red(&["ci"], &["ci"]),
        };
        match decide(&b, &c, &result, &sha(1)) {
            BatchDecision::Land => {
                q.batch_landed(5);
                assert_eq!(q.stats.flaky_checks.get("ci"), Some(&1));
                assert_eq!(q.stats.flaky_saved, 1);
                assert!(q.stats.ejections.is_empty());
                assert_eq!(q.head, Some(2));
            }
            BatchDecision::Eject { number } => {
                assert!(!second_green);
                assert_eq!(q.batch_eject(number), Vec::<u64>::new());
                assert_eq!(q.stats.flaky_saved, 0);
                assert_eq!(q.stats.ejections[&Ejection::CiFailed], 1);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(q.stats.flaky_retries, 1);
        assert_eq!(q.stats.ci_runs, 1, "the re-test's run");
        assert_eq!(
            q.stats.batches_first_tested, 0,
            "a re-test is no first pass"
        );
    }
}

/// What happens between two decisions of the model run.
#[derive(Debug, Clone)]
enum Step {
    /// CI finishes; a flaky run fails though nothing is broken. The intermediate
    /// commits (prefixes of 1 … k − 1 PRs): bit i of `known` says whether prefix
    /// i + 1 has a result, bit i of `prefix_flaky` whether its run flaked.
    Ci {
        flaky: bool,
        known: u8,
        prefix_flaky: u8,
    },
    /// Someone pushes to the target (the tip moves).
    BaseMoves,
    /// A PR of the batch (by index) is closed: it leaves the queue.
    Close(usize),
    /// A PR of the batch (by index) gets a new head: its record parks it until its
    /// CI passes again, then it joins again.
    Push(usize),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            6 => (any::<bool>(), any::<u8>(), any::<u8>()).prop_map(|(flaky, known, prefix_flaky)| {
                Step::Ci { flaky, known, prefix_flaky }
            }),
            1 => Just(Step::BaseMoves),
            1 => (0usize..6).prop_map(Step::Close),
            1 => (0usize..6).prop_map(Step::Push),
        ],
        1..120,
    )
}

proptest! {
    /// The serial head's runs under any sequence of CI results (broken or not, flaky
    /// or not, a check the tip knows or a new one): a PR is ejected only after two red
    /// runs of a known check or one of a new check; a new check is never re-tested;
    /// never more re-tests than `merge_queue_flaky_retries`; a sound PR whose runs
    /// flake at most once always lands.
    #[test]
    fn the_serial_head_is_ejected_only_after_a_reproduced_failure(
        broken in any::<bool>(),
        new_check in any::<bool>(),
        max in 0u32..3,
        flakes in prop::collection::vec(any::<bool>(), 4),
    ) {
        let check = match new_check { true => "new-test", false => "ci" };
        let tip_green: BTreeSet<String> = ["ci".to_string()].into();
        let c = BatchConfig { size: 1, wait_ms: 0, flaky_retries: max, step_results: true };
        let mut q = queue_of(&[1]);
        let mut runs = flakes.iter().map(|f| broken || *f);
        let failing = vec![check.to_string()];
        let (mut red_runs, mut landed, mut ejected) = (0, false, false);
        // The serial run on the tip.
        if runs.next().unwrap() {
            red_runs += 1;
            let retest = Retest { failing: &failing, tip_green: &tip_green, failed_before: &[], retries: 0, max };
            match retest.wanted() {
                true => q.start_retest(pr(1), sha(1), failing.clone(), 0),
                false => ejected = true,
            }
        } else {
            landed = true;
        }
        while let Some(b) = q.batch.clone() {
            q.batch_merged_one(sha(600));
            q.batch_built(sha(77));
            let is_red = runs.next().unwrap_or(broken);
            red_runs += u32::from(is_red);
            let ci = match is_red { true => red(&[check], &["ci"]), false => BatchCi::Green };
            match decide(&b, &c, &ci, &sha(1)) {
                BatchDecision::Land => { q.batch_landed(1); landed = true; }
                BatchDecision::Retry => q.batch_retry(failing.clone(), sha(1), 0),
                BatchDecision::Eject { number } => { q.batch_eject(number); ejected = true; }
                other => prop_assert!(false, "{:?}", other),
            }
        }
        prop_assert!(landed != ejected);
        prop_assert!(q.stats.flaky_retries <= u64::from(max));
        if new_check || max == 0 {
            prop_assert_eq!(q.stats.flaky_retries, 0);
        }
        if ejected && !new_check && max > 0 {
            prop_assert!(red_runs >= 2, "ejected after one red run");
        }
        if !broken && flakes.iter().filter(|f| **f).count() <= 1 && !new_check && max > 0 {
            prop_assert!(landed, "a sound PR flaking once was ejected");
        }
        prop_assert!(!(landed && broken), "a broken PR landed");
    }

    /// G1–G3 for batches: a batch lands only green on the tip it replaces (the tested
    /// commit is the landed one); with deterministic CI no broken PR lands and no PR
    /// that breaks nothing is ejected; with flaky runs an innocent PR is ejected only
    /// after two red runs that held it (a flake twice: f²), and never a
    /// batch of several is re-tested whole; every PR ends landed, ejected or still
    /// queued (none lost).
    #[test]
    fn batches_land_only_tested_green_tips_and_eject_only_culprits(
        n in 1u64..10,
        size in 1usize..6,
        bad in prop::collection::btree_set(1u64..10, 0..3),
        flaky_on in any::<bool>(),
        steps in steps(),
    ) {
        let c = cfg(size);
        let mut q = queue_of(&(1..=n).collect::<Vec<_>>());
        let mut tip = 1u64;
        let (mut landed, mut ejected) = (BTreeSet::new(), BTreeSet::new());
        // Red runs that held each PR.
        let mut reds: std::collections::BTreeMap<u64, u32> = Default::default();
        let mut closed = BTreeSet::new();
        let mut stale = BTreeSet::new();
        let mut version = 10;
        for step in steps {
            version += 1;
            if q.batch.is_none() {
                match next_batch(&q, &c, 0) {
                    NextBatch::Form(numbers) => {
                        q.start_batch(numbers.iter().map(|x| pr(*x)).collect(), sha(tip), 0);
                        for x in &numbers { q.batch_merged_one(sha(20_000 + 100 * tip + x)); }
                        q.batch_built(sha(10_000 + tip));
                    }
                    NextBatch::Eject { number, failing } => {
                        prop_assert!(!failing.is_empty());
                        let twice = reds.get(&number).copied().unwrap_or(0) >= 2;
                        prop_assert!(bad.contains(&number) || twice, "innocent #{} ejected unrun", number);
                        ejected.insert(number);
                        q.batch_eject(number);
                        continue;
                    }
                    NextBatch::Wait(_) | NextBatch::Empty => break,
                }
            }
            let b = q.batch.clone().unwrap();
            let broken = b.prs.iter().any(|p| bad.contains(&p.number));
            let op = |number, version, action| QueueOp { branch: "main".into(), number, version, action };
            if b.stage == BatchStage::Landing {
                // A green prefix of a red batch: the executor lands it as it lands any
                // batch (unless a PR of it changed or the target moved).
                if matches!(step, Step::BaseMoves) {
                    tip += 1;
                }
                if let Some(gone) = q.batch_left().first().copied() {
                    q.batch_drop(gone);
                } else if let Some(pushed) = b.numbers().into_iter().find(|x| stale.contains(x)) {
                    stale.remove(&pushed);
                    q.batch_drop(pushed);
                } else if b.base != sha(tip) {
                    q.batch_rebuild();
                } else {
                    prop_assert!(b.numbers().iter().all(|x| !closed.contains(x)), "a closed PR landed");
                    prop_assert!(!broken, "a broken prefix landed: {:?}", b.numbers());
                    prop_assert!(b.made_at.is_some() && b.made_at == b.tip);
                    prop_assert_eq!(b.steps.last(), b.tip.as_ref(), "the tested step is the landed one");
                    landed.extend(b.numbers());
                    q.batch_landed(0);
                    tip += 1;
                }
                continue;
            }
            let ci = match step {
                Step::BaseMoves => { tip += 1; BatchCi::Pending }
                Step::Close(i) => {
                    let number = b.prs[i % b.prs.len()].number;
                    closed.insert(number);
                    q.apply(&op(number, version, QueueAction::Leave { reason: super::super::Departure::Closed }), 0);
                    BatchCi::Pending
                }
                Step::Push(i) if !closed.contains(&b.prs[i % b.prs.len()].number) => {
                    let number = b.prs[i % b.prs.len()].number;
                    q.apply(&op(number, version, QueueAction::Park { reason: Ejection::NotReady }), 0);
                    q.apply(&op(number, version + 1, QueueAction::Join { priority: Priority::Normal }), 0);
                    version += 1;
                    // What was tested is no longer its head.
                    stale.insert(number);
                    BatchCi::Pending
                }
                Step::Push(_) => BatchCi::Pending,
                Step::Ci { flaky, known, prefix_flaky } => {
                    let is_red = broken || (flaky && flaky_on);
                    for x in b.numbers().into_iter().filter(|_| is_red) {
                        *reds.entry(x).or_default() += 1;
                    }
                    // Each intermediate commit's run (the runs happened either way; a
                    // red one held the PRs of its prefix).
                    let mut steps = Vec::new();
                    for i in 1..b.prs.len() {
                        let bit = 1u8 << (i - 1).min(7);
                        let prefix = &b.prs[..i];
                        let red_run = prefix.iter().any(|p| bad.contains(&p.number))
                            || (flaky_on && prefix_flaky & bit != 0);
                        if red_run {
                            for p in prefix {
                                *reds.entry(p.number).or_default() += 1;
                            }
                        }
                        steps.push(match (known & bit != 0, red_run) {
                            (false, _) => StepCi::Unknown,
                            (true, false) => StepCi::Green,
                            (true, true) => StepCi::Red { failing: vec!["ci".into()] },
                        });
                    }
                    match is_red {
                        true => BatchCi::Red {
                            failing: vec!["ci".into()],
                            tip_green: ["ci".to_string()].into(),
                            steps,
                        },
                        false => BatchCi::Green,
                    }
                }
            };
            match decide(&b, &c, &ci, &sha(tip)) {
                BatchDecision::Wait => {}
                BatchDecision::Land if !q.batch_left().is_empty() => {
                    let gone = q.batch_left()[0];
                    q.batch_drop(gone);
                }
                BatchDecision::Land if b.numbers().iter().any(|x| stale.contains(x)) => {
                    let pushed = *b.numbers().iter().find(|x| stale.contains(x)).unwrap();
                    stale.remove(&pushed);
                    q.batch_drop(pushed);
                }
                BatchDecision::Land => {
                    prop_assert!(b.numbers().iter().all(|x| !closed.contains(x)), "a closed PR landed");
                    prop_assert!(b.numbers().iter().all(|x| !stale.contains(x)), "an untested head landed");
                    prop_assert_eq!(&b.base, &sha(tip));
                    prop_assert_eq!(&ci, &BatchCi::Green);
                    prop_assert!(!broken, "a broken batch landed: {:?}", b.numbers());
                    landed.extend(b.numbers());
                    q.batch_landed(0);
                    tip += 1;
                }
                BatchDecision::Rebuild => q.batch_rebuild(),
                BatchDecision::Retry => {
                    prop_assert_eq!(b.prs.len(), 1, "a batch of several re-tested whole");
                    q.batch_retry(vec!["ci".into()], sha(tip), 0)
                }
                BatchDecision::Bisect(narrowed) => {
                    prop_assert!(b.prs.len() > 1);
                    prop_assert!(narrowed.green < narrowed.red && narrowed.red <= b.prs.len());
                    q.batch_bisect(vec!["ci".into()], narrowed, 0);
                }
                BatchDecision::Eject { number } => {
                    prop_assert_eq!(b.prs.len(), 1);
                    let twice = reds.get(&number).copied().unwrap_or(0) >= 2;
                    prop_assert!(bad.contains(&number) || twice, "innocent #{} ejected", number);
                    ejected.insert(number);
                    q.batch_eject(number);
                }
            }
            prop_assert!(q.head.is_none() || q.order()[0].number == q.head.unwrap());
        }
        prop_assert!(landed.is_disjoint(&ejected));
        let queued: BTreeSet<u64> = q.entries.iter().map(|e| e.number).collect();
        for x in 1..=n {
            let places = [landed.contains(&x), queued.contains(&x), closed.contains(&x)];
            prop_assert!(
                places.iter().filter(|p| **p).count() == 1,
                "#{} lost or twice: landed {:?} queued {:?} closed {:?}", x, landed, queued, closed
            );
        }
        prop_assert_eq!(q.stats.merged, landed.len() as u64);
    }
}

fn step_red() -> StepCi {
    StepCi::Red {
        failing: vec!["ci".into()],
    }
}

/// The longest green prefix lands, the first red one above it bounds the suspects;
/// unknown results are skipped, and a red prefix below a green one was a flake.
#[test]
fn intermediate_results_narrow_a_red_batch() {
    use StepCi::{Green, Unknown};
    let cases: Vec<(Vec<StepCi>, (usize, usize, usize))> = vec![
        // (steps of prefixes 1..n-1 of a batch of 4, (green, red, flaky checks))
        (vec![Green, Green, step_red()], (2, 3, 0)),
        (vec![Green, Unknown, Unknown], (1, 4, 0)),
        (vec![Unknown, Unknown, Unknown], (0, 4, 0)),
        (vec![step_red(), step_red(), step_red()], (0, 1, 0)),
        (vec![Green, Green, Green], (3, 4, 0)),
        (vec![step_red(), Green, Unknown], (2, 4, 1)),
        (vec![Unknown, step_red(), Green], (3, 4, 1)),
        (vec![], (0, 4, 0)),
    ];
    for (steps, (green, red, flaky)) in cases {
        let n = narrow(4, &steps);
        assert_eq!(
            (n.green, n.red, n.flaky.len()),
            (green, red, flaky),
            "{steps:?}"
        );
        assert_eq!(n.red_failing.is_empty(), red == 4, "{steps:?}");
    }
    // Results beyond the batch's own prefixes are ignored.
    assert_eq!(narrow(2, &[StepCi::Green, StepCi::Green]).green, 1);
}

/// A red batch of 4 whose culprit is #3 (prefixes 1 and 2 green, 3 red): #1 and #2
/// land at once on the commit CI passed (a batch of their own made at that step, no
/// new run), #3 failed on two runs that held it and is ejected without one, and #4
/// waits for the next batch.
#[test]
fn a_green_prefix_lands_and_a_reproduced_culprit_is_ejected_without_a_run() {
    let mut q = queue_of(&[1, 2, 3, 4, 5]);
    let c = cfg(4);
    let base = sha(1);
    assert_eq!(form(&mut q, &c, &base), vec![1, 2, 3, 4]);
    let b = q.batch.clone().unwrap();
    let ci = BatchCi::Red {
        failing: vec!["ci".into()],
        tip_green: ["ci".to_string()].into(),
        steps: vec![StepCi::Green, StepCi::Green, step_red()],
    };
    let BatchDecision::Bisect(n) = decide(&b, &c, &ci, &base) else {
        panic!("a bisection")
    };
    assert_eq!((n.green, n.red), (2, 3));
    // Without `merge_queue_step_results` the whole batch is bisected.
    let off = BatchConfig {
        step_results: false,
        ..c
    };
    assert_eq!(
        decide(&b, &off, &ci, &base),
        BatchDecision::Bisect(whole(4))
    );
    q.batch_bisect(vec!["ci".into()], n, 7);
    let land = q.batch.clone().expect("the green prefix lands");
    assert_eq!(land.numbers(), [1, 2]);
    assert_eq!(land.stage, BatchStage::Landing);
    assert_eq!(land.made_at, Some(sha(502)), "the commit holding #1 and #2");
    assert_eq!(land.tip, land.made_at);
    assert_eq!(land.base, base);
    assert_eq!(land.branch_name("main"), "shepherd/batch/main/2");
    assert_eq!(q.stale_branches, ["shepherd/batch/main/1"]);
    let bi = q.bisect.clone().unwrap();
    assert_eq!(
        (bi.suspects, bi.reproduced),
        (vec![3], vec!["ci".to_string()])
    );
    q.batch_landed(9);
    assert_eq!(q.stats.merged, 2);
    assert_eq!(
        next_batch(&q, &c, 0),
        NextBatch::Eject {
            number: 3,
            failing: vec!["ci".into()]
        }
    );
    assert_eq!(q.batch_eject(3), vec![1, 2, 4]);
    assert_eq!(next_batch(&q, &c, 0), NextBatch::Form(vec![4, 5]));
    assert_eq!(
        (q.stats.ci_runs, q.stats.batches_first_pass_green),
        (1, 0),
        "one run found the culprit; a landed prefix is no first pass"
    );
}

/// The culprit last in the batch (every intermediate commit green): the prefix
/// before it lands and it is tested alone (one red run held it so far), where a
/// second red ejects it.
#[test]
fn a_culprit_last_in_its_batch_is_tested_alone_after_the_prefix_lands() {
    let mut q = queue_of(&[1, 2, 3]);
    let c = cfg(3);
    let base = sha(1);
    form(&mut q, &c, &base);
    let b = q.batch.clone().unwrap();
    let ci = BatchCi::Red {
        failing: vec!["ci".into()],
        tip_green: ["ci".to_string()].into(),
        steps: vec![StepCi::Green, StepCi::Green],
    };
    let BatchDecision::Bisect(n) = decide(&b, &c, &ci, &base) else {
        panic!("a bisection")
    };
    q.batch_bisect(vec!["ci".into()], n, 0);
    assert_eq!(q.batch.as_ref().unwrap().numbers(), [1, 2]);
    q.batch_landed(0);
    assert!(q.bisect.as_ref().unwrap().reproduced.is_empty());
    assert_eq!(form(&mut q, &c, &sha(2)), vec![3]);
    let b = q.batch.clone().unwrap();
    assert_eq!(b.failed_before, ["ci"]);
    assert_eq!(
        decide(&b, &c, &red(&["ci"], &["ci"]), &sha(2)),
        BatchDecision::Eject { number: 3 }
    );
}

/// A red intermediate commit below a green one passed with more on top: its check is
/// counted as suspected flaky (no PR was saved by a re-test), and the green prefix
/// lands.
#[test]
fn a_red_step_below_a_green_one_counts_its_check_as_flaky() {
    let mut q = queue_of(&[1, 2, 3]);
    let c = cfg(3);
    form(&mut q, &c, &sha(1));
    let b = q.batch.clone().unwrap();
    let ci = BatchCi::Red {
        failing: vec!["ci".into()],
        tip_green: ["ci".to_string()].into(),
        steps: vec![step_red(), StepCi::Green],
    };
    let BatchDecision::Bisect(n) = decide(&b, &c, &ci, &sha(1)) else {
        panic!("a bisection")
    };
    assert_eq!(
        (n.green, n.red, n.flaky.clone()),
        (2, 3, vec!["ci".to_string()])
    );
    q.batch_bisect(vec!["ci".into()], n, 0);
    assert_eq!(q.stats.flaky_checks["ci"], 1);
    assert_eq!(q.stats.flaky_saved, 0);
    assert_eq!(q.batch.as_ref().unwrap().numbers(), [1, 2]);
}
