//! Claims, attempts, escalation and the stuck rule (DESIGN §2.3), shared by PR and
//! issue records.
//!
//! - At most one active work item; dispatching claims the record until the agent
//!   reports, a new head arrives, the PR/issue closes or the TTL expires (a failed
//!   attempt).
//! - Escalation: a new dispatch of kind K for problem S goes one tier above the last
//!   attempt of kind K when that attempt had the same signature S (the same problem
//!   came back); otherwise it stays at the record's tier. Tiers never go down.
//! - Stuck: `stuck_after` consecutive attempts of kind K with signature S at the top
//!   tier (since the last resume) → needs-human instead of another dispatch.

use super::super::effect::{
    AttemptSummary, EffectKind, Timer, TimerKind, WorkContext, WorkItem, WorkKind,
};
use super::super::event::WorkOutcome;
use super::super::ids::{Login, RepoName, Scope, Sha, WorkId};
use super::super::policy::Policy;
use super::super::record::{
    ActiveWork, Attempt, AttemptOutcome, Hold, MAX_REPORTED_SIGNATURE_BYTES, MAX_SUMMARY_BYTES,
    WORK_ITEM_ATTEMPTS, WorkState, bounded_text,
};
use super::super::usage::RunLimits;
use super::Fx;

/// The tier a dispatch of `kind` for problem `signature` gets.
pub(crate) fn next_tier(ws: &WorkState, kind: WorkKind, signature: &str, policy: &Policy) -> u8 {
    let top = policy.top_tier();
    let current = ws.tier.min(top);
    // A run stopped for its budget says nothing about the problem's difficulty.
    let counted = |a: &&Attempt| a.outcome != AttemptOutcome::OverBudget;
    match ws
        .attempts
        .iter()
        .rev()
        .filter(counted)
        .find(|a| a.kind == kind)
    {
        Some(last) if last.signature == signature => {
            current.max(last.tier.saturating_add(1).min(top))
        }
        Some(_) | None => current,
    }
}

/// Whether another dispatch of `kind` for `signature` would exceed the stuck rule.
pub(crate) fn is_stuck(ws: &WorkState, kind: WorkKind, signature: &str, policy: &Policy) -> bool {
    let top = policy.top_tier();
    let same = ws.attempts[ws.stuck_base.min(ws.attempts.len())..]
        .iter()
        .rev()
        .filter(|a| a.kind == kind && a.outcome != AttemptOutcome::OverBudget)
        .take_while(|a| a.signature == signature && a.tier >= top)
        .count();
    same >= policy.stuck_after as usize
}

/// The last attempt since the last resume, if it is of `kind` for `signature`, on
/// `head`, and reported success: its push (or PR) has not arrived yet.
pub(crate) fn awaiting_result_of(
    ws: &WorkState,
    kind: WorkKind,
    signature: &str,
    head: Option<&Sha>,
) -> Option<usize> {
    let i = ws.attempts.len().checked_sub(1)?;
    let a = &ws.attempts[i];
    let waiting = i >= ws.stuck_base
        && a.kind == kind
        && a.signature == signature
        && a.head_sha.as_ref() == head
        && a.outcome == AttemptOutcome::Succeeded;
    waiting.then_some(usize::try_from(ws.attempt_number(i)).unwrap_or(usize::MAX))
}

/// Why no more work is dispatched when the attempts since the last resume reached
/// `max_attempts_total` (0: no bound).
pub(crate) fn over_budget(ws: &WorkState, policy: &Policy) -> Option<String> {
    let max = u64::from(policy.max_attempts_total);
    let used = ws.attempts_total().saturating_sub(ws.attempts_base);
    (max > 0 && used >= max).then(|| {
        format!(
            "{used} attempts on this PR (max_attempts_total = {max}); a user with write \
             access must act (`/shepherd retry`, or push a commit)"
        )
    })
}

/// What to dispatch.
pub(crate) struct DispatchSpec<'a> {
    /// Repository.
    pub repo: &'a RepoName,
    /// Record kind.
    pub scope: Scope,
    /// Record number.
    pub number: u64,
    /// Kind of work.
    pub kind: WorkKind,
    /// The problem's signature.
    pub signature: String,
    /// The head it is for.
    pub head_sha: Option<Sha>,
    /// Failing checks / change requests (attempt history is added here).
    pub context: WorkContext,
}

/// Claims the record for a new work item: emits `Dispatch` and the claim-expiry
/// timer. Labels follow from the claim in `sync_labels`.
pub(crate) fn dispatch(
    ws: &mut WorkState,
    spec: DispatchSpec<'_>,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) {
    let tier = next_tier(ws, spec.kind, &spec.signature, policy);
    ws.tier = ws.tier.max(tier);
    super::budget::on_dispatch(ws);
    super::transient::on_dispatch(ws);
    ws.seq += 1;
    let id = WorkId::new(spec.repo, spec.scope, spec.number, ws.seq);
    let ttl_ms = i64::try_from(policy.claim_ttl_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    let expires_ms = now.saturating_add(ttl_ms);
    // Attempts a previous dispatcher made count on (`core::legacy`).
    let attempt = ws
        .attempts_of(spec.kind)
        .saturating_add(ws.legacy.carried_attempts())
        .saturating_add(1);
    let mut context = spec.context;
    // The most recent attempts only: the history of a long-lived record grows.
    let recent = ws.attempts.len().saturating_sub(WORK_ITEM_ATTEMPTS);
    context.attempts = ws.attempts[recent..]
        .iter()
        .map(|a| AttemptSummary {
            kind: a.kind,
            tier: a.tier,
            outcome: a.outcome.as_str().into(),
            signature: a.signature.clone(),
            summary: a.summary.clone(),
            started_at: Some(a.started_ms),
        })
        .collect();
    let item = WorkItem {
        id: id.clone(),
        kind: spec.kind,
        repo: spec.repo.clone(),
        number: spec.number,
        head_sha: spec.head_sha,
        tier,
        tier_name: policy.tier_name(tier),
        attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
        priority: spec.kind.priority(),
        claim_expires_at: expires_ms,
        context,
        limits: guard_limits(policy),
    };
    fx.push(EffectKind::Dispatch(item.clone()));
    fx.push(EffectKind::Schedule(claim_timer(&item)));
    ws.active = Some(ActiveWork {
        item,
        signature: spec.signature,
        dispatched_ms: now,
        expires_ms,
    });
}

/// The runaway guards of a new work item, from the policy (0 = off). The budget
/// figures of [`RunLimits`] are set later, where the ledger is read (issue 28).
fn guard_limits(policy: &Policy) -> RunLimits {
    let on32 = |v: u32| (v > 0).then_some(v);
    RunLimits {
        max_steps: on32(policy.max_steps_per_run),
        max_tool_calls: on32(policy.max_tool_calls_per_run),
        idle_secs: (policy.agent_idle_timeout_secs > 0).then_some(policy.agent_idle_timeout_secs),
        max_repeats: on32(policy.max_repeats_per_run),
        ..RunLimits::default()
    }
}

/// The timer that ends `item`'s claim at its expiry (an expired claim is a failed
/// attempt). Armed at dispatch, and by `rebuild --apply` for work only the rebuilt
/// record holds.
pub fn claim_timer(item: &WorkItem) -> Timer {
    Timer {
        due_ms: item.claim_expires_at,
        kind: TimerKind::ClaimExpiry {
            work_id: item.id.clone(),
        },
        id: format!("claim:{}", item.id),
    }
}

/// Ends the active claim with `outcome`; `cancel` also tells the agents to stop.
pub(crate) fn end_active(
    ws: &mut WorkState,
    outcome: AttemptOutcome,
    now: i64,
    cancel: bool,
    fx: &mut Fx,
) {
    let Some(active) = ws.active.take() else {
        return;
    };
    if cancel {
        fx.push(EffectKind::CancelWork {
            work_id: active.item.id.clone(),
        });
    }
    ws.push_attempt(Attempt {
        work_id: active.item.id,
        kind: active.item.kind,
        tier: active.item.tier,
        signature: active.signature,
        head_sha: active.item.head_sha,
        outcome,
        reported_signature: None,
        summary: None,
        started_ms: active.dispatched_ms,
        ended_ms: now,
        cost_micros: None,
        tokens: None,
    });
}

/// An agent's report. Ends the claim if it is the active item; for an item whose
/// claim already ended because its push arrived, records what the agent said.
/// Returns whether anything changed.
pub(crate) fn on_result(
    ws: &mut WorkState,
    work_id: &WorkId,
    outcome: WorkOutcome,
    signature: Option<&String>,
    summary: Option<&String>,
    now: i64,
    fx: &mut Fx,
) -> bool {
    let attempt_outcome = match outcome {
        WorkOutcome::Succeeded => AttemptOutcome::Succeeded,
        WorkOutcome::Failed => AttemptOutcome::Failed,
        WorkOutcome::NoChanges => AttemptOutcome::NoChanges,
        // `transient::on_result` retries it without an attempt; here it is past
        // `transient_retries` in a row, from a stopped run, or after a push: failed.
        WorkOutcome::Transient => AttemptOutcome::Failed,
    };
    if ws.active.as_ref().is_some_and(|a| &a.item.id == work_id) {
        end_active(ws, attempt_outcome, now, false, fx);
    } else {
        match ws.attempts.iter().rposition(|a| &a.work_id == work_id) {
            Some(i) if ws.attempts[i].outcome == AttemptOutcome::Superseded => {
                ws.attempts[i].outcome = attempt_outcome;
            }
            // A duplicate report, or one for a claim that expired or was cancelled.
            Some(_) | None => return false,
        }
    }
    if let Some(last) = ws.attempts.iter_mut().rev().find(|a| &a.work_id == work_id) {
        // Agents' text is bounded here, where it enters the record (and every later
        // work item): intake bounds it too, but internal events can come from anywhere.
        last.reported_signature = signature.map(|s| bounded_text(s, MAX_REPORTED_SIGNATURE_BYTES));
        last.summary = summary.map(|s| bounded_text(s, MAX_SUMMARY_BYTES));
    }
    true
}

/// The claim-expiry timer: an expired claim is a failed attempt.
pub(crate) fn on_expiry(ws: &mut WorkState, work_id: &WorkId, now: i64, fx: &mut Fx) -> bool {
    match &ws.active {
        Some(a) if &a.item.id == work_id && now >= a.expires_ms => {
            end_active(ws, AttemptOutcome::Expired, now, true, fx);
            true
        }
        Some(_) | None => false,
    }
}

/// Leaves paused/needs-human and restarts the stuck count.
pub(crate) fn resume(ws: &mut WorkState) -> bool {
    let changed = ws.hold.is_some()
        || ws.stuck_base != ws.attempts.len()
        || ws.attempts_base != ws.attempts_total();
    ws.hold = None;
    ws.stuck_base = ws.attempts.len();
    ws.attempts_base = ws.attempts_total();
    ws.resume_by_push = None;
    changed
}

/// Enters needs-human (once): the comment with the attempt history is emitted here,
/// the label by `sync_labels`.
pub(crate) fn enter_needs_human(
    ws: &mut WorkState,
    reason: &str,
    number: u64,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) {
    enter_needs_human_with(ws, reason, "", number, now, policy, fx);
}

/// [`enter_needs_human`] with `more` (e.g. the review rounds) appended to the comment.
pub(crate) fn enter_needs_human_with(
    ws: &mut WorkState,
    reason: &str,
    more: &str,
    number: u64,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) {
    if matches!(ws.hold, Some(Hold::NeedsHuman { .. })) {
        return;
    }
    ws.hold = Some(Hold::NeedsHuman {
        reason: reason.to_owned(),
        since_ms: now,
        label_seen: false,
    });
    let mut text =
        super::super::texts::needs_human(reason, &ws.attempts, ws.attempt_number(0), |t| {
            policy.tier_name(t)
        });
    if !more.is_empty() {
        text.push('\n');
        text.push_str(more);
    }
    fx.comment(number, text);
}

/// Notes the needs-human label in a fresh snapshot: seen → remember; gone after being
/// seen (and not removed by the bot) → a human resumed.
pub(crate) fn observe_hold_label(
    ws: &mut WorkState,
    labels: &std::collections::BTreeSet<String>,
    policy: &Policy,
    human: bool,
) {
    let Some(Hold::NeedsHuman { label_seen, .. }) = &mut ws.hold else {
        return;
    };
    let present = labels.contains(&policy.label_needs_human);
    if present {
        *label_seen = true;
    } else if *label_seen && human {
        resume(ws);
    }
}

/// Brings the managed labels (claim, tier, needs-human) to what the state wants,
/// emitting only differences from what was asked for before.
pub(crate) fn sync_labels(ws: &mut WorkState, open: bool, policy: &Policy, fx: &mut Fx) {
    let mut want = std::collections::BTreeSet::new();
    // A transient failure's back-off keeps the claim: the same work comes back soon.
    let claimed = ws
        .active
        .as_ref()
        .map(|a| a.item.kind)
        .or_else(|| super::transient::held_kind(ws));
    if open && let Some(kind) = claimed {
        // A reviewer holds the PR under its own label: the two never show at once
        // because a record has one active work item.
        let label = match kind {
            WorkKind::Review => &policy.label_claimed_reviewer,
            WorkKind::CiFix
            | WorkKind::ReviewFeedback
            | WorkKind::MergeConflicts
            | WorkKind::StaleCheck
            | WorkKind::IssueImpl
            | WorkKind::ReadyToMerge => &policy.label_claimed,
        };
        want.insert(label.clone());
    }
    if open && matches!(ws.hold, Some(Hold::NeedsHuman { .. })) {
        want.insert(policy.label_needs_human.clone());
    }
    if claimed.is_some() || !ws.attempts.is_empty() {
        want.insert(policy.tier_label(ws.tier));
    }
    let add: Vec<String> = want.difference(&ws.labels_applied).cloned().collect();
    let remove: Vec<String> = ws.labels_applied.difference(&want).cloned().collect();
    if !remove.is_empty() {
        fx.push(EffectKind::RemoveLabels { labels: remove });
    }
    if !add.is_empty() {
        fx.push(EffectKind::AddLabels { labels: add });
    }
    ws.labels_applied = want;
}

/// Pauses.
pub(crate) fn pause(ws: &mut WorkState, by: Option<&Login>, now: i64) -> bool {
    if matches!(ws.hold, Some(Hold::Paused { .. })) {
        return false;
    }
    ws.hold = Some(Hold::Paused {
        by: by.cloned(),
        since_ms: now,
    });
    true
}

/// `/shepherd escalate`: one tier up for the next attempt (never past the top).
pub(crate) fn escalate(ws: &mut WorkState, policy: &Policy) -> bool {
    let next = ws.tier.saturating_add(1).min(policy.top_tier());
    let changed = next != ws.tier;
    ws.tier = ws.tier.max(next);
    changed
}

/// The timer that ends the wait of `work_id`'s `succeeded` result for its push (or
/// PR) after `push_grace_secs` ([`on_push_grace`]).
pub(crate) fn push_grace_timer(work_id: &WorkId, now: i64, policy: &Policy) -> Timer {
    let grace_ms = i64::try_from(policy.push_grace_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    Timer {
        due_ms: now.saturating_add(grace_ms),
        kind: TimerKind::PushGrace {
            work_id: work_id.clone(),
        },
        id: format!("push-grace:{work_id}"),
    }
}

/// After a result was recorded: when it is the last attempt, a success, and what it
/// announced has not arrived (`waiting`: the PR's head is still the attempt's, or the
/// issue has no agent PR), arms its push-grace timer. Without it the record would
/// wait for that push with no deadline (`awaiting_result_of`).
pub(crate) fn arm_push_grace(
    ws: &WorkState,
    work_id: &WorkId,
    waiting: bool,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) {
    let last = ws.attempts.last();
    if waiting
        && last.is_some_and(|a| &a.work_id == work_id && a.outcome == AttemptOutcome::Succeeded)
    {
        fx.push(EffectKind::Schedule(push_grace_timer(work_id, now, policy)));
    }
}

/// The push-grace timer of `work_id`: if its attempt is still the last one since the
/// last resume, still `succeeded`, and what it announced still has not arrived
/// (`waiting`), it becomes `no-changes` — a failed attempt for the same-problem rule,
/// so the next dispatch escalates and the stuck rule counts it. Returns whether
/// anything changed.
pub(crate) fn on_push_grace(
    ws: &mut WorkState,
    work_id: &WorkId,
    waiting: bool,
    policy: &Policy,
) -> bool {
    let Some(i) = ws.attempts.len().checked_sub(1) else {
        return false;
    };
    let a = &mut ws.attempts[i];
    if !waiting || i < ws.stuck_base || &a.work_id != work_id {
        return false;
    }
    if a.outcome != AttemptOutcome::Succeeded {
        return false;
    }
    a.outcome = AttemptOutcome::NoChanges;
    let note = format!(
        "reported success, but nothing it announced arrived within {} s (push_grace_secs): \
         counted as no-changes",
        policy.push_grace_secs
    );
    let text = match &a.summary {
        Some(s) => format!("{note}\n{s}"),
        None => note,
    };
    a.summary = Some(bounded_text(&text, MAX_SUMMARY_BYTES));
    true
}

/// Whether `head` is still the head `work_id`'s attempt worked on (its push has not
/// arrived).
pub(crate) fn head_unmoved(ws: &WorkState, work_id: &WorkId, head: Option<&Sha>) -> bool {
    ws.attempts
        .iter()
        .rev()
        .find(|a| &a.work_id == work_id)
        .is_some_and(|a| a.head_sha.as_ref() == head)
}

/// Whether the last attempt ended `push_grace_secs` or more before `now` (a
/// `succeeded` result no longer holds the record waiting for its push).
pub(crate) fn grace_over(ws: &WorkState, now: i64, policy: &Policy) -> bool {
    let grace_ms = i64::try_from(policy.push_grace_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    ws.attempts
        .last()
        .is_some_and(|a| now >= a.ended_ms.saturating_add(grace_ms))
}

/// The timers a record's work state stands on besides its claim's ([`claim_timer`]):
/// the legacy read's deadline or a foreign claim's TTL, the push grace of a
/// `succeeded` result still waiting (due `push_grace_secs` after it ended), and a
/// transient back-off. A fold discards effects (`rebuild`), so whoever writes a folded
/// record arms these, or a wait would have no end.
pub fn standing_timers(ws: &WorkState, policy: &Policy) -> Vec<Timer> {
    let mut timers: Vec<Timer> = crate::core::legacy::timer(ws).into_iter().collect();
    if let Some(i) = ws.attempts.len().checked_sub(1)
        && i >= ws.stuck_base
        && ws.active.is_none()
        && ws.attempts[i].outcome == AttemptOutcome::Succeeded
    {
        let a = &ws.attempts[i];
        timers.push(push_grace_timer(&a.work_id, a.ended_ms, policy));
    }
    timers.extend(super::transient::timer(ws));
    timers
}
