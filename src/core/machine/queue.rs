//! A PR's part in its target branch's merge queue (policy `merge_queue`, issue 16).
//!
//! The record decides, level-triggered, what it wants of the queue ([`sync`]): to be
//! in it when every §2.4 condition holds (`Join`), to keep its ticket but stop being
//! tested when a problem appears (`Park`: CI red, a conflict, approvals gone, work,
//! a hold), to leave when merged, closed, dequeued or the queue is turned off. The
//! queue (`core::queue`, applied by the executor) answers with the PR's [`Place`].
//! Only the head is tested: when it is ready its record asks the executor to advance
//! it (`QueueAdvance`: update onto the tip, or merge the tested head fast-forward).
//! Outcomes: `Updated` (a new head follows, CI runs on it; bounded by
//! `merge_queue_max_updates`, then the PR goes to the back), `BaseMoved` (update again),
//! and the merge outcomes of a plain merge.

use super::super::event::PrState;
use super::super::ids::Sha;
use super::super::policy::Policy;
use super::super::queue::freeze::{FreezeAction, FreezeOp};
use super::super::queue::{Departure, Ejection, Place, Priority, QueueAction, QueueOp};
use super::super::record::{BatchFailure, ConflictFact, MergeState, PrRecord, QueueMembership};
use super::plan::{CiView, Plan, Want, ci_view};
use super::{Fx, Phase};
use crate::core::effect::{EffectKind, Timer, TimerKind};

/// The record's place if it is in its queue to be tested (joined, not parked).
fn joined(r: &PrRecord) -> Option<&QueueMembership> {
    r.queue.membership.as_ref().filter(|m| m.parked.is_none())
}

/// The position text of a joined record. Without the queue's length: a PR is told
/// when its own position changes, not each time others join behind it (the status
/// page and `inspect` read the queue itself).
fn position_text(r: &PrRecord, branch: &str) -> String {
    match &r.queue.place {
        Some(Place {
            position: Some(p), ..
        }) => format!("position {p} in the merge queue of `{branch}`"),
        Some(_) | None => format!("entering the merge queue of `{branch}`"),
    }
}

/// Whether the queue says this record is its head (and the record is joined).
pub(crate) fn is_head(r: &PrRecord) -> bool {
    joined(r).is_some() && r.queue.place.as_ref().is_some_and(|p| p.head)
}

/// Every §2.4 condition holds and the queue is on: queued, or (the head) advancing.
pub(crate) fn ready_plan(r: &PrRecord, sha: Sha, policy: &Policy, now: i64) -> Plan {
    let branch = base_branch(r);
    if r.queue.dequeued {
        return Plan {
            phase: Phase::ReadyToMerge,
            reason: format!(
                "ready, but taken out of the merge queue of `{branch}` (`/shepherd queue` to enter it again)"
            ),
            want: Want::Nothing,
        };
    }
    if r.queue.updated_from.as_ref() == Some(&sha) {
        return Plan {
            phase: Phase::Queued,
            reason: format!("updated onto the tip of `{branch}`; waiting for the new head"),
            want: Want::Nothing,
        };
    }
    if out_of_updates(r, policy) {
        // The base kept moving: `sync` sends the PR to the back of the queue.
        return Plan {
            phase: Phase::Queued,
            reason: format!(
                "the tip of `{branch}` moved again after {} updates while testing: \
                 back of the merge queue",
                policy.merge_queue_max_updates
            ),
            want: Want::Nothing,
        };
    }
    if is_head(r) {
        if let MergeState::Backoff { not_before_ms, .. } = r.merge
            && now < not_before_ms
        {
            // The advance asked to be tried again later (the lease was busy, or the
            // batch it leads is under test): the head keeps its place meanwhile.
            let what = match policy.merge_queue_batch_size > 1 {
                true => "testing a batch",
                false => "waiting for the merge lease",
            };
            return Plan {
                phase: Phase::Queued,
                reason: format!("head of the merge queue of `{branch}`: {what}"),
                want: Want::Nothing,
            };
        }
        let how = match r.queue.updated_onto {
            Some(_) => "tested on top of the tip",
            None => "head of the queue",
        };
        if let Some((note, at)) = &r.queue.frozen {
            // Asks again when the freeze should end (the merge-retry timer) or when the
            // queue spoke; the reason stays the same meanwhile.
            let reason = format!("{how} of `{branch}`, but {note}: {sha} merges after it");
            let want = match now >= *at {
                true => Want::Merge { sha },
                false => Want::Nothing,
            };
            return Plan {
                phase: Phase::Queued,
                reason,
                want,
            };
        }
        return Plan {
            phase: Phase::Queued,
            reason: format!("{how} of `{branch}`: merging {sha} once it is on the tip"),
            want: Want::Merge { sha },
        };
    }
    Plan {
        phase: Phase::Queued,
        reason: position_text(r, &branch),
        want: Want::Nothing,
    }
}

/// A joined record whose only blockers are CI on its (new) head and Forgejo's
/// mergeability check: it stays queued while they run.
pub(crate) fn testing_plan(r: &PrRecord, policy: &Policy, blockers: &[String]) -> Option<Plan> {
    joined(r)?;
    if r.queue.dequeued {
        return None;
    }
    let ci_waiting = matches!(ci_view(r, policy), CiView::Missing | CiView::Pending(_));
    let suspected = matches!(r.conflict, ConflictFact::Suspected { .. });
    let waiting = usize::from(ci_waiting) + usize::from(suspected);
    if waiting == 0 || blockers.len() != waiting {
        return None;
    }
    let branch = base_branch(r);
    let reason = match (is_head(r), &r.queue.updated_onto) {
        (true, Some(onto)) => format!("testing on top of `{branch}` at {onto}: waiting for CI"),
        (true, None) | (false, _) => format!("{}: waiting for CI", position_text(r, &branch)),
    };
    Some(Plan {
        phase: Phase::Queued,
        reason,
        want: Want::Nothing,
    })
}

/// The approvals reason of a record whose update dismissed them (reported plainly: it
/// waits for re-approval, keeping its ticket).
pub(crate) fn approvals_note(r: &PrRecord, first_blocker: &str) -> Option<String> {
    let m = r.queue.membership.as_ref()?;
    (r.queue.updated_onto.is_some() && first_blocker.contains("approval")).then(|| {
        format!(
            "{first_blocker}: the update onto `{}` made earlier approvals stale or dismissed them; \
             re-approve to re-enter the merge queue at the same position",
            m.branch
        )
    })
}

/// The note of a `ci-fix` on a head the queue produced: it failed only on top of the
/// new base.
pub(crate) fn ci_note(r: &PrRecord) -> Option<String> {
    let head = r.head_sha()?;
    let onto = r.queue.updated_onto.as_ref()?;
    (r.queue.updated_head.as_ref() == Some(head)).then(|| {
        format!(
            "CI failed on {head}, the head after Shepherd's merge queue updated this PR onto \
             `{}` at {onto}: it passed before and fails only on top of the new base",
            base_branch(r)
        )
    })
}

/// Issue 29: the serial queue's head (`merge_queue_batch_size` = 1) whose CI failed
/// on the head the queue's update built on the tip asks its queue before any agent is
/// woken: the executor reads the failing checks and the tip's, and the pure rule
/// (`core::queue::batch::Retest`) re-tests it once as a batch of one when every
/// failing check passed on the tip (green: it lands, the check counts as suspected
/// flaky), or ejects it (`QueueEjected`: `ci-fix` work with the note). Meanwhile the
/// PR stays queued at the head and `plan` (the `ci-fix` one) is replaced.
pub(crate) fn flaky_check(r: &PrRecord, plan: Plan, policy: &Policy, now: i64) -> Plan {
    let asks = plan.phase == Phase::CiFix
        && policy.merge_queue
        && policy.merge_queue_batch_size <= 1
        && policy.merge_queue_flaky_retries > 0
        && is_head(r)
        && !r.queue.dequeued
        && r.work.active.is_none()
        && batch_failure(r).is_none()
        && ci_note(r).is_some()
        && matches!(ci_view(r, policy), CiView::Failing(_));
    let (true, Some(sha), Some(onto)) = (asks, r.head_sha().cloned(), r.queue.updated_onto.clone())
    else {
        return plan;
    };
    let mut p = ready_plan(r, sha, policy, now);
    if p.phase == Phase::Queued && r.queue.frozen.is_none() {
        p.reason = format!(
            "CI failed on top of `{}` at {onto}: the merge queue re-tests it once if the \
             failing checks passed on the tip (a flaky failure wakes nobody)",
            base_branch(r)
        );
    }
    p
}

/// Whether the head may be updated onto the tip once more this turn at the head.
pub(crate) fn may_update(r: &PrRecord, policy: &Policy) -> bool {
    let max = policy.merge_queue_max_updates;
    max == 0 || r.queue.updates < max
}

/// The tip moved again after the turn's last allowed update: the PR goes to the back
/// (its count is pushed past the bound; going to the back resets it).
pub(crate) fn on_base_moved(r: &mut PrRecord, policy: &Policy) {
    if !may_update(r, policy) {
        r.queue.updates = policy.merge_queue_max_updates.saturating_add(1);
    }
}

/// Updated `merge_queue_max_updates` times and the tip moved again.
fn out_of_updates(r: &PrRecord, policy: &Policy) -> bool {
    let max = policy.merge_queue_max_updates;
    max > 0 && r.queue.updates > max
}

/// The priority the PR joins with: `hotfix` while it carries the policy's
/// `merge_queue_hotfix_label`, else its `/shepherd priority`.
fn priority(r: &PrRecord, policy: &Policy) -> Priority {
    let label = &policy.merge_queue_hotfix_label;
    let hotfix = !label.is_empty() && (r.pr.as_ref()).is_some_and(|p| p.labels.contains(label));
    match hotfix {
        true => Priority::Hotfix,
        false => r.queue.priority,
    }
}

/// `/shepherd freeze|unfreeze <branch>` by a user with write access: the queue of
/// that branch is changed by the executor (`QueueFreeze`); the comment says what
/// follows.
pub(crate) fn on_freeze_command(r: &PrRecord, op: FreezeOp, policy: &Policy, fx: &mut Fx) {
    if !policy.merge_queue {
        fx.comment(
            r.number,
            "The merge queue is not enabled for this repository (policy `merge_queue`): \
             there is no queue to freeze."
                .to_owned(),
        );
        return;
    }
    let branch = op.branch.clone();
    let text = match &op.action {
        FreezeAction::Freeze { .. } => {
            let hotfix = match policy.merge_queue_hotfix_label.is_empty() {
                true => String::new(),
                false => format!(
                    "; PRs labelled `{}` still merge",
                    policy.merge_queue_hotfix_label
                ),
            };
            format!(
                "Freezing the merge queue of `{branch}` (by @{}): nothing merges until \
                 `/shepherd unfreeze {branch}`{hotfix}.",
                op.by
            )
        }
        FreezeAction::Unfreeze => format!(
            "Unfreezing the merge queue of `{branch}` (by @{}); a freeze window of the \
             policy still holds while it lasts.",
            op.by
        ),
    };
    fx.push(EffectKind::QueueFreeze(op));
    fx.comment(r.number, text);
}

/// The PR's target branch.
fn base_branch(r: &PrRecord) -> String {
    r.pr.as_ref()
        .map(|p| p.base_ref.clone())
        .unwrap_or_default()
}

/// What the record wants of its queue now.
enum Wish {
    /// Nothing to change.
    Keep,
    /// Join (or re-join) `branch`.
    Join(String),
    /// Stop being tested, keep the ticket.
    Park(Ejection),
    /// Back of the queue.
    Requeue(Ejection),
    /// Leave.
    Leave(Departure),
}

/// The wish from the plan and facts.
fn wish(r: &PrRecord, plan: &Plan, policy: &Policy) -> Wish {
    let member = r.queue.membership.as_ref();
    let Some(pr) = &r.pr else {
        return Wish::Keep;
    };
    let leave = match pr.state {
        PrState::Merged => Some(Departure::Merged),
        PrState::Closed => Some(Departure::Closed),
        PrState::Open if !policy.merge_queue || r.queue.dequeued => Some(Departure::Dequeued),
        PrState::Open if member.is_some_and(|m| m.branch != pr.base_ref) => {
            Some(Departure::Retargeted)
        }
        PrState::Open => None,
    };
    if let Some(reason) = leave {
        return match member {
            Some(_) => Wish::Leave(reason),
            None => Wish::Keep,
        };
    }
    // The head's CI did not settle in time: the next PR is tested.
    if r.queue.ci_timed_out && member.is_some_and(|m| m.parked.is_none()) {
        return Wish::Park(Ejection::CiTimeout);
    }
    if plan.phase == Phase::Queued {
        if out_of_updates(r, policy) {
            return Wish::Requeue(Ejection::BaseMoving);
        }
        let same = member.is_some_and(|m| m.parked.is_none() && m.priority == priority(r, policy));
        return match same {
            true => Wish::Keep,
            false => Wish::Join(pr.base_ref.clone()),
        };
    }
    // An advance in flight (the record shows `merging`) settles first: its outcome
    // decides.
    if member.is_none_or(|m| m.parked.is_some()) || plan.phase == Phase::Merging {
        return Wish::Keep;
    }
    let reason = match plan.phase {
        Phase::CiFix => Ejection::CiFailed,
        Phase::MergeConflicts => Ejection::Conflict,
        Phase::AwaitingReview if plan.reason.contains("approval") => Ejection::Approvals,
        Phase::AwaitingCi
        | Phase::ReviewFeedback
        | Phase::AwaitingReview
        | Phase::ReadyToMerge
        | Phase::Queued
        | Phase::Merging
        | Phase::Merged
        | Phase::Closed
        | Phase::NeedsHuman
        | Phase::Paused
        | Phase::OverBudget => Ejection::NotReady,
    };
    Wish::Park(reason)
}

/// Sends the op that brings the queue to what the record wants (once: the record
/// keeps what it asked for), and keeps the head's CI timer.
pub(crate) fn sync(r: &mut PrRecord, plan: &Plan, now: i64, policy: &Policy, fx: &mut Fx) {
    sync_membership(r, plan, policy, fx);
    if joined(r).is_none() {
        r.queue.ci_timed_out = false;
    }
    track_ci_wait(r, now, policy, fx);
}

/// `merge_queue_ci_timeout_secs` in ms.
fn ci_timeout_ms(policy: &Policy) -> i64 {
    i64::try_from(policy.merge_queue_ci_timeout_secs.saturating_mul(1000)).unwrap_or(i64::MAX)
}

/// While the record is its queue's head and the head's CI has not settled, the
/// `queue-ci` timer runs (armed once per head sha); otherwise nothing is waited for.
fn track_ci_wait(r: &mut PrRecord, now: i64, policy: &Policy, fx: &mut Fx) {
    let waiting = policy.merge_queue
        && is_head(r)
        && matches!(ci_view(r, policy), CiView::Missing | CiView::Pending(_));
    let head = r.head_sha().cloned();
    let (true, Some(head)) = (waiting, head) else {
        r.queue.ci_wait = None;
        return;
    };
    if r.queue
        .ci_wait
        .as_ref()
        .is_some_and(|(sha, _)| *sha == head)
    {
        return;
    }
    r.queue.ci_wait = Some((head, now));
    fx.push(EffectKind::Schedule(Timer {
        due_ms: now.saturating_add(ci_timeout_ms(policy)),
        kind: TimerKind::QueueCi,
        id: "queue-ci".into(),
    }));
}

/// The `queue-ci` timer: the head still waits for CI on the same sha after
/// `merge_queue_ci_timeout_secs` → it parks (`ci-timeout`).
pub(crate) fn on_ci_timer(r: &mut PrRecord, now: i64, policy: &Policy) -> bool {
    let due = match &r.queue.ci_wait {
        Some((sha, since)) if r.head_sha() == Some(sha) && is_head(r) => {
            now >= since.saturating_add(ci_timeout_ms(policy))
        }
        Some(_) | None => false,
    };
    if due && !r.queue.ci_timed_out {
        r.queue.ci_timed_out = true;
        return true;
    }
    false
}

/// The membership part of [`sync`].
fn sync_membership(r: &mut PrRecord, plan: &Plan, policy: &Policy, fx: &mut Fx) {
    let wish = wish(r, plan, policy);
    let branch = r
        .queue
        .membership
        .as_ref()
        .map(|m| m.branch.clone())
        .unwrap_or_default();
    let (branch, action) = match wish {
        Wish::Keep => return,
        Wish::Join(to) => {
            let priority = priority(r, policy);
            r.queue.membership = Some(QueueMembership {
                branch: to.clone(),
                parked: None,
                priority,
            });
            (to, QueueAction::Join { priority })
        }
        Wish::Park(reason) => {
            park(r, reason);
            (branch, QueueAction::Park { reason })
        }
        Wish::Requeue(reason) => {
            park(r, reason);
            r.queue.updates = 0;
            (branch, QueueAction::Requeue { reason })
        }
        Wish::Leave(reason) => {
            r.queue.membership = None;
            r.queue.place = None;
            r.queue.ci_timed_out = false;
            (branch, QueueAction::Leave { reason })
        }
    };
    // The version this step commits: ops of later steps are newer. Until the queue
    // answers this op, the record does not know its place.
    r.queue.sent_version = r.version + 1;
    r.queue.place = None;
    fx.push(EffectKind::Queue(QueueOp {
        branch,
        number: r.number,
        version: r.version + 1,
        action,
    }));
}

/// Parks the membership; the record is no longer the head (a later place says where
/// it stands when it joins again).
fn park(r: &mut PrRecord, reason: Ejection) {
    if let Some(m) = &mut r.queue.membership {
        m.parked = Some(reason);
    }
    r.queue.place = None;
    r.queue.updates = 0;
    r.queue.ci_timed_out = false;
    r.queue.ci_wait = None;
    r.queue.frozen = None;
}

/// The queue says where the PR stands. Notices can arrive out of order and be
/// repeated: a place that does not reflect the record's latest op, or that is older
/// than the place known, is ignored.
pub(crate) fn on_place(r: &mut PrRecord, place: &Place) -> bool {
    if joined(r).is_none_or(|m| m.branch != place.branch) {
        return false;
    }
    let known = r.queue.place.as_ref();
    if place.op_version < r.queue.sent_version
        || known.is_some_and(|p| p.version > place.version || p == place)
    {
        return false;
    }
    if let Some((_, at)) = &mut r.queue.frozen {
        // The queue spoke (an unfreeze tells the head): ask again now.
        *at = 0;
    }
    if !place.head && r.queue.place.as_ref().is_some_and(|p| p.head) {
        // No longer the head (the queue dropped it): stop advancing.
        r.queue.updates = 0;
    }
    r.queue.place = Some(place.clone());
    true
}

/// The head `from` was updated onto `onto`: wait for the new head and its CI. The
/// new head's `pull_request_sync` may come before or after this outcome.
pub(crate) fn on_updated(r: &mut PrRecord, onto: &Sha, from: &Sha) {
    r.merge = MergeState::Idle;
    match r.head_sha() {
        Some(h) if h == from => r.queue.updated_from = Some(from.clone()),
        // The new head is here already.
        Some(h) => r.queue.updated_head = Some(h.clone()),
        None => {}
    }
    r.queue.updated_onto = Some(onto.clone());
    r.queue.updates = r.queue.updates.saturating_add(1);
}

/// A new head arrived: the one the queue's update produced, or someone's push.
pub(crate) fn on_new_head(r: &mut PrRecord) {
    match r.queue.updated_from.take() {
        Some(_) => r.queue.updated_head = r.head_sha().cloned(),
        None => {
            r.queue.updated_head = None;
            r.queue.updated_onto = None;
        }
    }
}

/// The batched queue ejected the PR's head (issue 29): the record keeps why, for that
/// head only (a new head is a new candidate).
pub(crate) fn on_ejected(r: &mut PrRecord, f: &BatchFailure) -> bool {
    if r.head_sha() != Some(&f.head) || r.queue.batch_failure.as_ref() == Some(f) {
        return false;
    }
    r.queue.batch_failure = Some(f.clone());
    true
}

/// The batched queue's ejection of the current head, if any.
pub(crate) fn batch_failure(r: &PrRecord) -> Option<&BatchFailure> {
    r.queue
        .batch_failure
        .as_ref()
        .filter(|f| r.head_sha() == Some(&f.head))
}

/// `/shepherd queue|priority|dequeue`.
pub(crate) fn on_command(
    r: &mut PrRecord,
    command: super::commands::QueueCommand,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) {
    use super::commands::QueueCommand;
    match command {
        QueueCommand::Enter => {
            r.queue.dequeued = false;
            let report = report(r, policy, now);
            fx.comment(r.number, report);
        }
        QueueCommand::Priority(level) => r.queue.priority = level,
        QueueCommand::Dequeue => r.queue.dequeued = true,
    }
}

/// The answer to `/shepherd queue`: where the PR stands in its merge queue and why.
fn report(r: &PrRecord, policy: &Policy, now: i64) -> String {
    let branch = base_branch(r);
    if !policy.merge_queue {
        return "The merge queue is not enabled for this repository (policy `merge_queue`): \
                the PR merges as soon as it is ready."
            .to_owned();
    }
    let p = super::plan_of(r, policy, now);
    let place = match (&r.queue.membership, &r.queue.place) {
        (Some(m), _) if m.parked.is_some() => format!(
            "parked in the merge queue of `{branch}` ({}); it re-enters at its position when ready",
            m.parked.map(|e| e.as_str()).unwrap_or_default()
        ),
        (Some(_), Some(place)) if place.head => {
            format!("head of the merge queue of `{branch}` (being tested)")
        }
        (Some(_), Some(_)) | (Some(_), None) => position_text(r, &branch),
        (None, _) => format!("not in the merge queue of `{branch}`"),
    };
    format!(
        "Merge queue: {place}, priority {}.\n\nPhase `{}`: {}",
        priority(r, policy).as_str(),
        p.phase.as_str(),
        p.reason
    )
}
