//! The merge queue end to end in the pure core (issue 16): PR records (the real
//! `step`), their branch's queue (`core::queue::BranchQueue`) and a model of the
//! executor and of Forgejo that decides with the same pure functions as the real
//! executor (`head_action`, and `merge_blockers` over a record rebuilt from fresh
//! reads). Property: for any interleaving of readiness, CI results, pushes, base
//! moves, approvals given, withdrawn and dismissed by updates, redelivered effects and
//! events (restarts), every merge is of a head whose CI was green and that was built
//! on the branch tip at the moment of the merge, the merged head is the pinned one,
//! and at most one PR believes it is the queue's head (is being tested).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::super::queue::is_head;
use super::super::{merge_blockers, step};
use super::{login, repo};
use crate::core::effect::TimerKind;
use crate::core::effect::{EffectKind, ObserveWhat};
use crate::core::event::{
    CiContext, CiState, EffectOutcome, Event, MergeOutcome, PrAction, PrSnapshot, PrState,
    ReviewFact, ReviewState,
};
use crate::core::ids::{Scope, Sha};
use crate::core::policy::Policy;
use crate::core::queue::{BranchQueue, Ejection, HeadAction, HeadReading, head_action};
use crate::core::record::PrRecord;

/// PRs in the simulation.
const PRS: u64 = 3;

/// A sha from a counter.
fn sha_n(n: u64) -> Sha {
    format!("{n:040x}").parse().unwrap()
}

/// The policy: queue on, bot PRs need one approval.
fn queue_policy() -> Policy {
    Policy {
        bot_login: Some(login("bot")),
        merge_queue: true,
        merge_queue_max_updates: 2,
        ..Policy::default()
    }
}

/// One PR as Forgejo holds it.
#[derive(Debug, Clone)]
struct WorldPr {
    /// Head commit.
    head: Sha,
    /// The tip its head is built on (Forgejo's `merge_base`).
    base: Sha,
    /// State.
    state: PrState,
    /// The head bob approved (None: no approval, or dismissed).
    approved_on: Option<Sha>,
    /// A push changed the diff since the approval (Forgejo marks it stale; an update
    /// that merges the base in does not change the PR's diff).
    stale: bool,
    /// The branch it targets (`main`, or `dev` after a retarget).
    target: String,
}

/// Forgejo, the executor and the records.
struct Sim {
    /// Clock (ms).
    now: i64,
    /// Sha counter.
    next: u64,
    /// The branch tip.
    tip: Sha,
    /// PRs.
    prs: BTreeMap<u64, WorldPr>,
    /// CI of each commit: None pending, Some(green).
    ci: BTreeMap<Sha, Option<bool>>,
    /// Updates dismiss approvals (branch protection `dismiss_stale_approvals`).
    dismiss: bool,
    /// The records.
    records: BTreeMap<u64, PrRecord>,
    /// The queue of `main`.
    queue: BranchQueue,
    /// Events waiting for delivery (record, event).
    events: Vec<(u64, Event)>,
    /// Effects waiting for execution (record, effect kind).
    effects: Vec<(u64, EffectKind)>,
    /// Effects already executed (a restart may run one again).
    done: Vec<(u64, EffectKind)>,
    /// Timers (record, event).
    timers: Vec<(u64, Event)>,
    /// Merges made: (PR, head, tip before).
    merges: Vec<(u64, Sha)>,
    /// Updates made: (PR).
    updates: Vec<u64>,
    /// The policy.
    policy: Policy,
}

impl Sim {
    fn new(dismiss: bool) -> Sim {
        let mut s = Sim {
            now: 1_800_000_000_000,
            next: 1,
            tip: sha_n(0xba5e),
            prs: BTreeMap::new(),
            ci: BTreeMap::new(),
            dismiss,
            records: BTreeMap::new(),
            queue: BranchQueue::new("main"),
            events: Vec::new(),
            effects: Vec::new(),
            done: Vec::new(),
            timers: Vec::new(),
            merges: Vec::new(),
            updates: Vec::new(),
            policy: queue_policy(),
        };
        for n in 1..=PRS {
            let head = s.fresh();
            s.ci.insert(head.clone(), None);
            let tip = s.tip.clone();
            s.prs.insert(
                n,
                WorldPr {
                    head,
                    base: tip,
                    state: PrState::Open,
                    approved_on: None,
                    stale: false,
                    target: "main".into(),
                },
            );
            s.records.insert(n, PrRecord::new(repo(), n));
            let ev = s.webhook(n, PrAction::Opened, "bot");
            s.events.push((n, ev));
        }
        s
    }

    fn fresh(&mut self) -> Sha {
        self.next += 1;
        sha_n(self.next)
    }

    fn tick(&mut self) -> i64 {
        self.now += 1_000;
        self.now
    }

    fn snapshot(&self, n: u64) -> PrSnapshot {
        let w = &self.prs[&n];
        PrSnapshot {
            repo: repo(),
            number: n,
            state: w.state,
            draft: false,
            title: format!("PR {n}"),
            body: String::new(),
            author: Some(login("bot")),
            head_sha: Some(w.head.clone()),
            head_ref: format!("pr-{n}"),
            base_ref: w.target.clone(),
            labels: BTreeSet::new(),
            mergeable: Some(true),
            updated_ms: self.now,
            comments: None,
        }
    }

    fn webhook(&self, n: u64, action: PrAction, sender: &str) -> Event {
        Event::PullRequest {
            action,
            pr: self.snapshot(n),
            base_changed_from: None,
            sender: Some(login(sender)),
        }
    }

    fn contexts(&self, sha: &Sha) -> Vec<CiContext> {
        let state = match self.ci.get(sha).copied().flatten() {
            None => CiState::Pending,
            Some(true) => CiState::Success,
            Some(false) => CiState::Failure,
        };
        vec![CiContext {
            context: "ci / test".into(),
            state,
            description: String::new(),
            target_url: String::new(),
            updated_ms: self.now,
        }]
    }

    fn reviews(&self, n: u64) -> Vec<ReviewFact> {
        let w = &self.prs[&n];
        match &w.approved_on {
            Some(on) => vec![ReviewFact {
                id: 1,
                reviewer: login("bob"),
                state: ReviewState::Approved,
                body: String::new(),
                commit_id: on.to_string(),
                stale: w.stale,
                official: true,
                dismissed: false,
                submitted_ms: self.now,
            }],
            None => Vec::new(),
        }
    }

    /// Delivers an event to record `n`, collecting its effects.
    fn deliver(&mut self, n: u64, ev: &Event) {
        let now = self.tick();
        let t = step(&self.records[&n], ev, now, &self.policy);
        for e in t.effects {
            match e.kind {
                EffectKind::Schedule(timer) => self.timers.push((
                    n,
                    Event::TimerFired {
                        repo: repo(),
                        scope: Scope::Pr,
                        number: n,
                        timer,
                    },
                )),
                EffectKind::Dispatch(_)
                | EffectKind::CancelWork { .. }
                | EffectKind::AddLabels { .. }
                | EffectKind::RemoveLabels { .. }
                | EffectKind::UpsertComment { .. }
                | EffectKind::Comment { .. }
                | EffectKind::QueueFreeze(_) => {}
                EffectKind::Merge { .. } => panic!("a plain merge with the queue on"),
                kind @ (EffectKind::Queue(_)
                | EffectKind::QueueAdvance { .. }
                | EffectKind::Observe(_)) => self.effects.push((n, kind)),
            }
        }
        if let Some(p) = &t.record.queue.place {
            assert!(
                p.op_version >= t.record.queue.sent_version,
                "#{n} {ev:?} -> {:?} (before {:?})",
                t.record.queue,
                self.records[&n].queue
            );
        }
        self.records.insert(n, t.record);
    }

    fn outcome(&mut self, n: u64, outcome: EffectOutcome) {
        self.events.push((
            n,
            Event::EffectOutcome {
                repo: repo(),
                scope: Scope::Pr,
                number: n,
                effect_id: "x".parse().unwrap(),
                outcome,
            },
        ));
    }

    /// Runs one effect as the executor does.
    fn execute(&mut self, n: u64, kind: &EffectKind) {
        self.tick();
        match kind {
            EffectKind::Queue(op) => {
                let before = self.queue.clone();
                let changed = self.queue.apply(op, self.now);
                let notices = match changed {
                    true => {
                        self.queue.version += 1;
                        crate::core::queue::changed_places(&before, &self.queue)
                    }
                    false => self
                        .queue
                        .places()
                        .into_iter()
                        .filter(|(k, p)| *k == op.number || p.head)
                        .collect(),
                };
                for (k, place) in notices {
                    self.outcome(k, EffectOutcome::Queue(place));
                }
            }
            EffectKind::QueueAdvance {
                head_sha,
                may_update,
                ..
            } => {
                let out = self.advance(n, head_sha, *may_update);
                self.outcome(n, EffectOutcome::Merge(out));
            }
            EffectKind::Observe(what) => {
                let at = self.now;
                let ev = match what {
                    ObserveWhat::Pr => Event::ObservedPr {
                        pr: self.snapshot(n),
                    },
                    ObserveWhat::Reviews => Event::ObservedReviews {
                        repo: repo(),
                        number: n,
                        reviews: self.reviews(n),
                        at_ms: at,
                    },
                    ObserveWhat::CombinedStatus { sha } => Event::ObservedStatus {
                        repo: repo(),
                        number: n,
                        sha: sha.clone(),
                        contexts: self.contexts(sha),
                        at_ms: at,
                    },
                    ObserveWhat::Permission { .. }
                    | ObserveWhat::Legacy { .. }
                    | ObserveWhat::Dependencies => return,
                };
                self.events.push((n, ev));
            }
            other => panic!("not executed here: {other:?}"),
        }
    }

    /// `QueueAdvance`, as the executor decides it (same pure functions).
    fn advance(&mut self, n: u64, pinned: &Sha, may_update: bool) -> MergeOutcome {
        let w = self.prs[&n].clone();
        if w.state == PrState::Merged {
            return MergeOutcome::Merged;
        }
        if w.state != PrState::Open || w.head != *pinned {
            return MergeOutcome::HeadMoved;
        }
        if w.target != "main" {
            // As the executor: never updated or merged here; the record re-reads the
            // PR and leaves main's queue itself.
            return MergeOutcome::HeadMoved;
        }
        if self.queue.head != Some(n) {
            return MergeOutcome::LockBusy { retry_ms: 1_000 };
        }
        let reading = HeadReading {
            merged: false,
            open: true,
            head: w.head.clone(),
            pinned: pinned.clone(),
            merge_base: Some(w.base.clone()),
            tip: self.tip.clone(),
        };
        match head_action(&reading) {
            HeadAction::Merged => MergeOutcome::Merged,
            HeadAction::HeadMoved => MergeOutcome::HeadMoved,
            HeadAction::Update { .. } if !may_update => MergeOutcome::BaseMoved,
            HeadAction::Update { tip } => {
                assert_ne!(w.base, self.tip, "an update of a PR already on the tip");
                let head = self.fresh();
                self.ci.insert(head.clone(), None);
                let p = self.prs.get_mut(&n).unwrap();
                p.head = head;
                p.base = tip.clone();
                if self.dismiss {
                    p.approved_on = None;
                }
                self.updates.push(n);
                let ev = self.webhook(n, PrAction::Synchronized, "bot");
                self.events.push((n, ev));
                MergeOutcome::Updated {
                    onto: tip,
                    from: pinned.clone(),
                }
            }
            HeadAction::Merge { tip } => {
                // The executor's re-check: a record rebuilt from fresh reads.
                let observed = Event::ResyncObserved {
                    pr: self.snapshot(n),
                    contexts: self.contexts(pinned),
                    reviews: self.reviews(n),
                    at_ms: self.now,
                };
                let fresh = step(&PrRecord::new(repo(), n), &observed, self.now, &self.policy);
                let mut fresh = fresh.record;
                let stored = &self.records[&n];
                fresh.work.hold = stored.work.hold.clone();
                fresh.work.active = stored.work.active.clone();
                if !merge_blockers(&fresh, &self.policy, self.now).is_empty() {
                    return MergeOutcome::TryAgain;
                }
                // The guarantees, against Forgejo's truth at the moment of the merge.
                assert_eq!(
                    self.ci.get(pinned),
                    Some(&Some(true)),
                    "merge of a head whose CI is not green"
                );
                assert_eq!(w.base, self.tip, "merge of a head not built on the tip");
                assert_eq!(
                    w.target, "main",
                    "merge of a PR that targets another branch"
                );
                assert_eq!(tip, self.tip);
                self.merges.push((n, pinned.clone()));
                // Fast-forward: the tested head is the new tip.
                self.tip = pinned.clone();
                self.prs.get_mut(&n).unwrap().state = PrState::Merged;
                let ev = self.webhook(n, PrAction::Closed, "bot");
                self.events.push((n, ev));
                MergeOutcome::Merged
            }
        }
    }

    /// How many records believe they are the head.
    fn heads(&self) -> usize {
        self.records.values().filter(|r| is_head(r)).count()
    }
}

/// One thing that happens.
#[derive(Debug, Clone)]
enum Op {
    /// Deliver the i-th waiting event.
    Deliver(usize),
    /// Execute the i-th waiting effect.
    Execute(usize),
    /// A restart: run the i-th executed effect again.
    Rerun(usize),
    /// Fire the i-th timer.
    Fire(usize),
    /// CI finishes on a PR's head.
    Ci(u64, bool),
    /// Someone pushes to a PR.
    Push(u64),
    /// The branch moves (a push to main by someone else).
    BaseMoves,
    /// bob approves the head.
    Approve(u64),
    /// bob's approval goes away.
    Withdraw(u64),
    /// The PR is retargeted to `dev` (its `edited` webhook is sent).
    Retarget(u64),
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => any::<usize>().prop_map(Op::Deliver),
        12 => any::<usize>().prop_map(Op::Execute),
        1 => any::<usize>().prop_map(Op::Rerun),
        2 => any::<usize>().prop_map(Op::Fire),
        4 => (1..=PRS, prop::bool::weighted(0.8)).prop_map(|(n, g)| Op::Ci(n, g)),
        1 => (1..=PRS).prop_map(Op::Push),
        1 => Just(Op::BaseMoves),
        3 => (1..=PRS).prop_map(Op::Approve),
        1 => (1..=PRS).prop_map(Op::Withdraw),
        1 => (1..=PRS).prop_map(Op::Retarget),
    ]
}

/// Runs one op.
fn run(s: &mut Sim, op: &Op) {
    match op {
        Op::Deliver(i) if !s.events.is_empty() => {
            let (n, ev) = s.events.remove(i % s.events.len());
            s.deliver(n, &ev);
        }
        Op::Execute(i) if !s.effects.is_empty() => {
            let (n, kind) = s.effects.remove(i % s.effects.len());
            s.execute(n, &kind);
            s.done.push((n, kind));
        }
        Op::Rerun(i) if !s.done.is_empty() => {
            let (n, kind) = s.done[i % s.done.len()].clone();
            s.execute(n, &kind);
        }
        Op::Fire(i) if !s.timers.is_empty() => {
            let (n, ev) = s.timers.remove(i % s.timers.len());
            if let Event::TimerFired { timer, .. } = &ev {
                s.now = s.now.max(timer.due_ms);
            }
            s.deliver(n, &ev);
        }
        Op::Ci(n, green) => {
            let head = s.prs[n].head.clone();
            if s.ci.get(&head) == Some(&None) {
                s.ci.insert(head.clone(), Some(*green));
                let at = s.tick();
                let ev = Event::ObservedStatus {
                    repo: repo(),
                    number: *n,
                    sha: head.clone(),
                    contexts: s.contexts(&head),
                    at_ms: at,
                };
                s.events.push((*n, ev));
            }
        }
        Op::Push(n) if s.prs[n].state == PrState::Open => {
            let head = s.fresh();
            s.ci.insert(head.clone(), None);
            let p = s.prs.get_mut(n).unwrap();
            p.head = head;
            p.stale = p.approved_on.is_some();
            s.tick();
            let ev = s.webhook(*n, PrAction::Synchronized, "alice");
            s.events.push((*n, ev));
        }
        Op::BaseMoves => {
            s.tip = s.fresh();
            for n in 1..=PRS {
                let ev = Event::Push {
                    repo: repo(),
                    branch: "main".into(),
                    after: Some(s.tip.clone()),
                    sender: Some(login("carol")),
                };
                s.events.push((n, ev));
            }
        }
        Op::Approve(n) if s.prs[n].state == PrState::Open => {
            let head = s.prs[n].head.clone();
            let p = s.prs.get_mut(n).unwrap();
            p.approved_on = Some(head);
            p.stale = false;
            let ev = Event::ObservedReviews {
                repo: repo(),
                number: *n,
                reviews: s.reviews(*n),
                at_ms: s.tick(),
            };
            s.events.push((*n, ev));
        }
        Op::Withdraw(n) => {
            s.prs.get_mut(n).unwrap().approved_on = None;
            let ev = Event::ObservedReviews {
                repo: repo(),
                number: *n,
                reviews: s.reviews(*n),
                at_ms: s.tick(),
            };
            s.events.push((*n, ev));
        }
        Op::Retarget(n) if s.prs[n].state == PrState::Open => {
            s.prs.get_mut(n).unwrap().target = "dev".into();
            s.tick();
            let ev = s.webhook(*n, PrAction::Edited, "alice");
            s.events.push((*n, ev));
        }
        Op::Deliver(_)
        | Op::Execute(_)
        | Op::Rerun(_)
        | Op::Fire(_)
        | Op::Push(_)
        | Op::Approve(_)
        | Op::Retarget(_) => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn merges_only_tested_heads_on_the_tip_one_head_at_a_time(
        dismiss in any::<bool>(),
        ops in prop::collection::vec(arb_op(), 0..500),
    ) {
        let mut s = Sim::new(dismiss);
        for op in &ops {
            run(&mut s, op);
            prop_assert!(
                s.heads() <= 1,
                "two PRs believe they are the queue's head after {op:?}: {:#?} {:#?}",
                s.records.values().map(|r| (&r.queue, &r.merge, r.pr.as_ref().map(|p| p.state))).collect::<Vec<_>>(),
                s.queue
            );
            let merged: BTreeSet<u64> = s.merges.iter().map(|(n, _)| *n).collect();
            prop_assert_eq!(merged.len(), s.merges.len(), "a PR merged twice");
        }
    }
}

/// Without randomness: three approved, green PRs merge one after the other, each
/// updated onto the tip the previous merge made, and nothing is left waiting.
#[test]
fn three_ready_prs_merge_in_order_each_tested_on_the_tip() {
    let mut s = Sim::new(false);
    for n in 1..=PRS {
        run(&mut s, &Op::Approve(n));
        run(&mut s, &Op::Ci(n, true));
    }
    for _ in 0..2_000 {
        // Drain events and effects in order; finish CI on every new head.
        if !s.events.is_empty() {
            run(&mut s, &Op::Deliver(0));
        } else if !s.effects.is_empty() {
            run(&mut s, &Op::Execute(0));
        } else {
            let pending: Vec<u64> = (1..=PRS)
                .filter(|n| {
                    s.prs[n].state == PrState::Open && s.ci.get(&s.prs[n].head) == Some(&None)
                })
                .collect();
            if pending.is_empty() && s.timers.is_empty() {
                break;
            }
            for n in pending {
                run(&mut s, &Op::Ci(n, true));
            }
            if s.events.is_empty() && !s.timers.is_empty() {
                run(&mut s, &Op::Fire(0));
            }
        }
        assert!(s.heads() <= 1);
    }
    let order: Vec<u64> = s.merges.iter().map(|(n, _)| *n).collect();
    assert_eq!(order, vec![1, 2, 3]);
    // The first was on the tip already; the others were updated once each.
    assert_eq!(s.updates, vec![2, 3]);
    assert_eq!(s.tip, s.merges[2].1);
    assert!(s.queue.entries.is_empty());
    assert_eq!(s.queue.stats.merged, 3);
}

impl Sim {
    /// Drains events and effects in order, finishing CI green on every new head of a
    /// PR not in `stuck` (whose CI never settles); fires no timer.
    fn settle(&mut self, stuck: &BTreeSet<u64>) {
        for _ in 0..2_000 {
            if !self.events.is_empty() {
                run(self, &Op::Deliver(0));
            } else if !self.effects.is_empty() {
                run(self, &Op::Execute(0));
            } else {
                let pending: Vec<u64> = (1..=PRS)
                    .filter(|n| {
                        !stuck.contains(n)
                            && self.prs[n].state == PrState::Open
                            && self.ci.get(&self.prs[n].head) == Some(&None)
                    })
                    .collect();
                if pending.is_empty() {
                    return;
                }
                for n in pending {
                    run(self, &Op::Ci(n, true));
                }
            }
            assert!(self.heads() <= 1);
        }
    }

    /// Fires the queue-ci timers that are due (the clock moves to them).
    fn fire_queue_ci(&mut self) -> usize {
        let (due, rest): (Vec<_>, Vec<_>) = self.timers.drain(..).partition(|(_, ev)| {
            matches!(ev, Event::TimerFired { timer, .. } if timer.kind == TimerKind::QueueCi)
        });
        self.timers = rest;
        let n = due.len();
        for (k, ev) in due {
            if let Event::TimerFired { timer, .. } = &ev {
                self.now = self.now.max(timer.due_ms);
            }
            self.deliver(k, &ev);
        }
        n
    }
}

/// Issue 26: the queue's head whose CI never settles is ejected after
/// `merge_queue_ci_timeout_secs` (`ci-timeout`), the next PR is tested and merged,
/// and the ejected one re-enters at its place once its CI settles.
#[test]
fn a_head_whose_ci_never_settles_is_ejected_after_the_timeout() {
    let mut s = Sim::new(false);
    for n in 1..=PRS {
        run(&mut s, &Op::Approve(n));
        run(&mut s, &Op::Ci(n, true));
    }
    // #1 merges (on the tip already); #2 is updated onto the new tip and its CI on
    // the new head never finishes.
    let stuck = BTreeSet::from([2]);
    s.settle(&stuck);
    assert_eq!(s.merges.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [1]);
    assert_eq!(s.queue.head, Some(2), "#2 is tested, waiting for CI");
    assert!(s.records[&2].queue.ci_wait.is_some());
    // The timer: #2 parks (ci-timeout); #3 is tested and merged.
    assert!(s.fire_queue_ci() >= 1);
    s.settle(&stuck);
    let parked = s
        .queue
        .entries
        .iter()
        .find(|e| e.number == 2)
        .map(|e| e.parked);
    assert_eq!(parked, Some(Some(Ejection::CiTimeout)), "{:#?}", s.queue);
    assert_eq!(s.queue.stats.ejections.get(&Ejection::CiTimeout), Some(&1));
    assert_eq!(s.merges.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [1, 3]);
    let m = s.records[&2].queue.membership.clone().unwrap();
    assert_eq!(m.parked, Some(Ejection::CiTimeout));
    // Its CI settles at last: it re-enters, is updated onto the new tip, merges.
    s.settle(&BTreeSet::new());
    assert_eq!(
        s.merges.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        [1, 3, 2]
    );
    assert!(s.queue.entries.is_empty());
}

/// A timer of a head whose CI settled in time does nothing.
#[test]
fn a_queue_ci_timer_after_ci_settled_does_nothing() {
    let mut s = Sim::new(false);
    for n in 1..=PRS {
        run(&mut s, &Op::Approve(n));
        run(&mut s, &Op::Ci(n, true));
    }
    s.settle(&BTreeSet::new());
    assert_eq!(s.merges.len(), 3);
    let before = s.records.clone();
    s.fire_queue_ci();
    for (n, r) in &s.records {
        assert_eq!(r.queue, before[n].queue, "#{n}");
    }
    assert_eq!(s.queue.stats.ejections.get(&Ejection::CiTimeout), None);
}

/// Issue 26: a head retargeted to another branch (its webhook lost) is never merged
/// through this branch's queue: the advance refuses it (`HeadMoved`), its record
/// re-reads the PR and leaves the queue (`retargeted`), and the next PR is tested.
#[test]
fn the_advance_leaves_a_retargeted_pr_out_of_the_queue() {
    let mut s = Sim::new(false);
    for n in 1..=PRS {
        run(&mut s, &Op::Approve(n));
        run(&mut s, &Op::Ci(n, true));
    }
    // Drain until #1 asks to advance, then retarget it behind the record's back (its
    // webhook is lost).
    for _ in 0..500 {
        let asked = s
            .effects
            .iter()
            .any(|(n, k)| *n == 1 && matches!(k, EffectKind::QueueAdvance { .. }));
        if asked {
            break;
        }
        if !s.events.is_empty() {
            run(&mut s, &Op::Deliver(0));
        } else {
            run(&mut s, &Op::Execute(0));
        }
    }
    assert_eq!(s.queue.head, Some(1));
    s.prs.get_mut(&1).unwrap().target = "dev".into();
    s.settle(&BTreeSet::new());
    let merged: Vec<u64> = s.merges.iter().map(|(n, _)| *n).collect();
    assert_eq!(merged, [2, 3], "#1 is not merged into main");
    assert!(
        s.queue.entries.iter().all(|e| e.number != 1),
        "{:#?}",
        s.queue
    );
    // The record left main's queue too (it may wait for `dev`'s now).
    let member = s.records[&1].queue.membership.as_ref();
    assert!(member.is_none_or(|m| m.branch == "dev"), "{member:?}");
    assert_eq!(s.prs[&1].state, PrState::Open);
}
