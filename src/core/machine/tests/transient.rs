//! Transient agent failures (issue 27): a `transient` result ends the claim without an
//! attempt, the same work comes back at the same tier after a back-off that doubles,
//! and past `transient_retries` in a row the next one is a failed attempt — an agent
//! that says `transient` forever still escalates and ends at a human.

use super::*;
use crate::core::event::{IssueAction, IssueSnapshot};
use crate::core::machine::{IssuePhase, decide_issue};
use crate::core::record::{AttemptOutcome, IssueRecord};
use crate::core::usage::{StopReason, Usage};

/// `ci / test` failing.
const FAIL: (&str, CiState, &str) = ("ci / test", CiState::Failure, "Failing after 1m2s");

/// A PR whose failing CI has its first `ci-fix` claimed.
fn claimed() -> H {
    let mut h = H::opened();
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    assert!(h.r.work.active.is_some());
    h
}

/// A `transient` report of `id`, with what the run cost.
fn transient(id: &WorkId) -> Event {
    Event::WorkResult {
        work_id: id.clone(),
        outcome: WorkOutcome::Transient,
        signature: Some("exit:1".into()),
        summary: Some("Error: Rate limit reached for requests".into()),
        usage: Some(Usage {
            input_tokens: 100,
            cost_micros: 2_000,
            ..Usage::default()
        }),
        stopped: None,
    }
}

/// The due time of the back-off timer among the last step's effects.
fn backoff_due(h: &H) -> Option<i64> {
    h.effects().iter().find_map(|e| match &e.kind {
        EffectKind::Schedule(t) if t.kind == TimerKind::TransientRetry => Some(t.due_ms),
        _ => None,
    })
}

/// The dispatched item of the last step, if any.
fn dispatched(h: &H) -> Option<crate::core::effect::WorkItem> {
    h.effects().iter().find_map(|e| match &e.kind {
        EffectKind::Dispatch(w) => Some(w.clone()),
        _ => None,
    })
}

/// Reports the active item transient and fires the back-off timer when it is due;
/// returns the back-off in seconds and the item dispatched again.
fn transient_then_retry(h: &mut H) -> (i64, crate::core::effect::WorkItem) {
    let id = h.work_id();
    h.later(30);
    h.step(transient(&id));
    let due = backoff_due(h).expect("a back-off timer");
    let secs = (due - h.now) / 1000;
    h.now = due;
    h.step(timer(TimerKind::TransientRetry, due));
    let again = dispatched(h).expect("the same work again once the back-off is over");
    (secs, again)
}

#[test]
fn a_transient_failure_is_no_attempt_and_comes_back_at_the_same_tier_after_the_backoff() {
    let mut h = claimed();
    let first = h.r.work.active.clone().unwrap().item;
    assert_eq!((first.tier, first.attempt), (0, 1));
    h.later(30);
    let fx = h.step(transient(&first.id));
    assert_eq!(
        fx,
        lines(&["timer transient-retry +30s", "status ci-fix"]),
        "the claim and tier labels stay; nothing is dispatched yet"
    );
    assert!(h.r.work.active.is_none());
    assert!(h.r.work.attempts.is_empty(), "no attempt counted");
    assert_eq!(h.r.work.tier, 0);
    assert_eq!(h.r.work.budget.spent_micros, 2_000, "what it cost counts");
    assert_eq!(h.phase(), Phase::CiFix);
    assert!(
        h.reason().contains("transient agent failure 1 of 3"),
        "{}",
        h.reason()
    );
    // A duplicated report changes nothing.
    assert!(step(&h.r, &transient(&first.id), h.now, &h.p).is_noop());
    // Before the back-off ends nothing starts, whatever wakes the record (an early
    // timer, a new status read).
    h.later(10);
    assert_eq!(
        h.step(timer(TimerKind::TransientRetry, h.now)),
        Vec::<String>::new()
    );
    h.step(status('a', &[FAIL], h.now));
    assert!(dispatched(&h).is_none() && h.r.work.active.is_none());
    h.later(20);
    let fx = h.step(timer(TimerKind::TransientRetry, h.now));
    assert_eq!(
        fx,
        lines(&[
            "dispatch ci-fix tier=0 attempt=1 head=aaa",
            "timer claim-expiry +7200s",
            "status ci-fix",
        ])
    );
    let again = h.r.work.active.clone().unwrap().item;
    assert_ne!(again.id, first.id, "a new work item");
    assert!(
        again.context.attempts.is_empty(),
        "its history has no attempt"
    );
}

#[test]
fn the_backoff_doubles_and_the_bound_makes_the_next_one_a_failed_attempt() {
    let mut h = claimed();
    let mut backoffs = Vec::new();
    for _ in 0..3 {
        let (secs, again) = transient_then_retry(&mut h);
        backoffs.push(secs);
        assert_eq!(
            (again.tier, again.attempt),
            (0, 1),
            "same tier, same attempt"
        );
    }
    assert_eq!(backoffs, [30, 60, 120]);
    assert!(h.r.work.attempts.is_empty());
    // The fourth in a row is past `transient_retries = 3`: a failed attempt, and the
    // same problem escalates at once.
    let id = h.work_id();
    h.later(30);
    h.step(transient(&id));
    assert!(backoff_due(&h).is_none(), "no more back-off");
    assert_eq!(h.r.work.attempts.len(), 1);
    assert_eq!(h.r.work.attempts[0].outcome, AttemptOutcome::Failed);
    assert_eq!(
        h.r.work.attempts[0].reported_signature.as_deref(),
        Some("exit:1")
    );
    let next = dispatched(&h).expect("the next attempt");
    assert_eq!((next.tier, next.attempt), (1, 2));
    assert!(
        h.r.work.transient.is_none(),
        "a counted result ends the row"
    );
    // The next tier gets its own retries.
    let (secs, again) = transient_then_retry(&mut h);
    assert_eq!((secs, again.tier, again.attempt), (30, 1, 2));
}

#[test]
fn a_counted_result_ends_the_row_of_transient_failures() {
    let mut h = claimed();
    transient_then_retry(&mut h);
    transient_then_retry(&mut h);
    let id = h.work_id();
    h.later(30);
    h.step(result(&id, WorkOutcome::Failed));
    assert!(h.r.work.transient.is_none());
    let (secs, again) = transient_then_retry(&mut h);
    assert_eq!(secs, 30, "the first of a new row");
    assert_eq!((again.tier, again.attempt), (1, 2));
}

#[test]
fn a_run_stopped_for_a_limit_is_never_transient() {
    for (reason, outcome) in [
        (StopReason::OverBudget, AttemptOutcome::OverBudget),
        (StopReason::Loop, AttemptOutcome::Failed),
    ] {
        let mut h = claimed();
        let id = h.work_id();
        h.later(30);
        let mut e = transient(&id);
        if let Event::WorkResult { stopped, .. } = &mut e {
            *stopped = Some(reason);
        }
        h.step(e);
        assert!(backoff_due(&h).is_none(), "{reason:?}");
        assert_eq!(h.r.work.attempts.len(), 1, "{reason:?}");
        assert_eq!(h.r.work.attempts[0].outcome, outcome, "{reason:?}");
    }
}

#[test]
fn zero_retries_makes_every_transient_failure_an_attempt() {
    let mut h = H::with(Policy {
        transient_retries: 0,
        ..policy()
    });
    h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    let id = h.work_id();
    h.step(transient(&id));
    assert_eq!(h.r.work.attempts[0].outcome, AttemptOutcome::Failed);
    assert_eq!(dispatched(&h).map(|w| w.tier), Some(1));
}

#[test]
fn an_agent_that_always_says_transient_still_escalates_and_ends_at_a_human() {
    let mut h = claimed();
    let mut runs = 1;
    let mut tiers = Vec::new();
    while h.phase() != Phase::NeedsHuman {
        assert!(runs <= 100, "unbounded: {runs} runs");
        let id = h.work_id();
        tiers.push(h.r.work.active.as_ref().unwrap().item.tier);
        h.later(30);
        h.step(transient(&id));
        if let Some(due) = backoff_due(&h) {
            h.now = due;
            h.step(timer(TimerKind::TransientRetry, due));
        }
        if h.r.work.active.is_some() {
            runs += 1;
        }
    }
    // Tiers 0..3 until the top, then `stuck_after` attempts there: each attempt is
    // `transient_retries + 1` runs.
    let attempts = usize::from(h.p.top_tier()) + h.p.stuck_after as usize;
    let per = h.p.transient_retries as usize + 1;
    assert_eq!(runs, attempts * per);
    assert_eq!(h.r.work.attempts.len(), attempts);
    assert!(
        h.r.work
            .attempts
            .iter()
            .all(|a| a.outcome == AttemptOutcome::Failed)
    );
    assert!(
        tiers.windows(2).all(|w| w[0] <= w[1]),
        "tiers never go down"
    );
    assert_eq!(*tiers.last().unwrap(), h.p.top_tier());
}

#[test]
fn the_backoff_is_durable_state_that_survives_a_reload() {
    let mut h = claimed();
    let id = h.work_id();
    h.later(30);
    h.step(transient(&id));
    let due = backoff_due(&h).unwrap();
    // The record as stored and loaded again (a restart): still waiting, then the
    // timer (stored with the record's effects) dispatches.
    let json = serde_json::to_string(&h.r).unwrap();
    h.r = serde_json::from_str(&json).unwrap();
    assert_eq!(h.r.work.transient.as_ref().unwrap().retry_at_ms, Some(due));
    h.now = due;
    h.step(timer(TimerKind::TransientRetry, due));
    assert_eq!(dispatched(&h).map(|w| (w.tier, w.attempt)), Some((0, 1)));
    // A record stored before this field existed loads without it.
    let mut old: serde_json::Value = serde_json::from_str(&json).unwrap();
    old["work"].as_object_mut().unwrap().remove("transient");
    let r: PrRecord = serde_json::from_value(old).unwrap();
    assert!(r.work.transient.is_none());
}

/// An open issue with the trigger label.
fn labelled_issue(updated: i64) -> IssueSnapshot {
    IssueSnapshot {
        repo: repo(),
        number: 9,
        open: true,
        title: "Widget overflows".into(),
        body: String::new(),
        author: Some(login("alice")),
        labels: BTreeSet::from(["auto/implement".to_owned()]),
        updated_ms: updated,
    }
}

#[test]
fn an_issues_transient_failure_waits_for_the_timer_then_the_same_tier() {
    let p = policy();
    let mut r = IssueRecord::new(repo(), 9);
    let labelled = Event::Issue {
        action: IssueAction::Labeled,
        issue: labelled_issue(T0),
        sender: Some(login("alice")),
    };
    r = step_issue_answered(&r, &labelled, T0, &p).record;
    let id = r.work.active.as_ref().unwrap().item.id.clone();
    let t = step_issue_answered(&r, &transient(&id), T0 + 1_000, &p);
    let shown: Vec<String> = t.effects.iter().map(|e| show(e, T0 + 1_000)).collect();
    assert_eq!(shown, lines(&["timer transient-retry +30s"]));
    r = t.record;
    assert!(r.work.active.is_none() && r.work.attempts.is_empty());
    let d = decide_issue(&r, &p);
    assert_eq!(d.phase, IssuePhase::Implementing);
    assert!(
        d.reason.contains("transient agent failure 1 of 3"),
        "{}",
        d.reason
    );
    let timer_event = |due: i64| Event::TimerFired {
        repo: repo(),
        scope: Scope::Issue,
        number: 9,
        timer: Timer {
            due_ms: due,
            id: "transient-retry".into(),
            kind: TimerKind::TransientRetry,
        },
    };
    let early = step_issue_answered(&r, &timer_event(T0 + 2_000), T0 + 2_000, &p);
    assert!(early.is_noop(), "not before its time");
    let due = T0 + 31_000;
    let t = step_issue_answered(&r, &timer_event(due), due, &p);
    let shown: Vec<String> = t.effects.iter().map(|e| show(e, due)).collect();
    // The dependencies are read again first (the claim is down meanwhile), then the
    // same tier and attempt number.
    assert!(
        shown.contains(&"dispatch issue-impl tier=0 attempt=1 head=-".to_owned()),
        "{shown:?}"
    );
}

#[test]
fn transient_patterns_must_compile_and_the_bounds_hold() {
    let bad = crate::core::policy::PolicyFile::from_toml(
        "[defaults]\ntransient_patterns = ['429', '(unclosed']\n",
    )
    .unwrap_err()
    .to_string();
    assert!(bad.contains("transient_patterns[1]"), "{bad}");
    assert!(bad.contains("(unclosed"), "{bad}");
    let empty =
        crate::core::policy::PolicyFile::from_toml("[defaults]\ntransient_patterns = [' ']\n")
            .unwrap_err()
            .to_string();
    assert!(empty.contains("transient_patterns[0]"), "{empty}");
    let per_repo = crate::core::policy::PolicyFile::from_toml(
        "[repos.\"acme/widgets\"]\ntransient_patterns = ['a{99999999}']\n",
    )
    .unwrap_err()
    .to_string();
    assert!(per_repo.contains("transient_patterns[0]"), "{per_repo}");
    let many = crate::core::policy::PolicyFile::from_toml("[defaults]\ntransient_retries = 21\n")
        .unwrap_err()
        .to_string();
    assert!(many.contains("transient_retries"), "{many}");
    let ok = crate::core::policy::PolicyFile::from_toml(
        "[defaults]\ntransient_patterns = ['quota exceeded']\ntransient_retries = 5\n",
    )
    .unwrap();
    let p = ok.for_repo(&repo());
    assert_eq!((p.transient_patterns.len(), p.transient_retries), (1, 5));
}
