//! The sample work items prompt templates are checked against at start: a full and
//! a degraded one of each kind (every optional piece of context could not be read).

use crate::agents::context::*;
use crate::core::effect::{
    AttemptSummary, ChangeRequest, FailingCheck, ReviewRequest, WorkContext, WorkItem, WorkKind,
};
use crate::core::observation::CiState;

/// A full and a degraded sample of `kind`.
pub(super) fn items(kind: WorkKind) -> [(WorkItem, AgentContext); 2] {
    let item = WorkItem {
        id: "sample-owner:sample-repo:pr:1:2"
            .parse()
            .expect("a work id"),
        kind,
        repo: "sample-owner/sample-repo".parse().expect("a repository"),
        number: 1,
        head_sha: Some(
            "0123456789abcdef0123456789abcdef01234567"
                .parse()
                .expect("a sha"),
        ),
        tier: 1,
        tier_name: "codex".into(),
        attempt: 2,
        priority: kind.priority(),
        claim_expires_at: 0,
        limits: Default::default(),
        context: WorkContext {
            failing_checks: vec![FailingCheck {
                context: "ci / test".into(),
                state: CiState::Failure,
                description: "Failing after 1m".into(),
                target_url: "/o/r/actions/runs/1/jobs/0".into(),
            }],
            change_requests: vec![ChangeRequest {
                review_id: 9,
                reviewer: "reviewer".parse().expect("a login"),
                body: "Please rename it.".into(),
            }],
            attempts: vec![AttemptSummary {
                kind,
                tier: 0,
                outcome: "failed".into(),
                signature: "ci / test=failure".into(),
                summary: Some("Tried a fix.".into()),
                started_at: Some(0),
            }],
            note: None,
            review: (kind == WorkKind::Review).then(|| ReviewRequest {
                reviewer: "reviewer-agent".parse().expect("a login"),
                round: 2,
                max_rounds: 3,
            }),
            author_trusted: Some(false),
            issue: (kind == WorkKind::IssueImpl).then(|| {
                Box::new(crate::core::effect::IssueWork {
                    branch: "shepherd/issue-1".into(),
                    base: Some("shepherd/issue-5".into()),
                    base_of: Some((5, 9)),
                })
            }),
        },
    };
    let text = |s: &str| s.to_owned();
    let full = AgentContext {
        repo: text("sample-owner/sample-repo"),
        owner: text("sample-owner"),
        name: text("sample-repo"),
        pr: (kind != WorkKind::IssueImpl).then(|| PrContext {
            number: 1,
            title: text("A change"),
            body: text("Closes #2"),
            author: text("author"),
            head_ref: text("feature"),
            head_sha: text("0123456789abcdef0123456789abcdef01234567"),
            base_ref: text("main"),
            base_sha: text("89abcdef0123456789abcdef0123456789abcdef"),
            state: text("open"),
            draft: false,
            url: text("https://forgejo.example/o/r/pulls/1"),
            untrusted: text(UNTRUSTED_AUTHOR),
        }),
        issue: (kind == WorkKind::IssueImpl).then(|| issue(1)),
        diff: Some(text("diff --git a/x b/x\n")),
        diff_truncated: false,
        files: vec![FileContext {
            filename: text("x"),
            status: text("changed"),
            additions: 1,
            ..FileContext::default()
        }],
        files_omitted: 1,
        ci_state: text("failure"),
        checks: vec![CheckContext {
            context: text("ci / test"),
            state: text("failure"),
            description: text("Failing after 1m"),
            target_url: text("https://forgejo.example/o/r/actions/runs/1/jobs/0"),
            failing: true,
        }],
        checks_omitted: 1,
        failing_checks: Vec::new(),
        ci_logs: vec![
            crate::agents::ci_logs::CheckLog {
                context: text("ci / test"),
                url: text("https://forgejo.example/o/r/actions/runs/1/jobs/0"),
                job: text("test"),
                tail: text("error: it broke\n"),
                tail_note: text("the whole log (16 bytes)"),
                errors: text("error: earlier\n"),
                unavailable: String::new(),
            },
            crate::agents::ci_logs::CheckLog {
                context: text("ci / lint"),
                url: text("https://forgejo.example/o/r/actions/runs/1/jobs/1"),
                unavailable: text("Forgejo 15.0.3 does not serve job logs over its API"),
                ..Default::default()
            },
        ],
        change_requests: vec![ChangeRequestContext {
            review_id: 9,
            reviewer: text("reviewer"),
            body: text("Please rename it."),
            comments: vec![ReviewCommentContext {
                author: text("reviewer"),
                path: text("x"),
                line: 3,
                body: text("here"),
                diff_hunk: text("@@ -1 +1 @@"),
            }],
            comments_omitted: 1,
            comments_unavailable: Some(text("HTTP 500")),
        }],
        change_requests_omitted: 1,
        reviews: vec![crate::agents::review::EarlierReview {
            id: 8,
            reviewer: text("reviewer-agent"),
            state: text("REQUEST_CHANGES"),
            commit_id: text("89abcdef0123456789abcdef0123456789abcdef"),
            submitted_at: text("2020-01-01T00:00:00+00:00"),
            stale: true,
            dismissed: false,
            body: text("Handle the empty list."),
        }],
        reviews_omitted: 1,
        comments: vec![CommentContext {
            id: 5,
            author: text("someone"),
            created_at: text("2020-01-01T00:00:00+00:00"),
            body: text("A comment"),
            untrusted: text(UNTRUSTED_COMMENTER),
        }],
        comments_omitted: 1,
        comments_since: Some(text("2020-01-01T00:00:00.000Z")),
        linked_issues: vec![issue(2)],
        linked_issues_omitted: 1,
        epic: Some(IssueContext {
            body: text("Parts:\n- [x] #2\n- [ ] #3 the rest\n"),
            ..issue(4)
        }),
        attempts: vec![AttemptContext {
            kind: text(kind.as_str()),
            tier: 0,
            outcome: text("failed"),
            signature: text("ci / test=failure"),
            summary: text("Tried a fix."),
            started_at: text("2020-01-01T00:00:00.000Z"),
        }],
        unavailable: Default::default(),
        head_moved_to: Some(text("fedcba9876543210fedcba9876543210fedcba98")),
        inputs: (kind == WorkKind::IssueImpl).then(|| IssueInputs {
            labels: vec![text("Type/Bug"), text("Priority/High")],
            milestone: text("v1.2"),
            branch: text("shepherd/issue-1"),
            base: text("shepherd/issue-5"),
            base_is_default: false,
            base_issue: Some(5),
            base_pr: Some(9),
        }),
    };
    let mut degraded = AgentContext {
        repo: full.repo.clone(),
        owner: full.owner.clone(),
        name: full.name.clone(),
        pr: full.pr.clone(),
        issue: full.issue.clone(),
        // No labels, no milestone, and the default branch's name unreadable.
        inputs: (kind == WorkKind::IssueImpl).then(|| IssueInputs {
            branch: text("shepherd/issue-1"),
            base_is_default: true,
            ..IssueInputs::default()
        }),
        ..AgentContext::default()
    };
    for piece in [
        "diff",
        "files",
        "checks",
        "reviews",
        "comments",
        "linked_issues",
        "epic",
        "base_branch",
    ] {
        degraded.unavailable.insert(piece.into(), text("HTTP 500"));
    }
    [(item.clone(), full), (item, degraded)]
}

fn issue(number: u64) -> IssueContext {
    IssueContext {
        number,
        title: "An issue".into(),
        body: "Something to do.".into(),
        author: "reporter".into(),
        state: "open".into(),
        url: format!("https://forgejo.example/o/r/issues/{number}"),
    }
}
