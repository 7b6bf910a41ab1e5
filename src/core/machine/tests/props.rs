//! Property tests over random event sequences (issue 3): merge safety, one active
//! work item, tiers never go down, idempotence under duplicates and replays,
//! convergence under permuted observations, no work on closed PRs, no work started
//! by the bot's own events.

use proptest::prelude::*;

use super::*;
use crate::core::command::Command;
use crate::core::event::{Permission, RunOutcome};
use crate::core::policy::MergeMode;
use crate::core::record::ConflictFact;

/// Heads a sequence moves between.
const HEADS: [char; 3] = ['a', 'b', 'c'];
/// Reviewers.
const REVIEWERS: [&str; 3] = ["bob", "carol", "dave"];

/// An abstract step, made concrete against the record when it runs.
#[derive(Debug, Clone)]
pub(super) enum Op {
    /// A PR snapshot (webhook or API read).
    Snapshot {
        /// Head index.
        head: usize,
        /// Bot PR (marker in body).
        bot_pr: bool,
        /// WIP.
        draft: bool,
        /// `mergeable`.
        mergeable: Option<bool>,
        /// 0..=17 open, 18 closed, 19 merged.
        state: u8,
        /// Sent by the bot user.
        by_bot: bool,
        /// Needs-human label present.
        nh_label: bool,
        /// An API read instead of a webhook.
        observed: bool,
    },
    /// A combined-status read.
    Status {
        /// Head index.
        head: usize,
        /// States of `ci / test` and `lint` (None: not reported).
        states: [Option<u8>; 2],
        /// Description variant.
        desc: u8,
    },
    /// A reviews read.
    Reviews(Vec<(usize, u8, usize, bool, bool)>),
    /// The active item's result (or a stray one).
    Result(u8),
    /// A timer (kind index).
    Timer(u8),
    /// A merge outcome (variant index).
    MergeOutcome(u8),
    /// A command (command index, sender index).
    Comment(u8, u8),
    /// mallory's permission read (write or read).
    Permission(bool),
    /// A review webhook.
    Hint,
    /// An Actions run on a head.
    ActionRun(usize),
    /// A push to main (true) or another branch.
    Push(bool),
    /// Time passes (seconds).
    Wait(u16),
    /// Green CI on the current head (steers sequences towards merges).
    Green,
    /// bob and carol approve the current head.
    Approve,
}

/// Strategy for one op.
pub(super) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, any::<bool>(), prop::bool::weighted(0.1), prop::option::of(prop::bool::weighted(0.8)), 0..20u8, prop::bool::weighted(0.3), prop::bool::weighted(0.2), any::<bool>())
            .prop_map(|(head, bot_pr, draft, mergeable, state, by_bot, nh_label, observed)| Op::Snapshot { head, bot_pr, draft, mergeable, state, by_bot, nh_label, observed }),
        4 => (0..3usize, [prop::option::of(0..3u8), prop::option::of(0..3u8)], 0..3u8)
            .prop_map(|(head, states, desc)| Op::Status { head, states, desc }),
        3 => prop::collection::vec((0..3usize, 0..3u8, 0..3usize, prop::bool::weighted(0.15), prop::bool::weighted(0.1)), 0..4).prop_map(Op::Reviews),
        3 => (0..4u8).prop_map(Op::Result),
        3 => (0..6u8).prop_map(Op::Timer),
        2 => (0..6u8).prop_map(Op::MergeOutcome),
        1 => (0..5u8, 0..3u8).prop_map(|(c, s)| Op::Comment(c, s)),
        1 => any::<bool>().prop_map(Op::Permission),
        1 => Just(Op::Hint),
        1 => (0..3usize).prop_map(Op::ActionRun),
        1 => any::<bool>().prop_map(Op::Push),
        2 => (0..900u16).prop_map(Op::Wait),
        3 => Just(Op::Green),
        3 => Just(Op::Approve),
    ]
}

/// The policy properties run under.
pub(super) fn prop_policy(dispatch_mode: bool) -> Policy {
    Policy {
        trusted_users: vec!["alice".into()],
        merge_mode: if dispatch_mode {
            MergeMode::Dispatch
        } else {
            MergeMode::Auto
        },
        ..policy()
    }
}

/// Counter for unique ids in one run.
pub(super) struct Ids(pub(super) i64);

/// Makes `op` concrete against the record; may move the clock.
pub(super) fn concrete(op: &Op, r: &PrRecord, now: &mut i64, ids: &mut Ids) -> Option<Event> {
    ids.0 += 1;
    *now += 1000;
    let head_of = |i: usize| HEADS[i];
    Some(match op {
        Op::Snapshot {
            head,
            bot_pr,
            draft,
            mergeable,
            state,
            by_bot,
            nh_label,
            observed,
        } => {
            let base = if *bot_pr {
                bot_snap(head_of(*head), *now)
            } else {
                snap(head_of(*head), *now)
            };
            let mut labels = BTreeSet::new();
            if *nh_label {
                labels.insert("needs feedback".to_owned());
            }
            let pr = PrSnapshot {
                draft: *draft,
                mergeable: *mergeable,
                state: match state {
                    18 => PrState::Closed,
                    19 => PrState::Merged,
                    _ => PrState::Open,
                },
                labels,
                ..base
            };
            if *observed {
                Event::ObservedPr { pr }
            } else {
                let action = if r.head_sha() != pr.head_sha.as_ref() {
                    PrAction::Synchronized
                } else {
                    PrAction::Labeled
                };
                pr_event(action, pr, if *by_bot { "bot" } else { "alice" })
            }
        }
        Op::Status { head, states, desc } => {
            let d = ["Failing after 1m2s", "Failing after 7s", "exit code 2"][usize::from(*desc)];
            let st = |s: u8| [CiState::Success, CiState::Failure, CiState::Pending][usize::from(s)];
            let mut cs: Vec<(&str, CiState, &str)> = Vec::new();
            if let Some(s) = states[0] {
                cs.push(("ci / test", st(s), d));
            }
            if let Some(s) = states[1] {
                cs.push(("lint", st(s), "lint"));
            }
            status(head_of(*head), &cs, *now)
        }
        Op::Reviews(list) => {
            let reviews = list
                .iter()
                .enumerate()
                .map(|(i, (who, state, head, stale, dismissed))| ReviewFact {
                    id: ids.0 * 10 + i64::try_from(i).unwrap(),
                    reviewer: login(REVIEWERS[*who]),
                    state: [
                        ReviewState::Approved,
                        ReviewState::RequestChanges,
                        ReviewState::Comment,
                    ][usize::from(*state)],
                    body: String::new(),
                    commit_id: sha(head_of(*head)).to_string(),
                    stale: *stale,
                    official: true,
                    dismissed: *dismissed,
                    submitted_ms: *now - 100 + i64::try_from(i).unwrap(),
                })
                .collect();
            Event::ObservedReviews {
                repo: repo(),
                number: PR,
                reviews,
                at_ms: *now,
            }
        }
        Op::Result(o) => {
            let outcome = [
                WorkOutcome::Succeeded,
                WorkOutcome::Failed,
                WorkOutcome::NoChanges,
                WorkOutcome::Transient,
            ][usize::from(*o)];
            let id = r
                .work
                .active
                .as_ref()
                .map(|a| a.item.id.clone())
                .unwrap_or_else(|| WorkId::new(&repo(), Scope::Pr, PR, u64::from(*o) + 1));
            result(&id, outcome)
        }
        Op::Timer(k) => match k {
            0 => {
                let poll = r.ci_poll.clone()?;
                *now = (*now).max(poll.due_ms);
                timer(TimerKind::CiPoll { sha: poll.sha }, poll.due_ms)
            }
            1 => {
                let a = r.work.active.clone()?;
                *now = (*now).max(a.expires_ms);
                timer(TimerKind::ClaimExpiry { work_id: a.item.id }, a.expires_ms)
            }
            2 => {
                *now += 60_000;
                timer(TimerKind::MergeRetry, *now)
            }
            3 => timer(TimerKind::Mergeability, *now),
            4 => {
                let at = r.work.transient.as_ref()?.retry_at_ms?;
                *now = (*now).max(at);
                timer(TimerKind::TransientRetry, at)
            }
            _ => {
                *now += 86_400_000;
                timer(TimerKind::StaleCheck, *now)
            }
        },
        Op::MergeOutcome(o) => merged(match o {
            0 => MergeOutcome::Merged,
            1 => MergeOutcome::Conflict,
            2 => MergeOutcome::HeadMoved,
            3 => MergeOutcome::TryAgain,
            4 => MergeOutcome::LockBusy { retry_ms: 5_200 },
            _ => MergeOutcome::FailedPermanent {
                message: "protected".into(),
            },
        }),
        Op::Comment(c, s) => {
            let cmd = ["retry", "escalate", "pause", "resume", "status"][usize::from(*c)];
            comment(
                ids.0,
                &format!("/shepherd {cmd}"),
                ["alice", "mallory", "bot"][usize::from(*s)],
            )
        }
        Op::Permission(write) => Event::ObservedPermission {
            repo: repo(),
            scope: Scope::Pr,
            number: PR,
            login: login("mallory"),
            permission: if *write {
                Permission::Write
            } else {
                Permission::Read
            },
            at_ms: *now,
        },
        Op::Hint => review_hint(r.pr.clone().unwrap_or_else(|| snap('a', 0)), "carol"),
        Op::ActionRun(h) => Event::ActionRun {
            repo: repo(),
            sha: sha(head_of(*h)),
            pr_number: None,
            outcome: RunOutcome::Failure,
            sender: Some(login("alice")),
        },
        Op::Push(main) => Event::Push {
            repo: repo(),
            branch: if *main { "main".into() } else { "dev".into() },
            after: Some(sha('e')),
            sender: Some(login("alice")),
        },
        Op::Green => {
            let head = r.head_sha()?.as_str().chars().next()?;
            let ok = [
                ("ci / test", CiState::Success, "ok"),
                ("lint", CiState::Success, "ok"),
            ];
            status(head, &ok, *now)
        }
        Op::Approve => {
            let head = r.head_sha()?.as_str().chars().next()?;
            reviews(
                &[
                    ("bob", ReviewState::Approved, head),
                    ("carol", ReviewState::Approved, head),
                ],
                *now,
            )
        }
        Op::Wait(s) => {
            *now += i64::from(*s) * 1000;
            return None;
        }
    })
}

/// The record with its version zeroed and the status comment key dropped (what
/// idempotence compares).
fn modulo_version(r: &PrRecord) -> PrRecord {
    PrRecord {
        version: 0,
        ..r.clone()
    }
}

/// The facts alone (what replays and permutations must agree on).
fn facts(r: &PrRecord) -> (Option<PrSnapshot>, String, Option<String>) {
    (
        r.pr.clone(),
        serde_json::to_string(&r.ci).unwrap(),
        serde_json::to_string(&r.reviews).ok(),
    )
}

/// Independent check of DESIGN §2.4 for a merge of `pinned` on record `r`. The
/// approvals counted are the last reviews read's plus, in merge mode `auto`, the
/// approval webhooks since (issue 17): such a `Merge` is an attempt the executor's
/// re-check confirms on fresh reads (PR, status, reviews) before any merge call.
fn merge_is_safe(r: &PrRecord, p: &Policy, pinned: &Sha) -> Result<(), String> {
    let pr = r.pr.as_ref().ok_or("no PR")?;
    if pr.state != PrState::Open || pr.draft {
        return Err("not open or draft".into());
    }
    if r.work.hold.is_some() || r.work.active.is_some() {
        return Err("held or work active".into());
    }
    if r.conflict == ConflictFact::Conflicting {
        return Err("conflict".into());
    }
    if pr.head_sha.as_ref() != Some(pinned) {
        return Err("pinned sha is not the head".into());
    }
    let ci = r.ci.get(pinned).ok_or("no CI for head")?;
    if ci.contexts.is_empty() || ci.contexts.values().any(|c| c.state != CiState::Success) {
        return Err("CI not green".into());
    }
    let latest = r
        .reviews
        .as_ref()
        .map(|v| v.latest.clone())
        .unwrap_or_default();
    let counts = |v: &crate::core::event::ReviewFact| {
        v.state == ReviewState::Approved && v.official && !v.stale && !v.dismissed
    };
    let read = latest.values().filter(|v| counts(v)).count();
    let hinted = match p.merge_mode {
        MergeMode::Auto => r
            .approval_hints
            .keys()
            .filter(|who| !latest.get(*who).is_some_and(counts))
            .count(),
        MergeMode::Dispatch => 0,
    };
    let approvals = read + hinted;
    let blocked = latest
        .values()
        .any(|v| v.state == ReviewState::RequestChanges && v.official && !v.dismissed);
    let bot = pr.author.as_ref().is_some_and(|a| p.is_bot_author(a))
        && (!p.require_bot_marker || pr.body.contains(&p.bot_marker));
    let need = if bot {
        p.approvals_bot
    } else {
        p.approvals_human
    };
    if blocked || approvals < need as usize {
        return Err(format!("approvals {approvals}/{need}, blocked {blocked}"));
    }
    Ok(())
}

/// One concrete step of a run.
struct Stepped {
    /// The event.
    event: Event,
    /// When.
    now: i64,
}

/// Runs `ops`, checking every per-step invariant; returns the final record and the
/// concrete events.
fn run(ops: &[Op], p: &Policy) -> Result<(PrRecord, Vec<Stepped>), TestCaseError> {
    let mut r = PrRecord::new(repo(), PR);
    let mut now = T0;
    let mut ids = Ids(0);
    let mut trail = Vec::new();
    let mut max_dispatched_tier = 0u8;
    let first = pr_event(PrAction::Opened, snap('a', T0), "alice");
    let mut pending = vec![Some(first)];
    for op in ops {
        pending.push(concrete(op, &r, &mut now, &mut ids));
        for event in pending.drain(..).flatten() {
            let t = step(&r, &event, now, p);
            check_effects(&t, p);
            let dispatches: Vec<_> = t
                .effects
                .iter()
                .filter_map(|e| match &e.kind {
                    EffectKind::Dispatch(w) => Some(w.clone()),
                    _ => None,
                })
                .collect();
            prop_assert!(dispatches.len() <= 1, "two dispatches in one step");
            if let Some(w) = dispatches.first() {
                if let Some(before) = &r.work.active {
                    prop_assert!(
                        t.record
                            .work
                            .attempts
                            .iter()
                            .any(|a| a.work_id == before.item.id),
                        "dispatch while {} still active",
                        before.item.id
                    );
                }
                prop_assert_eq!(
                    t.record.work.active.as_ref().map(|a| &a.item.id),
                    Some(&w.id)
                );
                prop_assert!(
                    w.tier >= max_dispatched_tier && w.tier >= r.work.tier,
                    "tier went down"
                );
                max_dispatched_tier = w.tier;
                prop_assert!(!p.is_bot(event.sender()), "the bot's event started work");
            }
            prop_assert!(t.record.work.tier >= r.work.tier, "record tier went down");
            let claimed = t.record.work.labels_applied.contains(&p.label_claimed);
            // A transient failure's back-off keeps the claim (issue 27).
            let backoff = t
                .record
                .work
                .transient
                .as_ref()
                .is_some_and(|b| b.retry_at_ms.is_some());
            prop_assert_eq!(
                claimed,
                (t.record.work.active.is_some() || backoff) && t.record.is_open(),
                "claim label out of step"
            );
            let open = t.record.is_open();
            for e in &t.effects {
                match &e.kind {
                    EffectKind::Merge { head_sha, .. } => {
                        prop_assert!(open, "merge of a closed PR");
                        if let Err(why) = merge_is_safe(&t.record, p, head_sha) {
                            return Err(TestCaseError::fail(format!(
                                "unsafe merge: {why}\n{:#?}",
                                t.record
                            )));
                        }
                    }
                    EffectKind::Dispatch(_) => prop_assert!(open, "work on a closed PR"),
                    _ => {}
                }
            }
            // The same event again changes nothing in the record.
            let again = step(&t.record, &event, now, p);
            prop_assert_eq!(
                modulo_version(&again.record),
                modulo_version(&t.record),
                "not idempotent: {}",
                event.name()
            );
            r = t.record;
            trail.push(Stepped { event, now });
        }
    }
    Ok((r, trail))
}

/// Replays concrete events (with their times) from a fresh record.
fn replay(steps: &[Stepped], p: &Policy, from: PrRecord, twice_each: bool) -> PrRecord {
    let mut r = from;
    for s in steps {
        let reps = if twice_each { 2 } else { 1 };
        for _ in 0..reps {
            r = step(&r, &s.event, s.now, p).record;
        }
    }
    r
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Merge safety, one active item, monotone tiers, no work on closed PRs or from
    /// the bot, per-event idempotence (checked inside `run`).
    #[test]
    fn invariants_hold_on_random_sequences(ops in prop::collection::vec(op(), 1..60), dispatch_mode in prop::bool::weighted(0.2)) {
        let p = prop_policy(dispatch_mode);
        run(&ops, &p)?;
    }

    /// With short-lived statuses left to settle (issue 17), every invariant above still
    /// holds, and the status comment ends with the phase the machine decides: once the
    /// settle timer has fired, the last status asked for is the decided phase, so a
    /// skipped edit never loses the final text.
    #[test]
    fn the_status_comment_ends_with_the_decided_phase(ops in prop::collection::vec(op(), 1..60), dispatch_mode in prop::bool::weighted(0.2)) {
        let p = Policy { status_settle_secs: 10, ..prop_policy(dispatch_mode) };
        let (mut r, trail) = run(&ops, &p)?;
        let mut now = trail.last().map_or(T0, |s| s.now);
        // The settle timer fires when due (it re-arms itself if it came early).
        for _ in 0..2 {
            if let Some(since) = r.status_pending_since_ms {
                let due = since + 10_000;
                now = now.max(due);
                let t = step(&r, &timer(TimerKind::StatusSettle, due), now, &p);
                check_effects(&t, &p);
                r = t.record;
            }
        }
        prop_assert_eq!(r.status_pending_since_ms, None);
        let key: serde_json::Value = serde_json::from_str(r.status_comment.as_deref().unwrap_or("[null]")).unwrap();
        let decided = crate::core::machine::decide(&r, &p, now).phase;
        prop_assert_eq!(key[0].as_str(), Some(decided.as_str()), "{:#?}", r);
    }

    /// Each event delivered twice gives the same record; the whole sequence replayed
    /// again gives the same facts.
    #[test]
    fn duplicates_and_replays_converge(ops in prop::collection::vec(op(), 1..40)) {
        let p = prop_policy(false);
        let (once, trail) = run(&ops, &p)?;
        let doubled = replay(&trail, &p, PrRecord::new(repo(), PR), true);
        prop_assert_eq!(modulo_version(&doubled), modulo_version(&once));
        let again = replay(&trail, &p, once.clone(), false);
        prop_assert_eq!(facts(&again), facts(&once));
    }

    /// Observations applied in any order give the same facts.
    #[test]
    fn permuted_observations_converge(
        obs in prop::collection::vec((0..3u8, 0..3usize, 0..3u8, any::<bool>()), 1..12),
        seed in any::<u64>(),
    ) {
        let p = prop_policy(false);
        let events: Vec<Event> = obs.iter().enumerate().map(|(i, (kind, head, st, flag))| {
            let t = T0 + 1000 * i64::try_from(i).unwrap();
            let h = HEADS[*head];
            let state = [CiState::Success, CiState::Failure, CiState::Pending][usize::from(*st)];
            match kind {
                0 => Event::ObservedPr { pr: PrSnapshot { mergeable: Some(*flag), ..snap(h, t) } },
                1 => status(h, &[("ci / test", state, "d")], t),
                _ => reviews(&[(if *flag { "bob" } else { "carol" }, [ReviewState::Approved, ReviewState::RequestChanges, ReviewState::Comment][usize::from(*st)], h)], t),
            }
        }).collect();
        let mut shuffled = events.clone();
        let mut s = seed;
        for i in (1..shuffled.len()).rev() {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            shuffled.swap(i, usize::try_from(s >> 33).unwrap() % (i + 1));
        }
        let apply = |evs: &[Event]| {
            let mut r = PrRecord::new(repo(), PR);
            for e in evs {
                r = step(&r, e, T0 + 100_000, &p).record;
            }
            r
        };
        prop_assert_eq!(facts(&apply(&events)), facts(&apply(&shuffled)));
    }

    /// Commands are only ever parsed from their own lines.
    #[test]
    fn quoted_commands_never_parse(cmd in "(retry|pause|resume|escalate|status)") {
        let body = format!("> /shepherd {cmd}\n```\n/shepherd {cmd}\n```");
        prop_assert_eq!(crate::core::command::parse(&body), Vec::<Command>::new());
    }
}

/// The generator reaches the interesting states (otherwise the properties above would
/// hold vacuously).
#[test]
fn generator_reaches_merges_dispatches_and_holds() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut merges, mut dispatches, mut holds) = (0, 0, 0);
    let p = prop_policy(false);
    for _ in 0..150 {
        let ops = prop::collection::vec(op(), 1..60)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let (r, trail) = run(&ops, &p).unwrap();
        let mut rr = PrRecord::new(repo(), PR);
        for s in &trail {
            let t = step(&rr, &s.event, s.now, &p);
            for e in &t.effects {
                match e.kind {
                    EffectKind::Merge { .. } => merges += 1,
                    EffectKind::Dispatch(_) => dispatches += 1,
                    _ => {}
                }
            }
            rr = t.record;
        }
        holds += usize::from(r.work.hold.is_some());
    }
    assert!(
        merges >= 10 && dispatches >= 50 && holds >= 3,
        "merges {merges} dispatches {dispatches} holds {holds}"
    );
}
