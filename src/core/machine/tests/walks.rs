//! Lifecycle walks (issue 3): whole stories, asserting the effects at every step.

use super::*;
use crate::core::record::{AttemptOutcome, Hold};

/// `ci / test` failing the same way each time (durations differ).
fn fail(desc: &str) -> [(&'static str, CiState, String); 1] {
    [("ci / test", CiState::Failure, desc.to_owned())]
}

/// Reads CI of `head` with the given contexts through the poll timer.
fn ci(h: &mut H, head: char, contexts: &[(&str, CiState, String)]) -> Vec<String> {
    let polled = h.fire_ci_poll();
    assert_eq!(
        polled[0],
        format!("observe status {}", &sha(head).as_str()[..3])
    );
    let cs: Vec<(&str, CiState, &str)> = contexts
        .iter()
        .map(|(c, s, d)| (*c, *s, d.as_str()))
        .collect();
    h.later(1);
    h.step(status(head, &cs, h.now))
}

/// The agent pushes `head` (as the bot) and reports success.
fn agent_pushes(h: &mut H, head: char) -> Vec<String> {
    let id = h.work_id();
    h.later(300);
    let pushed = PrSnapshot {
        mergeable: None,
        head_sha: Some(sha(head)),
        updated_ms: h.now,
        ..h.r.pr.clone().unwrap()
    };
    let fx = h.step(pr_event(PrAction::Synchronized, pushed, "bot"));
    h.later(5);
    h.step(result(&id, WorkOutcome::Succeeded));
    fx
}

#[test]
fn bot_pr_ci_failure_escalation_fix_approval_merge() {
    let mut h = H::opened_bot();
    assert_eq!(h.phase(), Phase::AwaitingCi);

    // CI fails: ci-fix at tier 0.
    let fx = ci(&mut h, 'a', &fail("Failing after 1m2s"));
    assert_eq!(fx[0], "dispatch ci-fix tier=0 attempt=1 head=aaa");

    // The agent pushes; the same failure comes back: tier goes up.
    let fx = agent_pushes(&mut h, 'b');
    assert_eq!(
        fx,
        lines(&[
            "timer mergeability +10s",
            "timer stale-check +86400s",
            "timer ci-poll +5s",
            "-auto/claimed-implementer",
            "status awaiting-ci"
        ])
    );
    assert_eq!(h.r.work.attempts[0].outcome, AttemptOutcome::Succeeded);
    let fx = ci(&mut h, 'b', &fail("Failing after 58s"));
    assert_eq!(
        fx,
        lines(&[
            "dispatch ci-fix tier=1 attempt=2 head=bbb",
            "timer claim-expiry +7200s",
            "-auto/last-attempt-tier-0",
            "+auto/claimed-implementer,auto/last-attempt-tier-1",
            "status ci-fix",
        ])
    );

    // A fix: green CI, waiting for one approval (bot PR).
    agent_pushes(&mut h, 'c');
    let fx = ci(
        &mut h,
        'c',
        &[("ci / test", CiState::Success, "Successful in 1m".into())],
    );
    assert_eq!(fx, lines(&["status awaiting-review"]));
    assert_eq!(h.reason(), "waiting for 1 more approval");

    // carol approves: merged pinned to the head (the executor's re-check reads the
    // reviews before the merge call).
    h.later(60);
    assert_eq!(
        h.step(review_hint(bot_snap('c', h.now), "carol")),
        lines(&[
            "timer stale-check +86400s",
            "merge ccc Squash delete=true",
            "timer merge-retry +1800s",
            "status merging"
        ])
    );
    let fx = h.step(merged(MergeOutcome::Merged));
    assert_eq!(fx, lines(&["comment #9", "status merged"]));
    assert_eq!(h.r.work.tier, 1);
    assert_eq!(
        h.r.work.labels_applied,
        BTreeSet::from(["auto/last-attempt-tier-1".to_owned()])
    );
}

#[test]
fn human_pr_change_request_then_two_approvals() {
    let mut h = H::opened();
    let green = [("ci / test", CiState::Success, "ok".to_owned())];
    ci(&mut h, 'a', &green);
    h.later(60);
    h.step(review_hint(snap('a', h.now), "bob"));
    let fx = h.step(reviews(&[("bob", ReviewState::RequestChanges, 'a')], h.now));
    assert_eq!(fx[0], "dispatch review-feedback tier=0 attempt=1 head=aaa");

    // The agent addresses it; bob's review is now on an old commit.
    agent_pushes(&mut h, 'b');
    ci(&mut h, 'b', &green);
    h.later(1);
    h.step(reviews(&[("bob", ReviewState::RequestChanges, 'a')], h.now));
    assert_eq!(h.phase(), Phase::AwaitingReview);
    assert_eq!(h.reason(), "changes requested by bob");

    // bob approves; one approval is not enough for a human PR.
    h.later(60);
    h.step(reviews(
        &[
            ("bob", ReviewState::RequestChanges, 'a'),
            ("bob", ReviewState::Approved, 'b'),
        ],
        h.now,
    ));
    assert_eq!(h.reason(), "waiting for 1 more approval");
    h.later(60);
    let two = [
        ("bob", ReviewState::RequestChanges, 'a'),
        ("bob", ReviewState::Approved, 'b'),
        ("carol", ReviewState::Approved, 'b'),
    ];
    let fx = h.step(reviews(&two, h.now));
    assert_eq!(
        fx,
        lines(&[
            "merge bbb Squash delete=true",
            "timer merge-retry +1800s",
            "status merging"
        ])
    );
}

#[test]
fn stuck_pr_resumed_then_fixed() {
    let mut h = H::opened();
    ci(&mut h, 'a', &fail("Failing after 1s"));
    let mut tiers = Vec::new();
    while h.r.work.hold.is_none() {
        tiers.push(h.r.work.active.as_ref().unwrap().item.tier);
        let id = h.work_id();
        h.later(60);
        h.step(result(&id, WorkOutcome::Failed));
    }
    assert_eq!(tiers, vec![0, 1, 2, 3, 3, 3]);
    assert_eq!(h.phase(), Phase::NeedsHuman);
    assert!(matches!(h.r.work.hold, Some(Hold::NeedsHuman { .. })));

    // A human with write access (here: trusted) pushes a fix: resumed, CI green, no
    // more work.
    h.p.trusted_users = vec!["alice".into()];
    h.later(600);
    let fx = h.step(pr_event(
        PrAction::Synchronized,
        PrSnapshot {
            mergeable: None,
            ..snap('b', h.now)
        },
        "alice",
    ));
    assert_eq!(
        fx,
        lines(&[
            "timer mergeability +10s",
            "timer stale-check +86400s",
            "timer ci-poll +5s",
            "-needs feedback",
            "status awaiting-ci"
        ])
    );
    ci(&mut h, 'b', &[("ci / test", CiState::Success, "ok".into())]);
    assert_eq!(h.phase(), Phase::AwaitingReview);
    // The tier never went down.
    assert_eq!(h.r.work.tier, 3);
}
