//! Hostile input against the record (issue 12): replayed command comments, command
//! floods, oversized agent results and long attempt histories.

use super::*;
use crate::core::effect::WorkKind;
use crate::core::record::{
    Attempt, AttemptOutcome, HANDLED_COMMENTS_KEPT, Hold, MAX_PENDING_COMMANDS,
    MAX_PENDING_PER_LOGIN, MAX_SUMMARY_BYTES, WORK_ITEM_ATTEMPTS,
};

/// A failing CI context.
const FAIL: (&str, CiState, &str) = ("ci / test", CiState::Failure, "Failing after 1m2s");

/// An opened PR whose commenter `alice` is trusted.
fn trusted() -> H {
    let mut h = H::opened();
    h.p.trusted_users = vec!["alice".into()];
    h
}

#[test]
fn replayed_command_comment_never_runs_again_after_64_newer_command_comments() {
    let mut h = trusted();
    h.step(comment(1, "/shepherd pause", "alice"));
    h.step(comment(2, "/shepherd resume", "alice"));
    assert_eq!(h.r.work.hold, None);
    // Far more newer command comments than the window holds.
    for id in 3..(3 + 3 * HANDLED_COMMENTS_KEPT as i64) {
        h.step(comment(id, "/shepherd status", "alice"));
    }
    assert!(h.r.work.handled_comments.len() <= HANDLED_COMMENTS_KEPT);
    for old in [1, 2, 3, 50] {
        let replay = comment(old, "/shepherd pause", "alice");
        let t = step(&h.r, &replay, h.now, &h.p);
        assert!(t.is_noop(), "comment {old} replayed: {:?}", t.effects);
    }
    assert_eq!(h.r.work.hold, None, "not paused again");
    // A new comment still runs.
    h.step(comment(10_000, "/shepherd pause", "alice"));
    assert!(matches!(h.r.work.hold, Some(Hold::Paused { .. })));
}

#[test]
fn replayed_escalate_does_not_raise_the_tier_again() {
    let mut h = trusted();
    h.step(comment(1, "/shepherd escalate", "alice"));
    assert_eq!(h.r.work.tier, 1);
    for id in 2..(2 + HANDLED_COMMENTS_KEPT as i64 + 1) {
        h.step(comment(id, "/shepherd status", "alice"));
    }
    assert!(
        step(
            &h.r,
            &comment(1, "/shepherd escalate", "alice"),
            h.now,
            &h.p
        )
        .is_noop()
    );
}

#[test]
fn command_comments_delivered_out_of_order_within_the_window_still_run() {
    let mut h = trusted();
    h.step(comment(20, "/shepherd status", "alice"));
    h.step(comment(10, "/shepherd pause", "alice"));
    assert!(matches!(h.r.work.hold, Some(Hold::Paused { .. })));
    // An edit of a handled comment (same id, new text) runs nothing.
    let edited = comment(20, "/shepherd resume", "alice");
    assert!(step(&h.r, &edited, h.now, &h.p).is_noop());
}

#[test]
fn a_command_flood_from_an_unknown_user_keeps_pending_commands_bounded() {
    let mut h = H::opened();
    let flood = "/shepherd status\n".repeat(1_000);
    let fx = h.step(comment(1, &flood, "mallory"));
    assert_eq!(fx, lines(&["observe permission mallory"]));
    for id in 2..200 {
        h.step(comment(id, &flood, "mallory"));
        h.step(comment(1_000 + id, "/shepherd pause", &format!("user{id}")));
    }
    assert_eq!(h.r.work.pending_commands.len(), MAX_PENDING_COMMANDS);
    let mallory =
        h.r.work
            .pending_commands
            .iter()
            .filter(|p| p.login.as_str() == "mallory");
    assert!(
        mallory.count() <= MAX_PENDING_PER_LOGIN,
        "one login holds at most its share"
    );
}

/// Many accounts flooding with commands while their lookups are pending cannot keep a
/// newcomer's command out: the oldest of the others is evicted instead.
#[test]
fn a_flood_from_many_accounts_does_not_silence_a_newcomers_command() {
    let mut h = H::opened();
    let flood = "/shepherd status\n".repeat(100);
    for id in 1..=20 {
        h.step(comment(id, &flood, &format!("sock{id}")));
    }
    assert_eq!(h.r.work.pending_commands.len(), MAX_PENDING_COMMANDS);
    let fx = h.step(comment(100, "/shepherd pause", "alice"));
    assert_eq!(fx, lines(&["observe permission alice"]));
    assert!(
        h.r.work
            .pending_commands
            .iter()
            .any(|p| p.login.as_str() == "alice"),
        "alice's pause waits for her lookup"
    );
    assert_eq!(h.r.work.pending_commands.len(), MAX_PENDING_COMMANDS);
}

#[test]
fn an_oversized_agent_summary_is_cut_before_it_enters_the_record() {
    let mut h = H::opened();
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    let id = h.work_id();
    let huge = "x".repeat(4_700_000);
    h.step(Event::WorkResult {
        work_id: id,
        outcome: WorkOutcome::Failed,
        signature: Some("s".repeat(1_000_000)),
        summary: Some(huge),
        usage: None,
        stopped: None,
    });
    let a = h.r.work.attempts.last().unwrap();
    let summary = a.summary.as_deref().unwrap();
    assert!(summary.len() <= MAX_SUMMARY_BYTES, "{}", summary.len());
    assert!(
        summary.ends_with("[truncated from 4700000 bytes]"),
        "says so"
    );
    assert!(a.reported_signature.as_ref().unwrap().len() <= 200);
    assert!(h.r.to_json().len() < 20_000, "the record stays small");
}

#[test]
fn work_items_carry_only_the_most_recent_attempts() {
    let mut h = H::opened();
    h.r.work.attempts = (0..50)
        .map(|i| Attempt {
            work_id: WorkId::new(&repo(), Scope::Pr, PR, i),
            kind: WorkKind::StaleCheck,
            tier: 0,
            signature: format!("old-{i}"),
            head_sha: None,
            outcome: AttemptOutcome::NoChanges,
            reported_signature: None,
            summary: Some(format!("attempt {i}")),
            started_ms: T0,
            ended_ms: T0,
            cost_micros: None,
            tokens: None,
        })
        .collect();
    h.r.work.stuck_base = 50;
    h.r.work.seq = 50;
    // Stored as an older build kept them (no bound): 50 attempts since the last resume
    // would hold the PR at `max_attempts_total`, which this test is not about.
    h.r.work.attempts_base = 50;
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    let item = &h.r.work.active.as_ref().expect("dispatched").item;
    let carried: Vec<&str> = item
        .context
        .attempts
        .iter()
        .map(|a| a.summary.as_deref().unwrap())
        .collect();
    let want: Vec<String> = (50 - WORK_ITEM_ATTEMPTS..50)
        .map(|i| format!("attempt {i}"))
        .collect();
    assert_eq!(carried, want, "the last WORK_ITEM_ATTEMPTS, oldest first");
}
