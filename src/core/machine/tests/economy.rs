//! The whole-life API economy of issue 17, as decisions of the core: short-lived
//! statuses settle before they are written (a fast merge is one edit, and the last
//! status is always written), the machine leaves the reviews read before a merge to
//! the executor's re-check, approval webhooks count towards a merge attempt without a
//! reviews read, and a PR's first status comment is marked when Forgejo's comment
//! count proves it has none.

use super::*;
use crate::core::machine::merge_blockers;
use crate::core::policy::MergeMode;

/// `ci / test` passing.
const PASS: (&str, CiState, &str) = ("ci / test", CiState::Success, "Successful in 58s");

/// A bot PR opened with green CI read, one approval away from merging.
fn ready_bot() -> H {
    let mut h = H::opened_bot();
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.later(1);
    h
}

/// The same with short-lived statuses settling (the default policy).
fn ready_bot_settled() -> H {
    let mut h = H::with(settled_policy());
    h.step(pr_event(PrAction::Opened, bot_snap('a', T0), "bot"));
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.later(1);
    h
}

/// The status effects of the last step, by phase and `first` flag.
fn statuses(h: &H) -> Vec<(String, bool)> {
    h.effects()
        .iter()
        .filter_map(|e| match &e.kind {
            EffectKind::UpsertComment { body, first } => {
                let state = texts::parse_status_comment(body).expect("state block");
                Some((state.phase.as_str().to_owned(), *first))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_fast_merge_writes_merged_once_instead_of_ready_merging_merged() {
    let mut h = ready_bot_settled();
    assert_eq!(h.phase(), Phase::AwaitingReview);
    let fx = h.step(review_hint(bot_snap('a', T0), "carol"));
    assert_eq!(
        fx,
        lines(&[
            "merge aaa Squash delete=true",
            "timer merge-retry +1800s",
            "timer status-settle +10s"
        ]),
        "merging waits"
    );
    assert_eq!(h.r.status_pending_since_ms, Some(h.now));
    h.later(2);
    let fx = h.step(merged(MergeOutcome::Merged));
    assert_eq!(
        fx,
        lines(&["comment #9", "status merged"]),
        "merged at once"
    );
    assert_eq!(h.r.status_pending_since_ms, None);
    // The settle timer still comes: nothing to write.
    h.later(8);
    let due = h.now;
    assert!(step(&h.r, &timer(TimerKind::StatusSettle, due), due, &h.p).is_noop());
}

#[test]
fn a_slow_merge_shows_merging_once_the_settle_time_is_over() {
    let mut h = ready_bot_settled();
    h.step(review_hint(bot_snap('a', T0), "carol"));
    let since = h.now;
    // A timer that comes early (the setting grew meanwhile) waits again.
    h.later(4);
    let early = h.now;
    let fx = h.step(timer(TimerKind::StatusSettle, early));
    assert_eq!(fx, lines(&["timer status-settle +6s"]));
    h.now = since + 10_000;
    let due = h.now;
    let fx = h.step(timer(TimerKind::StatusSettle, due));
    assert_eq!(fx, lines(&["status merging"]));
    // Forgejo asks to try again later: still short-lived (ready-to-merge), it waits.
    h.later(1);
    let fx = h.step(merged(MergeOutcome::TryAgain));
    assert_eq!(
        fx,
        lines(&["timer merge-retry +30s", "timer status-settle +10s"])
    );
}

/// Merge retries (Forgejo says "try again later", or another holder has the branch's
/// merge lease) flip the phase between ready-to-merge and merging; the comment is
/// written once, when the first of them has lasted `status_settle_secs`, and not again
/// on each flip: a flip back to what the comment already says cancels the wait.
#[test]
fn merge_retries_do_not_flip_the_status_comment() {
    let mut h = ready_bot_settled();
    h.step(review_hint(bot_snap('a', T0), "carol"));
    let t0 = h.now;
    h.later(2);
    let fx = h.step(merged(MergeOutcome::TryAgain));
    assert_eq!(fx, lines(&["timer merge-retry +30s"]), "still waiting");
    h.now = t0 + 10_000;
    let due = h.now;
    let fx = h.step(timer(TimerKind::StatusSettle, due));
    assert_eq!(fx, lines(&["status ready-to-merge"]), "it lasted: written");
    let mut written = Vec::new();
    for round in 0..5 {
        h.now = t0 + 32_000 + round * 31_000;
        let due = h.now;
        let fx = h.step(timer(TimerKind::MergeRetry, due));
        assert!(
            fx.contains(&"merge aaa Squash delete=true".to_owned()),
            "round {round}: {fx:?}"
        );
        written.extend(statuses(&h));
        h.later(1);
        let outcome = match round % 2 {
            0 => MergeOutcome::TryAgain,
            _ => MergeOutcome::LockBusy { retry_ms: 5_000 },
        };
        h.step(merged(outcome));
        written.extend(statuses(&h));
        assert_eq!(h.r.status_pending_since_ms, None, "round {round}");
        // The settle timer set when merging began finds nothing waiting.
        h.later(9);
        let due = h.now;
        let t = step(&h.r, &timer(TimerKind::StatusSettle, due), due, &h.p);
        assert!(t.effects.is_empty(), "round {round}: {:?}", t.effects);
    }
    assert_eq!(written, Vec::<(String, bool)>::new(), "no edit per retry");
    assert_eq!(h.phase(), Phase::ReadyToMerge);
}

#[test]
fn a_lasting_phase_is_written_at_once_and_replaces_a_waiting_one() {
    let mut h = ready_bot_settled();
    h.step(review_hint(bot_snap('a', T0), "carol"));
    assert!(h.r.status_pending_since_ms.is_some());
    // The re-check finds a change request: review-feedback is written at once.
    h.later(1);
    h.step(reviews(
        &[
            ("carol", ReviewState::Approved, 'a'),
            ("bob", ReviewState::RequestChanges, 'a'),
        ],
        h.now,
    ));
    let fx = h.step(merged(MergeOutcome::TryAgain));
    assert!(fx.contains(&"status review-feedback".to_owned()), "{fx:?}");
    assert_eq!(h.r.status_pending_since_ms, None);
}

#[test]
fn a_new_pr_waits_for_its_first_ci_read_before_its_first_status() {
    let mut h = H::with(settled_policy());
    let fx = h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    assert!(
        fx.contains(&"timer status-settle +10s".to_owned()),
        "{fx:?}"
    );
    assert!(!fx.iter().any(|l| l.starts_with("status ")), "{fx:?}");
    // The first read shows CI running: a lasting awaiting-ci, written now.
    h.later(5);
    let fx = h.step(status(
        'a',
        &[("ci / test", CiState::Pending, "Running")],
        h.now,
    ));
    assert_eq!(fx, lines(&["status awaiting-ci"]));
    // Without any CI read, the settle timer writes it.
    let mut h = H::with(settled_policy());
    h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    h.later(10);
    let due = h.now;
    let fx = h.step(timer(TimerKind::StatusSettle, due));
    assert_eq!(fx, lines(&["status awaiting-ci"]));
}

#[test]
fn the_first_status_is_marked_only_when_forgejo_counts_no_comments() {
    for (comments, first) in [(Some(0), true), (Some(1), false), (None, false)] {
        let mut h = H::new();
        let pr = PrSnapshot {
            comments,
            ..snap('a', T0)
        };
        h.step(pr_event(PrAction::Opened, pr, "alice"));
        assert_eq!(
            statuses(&h),
            vec![("awaiting-ci".to_owned(), first)],
            "{comments:?}"
        );
        // Later statuses never are, even after a command asked for a rewrite.
        h.later(5);
        h.step(status('a', &[PASS], h.now));
        assert_eq!(statuses(&h), vec![("awaiting-review".to_owned(), false)]);
        h.r.status_comment = None;
        h.later(5);
        let pr = PrSnapshot {
            comments: Some(0),
            ..snap('a', h.now)
        };
        h.step(pr_event(PrAction::Edited, pr, "alice"));
        assert_eq!(statuses(&h), vec![("awaiting-review".to_owned(), false)]);
    }
}

#[test]
fn review_hints_reread_reviews_unless_an_approval_the_merge_recheck_reads_anyway() {
    // A change request or a review comment: its id and body matter, read at once.
    for hint in [ReviewHint::Rejected, ReviewHint::Comment] {
        let mut h = H::opened();
        h.later(30);
        let fx = h.step(Event::Review {
            hint,
            pr: snap('a', T0),
            sender: Some(login("bob")),
        });
        assert_eq!(fx, lines(&["observe reviews"]), "{hint:?}");
        assert!(h.r.approval_hints.is_empty());
    }
    // An approval (merge mode auto): noted, not read; it counts towards the merge
    // decision only.
    let mut h = H::opened();
    h.later(30);
    let fx = h.step(review_hint(snap('a', T0), "bob"));
    assert_eq!(fx, Vec::<String>::new());
    assert_eq!(
        h.r.approval_hints.get(&login("bob")).map(|x| x.at_ms),
        Some(h.now)
    );
    assert_eq!(h.reason(), "waiting for CI to report on the head");
    // Dispatch mode: an agent merges without the executor's re-check, so read.
    let mut h = H::with(Policy {
        merge_mode: MergeMode::Dispatch,
        ..policy()
    });
    h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    let fx = h.step(review_hint(snap('a', T0), "bob"));
    assert_eq!(fx, lines(&["observe reviews"]));
    assert!(h.r.approval_hints.is_empty());
    // An approval by a reviewer whose latest known review requests changes: it may
    // end that request (and its work), so read.
    let mut h = H::opened();
    h.later(5);
    h.step(reviews(&[("bob", ReviewState::RequestChanges, 'a')], h.now));
    h.later(5);
    let fx = h.step(review_hint(snap('a', T0), "bob"));
    assert!(fx.contains(&"observe reviews".to_owned()), "{fx:?}");
    assert!(h.r.approval_hints.is_empty());
}

#[test]
fn an_approval_webhook_on_a_green_bot_pr_merges_without_a_reviews_read() {
    let mut h = ready_bot();
    let fx = h.step(review_hint(bot_snap('a', T0), "carol"));
    assert_eq!(
        fx,
        lines(&[
            "merge aaa Squash delete=true",
            "timer merge-retry +1800s",
            "status merging"
        ])
    );
    // The re-check read shows carol's approval does not count (no write access): the
    // executor reports what it read and does not merge; the record no longer counts
    // the webhook and waits for an approval.
    h.later(1);
    let Event::ObservedReviews {
        reviews: mut rs, ..
    } = reviews(&[("carol", ReviewState::Approved, 'a')], h.now)
    else {
        unreachable!()
    };
    rs[0].official = false;
    h.step(Event::ResyncObserved {
        pr: bot_snap('a', T0),
        contexts: vec![CiContext {
            context: PASS.0.into(),
            state: PASS.1,
            description: PASS.2.into(),
            target_url: String::new(),
            updated_ms: T0 + 5000,
        }],
        reviews: rs,
        at_ms: h.now,
    });
    assert!(h.r.approval_hints.is_empty(), "the read replaces the hint");
    h.step(merged(MergeOutcome::TryAgain));
    h.later(30);
    let due = h.now;
    let fx = h.step(timer(TimerKind::MergeRetry, due));
    assert_eq!(fx, lines(&["status awaiting-review"]));
    assert_eq!(h.reason(), "waiting for 1 more approval");
}

/// A new head does not forget the approvals announced for the old one: it asks for a
/// reviews read (Forgejo may have made them stale or dismissed them), and they keep
/// counting until that read comes back and drops them. So a PR in the merge queue,
/// updated onto the tip, keeps its place in the gap.
#[test]
fn a_new_head_reads_the_reviews_its_approval_hints_announced() {
    let mut h = H::opened_bot();
    h.later(5);
    h.step(review_hint(bot_snap('a', T0), "carol"));
    assert_eq!(h.r.approval_hints.len(), 1);
    h.later(5);
    let fx = h.step(pr_event(
        PrAction::Synchronized,
        bot_snap('b', h.now),
        "bot",
    ));
    assert!(fx.contains(&"observe reviews".to_owned()), "{fx:?}");
    assert_eq!(h.r.approval_hints.len(), 1, "kept until the read");
    h.later(1);
    h.step(reviews(&[], h.now));
    assert!(h.r.approval_hints.is_empty(), "the read drops them");

    // Without hints, a new head reads nothing more.
    let mut h = H::opened_bot();
    h.later(5);
    let fx = h.step(pr_event(
        PrAction::Synchronized,
        bot_snap('b', h.now),
        "bot",
    ));
    assert!(!fx.contains(&"observe reviews".to_owned()), "{fx:?}");
}

/// The executor's re-check builds a fresh record from what it read (one
/// `ResyncObserved`) and asks `merge_blockers`: an approval hint only starts the
/// attempt, it never counts there, so a hinted approval the read does not show blocks
/// the merge call.
#[test]
fn the_merge_recheck_counts_only_the_approvals_it_read() {
    let mut h = ready_bot();
    h.step(review_hint(bot_snap('a', T0), "carol"));
    assert!(
        merge_blockers(&h.r, &h.p, h.now).is_empty(),
        "the hint starts it"
    );
    let read = |reviews: Vec<ReviewFact>| Event::ResyncObserved {
        pr: bot_snap('a', T0),
        contexts: vec![CiContext {
            context: PASS.0.into(),
            state: PASS.1,
            description: PASS.2.into(),
            target_url: String::new(),
            updated_ms: T0 + 5000,
        }],
        reviews,
        at_ms: h.now,
    };
    let fresh = PrRecord::new(h.r.repo.clone(), h.r.number);
    let t = step(&fresh, &read(Vec::new()), h.now, &h.p);
    assert!(t.record.approval_hints.is_empty());
    assert_eq!(
        merge_blockers(&t.record, &h.p, h.now),
        ["waiting for 1 more approval"],
        "the approval was not read: no merge call"
    );
    let Event::ObservedReviews { reviews: rs, .. } =
        reviews(&[("carol", ReviewState::Approved, 'a')], h.now)
    else {
        unreachable!()
    };
    let t = step(&fresh, &read(rs), h.now, &h.p);
    assert!(merge_blockers(&t.record, &h.p, h.now).is_empty());
}
