//! One transition at a time, asserting the full effect list.

use super::*;
use crate::core::machine::merge_blockers;
use crate::core::policy::MergeMode;
use crate::core::record::{AttemptOutcome, ConflictFact, Hold, MergeState};

/// `ci / test` failing.
const FAIL: (&str, CiState, &str) = ("ci / test", CiState::Failure, "Failing after 1m2s");
/// `ci / test` passing.
const PASS: (&str, CiState, &str) = ("ci / test", CiState::Success, "Successful in 58s");
/// `ci / test` running.
const RUN: (&str, CiState, &str) = ("ci / test", CiState::Pending, "Running");

/// A human PR with failing CI and a ci-fix claimed.
fn claimed() -> H {
    let mut h = H::opened();
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    assert!(h.r.work.active.is_some());
    h
}

/// A bot PR with green CI and one approval: ready to merge.
fn ready_bot() -> H {
    let mut h = H::opened_bot();
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.later(1);
    h
}

#[test]
fn opened_pr_polls_ci_and_posts_status() {
    let mut h = H::new();
    let fx = h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"));
    assert_eq!(
        fx,
        lines(&[
            "timer stale-check +86400s",
            "timer ci-poll +5s",
            "status awaiting-ci"
        ])
    );
    assert_eq!(h.r.version, 1);
    assert_eq!(h.phase(), Phase::AwaitingCi);
}

#[test]
fn ci_poll_backs_off_while_pending_and_stops_when_settled() {
    let mut h = H::opened();
    assert_eq!(
        h.fire_ci_poll(),
        lines(&["observe status aaa", "timer ci-poll +10s"])
    );
    h.step(status('a', &[RUN], h.now));
    assert_eq!(
        h.fire_ci_poll(),
        lines(&["observe status aaa", "timer ci-poll +20s"])
    );
    assert_eq!(
        h.fire_ci_poll(),
        lines(&["observe status aaa", "timer ci-poll +40s"])
    );
    assert_eq!(
        h.fire_ci_poll(),
        lines(&["observe status aaa", "timer ci-poll +80s"])
    );
    assert_eq!(
        h.fire_ci_poll(),
        lines(&["observe status aaa", "timer ci-poll +120s"])
    );
    assert_eq!(
        h.fire_ci_poll(),
        lines(&["observe status aaa", "timer ci-poll +120s"])
    );
    // A duplicate firing of an old timer does nothing.
    let stale = timer(TimerKind::CiPoll { sha: sha('a') }, T0 + 5000);
    let t = step(&h.r, &stale, h.now, &h.p);
    assert!(t.is_noop());
    let fx = h.step(status('a', &[PASS], h.now));
    assert_eq!(fx, lines(&["status awaiting-review"]));
    assert_eq!(h.r.ci_poll, None);
}

#[test]
fn action_run_reads_the_status_of_the_head_only() {
    let mut h = H::opened();
    let run = |c: char| Event::ActionRun {
        repo: repo(),
        sha: sha(c),
        pr_number: None,
        outcome: crate::core::event::RunOutcome::Failure,
        sender: Some(login("alice")),
    };
    assert_eq!(h.step(run('a')), lines(&["observe status aaa"]));
    assert!(step(&h.r, &run('b'), h.now, &h.p).is_noop());
}

#[test]
fn an_actions_event_for_the_head_stops_its_backoff_reads() {
    let mut h = H::opened();
    assert_eq!(
        h.fire_ci_poll(),
        lines(&["observe status aaa", "timer ci-poll +10s"])
    );
    let run = Event::ActionRun {
        repo: repo(),
        sha: sha('a'),
        pr_number: None,
        outcome: crate::core::event::RunOutcome::Success,
        sender: Some(login("alice")),
    };
    // The event triggers the read; the timer already scheduled then reads nothing.
    assert_eq!(h.step(run.clone()), lines(&["observe status aaa"]));
    assert!(h.r.ci_poll.as_ref().is_some_and(|p| p.events));
    let poll = h.r.ci_poll.clone().expect("the poll stays, stopped");
    h.now = h.now.max(poll.due_ms);
    let due = timer(TimerKind::CiPoll { sha: sha('a') }, poll.due_ms);
    assert!(step(&h.r, &due, h.now, &h.p).is_noop(), "no backoff read");
    // Every later Actions event still triggers its read.
    assert_eq!(h.step(run), lines(&["observe status aaa"]));
    // A new head polls again from the start.
    h.step(pr_event(
        PrAction::Synchronized,
        snap('b', T0 + 60_000),
        "alice",
    ));
    assert!(
        h.r.ci_poll
            .as_ref()
            .is_some_and(|p| p.sha == sha('b') && !p.events)
    );
}

#[test]
fn failing_ci_dispatches_a_claimed_ci_fix() {
    let mut h = H::opened();
    h.later(5);
    let fx = h.step(status('a', &[FAIL], h.now));
    assert_eq!(
        fx,
        lines(&[
            "dispatch ci-fix tier=0 attempt=1 head=aaa",
            "timer claim-expiry +7200s",
            "+auto/claimed-implementer,auto/last-attempt-tier-0",
            "status ci-fix",
        ])
    );
    let EffectKind::Dispatch(item) = &h.effects()[0].kind else {
        panic!("not a dispatch");
    };
    assert_eq!(item.context.failing_checks.len(), 1);
    assert_eq!(item.priority, 40);
    assert_eq!(h.phase(), Phase::CiFix);
}

#[test]
fn work_item_json_is_exactly_the_contract() {
    let h = claimed();
    let EffectKind::Dispatch(item) = &h.effects()[0].kind else {
        panic!("not a dispatch");
    };
    let v = serde_json::to_value(item).unwrap();
    let keys: BTreeSet<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        BTreeSet::from([
            "id",
            "kind",
            "repo",
            "number",
            "head_sha",
            "tier",
            "tier_name",
            "attempt",
            "priority",
            "claim_expires_at",
            "context"
        ])
    );
    let context: BTreeSet<&str> = v["context"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        context,
        BTreeSet::from(["failing_checks", "change_requests", "attempts"])
    );
    assert_eq!(v["kind"], "ci-fix");
    assert_eq!(v["repo"], "acme/widgets");
    assert_eq!(v["number"], 7);
    assert_eq!(v["tier"], 0);
    assert_eq!(v["tier_name"], "haiku");
    assert_eq!(v["attempt"], 1);
    assert_eq!(v["id"], "acme:widgets:pr:7:1");
    assert_eq!(v["claim_expires_at"], "2027-01-15T10:00:05.000Z");
    let back: crate::core::effect::WorkItem = serde_json::from_value(v).unwrap();
    assert_eq!(&back, item);
}

#[test]
fn success_report_waits_for_the_push() {
    let mut h = claimed();
    let id = h.work_id();
    let fx = h.step(result(&id, WorkOutcome::Succeeded));
    // The wait for the push has a deadline (`push_grace_secs`, tests/grace.rs).
    assert_eq!(
        fx,
        lines(&[
            "timer push-grace +300s",
            "-auto/claimed-implementer",
            "status ci-fix"
        ])
    );
    assert!(
        h.reason().contains("waiting for the push of attempt 1"),
        "{}",
        h.reason()
    );
    // Duplicate report: nothing.
    assert!(step(&h.r, &result(&id, WorkOutcome::Succeeded), h.now, &h.p).is_noop());
}

#[test]
fn agent_push_ends_the_claim_without_cancel() {
    let mut h = claimed();
    h.later(60);
    let fx = h.step(pr_event(
        PrAction::Synchronized,
        PrSnapshot {
            mergeable: None,
            ..snap('b', h.now)
        },
        "bot",
    ));
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
    assert_eq!(h.r.work.attempts[0].outcome, AttemptOutcome::Superseded);
    // The late report fills in the attempt.
    let id = h.r.work.attempts[0].work_id.clone();
    assert_eq!(
        h.step(result(&id, WorkOutcome::Succeeded)),
        Vec::<String>::new()
    );
    assert_eq!(h.r.work.attempts[0].outcome, AttemptOutcome::Succeeded);
}

#[test]
fn human_push_cancels_the_claim() {
    let mut h = claimed();
    let id = h.work_id();
    h.later(60);
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
            &format!("cancel {id}"),
            "timer mergeability +10s",
            "timer stale-check +86400s",
            "timer ci-poll +5s",
            "-auto/claimed-implementer",
            "status awaiting-ci",
        ])
    );
}

#[test]
fn expired_claim_is_a_failed_attempt_and_escalates() {
    let mut h = claimed();
    let id = h.work_id();
    let due = h.r.work.active.as_ref().unwrap().expires_ms;
    h.now = due;
    let fx = h.step(timer(
        TimerKind::ClaimExpiry {
            work_id: id.clone(),
        },
        due,
    ));
    assert_eq!(
        fx,
        lines(&[
            &format!("cancel {id}"),
            "dispatch ci-fix tier=1 attempt=2 head=aaa",
            "timer claim-expiry +7200s",
            "-auto/last-attempt-tier-0",
            "+auto/last-attempt-tier-1",
            "status ci-fix",
        ])
    );
    assert_eq!(h.r.work.attempts[0].outcome, AttemptOutcome::Expired);
}

#[test]
fn a_different_failure_stays_at_the_tier() {
    let mut h = claimed();
    let id = h.work_id();
    h.step(result(&id, WorkOutcome::Failed));
    // The failure changed: another context now fails, not the same problem.
    let h2 = {
        let mut h2 = claimed();
        let id = h2.work_id();
        h2.later(10);
        h2.step(status(
            'a',
            &[("lint", CiState::Failure, "2 warnings")],
            h2.now,
        ));
        h2.step(result(&id, WorkOutcome::Failed));
        h2
    };
    let tier_of = |h: &H| h.r.work.active.as_ref().unwrap().item.tier;
    assert_eq!(tier_of(&h), 1, "same failure escalates");
    assert_eq!(tier_of(&h2), 0, "a different failure is progress");
}

#[test]
fn failure_signature_ignores_durations() {
    let mut h = claimed();
    let id = h.work_id();
    h.later(10);
    h.step(status(
        'a',
        &[("ci / test", CiState::Failure, "Failing after 3m17s")],
        h.now,
    ));
    h.step(result(&id, WorkOutcome::Failed));
    assert_eq!(h.r.work.active.as_ref().unwrap().item.tier, 1);
}

#[test]
fn active_change_request_dispatches_review_feedback() {
    let mut h = H::opened();
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    let fx = h.step(reviews(&[("bob", ReviewState::RequestChanges, 'a')], h.now));
    assert_eq!(
        fx,
        lines(&[
            "dispatch review-feedback tier=0 attempt=1 head=aaa",
            "timer claim-expiry +7200s",
            "+auto/claimed-implementer,auto/last-attempt-tier-0",
            "status review-feedback",
        ])
    );
    let EffectKind::Dispatch(item) = &h.effects()[0].kind else {
        panic!("not a dispatch");
    };
    assert_eq!(item.context.change_requests[0].reviewer.as_str(), "bob");
}

#[test]
fn addressed_change_request_still_blocks_merging() {
    let mut h = H::opened_bot();
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    // bob's change request is on an older commit: addressed, waiting for re-review.
    h.step(reviews(
        &[
            ("bob", ReviewState::RequestChanges, 'f'),
            ("carol", ReviewState::Approved, 'a'),
        ],
        h.now,
    ));
    assert_eq!(h.phase(), Phase::AwaitingReview);
    assert!(
        h.reason().contains("changes requested by bob"),
        "{}",
        h.reason()
    );
    assert!(h.r.work.active.is_none());
}

#[test]
fn ready_bot_pr_merges_without_reading_the_reviews_again() {
    // The executor's pre-merge re-check reads PR, status and reviews right before the
    // merge call: the machine does not read the reviews first (issue 17).
    let mut h = ready_bot();
    let fx = h.step(reviews(&[("carol", ReviewState::Approved, 'a')], h.now));
    assert_eq!(
        fx,
        lines(&[
            "merge aaa Squash delete=true",
            "timer merge-retry +1800s",
            "status merging"
        ])
    );
    assert_eq!(h.phase(), Phase::Merging);
}

#[test]
fn a_record_stored_while_verifying_merges_at_its_next_step() {
    // Records written by a build that read the reviews before merging.
    let mut h = ready_bot();
    h.step(reviews(&[("carol", ReviewState::Approved, 'a')], h.now));
    h.step(merged(MergeOutcome::TryAgain));
    h.r.merge = MergeState::Verifying {
        sha: sha('a'),
        since_ms: h.now,
    };
    h.later(60);
    let due = h.now;
    let fx = h.step(timer(TimerKind::MergeRetry, due));
    assert_eq!(
        fx,
        lines(&[
            "merge aaa Squash delete=true",
            "timer merge-retry +1800s",
            "status merging"
        ])
    );
}

#[test]
fn dismissed_approval_found_by_the_merge_recheck_stops_the_merge() {
    let mut h = ready_bot();
    h.step(reviews(&[("carol", ReviewState::Approved, 'a')], h.now));
    assert!(matches!(h.r.merge, MergeState::InFlight { .. }));
    h.later(1);
    // What the executor reports when its re-check finds the approval dismissed.
    let Event::ObservedReviews {
        reviews: mut rs, ..
    } = reviews(&[("carol", ReviewState::Approved, 'a')], h.now)
    else {
        unreachable!()
    };
    rs[0].dismissed = true;
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
    h.step(merged(MergeOutcome::TryAgain));
    h.later(30);
    let due = h.now;
    let fx = h.step(timer(TimerKind::MergeRetry, due));
    assert_eq!(fx, lines(&["status awaiting-review"]));
    assert_eq!(h.r.merge, MergeState::Idle);
}

#[test]
fn human_pr_needs_two_approvals() {
    let mut h = H::opened();
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.step(reviews(&[("carol", ReviewState::Approved, 'a')], h.now));
    assert_eq!(h.phase(), Phase::AwaitingReview);
    assert_eq!(h.reason(), "waiting for 1 more approval");
    h.later(1);
    let fx = h.step(reviews(
        &[
            ("carol", ReviewState::Approved, 'a'),
            ("dave", ReviewState::Approved, 'a'),
        ],
        h.now,
    ));
    assert_eq!(
        fx,
        lines(&[
            "merge aaa Squash delete=true",
            "timer merge-retry +1800s",
            "status merging"
        ])
    );
}

#[test]
fn merge_outcomes() {
    let in_flight = || {
        let mut h = ready_bot();
        h.step(reviews(&[("carol", ReviewState::Approved, 'a')], h.now));
        assert!(matches!(h.r.merge, MergeState::InFlight { .. }));
        h
    };
    let mut h = in_flight();
    assert_eq!(
        h.step(merged(MergeOutcome::Merged)),
        lines(&["comment #9", "status merged"])
    );
    assert_eq!(h.phase(), Phase::Merged);
    assert!(h.r.merge_announced);

    let mut h = in_flight();
    let fx = h.step(merged(MergeOutcome::Conflict));
    assert_eq!(
        fx,
        lines(&[
            "dispatch merge-conflicts tier=0 attempt=1 head=aaa",
            "timer claim-expiry +7200s",
            "+auto/claimed-implementer,auto/last-attempt-tier-0",
            "status merge-conflicts",
        ])
    );

    // The head moved: read the PR; the stale head is not tried again meanwhile (the
    // new head ends the back-off).
    let mut h = in_flight();
    assert_eq!(
        h.step(merged(MergeOutcome::HeadMoved)),
        lines(&[
            "observe pr",
            "timer merge-retry +30s",
            "status ready-to-merge"
        ])
    );
    assert!(matches!(h.r.merge, MergeState::Backoff { .. }));
    h.later(1);
    h.step(Event::ObservedPr {
        pr: bot_snap('b', h.now),
    });
    assert_eq!(h.r.merge, MergeState::Idle);
    assert_eq!(h.phase(), Phase::AwaitingCi);

    let mut h = in_flight();
    assert_eq!(
        h.step(merged(MergeOutcome::TryAgain)),
        lines(&["timer merge-retry +30s", "status ready-to-merge"])
    );
    assert!(step(&h.r, &merged(MergeOutcome::TryAgain), h.now, &h.p).is_noop());
    h.later(30);
    let due = h.now;
    assert_eq!(
        h.step(timer(TimerKind::MergeRetry, due)),
        lines(&[
            "merge aaa Squash delete=true",
            "timer merge-retry +1800s",
            "status merging"
        ])
    );

    // A busy merge lease: the fallback timer at the holder's remaining life, and the
    // timer ends the wait whenever it fires (early: woken by the lease's releaser),
    // while a "try again later" back-off ignores an early timer.
    let mut h = in_flight();
    assert_eq!(
        h.step(merged(MergeOutcome::LockBusy { retry_ms: 5_000 })),
        lines(&["timer merge-retry +5s", "status ready-to-merge"])
    );
    assert!(
        merge_blockers(&h.r, &h.p, h.now)
            .iter()
            .any(|b| b.contains("merge lease")),
        "{:?}",
        merge_blockers(&h.r, &h.p, h.now)
    );
    h.later(1);
    let woken = h.now;
    assert_eq!(
        h.step(timer(TimerKind::MergeRetry, woken)),
        lines(&[
            "merge aaa Squash delete=true",
            "timer merge-retry +1800s",
            "status merging"
        ])
    );
    let mut h = in_flight();
    h.step(merged(MergeOutcome::TryAgain));
    h.later(1);
    let early = h.now;
    assert!(step(&h.r, &timer(TimerKind::MergeRetry, early), h.now, &h.p).is_noop());

    let mut h = in_flight();
    let fx = h.step(merged(MergeOutcome::FailedPermanent {
        message: "not allowed".into(),
    }));
    assert_eq!(
        fx,
        lines(&["comment #7", "+needs feedback", "status needs-human"])
    );
}

#[test]
fn closing_cancels_work_and_releases_the_claim() {
    let mut h = claimed();
    let id = h.work_id();
    h.later(10);
    let fx = h.step(pr_event(
        PrAction::Closed,
        PrSnapshot {
            state: PrState::Closed,
            ..snap('a', h.now)
        },
        "alice",
    ));
    assert_eq!(
        fx,
        lines(&[
            &format!("cancel {id}"),
            "-auto/claimed-implementer",
            "status closed"
        ])
    );
    assert_eq!(h.r.work.attempts[0].outcome, AttemptOutcome::Cancelled);
}

#[test]
fn push_to_the_base_rereads_mergeability_other_branches_are_ignored() {
    let mut h = H::opened();
    let push = |b: &str| Event::Push {
        repo: repo(),
        branch: b.into(),
        after: Some(sha('e')),
        sender: Some(login("alice")),
    };
    assert_eq!(h.step(push("main")), lines(&["timer mergeability +10s"]));
    assert!(step(&h.r, &push("other"), h.now, &h.p).is_noop());
    let elsewhere = Event::Push {
        repo: "acme/other".parse().unwrap(),
        branch: "main".into(),
        after: None,
        sender: None,
    };
    assert!(step(&h.r, &elsewhere, h.now, &h.p).is_noop());
}

#[test]
fn one_unmergeable_read_is_only_a_suspicion() {
    let mut h = H::opened();
    h.later(20);
    let fx = h.step(Event::ObservedPr {
        pr: PrSnapshot {
            mergeable: Some(false),
            ..snap('a', T0 + 1)
        },
    });
    assert_eq!(fx, lines(&["timer mergeability +10s"]));
    assert!(matches!(h.r.conflict, ConflictFact::Suspected { .. }));
    h.later(10);
    let fx = h.step(Event::ObservedPr {
        pr: PrSnapshot {
            mergeable: Some(false),
            ..snap('a', T0 + 2)
        },
    });
    assert_eq!(
        fx,
        lines(&[
            "dispatch merge-conflicts tier=0 attempt=1 head=aaa",
            "timer claim-expiry +7200s",
            "+auto/claimed-implementer,auto/last-attempt-tier-0",
            "status merge-conflicts",
        ])
    );
}

#[test]
fn older_snapshots_never_overwrite_newer_ones() {
    let mut h = H::opened();
    h.step(pr_event(
        PrAction::Synchronized,
        PrSnapshot {
            mergeable: None,
            ..snap('b', T0 + 10)
        },
        "alice",
    ));
    let t = step(
        &h.r,
        &pr_event(PrAction::Labeled, snap('a', T0 + 5), "alice"),
        h.now,
        &h.p,
    );
    assert_eq!(t.record.head_sha(), Some(&sha('b')));
}

#[test]
fn bot_events_update_facts_but_never_start_work() {
    let mut h = H::opened();
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    let id = h.work_id();
    h.step(result(&id, WorkOutcome::Failed));
    assert!(h.r.work.active.is_some(), "observations may dispatch");
    let mut h = H::opened();
    h.later(5);
    // CI is known to fail, but the only event since is the bot's own label change.
    h.r.ci
        .insert(sha('a'), crate::core::record::ShaCi::default());
    h.r.ci.get_mut(&sha('a')).unwrap().contexts.insert(
        "ci / test".into(),
        CiContext {
            context: "ci / test".into(),
            state: CiState::Failure,
            description: String::new(),
            target_url: String::new(),
            updated_ms: 1,
        },
    );
    let fx = h.step(pr_event(PrAction::Labeled, snap('a', h.now), "bot"));
    assert!(fx.iter().all(|l| !l.starts_with("dispatch")), "{fx:?}");
    // Repeating the bot's event changes nothing.
    assert!(
        step(
            &h.r,
            &pr_event(PrAction::Labeled, snap('a', h.now), "bot"),
            h.now,
            &h.p
        )
        .is_noop()
    );
}

#[test]
fn stuck_goes_to_needs_human_once() {
    let mut h = claimed();
    for _ in 0..6 {
        let id = h.work_id();
        h.later(60);
        h.step(result(&id, WorkOutcome::Failed));
    }
    // tiers 0,1,2,3,3,3: three at the top with the same failure.
    assert_eq!(h.r.work.attempts.len(), 6);
    assert!(h.r.work.active.is_none());
    assert_eq!(h.phase(), Phase::NeedsHuman);
    let fx = h
        .effects()
        .iter()
        .map(|e| show(e, h.now))
        .collect::<Vec<_>>();
    assert_eq!(
        fx,
        lines(&[
            "comment #7",
            "-auto/claimed-implementer",
            "+needs feedback",
            "status needs-human"
        ])
    );
    let EffectKind::Comment { body, .. } = &h.effects()[0].kind else {
        panic!("not a comment");
    };
    assert!(body.contains("| 6 | ci-fix | opus | failed |"), "{body}");
    // Nothing more happens on new observations.
    h.later(60);
    let fx = h.step(status('a', &[FAIL], h.now));
    assert_eq!(fx, Vec::<String>::new());
}

/// A PR stuck in needs-human.
fn stuck() -> H {
    let mut h = claimed();
    for _ in 0..6 {
        let id = h.work_id();
        h.later(60);
        h.step(result(&id, WorkOutcome::Failed));
    }
    assert!(matches!(h.r.work.hold, Some(Hold::NeedsHuman { .. })));
    h
}

#[test]
fn resume_by_removing_the_label() {
    let mut h = stuck();
    h.later(10);
    let with_label = PrSnapshot {
        labels: BTreeSet::from(["needs feedback".to_owned()]),
        ..snap('a', h.now)
    };
    assert_eq!(
        h.step(pr_event(PrAction::Labeled, with_label, "bot")),
        Vec::<String>::new()
    );
    h.later(10);
    let fx = h.step(pr_event(PrAction::Labeled, snap('a', h.now), "alice"));
    assert_eq!(
        fx,
        lines(&[
            "timer stale-check +86400s",
            "dispatch ci-fix tier=3 attempt=7 head=aaa",
            "timer claim-expiry +7200s",
            "-needs feedback",
            "+auto/claimed-implementer",
            "status ci-fix",
        ])
    );
}

#[test]
fn resume_by_command_from_a_trusted_user() {
    let mut h = stuck();
    h.p.trusted_users = vec!["Alice".into()];
    h.later(10);
    let fx = h.step(comment(1, "ok, try again\n/shepherd resume", "alice"));
    assert_eq!(fx[1], "dispatch ci-fix tier=3 attempt=7 head=aaa");
}

#[test]
fn resume_by_a_push_of_a_user_with_write_access() {
    let mut h = stuck();
    h.later(10);
    let fx = h.step(pr_event(
        PrAction::Synchronized,
        PrSnapshot {
            mergeable: None,
            ..snap('b', h.now)
        },
        "alice",
    ));
    // The pusher's permission is read first: a push without write access does not
    // clear the hold (issue 26).
    assert!(
        fx.contains(&"observe permission alice".to_owned()),
        "{fx:?}"
    );
    assert!(matches!(h.r.work.hold, Some(Hold::NeedsHuman { .. })));
    h.later(1);
    h.step(Event::ObservedPermission {
        repo: repo(),
        scope: Scope::Pr,
        number: PR,
        login: login("alice"),
        permission: crate::core::event::Permission::Write,
        at_ms: h.now,
    });
    assert_eq!(h.r.work.hold, None);
    assert_eq!(h.phase(), Phase::AwaitingCi);
}

#[test]
fn untrusted_commands_wait_for_the_permission() {
    let mut h = H::opened();
    let fx = h.step(comment(1, "/shepherd pause", "mallory"));
    assert_eq!(fx, lines(&["observe permission mallory"]));
    let perm = |p| Event::ObservedPermission {
        repo: repo(),
        scope: Scope::Pr,
        number: PR,
        login: login("mallory"),
        permission: p,
        at_ms: T0,
    };
    let mut refused = H {
        r: h.r.clone(),
        now: h.now,
        p: h.p.clone(),
        last: None,
    };
    assert_eq!(
        refused.step(perm(crate::core::event::Permission::Read)),
        lines(&["comment #7"])
    );
    assert_eq!(refused.r.work.hold, None);
    assert_eq!(
        h.step(perm(crate::core::event::Permission::Write)),
        lines(&["status paused"])
    );
    assert_eq!(h.phase(), Phase::Paused);
    // The same comment delivered again does nothing.
    assert!(step(&h.r, &comment(1, "/shepherd pause", "mallory"), h.now, &h.p).is_noop());
}

#[test]
fn bot_comments_never_command() {
    let h = H::opened();
    let t = step(&h.r, &comment(1, "/shepherd pause", "bot"), h.now, &h.p);
    assert!(t.is_noop());
}

#[test]
fn escalate_command_raises_the_next_tier() {
    let mut h = H::opened();
    h.p.trusted_users = vec!["alice".into()];
    h.step(comment(1, "/shepherd escalate", "alice"));
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    assert_eq!(h.r.work.active.as_ref().unwrap().item.tier, 1);
}

#[test]
fn drafts_are_never_ready() {
    let mut h = H::new();
    h.step(pr_event(
        PrAction::Opened,
        PrSnapshot {
            draft: true,
            mergeable: Some(false),
            ..bot_snap('a', T0)
        },
        "bot",
    ));
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.step(reviews(&[("carol", ReviewState::Approved, 'a')], h.now));
    assert_eq!(h.phase(), Phase::AwaitingReview);
    assert_eq!(h.reason(), "draft (WIP)");
    assert_eq!(
        h.r.conflict,
        ConflictFact::Unknown,
        "WIP reads as unmergeable; not a conflict"
    );
}

#[test]
fn dispatch_mode_hands_ready_prs_to_an_agent() {
    let mut h = H::with(Policy {
        merge_mode: MergeMode::Dispatch,
        ..policy()
    });
    h.step(pr_event(PrAction::Opened, bot_snap('a', T0), "bot"));
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    let fx = h.step(reviews(&[("carol", ReviewState::Approved, 'a')], h.now));
    assert_eq!(
        fx,
        lines(&[
            "dispatch ready-to-merge tier=0 attempt=1 head=aaa",
            "timer claim-expiry +7200s",
            "+auto/claimed-implementer,auto/last-attempt-tier-0",
            "status merging",
        ])
    );
}

#[test]
fn required_contexts_must_be_present() {
    let mut h = H::with(Policy {
        required_contexts: vec!["ci / *".into(), "deploy".into()],
        ..policy()
    });
    h.step(pr_event(PrAction::Opened, bot_snap('a', T0), "bot"));
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.step(reviews(&[("carol", ReviewState::Approved, 'a')], h.now));
    assert_eq!(h.phase(), Phase::AwaitingCi);
    assert_eq!(h.reason(), "waiting for CI: deploy");
}

#[test]
fn stale_pr_gets_one_stale_check() {
    let mut h = H::opened();
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.now = T0 + 86_400_000;
    let fx = h.step(timer(TimerKind::StaleCheck, h.now));
    assert_eq!(
        fx,
        lines(&[
            "dispatch stale-check tier=0 attempt=1 head=aaa",
            "timer claim-expiry +7200s",
            "+auto/claimed-implementer,auto/last-attempt-tier-0",
            "status awaiting-review",
        ])
    );
    let id = h.work_id();
    h.step(result(&id, WorkOutcome::NoChanges));
    h.later(3600);
    let fx = h.step(timer(TimerKind::StaleCheck, h.now));
    assert!(fx.iter().all(|l| !l.starts_with("dispatch")), "{fx:?}");
}

#[test]
fn merged_webhook_announces_once_and_stops() {
    let mut h = claimed();
    let id = h.work_id();
    h.later(10);
    let done = PrSnapshot {
        state: PrState::Merged,
        ..snap('a', h.now)
    };
    let fx = h.step(pr_event(PrAction::Closed, done.clone(), "alice"));
    assert_eq!(
        fx,
        lines(&[
            &format!("cancel {id}"),
            "comment #9",
            "-auto/claimed-implementer",
            "status merged"
        ])
    );
    assert!(
        step(
            &h.r,
            &pr_event(PrAction::Closed, done, "alice"),
            h.now,
            &h.p
        )
        .is_noop()
    );
}

#[test]
fn events_for_other_records_are_noops() {
    let h = H::opened();
    let other = Event::ObservedPr {
        pr: PrSnapshot {
            number: 8,
            ..snap('a', T0)
        },
    };
    assert!(step(&h.r, &other, h.now, &h.p).is_noop());
    let foreign: WorkId = "acme:widgets:pr:8:1".parse().unwrap();
    assert!(step(&h.r, &result(&foreign, WorkOutcome::Failed), h.now, &h.p).is_noop());
}

#[test]
fn bot_opened_pr_without_human_activity_still_gets_a_stale_check() {
    let mut h = H::opened_bot();
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.now = T0 + 86_400_000;
    let fx = h.step(timer(TimerKind::StaleCheck, h.now));
    assert_eq!(fx[0], "dispatch stale-check tier=0 attempt=1 head=aaa");
}

#[test]
fn pause_stops_dispatch_and_merge_until_resume() {
    let mut h = ready_bot();
    h.p.trusted_users = vec!["alice".into()];
    assert_eq!(
        h.step(comment(1, "/shepherd pause", "alice")),
        lines(&["timer stale-check +86400s", "status paused"])
    );
    h.later(1);
    assert_eq!(
        h.step(reviews(&[("carol", ReviewState::Approved, 'a')], h.now)),
        Vec::<String>::new()
    );
    let fx = h.step(comment(2, "/shepherd resume", "alice"));
    assert_eq!(
        fx,
        lines(&[
            "timer stale-check +86400s",
            "merge aaa Squash delete=true",
            "timer merge-retry +1800s",
            "status merging"
        ])
    );
}

#[test]
fn gitea_status_for_the_head_is_a_ci_fact() {
    let mut h = H::opened();
    h.later(5);
    let ev = |c: char, state| Event::Status {
        repo: repo(),
        sha: sha(c),
        context: CiContext {
            context: "ci / test".into(),
            state,
            description: "x".into(),
            target_url: String::new(),
            updated_ms: T0 + 5000,
        },
        sender: Some(login("ci")),
    };
    assert!(step(&h.r, &ev('b', CiState::Failure), h.now, &h.p).is_noop());
    let fx = h.step(ev('a', CiState::Success));
    assert_eq!(fx, lines(&["status awaiting-review"]));
}

#[test]
fn resync_of_an_unknown_pr_builds_the_whole_record() {
    let mut h = H::new();
    let pr = snap('a', T0);
    let contexts = vec![CiContext {
        context: "ci / test".into(),
        state: CiState::Success,
        description: String::new(),
        target_url: String::new(),
        updated_ms: T0,
    }];
    let Event::ObservedReviews { reviews: rs, .. } = reviews(
        &[
            ("bob", ReviewState::Approved, 'a'),
            ("carol", ReviewState::Approved, 'a'),
        ],
        T0,
    ) else {
        unreachable!()
    };
    h.later(60);
    let fx = h.step(Event::ResyncObserved {
        pr,
        contexts,
        reviews: rs,
        at_ms: h.now,
    });
    assert_eq!(
        fx,
        lines(&[
            "timer stale-check +86340s",
            "merge aaa Squash delete=true",
            "timer merge-retry +1800s",
            "status merging"
        ])
    );
}

#[test]
fn failed_dispatch_ends_the_claim_and_counts() {
    let mut h = claimed();
    let id = h.work_id();
    let failed = Event::EffectOutcome {
        repo: repo(),
        scope: Scope::Pr,
        number: PR,
        effect_id: "e".parse().unwrap(),
        outcome: EffectOutcome::Failed {
            kind: crate::core::effect::EffectKindName::Dispatch,
            work_id: Some(id),
            message: "sink down".into(),
        },
    };
    let fx = h.step(failed.clone());
    assert_eq!(fx[0], "dispatch ci-fix tier=1 attempt=2 head=aaa");
    assert_eq!(h.r.work.attempts[0].outcome, AttemptOutcome::DispatchFailed);
    assert!(step(&h.r, &failed, h.now, &h.p).is_noop());
}

#[test]
fn late_merge_outcomes_are_ignored() {
    let h = ready_bot();
    for o in [
        MergeOutcome::Conflict,
        MergeOutcome::HeadMoved,
        MergeOutcome::TryAgain,
        MergeOutcome::FailedPermanent {
            message: "x".into(),
        },
    ] {
        assert!(step(&h.r, &merged(o), h.now, &h.p).is_noop());
    }
}

#[test]
fn mergeability_timer_reads_the_pr() {
    let mut h = H::opened();
    h.later(10);
    let now = h.now;
    assert_eq!(
        h.step(timer(TimerKind::Mergeability, now)),
        lines(&["observe pr"])
    );
}

#[test]
fn a_merge_whose_outcome_never_comes_is_given_up_after_the_watchdog() {
    let mut h = ready_bot();
    h.step(reviews(&[("carol", ReviewState::Approved, 'a')], h.now));
    assert!(matches!(h.r.merge, MergeState::InFlight { .. }));
    // An earlier merge-retry timer, replaced by the watchdog, may still fire: nothing
    // happens.
    let early = h.now;
    assert!(step(&h.r, &timer(TimerKind::MergeRetry, early), early, &h.p).is_noop());
    // No outcome for 30 minutes (the effect was dead-lettered): read the PR, back off.
    h.later(1800);
    let due = h.now;
    assert_eq!(
        h.step(timer(TimerKind::MergeRetry, due)),
        lines(&[
            "observe pr",
            "timer merge-retry +60s",
            "status ready-to-merge"
        ])
    );
    assert!(matches!(h.r.merge, MergeState::Backoff { .. }));
    // The late outcome of that merge still counts if it says merged ...
    let late = step(&h.r, &merged(MergeOutcome::Merged), h.now, &h.p);
    assert_eq!(
        late.record.pr.as_ref().map(|pr| pr.state),
        Some(PrState::Merged)
    );
    // ... and is ignored otherwise.
    assert!(step(&h.r, &merged(MergeOutcome::Conflict), h.now, &h.p).is_noop());
    // Still open a minute later: merge again (the executor re-checks first).
    h.later(60);
    let due = h.now;
    assert_eq!(
        h.step(timer(TimerKind::MergeRetry, due)),
        lines(&[
            "merge aaa Squash delete=true",
            "timer merge-retry +1800s",
            "status merging"
        ])
    );
}

#[test]
fn reopening_resumes_the_machine() {
    let mut h = H::opened();
    h.later(10);
    h.step(pr_event(
        PrAction::Closed,
        PrSnapshot {
            state: PrState::Closed,
            ..snap('a', h.now)
        },
        "alice",
    ));
    assert_eq!(h.phase(), Phase::Closed);
    h.later(10);
    let fx = h.step(pr_event(PrAction::Reopened, snap('a', h.now), "alice"));
    assert_eq!(
        fx,
        lines(&[
            "timer stale-check +86400s",
            "timer ci-poll +5s",
            "status awaiting-ci"
        ])
    );
}

#[test]
fn a_label_payload_of_the_same_second_does_not_undo_a_push() {
    let mut h = H::opened();
    h.step(pr_event(
        PrAction::Synchronized,
        PrSnapshot {
            mergeable: None,
            ..snap('b', T0 + 1000)
        },
        "alice",
    ));
    let late = pr_event(PrAction::Labeled, snap('a', T0 + 1000), "alice");
    assert_eq!(
        step(&h.r, &late, h.now, &h.p).record.head_sha(),
        Some(&sha('b'))
    );
    // An API read of the same second is authoritative.
    let read = Event::ObservedPr {
        pr: snap('c', T0 + 1000),
    };
    assert_eq!(
        step(&h.r, &read, h.now, &h.p).record.head_sha(),
        Some(&sha('c'))
    );
}

#[test]
fn a_merged_pr_stays_merged_when_an_older_same_second_label_payload_arrives() {
    let mut h = H::new();
    let mut merged_snap = snap('a', 1_000);
    merged_snap.state = crate::core::observation::PrState::Merged;
    h.step(pr_event(PrAction::Closed, merged_snap, "alice"));
    // A label payload taken before the merge, in the same second, with the same head.
    h.step(pr_event(PrAction::Labeled, snap('a', 1_000), "alice"));
    assert_eq!(
        h.r.pr.as_ref().map(|p| p.state),
        Some(crate::core::observation::PrState::Merged)
    );
}
