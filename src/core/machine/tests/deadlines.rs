//! No record waits forever (issue 27): after any sequence of events, time alone
//! (the timers the records armed, fired in due order, nothing else answering) brings
//! every PR to a dispatch, a merge, or a documented idle state within a bounded
//! number of firings. The waiting phases and their deadlines are listed in
//! docs/state-machine.md ("Every wait has a deadline").

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::props::{Ids, concrete, op, prop_policy};
use super::*;

/// Most timer firings after the events (a day of CI polls at `ci_poll_max_secs`
/// before the stale check is ~720).
const MAX_FIRINGS: usize = 5_000;

/// The timers a record armed and not yet fired, by id (a timer armed again under the
/// same id replaces the earlier one, as the store's timer set does).
#[derive(Default)]
struct Timers(BTreeMap<String, Timer>);

impl Timers {
    /// Notes the timers among `effects`.
    fn arm(&mut self, effects: &[Effect]) {
        for e in effects {
            if let EffectKind::Schedule(t) = &e.kind {
                self.0.insert(t.id.clone(), t.clone());
            }
        }
    }

    /// Takes the one due first.
    fn next(&mut self) -> Option<Timer> {
        let id = self
            .0
            .iter()
            .min_by_key(|(id, t)| (t.due_ms, (*id).clone()))
            .map(|(id, _)| id.clone())?;
        self.0.remove(&id)
    }
}

/// Whether `effects` start something: a dispatch or a merge.
fn starts_something(effects: &[Effect]) -> bool {
    effects
        .iter()
        .any(|e| matches!(e.kind, EffectKind::Dispatch(_) | EffectKind::Merge { .. }))
}

/// The documented idle states (docs/state-machine.md): a human must act (paused,
/// needs-human), the PR is done (merged, closed), or nothing is wrong and it waits
/// for CI to report or for a human's review — never with a claim held, and never for
/// a push an agent announced.
fn documented_idle(r: &PrRecord, p: &Policy, now: i64) -> Result<(), String> {
    let d = decide(r, p, now);
    let idle = matches!(
        d.phase,
        Phase::Paused | Phase::NeedsHuman | Phase::Merged | Phase::Closed
    ) || (matches!(d.phase, Phase::AwaitingCi | Phase::AwaitingReview)
        && r.work.active.is_none()
        && !d.reason.contains("waiting for the push"));
    match idle {
        true => Ok(()),
        false => Err(format!("stalled in {:?}: {}", d.phase, d.reason)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn time_alone_brings_every_pr_to_a_dispatch_a_merge_or_a_documented_idle_state(
        ops in prop::collection::vec(op(), 0..30),
        dispatch_mode in any::<bool>(),
        bot_pr in any::<bool>(),
    ) {
        let p = prop_policy(dispatch_mode);
        let mut r = PrRecord::new(repo(), PR);
        let mut now = T0;
        let mut timers = Timers::default();
        let opened = if bot_pr { bot_snap('a', now) } else { snap('a', now) };
        let mut events = vec![pr_event(PrAction::Opened, opened, "alice")];
        let mut ids = Ids(0);
        for o in &ops {
            for e in events.drain(..) {
                let t = step(&r, &e, now, &p);
                timers.arm(&t.effects);
                r = t.record;
            }
            if let Some(e) = concrete(o, &r, &mut now, &mut ids) {
                events.push(e);
            }
        }
        for e in events.drain(..) {
            let t = step(&r, &e, now, &p);
            timers.arm(&t.effects);
            r = t.record;
        }
        // Only time from here on.
        let mut reached = false;
        for _ in 0..MAX_FIRINGS {
            let Some(timer) = timers.next() else { break };
            now = now.max(timer.due_ms);
            let e = Event::TimerFired { repo: repo(), scope: Scope::Pr, number: PR, timer };
            let t = step(&r, &e, now, &p);
            timers.arm(&t.effects);
            r = t.record;
            if starts_something(&t.effects) {
                reached = true;
                break;
            }
        }
        if !reached {
            prop_assert!(documented_idle(&r, &p, now).is_ok(), "{:?} after {:?}", documented_idle(&r, &p, now), ops);
        }
    }
}

use crate::core::event::{IssueAction, IssueSnapshot};
use crate::core::machine::{IssuePhase, decide_issue, step_issue};
use crate::core::record::IssueRecord;

/// The issue of the issue property.
const ISSUE: u64 = 9;

/// One random step for an issue record.
#[derive(Debug, Clone)]
enum IssueOp {
    /// The issue's snapshot (labelled, open).
    Snapshot(bool, bool),
    /// The active item's result (0 succeeded, 1 failed, 2 no-changes).
    Result(u8),
    /// A PR linking the issue (author: 0 bot, 1 agent user, 2 outsider; state: 0
    /// open, 1 closed, 2 merged).
    Linking(u8, u8),
    /// Time passes (seconds).
    Wait(u16),
}

/// Strategy for one issue op.
fn issue_op() -> impl Strategy<Value = IssueOp> {
    prop_oneof![
        2 => (prop::bool::weighted(0.8), prop::bool::weighted(0.9)).prop_map(|(l, o)| IssueOp::Snapshot(l, o)),
        3 => (0..3u8).prop_map(IssueOp::Result),
        2 => (0..3u8, 0..3u8).prop_map(|(a, s)| IssueOp::Linking(a, s)),
        2 => (0..900u16).prop_map(IssueOp::Wait),
    ]
}

/// Whether `effects` ask for the issue's dependencies (`Observe(Dependencies)`).
fn asks_dependencies(effects: &[Effect]) -> bool {
    effects
        .iter()
        .any(|e| matches!(&e.kind, EffectKind::Observe(ObserveWhat::Dependencies)))
}

/// Makes `op` concrete against the issue record.
fn issue_event(op: &IssueOp, r: &IssueRecord, now: &mut i64) -> Option<Event> {
    *now += 1000;
    Some(match op {
        IssueOp::Snapshot(labelled, open) => Event::Issue {
            action: IssueAction::Edited,
            issue: IssueSnapshot {
                repo: repo(),
                number: ISSUE,
                open: *open,
                title: "Widget overflows".into(),
                body: String::new(),
                author: Some(login("alice")),
                labels: match labelled {
                    true => BTreeSet::from(["auto/implement".to_owned()]),
                    false => BTreeSet::new(),
                },
                updated_ms: *now,
            },
            sender: Some(login("alice")),
        },
        IssueOp::Result(o) => {
            let id = r.work.active.as_ref()?.item.id.clone();
            let outcome = [
                WorkOutcome::Succeeded,
                WorkOutcome::Failed,
                WorkOutcome::NoChanges,
            ][usize::from(*o)];
            result(&id, outcome)
        }
        IssueOp::Linking(author, state) => {
            let author = ["bot", "agent-1", "mallory"][usize::from(*author)];
            let state = [PrState::Open, PrState::Closed, PrState::Merged][usize::from(*state)];
            Event::PullRequest {
                action: PrAction::Edited,
                pr: PrSnapshot {
                    number: 40,
                    state,
                    author: Some(login(author)),
                    body: format!("Closes #{ISSUE}"),
                    ..snap('c', *now)
                },
                base_changed_from: None,
                sender: Some(login(author)),
            }
        }
        IssueOp::Wait(s) => {
            *now += i64::from(*s) * 1000;
            return None;
        }
    })
}

/// The documented idle states of an issue (docs/state-machine.md).
fn issue_idle(r: &IssueRecord, p: &Policy) -> Result<(), String> {
    let d = decide_issue(r, p);
    let idle = r.work.active.is_none()
        && matches!(
            d.phase,
            IssuePhase::Idle
                | IssuePhase::AwaitingMerge
                | IssuePhase::Done
                | IssuePhase::Closed
                | IssuePhase::NeedsHuman
                | IssuePhase::Paused
        );
    match idle {
        true => Ok(()),
        false => Err(format!("stalled in {:?}: {}", d.phase, d.reason)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn time_alone_brings_every_issue_to_a_dispatch_or_a_documented_idle_state(
        ops in prop::collection::vec(issue_op(), 0..25),
    ) {
        let p = Policy { agent_logins: vec!["agent-1".into()], ..policy() };
        let mut r = IssueRecord::new(repo(), ISSUE);
        let mut now = T0;
        let mut timers = Timers::default();
        let mut all = vec![IssueOp::Snapshot(true, true)];
        all.extend(ops.iter().cloned());
        for o in &all {
            if let Some(e) = issue_event(o, &r, &mut now) {
                let t = step_issue(&r, &e, now, &p);
                timers.arm(&t.effects);
                r = t.record;
            }
        }
        let mut reached = false;
        for _ in 0..MAX_FIRINGS {
            let Some(timer) = timers.next() else { break };
            now = now.max(timer.due_ms);
            let e = Event::TimerFired { repo: repo(), scope: Scope::Issue, number: ISSUE, timer };
            let mut t = step_issue(&r, &e, now, &p);
            timers.arm(&t.effects);
            r = t.record;
            // Shepherd's own read of the issue's dependencies is answered (none), as the
            // executor does when Forgejo answers: time alone, no one else acting.
            if asks_dependencies(&t.effects) {
                now += 1000;
                let e = Event::ObservedDependencies {
                    repo: repo(),
                    number: ISSUE,
                    dependencies: Vec::new(),
                    at_ms: now,
                };
                let answered = step_issue(&r, &e, now, &p);
                timers.arm(&answered.effects);
                r = answered.record;
                t.effects.extend(answered.effects);
            }
            if starts_something(&t.effects) {
                reached = true;
                break;
            }
        }
        if !reached {
            prop_assert!(issue_idle(&r, &p).is_ok(), "{:?} after {:?}", issue_idle(&r, &p), ops);
        }
    }
}
