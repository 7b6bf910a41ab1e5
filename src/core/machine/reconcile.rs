//! Wanted vs in flight → effects. Everything started here is written into the record
//! at once (the claim, the merge state, the CI poll, the labels asked for, the status
//! comment's state), so running reconcile again on the same record emits nothing.

use super::super::effect::{EffectKind, ObserveWhat, Timer, TimerKind};
use super::super::event::PrState;
use super::super::ids::{Login, Scope};
use super::super::policy::Policy;
use super::super::record::{AttemptOutcome, MergeState, PrRecord};
use super::super::texts::{self, StatusState};
use super::facts::{MERGE_TIMEOUT_MS, ci_poll_delay_ms, schedule_merge_retry};
use super::plan::{self, CiView, Plan, Want};
use super::{Fx, Phase, review, work};

/// Emits what it takes to move from what is in flight to what `plan` wants.
/// `allow_dispatch` is false for events the bot caused (they never start work).
pub(crate) fn reconcile(
    r: &mut PrRecord,
    plan: &Plan,
    allow_dispatch: bool,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) {
    if r.pr.is_some() && !r.is_open() {
        wind_down(r, now, fx);
    }
    match &plan.want {
        Want::Nothing => {}
        Want::ObservePr => fx.push(EffectKind::Observe(ObserveWhat::Pr)),
        Want::Dispatch {
            kind,
            signature,
            context,
        } => {
            if allow_dispatch && r.work.active.is_none() {
                if *kind == super::super::effect::WorkKind::StaleCheck {
                    r.stale_checked_at = Some(r.last_activity_ms);
                }
                let spec = work::DispatchSpec {
                    repo: &r.repo,
                    scope: Scope::Pr,
                    number: r.number,
                    kind: *kind,
                    signature: signature.clone(),
                    head_sha: r.head_sha().cloned(),
                    context: context.clone(),
                };
                work::dispatch(&mut r.work, spec, now, policy, fx);
                if *kind == super::super::effect::WorkKind::Review {
                    review::on_dispatch(r, now);
                }
            }
        }
        Want::NeedsHuman { reason } => {
            work::enter_needs_human(&mut r.work, reason, r.number, now, policy, fx);
        }
        Want::ReviewRoundsExhausted { reason } => {
            r.agent_review.exhausted = true;
            let rounds = texts::review_rounds(&r.agent_review.rounds);
            let (ws, n) = (&mut r.work, r.number);
            work::enter_needs_human_with(ws, reason, &rounds, n, now, policy, fx);
        }
        Want::ReadAuthor { login } => read_author(r, login, now, fx),
        Want::Merge { sha } => merge(r, sha, now, policy, fx),
    }
    if !matches!(plan.want, Want::Merge { .. }) && matches!(r.merge, MergeState::Verifying { .. }) {
        r.merge = MergeState::Idle;
    }
    super::queue::sync(r, plan, now, policy, fx);
    ci_poll(r, now, policy, fx);
    let open = r.is_open();
    work::sync_labels(&mut r.work, open, policy, fx);
    status_comment(r, now, policy, fx);
}

/// A closed or merged PR: cancel the claim, stop polling, tell linked issues.
fn wind_down(r: &mut PrRecord, now: i64, fx: &mut Fx) {
    work::end_active(&mut r.work, AttemptOutcome::Cancelled, now, true, fx);
    r.ci_poll = None;
    r.merge = MergeState::Idle;
    let merged = r.pr.as_ref().is_some_and(|p| p.state == PrState::Merged);
    if merged && !r.merge_announced {
        r.merge_announced = true;
        for issue in r.linked_issues() {
            fx.comment(issue, texts::merged_notice(r.number));
        }
    }
}

/// Mode `auto`: merge pinned to the head. The reviews are not read first: the
/// executor's pre-merge re-check reads the PR, the head's combined status and the
/// reviews right before the merge call and refuses on any blocker (reporting what it
/// read), so a read here would only repeat it (issue 17).
fn merge(r: &mut PrRecord, sha: &super::super::ids::Sha, now: i64, policy: &Policy, fx: &mut Fx) {
    match &r.merge {
        MergeState::InFlight { .. } => return,
        MergeState::Verifying { .. } | MergeState::Idle | MergeState::Backoff { .. } => {}
    }
    match super::queue::is_head(r) && policy.merge_queue {
        true => fx.push(EffectKind::QueueAdvance {
            head_sha: sha.clone(),
            branch: r
                .pr
                .as_ref()
                .map(|p| p.base_ref.clone())
                .unwrap_or_default(),
            update_style: policy.merge_queue_update_style,
            style: policy.merge_style,
            delete_branch: policy.delete_branch,
            may_update: super::queue::may_update(r, policy),
            batch: (policy.merge_queue_batch_size > 1).then_some(
                crate::core::effect::BatchSettings {
                    size: policy.merge_queue_batch_size,
                    wait_secs: policy.merge_queue_batch_wait_secs,
                    flaky_retries: policy.merge_queue_flaky_retries,
                    step_results: policy.merge_queue_step_results,
                },
            ),
        }),
        false => fx.push(EffectKind::Merge {
            head_sha: sha.clone(),
            style: policy.merge_style,
            delete_branch: policy.delete_branch,
            title: None,
            message: None,
        }),
    }
    r.merge = MergeState::InFlight {
        sha: sha.clone(),
        since_ms: now,
    };
    // The watchdog of a merge whose outcome never comes (replaces the verify timer).
    schedule_merge_retry(now.saturating_add(MERGE_TIMEOUT_MS), fx);
}

/// Poll the head's combined status with backoff while contexts are pending or
/// missing; stop once it settles.
fn ci_poll(r: &mut PrRecord, now: i64, policy: &Policy, fx: &mut Fx) {
    let head = match (r.is_open(), r.head_sha()) {
        (true, Some(h)) => h.clone(),
        (true, None) | (false, _) => {
            r.ci_poll = None;
            return;
        }
    };
    match plan::ci_view(r, policy) {
        CiView::Missing | CiView::Pending(_) => {
            if r.ci_poll.as_ref().is_some_and(|p| p.sha == head) {
                return;
            }
            let due_ms = now.saturating_add(ci_poll_delay_ms(0, policy));
            r.ci_poll = Some(super::super::record::CiPoll {
                sha: head.clone(),
                n: 0,
                due_ms,
                events: false,
            });
            fx.push(EffectKind::Schedule(Timer {
                due_ms,
                kind: TimerKind::CiPoll { sha: head },
                id: "ci-poll".into(),
            }));
        }
        CiView::Success | CiView::Failing(_) => r.ci_poll = None,
    }
}

/// Most unofficial change requesters carried in the status comment's state.
const UNOFFICIAL_KEPT: usize = 20;

/// Upserts the sticky status comment when phase, tier, attempts or the last problem
/// changed (not on every change of wording).
fn status_comment(r: &mut PrRecord, now: i64, policy: &Policy, fx: &mut Fx) {
    let p = plan::plan(r, policy, now);
    let state = StatusState {
        phase: p.phase,
        reason: p.reason,
        tier: r.work.tier,
        tier_name: policy.tier_name(r.work.tier),
        // With the attempts a previous dispatcher made (`core::legacy`).
        attempts: usize::try_from(
            r.work
                .attempts_total()
                .saturating_add(r.work.legacy.carried_attempts()),
        )
        .unwrap_or(usize::MAX),
        last_signature: r.work.attempts.last().map(|a| a.signature.clone()),
        head_sha: r.head_sha().cloned(),
        // Emitting this effect makes the step a change: the record will be committed
        // as the next version.
        version: r.version + 1,
        // Bounded: the list goes into the comment's state block, and any account
        // can review (the comment names the first ten and counts the rest).
        unofficial_change_requests: plan::unofficial_change_requests(r)
            .into_iter()
            .take(UNOFFICIAL_KEPT)
            .collect(),
        uncounted_approvals: review::uncounted_approvals(r, policy)
            .into_iter()
            .take(UNOFFICIAL_KEPT)
            .collect(),
        agents: match (&r.agents_on, plan::agents_gate(r, policy, now)) {
            (Some(on), _) => Some(format!(
                "on for this PR (`/shepherd agents on` by `{}`)",
                on.by
            )),
            (None, plan::AgentsGate::Off(why)) => Some(plan::agents_off_text(&why)),
            (None, plan::AgentsGate::Open { .. } | plan::AgentsGate::Unknown(_)) => None,
        },
        review: r
            .agent_review
            .rounds
            .last()
            .map(|round| texts::ReviewStatus {
                round: u32::try_from(r.agent_review.rounds.len()).unwrap_or(u32::MAX),
                max_rounds: policy.max_review_rounds,
                reviewer: round.reviewer.to_string(),
                verdict: round.verdict,
            }),
        queue: r.queue.membership.as_ref().map(|m| {
            let place = r.queue.place.as_ref().filter(|_| m.parked.is_none());
            texts::QueueStatus {
                branch: m.branch.clone(),
                position: place.and_then(|p| p.position),
                testing: place.is_some_and(|p| p.head),
                parked: m.parked,
                priority: m.priority,
            }
        }),
        cost: cost_status(&r.work),
        claimed_elsewhere: r
            .work
            .legacy
            .foreign_claim
            .as_ref()
            .filter(|c| !c.expired)
            .map(crate::core::legacy::claimed_elsewhere),
    };
    let mut key = serde_json::json!([
        state.phase,
        state.tier,
        state.attempts,
        state.last_signature,
        state.head_sha,
        r.work.active.as_ref().map(|a| a.item.id.clone()),
    ]);
    // Only when there are some: the keys of existing records stay as they were, so
    // no status comment is rewritten just because this field exists.
    if !state.unofficial_change_requests.is_empty()
        && let Some(parts) = key.as_array_mut()
    {
        parts.push(serde_json::json!(state.unofficial_change_requests));
    }
    // Likewise only when the bot or an agent approved.
    if !state.uncounted_approvals.is_empty()
        && let Some(parts) = key.as_array_mut()
    {
        parts.push(serde_json::json!(["uncounted", state.uncounted_approvals]));
    }
    // Likewise only when agents are off for the PR, or were let in by a command.
    if let Some(agents) = &state.agents
        && let Some(parts) = key.as_array_mut()
    {
        parts.push(serde_json::json!(["agents", agents]));
    }
    // Likewise only in the merge queue: the position, headship, parking, priority.
    if let Some(q) = &state.queue
        && let Some(parts) = key.as_array_mut()
    {
        parts.push(serde_json::json!([
            q.position, q.testing, q.parked, q.priority
        ]));
    }
    // Likewise only once a reviewer agent was asked: the round and its verdict.
    if let Some(review) = &state.review
        && let Some(parts) = key.as_array_mut()
    {
        parts.push(serde_json::json!([review.round, review.verdict]));
    }
    // Likewise only once a run's result said what it cost.
    if let Some(c) = &state.cost
        && let Some(parts) = key.as_array_mut()
    {
        parts.push(serde_json::json!(["cost", c.total_micros, c.runs]));
    }
    // Likewise only while a claim label Shepherd did not set holds the PR.
    if let Some(c) = &state.claimed_elsewhere
        && let Some(parts) = key.as_array_mut()
    {
        parts.push(serde_json::json!(["claimed-elsewhere", c]));
    }
    let key = key.to_string();
    if r.status_comment.as_ref() == Some(&key) {
        r.status_pending_since_ms = None;
        return;
    }
    let reading = matches!(p.want, Want::ReadAuthor { .. });
    if settling(r, p.phase, reading, now, policy, fx) {
        return;
    }
    let first = !r.status_posted
        && r.status_comment.is_none()
        && r.pr.as_ref().is_some_and(|p| p.comments == Some(0));
    r.status_comment = Some(key);
    r.status_pending_since_ms = None;
    r.status_posted = true;
    fx.push(EffectKind::UpsertComment {
        body: texts::status_comment(&state, &policy.comment_footer),
        first,
    });
}

/// The cost so far and per kept attempt (`None` until a result said what it cost).
fn cost_status(ws: &super::super::record::WorkState) -> Option<texts::CostStatus> {
    if ws.budget.runs == 0 {
        return None;
    }
    let attempts = ws
        .attempts
        .iter()
        .enumerate()
        .filter_map(|(i, a)| Some((ws.attempt_number(i), a.kind, a.cost_micros?)))
        .collect();
    Some(texts::CostStatus {
        total_micros: ws.budget.spent_micros,
        tokens: ws.budget.spent_tokens,
        runs: ws.budget.runs,
        attempts,
    })
}

/// Whether a new status for `phase` waits instead of being written now: a
/// short-lived one ([`short_lived`], or one waiting for the read of the PR author's
/// permission, answered in a moment) waits up to `status_settle_secs` from when the
/// first of its kind was decided (a timer writes it then); anything else is written at
/// once and takes the waiting one's place. Starting the wait schedules that timer.
fn settling(
    r: &mut PrRecord,
    phase: Phase,
    reading_author: bool,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) -> bool {
    let settle_ms = settle_ms(policy);
    if settle_ms == 0 || !(reading_author || short_lived(r, phase)) {
        return false;
    }
    let since = match r.status_pending_since_ms {
        Some(since) => since,
        None => {
            r.status_pending_since_ms = Some(now);
            schedule_status_settle(now.saturating_add(settle_ms), fx);
            now
        }
    };
    now < since.saturating_add(settle_ms)
}

/// Schedules the record's one status-settle timer (a new schedule replaces the last).
pub(crate) fn schedule_status_settle(due_ms: i64, fx: &mut Fx) {
    fx.push(EffectKind::Schedule(Timer {
        due_ms,
        kind: TimerKind::StatusSettle,
        id: "status-settle".into(),
    }));
}

/// Phases that usually last seconds, not worth an edit of their own: ready to merge
/// and merging (the merge re-check and call take a second or two, then `merged`), and
/// waiting for CI before the head's CI was read at all (the first CI read, due within
/// `ci_poll_initial_secs` or at the first Actions event, tells what to show).
fn short_lived(r: &PrRecord, phase: Phase) -> bool {
    match phase {
        Phase::ReadyToMerge | Phase::Merging => true,
        Phase::AwaitingCi => r.head_sha().is_none_or(|h| !r.ci.contains_key(h)),
        Phase::CiFix
        | Phase::ReviewFeedback
        | Phase::MergeConflicts
        | Phase::AwaitingReview
        | Phase::Queued
        | Phase::Merged
        | Phase::Closed
        | Phase::NeedsHuman
        | Phase::Paused
        | Phase::OverBudget => false,
    }
}

/// `status_settle_secs` in ms.
pub(crate) fn settle_ms(policy: &Policy) -> i64 {
    i64::try_from(policy.status_settle_secs.saturating_mul(1000)).unwrap_or(i64::MAX)
}

/// How long a permission read of the PR's author is waited for before it is asked
/// again (a read that failed for good leaves no answer).
const AUTHOR_READ_RETRY_MS: i64 = 300_000;

/// Asks for the PR author's permission (`agent_authors`), once per
/// [`AUTHOR_READ_RETRY_MS`]: the answer is cached like a commenter's, for an hour.
fn read_author(r: &mut PrRecord, login: &Login, now: i64, fx: &mut Fx) {
    if r.author_read_ms
        .is_some_and(|at| now.saturating_sub(at) < AUTHOR_READ_RETRY_MS)
    {
        return;
    }
    r.author_read_ms = Some(now);
    fx.push(EffectKind::Observe(ObserveWhat::Permission {
        login: login.clone(),
    }));
}
