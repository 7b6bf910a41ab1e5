//! Hostile input and hostile users (issue 12): decisions of the core that an outsider
//! must not be able to steer. Each test is named after the threat it closes.

use super::*;
use crate::core::record::MergeState;

/// `ci / test` passing.
const PASS: (&str, CiState, &str) = ("ci / test", CiState::Success, "Successful in 58s");

/// A PR opened by `author` with `body`, green CI, and the given reviews read.
fn green_pr(p: Policy, author: &str, body: &str, list: &[(&str, ReviewState, char)]) -> H {
    let mut h = H::with(p);
    let pr = PrSnapshot {
        author: Some(login(author)),
        body: body.into(),
        ..snap('a', T0)
    };
    h.step(pr_event(PrAction::Opened, pr, author));
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.later(1);
    h.step(reviews(list, h.now));
    h
}

/// The marker every agent PR carries (the policy default).
const MARKER: &str = "Closes #9\n\nAutomated by CleverAgents Bot";

#[test]
fn pasted_bot_marker_does_not_lower_the_approvals_of_a_human_pr() {
    let one = [("carol", ReviewState::Approved, 'a')];
    // A human pastes the marker: still a human PR, one approval is not enough.
    let h = green_pr(policy(), "mallory", MARKER, &one);
    assert_eq!(h.phase(), Phase::AwaitingReview);
    assert_eq!(h.reason(), "waiting for 1 more approval");
    assert!(!matches!(h.r.merge, MergeState::InFlight { .. }));
    // The bot login and a configured bot user are bot PRs by their author alone.
    let p = Policy {
        bot_users: vec!["Agent-Bot".into()],
        ..policy()
    };
    for author in ["bot", "agent-bot"] {
        let h = green_pr(p.clone(), author, "Closes #9", &one);
        assert_eq!(h.phase(), Phase::Merging, "{author}: {}", h.reason());
    }
}

#[test]
fn required_bot_marker_is_needed_in_addition_to_a_bot_author() {
    let one = [("carol", ReviewState::Approved, 'a')];
    let p = Policy {
        require_bot_marker: true,
        ..policy()
    };
    let h = green_pr(p.clone(), "bot", "Closes #9", &one);
    assert_eq!(h.reason(), "waiting for 1 more approval");
    let h = green_pr(p.clone(), "bot", MARKER, &one);
    assert_eq!(h.phase(), Phase::Merging, "{}", h.reason());
    let h = green_pr(p, "mallory", MARKER, &one);
    assert_eq!(h.reason(), "waiting for 1 more approval");
}

/// A reviews read where `who`'s change request on head `a` is not official.
fn unofficial_change_request(who: &str, approvers: &[&str], at: i64) -> Event {
    let mut list = vec![(who, ReviewState::RequestChanges, 'a')];
    list.extend(approvers.iter().map(|a| (*a, ReviewState::Approved, 'a')));
    match reviews(&list, at) {
        Event::ObservedReviews {
            repo,
            number,
            mut reviews,
            at_ms,
        } => {
            reviews[0].official = false;
            Event::ObservedReviews {
                repo,
                number,
                reviews,
                at_ms,
            }
        }
        other => other,
    }
}

#[test]
fn unofficial_change_request_neither_blocks_the_merge_nor_becomes_work() {
    let mut h = H::opened_bot();
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.later(1);
    let fx = h.step(unofficial_change_request("mallory", &["carol"], h.now));
    assert_eq!(
        fx,
        lines(&[
            "merge aaa Squash delete=true",
            "timer merge-retry +1800s",
            "status merging"
        ]),
        "no review-feedback dispatch, the merge goes ahead"
    );
    assert!(h.r.work.active.is_none());
    assert!(crate::core::machine::merge_blockers(&h.r, &h.p, h.now).is_empty());
    // Kept as a fact and shown in the status comment.
    let EffectKind::UpsertComment { body, .. } = &h.effects()[2].kind else {
        panic!("not the status comment");
    };
    assert!(
        body.contains("Not counted (no write access): changes requested by `mallory`"),
        "{body}"
    );
    assert!(
        !h.r.reviews
            .as_ref()
            .unwrap()
            .latest
            .values()
            .all(|r| r.official)
    );
}

#[test]
fn official_change_request_still_blocks_and_becomes_work() {
    let mut h = H::opened_bot();
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.later(1);
    let fx = h.step(reviews(
        &[
            ("bob", ReviewState::RequestChanges, 'a'),
            ("carol", ReviewState::Approved, 'a'),
        ],
        h.now,
    ));
    assert_eq!(fx[0], "dispatch review-feedback tier=0 attempt=1 head=aaa");
    assert_eq!(h.phase(), Phase::ReviewFeedback);
}
