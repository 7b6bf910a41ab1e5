//! `step_issue`: `issue-impl` for open issues carrying the trigger label (default
//! `auto/implement`). One work item at a time with the same claim, escalation and
//! stuck rules as PRs; cancelled when the issue closes; done when a PR that links the
//! issue (`Closes #N`) is merged — the worker delivers such PR events to the issue
//! record. An open linking PR only holds the issue (no new dispatch; the agent's own PR
//! ends its claim); closed unmerged, it releases the issue again. A blocked issue
//! (a label of `blocked_labels`, an open dependency) is not dispatched until unblocked,
//! and every dispatch is preceded by a read of its dependencies ([`super::issue_deps`]).

use serde::{Deserialize, Serialize};

use super::super::effect::{Effect, TimerKind, WorkContext, WorkKind};
use super::super::event::{EffectOutcome, Event, PrState, WorkOutcome};
use super::super::ids::Scope;
use super::super::policy::Policy;
use super::super::record::{AttemptOutcome, Hold, IssueRecord, LINKING_PRS_KEPT, linked_issues};
use super::issue_deps::{self, Verdict};
use super::{Fx, budget, commands, transient, work};

/// Where an issue stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IssuePhase {
    /// Not asking for implementation (no trigger label, or not read yet).
    Idle,
    /// An `issue-impl` is wanted or running.
    Implementing,
    /// The agent reported success; waiting for its PR to open.
    AwaitingPr,
    /// A PR linking the issue is open; waiting for it to be merged.
    AwaitingMerge,
    /// A PR linking the issue was merged.
    Done,
    /// Closed.
    Closed,
    /// Stuck: a human must act.
    NeedsHuman,
    /// Paused by a command.
    Paused,
    /// Implementation is wanted, but a spend cap is reached (issue 28).
    OverBudget,
    /// Implementation is wanted, but a blocking label or an open dependency holds it.
    Blocked,
}

impl IssuePhase {
    /// The phase's name.
    pub fn as_str(self) -> &'static str {
        match self {
            IssuePhase::Idle => "idle",
            IssuePhase::Implementing => "implementing",
            IssuePhase::AwaitingPr => "awaiting-pr",
            IssuePhase::AwaitingMerge => "awaiting-merge",
            IssuePhase::Done => "done",
            IssuePhase::Closed => "closed",
            IssuePhase::NeedsHuman => "needs-human",
            IssuePhase::Paused => "paused",
            IssuePhase::OverBudget => "over-budget",
            IssuePhase::Blocked => "blocked",
        }
    }
}

/// Where an issue stands and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssueDecision {
    /// The phase.
    pub phase: IssuePhase,
    /// Why.
    pub reason: String,
}

/// The result of one issue step (same contract as [`super::Transition`]).
#[derive(Debug, Clone, PartialEq)]
pub struct IssueTransition {
    /// The new record (version = old + 1 unless nothing changed).
    pub record: IssueRecord,
    /// Effects to commit with it.
    pub effects: Vec<Effect>,
    /// One line for the history.
    pub note: String,
}

impl IssueTransition {
    /// True when nothing changed and nothing needs committing.
    pub fn is_noop(&self) -> bool {
        self.effects.is_empty() && self.note.starts_with(super::NOOP_NOTE)
    }
}

/// The signature of `issue-impl` attempts (one problem: the issue itself).
const ISSUE_SIGNATURE: &str = "issue-impl";

/// What an issue wants now.
pub fn decide_issue(r: &IssueRecord, policy: &Policy) -> IssueDecision {
    let (phase, reason, _) = plan(r, policy);
    IssueDecision { phase, reason }
}

/// Phase, reason and whether to dispatch (`Some(true)`) or go to needs-human
/// (`Some(false)`).
fn plan(r: &IssueRecord, policy: &Policy) -> (IssuePhase, String, Option<bool>) {
    let Some(issue) = &r.issue else {
        return (
            IssuePhase::Idle,
            "the issue has not been read yet".into(),
            None,
        );
    };
    if !issue.open {
        return (IssuePhase::Closed, "closed".into(), None);
    }
    if let Some(pr) = r.done_by_pr {
        return (IssuePhase::Done, format!("implemented by #{pr}"), None);
    }
    match &r.work.hold {
        Some(Hold::Paused { .. }) => return (IssuePhase::Paused, "paused".into(), None),
        Some(Hold::NeedsHuman { reason, .. }) => {
            return (IssuePhase::NeedsHuman, reason.clone(), None);
        }
        None => {}
    }
    if let Some(a) = &r.work.active {
        let why = format!(
            "issue-impl attempt {} at tier {} in progress",
            a.item.attempt, a.item.tier_name
        );
        return (IssuePhase::Implementing, why, None);
    }
    if let Some(pr) = r.linking_prs.first() {
        let why = format!("#{pr} links the issue; waiting for it to be merged");
        return (IssuePhase::AwaitingMerge, why, None);
    }
    if !issue.labels.contains(&policy.label_implement) && !r.requested {
        return (
            IssuePhase::Idle,
            format!("no `{}` label", policy.label_implement),
            None,
        );
    }
    if let Some(n) = work::awaiting_result_of(&r.work, WorkKind::IssueImpl, ISSUE_SIGNATURE, None) {
        return (
            IssuePhase::AwaitingPr,
            format!("waiting for the PR of attempt {n}"),
            None,
        );
    }
    if work::is_stuck(&r.work, WorkKind::IssueImpl, ISSUE_SIGNATURE, policy) {
        let why = format!(
            "{} attempts of issue-impl at the top tier did not produce a PR.",
            policy.stuck_after
        );
        return (IssuePhase::NeedsHuman, why, Some(false));
    }
    // The reset timer ends the hold (the issue's decision has no clock).
    if let Some(h) = &r.work.budget.hold {
        return (IssuePhase::OverBudget, budget::reason(h), None);
    }
    // Likewise the back-off after a transient failure (issue 27).
    if let Some(why) = transient::waiting(&r.work, None, policy) {
        return (IssuePhase::Implementing, why, None);
    }
    if let Some(held) = crate::core::legacy::hold(&r.work) {
        let why = format!("implementation wanted; {held}");
        return (IssuePhase::Implementing, why, None);
    }
    blocked_plan(r, issue, policy)
}

/// The last part of [`plan`]: a blocking label, then the dependencies. `Some(true)`
/// while the read is not fresh means "read them" (`step_issue` never dispatches on a
/// read that is not fresh).
fn blocked_plan(
    r: &IssueRecord,
    issue: &super::super::event::IssueSnapshot,
    policy: &Policy,
) -> (IssuePhase, String, Option<bool>) {
    if let Some(why) = issue_deps::blocked_by_label(issue, policy) {
        return (IssuePhase::Blocked, why, None);
    }
    let deps = &r.deps;
    let want = match deps.requested_ms.is_some() {
        true => None,
        false => Some(true),
    };
    match issue_deps::verdict(r, policy) {
        Some(Verdict::Blocked(why)) if deps.fresh => (IssuePhase::Blocked, why, None),
        Some(Verdict::Blocked(why)) => (IssuePhase::Blocked, why, want),
        Some(Verdict::Clear { .. }) if deps.fresh => (
            IssuePhase::Implementing,
            "implementation wanted".into(),
            Some(true),
        ),
        Some(Verdict::Clear { .. }) | None => (
            IssuePhase::Implementing,
            "reading the issue's dependencies from Forgejo before dispatch".into(),
            want,
        ),
    }
}

/// Folds one event into an issue record.
pub fn step_issue(
    record: &IssueRecord,
    event: &Event,
    now_ms: i64,
    policy: &Policy,
) -> IssueTransition {
    let mut r = record.clone();
    let mut fx = Fx::default();
    let from_bot = event.sender().is_some_and(|s| policy.is_bot_or_agent(s));
    let relevant = apply(&mut r, event, now_ms, policy, from_bot, &mut fx);
    let legacy = legacy_step(
        &mut r,
        record.issue.is_none(),
        event,
        relevant,
        now_ms,
        policy,
        &mut fx,
    );
    if !(relevant || legacy) {
        return noop(record, event);
    }
    let open = r.issue.as_ref().is_some_and(|i| i.open);
    if !open && r.issue.is_some() {
        work::end_active(
            &mut r.work,
            AttemptOutcome::Cancelled,
            now_ms,
            true,
            &mut fx,
        );
    }
    let (_, reason, want) = plan(&r, policy);
    match want {
        Some(true) if !from_bot && r.work.active.is_none() && !r.deps.fresh => {
            issue_deps::request_read(&mut r, now_ms, policy, &mut fx);
        }
        Some(true) if !from_bot && r.work.active.is_none() => {
            let context = WorkContext {
                issue: Some(Box::new(issue_deps::issue_work(&mut r, policy))),
                ..WorkContext::default()
            };
            let spec = work::DispatchSpec {
                repo: &record.repo,
                scope: Scope::Issue,
                number: r.number,
                kind: WorkKind::IssueImpl,
                signature: ISSUE_SIGNATURE.into(),
                head_sha: None,
                context,
            };
            work::dispatch(&mut r.work, spec, now_ms, policy, &mut fx);
        }
        Some(false) => {
            work::enter_needs_human(&mut r.work, &reason, r.number, now_ms, policy, &mut fx)
        }
        // The bot's own event released an issue a human asked for (its linking PR
        // closed unmerged): the bot never starts work, so a timer (no sender) looks
        // again at once — else the issue would wait for the next human event.
        Some(true) if r.work.active.is_none() && released(record, &r) => {
            fx.push(super::super::effect::EffectKind::Schedule(look_again(
                now_ms,
            )));
        }
        Some(true) | None => {}
    }
    work::sync_labels(&mut r.work, open && r.done_by_pr.is_none(), policy, &mut fx);
    crate::core::legacy::sweep(&mut r.work, open, &mut fx);
    if r == *record && fx.is_empty() {
        return noop(record, event);
    }
    r.version = record.version + 1;
    let d = decide_issue(&r, policy);
    let effects = fx.finish(&r.repo, Scope::Issue, r.number, r.version, policy);
    let note = super::note(event, d.phase.as_str(), &d.reason, &effects);
    IssueTransition {
        record: r,
        effects,
        note,
    }
}

/// What a previous dispatcher left (`core::legacy`), as for PRs (`machine::step`).
fn legacy_step(
    r: &mut IssueRecord,
    unseen: bool,
    event: &Event,
    relevant: bool,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) -> bool {
    use crate::core::event::IssueAction;
    use crate::core::legacy::{Me, Seen, Sight};
    let labeled_by = match event {
        Event::Issue { action, sender, .. } => {
            Some((*action == IssueAction::Labeled).then_some(sender.as_ref()))
        }
        _ => None,
    };
    let mut ws = std::mem::take(&mut r.work);
    let seen = Seen {
        current: labeled_by.and(r.issue.as_ref()).map(|cur| Sight {
            labels: &cur.labels,
            updated_ms: cur.updated_ms,
        }),
        unseen,
        labeled_by: labeled_by.flatten(),
        relevant,
    };
    let me = Me {
        repo: &r.repo,
        scope: Scope::Issue,
        number: r.number,
    };
    let concerned = crate::core::legacy::fold(&mut ws, &me, event, seen, now, policy, fx);
    r.work = ws;
    concerned
}

/// The untouched record.
fn noop(record: &IssueRecord, event: &Event) -> IssueTransition {
    IssueTransition {
        record: record.clone(),
        effects: Vec::new(),
        note: format!("{}: {}", super::NOOP_NOTE, event.name()),
    }
}

/// Folds an event into the issue's facts; false when it does not concern it.
fn apply(
    r: &mut IssueRecord,
    event: &Event,
    now: i64,
    policy: &Policy,
    from_bot: bool,
    fx: &mut Fx,
) -> bool {
    match event {
        Event::Issue { issue, .. } => {
            if issue.repo != r.repo || issue.number != r.number {
                return false;
            }
            let newer = r
                .issue
                .as_ref()
                .is_none_or(|cur| issue.updated_ms >= cur.updated_ms);
            if newer {
                work::observe_hold_label(&mut r.work, &issue.labels, policy, !from_bot);
                r.issue = Some(issue.clone());
            }
            true
        }
        Event::PullRequest { pr, .. } => on_linking_pr(r, pr, now, policy, fx),
        Event::ObservedDependencies {
            repo,
            number,
            dependencies,
            at_ms,
        } => {
            is_this(r, repo, Scope::Issue, *number)
                && issue_deps::on_read(r, dependencies, *at_ms, now, policy, fx)
        }
        Event::Comment { .. } | Event::ObservedPermission { .. } => {
            commands_of(r, event, now, policy, from_bot, fx)
        }
        Event::TimerFired { .. } | Event::WorkResult { .. } | Event::EffectOutcome { .. } => {
            claim_event(r, event, now, policy, fx)
        }
        Event::Review { .. }
        | Event::ActionRun { .. }
        | Event::Status { .. }
        | Event::Push { .. }
        | Event::ObservedPr { .. }
        | Event::ObservedReviews { .. }
        | Event::ObservedStatus { .. }
        | Event::ObservedLegacy { .. }
        | Event::ResyncObserved { .. } => false,
    }
}

/// A PR event delivered to the issue (its body links the issue now or did before).
/// Only a merge ends the issue's work; an open PR holds it, and the agent's own PR (a
/// bot author) ends the claim as its result; a PR closed unmerged, or whose body no
/// longer links the issue, releases what it took. Anyone can open a PR that links any
/// issue, so an open or closed PR never marks the issue done.
fn on_linking_pr(
    r: &mut IssueRecord,
    pr: &super::super::event::PrSnapshot,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) -> bool {
    if pr.repo != r.repo {
        return false;
    }
    let n = pr.number;
    let links = linked_issues(&pr.body).contains(&r.number);
    // The bot, a bot user, or an agent user (agents may open PRs as themselves).
    let agent = pr
        .author
        .as_ref()
        .is_some_and(|a| policy.is_bot_author(a) || policy.is_agent(a));
    match (links, pr.state) {
        (true, PrState::Merged) => {
            r.linking_prs.remove(&n);
            if r.done_by_pr.is_some() {
                return false;
            }
            r.done_by_pr = Some(n);
            // The agent's merged PR is its result; someone else's merge makes the
            // agent's work moot: cancel it.
            let outcome = match agent {
                true => AttemptOutcome::Superseded,
                false => AttemptOutcome::Cancelled,
            };
            work::end_active(&mut r.work, outcome, now, !agent, fx);
            true
        }
        (true, PrState::Open) => {
            if r.done_by_pr.is_some() {
                return false;
            }
            let mut changed = false;
            // Only the agents' own PRs hold the issue (`awaiting-merge`): anyone can open
            // a PR that says `Closes #N`, and an outsider's open PR must not stop the
            // issue's work. Other linking PRs count only when they merge.
            if agent && !r.linking_prs.contains(&n) && r.linking_prs.len() < LINKING_PRS_KEPT {
                changed = r.linking_prs.insert(n);
            }
            if agent && r.work.active.is_some() {
                // The agent's PR is its result: end the claim without cancelling it.
                work::end_active(&mut r.work, AttemptOutcome::Superseded, now, false, fx);
                changed = true;
            }
            changed
        }
        (true, PrState::Closed) | (false, _) => {
            let mut changed = r.linking_prs.remove(&n);
            // A record an open PR marked done before only merges counted.
            if pr.state == PrState::Closed && r.done_by_pr == Some(n) {
                r.done_by_pr = None;
                changed = true;
            }
            // The agent PR a `succeeded` attempt announced closed unmerged: the issue
            // would wait for a PR again, so the wait gets a deadline again.
            if changed && let Some(last) = r.work.attempts.last().map(|a| a.work_id.clone()) {
                work::arm_push_grace(&r.work, &last, awaits_pr(r), now, policy, fx);
            }
            changed
        }
    }
}

/// Whether an event's repository, scope and number name this issue.
fn is_this(r: &IssueRecord, repo: &super::super::ids::RepoName, scope: Scope, number: u64) -> bool {
    scope == Scope::Issue && *repo == r.repo && number == r.number
}

/// Comments on the issue and permission reads: commands.
fn commands_of(
    r: &mut IssueRecord,
    event: &Event,
    now: i64,
    policy: &Policy,
    from_bot: bool,
    fx: &mut Fx,
) -> bool {
    let ctx = commands::CommandCtx { number: r.number };
    let out = match event {
        Event::Comment {
            repo,
            number,
            is_pull,
            comment_id,
            commands,
            sender,
            ..
        } => {
            if *is_pull || !is_this(r, repo, Scope::Issue, *number) {
                return false;
            }
            if from_bot {
                return true;
            }
            let sender = sender.as_ref();
            commands::on_comment(
                &mut r.work,
                &ctx,
                *comment_id,
                commands,
                sender,
                now,
                policy,
                fx,
            )
        }
        Event::ObservedPermission {
            repo,
            scope,
            number,
            login,
            permission,
            at_ms,
        } => {
            if !is_this(r, repo, *scope, *number) {
                return false;
            }
            commands::on_permission(
                &mut r.work,
                &ctx,
                login,
                *permission,
                *at_ms,
                now,
                policy,
                fx,
            )
        }
        Event::PullRequest { .. }
        | Event::Review { .. }
        | Event::Issue { .. }
        | Event::ActionRun { .. }
        | Event::Status { .. }
        | Event::Push { .. }
        | Event::TimerFired { .. }
        | Event::ObservedPr { .. }
        | Event::ObservedReviews { .. }
        | Event::ObservedStatus { .. }
        | Event::ObservedDependencies { .. }
        | Event::WorkResult { .. }
        | Event::EffectOutcome { .. }
        | Event::ObservedLegacy { .. }
        | Event::ResyncObserved { .. } => return false,
    };
    r.requested |= out.implement;
    true
}

/// Claim-expiry timers, work results and failed dispatches.
fn claim_event(r: &mut IssueRecord, event: &Event, now: i64, policy: &Policy, fx: &mut Fx) -> bool {
    match event {
        Event::TimerFired {
            repo,
            scope,
            number,
            timer,
        } => match &timer.kind {
            TimerKind::ClaimExpiry { work_id } if is_this(r, repo, *scope, *number) => {
                work::on_expiry(&mut r.work, work_id, now, fx)
            }
            // [`look_again`]: the step re-plans without a sender.
            TimerKind::StaleCheck => is_this(r, repo, *scope, *number),
            TimerKind::ClaimExpiry { .. }
            | TimerKind::CiPoll { .. }
            | TimerKind::Mergeability
            | TimerKind::MergeRetry
            | TimerKind::StatusSettle
            | TimerKind::QueueCi
            // `core::legacy` handles it (`step_issue`).
            | TimerKind::Legacy => false,
            TimerKind::BudgetReset => {
                is_this(r, repo, *scope, *number) && budget::on_reset_timer(&mut r.work, now)
            }
            TimerKind::TransientRetry => {
                is_this(r, repo, *scope, *number) && transient::on_timer(&mut r.work, now)
            }
            TimerKind::PushGrace { work_id } if is_this(r, repo, *scope, *number) => {
                let waits = awaits_pr(r);
                work::on_push_grace(&mut r.work, work_id, waits, policy)
            }
            TimerKind::PushGrace { .. } => false,
            TimerKind::DependencyRecheck => {
                is_this(r, repo, *scope, *number) && issue_deps::on_recheck(r)
            }
        },
        Event::WorkResult {
            work_id,
            outcome,
            signature,
            summary,
            usage,
            stopped,
        } => {
            let mine = work_id.subject() == Some((r.repo.clone(), Scope::Issue, r.number));
            let (sig, sum) = (signature.as_ref(), summary.as_ref());
            if mine {
                let (o, s, u) = (*outcome, *stopped, usage.as_ref());
                let w = &mut r.work;
                if transient::on_result(w, work_id, o, s, sum, u, now, policy, fx) {
                    return true;
                }
            }
            let scope = budget::active_scope(&r.work, work_id);
            let recorded =
                mine && work::on_result(&mut r.work, work_id, *outcome, sig, sum, now, fx);
            if recorded {
                let (u, s) = (usage.as_ref(), *stopped);
                budget::on_result(&mut r.work, work_id, u, s, scope.as_deref(), now, fx);
                if *outcome == WorkOutcome::Succeeded {
                    let waits = awaits_pr(r);
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
            if !is_this(r, repo, *scope, *number) {
                return false;
            }
            let failed_dispatch = match outcome {
                EffectOutcome::Failed {
                    work_id: Some(id), ..
                } => r.work.active.as_ref().is_some_and(|a| &a.item.id == id),
                EffectOutcome::OverBudget { work_id, stop } => {
                    return budget::on_dispatch_held(&mut r.work, work_id, stop, now, fx);
                }
                EffectOutcome::Failed { work_id: None, .. }
                | EffectOutcome::Merge(_)
                | EffectOutcome::Queue(_)
                | EffectOutcome::QueueEjected(_) => false,
            };
            if !failed_dispatch {
                return false;
            }
            work::end_active(&mut r.work, AttemptOutcome::DispatchFailed, now, false, fx);
            true
        }
        Event::PullRequest { .. }
        | Event::Review { .. }
        | Event::Comment { .. }
        | Event::Issue { .. }
        | Event::ActionRun { .. }
        | Event::Status { .. }
        | Event::Push { .. }
        | Event::ObservedPr { .. }
        | Event::ObservedReviews { .. }
        | Event::ObservedStatus { .. }
        | Event::ObservedPermission { .. }
        | Event::ObservedLegacy { .. }
        | Event::ObservedDependencies { .. }
        | Event::ResyncObserved { .. } => false,
    }
}

/// Whether a `succeeded` issue-impl result still waits for its PR: the issue is open,
/// not done, and no agent PR links it.
fn awaits_pr(r: &IssueRecord) -> bool {
    r.issue.as_ref().is_some_and(|i| i.open) && r.done_by_pr.is_none() && r.linking_prs.is_empty()
}

/// Whether the step from `before` to `after` released the issue: a linking PR held
/// it or marked it done, and none does now.
fn released(before: &IssueRecord, after: &IssueRecord) -> bool {
    let held = |r: &IssueRecord| r.done_by_pr.is_some() || !r.linking_prs.is_empty();
    held(before) && !held(after)
}

/// The timer that makes an issue decide again without a sender (due at once).
fn look_again(now: i64) -> super::super::effect::Timer {
    super::super::effect::Timer {
        due_ms: now,
        kind: TimerKind::StaleCheck,
        id: "look-again".into(),
    }
}
