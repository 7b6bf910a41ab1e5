//! Normalization of every fixture in `webhooks/`, of hand-made edge cases, and of
//! malformed payloads (errors name the JSON path).

use super::*;
use crate::core::command::Command;
use crate::core::event::Target;

/// Normalizes a fixture, panicking on an error.
fn norm(event_type: &str, body: &[u8]) -> Option<Event> {
    normalize(event_type, body).unwrap_or_else(|e| panic!("{event_type}: {e}"))
}

/// The fixture repository.
fn widgets() -> RepoName {
    "forgejo-bot-test/widgets".parse().unwrap()
}

#[test]
fn every_fixture_normalizes_to_the_expected_event() {
    let cases: [(&str, &[u8], &str); 22] = [
        (
            "pull_request",
            include_bytes!("../../webhooks/pull_request_opened.json"),
            "pull_request/opened",
        ),
        (
            "pull_request",
            include_bytes!("../../webhooks/pull_request_closed_merged.json"),
            "pull_request/closed",
        ),
        (
            "pull_request",
            include_bytes!("../../webhooks/pull_request_closed.json"),
            "pull_request/closed",
        ),
        (
            "pull_request",
            include_bytes!("../../webhooks/pull_request_reopened.json"),
            "pull_request/reopened",
        ),
        (
            "pull_request",
            include_bytes!("../../webhooks/pull_request_edited.json"),
            "pull_request/edited",
        ),
        (
            "pull_request_sync",
            include_bytes!("../../webhooks/pull_request_sync.json"),
            "pull_request/synchronized",
        ),
        (
            "pull_request_label",
            include_bytes!("../../webhooks/pull_request_label.json"),
            "pull_request/labeled",
        ),
        (
            "pull_request_review_approved",
            include_bytes!("../../webhooks/pull_request_review_approved.json"),
            "review/approved",
        ),
        (
            "pull_request_review_rejected",
            include_bytes!("../../webhooks/pull_request_review_rejected.json"),
            "review/rejected",
        ),
        (
            "pull_request_review_comment",
            include_bytes!("../../webhooks/pull_request_review_comment.json"),
            "review/comment",
        ),
        (
            "pull_request_comment",
            include_bytes!("../../webhooks/pull_request_comment.json"),
            "comment",
        ),
        (
            "issues",
            include_bytes!("../../webhooks/issues_opened.json"),
            "issue/opened",
        ),
        (
            "issues",
            include_bytes!("../../webhooks/issues_closed.json"),
            "issue/closed",
        ),
        (
            "issue_label",
            include_bytes!("../../webhooks/issue_label.json"),
            "issue/labeled",
        ),
        (
            "issue_comment",
            include_bytes!("../../webhooks/issue_comment.json"),
            "comment",
        ),
        (
            "action_run_success",
            include_bytes!("../../webhooks/action_run_success.json"),
            "action_run/success",
        ),
        (
            "action_run_failure",
            include_bytes!("../../webhooks/action_run_failure.json"),
            "action_run/failure",
        ),
        (
            "action_run_recover",
            include_bytes!("../../webhooks/action_run_recover.json"),
            "action_run/recover",
        ),
        (
            "status",
            include_bytes!("../../webhooks/status_success.json"),
            "status",
        ),
        (
            "status",
            include_bytes!("../../webhooks/status_failure.json"),
            "status",
        ),
        (
            "status",
            include_bytes!("../../webhooks/status_pending.json"),
            "status",
        ),
        ("push", include_bytes!("../../webhooks/push.json"), "push"),
    ];
    for (event_type, body, name) in cases {
        let event = norm(event_type, body).unwrap_or_else(|| panic!("{name} ignored"));
        assert_eq!(event.name(), name);
        assert_ne!(event.target(), Target::None, "{name}");
        // Internal storage round-trips.
        let json = serde_json::to_string(&event).unwrap();
        let back: Event = serde_json::from_str(&json).unwrap();
        assert_eq!(back, event, "{name}");
    }
}

#[test]
fn sync_makes_mergeability_unknown_and_keeps_the_head() {
    let event = norm(
        "pull_request_sync",
        include_bytes!("../../webhooks/pull_request_sync.json"),
    )
    .unwrap();
    let Event::PullRequest {
        action, pr, sender, ..
    } = event
    else {
        panic!("not a PR event");
    };
    assert_eq!(action, PrAction::Synchronized);
    assert_eq!(pr.mergeable, None);
    assert_eq!(
        pr.head_sha.unwrap().as_str(),
        "9b1e4d7c2f0a8b36e5d14c7a9f2b0e6d8c3a5f47"
    );
    assert_eq!(pr.repo, widgets());
    assert!(pr.updated_ms > 0);
    assert!(sender.is_some());
}

#[test]
fn opened_pr_carries_the_facts_the_machine_needs() {
    let event = norm(
        "pull_request",
        include_bytes!("../../webhooks/pull_request_opened.json"),
    )
    .unwrap();
    let Event::PullRequest { pr, .. } = event else {
        panic!("not a PR event");
    };
    assert_eq!(pr.number, 12);
    assert_eq!(pr.state, PrState::Open);
    assert!(pr.body.contains("Automated by CleverAgents Bot"));
    assert!(crate::core::record::linked_issues(&pr.body).contains(&9));
    assert_eq!(pr.base_ref, "main");
    assert!(pr.mergeable.is_some());
}

#[test]
fn merged_close_is_merged() {
    let event = norm(
        "pull_request",
        include_bytes!("../../webhooks/pull_request_closed_merged.json"),
    )
    .unwrap();
    let Event::PullRequest { pr, .. } = event else {
        panic!("not a PR event");
    };
    assert_eq!(pr.state, PrState::Merged);
    let event = norm(
        "pull_request",
        include_bytes!("../../webhooks/pull_request_closed.json"),
    )
    .unwrap();
    let Event::PullRequest { pr, .. } = event else {
        panic!("not a PR event");
    };
    assert_eq!(pr.state, PrState::Closed);
}

#[test]
fn comments_carry_parsed_commands_and_route_by_is_pull() {
    let event = norm(
        "pull_request_comment",
        include_bytes!("../../webhooks/pull_request_comment.json"),
    )
    .unwrap();
    assert_eq!(event.target(), Target::Pr(widgets(), 12));
    let Event::Comment { commands, .. } = &event else {
        panic!("not a comment");
    };
    assert_eq!(commands, &vec![Command::Pause]);
    let event = norm(
        "issue_comment",
        include_bytes!("../../webhooks/issue_comment.json"),
    )
    .unwrap();
    assert_eq!(event.target(), Target::Issue(widgets(), 9));
}

#[test]
fn action_runs_find_the_pr_in_the_event_payload() {
    let event = norm(
        "action_run_failure",
        include_bytes!("../../webhooks/action_run_failure.json"),
    )
    .unwrap();
    assert_eq!(event.target(), Target::Pr(widgets(), 12));
    let Event::ActionRun { outcome, .. } = event else {
        panic!("not an action run");
    };
    assert_eq!(outcome, RunOutcome::Failure);
}

#[test]
fn status_and_push_are_repository_wide() {
    let event = norm(
        "status",
        include_bytes!("../../webhooks/status_failure.json"),
    )
    .unwrap();
    assert_eq!(event.target(), Target::Repo(widgets()));
    let Event::Status { context, .. } = event else {
        panic!("not a status");
    };
    assert_eq!(context.state, CiState::Failure);
    assert!(context.updated_ms > 0);
    let event = norm("push", include_bytes!("../../webhooks/push.json")).unwrap();
    let Event::Push { branch, .. } = event else {
        panic!("not a push");
    };
    assert_eq!(branch, "main");
}

#[test]
fn known_but_ignored_events_are_none() {
    let repo = r#"{"full_name":"o/r"}"#;
    assert_eq!(norm("wiki", b"{}"), None);
    assert_eq!(norm("release", b"not even json"), None);
    let tag = format!(r#"{{"ref":"refs/tags/v1","after":"abcd1234","repository":{repo}}}"#);
    assert_eq!(norm("push", tag.as_bytes()), None);
    let delete = format!(r#"{{"ref":"refs/heads/x","after":"0000000000","repository":{repo}}}"#);
    assert_eq!(norm("push", delete.as_bytes()), None);
    let assigned = format!(
        r#"{{"action":"assigned","number":1,"pull_request":{{"number":1}},"repository":{repo}}}"#
    );
    assert_eq!(norm("pull_request", assigned.as_bytes()), None);
    let deleted = format!(
        r#"{{"action":"deleted","issue":{{"number":1}},"comment":{{"body":"/shepherd retry"}},"repository":{repo}}}"#
    );
    assert_eq!(norm("issue_comment", deleted.as_bytes()), None);
}

#[test]
fn malformed_payloads_name_the_path() {
    let err = normalize("pull_request", br#"{"action":"opened","number":1,"pull_request":{"number":"x"},"repository":{"full_name":"o/r"}}"#).unwrap_err();
    assert_eq!(err.path, "pull_request.number");
    assert!(err.to_string().contains("pull_request.number"), "{err}");
    let err = normalize("pull_request", br#"{"action":"opened","number":1,"pull_request":{"number":1},"repository":{"full_name":"nope"}}"#).unwrap_err();
    assert_eq!(err.path, "repository.full_name");
    let err = normalize(
        "action_run_success",
        br#"{"action":"success","run":{"repository":{"full_name":"o/r"},"commit_sha":"zz"}}"#,
    )
    .unwrap_err();
    assert_eq!(err.path, "run.commit_sha");
    let err = normalize("issues", b"[1]").unwrap_err();
    assert_eq!(err.event_type, "issues");
}

#[test]
fn wip_titles_are_drafts() {
    let body = br#"{"action":"edited","number":3,"pull_request":{"number":3,"title":"[wip] thing","state":"open"},"repository":{"full_name":"o/r"}}"#;
    let Some(Event::PullRequest { pr, .. }) = norm("pull_request", body) else {
        panic!("not a PR event");
    };
    assert!(pr.draft);
}

#[test]
fn api_conversions_read_reviews_and_statuses() {
    let reviews: Vec<payload::PullReview> = serde_json::from_str(
        r#"[{"id":5,"user":{"login":"Bob"},"state":"APPROVED","commit_id":"ABCD1234","stale":false,"official":true,"dismissed":false,"submitted_at":"2026-11-30T10:00:00Z"},
            {"id":6,"user":null,"state":"COMMENT"}]"#,
    )
    .unwrap();
    let converted: Vec<_> = reviews.iter().filter_map(review).collect();
    assert_eq!(converted.len(), 1);
    assert_eq!(converted[0].reviewer.as_str(), "bob");
    assert_eq!(converted[0].state, ReviewState::Approved);
    assert_eq!(converted[0].commit_id, "abcd1234");
    let combined: payload::CombinedStatus = serde_json::from_str(
        r#"{"state":"failure","sha":"abcd","total_count":2,"statuses":[{"context":"ci / test","status":"failure","description":"Failing after 3s"},{"context":"lint","state":"success"}]}"#,
    )
    .unwrap();
    let cs = ci_contexts(&combined);
    assert_eq!(cs[0].state, CiState::Failure);
    assert_eq!(cs[1].state, CiState::Success);
    let empty: payload::CombinedStatus =
        serde_json::from_str(r#"{"state":"","sha":"","total_count":0,"statuses":null}"#).unwrap();
    assert!(ci_contexts(&empty).is_empty());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn arbitrary_bytes_never_panic(body in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
        for t in ["pull_request", "issues", "push", "status", "action_run_success", "issue_comment"] {
            let _ = normalize(t, &body);
        }
    }
}

#[test]
fn a_huge_pr_description_is_cut_before_it_enters_the_snapshot() {
    let text = include_str!("../../webhooks/pull_request_sync.json");
    let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
    let body: String = (1..=100_000).map(|n| format!("Closes #{n}\n")).collect();
    v["pull_request"]["body"] = body.into();
    let bytes = serde_json::to_vec(&v).unwrap();
    let Some(Event::PullRequest { pr, .. }) = norm("pull_request_sync", &bytes) else {
        panic!("not a PR event");
    };
    assert!(pr.body.len() <= MAX_BODY_KEPT, "{}", pr.body.len());
    assert!(pr.body.ends_with(" bytes]"), "says it was cut");
    assert!(pr.body.starts_with("Closes #1\nCloses #2\n"));
}

/// A megabyte-sized review body (any account can review, and unofficial reviews are kept
/// as facts) is cut before it enters the record.
#[test]
fn a_huge_review_body_is_cut_before_it_enters_the_record() {
    let body = "é".repeat(600_000);
    let json = format!(
        r#"[{{"id":5,"user":{{"login":"mallory"}},"state":"REQUEST_CHANGES","body":"{body}","commit_id":"abcd","stale":false,"official":false,"dismissed":false}}]"#
    );
    let reviews: Vec<crate::core::payload::PullReview> = serde_json::from_str(&json).unwrap();
    let review = review(&reviews[0]).expect("a reviewer");
    assert!(
        review.body.len() <= MAX_REVIEW_BODY_KEPT,
        "{}",
        review.body.len()
    );
    assert!(
        review.body.ends_with("[truncated from 1200000 bytes]"),
        "{}",
        &review.body[review.body.len() - 40..]
    );
}
