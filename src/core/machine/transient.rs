//! Transient agent failures (issue 27), shared by PR and issue records: a run that
//! failed for a reason a later run may not have — the model provider's 429 or 5xx,
//! an overload, a timeout — reported as outcome `transient` (by the runner's
//! `transient_patterns`, or by the agent itself).
//!
//! - A `transient` result of the active work item ends its claim **without an
//!   attempt**: escalation (`work::next_tier`), the stuck rule and
//!   `max_attempts_total` never see it, so the next dispatch is the same kind at the
//!   same tier with the same attempt number.
//! - No agent work starts on the record until the back-off is over:
//!   `transient_backoff_secs × 2^(n-1)` after the n-th transient failure in a row, a
//!   durable timer (`TransientRetry`) that survives restarts; the PR's plan also
//!   compares with its clock, the (which has none) waits for the timer.
//! - Agents are hostile and can say `transient` forever: past `transient_retries` in a
//!   row, the next one is a **failed attempt** (escalation proceeds). Any counted
//!   result of the active item ends the row; a run the runner stopped for a limit
//!   (budget, runaway) is never transient.
//! - What the transient runs cost still counts towards the record's cost so far.

use super::super::effect::{EffectKind, Timer, TimerKind};
use super::super::event::WorkOutcome;
use super::super::ids::WorkId;
use super::super::policy::Policy;
use super::super::record::{MAX_SUMMARY_BYTES, TransientRetry, WorkState, bounded_text};
use super::super::usage::{StopReason, Usage};
use super::Fx;

/// The id of the back-off timer (one per record: a new back-off replaces it).
const TIMER_ID: &str = "transient-retry";

/// The longest back-off, whatever the policy and the count (a day).
const MAX_BACKOFF_MS: i64 = 86_400_000;

/// The back-off after the `n`-th transient failure in a row (1-based):
/// `transient_backoff_secs × 2^(n-1)`, at most [`MAX_BACKOFF_MS`].
pub(crate) fn backoff_ms(n: u32, policy: &Policy) -> i64 {
    let base = policy.transient_backoff_secs.saturating_mul(1000);
    let ms = base.saturating_mul(1u64 << n.saturating_sub(1).min(30));
    i64::try_from(ms).unwrap_or(i64::MAX).min(MAX_BACKOFF_MS)
}

/// A work result, before the attempt bookkeeping (`work::on_result`). A `transient`
/// result of the active item within the bound ends its claim without an attempt,
/// notes its usage and arms the back-off: returns `true` (handled). Anything else
/// returns `false` and is recorded as usual — past the bound, or from a run the runner
/// stopped, `transient` is a failed attempt there; and a counted result of the active
/// item ends the row of transient failures.
#[expect(
    clippy::too_many_arguments,
    reason = "the fields of one WorkResult event, as work::on_result takes them"
)]
pub(crate) fn on_result(
    ws: &mut WorkState,
    work_id: &WorkId,
    outcome: WorkOutcome,
    stopped: Option<StopReason>,
    summary: Option<&String>,
    usage: Option<&Usage>,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) -> bool {
    if ws.active.as_ref().is_none_or(|a| &a.item.id != work_id) {
        // A late, duplicated or superseded report: `work::on_result` decides.
        return false;
    }
    let count = ws
        .transient
        .as_ref()
        .map_or(0, |t| t.count)
        .saturating_add(1);
    if outcome != WorkOutcome::Transient || stopped.is_some() || count > policy.transient_retries {
        ws.transient = None;
        return false;
    }
    let Some(active) = ws.active.take() else {
        return false;
    };
    let due = now.saturating_add(backoff_ms(count, policy));
    ws.transient = Some(TransientRetry {
        count,
        kind: active.item.kind,
        retry_at_ms: Some(due),
        summary: summary.map(|s| bounded_text(s, MAX_SUMMARY_BYTES)),
    });
    if let Some(u) = usage {
        super::budget::add_spent(ws, u);
    }
    fx.push(EffectKind::Schedule(Timer {
        due_ms: due,
        kind: TimerKind::TransientRetry,
        id: TIMER_ID.into(),
    }));
    true
}

/// The back-off timer: the wait is over when its time has come (the row's count
/// stays until a counted result).
pub(crate) fn on_timer(ws: &mut WorkState, now: i64) -> bool {
    match &mut ws.transient {
        Some(t) if t.retry_at_ms.is_some_and(|at| now >= at) => {
            t.retry_at_ms = None;
            true
        }
        Some(_) | None => false,
    }
}

/// The back-off's timer while one runs (re-armed by whoever writes a folded record).
pub(crate) fn timer(ws: &WorkState) -> Option<Timer> {
    let due_ms = ws.transient.as_ref()?.retry_at_ms?;
    Some(Timer {
        due_ms,
        kind: TimerKind::TransientRetry,
        id: TIMER_ID.into(),
    })
}

/// A new dispatch: whatever back-off there was is over (the row's count stays).
pub(crate) fn on_dispatch(ws: &mut WorkState) {
    if let Some(t) = &mut ws.transient {
        t.retry_at_ms = None;
    }
}

/// Why no agent work may start now, when a back-off runs. `now`: the PR's clock (a
/// back-off whose time has passed is over before its timer fires); `None`: the issue's
/// decision, which has no clock and waits for the timer.
pub(crate) fn waiting(ws: &WorkState, now: Option<i64>, policy: &Policy) -> Option<String> {
    let t = ws.transient.as_ref()?;
    let at = t.retry_at_ms?;
    if now.is_some_and(|n| n >= at) {
        return None;
    }
    let when = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(at)
        .map(|t| t.format("%H:%M:%S UTC").to_string())
        .unwrap_or_default();
    Some(format!(
        "transient agent failure {} of {} (model provider: rate limit, overload or \
         timeout); the same work is tried again at {when}, no attempt counted",
        t.count, policy.transient_retries
    ))
}

/// The kind whose claim label stays while a back-off runs (the record is still
/// Shepherd's: its work is tried again soon).
pub(crate) fn held_kind(ws: &WorkState) -> Option<super::super::effect::WorkKind> {
    ws.transient
        .as_ref()
        .filter(|t| t.retry_at_ms.is_some())
        .map(|t| t.kind)
}
