//! What an issue needs before `issue-impl`: it is not blocked — by a label of policy
//! `blocked_labels` (default `State/Paused`, `Blocked`) or by an open dependency
//! (Forgejo issue dependencies, read by `Observe(Dependencies)` before every
//! dispatch) — and where the agent works: the branch of policy `issue_branch` and the
//! base branch, which is the repository's default branch or, when the issue depends on
//! an issue whose agents' PR is open, that PR's head branch (stacked work).
//!
//! Only Forgejo's dependency API says what an issue depends on: a "depends on #N" in
//! an issue's body is text anyone who can edit it writes, and is never read. Only
//! PRs by the bot or a bot user (`Policy::is_bot_author`) from a branch of the
//! repository itself become a base: anyone can open a PR that says `Closes #N`.
//!
//! Forgejo sends a dependency's `closed` webhook for the dependency only, never for
//! the issues it blocks, so a blocked issue reads its dependencies again every
//! `dependency_recheck_secs` (timer `dependency-recheck`); the same timer asks again
//! when a read never came back. A blocking label's removal is an `issue_label`
//! webhook on the issue itself.

use super::super::effect::{EffectKind, IssueWork, ObserveWhat, Timer, TimerKind};
use super::super::event::{DependencyFact, IssueSnapshot};
use super::super::ids::{RepoName, branch_name_problem};
use super::super::policy::Policy;
use super::super::record::{DependencyRead, IssueRecord};
use super::Fx;

/// The id of the recheck timer within the record (scheduling again replaces it).
const RECHECK_TIMER: &str = "dependency-recheck";

/// What the dependencies allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// No open dependency holds the issue; `base` is the stacked base, if any:
    /// `(branch, dependency, pr)`.
    Clear {
        /// The head branch of a dependency's open PR to start from.
        base: Option<(String, u64, u64)>,
    },
    /// Held, and why.
    Blocked(String),
}

/// The first of the policy's `blocked_labels` the issue carries, as a reason.
pub(super) fn blocked_by_label(issue: &IssueSnapshot, policy: &Policy) -> Option<String> {
    policy
        .blocked_labels
        .iter()
        .find(|b| {
            issue
                .labels
                .iter()
                .any(|l| l.trim().eq_ignore_ascii_case(b.trim()))
        })
        .map(|l| format!("blocked by the label `{l}` (remove it to dispatch)"))
}

/// What the dependencies of `read` allow for an issue of `repo`.
pub(super) fn judge(read: &DependencyRead, repo: &RepoName, policy: &Policy) -> Verdict {
    let mut waiting = Vec::new();
    let mut stacks: Vec<(String, u64, u64)> = Vec::new();
    for d in read.items.iter().filter(|d| d.open) {
        match stack_base(d, repo, policy) {
            Some((branch, pr)) => stacks.push((branch, d.number, pr)),
            None if d.repo == *repo => waiting.push(format!("#{}", d.number)),
            None => waiting.push(format!("{}#{}", d.repo, d.number)),
        }
    }
    if !waiting.is_empty() {
        let open = waiting.join(", ");
        return Verdict::Blocked(format!(
            "blocked by open dependencies: {open} (dispatched when they close)"
        ));
    }
    stacks.sort();
    stacks.dedup_by(|a, b| a.0 == b.0);
    match stacks.as_slice() {
        [] => Verdict::Clear { base: None },
        [one] => Verdict::Clear {
            base: Some(one.clone()),
        },
        [a, b, ..] => Verdict::Blocked(format!(
            "blocked: dependencies #{} and #{} are in different open PRs (`{}`, `{}`); \
             one branch cannot start from both (dispatched when one is merged)",
            a.1, b.1, a.0, b.0
        )),
    }
}

/// The branch an open dependency's work can be stacked on: the head branch of its
/// open PR by the agents, from the repository itself, with a name git accepts
/// (the lowest PR number when there are several). `None`: the dependency blocks.
fn stack_base(d: &DependencyFact, repo: &RepoName, policy: &Policy) -> Option<(String, u64)> {
    if d.repo != *repo || d.is_pull {
        return None;
    }
    d.linking_prs
        .iter()
        .filter(|p| p.same_repo && branch_name_problem(&p.head_ref).is_none())
        .filter(|p| p.author.as_ref().is_some_and(|a| policy.is_bot_author(a)))
        .min_by_key(|p| p.number)
        .map(|p| (p.head_ref.clone(), p.number))
}

/// The record's verdict from its last read (`None`: never read).
pub(super) fn verdict(r: &IssueRecord, policy: &Policy) -> Option<Verdict> {
    r.deps
        .read
        .as_ref()
        .map(|read| judge(read, &r.repo, policy))
}

/// Asks for a read of the dependencies, unless one is in flight; the recheck timer
/// asks again if it never comes back.
pub(super) fn request_read(r: &mut IssueRecord, now: i64, policy: &Policy, fx: &mut Fx) {
    if r.deps.requested_ms.is_some() {
        return;
    }
    r.deps.requested_ms = Some(now);
    fx.push(EffectKind::Observe(ObserveWhat::Dependencies));
    schedule_recheck(now, policy, fx);
}

/// A read came back: it is the newest fact unless an older read arrives late.
pub(super) fn on_read(
    r: &mut IssueRecord,
    items: &[DependencyFact],
    at_ms: i64,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) -> bool {
    if r.deps.read.as_ref().is_some_and(|old| old.at_ms > at_ms) {
        return false;
    }
    r.deps.read = Some(DependencyRead {
        at_ms,
        items: items.to_vec(),
    });
    r.deps.fresh = true;
    r.deps.requested_ms = None;
    if matches!(verdict(r, policy), Some(Verdict::Blocked(_))) {
        schedule_recheck(now, policy, fx);
    }
    true
}

/// The recheck timer: the last read is no longer good for a dispatch, and a read in
/// flight is given up (the next step asks again when the issue still wants work).
pub(super) fn on_recheck(r: &mut IssueRecord) -> bool {
    let changed = r.deps.fresh || r.deps.requested_ms.is_some();
    r.deps.fresh = false;
    r.deps.requested_ms = None;
    changed
}

/// Where the agent works; uses up the read (the next dispatch reads again).
pub(super) fn issue_work(r: &mut IssueRecord, policy: &Policy) -> IssueWork {
    let base = match verdict(r, policy) {
        Some(Verdict::Clear { base }) => base,
        Some(Verdict::Blocked(_)) | None => None,
    };
    r.deps.fresh = false;
    IssueWork {
        branch: branch_of(&policy.issue_branch, r.number),
        base_of: base.as_ref().map(|(_, issue, pr)| (*issue, *pr)),
        base: base.map(|(branch, _, _)| branch),
    }
}

/// Policy `issue_branch` for issue `number`.
pub fn branch_of(template: &str, number: u64) -> String {
    template.replace("{number}", &number.to_string())
}

fn schedule_recheck(now: i64, policy: &Policy, fx: &mut Fx) {
    let delay =
        i64::try_from(policy.dependency_recheck_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    fx.push(EffectKind::Schedule(Timer {
        due_ms: now.saturating_add(delay),
        kind: TimerKind::DependencyRecheck,
        id: RECHECK_TIMER.into(),
    }));
}
