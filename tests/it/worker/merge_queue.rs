//! The merge queue end to end (issue 16): real `shepherd run`, real Redis, the fake
//! Forgejo with its simulated CI (a fixed duration; results by what a commit
//! contains). Every check of "main stays green" reads the fake's own history: its
//! merges, its updates and the statuses of every landed commit.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::fake_forgejo::queue::SimCi;
use crate::support::fake_forgejo::{FakeForgejo, MergeRecord, NewPr};
use crate::support::scenario::Scenario;

/// The repository.
pub(super) const REPO: &str = "acme/widgets";
/// The simulated CI's context.
pub(super) const CI: &str = "ci / test";
/// The queue's policy on top of the scenario's fast timers.
const QUEUE_POLICY: &str = "merge_queue = true\nmerge_queue_max_updates = 3\n";
/// How long a scenario may take to get where it should.
const QUEUE_DEADLINE: Duration = Duration::from_secs(120);

/// Starts a scenario with the queue on and a simulated CI of `ci_ms` per run.
async fn start(ci_ms: u64, breaks: &[(u64, u64)]) -> Scenario {
    start_with("", ci_ms, breaks).await
}

/// [`start`] with more policy lines.
pub(super) async fn start_with(extra: &str, ci_ms: u64, breaks: &[(u64, u64)]) -> Scenario {
    let s = Scenario::start(&format!("{QUEUE_POLICY}{extra}")).await;
    let mut ci = SimCi::new(CI, Duration::from_millis(ci_ms));
    ci.breaks = breaks.to_vec();
    s.fake.simulate_ci(REPO, ci);
    s
}

/// Opens `n` bot PRs on `main` and lets their CI finish (green on their own), then
/// approves them one by one, each only once the previous one is in the queue (or
/// merged): the queue's order is the PRs' order. Returns their numbers.
async fn queue_in_order(s: &Scenario, n: usize) -> Vec<u64> {
    let prs = open_green(s, n).await;
    approve_in_order(s, &prs).await;
    prs
}

/// Opens `n` bot PRs on `main` and lets the CI of their own heads finish (green).
pub(super) async fn open_green(s: &Scenario, n: usize) -> Vec<u64> {
    let mut prs = Vec::new();
    for i in 0..n {
        let pr = s
            .fake
            .open_pr(REPO, NewPr::new("agent-bot", &format!("Change {i}")));
        s.send(&s.fake.pr_opened(REPO, pr)).await;
        prs.push(pr);
    }
    run_until(s, "CI of every PR's own head finished", |f| {
        f.with_model(|m| m.repos[REPO].ci.as_ref().is_some_and(|c| c.runs.is_empty()))
    })
    .await;
    prs
}

/// Approves `prs` one by one, each once the previous one is in the queue (or merged).
pub(super) async fn approve_in_order(s: &Scenario, prs: &[u64]) {
    for &pr in prs {
        approve(s, pr).await;
        let end = Instant::now() + QUEUE_DEADLINE;
        while !in_queue_or_merged(s, pr).await {
            assert!(Instant::now() < end, "#{pr} entered the queue");
            pump(s).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Holds the simulated CI: runs started from now on finish only on [`release_ci`].
pub(super) fn hold_ci(s: &Scenario) {
    s.fake.with_model(|m| {
        if let Some(ci) = m.repo_mut(REPO).ci.as_mut() {
            ci.duration = Duration::from_secs(3_600);
        }
    });
}

/// Lets every held CI run finish at once, and later ones after `ms`.
pub(super) fn release_ci(s: &Scenario, ms: u64) {
    s.fake.with_model(|m| {
        if let Some(ci) = m.repo_mut(REPO).ci.as_mut() {
            ci.duration = Duration::from_millis(ms);
            let now = Instant::now();
            ci.runs.iter_mut().for_each(|r| r.due = now);
        }
    });
}

/// Delivers the echoes of Shepherd's writes only (no CI run finishes).
pub(super) async fn pump_outbox(s: &Scenario) {
    for hook in s.fake.take_outbox() {
        s.send(&hook).await;
    }
}

/// A comment by the repository's owner (a writer: its commands run).
async fn command(s: &Scenario, n: u64, body: &str) {
    let id = s.fake.add_comment(REPO, n, "acme", body);
    s.send(&s.fake.comment_created(REPO, id)).await;
}

/// Waits for a bot comment on PR `n` containing `text` (delivering echoes meanwhile).
async fn wait_bot_comment(s: &Scenario, n: u64, text: &str) {
    let end = Instant::now() + QUEUE_DEADLINE;
    loop {
        let found = s
            .fake
            .comments_on(REPO, n)
            .iter()
            .any(|c| c.user == s.fake.bot_login() && c.body.contains(text));
        if found {
            return;
        }
        if Instant::now() > end {
            let bodies: Vec<String> = s
                .fake
                .comments_on(REPO, n)
                .into_iter()
                .map(|c| c.body)
                .collect();
            panic!("no bot comment on #{n} with {text:?}: {bodies:#?}");
        }
        pump_outbox(s).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the stored queue of `main` holds exactly `expected`, in queue order.
async fn wait_queue_order(s: &Scenario, expected: &[u64]) {
    let end = Instant::now() + QUEUE_DEADLINE;
    loop {
        let order = queue_order(s).await;
        if order == expected {
            return;
        }
        assert!(
            Instant::now() < end,
            "queue order {order:?}, expected {expected:?}"
        );
        pump_outbox(s).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The PRs of `main`'s queue that are in line (not parked), in order, as the core's
/// own `BranchQueue::order` computes it from the stored queue.
async fn queue_order(s: &Scenario) -> Vec<u64> {
    stored_queue(s)
        .await
        .order()
        .iter()
        .map(|e| e.number)
        .collect()
}

/// `main`'s queue as stored in Redis (an empty one before the first op).
pub(super) async fn stored_queue(s: &Scenario) -> shepherd::core::queue::BranchQueue {
    let key = s.shepherd.keys().merge_queue(REPO, "main");
    let mut conn = s.redis_conn();
    let data: Option<String> = redis::cmd("HGET")
        .arg(&key)
        .arg("data")
        .query_async(&mut conn)
        .await
        .expect("HGET the queue");
    let Some(data) = data else {
        return shepherd::core::queue::BranchQueue::new("main");
    };
    serde_json::from_str(&data).expect("queue JSON")
}

/// The PRs in `main`'s queue (in line or parked), read from Redis.
async fn queue_entries(s: &Scenario) -> Vec<u64> {
    stored_queue(s)
        .await
        .entries
        .iter()
        .map(|e| e.number)
        .collect()
}

/// PR `n` is in `main`'s queue or merged.
async fn in_queue_or_merged(s: &Scenario, n: u64) -> bool {
    merges(&s.fake).iter().any(|m| m.number == n) || queue_entries(s).await.contains(&n)
}

/// A writer approves PR `n`'s head (and the review webhook goes out).
pub(super) async fn approve(s: &Scenario, n: u64) {
    let id = s
        .fake
        .with_model(|m| m.add_review(REPO, n, "reviewer", "APPROVED"));
    s.send(&s.fake.pr_reviewed(REPO, n, id)).await;
}

/// Delivers what Forgejo would send on its own: finished CI runs (`action_run_*`)
/// and the echoes of Shepherd's writes (label changes, comments, merges, the
/// `pull_request_sync` of an update).
pub(super) async fn pump(s: &Scenario) {
    let hooks: Vec<_> = s
        .fake
        .finish_ci_runs()
        .into_iter()
        .chain(s.fake.take_outbox())
        .collect();
    for hook in hooks {
        s.send(&hook).await;
    }
}

/// Runs the world until `cond` holds (polls with a deadline; never a timed assertion).
pub(super) async fn run_until(s: &Scenario, what: &str, cond: impl Fn(&FakeForgejo) -> bool) {
    let end = Instant::now() + QUEUE_DEADLINE;
    loop {
        pump(s).await;
        if cond(&s.fake) {
            return;
        }
        if Instant::now() > end {
            s.dump().await;
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The status page shows `on_page` and the metrics hold the ejection series
/// `shepherd_merge_queue_ejections_total` followed by `series` (labels, and a count
/// where the test knows it).
async fn assert_ejection_shown(s: &Scenario, on_page: &str, series: &str) {
    let page = s.status_page().await;
    assert!(page.contains(on_page), "{page}");
    let line = format!("shepherd_merge_queue_ejections_total{series}");
    s.metrics_until(&line, |metrics| metrics.contains(&line))
        .await;
}

/// main moves, CI is held and `prs` are approved in order: waits until #1 is updated
/// onto the moved tip (its CI on the new head running, held).
async fn move_main_and_update_the_head_with_ci_held(s: &Scenario, prs: &[u64]) {
    let push = s.fake.push_to_branch(REPO, "main", "someone");
    s.send(&push).await;
    hold_ci(s);
    approve_in_order(s, prs).await;
    run_until(s, "#1 updated onto the moved tip", |f| {
        updates(f).iter().any(|u| u.0 == 1)
    })
    .await;
}

/// The merges of the repository's PRs, in order, without the merges of PRs into the
/// queue's temporary batch branches (the serial queue's re-tests make those too).
pub(super) fn merges(fake: &FakeForgejo) -> Vec<MergeRecord> {
    fake.merges()
        .into_iter()
        .filter(|m| m.repo == REPO)
        .filter(|m| {
            let base = fake.issue(REPO, m.number).pull.map(|p| p.base_ref);
            !base.is_some_and(|b| b.starts_with("shepherd/batch/"))
        })
        .collect()
}

/// The combined state of `sha`'s statuses in the fake.
pub(super) fn ci_state(fake: &FakeForgejo, sha: &str) -> String {
    fake.with_model(|m| {
        let latest = m.repos[REPO].latest_statuses(sha);
        crate::support::fake_forgejo::model::combined_state(&latest).to_owned()
    })
}

/// The guarantees, from the fake's history: every merge was fast-forward-only and
/// pinned to the head it merged, the branch's tip before it was the base that head
/// was built on (so the landed commit is the tested commit), the landed commit's CI
/// was green, and the merges follow one another (each on the tip the previous made).
fn assert_main_stayed_green(fake: &FakeForgejo) {
    let ms = merges(fake);
    for (i, m) in ms.iter().enumerate() {
        assert_eq!(m.style, "fast-forward-only", "merge {i}: {m:?}");
        assert_eq!(m.head_commit_id.as_deref(), Some(m.merged_sha.as_str()));
        assert_eq!(m.tip_after, m.merged_sha, "the tested head is the new tip");
        assert_eq!(
            ci_state(fake, &m.merged_sha),
            "success",
            "CI of merge point {i}"
        );
        assert!(
            m.body
                .get("force_merge")
                .is_none_or(|v| v == &Value::Bool(false)),
            "never force_merge"
        );
        if i > 0 {
            assert_eq!(
                m.tip_before,
                ms[i - 1].tip_after,
                "merge {i} on the previous tip"
            );
        }
    }
}

/// The updates the fake did: (PR, old head, new head, tip built on).
fn updates(fake: &FakeForgejo) -> Vec<(u64, String, String, String)> {
    fake.with_model(|m| m.repos[REPO].updates.clone())
}

/// The dispatched work items of `kind` for PR `n`.
pub(super) async fn work_for(s: &Scenario, kind: &str, n: u64) -> Vec<Value> {
    s.work_items()
        .await
        .into_iter()
        .filter(|w| w["kind"] == kind && w["number"] == n)
        .collect()
}

/// Five approved PRs, the fourth of which breaks CI only on top of the second: four
/// merge in order, each updated onto and tested on the tip of the moment; the fourth,
/// whose failing check passed on the tip, is re-tested once (issue 29: a batch of one
/// on a new branch), fails again and is ejected to `ci-fix` with a note that it fails
/// only on the new base (no flake counted); the agent's
/// fix (and a re-approval) brings it back, and it merges last. `main` is green at every
/// merge point.
#[tokio::test(flavor = "multi_thread")]
async fn five_prs_merge_in_order_and_the_one_broken_by_the_combination_is_fixed() {
    let s = start(300, &[(4, 2)]).await;
    let prs = queue_in_order(&s, 5).await;
    assert_eq!(prs, vec![1, 2, 3, 4, 5]);
    run_until(&s, "four merges and a ci-fix for #4", |f| {
        merges(f).len() >= 4
    })
    .await;
    let order: Vec<u64> = merges(&s.fake).iter().map(|m| m.number).collect();
    assert_eq!(order, vec![1, 2, 3, 5], "in order, #4 ejected");
    // Each PR after the first was updated onto the tip the previous merge made, and
    // what merged is exactly that update's head.
    let ups = updates(&s.fake);
    let ms = merges(&s.fake);
    for w in ms.windows(2) {
        let (prev, m) = (&w[0], &w[1]);
        let up = ups
            .iter()
            .rev()
            .find(|u| u.0 == m.number)
            .unwrap_or_else(|| panic!("#{} was updated", m.number));
        assert_eq!(
            up.3, prev.tip_after,
            "#{} tested on the tip of its moment",
            m.number
        );
        assert_eq!(up.2, m.merged_sha, "#{} merged the tested head", m.number);
    }
    // #4 was updated onto a tip holding #2's changes, failed there, and went to ci-fix
    // with the note.
    let fix = loop {
        let items = work_for(&s, "ci-fix", 4).await;
        if let Some(item) = items.into_iter().next() {
            break item;
        }
        pump(&s).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let note = fix["context"]["note"].as_str().unwrap_or_default();
    assert!(note.contains("only on top of the new base"), "note: {note}");
    // The failing sha is the head the queue's update made, on top of #2's changes.
    let ups = updates(&s.fake);
    let up4 = ups
        .iter()
        .rev()
        .find(|u| u.0 == 4)
        .expect("#4 was tested on top of the new base");
    assert_eq!(fix["head_sha"], up4.2.as_str());
    assert_eq!(fix["head_sha"], s.fake.head_sha(REPO, 4));
    assert_eq!(ci_state(&s.fake, &up4.2), "failure");
    assert!(note.contains(&up4.3), "the note names the base: {note}");
    assert!(note.contains("re-tested once"), "note: {note}");
    let q = stored_queue(&s).await;
    assert_eq!(
        (q.stats.flaky_retries, q.stats.flaky_saved),
        (1, 0),
        "one re-test of #4, which failed again: {:?}",
        q.stats
    );
    assert!(q.stats.flaky_checks.is_empty());
    // Ejected, it keeps its ticket (its place in line) while parked.
    let q = stored_queue(&s).await;
    let e4 = q
        .entries
        .iter()
        .find(|e| e.number == 4)
        .expect("#4 keeps its entry");
    assert_eq!(
        (e4.parked, e4.ticket),
        (Some(shepherd::core::queue::Ejection::CiFailed), 4),
        "parked, with the ticket it joined with"
    );
    // The agent pushes a fix (as the bot); a writer approves the new head.
    s.fake.push_fix(REPO, 4);
    s.send(&s.fake.pr_synchronized(REPO, 4, s.fake.bot_login()))
        .await;
    let work_id = fix["id"].as_str().expect("a work id").to_owned();
    assert_eq!(
        s.report(&work_id, "succeeded", None).await,
        202,
        "result accepted"
    );
    approve(&s, 4).await;
    run_until(&s, "#4 merged after its fix", |f| merges(f).len() == 5).await;
    let order: Vec<u64> = merges(&s.fake).iter().map(|m| m.number).collect();
    assert_eq!(order, vec![1, 2, 3, 5, 4]);
    assert_main_stayed_green(&s.fake);
    // No update of a PR already on the tip: every update changed its PR's base.
    let ups = updates(&s.fake);
    assert!(ups.iter().all(|u| u.1 != u.2));
    assert_eq!(
        ups.iter().filter(|u| u.0 == 1).count(),
        0,
        "#1 was on the tip already"
    );
    s.fake.assert_calls_match_openapi();
}

/// An update that conflicts (409) sends the PR to `merge-conflicts`; the queue moves
/// on to the next PR, which merges. Updates use the policy's style (`rebase` here).
#[tokio::test(flavor = "multi_thread")]
async fn a_conflict_on_update_becomes_merge_conflicts_work() {
    let s = start_with("merge_queue_update_style = \"rebase\"\n", 200, &[]).await;
    s.fake.with_model(|m| {
        m.repo_mut(REPO).update_conflicts.insert(2);
    });
    queue_in_order(&s, 3).await;
    run_until(&s, "#1 and #3 merged", |f| merges(f).len() >= 2).await;
    let order: Vec<u64> = merges(&s.fake).iter().map(|m| m.number).collect();
    assert_eq!(order, vec![1, 3]);
    let end = Instant::now() + QUEUE_DEADLINE;
    while work_for(&s, "merge-conflicts", 2).await.is_empty() {
        assert!(Instant::now() < end, "merge-conflicts work for #2");
        pump(&s).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let update_calls = s
        .fake
        .calls("POST", &format!("/repos/{REPO}/pulls/2/update"));
    assert_eq!(
        update_calls.len(),
        1,
        "the conflicting update is not retried"
    );
    assert_eq!(update_calls[0].status, 409);
    // The policy's update style, on every update (#3's too).
    let styles: Vec<_> = s
        .fake
        .calls("POST", &format!("/repos/{REPO}/pulls/*/update"))
        .iter()
        .map(|c| c.query_param("style").map(str::to_owned))
        .collect();
    assert_eq!(styles, vec![Some("rebase".to_owned()); 2], "{styles:?}");
    assert_main_stayed_green(&s.fake);
    s.fake.assert_calls_match_openapi();
}

/// The tip moves while the head is tested (someone pushes to `main`): the head is
/// updated again onto the new tip before it merges, never merged onto an untested
/// base.
#[tokio::test(flavor = "multi_thread")]
async fn a_base_that_moves_during_the_test_means_another_update() {
    let s = start(1_500, &[]).await;
    let prs = open_green(&s, 1).await;
    // Someone else moves main before #1 is ready, and again while it is tested.
    let push = s.fake.push_to_branch(REPO, "main", "someone");
    let moved = s.fake.branch_tip(REPO, "main");
    s.send(&push).await;
    approve_in_order(&s, &prs).await;
    run_until(&s, "#1 updated onto the moved tip", |f| {
        updates(f).iter().any(|u| u.3 == moved)
    })
    .await;
    let push = s.fake.push_to_branch(REPO, "main", "someone");
    let moved_again = s.fake.branch_tip(REPO, "main");
    s.send(&push).await;
    run_until(&s, "#1 merged", |f| merges(f).len() == 1).await;
    let ups = updates(&s.fake);
    assert_eq!(ups.len(), 2, "updated twice: {ups:?}");
    assert_eq!(
        ups[1].3, moved_again,
        "the second update is onto the new tip"
    );
    let m = &merges(&s.fake)[0];
    assert_eq!(m.tip_before, moved_again);
    assert_eq!(m.merged_sha, ups[1].2);
    assert_main_stayed_green(&s.fake);
    s.fake.assert_calls_match_openapi();
}

/// A tip that keeps moving: after `merge_queue_max_updates` (3) updates in one turn
/// and one more move, the head goes to the back of the queue with the reason
/// `base-moving` (status page, metrics) and the next PR is tested; once the tip holds
/// still, the first one merges too.
#[tokio::test(flavor = "multi_thread")]
async fn a_tip_that_keeps_moving_sends_the_head_to_the_back() {
    let s = start(800, &[]).await;
    let prs = open_green(&s, 2).await;
    let push = s.fake.push_to_branch(REPO, "main", "someone");
    s.send(&push).await;
    approve_in_order(&s, &prs[..1]).await;
    // Each time #1 is updated, main moves again while its CI runs.
    let end = Instant::now() + QUEUE_DEADLINE;
    let mut seen = 0;
    while seen < 3 {
        assert!(Instant::now() < end, "#1 updated three times");
        let n = updates(&s.fake).iter().filter(|u| u.0 == 1).count();
        if n > seen {
            seen = n;
            let push = s.fake.push_to_branch(REPO, "main", "someone");
            s.send(&push).await;
            if seen == 3 {
                // #2 enters behind #1 now, so it is next when #1 goes to the back.
                approve_in_order(&s, &prs[1..]).await;
            }
        }
        pump(&s).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run_until(&s, "both merged", |f| merges(f).len() == 2).await;
    let order: Vec<u64> = merges(&s.fake).iter().map(|m| m.number).collect();
    assert_eq!(order, vec![2, 1], "#1 went to the back");
    let ups = updates(&s.fake);
    assert_eq!(
        ups.iter().filter(|u| u.0 == 1).count(),
        4,
        "three updates in its first turn, one in its second: {ups:?}"
    );
    assert_main_stayed_green(&s.fake);
    assert_ejection_shown(&s, "ejections: base-moving 1", "{reason=\"base-moving\"} 1").await;
    s.fake.assert_calls_match_openapi();
}

/// Every Shepherd process is killed (SIGKILL) while the queue's head is being tested
/// and restarted: the queue resumes where it was, with no second update of a head and
/// no second merge.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_mid_queue_resumes_without_double_updates_or_merges() {
    let mut s = start(1_000, &[]).await;
    queue_in_order(&s, 3).await;
    run_until(&s, "#2 updated (its CI running)", |f| {
        updates(f).iter().any(|u| u.0 == 2)
    })
    .await;
    s.restart().await;
    run_until(&s, "all three merged", |f| merges(f).len() == 3).await;
    let order: Vec<u64> = merges(&s.fake).iter().map(|m| m.number).collect();
    assert_eq!(order, vec![1, 2, 3]);
    let ups = updates(&s.fake);
    assert_eq!(
        ups.iter().filter(|u| u.0 == 2).count(),
        1,
        "#2 updated once: {ups:?}"
    );
    for n in 1..=3 {
        let merge_calls = s
            .fake
            .calls("POST", &format!("/repos/{REPO}/pulls/{n}/merge"));
        assert_eq!(merge_calls.len(), 1, "#{n} merged with one call");
        let update_calls = s
            .fake
            .calls("POST", &format!("/repos/{REPO}/pulls/{n}/update"));
        let expected = usize::from(n > 1);
        assert_eq!(
            update_calls.len(),
            expected,
            "#{n}: one update call at most"
        );
    }
    assert_main_stayed_green(&s.fake);
    s.fake.assert_calls_match_openapi();
}

/// The operator's commands through PR comments: `/shepherd queue` answers with the
/// PR's place and why; `/shepherd priority high` puts a PR before every `normal` one
/// (behind the head under test); `/shepherd dequeue` takes a PR out (it does not merge
/// while out, though ready); `/shepherd queue` brings it back. The queue shows on the
/// status page, in `inspect` and in the metrics.
#[tokio::test(flavor = "multi_thread")]
async fn operator_commands_queue_priority_and_dequeue() {
    let s = start(200, &[]).await;
    let prs = open_green(&s, 4).await;
    // #1 merges at once (built on the tip, green); #2 is updated and its CI held.
    hold_ci(&s);
    approve_in_order(&s, &prs).await;
    wait_queue_order(&s, &[2, 3, 4]).await;

    command(&s, 3, "/shepherd queue").await;
    wait_bot_comment(
        &s,
        3,
        "Merge queue: position 2 in the merge queue of `main`",
    )
    .await;
    let out = s.cli(&["inspect", &format!("{REPO}#3")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("queue     main: position 2 of 3, waiting, priority normal"),
        "{text}"
    );
    let page = s.status_page().await;
    assert!(page.contains("id=\"merge-queues\""), "{page}");
    assert!(
        page.contains("<td>1</td><td>acme/widgets#2</td><td>testing</td>"),
        "{page}"
    );

    // #4 goes before #3, never before the head under test.
    command(&s, 4, "/shepherd priority high").await;
    wait_queue_order(&s, &[2, 4, 3]).await;
    // Once #3's record was told (its status comment shows it), it answers with it.
    wait_bot_comment(&s, 3, "Merge queue of `main`: position 3 · priority normal").await;
    command(&s, 3, "/shepherd queue").await;
    wait_bot_comment(&s, 3, "Merge queue: position 3 in the merge queue").await;

    // #3 is taken out: it stays ready but is not tested or merged.
    command(&s, 3, "/shepherd dequeue").await;
    wait_queue_order(&s, &[2, 4]).await;
    release_ci(&s, 200);
    run_until(&s, "#2 and #4 merged", |f| merges(f).len() == 3).await;
    let order: Vec<u64> = merges(&s.fake).iter().map(|m| m.number).collect();
    assert_eq!(order, vec![1, 2, 4]);
    s.wait_idle().await;
    assert_eq!(s.phase(REPO, 3).await, "ready-to-merge");
    assert!(
        merges(&s.fake).iter().all(|m| m.number != 3),
        "not merged while out"
    );

    // Back in: it is updated onto the tip #4 made, tested there, and merged.
    command(&s, 3, "/shepherd queue").await;
    run_until(&s, "#3 merged", |f| merges(f).len() == 4).await;
    assert_main_stayed_green(&s.fake);
    let lines = [
        "shepherd_merge_queue_merged_total{branch=\"main\",repo=\"acme/widgets\"} 4",
        "shepherd_merge_queue_length{branch=\"main\",repo=\"acme/widgets\"} 0",
        "shepherd_merge_queue_updates_total{outcome=\"updated\"} 3",
        "shepherd_merge_queue_wait_seconds_count{branch=\"main\",repo=\"acme/widgets\"} 4",
    ];
    s.metrics_until(&format!("{lines:?}"), |metrics| {
        lines.iter().all(|line| metrics.contains(line))
    })
    .await;
    s.fake.assert_calls_match_openapi();
}

/// Branch protection dismisses stale approvals and the update changes the PR's diff:
/// the update's new head has no approval any more. The PR says so plainly and waits
/// (no second update, no loop); a re-approval brings it back, and it merges without
/// another update (it is on the tip already).
#[tokio::test(flavor = "multi_thread")]
async fn approvals_dismissed_by_the_update_are_reported_and_wait_for_re_approval() {
    let s = start(200, &[]).await;
    s.fake.set_protection(
        REPO,
        crate::support::fake_forgejo::Protection {
            dismiss_stale_approvals: true,
            ..Default::default()
        },
    );
    s.fake
        .with_model(|m| m.repo_mut(REPO).updates_change_diff = true);
    queue_in_order(&s, 2).await;
    run_until(&s, "#1 merged and #2 updated", |f| {
        merges(f).len() == 1 && updates(f).iter().any(|u| u.0 == 2)
    })
    .await;
    run_until(&s, "#2 says it waits for re-approval", |f| {
        f.comments_on(REPO, 2)
            .iter()
            .any(|c| c.body.contains("re-approve to re-enter the merge queue"))
    })
    .await;
    s.wait_idle().await;
    pump(&s).await;
    s.wait_idle().await;
    assert_eq!(
        merges(&s.fake).len(),
        1,
        "#2 is not merged without approval"
    );
    let update_calls = s
        .fake
        .calls("POST", &format!("/repos/{REPO}/pulls/2/update"));
    assert_eq!(update_calls.len(), 1, "no loop of updates");
    assert_eq!(s.phase(REPO, 2).await, "awaiting-review");
    approve(&s, 2).await;
    run_until(&s, "#2 merged after re-approval", |f| merges(f).len() == 2).await;
    let update_calls = s
        .fake
        .calls("POST", &format!("/repos/{REPO}/pulls/2/update"));
    assert_eq!(
        update_calls.len(),
        1,
        "already on the tip: not updated again"
    );
    assert_main_stayed_green(&s.fake);
    s.fake.assert_calls_match_openapi();
}

/// Lets the held CI runs of PR `n` finish now.
fn release_ci_of(s: &Scenario, n: u64) {
    s.fake.with_model(|m| {
        if let Some(ci) = m.repo_mut(REPO).ci.as_mut() {
            let now = Instant::now();
            ci.runs
                .iter_mut()
                .filter(|r| r.pr == n)
                .for_each(|r| r.due = now);
        }
    });
}

/// Waits until `cond` holds, delivering webhooks (held CI runs stay held).
async fn run_until_held(s: &Scenario, what: &str, cond: impl Fn(&FakeForgejo) -> bool) {
    let end = Instant::now() + QUEUE_DEADLINE;
    while !cond(&s.fake) {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        pump(s).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An ejected PR keeps its place: #4 breaks only on top of #2; it is ejected to
/// `ci-fix` while #5 takes the head and #6 waits; once its fix is green and approved it
/// re-enters ahead of #6 (its old position), behind the head under test, and merges
/// before #6. The CI runs finish one PR at a time, as the test releases them (so
/// without the flaky re-test, whose run on a batch branch belongs to no PR here; the
/// re-test is covered by `five_prs_…` and `worker::merge_queue_batch`'s serial tests).
#[tokio::test(flavor = "multi_thread")]
async fn an_ejected_pr_re_enters_at_its_old_position() {
    let s = start_with("merge_queue_flaky_retries = 0\n", 200, &[(4, 2)]).await;
    let prs = open_green(&s, 6).await;
    hold_ci(&s);
    approve_in_order(&s, &prs).await;
    for n in [2, 3] {
        run_until_held(&s, "the head updated", |f| {
            updates(f).iter().any(|u| u.0 == n)
        })
        .await;
        release_ci_of(&s, n);
        run_until_held(&s, "the head merged", |f| {
            merges(f).iter().any(|m| m.number == n)
        })
        .await;
    }
    run_until_held(&s, "#4 updated", |f| updates(f).iter().any(|u| u.0 == 4)).await;
    release_ci_of(&s, 4);
    let end = Instant::now() + QUEUE_DEADLINE;
    let fix = loop {
        if let Some(item) = work_for(&s, "ci-fix", 4).await.into_iter().next() {
            break item;
        }
        assert!(Instant::now() < end, "ci-fix for #4");
        pump(&s).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // #5 is the head now (its CI held), #6 waits behind it.
    wait_queue_order(&s, &[5, 6]).await;
    s.fake.push_fix(REPO, 4);
    s.send(&s.fake.pr_synchronized(REPO, 4, s.fake.bot_login()))
        .await;
    let work_id = fix["id"].as_str().expect("a work id").to_owned();
    assert_eq!(s.report(&work_id, "succeeded", None).await, 202);
    release_ci_of(&s, 4);
    approve(&s, 4).await;
    let end = Instant::now() + QUEUE_DEADLINE;
    while queue_order(&s).await != [5, 4, 6] {
        assert!(
            Instant::now() < end,
            "#4 back at its old place: {:?}",
            queue_order(&s).await
        );
        pump(&s).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    release_ci(&s, 200);
    run_until(&s, "every PR merged", |f| merges(f).len() == 6).await;
    let order: Vec<u64> = merges(&s.fake).iter().map(|m| m.number).collect();
    assert_eq!(order, vec![1, 2, 3, 5, 4, 6]);
    assert_main_stayed_green(&s.fake);
    s.fake.assert_calls_match_openapi();
}

/// A repository that does not allow fast-forward-only merges: the queue still tests
/// each head on top of the then-current tip, and merges it with the policy's style
/// (`merge_style = "merge"` here), pinned to the tested head, on the tip it was tested
/// on. The landed commit is then a merge commit whose content is the tested head's
/// (the head was built on that tip): the guarantee docs/merge-queue.md states for the
/// other styles. Fast-forward-only is never tried where it is not allowed.
#[tokio::test(flavor = "multi_thread")]
async fn without_fast_forward_the_configured_style_merges_the_tested_head_on_its_tip() {
    let s = start_with("merge_style = \"merge\"\n", 200, &[]).await;
    s.fake
        .with_model(|m| m.repo_mut(REPO).no_fast_forward = true);
    queue_in_order(&s, 3).await;
    run_until(&s, "all three merged", |f| merges(f).len() == 3).await;
    let ms = merges(&s.fake);
    let order: Vec<u64> = ms.iter().map(|m| m.number).collect();
    assert_eq!(order, vec![1, 2, 3]);
    let ups = updates(&s.fake);
    for (i, m) in ms.iter().enumerate() {
        assert_eq!(m.style, "merge", "merge {i}: the policy's style: {m:?}");
        assert_eq!(
            m.head_commit_id.as_deref(),
            Some(m.merged_sha.as_str()),
            "merge {i} pinned to the head it merged"
        );
        assert_eq!(
            ci_state(&s.fake, &m.merged_sha),
            "success",
            "CI of merge {i}'s head"
        );
        if i > 0 {
            assert_eq!(
                m.tip_before,
                ms[i - 1].tip_after,
                "merge {i} on the previous tip"
            );
            // The merged head is the one the queue built on that tip and tested.
            let update = ups
                .iter()
                .rfind(|u| u.0 == m.number)
                .unwrap_or_else(|| panic!("#{} was updated onto the tip: {ups:?}", m.number));
            assert_eq!(update.2, m.merged_sha, "merge {i} is of the updated head");
            assert_eq!(
                update.3, m.tip_before,
                "merge {i}'s head was built on its tip"
            );
        }
        let (landed, tested) = s.fake.with_model(|model| {
            let r = &model.repos[REPO];
            (
                r.content.get(&m.tip_after).cloned().unwrap_or_default(),
                r.content.get(&m.merged_sha).cloned().unwrap_or_default(),
            )
        });
        assert!(
            tested.contains(&m.number),
            "#{} is in its head: {tested:?}",
            m.number
        );
        assert_eq!(landed, tested, "merge {i} landed what was tested");
    }
    assert!(
        s.fake
            .all_calls()
            .iter()
            .filter(|c| c.method == "POST" && c.path.ends_with("/merge"))
            .all(|c| c.body.get("Do").and_then(Value::as_str) == Some("merge")),
        "fast-forward-only is never tried where the repository does not allow it"
    );
    s.fake.assert_calls_match_openapi();
}

/// A repository that refuses rebase updates (`allow_rebase_update` off) while the
/// policy asks for them: Forgejo answers the update with a bare 403. The head is not
/// retried blindly: it goes to `needs-human` with the refusal named, leaves the head
/// of the queue, and the next PR is tried (and refused the same way: nothing is
/// merged that could not be brought onto the tip).
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_update_hands_the_pr_to_a_human_and_the_next_is_tried() {
    let s = start_with("merge_queue_update_style = \"rebase\"\n", 200, &[]).await;
    s.fake
        .with_model(|m| m.repo_mut(REPO).no_rebase_update = true);
    let prs = open_green(&s, 3).await;
    // #1 merges on the tip it was opened on; #2 and #3 then need an update.
    approve_in_order(&s, &prs[..1]).await;
    run_until(&s, "#1 merged", |f| merges(f).len() == 1).await;
    approve_in_order(&s, &prs[1..]).await;
    s.wait_phase(REPO, 2, "needs-human").await;
    let refused = s
        .fake
        .calls("POST", &format!("/repos/{REPO}/pulls/2/update"));
    assert_eq!(
        refused.iter().map(|c| c.status).collect::<Vec<_>>(),
        [403],
        "refused once, never retried"
    );
    let out = s.cli(&["inspect", &format!("{REPO}#2")]);
    let view = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{view}");
    assert!(view.contains("refused (403)"), "{view}");
    // #3 is refused the same way: Shepherd never merges a head it could not bring
    // onto the tip, and nothing merged after #1.
    s.wait_phase(REPO, 3, "needs-human").await;
    s.wait_idle().await;
    assert_eq!(merges(&s.fake).len(), 1, "only #1 merged");
    assert_eq!(stored_queue(&s).await.head, None, "no head left in flight");
    s.fake.assert_calls_match_openapi();
}

/// Issue 26: the queue's head whose CI never settles blocks its branch no longer: after
/// `merge_queue_ci_timeout_secs` it is parked (`ci-timeout`, status page and metrics)
/// and the next PR is tested; once its CI settles it re-enters, and both merge.
#[tokio::test(flavor = "multi_thread")]
async fn a_head_whose_ci_never_settles_is_ejected_with_ci_timeout() {
    let s = start_with("merge_queue_ci_timeout_secs = 4\n", 500, &[]).await;
    let prs = open_green(&s, 2).await;
    // main moves, so #1 is updated and its CI on the new head runs (held).
    move_main_and_update_the_head_with_ci_held(&s, &prs).await;
    let end = Instant::now() + QUEUE_DEADLINE;
    loop {
        let q = stored_queue(&s).await;
        let parked = q
            .entries
            .iter()
            .find(|e| e.number == 1)
            .and_then(|e| e.parked);
        if parked == Some(shepherd::core::queue::Ejection::CiTimeout) {
            assert_ne!(q.head, Some(1), "the next PR is tested: {q:?}");
            break;
        }
        assert!(Instant::now() < end, "#1 ejected with ci-timeout: {q:?}");
        pump_outbox(&s).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(merges(&s.fake).is_empty(), "nothing merged untested");
    release_ci(&s, 200);
    run_until(&s, "both merged", |f| merges(f).len() == 2).await;
    assert_main_stayed_green(&s.fake);
    assert_ejection_shown(&s, "ci-timeout", "{reason=\"ci-timeout\"}").await;
    s.fake.assert_calls_match_openapi();
}

/// Issue 26: a head retargeted to another branch while it is tested (its `edited`
/// webhook lost) is never merged by this branch's queue: the advance takes it out of
/// `main`'s queue (`retargeted`) and the next PR merges into main; the retargeted PR
/// goes through `dev`'s queue instead (updated onto dev's tip and tested there first).
#[tokio::test(flavor = "multi_thread")]
async fn the_advance_leaves_a_retargeted_head_out_of_the_queue() {
    let s = start(500, &[]).await;
    let prs = open_green(&s, 2).await;
    // `dev` stays at main's old tip.
    let dev_tip = s.fake.branch_tip(REPO, "main");
    s.fake.with_model(|m| {
        (m.repo_mut(REPO).branches).insert("dev".into(), dev_tip.clone());
    });
    move_main_and_update_the_head_with_ci_held(&s, &prs).await;
    // #1 now targets `dev`; no webhook says so.
    s.fake.with_model(|m| {
        let r = m.repo_mut(REPO);
        if let Some(pull) = r.issues.get_mut(&1).and_then(|i| i.pull.as_mut()) {
            pull.base_ref = "dev".into();
        }
    });
    release_ci(&s, 200);
    // Every webhook about #1 is lost until it left main's queue: only the advance can
    // find out.
    let end = Instant::now() + QUEUE_DEADLINE;
    while queue_entries(&s).await.contains(&1) {
        assert!(Instant::now() < end, "#1 left main's queue");
        let hooks = s
            .fake
            .finish_ci_runs()
            .into_iter()
            .chain(s.fake.take_outbox());
        for hook in hooks.collect::<Vec<_>>() {
            let p = &hook.payload;
            let n = p["pull_request"]["number"]
                .as_u64()
                .or_else(|| p["issue"]["number"].as_u64());
            if n != Some(1) {
                s.send(&hook).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run_until(&s, "both merged", |f| merges(f).len() == 2).await;
    let all = merges(&s.fake);
    let two = all.iter().find(|m| m.number == 2).expect("#2 merged");
    assert_eq!(two.tip_after, s.fake.branch_tip(REPO, "main"), "{all:?}");
    // #1 went into dev, after an update onto dev's tip (tested there), never merged
    // by main's queue on main's tip.
    let one = all.iter().find(|m| m.number == 1).expect("#1 merged");
    assert_eq!(one.tip_before, dev_tip, "{all:?}");
    assert_eq!(one.tip_after, s.fake.branch_tip(REPO, "dev"));
    let onto_dev = updates(&s.fake)
        .into_iter()
        .find(|u| u.0 == 1 && u.3 == dev_tip);
    let onto_dev = onto_dev.expect("#1 updated onto dev's tip before its merge");
    assert_eq!(
        one.merged_sha, onto_dev.2,
        "the merged head is the one tested on dev"
    );
}
