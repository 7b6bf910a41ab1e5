//! Budgets on a PR record (issue 28), with the pure budget decision playing the
//! dispatch path and a faked clock: a spent daily budget holds the PR in
//! `over-budget` with nothing dispatched until the day's reset; `/shepherd budget +N`
//! by a writer lifts one PR and is refused to others; a run the runner stopped for its
//! budget holds the PR without raising the tier; the cost so far is counted once.

use proptest::prelude::*;

use super::*;
use crate::core::budget::{self, Ledger, Spent, Verdict};
use crate::core::effect::WorkItem;
use crate::core::event::Permission;
use crate::core::record::AttemptOutcome;
use crate::core::usage::{StopReason, Usage};

/// `ci / test` failing.
const FAIL: (&str, CiState, &str) = ("ci / test", CiState::Failure, "Failing after 1m2s");

/// Ten dollars a day for the repository, five per run.
fn capped() -> Policy {
    Policy {
        budget_repo_daily_usd: 10.0,
        budget_run_usd: 5.0,
        stuck_after: 100,
        ..policy()
    }
}

/// The dispatch path: every `Dispatch` of the last step goes through the budget
/// decision with the repository's `spent_today`; a stop is reported back (stepped),
/// a go returns the item as it would be sent.
fn dispatch_path(h: &mut H, spent_today: u64) -> Vec<WorkItem> {
    let items: Vec<WorkItem> = h
        .effects()
        .iter()
        .filter_map(|e| match &e.kind {
            EffectKind::Dispatch(w) => Some(w.clone()),
            _ => None,
        })
        .collect();
    let mut sent = Vec::new();
    for item in items {
        let ledger = Ledger {
            spent: vec![(
                (budget::Scope::Repo, budget::Window::Day),
                Spent {
                    usd_micros: spent_today,
                    tokens: 0,
                },
            )],
        };
        let exp = budget::expected(&h.p, &crate::core::machine::past_runs(&h.r.work));
        match budget::decide(&h.p, &ledger, h.r.work.budget.grant, exp, h.now) {
            Verdict::Go(limits) => {
                let mut item = item;
                item.limits.usd_micros = limits.usd_micros;
                item.limits.budget_scope = limits.scope;
                sent.push(item);
            }
            Verdict::Stop(stop) => {
                h.step(held(&item, stop));
            }
        }
    }
    sent
}

/// The dispatch path's report that `item` was held back.
fn held(item: &WorkItem, stop: budget::Stop) -> Event {
    Event::EffectOutcome {
        repo: repo(),
        scope: Scope::Pr,
        number: PR,
        effect_id: "x".parse().unwrap(),
        outcome: EffectOutcome::OverBudget {
            work_id: item.id.clone(),
            stop,
        },
    }
}

/// A failed result that cost `usd` dollars, maybe stopped by the runner.
fn costly(id: &WorkId, usd: u64, stopped: Option<StopReason>) -> Event {
    Event::WorkResult {
        work_id: id.clone(),
        outcome: WorkOutcome::Failed,
        signature: None,
        summary: None,
        usage: Some(Usage {
            input_tokens: 1_000,
            output_tokens: 200,
            cost_micros: usd * 1_000_000,
            steps: 3,
            ..Usage::default()
        }),
        stopped,
    }
}

/// A PR with failing CI whose first ci-fix went out when other PRs had spent four of
/// the day's ten dollars, spent its five (the run cap), and failed; the next
/// dispatch was held back (one dollar left, a run needs five).
fn over_budget() -> H {
    let mut h = H::with(capped());
    h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    let sent = dispatch_path(&mut h, 4_000_000);
    assert_eq!(sent.len(), 1, "the first run goes out");
    assert_eq!(
        sent[0].limits.usd_micros,
        Some(5_000_000),
        "the tightest remainder"
    );
    assert_eq!(sent[0].limits.budget_scope.as_deref(), Some("run-usd"));
    h.later(60);
    h.step(costly(&sent[0].id, 5, None));
    let again = dispatch_path(&mut h, 9_000_000);
    assert!(
        again.is_empty(),
        "nothing is sent once the day's budget is spent"
    );
    h
}

/// Whether the last step dispatched anything.
fn dispatched(h: &H) -> bool {
    h.effects()
        .iter()
        .any(|e| matches!(e.kind, EffectKind::Dispatch(_)))
}

#[test]
fn a_spent_daily_budget_holds_the_pr_until_the_reset_then_work_resumes() {
    let mut h = over_budget();
    assert_eq!(h.phase(), Phase::OverBudget);
    assert!(
        h.r.work.active.is_none(),
        "the held-back item's claim ended"
    );
    let reason = h.reason();
    assert!(reason.contains("`repo-daily-usd`"), "{reason}");
    assert!(reason.contains("/shepherd budget +"), "{reason}");
    let reset = budget::next_utc_day(h.now).unwrap();
    let midnight = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(reset)
        .unwrap()
        .format("resumes at %Y-%m-%d 00:00 UTC")
        .to_string();
    assert!(reason.contains(&midnight), "{reason}");
    let timers: Vec<i64> = h
        .effects()
        .iter()
        .filter_map(|e| match &e.kind {
            EffectKind::Schedule(t) if t.kind == TimerKind::BudgetReset => Some(t.due_ms),
            _ => None,
        })
        .collect();
    assert_eq!(
        timers,
        vec![reset],
        "the reset timer is armed at midnight UTC"
    );
    let body = h
        .effects()
        .iter()
        .find_map(|e| match &e.kind {
            EffectKind::UpsertComment { body, .. } => Some(body.clone()),
            _ => None,
        })
        .expect("the status comment shows it");
    assert!(body.contains("`over-budget`"), "{body}");
    assert!(body.contains("Cost so far: $5.00 over 1 run"), "{body}");
    assert!(
        reason.contains("has $1.00 left and a run needs $5.00"),
        "{reason}"
    );
    // Still failing CI, a new read: nothing is dispatched while held.
    h.later(600);
    h.step(status('a', &[FAIL, ("lint", CiState::Failure, "x")], h.now));
    assert!(!dispatched(&h));
    assert_eq!(h.phase(), Phase::OverBudget);
    // An early timer changes nothing.
    h.step(timer(TimerKind::BudgetReset, h.now));
    assert!(!dispatched(&h));
    // The day resets: the timer ends the hold and the work is dispatched again, under
    // the new day's budget.
    h.now = reset;
    h.step(timer(TimerKind::BudgetReset, reset));
    assert!(dispatched(&h), "work resumes at the reset");
    let sent = dispatch_path(&mut h, 0);
    assert_eq!(sent.len(), 1);
    assert_ne!(h.phase(), Phase::OverBudget);
}

#[test]
fn a_writer_lifts_one_pr_with_budget_plus_and_a_non_writer_is_refused() {
    let mut h = over_budget();
    h.later(30);
    h.step(comment(501, "/shepherd budget +5", "mallory"));
    h.step(permission("mallory", Permission::Read, h.now));
    let refused = h.effects().iter().any(|e| {
        matches!(&e.kind, EffectKind::Comment { body, .. } if body.contains("only users with write access"))
    });
    assert!(refused, "the non-writer is told");
    assert!(!dispatched(&h));
    assert_eq!(h.phase(), Phase::OverBudget);
    assert!(
        h.r.work.budget.grant.is_empty(),
        "no grant from a non-writer"
    );
    h.later(30);
    h.step(comment(502, "/shepherd budget +5", "carol"));
    h.step(permission("carol", Permission::Write, h.now));
    assert!(dispatched(&h), "the grant lifts the hold at once");
    let sent = dispatch_path(&mut h, 9_000_000);
    assert_eq!(sent.len(), 1, "the grant pays for one more run");
    assert_eq!(
        sent[0].limits.usd_micros,
        Some(6_000_000),
        "the dollar left and the five"
    );
    // The run spends the grant: the PR is held again, and the grant is used up.
    h.later(60);
    h.step(costly(&sent[0].id, 5, None));
    assert!(h.r.work.budget.grant.is_empty());
    assert!(dispatch_path(&mut h, 14_000_000).is_empty());
    assert_eq!(h.phase(), Phase::OverBudget);
}

#[test]
fn a_run_stopped_for_its_budget_holds_without_raising_the_tier() {
    let p = Policy {
        budget_repo_daily_usd: 10.0,
        stuck_after: 100,
        ..policy()
    };
    let mut h = H::with(p);
    h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    let sent = dispatch_path(&mut h, 0);
    // The active item carries its budget scope as the dispatch path set it (the
    // runner's stop names it).
    if let Some(a) = &mut h.r.work.active {
        a.item.limits.budget_scope = sent[0].limits.budget_scope.clone();
    }
    let tier = h.r.work.tier;
    h.later(60);
    h.step(costly(&sent[0].id, 4, Some(StopReason::OverBudget)));
    assert_eq!(h.phase(), Phase::OverBudget);
    assert!(!dispatched(&h));
    let last = h.r.work.attempts.last().unwrap();
    assert_eq!(last.outcome, AttemptOutcome::OverBudget);
    assert_eq!(last.cost_micros, Some(4_000_000));
    let reset = budget::next_utc_day(h.now).unwrap();
    h.now = reset;
    h.step(timer(TimerKind::BudgetReset, reset));
    let next = dispatch_path(&mut h, 0);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].tier, tier, "a budget stop never raises the tier");
    // A plain failure of the same problem does escalate (the contrast).
    h.later(60);
    h.step(costly(&next[0].id, 1, None));
    let after = dispatch_path(&mut h, 1_000_000);
    assert_eq!(after[0].tier, tier + 1);
}

#[test]
fn a_runs_cost_is_counted_once_and_shown_per_attempt() {
    let mut h = H::with(capped());
    h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    let id = h.work_id();
    h.later(60);
    h.step(costly(&id, 3, None));
    let body = h
        .effects()
        .iter()
        .find_map(|e| match &e.kind {
            EffectKind::UpsertComment { body, .. } => Some(body.clone()),
            _ => None,
        })
        .expect("a status comment");
    assert!(
        body.contains("Cost so far: $3.00 over 1 run (1200 tokens) · per attempt: #1 ci-fix $3.00"),
        "{body}"
    );
    // A re-reported result changes nothing.
    let before = h.r.work.budget.clone();
    h.step(costly(&id, 3, None));
    assert_eq!(h.r.work.budget, before);
}

/// One thing that can happen in the property test.
#[derive(Debug, Clone)]
enum Step {
    /// The dispatch path holds back what was dispatched (spent = the cap).
    Hold,
    /// The dispatch path lets it go; the agent fails, maybe stopped for its budget.
    Fail(bool),
    /// The clock moves by this many hours (and the reset timer fires).
    Hours(u8),
    /// A writer grants a dollar.
    Grant,
    /// A new CI read (same failure).
    Ci,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            Just(Step::Hold),
            any::<bool>().prop_map(Step::Fail),
            (1u8..30).prop_map(Step::Hours),
            Just(Step::Grant),
            Just(Step::Ci),
        ],
        1..25,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Whatever happens: no step dispatches while the PR is held over budget at the
    /// step's end, and the tier never goes down.
    #[test]
    fn no_dispatch_while_over_budget_and_tiers_never_go_down(script in steps()) {
        let mut h = H::with(capped());
        h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
        h.later(5);
        h.step(status('a', &[FAIL], h.now));
        let mut tier = h.r.work.tier;
        let mut comment_id = 1000;
        for s in script {
            match s {
                Step::Hold => { dispatch_path(&mut h, 10_000_000); }
                Step::Fail(stopped) => {
                    if let Some(a) = &mut h.r.work.active {
                        a.item.limits.budget_scope = Some("repo-daily-usd".into());
                        let id = a.item.id.clone();
                        h.later(60);
                        h.step(costly(&id, 1, stopped.then_some(StopReason::OverBudget)));
                    }
                }
                Step::Hours(n) => {
                    h.later(i64::from(n) * 3600);
                    h.step(timer(TimerKind::BudgetReset, h.now));
                }
                Step::Grant => {
                    comment_id += 1;
                    h.later(1);
                    h.step(comment(comment_id, "/shepherd budget +1", "carol"));
                    h.step(permission("carol", Permission::Write, h.now));
                }
                Step::Ci => {
                    h.later(30);
                    h.step(status('a', &[FAIL], h.now));
                }
            }
            let held = crate::core::machine::budget::active_hold(&h.r.work, h.now).is_some();
            prop_assert!(!(held && dispatched(&h)), "dispatched while over budget");
            if held {
                prop_assert_eq!(h.phase(), Phase::OverBudget);
            }
            prop_assert!(h.r.work.tier >= tier, "the tier went down");
            tier = h.r.work.tier;
        }
    }
}
