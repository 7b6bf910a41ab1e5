//! Attempts are bounded (issue 26 finding 6): `max_attempts_total` per PR, then
//! `needs-human` until a user with write access acts; a push by someone without write
//! access does not clear it; the record keeps the last [`ATTEMPTS_KEPT`] attempts in
//! full and counts the rest.

use proptest::prelude::*;

use super::*;
use crate::core::event::Permission;
use crate::core::record::{ATTEMPTS_KEPT, Hold};

/// `ci / test` failing.
const FAIL: (&str, CiState, &str) = ("ci / test", CiState::Failure, "Failing after 1m2s");

/// A human PR with failing CI and a ci-fix claimed, under `p`.
fn claimed(p: Policy) -> H {
    let mut h = H::with(p);
    h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    assert!(h.r.work.active.is_some());
    h
}

/// The active item fails `n` times (each failure dispatches the next attempt while
/// the budget lasts).
fn fail(h: &mut H, n: usize) {
    for _ in 0..n {
        let id = h.work_id();
        h.later(60);
        h.step(result(&id, WorkOutcome::Failed));
    }
}

/// The attempt number of the dispatch in the last step, if any.
fn dispatched_attempt(h: &H) -> Option<u32> {
    h.effects().iter().find_map(|e| match &e.kind {
        EffectKind::Dispatch(w) => Some(w.attempt),
        _ => None,
    })
}

/// A push of head `head` by `who`.
fn push(h: &mut H, head: char, who: &str) -> Vec<String> {
    h.later(10);
    let now = h.now;
    h.step(pr_event(
        PrAction::Synchronized,
        PrSnapshot {
            mergeable: None,
            ..snap(head, now)
        },
        who,
    ))
}

/// Many failures never escalate to the stuck rule here: `stuck_after` past them.
fn unstuck(max_total: u32) -> Policy {
    Policy {
        stuck_after: 1000,
        max_attempts_total: max_total,
        ..policy()
    }
}

#[test]
fn max_attempts_total_holds_at_needs_human_until_a_writer_acts() {
    let mut h = claimed(unstuck(4));
    fail(&mut h, 4);
    assert!(h.r.work.active.is_none(), "no fifth attempt");
    assert_eq!(h.phase(), Phase::NeedsHuman);
    assert!(
        h.reason()
            .starts_with("4 attempts on this PR (max_attempts_total = 4)"),
        "{}",
        h.reason()
    );
    assert!(matches!(h.r.work.hold, Some(Hold::NeedsHuman { .. })));
    let shown: Vec<String> = h.effects().iter().map(|e| show(e, h.now)).collect();
    assert_eq!(shown[0], "comment #7", "{shown:?}");
    // A new observation changes nothing.
    h.later(60);
    assert_eq!(h.step(status('a', &[FAIL], h.now)), Vec::<String>::new());
    // A writer's `/shepherd retry` gives the PR another budget.
    h.p.trusted_users = vec!["carol".into()];
    h.later(10);
    h.step(comment(1, "/shepherd retry", "carol"));
    assert_eq!(dispatched_attempt(&h), Some(5));
    fail(&mut h, 4);
    assert_eq!(h.phase(), Phase::NeedsHuman, "{}", h.reason());
    assert_eq!(h.r.work.attempts_total(), 8);
    // No bound at 0.
    let mut h = claimed(unstuck(0));
    fail(&mut h, 20);
    assert!(h.r.work.active.is_some());
}

#[test]
fn a_push_by_a_user_without_write_access_does_not_clear_needs_human() {
    let mut h = claimed(unstuck(2));
    fail(&mut h, 2);
    assert_eq!(h.phase(), Phase::NeedsHuman);
    // mallory's permission is not known: it is read, and the hold stays meanwhile.
    let fx = push(&mut h, 'b', "mallory");
    assert!(
        fx.contains(&"observe permission mallory".to_owned()),
        "{fx:?}"
    );
    assert!(!fx.iter().any(|l| l.starts_with("dispatch")), "{fx:?}");
    assert!(matches!(h.r.work.hold, Some(Hold::NeedsHuman { .. })));
    // Read access only: the hold stays, nothing is dispatched on the new head.
    h.later(1);
    let fx = h.step(permission("mallory", Permission::Read, h.now));
    assert!(!fx.iter().any(|l| l.starts_with("dispatch")), "{fx:?}");
    assert!(matches!(h.r.work.hold, Some(Hold::NeedsHuman { .. })));
    assert_eq!(h.r.work.resume_by_push, None);
    h.later(5);
    let fx = h.step(status('b', &[FAIL], h.now));
    assert!(!fx.iter().any(|l| l.starts_with("dispatch")), "{fx:?}");
    // Known read-only now: the next push asks nothing and clears nothing.
    let fx = push(&mut h, 'c', "mallory");
    assert!(!fx.iter().any(|l| l.contains("permission")), "{fx:?}");
    assert!(matches!(h.r.work.hold, Some(Hold::NeedsHuman { .. })));
    // The bot's and an agent user's pushes never clear it either.
    h.p.agent_logins = vec!["agent-1".into()];
    push(&mut h, 'd', "agent-1");
    push(&mut h, 'e', "bot");
    assert!(matches!(h.r.work.hold, Some(Hold::NeedsHuman { .. })));
    // An API read that shows a new head (pusher unknown) does not either.
    h.later(10);
    let now = h.now;
    h.step(Event::ObservedPr {
        pr: PrSnapshot {
            mergeable: None,
            ..snap('f', now)
        },
    });
    assert!(matches!(h.r.work.hold, Some(Hold::NeedsHuman { .. })));
    // A push by a user whom the read shows with write access clears it.
    let fx = push(&mut h, '1', "dave");
    assert!(fx.contains(&"observe permission dave".to_owned()), "{fx:?}");
    assert!(matches!(h.r.work.hold, Some(Hold::NeedsHuman { .. })));
    h.later(1);
    h.step(permission("dave", Permission::Write, h.now));
    assert_eq!(h.r.work.hold, None);
    h.later(5);
    h.step(status('1', &[FAIL], h.now));
    assert_eq!(dispatched_attempt(&h), Some(3), "a new budget");
}

#[test]
fn a_trusted_users_push_clears_needs_human_at_once() {
    let mut h = claimed(unstuck(1));
    fail(&mut h, 1);
    assert_eq!(h.phase(), Phase::NeedsHuman);
    h.p.trusted_users = vec!["alice".into()];
    let fx = push(&mut h, 'b', "alice");
    assert!(!fx.iter().any(|l| l.contains("permission")), "{fx:?}");
    assert_eq!(h.r.work.hold, None);
}

#[test]
fn the_record_keeps_the_last_ten_attempts_and_counts_the_rest() {
    let mut h = claimed(unstuck(0));
    fail(&mut h, 25);
    let ws = &h.r.work;
    assert_eq!(ws.attempts.len(), ATTEMPTS_KEPT);
    assert_eq!(ws.attempts_dropped, 15);
    assert_eq!(ws.attempts_total(), 25);
    assert_eq!(ws.attempts_of(crate::core::effect::WorkKind::CiFix), 25);
    // Numbering goes on past the dropped ones; the tier still escalated to the top.
    let active = &ws.active.as_ref().unwrap().item;
    assert_eq!(active.attempt, 26);
    assert_eq!(active.tier, h.p.top_tier());
    // The work item carries the last ten, the status comment the total.
    assert_eq!(active.context.attempts.len(), 10);
    let body =
        h.r.status_comment
            .clone()
            .expect("a status key was written");
    assert!(body.contains(",25,"), "{body}");
    // The needs-human comment numbers the kept attempts by their place in all.
    let mut p = unstuck(26);
    p.trusted_users = vec![];
    h.p = p;
    fail(&mut h, 1);
    assert_eq!(h.phase(), Phase::NeedsHuman);
    let EffectKind::Comment { body, .. } = &h.effects()[0].kind else {
        panic!("{:?}", h.effects());
    };
    assert!(body.contains("16 before them are counted"), "{body}");
    assert!(body.contains("| 17 | ci-fix |"), "{body}");
    assert!(body.contains("| 26 | ci-fix |"), "{body}");
    // The record round-trips with its counters; a record without them loads.
    let back = crate::core::record::PrRecord::from_json(&h.r.to_json()).unwrap();
    assert_eq!(back, h.r);
    let fresh = crate::core::record::PrRecord::new(repo(), PR).to_json();
    assert!(!fresh.contains("attempts_dropped"), "{fresh}");
}

#[test]
fn a_stored_record_with_a_long_attempt_list_is_cut_at_the_next_attempt() {
    let mut h = claimed(unstuck(0));
    fail(&mut h, 3);
    // As an older build stored it: 30 attempts, no counters.
    let mut r = h.r.clone();
    let one = r.work.attempts[0].clone();
    r.work.attempts = vec![one; 30];
    r.work.stuck_base = 30;
    h.r = r;
    fail(&mut h, 1);
    assert_eq!(h.r.work.attempts.len(), ATTEMPTS_KEPT);
    assert_eq!(h.r.work.attempts_total(), 31);
    assert!(h.r.work.stuck_base <= ATTEMPTS_KEPT);
}

/// One generated step of the property test.
#[derive(Debug, Clone)]
enum Op {
    /// The active item reports failure (or success).
    Report(bool),
    /// The claim's TTL runs out.
    Expire,
    /// A push by a writer (true) or by a read-only user.
    Push(bool),
    /// A trusted `/shepherd retry`.
    Retry,
    /// CI fails on the head.
    Fail,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Whatever happens, the attempt list never holds more than ten, the total only
    /// grows, and an untrusted push never ends a hold.
    #[test]
    fn the_attempt_list_never_exceeds_ten(
        ops in prop::collection::vec(prop_oneof![
            4 => any::<bool>().prop_map(Op::Report),
            1 => Just(Op::Expire),
            1 => any::<bool>().prop_map(Op::Push),
            1 => Just(Op::Retry),
            2 => Just(Op::Fail),
        ], 1..80),
        max_total in 0..15u32,
    ) {
        let mut p = unstuck(max_total);
        p.stuck_after = 3;
        p.trusted_users = vec!["carol".into(), "dave".into()];
        let mut h = claimed(p);
        let (mut heads, mut comment_id) = (0u8, 0i64);
        for op in ops {
            let total = h.r.work.attempts_total();
            let held = h.r.work.hold.is_some();
            h.later(60);
            match op {
                Op::Report(ok) => {
                    if let Some(a) = &h.r.work.active {
                        let id = a.item.id.clone();
                        let o = if ok { WorkOutcome::Succeeded } else { WorkOutcome::Failed };
                        h.step(result(&id, o));
                    }
                }
                Op::Expire => {
                    if let Some(a) = &h.r.work.active {
                        let (id, due) = (a.item.id.clone(), a.expires_ms);
                        h.now = h.now.max(due);
                        h.step(timer(TimerKind::ClaimExpiry { work_id: id }, due));
                    }
                }
                Op::Push(writer) => {
                    heads = (heads + 1) % 6;
                    let head = char::from(b'a' + heads);
                    push(&mut h, head, if writer { "dave" } else { "mallory" });
                    if !writer {
                        h.later(1);
                        let now = h.now;
                        h.step(permission("mallory", Permission::Read, now));
                        prop_assert!(!held || h.r.work.hold.is_some(), "an untrusted push ended a hold");
                    }
                }
                Op::Retry => {
                    comment_id += 1;
                    h.step(comment(comment_id, "/shepherd retry", "carol"));
                }
                Op::Fail => {
                    let head = char::from(b'a' + heads);
                    let now = h.now;
                    h.step(status(head, &[FAIL], now));
                }
            }
            prop_assert!(h.r.work.attempts.len() <= ATTEMPTS_KEPT, "{} attempts kept", h.r.work.attempts.len());
            prop_assert!(h.r.work.attempts_total() >= total, "the total went down");
            prop_assert!(h.r.work.stuck_base <= h.r.work.attempts.len());
            if max_total > 0 {
                let since = h.r.work.attempts_total() - h.r.work.attempts_base;
                prop_assert!(since <= u64::from(max_total), "{} attempts past the budget", since);
            }
        }
    }
}
