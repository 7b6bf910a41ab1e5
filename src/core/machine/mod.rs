//! The state machine: `step(record, event, now, policy)` folds one event into a
//! record's facts, asks `decide` what the PR wants now, compares that with what is in
//! flight and returns the new record and the effects (DESIGN §2).
//!
//! Level-triggered: every step recomputes the wanted state from facts, so duplicated,
//! reordered and replayed events converge. Effects that start something (dispatch,
//! merge, status comment, labels, CI polls) are recorded in the record when emitted,
//! so repeating a step emits nothing new.
//!
//! Files: `facts` (events → facts), `plan` (`decide`: phase, reason, wanted action),
//! `work` (claims, attempts, escalation, stuck), `review` (reviewer agents: when a
//! `review` is wanted, whose approvals count, rounds), `reconcile` (wanted vs in flight →
//! effects), `commands` (`/shepherd …` with trust), `issue` (`step_issue`), `budget`
//! (over-budget holds, grants and the cost so far), `transient` (transient agent
//! failures: retried after a back-off without an attempt, bounded).

mod budget;
mod commands;
mod facts;
mod issue;
mod issue_deps;
mod plan;
mod queue;
mod reconcile;
mod review;
mod transient;
mod work;

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use budget::past_runs;
pub use issue::{IssueDecision, IssuePhase, IssueTransition, decide_issue, step_issue};
pub use issue_deps::branch_of;
pub use plan::{
    CiView, active_change_requests, ci_view, merge_blockers, unofficial_change_requests,
};
pub use work::{claim_timer, standing_timers};

use super::effect::{Effect, EffectKind};
use super::event::Event;
use super::ids::{EffectId, RepoName, Scope};
use super::policy::Policy;
use super::record::PrRecord;
use super::texts;

/// What a person sees (DESIGN §2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// CI has not reported (all contexts) on the head yet.
    AwaitingCi,
    /// CI fails; a `ci-fix` is wanted or running.
    CiFix,
    /// Change requests; a `review-feedback` is wanted or running.
    ReviewFeedback,
    /// Conflicts with the base; a `merge-conflicts` is wanted or running.
    MergeConflicts,
    /// Waiting for approvals (or a re-review, or a draft to be marked ready).
    AwaitingReview,
    /// Every merge condition holds.
    ReadyToMerge,
    /// In its target branch's merge queue: waiting, or (the head) being updated onto
    /// the tip, tested and merged.
    Queued,
    /// A merge is in flight.
    Merging,
    /// Merged.
    Merged,
    /// Closed without merge.
    Closed,
    /// Stuck: a human must act.
    NeedsHuman,
    /// Paused by a command.
    Paused,
    /// Agent work is wanted, but a spend cap is reached (issue 28): it resumes at the
    /// cap's reset or on `/shepherd budget +<amount>`.
    OverBudget,
}

impl Phase {
    /// The phase's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::AwaitingCi => "awaiting-ci",
            Phase::CiFix => "ci-fix",
            Phase::ReviewFeedback => "review-feedback",
            Phase::MergeConflicts => "merge-conflicts",
            Phase::AwaitingReview => "awaiting-review",
            Phase::ReadyToMerge => "ready-to-merge",
            Phase::Queued => "queued",
            Phase::Merging => "merging",
            Phase::Merged => "merged",
            Phase::Closed => "closed",
            Phase::NeedsHuman => "needs-human",
            Phase::Paused => "paused",
            Phase::OverBudget => "over-budget",
        }
    }
}

/// Where a PR stands and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The phase.
    pub phase: Phase,
    /// A human-readable reason, e.g. "waiting for 1 more approval".
    pub reason: String,
}

/// The result of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// The new record (version = old + 1 unless nothing changed).
    pub record: PrRecord,
    /// Effects to commit with it, ids `<record>@<new version>.<index>`.
    pub effects: Vec<Effect>,
    /// One line for the history.
    pub note: String,
}

impl Transition {
    /// True when the event changed nothing: the record is returned as loaded (same
    /// version) and there are no effects, so nothing needs committing.
    pub fn is_noop(&self) -> bool {
        self.effects.is_empty() && self.note.starts_with(NOOP_NOTE)
    }
}

/// How notes of no-op transitions start.
const NOOP_NOTE: &str = "no change";

/// What the PR wants now, according to its facts and policy.
pub fn decide(record: &PrRecord, policy: &Policy, now_ms: i64) -> Decision {
    let p = plan_of(record, policy, now_ms);
    Decision {
        phase: p.phase,
        reason: p.reason,
    }
}

/// The plan, with the merge queue's word on a serial head red on the tip
/// (`queue::flaky_check`: a flaky failure is re-tested before any agent is woken).
fn plan_of(r: &PrRecord, policy: &Policy, now_ms: i64) -> plan::Plan {
    queue::flaky_check(r, plan::plan(r, policy, now_ms), policy, now_ms)
}

/// Folds one event into a PR record. Pure and deterministic: same inputs, same output.
///
/// Events for another record, and `Target::Repo` events that do not concern this PR
/// (push to another branch, a CI event for a sha that is not the head), are no-ops.
pub fn step(record: &PrRecord, event: &Event, now_ms: i64, policy: &Policy) -> Transition {
    let mut r = record.clone();
    let mut fx = Fx::default();
    // The agent users' events count as the bot's: they never start work, and an
    // agent's push ends its claim without a cancel.
    let from_bot = event.sender().is_some_and(|s| policy.is_bot_or_agent(s));
    let unseen = r.pr.is_none();
    let relevant = facts::apply(&mut r, event, now_ms, policy, from_bot, &mut fx);
    let legacy = legacy_step(&mut r, event, unseen, relevant, now_ms, policy, &mut fx);
    // PRs into or out of the merge queue's temporary batch branches are the queue's
    // own (issue 29): never reviewed, merged or commented on as PRs.
    let batch_pr = r.pr.as_ref().is_some_and(|p| {
        super::queue::batch::is_batch_branch(&p.base_ref)
            || super::queue::batch::is_batch_branch(&p.head_ref)
    });
    if !(relevant || legacy) || batch_pr {
        return noop(record, event);
    }
    review::note_verdicts(&mut r, policy);
    let plan = plan_of(&r, policy, now_ms);
    reconcile::reconcile(&mut r, &plan, !from_bot, now_ms, policy, &mut fx);
    let open = r.is_open();
    super::legacy::sweep(&mut r.work, open, &mut fx);
    if r == *record && fx.is_empty() {
        return noop(record, event);
    }
    r.version = record.version + 1;
    let plan = plan_of(&r, policy, now_ms);
    let effects = fx.finish(&r.repo, Scope::Pr, r.number, r.version, policy);
    let note = note(event, plan.phase.as_str(), &plan.reason, &effects);
    Transition {
        record: r,
        effects,
        note,
    }
}

/// What a previous dispatcher left (`core::legacy`): the first snapshot seeds the
/// record, later label webhooks may start a foreign claim, the read's answer and the
/// legacy timer land here. Returns whether the event was for the legacy facts alone.
fn legacy_step(
    r: &mut PrRecord,
    event: &Event,
    unseen: bool,
    relevant: bool,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) -> bool {
    use super::legacy::{Me, Seen, Sight};
    let snap = match event {
        Event::PullRequest { pr, .. }
        | Event::Review { pr, .. }
        | Event::ObservedPr { pr }
        | Event::ResyncObserved { pr, .. } => Some(pr),
        _ => None,
    };
    let labeled_by = match event {
        Event::PullRequest {
            action: super::event::PrAction::Labeled,
            sender,
            ..
        } => Some(sender.as_ref()),
        _ => None,
    };
    let mut ws = std::mem::take(&mut r.work);
    let seen = Seen {
        current: snap.and(r.pr.as_ref()).map(|cur| Sight {
            labels: &cur.labels,
            updated_ms: cur.updated_ms,
        }),
        unseen,
        labeled_by,
        relevant,
    };
    let me = Me {
        repo: &r.repo,
        scope: Scope::Pr,
        number: r.number,
    };
    let concerned = super::legacy::fold(&mut ws, &me, event, seen, now, policy, fx);
    r.work = ws;
    concerned
}

/// The untouched record.
fn noop(record: &PrRecord, event: &Event) -> Transition {
    Transition {
        record: record.clone(),
        effects: Vec::new(),
        note: format!("{NOOP_NOTE}: {}", event.name()),
    }
}

/// The history line of a transition.
fn note(event: &Event, phase: &str, reason: &str, effects: &[Effect]) -> String {
    let mut s = format!("{}: {phase} — {reason}", event.name());
    if !effects.is_empty() {
        let names: Vec<String> = effects.iter().map(|e| effect_label(&e.kind)).collect();
        s.push_str(&format!(" [{}]", names.join(", ")));
    }
    s
}

/// A short label of an effect for notes.
fn effect_label(kind: &EffectKind) -> String {
    match kind {
        EffectKind::Dispatch(w) => format!("dispatch {} tier {}", w.kind.as_str(), w.tier),
        EffectKind::CancelWork { .. } => "cancel work".into(),
        EffectKind::AddLabels { labels } => format!("+labels {}", labels.join(",")),
        EffectKind::RemoveLabels { labels } => format!("-labels {}", labels.join(",")),
        EffectKind::UpsertComment { .. } => "status comment".into(),
        EffectKind::Comment { number, .. } => format!("comment #{number}"),
        EffectKind::Merge { head_sha, .. } => format!("merge {head_sha}"),
        EffectKind::Queue(op) => format!("queue {:?} {}", op.action, op.branch),
        EffectKind::QueueAdvance { head_sha, .. } => format!("advance queue {head_sha}"),
        EffectKind::QueueFreeze(op) => format!("queue {:?} {}", op.action, op.branch),
        EffectKind::Observe(w) => format!("observe {w:?}"),
        EffectKind::Schedule(t) => format!("timer {}", t.kind.name()),
    }
}

/// An effect before its id is known.
#[derive(Debug, Clone, PartialEq)]
enum Pending {
    /// A finished effect kind.
    Kind(Box<EffectKind>),
    /// A comment whose body gets the effect-id marker and footer at the end.
    Comment {
        /// Where.
        number: u64,
        /// Text before marker and footer.
        text: String,
    },
}

/// Collects the effects of one step, in order.
#[derive(Debug, Default)]
pub(crate) struct Fx {
    /// The effects so far.
    items: Vec<Pending>,
}

impl Fx {
    /// Adds an effect.
    pub(crate) fn push(&mut self, kind: EffectKind) {
        self.items.push(Pending::Kind(Box::new(kind)));
    }

    /// Adds a comment on issue/PR `number`.
    pub(crate) fn comment(&mut self, number: u64, text: String) {
        self.items.push(Pending::Comment { number, text });
    }

    /// Whether nothing was added.
    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Assigns ids and renders comment bodies.
    pub(crate) fn finish(
        self,
        repo: &RepoName,
        scope: Scope,
        number: u64,
        version: u64,
        policy: &Policy,
    ) -> Vec<Effect> {
        self.items
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let id = EffectId::new(repo, scope, number, version, i);
                let kind = match p {
                    Pending::Kind(k) => *k,
                    Pending::Comment { number, text } => EffectKind::Comment {
                        number,
                        body: texts::finish_comment(&text, &id, &policy.comment_footer),
                    },
                };
                Effect {
                    id,
                    repo: repo.clone(),
                    scope,
                    number,
                    kind,
                }
            })
            .collect()
    }
}
