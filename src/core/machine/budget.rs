//! Budgets on a record (issue 28), shared by PR and issue records:
//!
//! - the dispatch path said no (`EffectOutcome::OverBudget`): the claim ends without an
//!   attempt (the work never ran) and the record holds in `over-budget`;
//! - a run the runner stopped for its budget (`stopped: over-budget`) is an attempt
//!   with outcome `over-budget`, which escalation and the stuck rule pass over, and
//!   the record holds in `over-budget` too (never a tier raise);
//! - the hold ends at the reset of the caps that stopped it (a timer, and
//!   level-triggered: a step after the reset sees it ended), or when a user with
//!   write access grants the record more (`/shepherd budget +<amount>`);
//! - every result that carries usage adds to the record's cost so far, once per
//!   attempt, and counts down what is left of a grant.

use super::super::budget::{Grant, Stop, resets_of_scope};
use super::super::effect::{EffectKind, Timer, TimerKind};
use super::super::ids::WorkId;
use super::super::record::{AttemptOutcome, BudgetHold, WorkState};
use super::super::usage::{StopReason, Usage};
use super::Fx;

/// The hold in force at `now`, if any: one whose reset has passed is over even
/// before its timer fires.
pub(crate) fn active_hold(ws: &WorkState, now: i64) -> Option<&BudgetHold> {
    ws.budget
        .hold
        .as_ref()
        .filter(|h| h.stop.resets_at_ms.is_none_or(|at| now < at))
}

/// The `limits.budget_scope` of `work_id` when it is the active item (read before its
/// result ends the claim).
pub(crate) fn active_scope(ws: &WorkState, work_id: &WorkId) -> Option<String> {
    ws.active
        .as_ref()
        .filter(|a| &a.item.id == work_id)
        .and_then(|a| a.item.limits.budget_scope.clone())
}

/// Enters `over-budget` with `stop`, and arms the reset timer when the stop resets.
fn hold(ws: &mut WorkState, stop: Stop, now: i64, fx: &mut Fx) {
    if let Some(due_ms) = stop.resets_at_ms {
        fx.push(EffectKind::Schedule(Timer {
            due_ms,
            kind: TimerKind::BudgetReset,
            id: "budget-reset".into(),
        }));
    }
    ws.budget.hold = Some(BudgetHold {
        stop,
        since_ms: now,
    });
}

/// The dispatch path held `work_id` back: end its claim without an attempt (it never
/// reached an agent, so neither escalation nor the stuck rule sees it) and hold.
/// A late or duplicated outcome for another item changes nothing.
pub(crate) fn on_dispatch_held(
    ws: &mut WorkState,
    work_id: &WorkId,
    stop: &Stop,
    now: i64,
    fx: &mut Fx,
) -> bool {
    if ws.active.as_ref().is_none_or(|a| &a.item.id != work_id) {
        return false;
    }
    ws.active = None;
    hold(ws, stop.clone(), now, fx);
    true
}

/// A result was recorded for `work_id` (its attempt is in `ws.attempts`): note its
/// usage once, and when the runner stopped it for its budget, mark the attempt and
/// hold. `budget_scope` is the item's `limits.budget_scope` (the caps that set its
/// budget), known when the item was the active one.
pub(crate) fn on_result(
    ws: &mut WorkState,
    work_id: &WorkId,
    usage: Option<&Usage>,
    stopped: Option<StopReason>,
    budget_scope: Option<&str>,
    now: i64,
    fx: &mut Fx,
) {
    let Some(attempt) = ws.attempts.iter_mut().rev().find(|a| &a.work_id == work_id) else {
        return;
    };
    let first = attempt.cost_micros.is_none();
    if let Some(u) = usage
        && first
    {
        attempt.cost_micros = Some(u.cost_micros);
        attempt.tokens = Some(u.budget_tokens());
    }
    if stopped == Some(StopReason::OverBudget) {
        attempt.outcome = AttemptOutcome::OverBudget;
    }
    if let Some(u) = usage
        && first
    {
        add_spent(ws, u);
    }
    if stopped != Some(StopReason::OverBudget) {
        return;
    }
    let Some(scope) = budget_scope else {
        // Not the active item any more (a push superseded it): nothing to hold for.
        return;
    };
    let stop = Stop {
        cap: scope.to_owned(),
        left: 0,
        needed: 0,
        tokens: !scope.contains("usd"),
        resets_at_ms: resets_of_scope(scope, now),
    };
    hold(ws, stop, now, fx);
}

/// Adds one run's usage to the record's cost so far and counts down what is left of
/// a grant (a transient failure's run too, which has no attempt).
pub(crate) fn add_spent(ws: &mut WorkState, u: &Usage) {
    let b = &mut ws.budget;
    b.spent_micros = b.spent_micros.saturating_add(u.cost_micros);
    b.spent_tokens = b.spent_tokens.saturating_add(u.budget_tokens());
    b.runs = b.runs.saturating_add(1);
    b.grant.usd_micros = b.grant.usd_micros.saturating_sub(u.cost_micros);
    b.grant.tokens = b.grant.tokens.saturating_sub(u.budget_tokens());
}

/// The reset timer: the hold ends when its reset has come.
pub(crate) fn on_reset_timer(ws: &mut WorkState, now: i64) -> bool {
    let due = ws
        .budget
        .hold
        .as_ref()
        .is_some_and(|h| h.stop.resets_at_ms.is_some_and(|at| now >= at));
    if due {
        ws.budget.hold = None;
    }
    due
}

/// `/shepherd budget +<amount>` by a user with write access: the record may spend
/// that much more beyond the caps, and the hold ends (the dispatch path decides
/// again with the grant).
pub(crate) fn grant(ws: &mut WorkState, more: Grant) {
    let g = &mut ws.budget.grant;
    g.usd_micros = g.usd_micros.saturating_add(more.usd_micros);
    g.tokens = g.tokens.saturating_add(more.tokens);
    ws.budget.hold = None;
}

/// A new dispatch: whatever hold there was is over (its reset passed or a grant
/// lifted it).
pub(crate) fn on_dispatch(ws: &mut WorkState) {
    ws.budget.hold = None;
}

/// The record's past runs' costs, for the expected cost of the next run (the median
/// of the kept attempts that said what they cost).
pub fn past_runs(ws: &WorkState) -> Vec<super::super::budget::Spent> {
    ws.attempts
        .iter()
        .filter_map(|a| {
            Some(super::super::budget::Spent {
                usd_micros: a.cost_micros?,
                tokens: a.tokens.unwrap_or(0),
            })
        })
        .collect()
}

/// The reason shown in `over-budget`.
pub(crate) fn reason(h: &BudgetHold) -> String {
    super::super::texts::over_budget(&h.stop)
}
