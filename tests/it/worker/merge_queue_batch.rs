//! The batched merge queue end to end (issue 29, `merge_queue_batch_size` > 1): real
//! `shepherd run`, real Redis, the fake Forgejo with its simulated CI. Each check of
//! "main stays green" reads the fake's own history: the landings (fast-forward-only
//! merges of a batch branch into `main`), the PRs marked merged by them, and the
//! statuses of every landed commit.

use std::collections::BTreeSet;

use crate::support::fake_forgejo::faults::Fault;
use crate::support::fake_forgejo::{FakeForgejo, MergeRecord};
use crate::support::scenario::Scenario;

use super::merge_queue::{
    CI, REPO, approve_in_order, ci_state, hold_ci, merges, open_green, pump, release_ci, run_until,
    start_with, stored_queue, work_for,
};

/// Batches of `size`, a partial batch waiting long enough for the test's approvals.
fn batch_policy(size: u32) -> String {
    format!("merge_queue_batch_size = {size}\nmerge_queue_batch_wait_secs = 30\n")
}

/// The base branch of PR `n` in the fake.
fn base_of(fake: &FakeForgejo, n: u64) -> String {
    fake.issue(REPO, n)
        .pull
        .map(|p| p.base_ref)
        .unwrap_or_default()
}

/// The landings: merges into `main` (of a batch branch, fast-forward).
fn landings(fake: &FakeForgejo) -> Vec<MergeRecord> {
    merges(fake)
        .into_iter()
        .filter(|m| m.style != "manually-merged" && base_of(fake, m.number) == "main")
        .collect()
}

/// The PRs marked merged by a landing, in order.
fn marked(fake: &FakeForgejo) -> Vec<MergeRecord> {
    merges(fake)
        .into_iter()
        .filter(|m| m.style == "manually-merged")
        .collect()
}

/// The merges of PRs into the queue's temporary batch branches (building a batch).
fn into_batch_branches(fake: &FakeForgejo) -> Vec<MergeRecord> {
    fake.merges()
        .into_iter()
        .filter(|m| m.repo == REPO && base_of(fake, m.number).starts_with("shepherd/batch/"))
        .collect()
}

/// The queue's temporary branches that exist in the fake.
fn batch_branches(fake: &FakeForgejo) -> Vec<String> {
    fake.with_model(|m| {
        m.repos[REPO]
            .branches
            .keys()
            .filter(|b| b.starts_with("shepherd/batch/"))
            .cloned()
            .collect()
    })
}

/// The PRs whose changes commit `sha` holds.
fn content(fake: &FakeForgejo, sha: &str) -> BTreeSet<u64> {
    fake.with_model(|m| crate::support::fake_forgejo::queue::content_of(&m.repos[REPO], sha))
}

/// G1–G3 for batches, from the fake's history: every landing was a fast-forward-only
/// merge pinned to the batch tip it landed (the tested commit is the landed one), on
/// the tip the previous landing made, with green CI on the landed commit; every PR
/// marked merged names a landed commit that holds its changes.
fn assert_main_stayed_green(fake: &FakeForgejo) {
    let lands = landings(fake);
    for (i, m) in lands.iter().enumerate() {
        assert_eq!(m.style, "fast-forward-only", "landing {i}: {m:?}");
        assert_eq!(m.head_commit_id.as_deref(), Some(m.merged_sha.as_str()));
        assert_eq!(m.tip_after, m.merged_sha, "the tested tip is the new tip");
        assert_eq!(
            ci_state(fake, &m.merged_sha),
            "success",
            "CI of landing {i}"
        );
        if i > 0 {
            assert_eq!(
                m.tip_before,
                lands[i - 1].tip_after,
                "landing {i} on the last"
            );
        }
    }
    for m in marked(fake) {
        let commit = m.body["MergeCommitID"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            lands.iter().any(|l| l.tip_after == commit),
            "#{} marked merged by a landed commit: {commit}",
            m.number
        );
        assert!(
            content(fake, &commit).contains(&m.number),
            "#{} landed",
            m.number
        );
        assert_eq!(
            fake.issue(REPO, m.number)
                .pull
                .and_then(|p| p.merge_commit_sha),
            Some(commit)
        );
    }
}

/// Waits until no batch branch is left.
async fn wait_no_batch_branch(s: &Scenario) {
    run_until(s, "no batch branch left", |f| batch_branches(f).is_empty()).await;
}

/// Three approved PRs are tested together once (one CI run on the batch's tip) and
/// land together: one fast-forward of `main` to the tested tip, then each PR marked
/// merged with that commit (its record sees the merged webhook and leaves the queue).
/// The batch branch is deleted; the helper PRs of the batch never became work.
#[tokio::test(flavor = "multi_thread")]
async fn three_prs_are_tested_together_and_land_with_one_ci_run() {
    let s = start_with(&batch_policy(3), 300, &[]).await;
    let main_before = s.fake.branch_tip(REPO, "main");
    let prs = open_green(&s, 3).await;
    approve_in_order(&s, &prs).await;
    run_until(&s, "three PRs marked merged", |f| marked(f).len() == 3).await;
    let lands = landings(&s.fake);
    assert_eq!(lands.len(), 1, "one landing: {lands:?}");
    assert_eq!(lands[0].tip_before, main_before);
    assert_eq!(
        content(&s.fake, &lands[0].tip_after),
        BTreeSet::from([1, 2, 3])
    );
    let order: Vec<u64> = marked(&s.fake).iter().map(|m| m.number).collect();
    assert_eq!(order, vec![1, 2, 3]);
    assert_main_stayed_green(&s.fake);
    wait_no_batch_branch(&s).await;
    let q = stored_queue(&s).await;
    assert_eq!(
        (
            q.stats.merged,
            q.stats.batches_tested,
            q.stats.batches_first_pass_green,
            q.stats.ci_runs
        ),
        (3, 1, 1, 1),
        "{:?}",
        q.stats
    );
    // Each PR's record saw its merge (the merged webhook of `manually-merged`).
    for n in prs {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while s.phase(REPO, n).await != "merged" {
            assert!(std::time::Instant::now() < end, "#{n}'s record is merged");
            pump(&s).await;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    // The batch's helper PRs were never treated as PRs (no work, no status comment).
    let helpers: Vec<u64> = (4..=8)
        .filter(|n| s.fake.with_model(|m| m.repos[REPO].issues.contains_key(n)))
        .collect();
    assert!(!helpers.is_empty(), "helper PRs exist");
    for n in helpers {
        assert!(
            s.fake.status_comments(REPO, n).is_empty(),
            "no status on helper #{n}"
        );
        assert_eq!(s.phase(REPO, n).await, "", "no record of helper #{n}");
        assert!(work_for(&s, "review", n).await.is_empty());
    }
    s.fake.assert_calls_match_openapi();
}

/// Four PRs, the third of which breaks CI on top of the first: the batch of four is
/// red. Its intermediate commits were tested too (each merge into the batch branch is
/// a push): #1 and #1+#2 green, #1+#2+#3 red. So #1 and #2 land at once on the commit
/// CI passed (a branch made there, fast-forwarded: no new run), #3 failed on two runs
/// that held it and is ejected to `ci-fix` without a run of its own, with the note
/// naming what it was tested with, and #4 is batched again (green: lands). One run
/// beyond the two batches'; nobody else is ejected; `main` is green at every landing.
#[tokio::test(flavor = "multi_thread")]
async fn a_red_batch_is_narrowed_by_its_intermediate_commits_and_the_rest_lands() {
    bisect_to_the_culprit(true).await;
}

/// The same with `merge_queue_step_results = false` (a CI whose intermediate runs
/// cannot be trusted): bisection tests #1 and #2 (green: they land), then #3 alone on
/// top of them (red on the check that failed in the batch: reproduced, so ejected
/// without a re-test), then #4 (green: lands).
#[tokio::test(flavor = "multi_thread")]
async fn a_red_batch_is_bisected_to_the_culprit_and_the_rest_lands() {
    bisect_to_the_culprit(false).await;
}

async fn bisect_to_the_culprit(step_results: bool) {
    let policy = format!(
        "{}merge_queue_step_results = {step_results}\n",
        batch_policy(4)
    );
    let s = start_with(&policy, 300, &[(3, 1)]).await;
    let prs = open_green(&s, 4).await;
    approve_in_order(&s, &prs).await;
    run_until(&s, "#1, #2 and #4 marked merged", |f| marked(f).len() == 3).await;
    let order: Vec<u64> = marked(&s.fake).iter().map(|m| m.number).collect();
    assert_eq!(order, vec![1, 2, 4]);
    let lands = landings(&s.fake);
    assert_eq!(lands.len(), 2, "the green prefix or half, then #4");
    assert_eq!(
        content(&s.fake, &lands[0].tip_after),
        BTreeSet::from([1, 2])
    );
    assert_main_stayed_green(&s.fake);
    let fix = loop {
        if let Some(item) = work_for(&s, "ci-fix", 3).await.into_iter().next() {
            break item;
        }
        pump(&s).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let note = fix["context"]["note"].as_str().unwrap_or_default();
    assert!(note.contains("failed on top of #1, #2, #4"), "note: {note}");
    assert_eq!(fix["head_sha"], s.fake.head_sha(REPO, 3));
    for n in [1, 2, 4] {
        assert!(
            work_for(&s, "ci-fix", n).await.is_empty(),
            "#{n} not blamed"
        );
    }
    let q = stored_queue(&s).await;
    let e3 = q
        .entries
        .iter()
        .find(|e| e.number == 3)
        .expect("#3 keeps its ticket");
    assert_eq!(e3.parked, Some(shepherd::core::queue::Ejection::CiFailed));
    // Only the last batch (#4, formed after the bisection) was green at its first test.
    assert_eq!(q.stats.batches_first_pass_green, 1);
    // With the intermediate results: the red batch, then #4. Without: the red batch
    // (not re-tested whole: bisected), the green half, #3 alone red on the same check
    // (failed twice: no re-test), then #4 green.
    let runs = match step_results {
        true => 2,
        false => 4,
    };
    assert_eq!(
        (q.stats.ci_runs, q.stats.flaky_retries, q.stats.flaky_saved),
        (runs, 0, 0),
        "{:?}",
        q.stats
    );
    wait_no_batch_branch(&s).await;
    s.fake.assert_calls_match_openapi();
}

/// A red batch of two is not re-tested whole: #1's commit on the batch branch passed,
/// so #1 lands at once, and #2, tested alone, is green and lands: the failure was a
/// flake. Nobody is ejected, no `ci-fix` work is dispatched, the check is counted as
/// suspected flaky, and no extra run was spent.
#[tokio::test(flavor = "multi_thread")]
async fn a_flaky_failure_is_re_tested_and_nobody_is_ejected() {
    let s = start_with(&batch_policy(2), 300, &[]).await;
    // `main`'s tip knows the check (it passed there).
    let tip = s.fake.branch_tip(REPO, "main");
    s.fake.set_status(REPO, &tip, CI, "success", "Successful");
    let prs = open_green(&s, 2).await;
    // The first run on a commit holding exactly #1 and #2 fails once.
    s.fake.with_model(|m| {
        let ci = m.repo_mut(REPO).ci.as_mut().expect("a simulated CI");
        ci.flake_once.push(BTreeSet::from([1, 2]));
    });
    approve_in_order(&s, &prs).await;
    run_until(&s, "both PRs marked merged", |f| marked(f).len() == 2).await;
    assert_main_stayed_green(&s.fake);
    let finished = s
        .fake
        .with_model(|m| m.repos[REPO].ci.as_ref().map(|c| c.finished.clone()))
        .unwrap_or_default();
    assert!(
        finished.iter().any(|(_, green)| !green),
        "a red run happened"
    );
    // The branch goes after the landing is written to the queue.
    wait_no_batch_branch(&s).await;
    let q = stored_queue(&s).await;
    assert_eq!(
        (
            q.stats.flaky_retries,
            q.stats.flaky_saved,
            q.stats.batches_tested
        ),
        (0, 1, 2),
        "{:?}",
        q.stats
    );
    assert_eq!(landings(&s.fake).len(), 2, "each half landed on its own");
    assert_eq!(q.stats.flaky_checks.get(CI), Some(&1));
    assert!(q.stats.ejections.is_empty(), "{:?}", q.stats.ejections);
    for n in prs {
        assert!(
            work_for(&s, "ci-fix", n).await.is_empty(),
            "no ci-fix for #{n}"
        );
    }

    s.fake.assert_calls_match_openapi();
}

/// A PR tested alone (the only one waiting) whose failing check passed on `main`'s tip
/// is re-tested once on a new branch; the re-test passes, so it lands, is not ejected,
/// gets no `ci-fix` work, and the check is counted as suspected flaky.
#[tokio::test(flavor = "multi_thread")]
async fn a_single_pr_flake_is_re_tested_and_saved() {
    let policy = "merge_queue_batch_size = 2\nmerge_queue_batch_wait_secs = 0\n";
    let s = start_with(policy, 300, &[]).await;
    let tip = s.fake.branch_tip(REPO, "main");
    s.fake.set_status(REPO, &tip, CI, "success", "Successful");
    let prs = open_green(&s, 1).await;
    s.fake.with_model(|m| {
        let ci = m.repo_mut(REPO).ci.as_mut().expect("a simulated CI");
        ci.flake_once.push(BTreeSet::from([1]));
    });
    approve_in_order(&s, &prs).await;
    run_until(&s, "#1 marked merged", |f| marked(f).len() == 1).await;
    assert_main_stayed_green(&s.fake);
    wait_no_batch_branch(&s).await;
    let q = stored_queue(&s).await;
    assert_eq!(
        (
            q.stats.flaky_retries,
            q.stats.flaky_saved,
            q.stats.batches_tested
        ),
        (1, 1, 2),
        "{:?}",
        q.stats
    );
    assert_eq!(q.stats.flaky_checks.get(CI), Some(&1));
    assert!(q.stats.ejections.is_empty(), "{:?}", q.stats.ejections);
    assert!(work_for(&s, "ci-fix", 1).await.is_empty(), "no ci-fix");
    s.fake.assert_calls_match_openapi();
}

/// Restarts `shepherd run` (SIGKILL) once `reached` holds for the batch of three PRs,
/// with `fault` injected until then, and lets the queue finish: every PR is marked
/// merged exactly once by one landing of a tested tip, and no batch branch is left.
async fn restart_during_a_batch(
    fault: Option<Fault>,
    hold: bool,
    what: &str,
    reached: impl Fn(&FakeForgejo) -> bool,
) {
    let mut s = start_with(&batch_policy(3), 300, &[]).await;
    let prs = open_green(&s, 3).await;
    if hold {
        hold_ci(&s);
    }
    if let Some(f) = fault {
        s.fake.inject(f);
    }
    approve_in_order(&s, &prs).await;
    run_until(&s, what, reached).await;
    s.restart().await;
    s.fake.clear_faults();
    release_ci(&s, 300);
    run_until(&s, "three PRs marked merged", |f| marked(f).len() >= 3).await;
    wait_no_batch_branch(&s).await;
    let lands = landings(&s.fake);
    assert_eq!(lands.len(), 1, "one landing: {lands:?}");
    let mut order: Vec<u64> = marked(&s.fake).iter().map(|m| m.number).collect();
    order.sort_unstable();
    assert_eq!(order, vec![1, 2, 3], "each PR marked merged once");
    assert_eq!(
        content(&s.fake, &lands[0].tip_after),
        BTreeSet::from([1, 2, 3])
    );
    assert_main_stayed_green(&s.fake);
    s.fake.assert_calls_match_openapi();
}

/// A stall of every call to `path` (the process dies while it hangs).
fn stall(method: &str, path: &str) -> Fault {
    Fault::on(method, path).stall(std::time::Duration::from_secs(3_600))
}

/// Restart right after the batch branch was made (its first helper PR hangs).
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_after_the_batch_branch_is_made_loses_nothing() {
    let path = format!("/repos/{REPO}/pulls");
    restart_during_a_batch(Some(stall("POST", &path)), false, "the branch made", |f| {
        !batch_branches(f).is_empty() && !f.calls("POST", &path).is_empty()
    })
    .await;
}

/// Restart mid-build: once one PR is merged into the batch branch (CI held, so the
/// batch cannot get further than its build and test).
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_mid_build_loses_nothing() {
    restart_during_a_batch(None, true, "one PR merged into the batch branch", |f| {
        !into_batch_branches(f).is_empty()
    })
    .await;
}

/// Restart while CI runs on the batch tip (held).
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_during_the_batch_ci_loses_nothing() {
    restart_during_a_batch(None, true, "CI running on the built batch", |f| {
        into_batch_branches(f).len() == 3
    })
    .await;
}

/// Restart between the fast-forward of `main` and the PRs being marked merged (the
/// first `manually-merged` call hangs).
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_between_the_fast_forward_and_the_merged_marks_loses_nothing() {
    let path = format!("/repos/{REPO}/pulls/1/merge");
    restart_during_a_batch(
        Some(stall("POST", &path)),
        false,
        "main fast-forwarded",
        |f| !landings(f).is_empty() && !f.calls("POST", &path).is_empty(),
    )
    .await;
}

/// Restart while a green prefix of a red batch lands: #3 breaks on top of #1, so the
/// batch of three is red and its commit holding #1 and #2 green; that commit's branch
/// is made and the landing PR's creation hangs when the process dies. After the
/// restart #1 and #2 land once, on that very commit (no new run of it), #3 goes to
/// `ci-fix`, and no batch branch is left.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_while_a_green_prefix_lands_loses_nothing() {
    let mut s = start_with(&batch_policy(3), 300, &[(3, 1)]).await;
    let prs = open_green(&s, 3).await;
    hold_ci(&s);
    approve_in_order(&s, &prs).await;
    run_until(&s, "the batch built, CI held", |f| {
        into_batch_branches(f).len() == 3
    })
    .await;
    let pulls = format!("/repos/{REPO}/pulls");
    let before = s.fake.calls("POST", &pulls).len();
    s.fake.inject(stall("POST", &pulls));
    release_ci(&s, 300);
    run_until(&s, "the prefix branch made, its landing PR hanging", |f| {
        batch_branches(f).iter().any(|b| b.ends_with("/2"))
            && f.calls("POST", &pulls).len() > before
    })
    .await;
    let step = s.fake.branch_tip(REPO, "shepherd/batch/main/2");
    assert_eq!(content(&s.fake, &step), BTreeSet::from([1, 2]));
    assert_eq!(ci_state(&s.fake, &step), "success", "the prefix passed");
    s.restart().await;
    s.fake.clear_faults();
    run_until(&s, "#1 and #2 marked merged", |f| marked(f).len() >= 2).await;
    let fix = loop {
        if let Some(item) = work_for(&s, "ci-fix", 3).await.into_iter().next() {
            break item;
        }
        pump(&s).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(
        fix["context"]["note"]
            .as_str()
            .unwrap_or_default()
            .contains("#1, #2")
    );
    wait_no_batch_branch(&s).await;
    let lands = landings(&s.fake);
    assert_eq!(lands.len(), 1, "one landing: {lands:?}");
    assert_eq!(lands[0].tip_after, step, "the tested commit landed");
    let mut order: Vec<u64> = marked(&s.fake).iter().map(|m| m.number).collect();
    order.sort_unstable();
    assert_eq!(order, vec![1, 2], "each marked merged once");
    assert_main_stayed_green(&s.fake);
    s.fake.assert_calls_match_openapi();
}

/// The serial queue (`merge_queue_batch_size` = 1, the default) and a flaky check:
/// #2, updated onto the tip #1 made, fails once there although its check passed on
/// the tip; it is re-tested once as a batch of one (a new branch at the tip, a new
/// commit of the same content, so CI runs again), passes and lands: never ejected, no
/// `ci-fix` work, the check counted as suspected flaky (stored figures, `/metrics`,
/// status page), and every commit that landed on `main` was green on its base.
#[tokio::test(flavor = "multi_thread")]
async fn a_serial_flake_on_the_tip_is_re_tested_and_merges() {
    let s = start_with("", 300, &[]).await;
    let prs = open_green(&s, 2).await;
    s.fake.with_model(|m| {
        let ci = m.repo_mut(REPO).ci.as_mut().expect("a simulated CI");
        // #2 on top of #1: its first run there fails, a re-run passes.
        ci.flake_once.push(BTreeSet::from([1, 2]));
    });
    approve_in_order(&s, &prs).await;
    run_until(&s, "#2 marked merged by its re-test's landing", |f| {
        marked(f).iter().any(|m| m.number == 2)
    })
    .await;
    let updated = s.fake.with_model(|m| m.repos[REPO].updates.clone());
    let up2 = updated.iter().find(|u| u.0 == 2).expect("#2 was updated");
    assert_eq!(
        ci_state(&s.fake, &up2.2),
        "failure",
        "its run on the tip failed"
    );
    let lands = landings(&s.fake);
    assert_eq!(
        lands.len(),
        2,
        "#1's merge and the re-test's landing: {lands:?}"
    );
    assert_eq!(lands[1].tip_before, up2.3, "landed on the tip it failed on");
    assert_ne!(lands[1].tip_after, up2.2, "a new commit was tested");
    assert_eq!(
        content(&s.fake, &lands[1].tip_after),
        BTreeSet::from([1, 2])
    );
    assert_main_stayed_green(&s.fake);
    wait_no_batch_branch(&s).await;
    let q = stored_queue(&s).await;
    assert_eq!(
        (q.stats.flaky_retries, q.stats.flaky_saved, q.stats.ci_runs),
        (1, 1, 2),
        "one re-test saved #2; CI runs: #2's update and its re-test: {:?}",
        q.stats
    );
    assert_eq!(q.stats.flaky_checks.get(CI), Some(&1));
    assert!(q.stats.ejections.is_empty(), "{:?}", q.stats.ejections);
    assert!(q.entries.is_empty(), "both left the queue merged: {q:?}");
    assert!(work_for(&s, "ci-fix", 2).await.is_empty(), "no ci-fix");
    s.metrics_until("the suspected-flaky check counted once", |metrics| {
        metrics.lines().any(|l| {
            l.starts_with("shepherd_merge_queue_flaky_checks{")
                && l.contains(&format!("context=\"{CI}\""))
                && l.ends_with(" 1")
        })
    })
    .await;
    let page = s.status_page().await;
    assert!(
        page.contains("Suspected flaky checks") && page.contains(CI),
        "{page}"
    );
    s.fake.assert_calls_match_openapi();
}

/// The serial queue and a check the tip does not know: `main` moved by a push whose
/// commit has no CI status, #1 is updated onto it and fails there. A failing check
/// that did not pass on the tip is a new test: #1 is ejected to `ci-fix` at once,
/// without a re-test (no batch branch is ever made), with a note saying why.
#[tokio::test(flavor = "multi_thread")]
async fn a_serial_failure_of_a_check_new_to_the_tip_is_ejected_without_a_re_test() {
    let s = start_with("", 300, &[]).await;
    let prs = open_green(&s, 1).await;
    let push = s.fake.push_to_branch(REPO, "main", "someone");
    s.send(&push).await;
    s.fake.with_model(|m| {
        let ci = m.repo_mut(REPO).ci.as_mut().expect("a simulated CI");
        ci.flake_once.push(BTreeSet::from([1]));
    });
    approve_in_order(&s, &prs).await;
    let fix = loop {
        if let Some(item) = work_for(&s, "ci-fix", 1).await.into_iter().next() {
            break item;
        }
        pump(&s).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let note = fix["context"]["note"].as_str().unwrap_or_default();
    assert!(
        note.contains(&format!("not re-tested: {CI} did not pass on the tip")),
        "note: {note}"
    );
    assert_eq!(fix["head_sha"], s.fake.head_sha(REPO, 1));
    let q = stored_queue(&s).await;
    assert_eq!(
        (q.stats.flaky_retries, q.stats.ci_runs),
        (0, 1),
        "no re-test; one run (the update's): {:?}",
        q.stats
    );
    assert_eq!(
        q.stats
            .ejections
            .get(&shepherd::core::queue::Ejection::CiFailed),
        Some(&1)
    );
    assert!(
        s.fake
            .calls("POST", &format!("/repos/{REPO}/branches"))
            .is_empty(),
        "no batch branch made"
    );
    assert!(landings(&s.fake).is_empty(), "nothing merged");
    s.fake.assert_calls_match_openapi();
}
