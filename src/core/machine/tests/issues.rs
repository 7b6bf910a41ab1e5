//! `step_issue`: issue-impl dispatch, cancel on close, done when a linking PR opens.

use super::*;
use crate::core::event::{IssueAction, IssueSnapshot};
use crate::core::machine::{IssuePhase, IssueTransition, decide_issue, step_issue};
use crate::core::record::{AttemptOutcome, IssueRecord};

/// Issue number used here.
const ISSUE: u64 = 9;

/// An open issue, optionally with the trigger label.
fn issue(labelled: bool, open: bool, updated: i64) -> IssueSnapshot {
    IssueSnapshot {
        repo: repo(),
        number: ISSUE,
        open,
        title: "Widget overflows".into(),
        body: String::new(),
        author: Some(login("alice")),
        labels: match labelled {
            true => BTreeSet::from(["auto/implement".to_owned()]),
            false => BTreeSet::new(),
        },
        updated_ms: updated,
    }
}

/// An issue webhook.
fn ev(action: IssueAction, snap: IssueSnapshot, sender: &str) -> Event {
    Event::Issue {
        action,
        issue: snap,
        sender: Some(login(sender)),
    }
}

/// Steps and returns the effects as lines.
fn go(r: &mut IssueRecord, e: Event, now: i64, p: &Policy) -> (Vec<String>, IssueTransition) {
    let t = step_issue(r, &e, now, p);
    let shown = t.effects.iter().map(|x| show(x, now)).collect();
    *r = t.record.clone();
    (shown, t)
}

#[test]
fn labelled_issue_dispatches_issue_impl_with_low_priority() {
    let p = policy();
    let mut r = IssueRecord::new(repo(), ISSUE);
    let (fx, t) = go(
        &mut r,
        ev(IssueAction::Labeled, issue(true, true, T0), "alice"),
        T0,
        &p,
    );
    assert_eq!(
        fx,
        lines(&[
            "dispatch issue-impl tier=0 attempt=1 head=-",
            "timer claim-expiry +7200s",
            "+auto/claimed-implementer,auto/last-attempt-tier-0",
        ])
    );
    let EffectKind::Dispatch(item) = &t.effects[0].kind else {
        panic!("not a dispatch");
    };
    assert_eq!(item.priority, 10);
    assert!(item.priority < crate::core::effect::WorkKind::CiFix.priority());
    assert_eq!(
        serde_json::to_value(item).unwrap()["head_sha"],
        serde_json::Value::Null
    );
    assert_eq!(decide_issue(&r, &p).phase, IssuePhase::Implementing);
    // Duplicate delivery: nothing.
    assert!(
        step_issue(
            &r,
            &ev(IssueAction::Labeled, issue(true, true, T0), "alice"),
            T0,
            &p
        )
        .is_noop()
    );
}

#[test]
fn unlabelled_or_bot_labelled_issues_wait_and_implement_command_starts() {
    let p = Policy {
        trusted_users: vec!["alice".into()],
        ..policy()
    };
    let mut r = IssueRecord::new(repo(), ISSUE);
    let (fx, _) = go(
        &mut r,
        ev(IssueAction::Opened, issue(false, true, T0), "alice"),
        T0,
        &p,
    );
    assert_eq!(fx, Vec::<String>::new());
    let (fx, _) = go(
        &mut r,
        ev(IssueAction::Labeled, issue(true, true, T0 + 1), "bot"),
        T0,
        &p,
    );
    assert_eq!(
        fx,
        Vec::<String>::new(),
        "the bot's own label never starts work"
    );
    let mut r = IssueRecord::new(repo(), ISSUE);
    go(
        &mut r,
        ev(IssueAction::Opened, issue(false, true, T0), "alice"),
        T0,
        &p,
    );
    let cmd = Event::Comment {
        repo: repo(),
        number: ISSUE,
        is_pull: false,
        comment_id: 5,
        commands: crate::core::command::parse("/shepherd implement"),
        at_ms: T0,
        sender: Some(login("alice")),
    };
    let (fx, _) = go(&mut r, cmd, T0, &p);
    assert_eq!(fx[0], "dispatch issue-impl tier=0 attempt=1 head=-");
}

#[test]
fn closing_cancels_and_a_linking_pr_finishes() {
    let p = policy();
    let mut r = IssueRecord::new(repo(), ISSUE);
    go(
        &mut r,
        ev(IssueAction::Labeled, issue(true, true, T0), "alice"),
        T0,
        &p,
    );
    let id = r.work.active.as_ref().unwrap().item.id.clone();
    let mut closed = r.clone();
    let (fx, _) = go(
        &mut closed,
        ev(IssueAction::Closed, issue(true, false, T0 + 5), "alice"),
        T0,
        &p,
    );
    assert_eq!(
        fx,
        lines(&[&format!("cancel {id}"), "-auto/claimed-implementer"])
    );
    assert_eq!(decide_issue(&closed, &p).phase, IssuePhase::Closed);

    let pr = pr_event(PrAction::Opened, bot_snap('a', T0 + 10), "bot");
    let (fx, _) = go(&mut r, pr.clone(), T0 + 10, &p);
    assert_eq!(fx, lines(&["-auto/claimed-implementer"]));
    assert_eq!(r.done_by_pr, Some(PR));
    assert_eq!(r.work.attempts[0].outcome, AttemptOutcome::Superseded);
    assert_eq!(decide_issue(&r, &p).phase, IssuePhase::Done);
    let (fx, _) = go(&mut r, result(&id, WorkOutcome::Succeeded), T0 + 20, &p);
    assert_eq!(fx, Vec::<String>::new());
    assert_eq!(r.work.attempts[0].outcome, AttemptOutcome::Succeeded);
    assert!(step_issue(&r, &pr, T0 + 30, &p).is_noop());
}

#[test]
fn failed_attempts_escalate_and_get_stuck() {
    let p = policy();
    let mut r = IssueRecord::new(repo(), ISSUE);
    go(
        &mut r,
        ev(IssueAction::Labeled, issue(true, true, T0), "alice"),
        T0,
        &p,
    );
    let mut tiers = Vec::new();
    let mut now = T0;
    while let Some(a) = r.work.active.clone() {
        tiers.push(a.item.tier);
        now += 60_000;
        go(&mut r, result(&a.item.id, WorkOutcome::Failed), now, &p);
    }
    assert_eq!(tiers, vec![0, 1, 2, 3, 3, 3]);
    assert_eq!(decide_issue(&r, &p).phase, IssuePhase::NeedsHuman);
    let expiry_for_nothing = Event::TimerFired {
        repo: repo(),
        scope: Scope::Issue,
        number: ISSUE,
        timer: Timer {
            due_ms: now,
            kind: TimerKind::ClaimExpiry {
                work_id: tiers_id(),
            },
            id: "x".into(),
        },
    };
    assert!(step_issue(&r, &expiry_for_nothing, now, &p).is_noop());
}

/// A work id no record has.
fn tiers_id() -> WorkId {
    "acme:widgets:issue:9:99".parse().unwrap()
}

#[test]
fn issue_claim_expiry_escalates_and_untrusted_implement_waits_for_permission() {
    let p = policy();
    let mut r = IssueRecord::new(repo(), ISSUE);
    go(
        &mut r,
        ev(IssueAction::Labeled, issue(true, true, T0), "alice"),
        T0,
        &p,
    );
    let a = r.work.active.clone().unwrap();
    let expiry = Event::TimerFired {
        repo: repo(),
        scope: Scope::Issue,
        number: ISSUE,
        timer: Timer {
            due_ms: a.expires_ms,
            kind: TimerKind::ClaimExpiry {
                work_id: a.item.id.clone(),
            },
            id: "claim".into(),
        },
    };
    let (fx, _) = go(&mut r, expiry, a.expires_ms, &p);
    assert_eq!(
        fx,
        lines(&[
            &format!("cancel {}", a.item.id),
            "dispatch issue-impl tier=1 attempt=2 head=-",
            "timer claim-expiry +7200s",
            "-auto/last-attempt-tier-0",
            "+auto/last-attempt-tier-1",
        ])
    );

    let mut r = IssueRecord::new(repo(), ISSUE);
    go(
        &mut r,
        ev(IssueAction::Opened, issue(false, true, T0), "alice"),
        T0,
        &p,
    );
    let cmd = Event::Comment {
        repo: repo(),
        number: ISSUE,
        is_pull: false,
        comment_id: 8,
        commands: crate::core::command::parse("/shepherd implement"),
        at_ms: T0,
        sender: Some(login("mallory")),
    };
    let (fx, _) = go(&mut r, cmd, T0, &p);
    assert_eq!(fx, lines(&["observe permission mallory"]));
    let perm = Event::ObservedPermission {
        repo: repo(),
        scope: Scope::Issue,
        number: ISSUE,
        login: login("mallory"),
        permission: crate::core::event::Permission::Admin,
        at_ms: T0 + 1,
    };
    let (fx, _) = go(&mut r, perm, T0 + 1, &p);
    assert_eq!(fx[0], "dispatch issue-impl tier=0 attempt=1 head=-");
}
