//! `push_grace_secs` (issue 27): a `succeeded` result whose push (PR work) or PR
//! (issue work) never comes counts as `no-changes` at the grace's end, and
//! `no-changes` is a failed attempt for the same-problem rule.

use super::*;
use crate::core::event::{IssueAction, IssueSnapshot};
use crate::core::machine::{IssuePhase, decide_issue};
use crate::core::record::{AttemptOutcome, Hold, IssueRecord};

/// A failing `ci / test` read of `head` at `at`.
fn red(head: char, at: i64) -> Event {
    status(head, &[("ci / test", CiState::Failure, "tests failed")], at)
}

/// The push-grace timer of `id`.
fn grace(id: &WorkId) -> TimerKind {
    TimerKind::PushGrace {
        work_id: id.clone(),
    }
}

/// A bot PR with red CI on head `a` and a ci-fix dispatched.
fn red_pr() -> H {
    let mut h = H::opened_bot();
    h.later(1);
    let fx = h.step(red('a', h.now));
    assert_eq!(fx[0], "dispatch ci-fix tier=0 attempt=1 head=aaa");
    h
}

/// The agent reports success for the active item without pushing; returns the
/// work id and the effects.
fn succeeded_without_push(h: &mut H) -> (WorkId, Vec<String>) {
    let id = h.work_id();
    h.later(60);
    let fx = h.step(result(&id, WorkOutcome::Succeeded));
    (id, fx)
}

#[test]
fn a_success_without_a_push_becomes_no_changes_and_escalates() {
    let mut h = red_pr();
    let (id, fx) = succeeded_without_push(&mut h);
    assert!(fx.contains(&"timer push-grace +300s".to_owned()), "{fx:?}");
    assert!(
        h.reason().contains("waiting for the push of attempt 1"),
        "{}",
        h.reason()
    );
    // Before the grace ends the record still waits (an early firing is a no-op for
    // a timer the store fires only when due; here the grace is the whole wait).
    h.later(300);
    let fx = h.step(timer(grace(&id), h.now));
    assert_eq!(h.r.work.attempts[0].outcome, AttemptOutcome::NoChanges);
    assert!(
        h.r.work.attempts[0]
            .summary
            .as_deref()
            .unwrap()
            .contains("push_grace_secs"),
    );
    assert_eq!(fx[0], "dispatch ci-fix tier=1 attempt=2 head=aaa", "{fx:?}");
    // A second firing (a redelivered timer) changes nothing.
    let before = h.r.clone();
    let t = step(&h.r, &timer(grace(&id), h.now), h.now, &h.p);
    assert_eq!(t.record, before);
    assert!(t.effects.is_empty());
}

/// A folded record (`rebuild --apply` writes it without the fold's effects) names the
/// push-grace timer it waits on, due `push_grace_secs` after the result, so the wait
/// still ends; once the attempt is `no-changes` it names none.
#[test]
fn a_folded_record_waiting_for_a_push_names_its_grace_timer() {
    let mut h = red_pr();
    assert!(
        crate::core::machine::standing_timers(&h.r.work, &h.p).is_empty(),
        "a running item stands on its claim timer only"
    );
    let (id, _) = succeeded_without_push(&mut h);
    let ended = h.r.work.attempts[0].ended_ms;
    let timers = crate::core::machine::standing_timers(&h.r.work, &h.p);
    assert_eq!(timers.len(), 1, "{timers:?}");
    assert_eq!(timers[0].kind, grace(&id));
    assert_eq!(timers[0].due_ms, ended + 300_000);
    h.later(300);
    h.step(timer(grace(&id), h.now));
    let timers = crate::core::machine::standing_timers(&h.r.work, &h.p);
    assert!(timers.iter().all(|t| t.kind != grace(&id)), "{timers:?}");
}

#[test]
fn a_push_within_the_grace_keeps_the_success() {
    let mut h = red_pr();
    let (id, _) = succeeded_without_push(&mut h);
    h.later(100);
    let pushed = PrSnapshot {
        mergeable: None,
        head_sha: Some(sha('b')),
        updated_ms: h.now,
        ..h.r.pr.clone().unwrap()
    };
    h.step(pr_event(PrAction::Synchronized, pushed, "bot"));
    h.later(200);
    let t = step(&h.r, &timer(grace(&id), h.now), h.now, &h.p);
    assert_eq!(t.record.work.attempts[0].outcome, AttemptOutcome::Succeeded);
    assert!(
        !t.effects
            .iter()
            .any(|e| matches!(e.kind, EffectKind::Dispatch(_)))
    );
}

#[test]
fn a_push_before_the_result_arms_no_grace() {
    let mut h = red_pr();
    let id = h.work_id();
    let pushed = PrSnapshot {
        mergeable: None,
        head_sha: Some(sha('b')),
        updated_ms: h.now + 1,
        ..h.r.pr.clone().unwrap()
    };
    h.later(10);
    h.step(pr_event(PrAction::Synchronized, pushed, "bot"));
    h.later(10);
    let fx = h.step(result(&id, WorkOutcome::Succeeded));
    assert!(!fx.iter().any(|l| l.contains("push-grace")), "{fx:?}");
    assert_eq!(h.r.work.attempts[0].outcome, AttemptOutcome::Succeeded);
}

#[test]
fn no_changes_raises_the_tier_and_ends_in_needs_human() {
    let mut h = red_pr();
    let top = usize::from(h.p.top_tier());
    let stuck = h.p.stuck_after as usize;
    // tiers 0..top once each, then `stuck_after` attempts at the top.
    let runs = top + stuck;
    for n in 1..=runs {
        let (id, _) = succeeded_without_push(&mut h);
        h.later(i64::try_from(h.p.push_grace_secs).unwrap());
        let fx = h.step(timer(grace(&id), h.now));
        let a = h.r.work.attempts.last().unwrap();
        assert_eq!(a.outcome, AttemptOutcome::NoChanges);
        assert_eq!(usize::from(a.tier), (n - 1).min(top), "attempt {n}");
        if n < runs {
            let want = format!(
                "dispatch ci-fix tier={} attempt={} head=aaa",
                n.min(top),
                n + 1
            );
            assert_eq!(fx[0], want, "after attempt {n}");
        } else {
            assert!(fx.iter().any(|l| l == "comment #7"), "{fx:?}");
            assert!(!fx.iter().any(|l| l.starts_with("dispatch")), "{fx:?}");
        }
    }
    assert!(matches!(h.r.work.hold, Some(Hold::NeedsHuman { .. })));
    assert_eq!(h.phase(), Phase::NeedsHuman);
}

#[test]
fn a_reported_no_changes_counts_as_a_failed_attempt_for_the_same_problem() {
    let p = policy();
    let mut h = red_pr();
    let id = h.work_id();
    h.later(30);
    let fx = h.step(result(&id, WorkOutcome::NoChanges));
    assert!(!fx.iter().any(|l| l.contains("push-grace")), "{fx:?}");
    assert_eq!(fx[0], "dispatch ci-fix tier=1 attempt=2 head=aaa");
    let ws = &h.r.work;
    let sig = ws.active.as_ref().unwrap().signature.clone();
    assert_eq!(
        super::super::work::next_tier(ws, WorkKind::CiFix, &sig, &p),
        1
    );
    // At the top tier, `stuck_after` no-changes make the PR stuck.
    let mut ws = ws.clone();
    ws.active = None;
    ws.tier = p.top_tier();
    for _ in 0..p.stuck_after {
        let mut a = ws.attempts[0].clone();
        a.tier = p.top_tier();
        a.outcome = AttemptOutcome::NoChanges;
        assert!(!super::super::work::is_stuck(
            &ws,
            WorkKind::CiFix,
            &sig,
            &p
        ));
        ws.attempts.push(a);
    }
    assert!(super::super::work::is_stuck(&ws, WorkKind::CiFix, &sig, &p));
}

use crate::core::effect::WorkKind;

/// Issue number used here.
const ISSUE: u64 = 9;

/// The labelled, open issue.
fn labelled(at: i64) -> Event {
    Event::Issue {
        action: IssueAction::Labeled,
        issue: IssueSnapshot {
            repo: repo(),
            number: ISSUE,
            open: true,
            title: "Widget overflows".into(),
            body: String::new(),
            author: Some(login("alice")),
            labels: BTreeSet::from(["auto/implement".to_owned()]),
            updated_ms: at,
        },
        sender: Some(login("alice")),
    }
}

/// A PR event for PR 40 by `author` that links the issue.
fn linking_pr(state: PrState, author: &str, at: i64) -> Event {
    let action = match state {
        PrState::Open => PrAction::Opened,
        PrState::Closed | PrState::Merged => PrAction::Closed,
    };
    Event::PullRequest {
        action,
        pr: PrSnapshot {
            number: 40,
            state,
            author: Some(login(author)),
            body: format!("Closes #{ISSUE}"),
            ..snap('c', at)
        },
        base_changed_from: None,
        sender: Some(login(author)),
    }
}

/// An issue timer.
fn issue_timer(kind: TimerKind, due: i64) -> Event {
    Event::TimerFired {
        repo: repo(),
        scope: Scope::Issue,
        number: ISSUE,
        timer: Timer {
            due_ms: due,
            id: kind.name().into(),
            kind,
        },
    }
}

/// Steps an issue record, returning the effects as lines.
fn go(r: &mut IssueRecord, e: Event, now: i64, p: &Policy) -> Vec<String> {
    let t = step_issue_answered(r, &e, now, p);
    *r = t.record;
    t.effects.iter().map(|x| show(x, now)).collect()
}

/// An issue whose issue-impl reported success without a PR.
fn issue_succeeded(p: &Policy) -> (IssueRecord, WorkId, i64) {
    let mut r = IssueRecord::new(repo(), ISSUE);
    let fx = go(&mut r, labelled(T0), T0, p);
    assert_eq!(fx[0], "dispatch issue-impl tier=0 attempt=1 head=-");
    let id = r.work.active.as_ref().unwrap().item.id.clone();
    let now = T0 + 60_000;
    let fx = go(&mut r, result(&id, WorkOutcome::Succeeded), now, p);
    assert!(fx.contains(&"timer push-grace +300s".to_owned()), "{fx:?}");
    assert_eq!(decide_issue(&r, p).phase, IssuePhase::AwaitingPr);
    (r, id, now)
}

#[test]
fn an_issue_success_without_a_pr_becomes_no_changes() {
    let p = policy();
    let (mut r, id, now) = issue_succeeded(&p);
    let now = now + 300_000;
    let fx = go(&mut r, issue_timer(grace(&id), now), now, &p);
    assert_eq!(r.work.attempts[0].outcome, AttemptOutcome::NoChanges);
    assert_eq!(
        fx[0], "dispatch issue-impl tier=1 attempt=2 head=-",
        "{fx:?}"
    );
}

#[test]
fn an_agent_pr_within_the_grace_keeps_the_issue_success() {
    let p = Policy {
        agent_logins: vec!["agent-1".into()],
        ..policy()
    };
    let (mut r, id, now) = issue_succeeded(&p);
    // An agent user's own PR (not the bot's) holds the issue.
    let now = now + 10_000;
    go(&mut r, linking_pr(PrState::Open, "agent-1", now), now, &p);
    assert_eq!(decide_issue(&r, &p).phase, IssuePhase::AwaitingMerge);
    let now = now + 300_000;
    let fx = go(&mut r, issue_timer(grace(&id), now), now, &p);
    assert_eq!(fx, Vec::<String>::new());
    assert_eq!(r.work.attempts[0].outcome, AttemptOutcome::Succeeded);
    // The PR closes unmerged: the wait for a PR gets a deadline again.
    let now = now + 10_000;
    let fx = go(&mut r, linking_pr(PrState::Closed, "agent-1", now), now, &p);
    assert!(fx.contains(&"timer push-grace +300s".to_owned()), "{fx:?}");
    assert_eq!(decide_issue(&r, &p).phase, IssuePhase::AwaitingPr);
    let now = now + 300_000;
    let fx = go(&mut r, issue_timer(grace(&id), now), now, &p);
    assert_eq!(r.work.attempts[0].outcome, AttemptOutcome::NoChanges);
    assert_eq!(
        fx[0], "dispatch issue-impl tier=1 attempt=2 head=-",
        "{fx:?}"
    );
}

#[test]
fn an_outsiders_pr_does_not_keep_the_issue_success() {
    let p = policy();
    let (mut r, id, now) = issue_succeeded(&p);
    let now = now + 10_000;
    go(&mut r, linking_pr(PrState::Open, "mallory", now), now, &p);
    let now = now + 300_000;
    go(&mut r, issue_timer(grace(&id), now), now, &p);
    assert_eq!(r.work.attempts[0].outcome, AttemptOutcome::NoChanges);
}

#[test]
fn a_pr_closed_and_reopened_during_the_grace_does_not_wait_for_the_push_again() {
    let mut h = red_pr();
    let (id, _) = succeeded_without_push(&mut h);
    h.later(10);
    let closed = PrSnapshot {
        state: PrState::Closed,
        updated_ms: h.now,
        ..h.r.pr.clone().unwrap()
    };
    h.step(pr_event(PrAction::Closed, closed, "alice"));
    h.later(300);
    let t = step(&h.r, &timer(grace(&id), h.now), h.now, &h.p);
    assert!(t.effects.is_empty(), "closed: the grace changes nothing");
    h.later(600);
    let reopened = PrSnapshot {
        state: PrState::Open,
        updated_ms: h.now,
        ..h.r.pr.clone().unwrap()
    };
    let fx = h.step(pr_event(PrAction::Reopened, reopened, "alice"));
    assert!(
        fx.contains(&"dispatch ci-fix tier=1 attempt=2 head=aaa".to_owned()),
        "{fx:?}"
    );
}
