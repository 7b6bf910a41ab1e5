//! `step_issue`: issue-impl dispatch, cancel on close, done when a linking PR merges.

use proptest::prelude::*;

use super::*;
use crate::core::event::{IssueAction, IssueSnapshot};
use crate::core::machine::{IssuePhase, IssueTransition, decide_issue, step_issue};
use crate::core::record::{AttemptOutcome, IssueRecord, LINKING_PRS_KEPT};

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

/// Steps and returns the effects as lines. A read of the dependencies (asked for
/// before every dispatch) is answered at once with none, as Forgejo answers for an
/// issue without dependencies, and the read and its timer are left out of the lines:
/// these tests are about what follows (`tests/issue_deps.rs` shows the reads).
fn go(r: &mut IssueRecord, e: Event, now: i64, p: &Policy) -> (Vec<String>, IssueTransition) {
    let t = step_issue(r, &e, now, p);
    let mut shown: Vec<String> = t.effects.iter().map(|x| show(x, now)).collect();
    *r = t.record.clone();
    if shown.iter().any(|l| l == "observe dependencies") {
        shown.retain(|l| l != "observe dependencies" && !l.starts_with("timer dependency-recheck"));
        let read = Event::ObservedDependencies {
            repo: repo(),
            number: r.number,
            dependencies: Vec::new(),
            at_ms: now,
        };
        let (more, t2) = go(r, read, now, p);
        shown.extend(more);
        return (shown, t2);
    }
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
    assert_eq!(r.done_by_pr, None, "an open PR does not finish the issue");
    assert_eq!(r.work.attempts[0].outcome, AttemptOutcome::Superseded);
    assert_eq!(decide_issue(&r, &p).phase, IssuePhase::AwaitingMerge);
    let (fx, _) = go(&mut r, result(&id, WorkOutcome::Succeeded), T0 + 20, &p);
    assert_eq!(fx, Vec::<String>::new());
    assert_eq!(r.work.attempts[0].outcome, AttemptOutcome::Succeeded);
    assert!(step_issue(&r, &pr, T0 + 30, &p).is_noop());
    let merged = PrSnapshot {
        state: PrState::Merged,
        ..bot_snap('a', T0 + 40)
    };
    go(
        &mut r,
        pr_event(PrAction::Closed, merged, "bot"),
        T0 + 40,
        &p,
    );
    assert_eq!(r.done_by_pr, Some(PR));
    assert_eq!(decide_issue(&r, &p).phase, IssuePhase::Done);
    assert!(step_issue(&r, &pr, T0 + 50, &p).is_noop());
}

/// A labelled issue with an `issue-impl` claimed.
fn claimed_issue(p: &Policy) -> IssueRecord {
    let mut r = IssueRecord::new(repo(), ISSUE);
    go(
        &mut r,
        ev(IssueAction::Labeled, issue(true, true, T0), "alice"),
        T0,
        p,
    );
    assert!(r.work.active.is_some());
    r
}

#[test]
fn a_linking_pr_closed_unmerged_does_not_mark_the_issue_done() {
    let p = policy();
    let mut r = claimed_issue(&p);
    let id = r.work.active.as_ref().unwrap().item.id.clone();
    // Anyone's PR linking the issue: neither done nor held, the agent's claim stays.
    let hostile = PrSnapshot {
        author: Some(login("mallory")),
        ..snap('a', T0 + 10)
    };
    let (fx, _) = go(
        &mut r,
        pr_event(PrAction::Opened, hostile.clone(), "mallory"),
        T0 + 10,
        &p,
    );
    assert_eq!(fx, Vec::<String>::new());
    assert_eq!(r.work.active.as_ref().map(|a| &a.item.id), Some(&id));
    assert_eq!(r.done_by_pr, None);
    assert!(r.linking_prs.is_empty(), "an outsider's PR holds nothing");
    // The agent fails: the outsider's open PR does not stop the next attempt.
    let (fx, _) = go(&mut r, result(&id, WorkOutcome::Failed), T0 + 20, &p);
    assert!(
        fx.iter()
            .any(|f| f.starts_with("dispatch issue-impl") && f.contains("attempt=2")),
        "{fx:?}"
    );
    assert_eq!(decide_issue(&r, &p).phase, IssuePhase::Implementing);
    // Closed unmerged: still not done.
    let closed = PrSnapshot {
        state: PrState::Closed,
        ..hostile
    };
    go(
        &mut r,
        pr_event(PrAction::Closed, closed, "mallory"),
        T0 + 30,
        &p,
    );
    assert_eq!(r.done_by_pr, None);
    assert!(r.linking_prs.is_empty());
    assert_eq!(decide_issue(&r, &p).phase, IssuePhase::Implementing);
}

/// The agent's own open PR holds the issue (`awaiting-merge`) until it merges; closed
/// unmerged, it releases the issue for another attempt.
#[test]
fn the_agents_linking_pr_holds_the_issue_until_closed_unmerged() {
    let p = policy();
    let mut r = claimed_issue(&p);
    let own = PrSnapshot {
        author: Some(login("bot")),
        ..snap('a', T0 + 10)
    };
    go(
        &mut r,
        pr_event(PrAction::Opened, own.clone(), "bot"),
        T0 + 10,
        &p,
    );
    assert!(r.work.active.is_none(), "the agent's PR is its result");
    assert_eq!(decide_issue(&r, &p).phase, IssuePhase::AwaitingMerge);
    let closed = PrSnapshot {
        state: PrState::Closed,
        ..own
    };
    let (fx, _) = go(
        &mut r,
        pr_event(PrAction::Closed, closed, "alice"),
        T0 + 30,
        &p,
    );
    assert!(
        fx.iter().any(|f| f.starts_with("dispatch issue-impl")),
        "{fx:?}"
    );
    assert_eq!(r.done_by_pr, None);
    assert!(r.linking_prs.is_empty());
}

#[test]
fn only_a_merged_linking_pr_ends_the_issue_work() {
    let p = policy();
    let mut r = claimed_issue(&p);
    let id = r.work.active.as_ref().unwrap().item.id.clone();
    let merged = PrSnapshot {
        author: Some(login("alice")),
        state: PrState::Merged,
        ..snap('a', T0 + 10)
    };
    let (fx, _) = go(
        &mut r,
        pr_event(PrAction::Closed, merged, "alice"),
        T0 + 10,
        &p,
    );
    assert_eq!(
        fx,
        lines(&[&format!("cancel {id}"), "-auto/claimed-implementer"]),
        "a human's merged PR makes the agent's work moot"
    );
    assert_eq!(r.done_by_pr, Some(PR));
    assert_eq!(decide_issue(&r, &p).phase, IssuePhase::Done);
    // A record an open PR marked done under the old rule is released by its close.
    let mut legacy = claimed_issue(&p);
    legacy.work.active = None;
    legacy.done_by_pr = Some(PR);
    let closed = PrSnapshot {
        state: PrState::Closed,
        ..snap('a', T0 + 10)
    };
    go(
        &mut legacy,
        pr_event(PrAction::Closed, closed, "alice"),
        T0 + 10,
        &p,
    );
    assert_eq!(legacy.done_by_pr, None);
    assert_ne!(decide_issue(&legacy, &p).phase, IssuePhase::Done);
}

#[test]
fn linking_prs_kept_are_bounded() {
    let p = policy();
    let mut r = claimed_issue(&p);
    for k in 0..(LINKING_PRS_KEPT as u64 + 10) {
        let pr = PrSnapshot {
            number: 100 + k,
            author: Some(login("bot")),
            ..snap('a', T0 + 10)
        };
        go(&mut r, pr_event(PrAction::Opened, pr, "bot"), T0 + 10, &p);
    }
    assert_eq!(r.linking_prs.len(), LINKING_PRS_KEPT);
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
    // The claim is down while the dependencies are read again before the next attempt.
    assert_eq!(
        fx,
        lines(&[
            &format!("cancel {}", a.item.id),
            "-auto/claimed-implementer",
            "dispatch issue-impl tier=1 attempt=2 head=-",
            "timer claim-expiry +7200s",
            "-auto/last-attempt-tier-0",
            "+auto/claimed-implementer,auto/last-attempt-tier-1",
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

/// An abstract issue event.
#[derive(Debug, Clone)]
enum IssueOp {
    /// Issue webhook: (labelled, open, by the bot).
    Snapshot(bool, bool, bool),
    /// The active item's result (outcome index).
    Result(u8),
    /// The active claim expires.
    Expire,
    /// A PR linking the issue opens.
    LinkedPr,
    /// `/shepherd implement` by alice (trusted) or mallory.
    Implement(bool),
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Issues: no work once closed or done, one claim at a time, tiers never go down,
    /// the bot never starts work, every event is idempotent.
    #[test]
    fn issue_invariants(ops in proptest::collection::vec(proptest::prop_oneof![
        4 => (proptest::bool::weighted(0.7), proptest::bool::weighted(0.85), proptest::bool::weighted(0.2)).prop_map(|(l, o, b)| IssueOp::Snapshot(l, o, b)),
        4 => (0..3u8).prop_map(IssueOp::Result),
        1 => proptest::strategy::Just(IssueOp::Expire),
        1 => proptest::strategy::Just(IssueOp::LinkedPr),
        1 => proptest::bool::ANY.prop_map(IssueOp::Implement),
    ], 1..40)) {
        let p = Policy { trusted_users: vec!["alice".into()], ..policy() };
        let mut r = IssueRecord::new(repo(), ISSUE);
        let mut now = T0;
        for (i, op) in ops.iter().enumerate() {
            now += 60_000;
            let e = match op {
                IssueOp::Snapshot(l, o, b) => ev(IssueAction::Labeled, issue(*l, *o, now), if *b { "bot" } else { "alice" }),
                IssueOp::Result(o) => {
                    let id = r.work.active.as_ref().map_or_else(tiers_id, |a| a.item.id.clone());
                    result(&id, [WorkOutcome::Succeeded, WorkOutcome::Failed, WorkOutcome::NoChanges][usize::from(*o)])
                }
                IssueOp::Expire => {
                    let Some(a) = r.work.active.clone() else { continue };
                    now = now.max(a.expires_ms);
                    Event::TimerFired { repo: repo(), scope: Scope::Issue, number: ISSUE, timer: Timer { due_ms: a.expires_ms, kind: TimerKind::ClaimExpiry { work_id: a.item.id }, id: "c".into() } }
                }
                IssueOp::LinkedPr => pr_event(PrAction::Opened, bot_snap('a', now), "bot"),
                IssueOp::Implement(trusted) => Event::Comment {
                    repo: repo(), number: ISSUE, is_pull: false, comment_id: i64::try_from(i).unwrap(),
                    commands: crate::core::command::parse("/shepherd implement"), at_ms: now,
                    sender: Some(login(if *trusted { "alice" } else { "mallory" })),
                },
            };
            let t = step_issue(&r, &e, now, &p);
            let dispatched: Vec<_> = t.effects.iter().filter_map(|x| match &x.kind { EffectKind::Dispatch(w) => Some(w.clone()), _ => None }).collect();
            prop_assert!(dispatched.len() <= 1);
            if let Some(w) = dispatched.first() {
                let open = t.record.issue.as_ref().is_some_and(|i| i.open);
                prop_assert!(open && t.record.done_by_pr.is_none(), "work on a closed or done issue");
                prop_assert!(!p.is_bot(e.sender()), "the bot started work");
                if let Some(before) = &r.work.active {
                    prop_assert!(t.record.work.attempts.iter().any(|a| a.work_id == before.item.id));
                }
                prop_assert!(w.tier >= r.work.tier);
            }
            prop_assert!(t.record.work.tier >= r.work.tier);
            let again = step_issue(&t.record, &e, now, &p);
            prop_assert_eq!(IssueRecord { version: 0, ..again.record }, IssueRecord { version: 0, ..t.record.clone() });
            r = t.record;
        }
    }
}
