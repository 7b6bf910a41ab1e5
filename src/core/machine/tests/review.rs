//! Reviewer agents (`review` work): dispatch once per head, rounds bounded by
//! `max_review_rounds`, approvals counted by policy, a human's change request always
//! blocking, the reviewer's claim apart from the implementer's, escalation of the same
//! change request coming back. Table tests, then a property test of the invariants.

use proptest::prelude::*;

use super::*;
use crate::core::effect::WorkKind;
use crate::core::machine::merge_blockers;
use crate::core::policy::AgentScope;
use crate::core::record::ReviewVerdict;

/// The default policy with one reviewer agent, `rev`.
fn rpolicy() -> Policy {
    Policy {
        reviewer_logins: vec!["rev".into()],
        ..policy()
    }
}

/// A reviews read of (reviewer, state, head, body) with ids from `first_id`.
fn reviews_with(list: &[(&str, ReviewState, char, &str)], first_id: i64, at: i64) -> Event {
    Event::ObservedReviews {
        repo: repo(),
        number: PR,
        reviews: list
            .iter()
            .enumerate()
            .map(|(i, (who, state, head, body))| {
                let i = i64::try_from(i).unwrap();
                ReviewFact {
                    id: first_id + i,
                    reviewer: login(who),
                    state: *state,
                    body: (*body).into(),
                    commit_id: sha(*head).to_string(),
                    stale: false,
                    official: true,
                    dismissed: false,
                    submitted_ms: at - 1000 + i,
                }
            })
            .collect(),
        at_ms: at,
    }
}

/// CI green on `head`.
fn green(head: char, at: i64) -> Event {
    status(head, &[("ci / test", CiState::Success, "ok")], at)
}

/// The dispatched work items of the last step.
fn dispatched(h: &H) -> Vec<crate::core::effect::WorkItem> {
    h.effects()
        .iter()
        .filter_map(|e| match &e.kind {
            EffectKind::Dispatch(w) => Some(w.clone()),
            _ => None,
        })
        .collect()
}

/// An opened bot PR at `a` under `p`, CI green: the first review is dispatched.
fn bot_pr_green(p: Policy) -> H {
    let mut h = H::with(p);
    h.step(pr_event(PrAction::Opened, bot_snap('a', T0), "bot"));
    h.later(10);
    h.step(green('a', h.now));
    h
}

#[test]
fn a_green_bot_pr_gets_one_review_under_the_reviewer_claim() {
    let mut h = H::with(rpolicy());
    h.step(pr_event(PrAction::Opened, bot_snap('a', T0), "bot"));
    h.later(10);
    let fx = h.step(green('a', h.now));
    assert_eq!(
        fx,
        lines(&[
            "dispatch review tier=0 attempt=1 head=aaa",
            "timer claim-expiry +7200s",
            "+auto/claimed-reviewer,auto/last-attempt-tier-0",
            "status awaiting-review",
        ])
    );
    let item = &dispatched(&h)[0];
    let review = item.context.review.as_ref().expect("context.review");
    assert_eq!(
        (review.reviewer.as_str(), review.round, review.max_rounds),
        ("rev", 1, 3)
    );
    let json = serde_json::to_value(item).unwrap();
    assert_eq!(json["kind"], "review");
    assert_eq!(json["context"]["review"]["reviewer"], "rev");
    assert_eq!(h.r.agent_review.rounds.len(), 1);
    assert!(!h.r.work.labels_applied.contains("auto/claimed-implementer"));
    // The same read again, a CI poll, a review hint: nothing new for this head.
    h.later(5);
    assert!(
        !h.step(green('a', h.now))
            .iter()
            .any(|l| l.starts_with("dispatch"))
    );
}

#[test]
fn no_reviewer_logins_or_a_human_pr_by_default_means_no_review() {
    // Without reviewer_logins nothing changes: the PR waits for a person.
    let h = bot_pr_green(policy());
    assert!(dispatched(&h).is_empty());
    assert_eq!(h.phase(), Phase::AwaitingReview);
    // A human PR: off by default, on with agent_review = "all".
    let mut h = H::with(rpolicy());
    h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    h.step(green('a', T0 + 1000));
    assert!(dispatched(&h).is_empty(), "{:?}", h.effects());
    let all = Policy {
        agent_review: AgentScope::All,
        ..rpolicy()
    };
    h = H::with(all);
    h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    h.step(green('a', T0 + 1000));
    assert_eq!(dispatched(&h)[0].kind, WorkKind::Review);
    // agent_review = "off" on a bot PR.
    let off = Policy {
        agent_review: AgentScope::Off,
        ..rpolicy()
    };
    assert!(dispatched(&bot_pr_green(off)).is_empty());
}

#[test]
fn the_reviewer_is_never_the_author() {
    // Every reviewer login is the author (the bot): no review, and the PR says why it
    // waits (approvals), not that a review runs.
    let p = Policy {
        reviewer_logins: vec!["bot".into()],
        ..policy()
    };
    let mut h = bot_pr_green(p);
    assert!(dispatched(&h).is_empty());
    assert_eq!(h.reason(), "waiting for 1 more approval");
    // With a second reviewer, that one reviews.
    let p = Policy {
        reviewer_logins: vec!["bot".into(), "rev2".into()],
        ..policy()
    };
    h = bot_pr_green(p);
    let item = &dispatched(&h)[0];
    assert_eq!(
        item.context.review.as_ref().unwrap().reviewer.as_str(),
        "rev2"
    );
}

#[test]
fn a_failed_review_is_not_repeated_on_the_same_head() {
    let mut h = bot_pr_green(rpolicy());
    let id = h.work_id();
    h.later(60);
    let fx = h.step(result(&id, WorkOutcome::Failed));
    assert!(!fx.iter().any(|l| l.starts_with("dispatch")), "{fx:?}");
    assert!(fx.contains(&"-auto/claimed-reviewer".to_owned()), "{fx:?}");
    // An expired claim neither.
    let mut h = bot_pr_green(rpolicy());
    let id = h.work_id();
    h.later(7200);
    let due = h.r.work.active.as_ref().unwrap().expires_ms;
    let fx = h.step(timer(TimerKind::ClaimExpiry { work_id: id }, due));
    assert!(!fx.iter().any(|l| l.starts_with("dispatch")), "{fx:?}");
    assert_eq!(h.r.agent_review.rounds.len(), 1);
}

/// Round `n` of a reviewer who requests changes with `body`: review dispatched on
/// `head`, reviewer reports, reviews read, feedback dispatched, the implementer pushes
/// `next` as the bot and CI goes green on it. Returns the feedback item's tier.
fn change_round(h: &mut H, head: char, next: char, body: &str, first_id: i64) -> u8 {
    let review = h.work_id();
    assert_eq!(
        h.r.work.active.as_ref().unwrap().item.kind,
        WorkKind::Review
    );
    h.later(30);
    h.step(result(&review, WorkOutcome::Succeeded));
    h.later(1);
    let fx = h.step(reviews_with(
        &[("rev", ReviewState::RequestChanges, head, body)],
        first_id,
        h.now,
    ));
    let feedback = dispatched(h);
    assert_eq!(feedback.len(), 1, "{fx:?}");
    assert_eq!(feedback[0].kind, WorkKind::ReviewFeedback);
    let tier = feedback[0].tier;
    let id = h.work_id();
    h.later(60);
    h.step(result(&id, WorkOutcome::Succeeded));
    h.later(1);
    h.step(pr_event(
        PrAction::Synchronized,
        bot_snap(next, h.now),
        "bot",
    ));
    h.later(10);
    h.step(green(next, h.now));
    tier
}

#[test]
fn review_feedback_push_review_approve_merges() {
    let mut h = bot_pr_green(rpolicy());
    change_round(&mut h, 'a', 'b', "Handle the empty list.", 200);
    // One new review for the new head.
    let items = dispatched(&h);
    assert_eq!(items.len(), 1, "{:?}", h.effects());
    assert_eq!(items[0].kind, WorkKind::Review);
    assert_eq!(items[0].context.review.as_ref().unwrap().round, 2);
    let id = h.work_id();
    h.later(30);
    h.step(result(&id, WorkOutcome::Succeeded));
    h.later(1);
    let fx = h.step(reviews_with(
        &[
            (
                "rev",
                ReviewState::RequestChanges,
                'a',
                "Handle the empty list.",
            ),
            ("rev", ReviewState::Approved, 'b', "LGTM"),
        ],
        200,
        h.now,
    ));
    // The merge (the executor's re-check reads the reviews again before the call).
    assert!(fx.iter().any(|l| l.starts_with("merge bbb")), "{fx:?}");
    let verdicts: Vec<_> = h.r.agent_review.rounds.iter().map(|r| r.verdict).collect();
    assert_eq!(
        verdicts,
        [
            Some(ReviewVerdict::ChangesRequested),
            Some(ReviewVerdict::Approved)
        ]
    );
}

#[test]
fn an_agent_approval_counts_by_policy() {
    let approve = |h: &mut H| {
        let id = h.work_id();
        h.later(30);
        h.step(result(&id, WorkOutcome::Succeeded));
        h.later(1);
        h.step(reviews_with(
            &[("rev", ReviewState::Approved, 'a', "ok")],
            300,
            h.now,
        ))
    };
    // Not counted on bot PRs when the policy says off.
    let p = Policy {
        reviewer_approvals_count: AgentScope::Off,
        ..rpolicy()
    };
    let mut h = bot_pr_green(p);
    let fx = approve(&mut h);
    assert!(!fx.contains(&"observe reviews".to_owned()), "{fx:?}");
    assert_eq!(h.reason(), "waiting for 1 more approval");
    // A human PR reviewed by an agent (agent_review = all): the agent's approval does
    // not count by default, two people must approve.
    let p = Policy {
        agent_review: AgentScope::All,
        ..rpolicy()
    };
    let mut h = H::with(p);
    h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    h.later(10);
    h.step(green('a', h.now));
    approve(&mut h);
    assert_eq!(h.reason(), "waiting for 2 more approvals");
    // An agent's approval of an old head never counts, even where agents count.
    let mut h = bot_pr_green(rpolicy());
    let id = h.work_id();
    h.step(result(&id, WorkOutcome::Failed));
    h.later(1);
    h.step(pr_event(
        PrAction::Synchronized,
        bot_snap('b', h.now),
        "alice",
    ));
    h.later(1);
    h.step(reviews_with(
        &[("rev", ReviewState::Approved, 'a', "ok")],
        300,
        h.now,
    ));
    assert!(merge_blockers(&h.r, &h.p, h.now).contains(&"waiting for 1 more approval".to_owned()));
    // … and it stays in the history of the round it was for.
    assert_eq!(
        h.r.agent_review.rounds[0].verdict,
        Some(ReviewVerdict::Approved)
    );
}

#[test]
fn a_human_change_request_blocks_whatever_the_agents_say() {
    let mut h = bot_pr_green(rpolicy());
    let id = h.work_id();
    h.later(30);
    h.step(result(&id, WorkOutcome::Succeeded));
    h.later(1);
    // The human's change request is for an old head (the agents will not fix it: it
    // is not active), the agent approves the head.
    let fx = h.step(reviews_with(
        &[
            ("carol", ReviewState::RequestChanges, '0', "No."),
            ("rev", ReviewState::Approved, 'a', "LGTM"),
        ],
        400,
        h.now,
    ));
    assert!(
        !fx.iter()
            .any(|l| l.starts_with("merge") || l == "observe reviews"),
        "{fx:?}"
    );
    assert!(merge_blockers(&h.r, &h.p, h.now).contains(&"changes requested by carol".to_owned()));
    // A new head: no agent review while the human's request stands.
    h.later(1);
    h.step(pr_event(
        PrAction::Synchronized,
        bot_snap('b', h.now),
        "alice",
    ));
    h.later(10);
    let fx = h.step(green('b', h.now));
    assert!(!fx.iter().any(|l| l.starts_with("dispatch")), "{fx:?}");
}

#[test]
fn a_reviewer_who_always_requests_changes_gets_three_rounds_then_a_human() {
    let mut h = bot_pr_green(rpolicy());
    let body = "Line 12: the loop never ends.";
    let mut tiers = Vec::new();
    for (i, (head, next)) in [('a', 'b'), ('b', 'c'), ('c', 'd')].into_iter().enumerate() {
        let round = dispatched(&h);
        assert_eq!(round.len(), 1, "round {i}: {:?}", h.effects());
        assert_eq!(
            round[0].context.review.as_ref().unwrap().round,
            i as u32 + 1
        );
        tiers.push(change_round(&mut h, head, next, body, 500 + 10 * i as i64));
    }
    // The same change request after each fix: the implementer escalates every round.
    assert_eq!(tiers, [0, 1, 2]);
    // CI green on the fourth head: no fourth review, needs-human with the rounds.
    let comments: Vec<&str> = h
        .effects()
        .iter()
        .filter_map(|e| match &e.kind {
            EffectKind::Comment { body, .. } => Some(body.as_str()),
            _ => None,
        })
        .collect();
    assert!(dispatched(&h).is_empty(), "{:?}", h.effects());
    assert_eq!(comments.len(), 1, "{:?}", h.effects());
    assert!(comments[0].contains("3 review rounds"), "{}", comments[0]);
    assert!(
        comments[0].contains("| 3 | `cccccccccc` | `rev` | changes-requested |"),
        "{}",
        comments[0]
    );
    assert_eq!(h.phase(), Phase::NeedsHuman);
    assert!(h.r.work.labels_applied.contains("needs feedback"));
    // A person resumes: the PR waits for a human review; no fourth round, no second
    // needs-human.
    let mut trusted = h.p.clone();
    trusted.trusted_users = vec!["carol".into()];
    h.p = trusted;
    h.later(5);
    let fx = h.step(comment(9002, "/shepherd resume", "carol"));
    assert!(
        !fx.iter()
            .any(|l| l.starts_with("dispatch") || l.starts_with("comment")),
        "{fx:?}"
    );
    assert_eq!(h.phase(), Phase::AwaitingReview);
    assert!(h.reason().contains("a human must review"), "{}", h.reason());
    assert_eq!(h.r.agent_review.rounds.len(), 3);
}

#[test]
fn status_comment_shows_the_round_and_verdict() {
    let mut h = bot_pr_green(rpolicy());
    let id = h.work_id();
    h.later(30);
    h.step(result(&id, WorkOutcome::Succeeded));
    h.later(1);
    h.step(reviews_with(
        &[("rev", ReviewState::RequestChanges, 'a', "Fix it.")],
        600,
        h.now,
    ));
    let body = h
        .effects()
        .iter()
        .find_map(|e| match &e.kind {
            EffectKind::UpsertComment { body, .. } => Some(body.clone()),
            _ => None,
        })
        .expect("status comment");
    assert!(
        body.contains("Agent review: round 1 of 3 by `rev` · verdict: changes-requested"),
        "{body}"
    );
    let state = texts::parse_status_comment(&body).unwrap();
    assert_eq!(
        state.review.unwrap().verdict,
        Some(ReviewVerdict::ChangesRequested)
    );
}

/// One generated step of the property test.
#[derive(Debug, Clone)]
enum Op {
    /// CI green on the head.
    Green,
    /// The active work reports (true: succeeded).
    Report(bool),
    /// The claim's TTL runs out.
    Expire,
    /// The agent's verdict on the head (true: approve) is read, with a human's stance.
    Reviews(bool, Option<bool>),
    /// The implementer pushes a new head (as the bot) or a human does.
    Push(bool),
    /// Time passes.
    Wait,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Green),
        3 => any::<bool>().prop_map(Op::Report),
        1 => Just(Op::Expire),
        3 => (any::<bool>(), proptest::option::of(any::<bool>())).prop_map(|(a, h)| Op::Reviews(a, h)),
        2 => any::<bool>().prop_map(Op::Push),
        1 => Just(Op::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Never two review dispatches for one head; never more than max_review_rounds;
    /// no merge while a human's latest review requests changes; the implementer's and
    /// the reviewer's claims never both.
    #[test]
    fn review_rounds_are_bounded_and_claims_never_overlap(
        ops in proptest::collection::vec(op(), 1..60),
        max in 1u32..4,
    ) {
        let p = Policy { max_review_rounds: max, ..rpolicy() };
        let mut h = H::with(p);
        h.step(pr_event(PrAction::Opened, bot_snap('0', T0), "bot"));
        let heads = "0123456789abcdef";
        let mut head_i = 0usize;
        let mut reviewed: Vec<Sha> = Vec::new();
        let mut human_blocks = false;
        let mut next_id = 1000;
        for o in ops {
            h.later(7);
            let head = heads.chars().nth(head_i % 16).unwrap();
            match o {
                Op::Green => { h.step(green(head, h.now)); }
                Op::Report(ok) => {
                    if let Some(a) = &h.r.work.active {
                        let id = a.item.id.clone();
                        let outcome = if ok { WorkOutcome::Succeeded } else { WorkOutcome::Failed };
                        h.step(result(&id, outcome));
                    }
                }
                Op::Expire => {
                    if let Some(a) = h.r.work.active.clone() {
                        h.now = h.now.max(a.expires_ms);
                        h.step(timer(TimerKind::ClaimExpiry { work_id: a.item.id }, a.expires_ms));
                    }
                }
                Op::Reviews(approve, human) => {
                    let agent = if approve { ReviewState::Approved } else { ReviewState::RequestChanges };
                    let mut list = vec![("rev", agent, head, "Same problem.")];
                    if let Some(h_ok) = human {
                        let s = if h_ok { ReviewState::Approved } else { ReviewState::RequestChanges };
                        list.push(("carol", s, head, "Human."));
                    }
                    // Each read is the full list: its human stance is the one that holds.
                    human_blocks = human == Some(false);
                    next_id += 10;
                    h.step(reviews_with(&list, next_id, h.now));
                }
                Op::Push(by_bot) => {
                    head_i += 1;
                    let next = heads.chars().nth(head_i % 16).unwrap();
                    let who = if by_bot { "bot" } else { "alice" };
                    h.step(pr_event(PrAction::Synchronized, bot_snap(next, h.now), who));
                }
                Op::Wait => { h.later(600); h.step(timer(TimerKind::StaleCheck, h.now)); }
            }
            for item in dispatched(&h).iter().filter(|w| w.kind == WorkKind::Review) {
                let s = item.head_sha.clone().unwrap();
                prop_assert!(!reviewed.contains(&s), "second review of {s}");
                reviewed.push(s);
            }
            prop_assert!(reviewed.len() <= max as usize, "{} reviews > {max}", reviewed.len());
            prop_assert!(h.r.agent_review.rounds.len() <= max as usize);
            let merging = h.effects().iter().any(|e| matches!(e.kind, EffectKind::Merge { .. }));
            prop_assert!(!(human_blocks && merging), "merged over a human's change request");
            let labels = &h.r.work.labels_applied;
            prop_assert!(
                !(labels.contains("auto/claimed-implementer") && labels.contains("auto/claimed-reviewer")),
                "both claims: {labels:?}"
            );
            if let Some(a) = &h.r.work.active {
                let want = if a.item.kind == WorkKind::Review { "auto/claimed-reviewer" } else { "auto/claimed-implementer" };
                prop_assert!(labels.contains(want), "{labels:?} for {}", a.item.kind.as_str());
            }
        }
    }
}

/// Issue 17's approval hints and the reviewer agents: a reviewer agent's approval
/// webhook is always read (its verdict is a fact of its round), never taken as a hint;
/// a person's approval hint counts, so a green bot PR it approved merges (the
/// executor's re-check reads the reviews) instead of getting an agent's review.
#[test]
fn a_reviewer_agents_approval_is_read_and_a_persons_hint_stops_the_review() {
    let mut h = bot_pr_green(rpolicy());
    let review = h.work_id();
    h.later(30);
    h.step(result(&review, WorkOutcome::Succeeded));
    h.later(1);
    let fx = h.step(review_hint(bot_snap('a', T0), "rev"));
    assert!(fx.contains(&"observe reviews".to_owned()), "{fx:?}");
    assert!(h.r.approval_hints.is_empty());

    let mut h = H::with(rpolicy());
    h.step(pr_event(PrAction::Opened, bot_snap('a', T0), "bot"));
    h.later(5);
    let fx = h.step(review_hint(bot_snap('a', T0), "carol"));
    assert!(!fx.contains(&"observe reviews".to_owned()), "{fx:?}");
    assert_eq!(h.r.approval_hints.len(), 1);
    h.later(5);
    let fx = h.step(green('a', h.now));
    assert!(dispatched(&h).is_empty(), "{fx:?}");
    assert!(fx.iter().any(|l| l.starts_with("merge aaa")), "{fx:?}");
}

/// The status comment body of the last step, if it wrote one.
fn status_body(h: &H) -> Option<String> {
    h.effects().iter().find_map(|e| match &e.kind {
        EffectKind::UpsertComment { body, .. } => Some(body.clone()),
        _ => None,
    })
}

/// Every one of `logins` approves head `a` ("lgtm"), in one observation of the reviews.
fn all_approve(h: &mut H, logins: &[&str]) -> Vec<String> {
    let list: Vec<_> = logins
        .iter()
        .map(|l| (*l, ReviewState::Approved, 'a', "lgtm"))
        .collect();
    h.step(reviews_with(&list, 400, h.now))
}

/// Issue 26 finding 5: the bot's and an agent user's approvals never count, whatever
/// the PR, and the status comment says so; a person's approval still counts.
#[test]
fn bot_and_agent_approvals_never_count() {
    let p = Policy {
        agent_logins: vec!["Agent-1".into()],
        ..policy()
    };
    // A human PR needing 2: one person + the bot does not merge.
    let mut h = H::with(p.clone());
    h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    h.later(10);
    h.step(green('a', h.now));
    h.later(10);
    let fx = all_approve(&mut h, &["bob", "bot"]);
    assert!(!fx.iter().any(|l| l.starts_with("merge")), "{fx:?}");
    assert_eq!(h.reason(), "waiting for 1 more approval");
    let body = status_body(&h).expect("status comment");
    assert!(
        body.contains("Approval by `bot` (bot/agent) not counted"),
        "{body}"
    );
    assert_eq!(
        texts::parse_status_comment(&body)
            .unwrap()
            .uncounted_approvals,
        vec!["bot".to_owned()]
    );
    // The agent user's approval (any case) counts no more, nor does its hint.
    h.later(10);
    let fx = h.step(review_hint(snap('a', T0), "agent-1"));
    assert_eq!(fx, lines(&["observe reviews"]), "never taken on trust");
    assert!(h.r.approval_hints.is_empty());
    h.later(1);
    let fx = all_approve(&mut h, &["bob", "bot", "agent-1"]);
    assert!(!fx.iter().any(|l| l.starts_with("merge")), "{fx:?}");
    assert_eq!(h.reason(), "waiting for 1 more approval");
    // A second person does merge it.
    h.later(1);
    let fx = all_approve(&mut h, &["bob", "bot", "agent-1", "dave"]);
    assert!(fx.iter().any(|l| l.starts_with("merge")), "{fx:?}");
    // A bot PR needing 1: the bot approving its own PR does not merge it, even
    // where reviewer agents' approvals count.
    let p = Policy {
        reviewer_approvals_count: AgentScope::All,
        reviewer_logins: vec!["bot".into()],
        agent_review: AgentScope::Off,
        ..p
    };
    let mut h = H::with(p);
    h.step(pr_event(PrAction::Opened, bot_snap('a', T0), "bot"));
    h.later(10);
    h.step(green('a', h.now));
    h.later(10);
    let fx = h.step(reviews_with(
        &[("bot", ReviewState::Approved, 'a', "")],
        500,
        h.now,
    ));
    assert!(!fx.iter().any(|l| l.starts_with("merge")), "{fx:?}");
    assert_eq!(h.reason(), "waiting for 1 more approval");
}
