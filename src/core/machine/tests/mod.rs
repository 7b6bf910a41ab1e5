//! Tests of the state machine: a small harness (records, events, effects shown as
//! one-line strings so a test can assert the full effect list), table tests of single
//! transitions, lifecycle walks and property tests.

mod attempts;
mod authors;
mod bounds;
mod budget;
mod deadlines;
mod economy;
mod grace;
mod hostile;
mod issue_deps;
mod issues;
mod legacy;
mod props;
mod queue;
mod review;
mod table;
mod transient;
mod walks;

use std::collections::BTreeSet;

use super::{Phase, Transition, decide, step};
use crate::core::effect::{Effect, EffectKind, ObserveWhat, Timer, TimerKind};
use crate::core::event::{
    CiContext, CiState, EffectOutcome, Event, MergeOutcome, PrAction, PrSnapshot, PrState,
    ReviewFact, ReviewHint, ReviewState, WorkOutcome,
};
use crate::core::ids::{Login, RepoName, Scope, Sha, WorkId};
use crate::core::policy::Policy;
use crate::core::record::PrRecord;
use crate::core::texts;

/// Start of every test clock (unix ms).
pub(super) const T0: i64 = 1_800_000_000_000;
/// PR number used throughout.
pub(super) const PR: u64 = 7;

/// The test repository.
pub(super) fn repo() -> RepoName {
    "acme/widgets".parse().unwrap()
}

/// A login.
pub(super) fn login(s: &str) -> Login {
    s.parse().unwrap()
}

/// A 40-digit sha made of one hex digit.
pub(super) fn sha(c: char) -> Sha {
    std::iter::repeat_n(c, 40)
        .collect::<String>()
        .parse()
        .unwrap()
}

/// The default policy with the bot user `bot`, every status written at once
/// (`status_settle_secs = 0`) so a test sees each phase's status effect; the settling
/// of short-lived statuses has its own tests ([`settled_policy`]).
///
/// `agent_authors = anyone`: these tests are about the work, not about who gets it,
/// and their PRs are by `alice`, whose permission is never read here; the
/// `agent_authors` gate has its own tests (`tests/authors.rs`) under its default.
pub(super) fn policy() -> Policy {
    Policy {
        bot_login: Some(login("bot")),
        status_settle_secs: 0,
        agent_authors: crate::core::policy::AgentAuthors::Anyone,
        ..Policy::default()
    }
}

/// [`policy`] with the default `status_settle_secs` (short-lived statuses wait).
pub(super) fn settled_policy() -> Policy {
    Policy {
        status_settle_secs: Policy::default().status_settle_secs,
        ..policy()
    }
}

/// An open human PR (needs 2 approvals) at head `head`, updated at `updated`.
pub(super) fn snap(head: char, updated: i64) -> PrSnapshot {
    PrSnapshot {
        repo: repo(),
        number: PR,
        state: PrState::Open,
        draft: false,
        title: "Fix widget overflow".into(),
        body: "Closes #9".into(),
        author: Some(login("alice")),
        head_sha: Some(sha(head)),
        head_ref: "fix".into(),
        base_ref: "main".into(),
        labels: BTreeSet::new(),
        mergeable: Some(true),
        updated_ms: updated,
        comments: None,
    }
}

/// The same PR marked as a bot PR (needs 1 approval).
pub(super) fn bot_snap(head: char, updated: i64) -> PrSnapshot {
    PrSnapshot {
        body: "Closes #9\n\nAutomated by CleverAgents Bot".into(),
        author: Some(login("bot")),
        ..snap(head, updated)
    }
}

/// A PR webhook.
pub(super) fn pr_event(action: PrAction, pr: PrSnapshot, sender: &str) -> Event {
    Event::PullRequest {
        action,
        pr,
        base_changed_from: None,
        sender: Some(login(sender)),
    }
}

/// A combined-status read of `head` (contexts updated at `at`).
pub(super) fn status(head: char, contexts: &[(&str, CiState, &str)], at: i64) -> Event {
    Event::ObservedStatus {
        repo: repo(),
        number: PR,
        sha: sha(head),
        contexts: contexts
            .iter()
            .map(|(c, s, d)| CiContext {
                context: (*c).into(),
                state: *s,
                description: (*d).into(),
                target_url: String::new(),
                updated_ms: at,
            })
            .collect(),
        at_ms: at,
    }
}

/// A reviews read: (reviewer, state, reviewed head), ids in order.
pub(super) fn reviews(list: &[(&str, ReviewState, char)], at: i64) -> Event {
    Event::ObservedReviews {
        repo: repo(),
        number: PR,
        reviews: list
            .iter()
            .enumerate()
            .map(|(i, (who, state, head))| ReviewFact {
                id: 100 + i64::try_from(i).unwrap(),
                reviewer: login(who),
                state: *state,
                body: format!("review by {who}"),
                commit_id: sha(*head).to_string(),
                stale: false,
                official: true,
                dismissed: false,
                submitted_ms: at - 1000 + i64::try_from(i).unwrap(),
            })
            .collect(),
        at_ms: at,
    }
}

/// An agent's report.
pub(super) fn result(id: &WorkId, outcome: WorkOutcome) -> Event {
    Event::WorkResult {
        work_id: id.clone(),
        outcome,
        signature: None,
        summary: Some("did things".into()),
        usage: None,
        stopped: None,
    }
}

/// A timer firing.
pub(super) fn timer(kind: TimerKind, due_ms: i64) -> Event {
    Event::TimerFired {
        repo: repo(),
        scope: Scope::Pr,
        number: PR,
        timer: Timer {
            due_ms,
            id: kind.name().into(),
            kind,
        },
    }
}

/// A merge outcome.
pub(super) fn merged(outcome: MergeOutcome) -> Event {
    Event::EffectOutcome {
        repo: repo(),
        scope: Scope::Pr,
        number: PR,
        effect_id: "x".parse().unwrap(),
        outcome: EffectOutcome::Merge(outcome),
    }
}

/// A PR conversation comment.
pub(super) fn comment(id: i64, body: &str, sender: &str) -> Event {
    Event::Comment {
        repo: repo(),
        number: PR,
        is_pull: true,
        comment_id: id,
        commands: crate::core::command::parse(body),
        at_ms: 0,
        sender: Some(login(sender)),
    }
}

/// A permission read of `who`.
pub(super) fn permission(who: &str, p: crate::core::event::Permission, at: i64) -> Event {
    Event::ObservedPermission {
        repo: repo(),
        scope: Scope::Pr,
        number: PR,
        login: login(who),
        permission: p,
        at_ms: at,
    }
}

/// A review webhook (a hint).
pub(super) fn review_hint(pr: PrSnapshot, who: &str) -> Event {
    Event::Review {
        hint: ReviewHint::Approved,
        pr,
        sender: Some(login(who)),
    }
}

/// The first three characters of a sha.
fn short(s: &Sha) -> &str {
    &s.as_str()[..3]
}

/// One effect as a line (timers relative to `now`, in seconds).
pub(super) fn show(e: &Effect, now: i64) -> String {
    match &e.kind {
        EffectKind::Dispatch(w) => format!(
            "dispatch {} tier={} attempt={} head={}",
            w.kind.as_str(),
            w.tier,
            w.attempt,
            w.head_sha.as_ref().map_or("-", short)
        ),
        EffectKind::CancelWork { work_id } => format!("cancel {work_id}"),
        EffectKind::AddLabels { labels } => format!("+{}", labels.join(",")),
        EffectKind::RemoveLabels { labels } => format!("-{}", labels.join(",")),
        EffectKind::UpsertComment { body, .. } => {
            let state = texts::parse_status_comment(body).expect("state block");
            format!("status {}", state.phase.as_str())
        }
        EffectKind::Comment { number, .. } => format!("comment #{number}"),
        EffectKind::Merge {
            head_sha,
            style,
            delete_branch,
            ..
        } => format!("merge {} {style:?} delete={delete_branch}", short(head_sha)),
        EffectKind::Queue(op) => format!("queue {:?} {}", op.action, op.branch),
        EffectKind::QueueAdvance { head_sha, .. } => format!("advance {}", short(head_sha)),
        EffectKind::QueueFreeze(op) => format!("freeze {:?} {}", op.action, op.branch),
        EffectKind::Observe(ObserveWhat::Pr) => "observe pr".into(),
        EffectKind::Observe(ObserveWhat::Reviews) => "observe reviews".into(),
        EffectKind::Observe(ObserveWhat::Dependencies) => "observe dependencies".into(),
        EffectKind::Observe(ObserveWhat::CombinedStatus { sha }) => {
            format!("observe status {}", short(sha))
        }
        EffectKind::Observe(ObserveWhat::Permission { login }) => {
            format!("observe permission {login}")
        }
        EffectKind::Observe(ObserveWhat::Legacy {
            comments,
            claim_label,
        }) => format!(
            "observe legacy comments={comments} claim={}",
            claim_label.as_deref().unwrap_or("-")
        ),
        EffectKind::Schedule(t) => format!("timer {} +{}s", t.kind.name(), (t.due_ms - now) / 1000),
    }
}

/// Checks what must hold for every transition's effects: ids carry the new version
/// and are unique; comments end with the footer and carry their own id.
pub(super) fn check_effects(t: &Transition, p: &Policy) {
    let mut ids = BTreeSet::new();
    for e in &t.effects {
        assert!(ids.insert(e.id.clone()), "duplicate effect id {}", e.id);
        assert!(
            e.id.as_str().contains(&format!("@{}.", t.record.version)),
            "{} not of version {}",
            e.id,
            t.record.version
        );
        if let EffectKind::Comment { body, .. } = &e.kind {
            assert!(body.ends_with(&p.comment_footer), "{body}");
            assert_eq!(texts::find_effect_marker(body), Some(e.id.as_str()));
        }
        if let EffectKind::UpsertComment { body, .. } = &e.kind {
            assert!(body.ends_with(&p.comment_footer), "{body}");
            assert_eq!(texts::status_version(body), t.record.version, "{body}");
        }
    }
}

/// A record under test with its clock and policy.
pub(super) struct H {
    /// The record.
    pub r: PrRecord,
    /// Now (unix ms).
    pub now: i64,
    /// Policy.
    pub p: Policy,
    /// The last transition.
    pub last: Option<Transition>,
}

impl H {
    /// A fresh record at T0.
    pub fn new() -> H {
        H::with(policy())
    }

    /// A fresh record with a policy.
    pub fn with(p: Policy) -> H {
        H {
            r: PrRecord::new(repo(), PR),
            now: T0,
            p,
            last: None,
        }
    }

    /// Steps one event; returns the effects as lines.
    pub fn step(&mut self, e: Event) -> Vec<String> {
        let t = step(&self.r, &e, self.now, &self.p);
        check_effects(&t, &self.p);
        let shown = t.effects.iter().map(|x| show(x, self.now)).collect();
        self.r = t.record.clone();
        self.last = Some(t);
        shown
    }

    /// Moves the clock.
    pub fn later(&mut self, secs: i64) {
        self.now += secs * 1000;
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        decide(&self.r, &self.p, self.now).phase
    }

    /// The current reason.
    pub fn reason(&self) -> String {
        decide(&self.r, &self.p, self.now).reason
    }

    /// The active work id.
    pub fn work_id(&self) -> WorkId {
        self.r
            .work
            .active
            .as_ref()
            .expect("active work")
            .item
            .id
            .clone()
    }

    /// The last transition's effects.
    pub fn effects(&self) -> &[Effect] {
        &self.last.as_ref().expect("a step").effects
    }

    /// Fires the pending CI poll.
    pub fn fire_ci_poll(&mut self) -> Vec<String> {
        let poll = self.r.ci_poll.clone().expect("a CI poll");
        self.now = self.now.max(poll.due_ms);
        self.step(timer(TimerKind::CiPoll { sha: poll.sha }, poll.due_ms))
    }

    /// An opened human PR at head `a` (T0), with CI and reviews not yet read.
    pub fn opened() -> H {
        let mut h = H::new();
        h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
        h
    }

    /// An opened bot PR at head `a`.
    pub fn opened_bot() -> H {
        let mut h = H::new();
        h.step(pr_event(PrAction::Opened, bot_snap('a', T0), "bot"));
        h
    }
}

/// Lines for comparison.
pub(super) fn lines(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// Steps an issue record as the worker does when Forgejo answers: Shepherd's own read
/// of the issue's dependencies (asked before every dispatch) is answered at once with
/// none, as for an issue without dependencies, and the read and its recheck timer are
/// left out of the effects (`tests/issue_deps.rs` shows them).
pub(super) fn step_issue_answered(
    r: &crate::core::record::IssueRecord,
    e: &Event,
    now: i64,
    p: &Policy,
) -> super::IssueTransition {
    let mut t = super::step_issue(r, e, now, p);
    let asks = |x: &Effect| matches!(x.kind, EffectKind::Observe(ObserveWhat::Dependencies));
    if t.effects.iter().any(asks) {
        t.effects.retain(|x| {
            !asks(x)
                && !matches!(&x.kind, EffectKind::Schedule(tm) if tm.kind == TimerKind::DependencyRecheck)
        });
        let read = Event::ObservedDependencies {
            repo: t.record.repo.clone(),
            number: t.record.number,
            dependencies: Vec::new(),
            at_ms: now,
        };
        let answered = step_issue_answered(&t.record, &read, now, p);
        t.effects.extend(answered.effects);
        t.record = answered.record;
    }
    t
}
