//! Events → facts. Each fact keeps the time it was observed and an older observation
//! never overwrites a newer one: PR snapshots are ordered by Forgejo's `updated_at`,
//! CI contexts by their own `updated_at`, review lists by the time they were read.
//!
//! `apply` returns `false` for an event that does not concern the record (another PR,
//! a push to another branch, CI news about a sha that is not the head): the step is a
//! no-op then.

use std::collections::BTreeMap;

use super::super::effect::{EffectKind, EffectKindName, ObserveWhat, Timer, TimerKind};
use super::super::event::{
    CiContext, EffectOutcome, Event, MergeOutcome, PrAction, PrSnapshot, PrState, ReviewFact,
    ReviewState,
};
use super::super::ids::{Login, RepoName, Scope, Sha};
use super::super::policy::Policy;
use super::super::record::{
    AgentsOn, ApprovalHint, AttemptOutcome, ConflictFact, Hold, MergeState, PrRecord, ReviewFacts,
    ShaCi,
};
use super::{Fx, commands, work};

/// How many commits' CI contexts a record keeps besides the head's.
const CI_SHAS_KEPT: usize = 3;
/// After this long without the reviews read, a merge verification starts over (ms).
pub(crate) const VERIFY_TIMEOUT_MS: i64 = 60_000;
/// After this long without the outcome of a `Merge` effect, the record stops waiting
/// for it (ms): an effect that fails reports its outcome within the executor's retry
/// budget (10 min), but one dead-lettered as poison never does. Well past that budget,
/// so a slow merge is never doubled by a second one.
pub(crate) const MERGE_TIMEOUT_MS: i64 = 30 * 60_000;
/// How long a record given up on a lost merge waits, after asking for the PR again,
/// before it may merge again (ms): the read shows a merge that did happen first.
pub(crate) const LOST_MERGE_BACKOFF_MS: i64 = 60_000;

/// Folds `event` into the record's facts; returns whether it concerns this record.
pub(crate) fn apply(
    r: &mut PrRecord,
    event: &Event,
    now: i64,
    policy: &Policy,
    from_bot: bool,
    fx: &mut Fx,
) -> bool {
    let human = !from_bot;
    match event {
        Event::PullRequest {
            action, pr, sender, ..
        } => {
            // New code is activity whoever pushed it (agents push as the bot); the
            // bot's label and comment echoes are not.
            let code = matches!(
                action,
                PrAction::Opened | PrAction::Reopened | PrAction::Synchronized
            );
            // The sender of a new head's event pushed it.
            let pusher = sender.as_ref().filter(|_| code);
            pr_webhook(r, pr, now, policy, human, code, pusher, fx)
        }
        Event::Review { hint, pr, sender } => {
            let mine = pr_webhook(r, pr, now, policy, human, false, None, fx);
            if mine {
                match super::review::approval_hint(r, *hint, sender.as_ref(), policy) {
                    Some(reviewer) => {
                        r.approval_hints
                            .insert(reviewer, ApprovalHint { at_ms: now });
                    }
                    None => fx.push(EffectKind::Observe(ObserveWhat::Reviews)),
                }
            }
            mine
        }
        Event::Comment { .. } => comment(r, event, now, policy, human, fx),
        Event::Issue { .. } => false,
        Event::ActionRun { .. } | Event::Status { .. } | Event::Push { .. } => {
            repo_event(r, event, now, policy, fx)
        }
        Event::TimerFired {
            repo,
            scope,
            number,
            timer,
        } => {
            *scope == Scope::Pr && is_this(r, repo, *number) && on_timer(r, timer, now, policy, fx)
        }
        Event::ObservedPr { pr } => observed(r, pr, None, now, policy, fx),
        Event::ObservedReviews {
            repo,
            number,
            reviews,
            at_ms,
        } => {
            is_this(r, repo, *number) && {
                apply_reviews(r, reviews, *at_ms);
                true
            }
        }
        Event::ObservedStatus {
            repo,
            number,
            sha,
            contexts,
            at_ms,
        } => {
            is_this(r, repo, *number) && {
                apply_ci(r, sha, contexts, *at_ms);
                true
            }
        }
        Event::ObservedPermission { .. } => permission(r, event, now, policy, fx),
        // `core::legacy` folds it (`machine::step`).
        Event::ObservedLegacy { .. } => false,
        // An issue's dependencies concern its issue record only.
        Event::ObservedDependencies { .. } => false,
        Event::WorkResult {
            work_id,
            outcome,
            signature,
            summary,
            usage,
            stopped,
        } => {
            let mine = work_id.subject() == Some((r.repo.clone(), Scope::Pr, r.number));
            let (sig, sum) = (signature.as_ref(), summary.as_ref());
            if mine {
                let (o, s, u) = (*outcome, *stopped, usage.as_ref());
                let w = &mut r.work;
                if super::transient::on_result(w, work_id, o, s, sum, u, now, policy, fx) {
                    return true;
                }
            }
            let scope = super::budget::active_scope(&r.work, work_id);
            let recorded =
                mine && work::on_result(&mut r.work, work_id, *outcome, sig, sum, now, fx);
            if recorded {
                let (u, s) = (usage.as_ref(), *stopped);
                super::budget::on_result(&mut r.work, work_id, u, s, scope.as_deref(), now, fx);
                // A success whose push is still to come waits `push_grace_secs` at most.
                let waits = r.is_open() && work::head_unmoved(&r.work, work_id, r.head_sha());
                if *outcome == super::super::event::WorkOutcome::Succeeded {
                    work::arm_push_grace(&r.work, work_id, waits, now, policy, fx);
                }
            }
            recorded
        }
        Event::EffectOutcome {
            repo,
            scope,
            number,
            outcome,
            ..
        } => {
            *scope == Scope::Pr
                && is_this(r, repo, *number)
                && on_outcome(r, outcome, now, policy, fx)
        }
        Event::ResyncObserved {
            pr,
            contexts,
            reviews,
            at_ms,
        } => observed(r, pr, Some((contexts, reviews, *at_ms)), now, policy, fx),
    }
}

/// A PR or review webhook: its snapshot, and activity (any human event; new code
/// (`code`: opened, reopened, synchronized) from anyone). `pusher`: who pushed the
/// snapshot's head, when the event says.
#[expect(clippy::too_many_arguments, reason = "the event's parts, read once")]
fn pr_webhook(
    r: &mut PrRecord,
    pr: &PrSnapshot,
    now: i64,
    policy: &Policy,
    human: bool,
    code: bool,
    pusher: Option<&Login>,
    fx: &mut Fx,
) -> bool {
    if !is_this(r, &pr.repo, pr.number) {
        return false;
    }
    apply_snapshot(r, pr, now, policy, human, code, pusher, fx);
    if human || code {
        touch(r, or_now(pr.updated_ms, now), policy, fx);
    }
    true
}

/// A PR conversation comment: activity and commands (humans only).
fn comment(
    r: &mut PrRecord,
    event: &Event,
    now: i64,
    policy: &Policy,
    human: bool,
    fx: &mut Fx,
) -> bool {
    let Event::Comment {
        repo,
        number,
        is_pull,
        comment_id,
        commands,
        at_ms,
        sender,
    } = event
    else {
        return false;
    };
    if !*is_pull || !is_this(r, repo, *number) {
        return false;
    }
    if human {
        touch(r, or_now(*at_ms, now), policy, fx);
        let ctx = commands::CommandCtx { number: r.number };
        let sender = sender.as_ref();
        let status = commands::on_comment(
            &mut r.work,
            &ctx,
            *comment_id,
            commands,
            sender,
            now,
            policy,
            fx,
        );
        after_commands(r, status, now, policy, fx);
    }
    true
}

/// Repository-wide events: they concern this PR only when they name its head or base.
fn repo_event(r: &mut PrRecord, event: &Event, now: i64, policy: &Policy, fx: &mut Fx) -> bool {
    let head = r.head_sha().cloned();
    let open = r.is_open();
    match event {
        Event::ActionRun {
            repo,
            sha,
            pr_number,
            ..
        } => {
            let for_us = *repo == r.repo && pr_number.is_none_or(|n| n == r.number);
            if !for_us || !open || head.as_ref() != Some(sha) {
                return false;
            }
            // The event triggers the read; the backoff reads of this head stop.
            if let Some(poll) = r.ci_poll.as_mut().filter(|p| p.sha == *sha) {
                poll.events = true;
            }
            fx.push(EffectKind::Observe(ObserveWhat::CombinedStatus {
                sha: sha.clone(),
            }));
            true
        }
        Event::Status {
            repo, sha, context, ..
        } => {
            if *repo != r.repo || !open || head.as_ref() != Some(sha) {
                return false;
            }
            apply_ci(r, sha, std::slice::from_ref(context), 0);
            true
        }
        Event::Push { repo, branch, .. } => {
            let on_base = r.pr.as_ref().is_some_and(|p| p.base_ref == *branch);
            if *repo != r.repo || !open || !on_base {
                return false;
            }
            schedule_mergeability(now, policy, fx);
            true
        }
        Event::PullRequest { .. }
        | Event::Review { .. }
        | Event::Comment { .. }
        | Event::Issue { .. }
        | Event::TimerFired { .. }
        | Event::ObservedPr { .. }
        | Event::ObservedReviews { .. }
        | Event::ObservedStatus { .. }
        | Event::ObservedPermission { .. }
        | Event::ObservedLegacy { .. }
        | Event::ObservedDependencies { .. }
        | Event::WorkResult { .. }
        | Event::EffectOutcome { .. }
        | Event::ResyncObserved { .. } => false,
    }
}

/// An API read of the PR, with its head's CI and its reviews for a resync.
fn observed(
    r: &mut PrRecord,
    pr: &PrSnapshot,
    resync: Option<(&Vec<CiContext>, &Vec<ReviewFact>, i64)>,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) -> bool {
    if !is_this(r, &pr.repo, pr.number) {
        return false;
    }
    apply_snapshot(r, pr, now, policy, true, true, None, fx);
    first_sight(r, pr, now, policy, fx);
    if let Some((contexts, reviews, at_ms)) = resync {
        if let Some(head) = &pr.head_sha {
            apply_ci(r, head, contexts, at_ms);
        }
        apply_reviews(r, reviews, at_ms);
    }
    true
}

/// A commenter's permission: run or refuse their waiting commands.
fn permission(r: &mut PrRecord, event: &Event, now: i64, policy: &Policy, fx: &mut Fx) -> bool {
    let Event::ObservedPermission {
        repo,
        scope,
        number,
        login,
        permission,
        at_ms,
    } = event
    else {
        return false;
    };
    if *scope != Scope::Pr || !is_this(r, repo, *number) {
        return false;
    }
    let ctx = commands::CommandCtx { number: r.number };
    let status = commands::on_permission(
        &mut r.work,
        &ctx,
        login,
        *permission,
        *at_ms,
        now,
        policy,
        fx,
    );
    after_commands(r, status, now, policy, fx);
    true
}

/// What executed commands ask of the PR record beyond its work state.
fn after_commands(
    r: &mut PrRecord,
    status: commands::CommandEffects,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) {
    if status.refresh_status {
        r.status_comment = None;
    }
    if let Some(c) = status.queue {
        super::queue::on_command(r, c, now, policy, fx);
    }
    if let Some(op) = status.freeze {
        super::queue::on_freeze_command(r, op, policy, fx);
    }
    if status.retry && matches!(r.merge, MergeState::Backoff { .. }) {
        r.merge = MergeState::Idle;
    }
    // The first grant stands (who let the agents in first); a later one changes nothing.
    if let Some(by) = status.agents_on
        && r.agents_on.is_none()
    {
        r.agents_on = Some(AgentsOn { by, at_ms: now });
    }
    if let Some(by) = status.agents_on_refused {
        r.agents_on_refused = Some(AgentsOn { by, at_ms: now });
    }
}

/// Whether the event names this record.
fn is_this(r: &PrRecord, repo: &RepoName, number: u64) -> bool {
    r.repo == *repo && r.number == number
}

/// `t`, or `now` when the event carried no time.
fn or_now(t: i64, now: i64) -> i64 {
    if t > 0 { t } else { now }
}

/// Human activity at `t`: moves the stale-check timer.
fn touch(r: &mut PrRecord, t: i64, policy: &Policy, fx: &mut Fx) {
    if t <= r.last_activity_ms || !r.is_open() {
        return;
    }
    r.last_activity_ms = t;
    let stale_ms = i64::try_from(policy.stale_after_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    fx.push(EffectKind::Schedule(Timer {
        due_ms: t.saturating_add(stale_ms),
        kind: TimerKind::StaleCheck,
        id: "stale".into(),
    }));
}

/// A record first seen through an API read (resync) starts its activity clock at the
/// PR's last change.
fn first_sight(r: &mut PrRecord, pr: &PrSnapshot, now: i64, policy: &Policy, fx: &mut Fx) {
    if r.last_activity_ms == 0 {
        touch(r, or_now(pr.updated_ms, now), policy, fx);
    }
}

/// Re-read the PR after Forgejo's asynchronous conflict check had time to run.
fn schedule_mergeability(now: i64, policy: &Policy, fx: &mut Fx) {
    let delay = i64::try_from(policy.mergeability_delay_secs.saturating_mul(1000)).unwrap_or(0);
    fx.push(EffectKind::Schedule(Timer {
        due_ms: now.saturating_add(delay),
        kind: TimerKind::Mergeability,
        id: "mergeability".into(),
    }));
}

/// Schedules the record's one merge timer (`merge-retry`): back-off over, verification
/// lost, or a merge whose outcome never came. A new schedule replaces the last.
pub(crate) fn schedule_merge_retry(due_ms: i64, fx: &mut Fx) {
    fx.push(EffectKind::Schedule(Timer {
        due_ms,
        kind: TimerKind::MergeRetry,
        id: "merge-retry".into(),
    }));
}

/// No merge before `not_before_ms`; the timer then lets the record try again.
fn back_off_merge(r: &mut PrRecord, not_before_ms: i64, fx: &mut Fx) {
    r.merge = MergeState::Backoff {
        not_before_ms,
        lease_wait: false,
    };
    schedule_merge_retry(not_before_ms, fx);
}

/// The merge lease was busy: try again when its holder releases it (the releaser wakes
/// the timer early) or, should the holder have died, at `fallback_ms`.
fn wait_for_lease(r: &mut PrRecord, fallback_ms: i64, fx: &mut Fx) {
    r.merge = MergeState::Backoff {
        not_before_ms: fallback_ms,
        lease_wait: true,
    };
    schedule_merge_retry(fallback_ms, fx);
}

/// A PR snapshot, unless an equally new or newer one is already known. `pusher`: who
/// pushed its head, when the event says (an API read does not).
#[expect(clippy::too_many_arguments, reason = "the event's parts, read once")]
pub(crate) fn apply_snapshot(
    r: &mut PrRecord,
    snap: &PrSnapshot,
    now: i64,
    policy: &Policy,
    human: bool,
    head_source: bool,
    pusher: Option<&Login>,
    fx: &mut Fx,
) {
    // Forgejo's `updated_at` has second resolution: at a tie, only a source that
    // speaks for the head (a sync, an opened/reopened payload, an API read) may change
    // it; an equally old label or edit payload may predate the push.
    // A merged PR is final (Forgejo cannot reopen it): a snapshot that says otherwise
    // was taken before the merge, e.g. a label payload of the same second.
    let older = r.pr.as_ref().is_some_and(|cur| {
        snap.updated_ms < cur.updated_ms
            || (snap.updated_ms == cur.updated_ms && !head_source && snap.head_sha != cur.head_sha)
            || (cur.state == crate::core::observation::PrState::Merged
                && snap.state != crate::core::observation::PrState::Merged)
    });
    if older {
        return;
    }
    let head_changed =
        r.pr.as_ref()
            .is_some_and(|cur| cur.head_sha != snap.head_sha);
    r.pr = Some(snap.clone());
    if head_changed {
        on_new_head(r, now, policy, human, pusher, fx);
    }
    let delay = i64::try_from(policy.mergeability_delay_secs.saturating_mul(1000)).unwrap_or(0);
    r.conflict = match (snap.mergeable, snap.draft, r.conflict) {
        (None, _, c) => c,
        (Some(true), _, _) => ConflictFact::Clean,
        // WIP PRs always read as not mergeable.
        (Some(false), true, c) => c,
        (Some(false), false, ConflictFact::Conflicting) => ConflictFact::Conflicting,
        (Some(false), false, ConflictFact::Suspected { since_ms }) if now - since_ms >= delay => {
            ConflictFact::Conflicting
        }
        (Some(false), false, c @ ConflictFact::Suspected { .. }) => c,
        (Some(false), false, ConflictFact::Clean | ConflictFact::Unknown) => {
            schedule_mergeability(now, policy, fx);
            ConflictFact::Suspected { since_ms: now }
        }
    };
    work::observe_hold_label(&mut r.work, &snap.labels, policy, human);
}

/// A new head commit: CI, conflicts and the claim start over.
fn on_new_head(
    r: &mut PrRecord,
    now: i64,
    policy: &Policy,
    human: bool,
    pusher: Option<&Login>,
    fx: &mut Fx,
) {
    r.conflict = ConflictFact::Unknown;
    r.ci_poll = None;
    r.merge = match &r.merge {
        MergeState::InFlight { sha, since_ms } => MergeState::InFlight {
            sha: sha.clone(),
            since_ms: *since_ms,
        },
        MergeState::Idle | MergeState::Verifying { .. } | MergeState::Backoff { .. } => {
            MergeState::Idle
        }
    };
    // Approvals announced for the old head and taken on trust may be stale or dismissed
    // now: read what Forgejo says of them. They keep counting until that read comes
    // back (it drops them), so a PR in the merge queue does not leave its place in the
    // gap; the executor's re-check reads the reviews before any merge anyway.
    if !r.approval_hints.is_empty() {
        fx.push(EffectKind::Observe(ObserveWhat::Reviews));
    }
    // The agents push as the bot: their own push ends the claim without a cancel.
    work::end_active(&mut r.work, AttemptOutcome::Superseded, now, human, fx);
    if human && matches!(r.work.hold, Some(Hold::NeedsHuman { .. })) {
        push_resumes(r, pusher, now, policy, fx);
    }
    schedule_mergeability(now, policy, fx);
    super::queue::on_new_head(r);
    let head = r.head_sha().cloned();
    prune_ci(&mut r.ci, head.as_ref());
}

/// A human's push while the PR needs a human: it ends the hold only when the pusher
/// has write access (a trusted user, or a permission read said so). Unknown: the
/// permission is read and the hold ends when it says write access. A pusher without
/// write access, an agent user, or a push whose pusher is not known (an API read)
/// leaves the hold: anyone's push must not buy more attempts.
fn push_resumes(r: &mut PrRecord, pusher: Option<&Login>, now: i64, policy: &Policy, fx: &mut Fx) {
    let Some(login) = pusher.filter(|l| !policy.is_bot_or_agent(l)) else {
        return;
    };
    match commands::writer(&r.work, login, policy, now) {
        Some(true) => {
            work::resume(&mut r.work);
        }
        Some(false) => r.work.resume_by_push = None,
        None => {
            r.work.resume_by_push = Some(login.clone());
            fx.push(EffectKind::Observe(ObserveWhat::Permission {
                login: login.clone(),
            }));
        }
    }
}

/// Merges CI contexts of `sha` (per context, the newer `updated_at` wins).
pub(crate) fn apply_ci(r: &mut PrRecord, sha: &Sha, contexts: &[CiContext], at_ms: i64) {
    let entry = r.ci.entry(sha.clone()).or_default();
    for c in contexts {
        let newer = entry
            .contexts
            .get(&c.context)
            .is_none_or(|old| c.updated_ms >= old.updated_ms);
        if newer {
            entry.contexts.insert(c.context.clone(), c.clone());
        }
    }
    entry.observed_ms = entry.observed_ms.max(at_ms);
    let head = r.head_sha().cloned();
    prune_ci(&mut r.ci, head.as_ref());
}

/// Keeps the head's CI and the most recently observed few others.
fn prune_ci(ci: &mut BTreeMap<Sha, ShaCi>, head: Option<&Sha>) {
    while ci.len() > CI_SHAS_KEPT + 1 {
        let oldest = ci
            .iter()
            .filter(|(sha, _)| Some(*sha) != head)
            .min_by_key(|(sha, c)| (c.observed_ms, (*sha).clone()))
            .map(|(sha, _)| sha.clone());
        match oldest {
            Some(sha) => ci.remove(&sha),
            None => break,
        };
    }
}

/// A full reviews read, unless a later read is already known.
pub(crate) fn apply_reviews(r: &mut PrRecord, reviews: &[ReviewFact], at_ms: i64) {
    if r.reviews.as_ref().is_some_and(|cur| at_ms < cur.at_ms) {
        return;
    }
    let mut latest: BTreeMap<Login, ReviewFact> = BTreeMap::new();
    for review in reviews {
        let stance = match review.state {
            ReviewState::Approved | ReviewState::RequestChanges => true,
            ReviewState::Comment
            | ReviewState::Pending
            | ReviewState::RequestReview
            | ReviewState::Unknown => false,
        };
        if !stance {
            continue;
        }
        let newer = latest
            .get(&review.reviewer)
            .is_none_or(|cur| (review.submitted_ms, review.id) > (cur.submitted_ms, cur.id));
        if newer {
            latest.insert(review.reviewer.clone(), review.clone());
        }
    }
    r.reviews = Some(ReviewFacts { at_ms, latest });
    // The read shows every approval announced before it.
    r.approval_hints.retain(|_, hint| hint.at_ms > at_ms);
}

/// The delay before CI poll number `n` (0-based): initial × 2^n, capped.
pub(crate) fn ci_poll_delay_ms(n: u32, policy: &Policy) -> i64 {
    let initial = policy.ci_poll_initial_secs.saturating_mul(1000);
    let max = policy.ci_poll_max_secs.saturating_mul(1000);
    let delay = initial.saturating_mul(1u64 << n.min(20)).min(max);
    i64::try_from(delay).unwrap_or(i64::MAX)
}

/// A timer came due.
fn on_timer(r: &mut PrRecord, timer: &Timer, now: i64, policy: &Policy, fx: &mut Fx) -> bool {
    match &timer.kind {
        TimerKind::CiPoll { sha } => {
            let current = r.ci_poll.as_ref().is_some_and(|p| {
                p.sha == *sha && p.due_ms == timer.due_ms && r.head_sha() == Some(sha)
            });
            if !current || !r.is_open() {
                return false;
            }
            // Actions events arrive for this head: they trigger the reads now.
            if r.ci_poll.as_ref().is_some_and(|p| p.events) {
                return false;
            }
            fx.push(EffectKind::Observe(ObserveWhat::CombinedStatus {
                sha: sha.clone(),
            }));
            if let Some(poll) = &mut r.ci_poll {
                poll.n += 1;
                poll.due_ms = now.saturating_add(ci_poll_delay_ms(poll.n, policy));
                fx.push(EffectKind::Schedule(Timer {
                    due_ms: poll.due_ms,
                    kind: TimerKind::CiPoll { sha: sha.clone() },
                    id: "ci-poll".into(),
                }));
            }
            true
        }
        TimerKind::Mergeability => {
            if r.is_open() {
                fx.push(EffectKind::Observe(ObserveWhat::Pr));
            }
            r.is_open()
        }
        TimerKind::ClaimExpiry { work_id } => work::on_expiry(&mut r.work, work_id, now, fx),
        TimerKind::MergeRetry => match &r.merge {
            // A lease wait ends whenever its timer fires: early means woken by the
            // lease's releaser.
            MergeState::Backoff {
                not_before_ms,
                lease_wait,
            } if *lease_wait || now >= *not_before_ms => {
                r.merge = MergeState::Idle;
                true
            }
            MergeState::Verifying { since_ms, .. } if now - since_ms >= VERIFY_TIMEOUT_MS => {
                r.merge = MergeState::Idle;
                true
            }
            // The merge's outcome never came (its effect was dead-lettered): read the PR
            // (it may be merged after all) and back off before any second merge.
            MergeState::InFlight { since_ms, .. } if now - since_ms >= MERGE_TIMEOUT_MS => {
                fx.push(EffectKind::Observe(ObserveWhat::Pr));
                back_off_merge(r, now.saturating_add(LOST_MERGE_BACKOFF_MS), fx);
                true
            }
            // A head held by a freeze asks again (`queue::ready_plan`).
            MergeState::Idle => r.queue.frozen.is_some(),
            MergeState::Backoff { .. }
            | MergeState::Verifying { .. }
            | MergeState::InFlight { .. } => false,
        },
        TimerKind::StaleCheck => r.is_open(),
        TimerKind::QueueCi => super::queue::on_ci_timer(r, now, policy),
        TimerKind::BudgetReset => super::budget::on_reset_timer(&mut r.work, now),
        TimerKind::TransientRetry => super::transient::on_timer(&mut r.work, now),
        TimerKind::PushGrace { work_id } => {
            let waits = r.is_open() && work::head_unmoved(&r.work, work_id, r.head_sha());
            work::on_push_grace(&mut r.work, work_id, waits, policy)
        }
        // `core::legacy` handles it (`machine::step`).
        TimerKind::Legacy => false,
        TimerKind::DependencyRecheck => false,
        TimerKind::StatusSettle => match r.status_pending_since_ms {
            // Due: the step's reconcile writes the waiting status.
            Some(since) if now >= since.saturating_add(super::reconcile::settle_ms(policy)) => true,
            // Not yet (the setting grew since the timer was set): wait again.
            Some(since) => {
                super::reconcile::schedule_status_settle(
                    since.saturating_add(super::reconcile::settle_ms(policy)),
                    fx,
                );
                true
            }
            None => false,
        },
    }
}

/// An effect's outcome.
fn on_outcome(
    r: &mut PrRecord,
    outcome: &EffectOutcome,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) -> bool {
    let in_flight = matches!(r.merge, MergeState::InFlight { .. });
    if let EffectOutcome::Merge(m) = outcome
        && in_flight
        && !matches!(m, MergeOutcome::Frozen { .. })
    {
        r.queue.frozen = None;
    }
    match outcome {
        EffectOutcome::Merge(MergeOutcome::Merged) => {
            if let Some(pr) = &mut r.pr {
                pr.state = PrState::Merged;
            }
            r.merge = MergeState::Idle;
            true
        }
        EffectOutcome::Queue(place) => super::queue::on_place(r, place),
        EffectOutcome::QueueEjected(failure) => super::queue::on_ejected(r, failure),
        // A late or duplicated outcome of a merge that is no longer in flight.
        EffectOutcome::Merge(m) if !in_flight && *m != MergeOutcome::Merged => false,
        EffectOutcome::Merge(MergeOutcome::Conflict) => {
            r.conflict = ConflictFact::Conflicting;
            r.merge = MergeState::Idle;
            true
        }
        EffectOutcome::Merge(MergeOutcome::HeadMoved) => {
            // Read the PR, and do not try the head the record still holds before the
            // read is in: a new head resets the back-off (`on_new_head`).
            fx.push(EffectKind::Observe(ObserveWhat::Pr));
            let delay = i64::try_from(policy.merge_retry_secs.saturating_mul(1000)).unwrap_or(0);
            back_off_merge(r, now.saturating_add(delay), fx);
            true
        }
        EffectOutcome::Merge(MergeOutcome::LockBusy { retry_ms }) => {
            let delay = i64::try_from(*retry_ms).unwrap_or(i64::MAX);
            wait_for_lease(r, now.saturating_add(delay), fx);
            true
        }
        EffectOutcome::Merge(MergeOutcome::Frozen { note, retry_ms }) => {
            // Held by a freeze: asks again at its end (or when the queue tells it its
            // place again, as an unfreeze does). Not a merge blocker: the PR stays
            // queued at the head.
            r.merge = MergeState::Idle;
            let at = now.saturating_add(i64::try_from(*retry_ms).unwrap_or(i64::MAX));
            r.queue.frozen = Some((note.clone(), at));
            schedule_merge_retry(at, fx);
            true
        }
        EffectOutcome::Merge(MergeOutcome::TryAgain) => {
            let delay = i64::try_from(policy.merge_retry_secs.saturating_mul(1000)).unwrap_or(0);
            back_off_merge(r, now.saturating_add(delay), fx);
            true
        }
        EffectOutcome::Merge(MergeOutcome::Updated { onto, from }) => {
            super::queue::on_updated(r, onto, from);
            true
        }
        EffectOutcome::Merge(MergeOutcome::BaseMoved) => {
            // The tip moved under the merge: the next advance updates again, unless
            // the turn's updates ran out (then the PR goes to the back).
            r.merge = MergeState::Idle;
            super::queue::on_base_moved(r, policy);
            true
        }
        EffectOutcome::Merge(MergeOutcome::FailedPermanent { message }) => {
            r.merge = MergeState::Idle;
            let reason = format!("Merging failed: {message}");
            work::enter_needs_human(&mut r.work, &reason, r.number, now, policy, fx);
            true
        }
        EffectOutcome::OverBudget { work_id, stop } => {
            super::budget::on_dispatch_held(&mut r.work, work_id, stop, now, fx)
        }
        EffectOutcome::Failed { kind, work_id, .. } => match kind {
            EffectKindName::Dispatch => {
                let active = r.work.active.as_ref().map(|a| &a.item.id);
                if work_id.is_some() && active == work_id.as_ref() {
                    work::end_active(&mut r.work, AttemptOutcome::DispatchFailed, now, false, fx);
                    true
                } else {
                    false
                }
            }
            EffectKindName::CancelWork
            | EffectKindName::AddLabels
            | EffectKindName::RemoveLabels
            | EffectKindName::UpsertComment
            | EffectKindName::Comment
            | EffectKindName::Merge
            | EffectKindName::Queue
            | EffectKindName::QueueAdvance
            | EffectKindName::QueueFreeze
            | EffectKindName::Observe
            | EffectKindName::Schedule => false,
        },
    }
}
