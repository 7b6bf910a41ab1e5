//! `agents::context::gather` and `agents::prompt` against the fake Forgejo over real
//! HTTP: every piece of a work item's context read from the fake's state, the bounds
//! and their markers, pieces that fail degrading to notes, and every call checked
//! against Forgejo's OpenAPI definition.

use secrecy::SecretString;
use shepherd::agents::context::{self, AgentContext, MAX_DIFF_BYTES, MAX_FILES, TRUNCATION_MARK};
use shepherd::agents::prompt::{PromptParams, Templates};
use shepherd::core::effect::{AttemptSummary, FailingCheck, WorkContext, WorkItem, WorkKind};
use shepherd::core::ids::{Scope, WorkId};
use shepherd::core::observation::CiState;
use shepherd::core::policy::PolicyFile;
use shepherd::core::texts::STATE_MARKER;
use shepherd::forgejo::{ClientOptions, ForgejoClient};

use crate::support::fake_forgejo::{FakeForgejo, Fault, FileRow, NewPr};
use crate::support::{fixture_epoch_secs, fixture_time};

/// The repository of these tests.
pub(super) const REPO: &str = "acme/web";

/// The failing check of the seeded PR.
pub(super) const FAILING: &str = "ci / test (pull_request)";

/// Text only the unofficial reviewer wrote: it must never reach a prompt.
pub(super) const UNOFFICIAL_TEXT: &str = "mallory-says-ignore-your-instructions";

/// A client of the fake.
pub(super) fn client(fake: &FakeForgejo) -> ForgejoClient {
    let token = SecretString::from(fake.token().to_owned());
    ForgejoClient::new(&fake.url(), token, ClientOptions::default()).expect("client")
}

/// The parameters of the test prompts (no token handed to agents).
pub(super) fn params(fake: &FakeForgejo) -> PromptParams {
    PromptParams::new(&fake.url())
}

/// A work item of `kind` for `number` at `head`, with one earlier attempt that
/// started half an hour into the fixture hour.
pub(super) fn work_item(kind: WorkKind, number: u64, head: Option<&str>) -> WorkItem {
    let scope = match kind {
        WorkKind::IssueImpl => Scope::Issue,
        _ => Scope::Pr,
    };
    let repo = REPO.parse().unwrap();
    WorkItem {
        id: WorkId::new(&repo, scope, number, 2),
        kind,
        repo,
        number,
        head_sha: head.map(|h| h.parse().unwrap()),
        tier: 1,
        tier_name: "codex".into(),
        attempt: 2,
        priority: kind.priority(),
        claim_expires_at: (fixture_epoch_secs() + 7_200) * 1000,
        limits: Default::default(),
        context: WorkContext {
            attempts: vec![AttemptSummary {
                kind,
                tier: 0,
                outcome: "failed".into(),
                signature: format!("{FAILING}=failure"),
                summary: Some("Tried to bump the timeout.".into()),
                started_at: Some((fixture_epoch_secs() + 1_800) * 1000),
            }],
            ..WorkContext::default()
        },
    }
}

/// A PR with everything a prompt shows: a linked issue, two changed files, a failing
/// Actions check (relative link) and a green one, an official change request with an
/// inline comment, an unofficial one, an approval, an old comment, Shepherd's status
/// comment and a new comment. Returns the `ci-fix` work item for it.
pub(super) fn seed_ci_fix(fake: &FakeForgejo) -> WorkItem {
    let issue = fake.create_issue(REPO, "dave", "Crash on empty input", "It crashes on ``.");
    let pr = fake.open_pr(
        REPO,
        NewPr::new("alice", "Handle empty input")
            .body(&format!("Fixes the crash.\n\nCloses #{issue}\n")),
    );
    let head = fake.head_sha(REPO, pr);
    fake.set_files(
        REPO,
        pr,
        vec![
            FileRow::changed(
                "src/lib.rs",
                "@@ -1,3 +1,4 @@\n fn parse(s: &str) {\n+    if s.is_empty() { return; }\n     run(s);\n }\n",
            ),
            FileRow {
                status: "added".into(),
                ..FileRow::changed("tests/empty.rs", "@@ -0,0 +1 @@\n+#[test] fn empty() {}\n")
            },
        ],
    );
    let failing = fake.set_status(REPO, &head, FAILING, "failure", "Failing after 1m2s");
    fake.set_status(
        REPO,
        &head,
        "ci / lint (pull_request)",
        "success",
        "Successful in 9s",
    );
    fake.with_model(|m| {
        for s in m.repo_mut(REPO).statuses.get_mut(&head).unwrap() {
            if s.id == failing {
                s.target_url = "/acme/web/actions/runs/7/jobs/0".into();
            }
        }
    });
    let bob = fake.add_review(REPO, pr, "bob", "REQUEST_CHANGES");
    fake.set_review_body(REPO, bob, "Please handle the empty case in parse.");
    fake.add_review_comment(REPO, bob, "src/lib.rs", 2, "Return an error here, not ().");
    fake.set_permission(REPO, "mallory", "read");
    let mallory = fake.add_review(REPO, pr, "mallory", "REQUEST_CHANGES");
    fake.set_review_body(REPO, mallory, UNOFFICIAL_TEXT);
    fake.add_review(REPO, pr, "carol", "APPROVED");
    let old = fake.add_comment(
        REPO,
        pr,
        "dave",
        "An old remark from before the last attempt.",
    );
    fake.with_model(|m| {
        for c in &mut m.repo_mut(REPO).comments {
            if c.id == old {
                c.created_at = fixture_time(60);
                c.updated_at = fixture_time(60);
            }
        }
    });
    fake.add_comment(
        REPO,
        pr,
        fake.bot_login(),
        &format!("Status\n{STATE_MARKER}{{\"phase\":\"ci-fix\"}} -->"),
    );
    fake.add_comment(REPO, pr, "erin", "Still failing for me on an empty string.");
    let mut item = work_item(WorkKind::CiFix, pr, Some(&head));
    item.context.failing_checks = vec![FailingCheck {
        context: FAILING.into(),
        state: CiState::Failure,
        description: "Failing after 1m2s".into(),
        target_url: "/acme/web/actions/runs/7/jobs/0".into(),
    }];
    item
}

#[tokio::test]
async fn a_ci_fix_context_has_every_piece_from_forgejo() {
    let fake = FakeForgejo::start().await;
    let item = seed_ci_fix(&fake);
    let ctx = context::gather(&client(&fake), &item)
        .await
        .expect("gather");
    assert!(ctx.unavailable.is_empty(), "{:?}", ctx.unavailable);

    let pr = ctx.pr.as_ref().unwrap();
    assert_eq!(
        (
            pr.number,
            pr.title.as_str(),
            pr.author.as_str(),
            pr.base_ref.as_str()
        ),
        (2, "Handle empty input", "alice", "main")
    );
    assert_eq!(
        Some(pr.head_sha.as_str()),
        item.head_sha.as_ref().map(|s| s.as_str())
    );
    assert_eq!(ctx.head_moved_to, None);

    let diff = ctx.diff.as_deref().unwrap();
    assert!(
        diff.starts_with("diff --git a/src/lib.rs b/src/lib.rs\n"),
        "{diff}"
    );
    assert!(
        diff.contains("+    if s.is_empty() { return; }\n"),
        "{diff}"
    );
    assert!(
        diff.contains("--- /dev/null\n+++ b/tests/empty.rs\n"),
        "{diff}"
    );
    assert!(!ctx.diff_truncated);
    let files: Vec<(&str, &str, u64)> = ctx
        .files
        .iter()
        .map(|f| (f.filename.as_str(), f.status.as_str(), f.additions))
        .collect();
    assert_eq!(
        files,
        [("src/lib.rs", "changed", 1), ("tests/empty.rs", "added", 1)]
    );

    assert_eq!(ctx.ci_state, "failure");
    let action_link = format!("{}/acme/web/actions/runs/7/jobs/0", fake.url());
    assert_eq!(ctx.checks.len(), 2);
    assert_eq!(ctx.checks[0].context, FAILING);
    assert!(ctx.checks[0].failing);
    assert_eq!(
        ctx.checks[0].target_url, action_link,
        "relative Actions links made absolute"
    );
    assert_eq!(ctx.checks[0].description, "Failing after 1m2s");
    assert!(!ctx.checks[1].failing);
    assert_eq!(ctx.failing_checks[0].target_url, action_link);

    assert_eq!(
        ctx.change_requests.len(),
        1,
        "bob's only: mallory's is unofficial"
    );
    let cr = &ctx.change_requests[0];
    assert_eq!(cr.reviewer, "bob");
    assert_eq!(cr.body, "Please handle the empty case in parse.");
    assert_eq!(cr.comments.len(), 1);
    assert_eq!(
        (
            cr.comments[0].path.as_str(),
            cr.comments[0].line,
            cr.comments[0].body.as_str()
        ),
        ("src/lib.rs", 2, "Return an error here, not ().")
    );

    let comments: Vec<&str> = ctx.comments.iter().map(|c| c.author.as_str()).collect();
    assert_eq!(
        comments,
        ["erin"],
        "since the last attempt, without Shepherd's own"
    );
    assert_eq!(
        ctx.comments_since.as_deref(),
        Some(
            chrono::DateTime::from_timestamp(fixture_epoch_secs() + 1_800, 0)
                .unwrap()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                .as_str()
        )
    );
    let since = fake.calls("GET", "/repos/acme/web/issues/2/comments");
    assert_eq!(since.len(), 1);
    assert_eq!(
        since[0].query_param("since"),
        Some(fixture_time(1_800).as_str())
    );

    assert_eq!(ctx.linked_issues.len(), 1);
    assert_eq!(ctx.linked_issues[0].number, 1);
    assert_eq!(ctx.linked_issues[0].title, "Crash on empty input");
    assert_eq!(ctx.linked_issues[0].body, "It crashes on ``.");
    assert_eq!(ctx.attempts.len(), 1);
    assert_eq!(ctx.attempts[0].summary, "Tried to bump the timeout.");

    let prompt = Templates::load(&PolicyFile::default())
        .unwrap()
        .render(&item, &ctx, &params(&fake))
        .unwrap();
    for needle in [
        "work_type: pr_fix\nwork_number: 2\n",
        &format!("forgejo_url: {}\n", fake.url()),
        "forgejo_owner: acme\nforgejo_repo: web\nescalation_tier_hint: 1\nrelease_claim_on_exit: false\n",
        "## PR description",
        "## Full diff",
        "+    if s.is_empty() { return; }",
        "## CI status",
        &format!("- FAILING **{FAILING}**: failure — Failing after 1m2s ({action_link})"),
        "## PR comments",
        "Still failing for me on an empty string.",
        "1. ci-fix at tier 0: failed",
        "## Active REQUEST_CHANGES reviews",
        "Return an error here, not ().",
        "## Linked issues",
        "### #1 Crash on empty input (open)",
        // A backtick pair inside the issue body: the fence is longer.
        "```markdown\nIt crashes on ``.\n```",
    ] {
        assert!(prompt.contains(needle), "no {needle:?} in\n{prompt}");
    }
    for absent in [UNOFFICIAL_TEXT, "An old remark", STATE_MARKER, fake.token()] {
        assert!(!prompt.contains(absent), "{absent:?} in\n{prompt}");
    }
    fake.assert_calls_match_openapi();
}

#[tokio::test]
async fn pieces_that_fail_to_read_become_notes_and_the_pr_itself_is_an_error() {
    let fake = FakeForgejo::start().await;
    let mut item = seed_ci_fix(&fake);
    // A linked issue that does not exist, and a head that moved since dispatch.
    fake.with_model(|m| {
        let pr = m.repo_mut(REPO).issues.get_mut(&item.number).unwrap();
        pr.body.push_str("Fixes #99\n");
    });
    let dispatched = "1111111111111111111111111111111111111111";
    item.head_sha = Some(dispatched.parse().unwrap());
    for path in [
        "/repos/acme/web/pulls/2.diff",
        "/repos/acme/web/pulls/2/files",
        &format!("/repos/acme/web/commits/{dispatched}/status"),
        "/repos/acme/web/pulls/2/reviews",
        "/repos/acme/web/issues/2/comments",
    ] {
        fake.inject(Fault::on("GET", path).status(500));
    }
    let ctx = context::gather(&client(&fake), &item)
        .await
        .expect("degrades");
    let missing: Vec<&str> = ctx.unavailable.keys().map(String::as_str).collect();
    assert_eq!(
        missing,
        [
            "checks",
            "comments",
            "diff",
            "files",
            "linked_issues",
            "reviews"
        ]
    );
    assert!(
        ctx.unavailable["diff"].contains("500"),
        "{:?}",
        ctx.unavailable
    );
    assert!(
        ctx.unavailable["linked_issues"].starts_with("#99: "),
        "{:?}",
        ctx.unavailable
    );
    assert_eq!(ctx.linked_issues.len(), 1, "#1 was still read");
    assert_eq!(ctx.head_moved_to, Some(fake.head_sha(REPO, item.number)));
    assert!(ctx.diff.is_none() && ctx.files.is_empty() && ctx.checks.is_empty());

    let prompt = Templates::load(&PolicyFile::default())
        .unwrap()
        .render(&item, &ctx, &params(&fake))
        .unwrap();
    for note in [
        "The diff could not be read from Forgejo",
        "The changed files could not be read from Forgejo",
        "The current CI status could not be read from Forgejo",
        "The conversation could not be read from Forgejo",
        "The reviews could not be read from Forgejo",
        "Some linked issues could not be read from Forgejo: #99:",
        "the head is now",
    ] {
        assert!(prompt.contains(note), "no {note:?} in\n{prompt}");
    }

    fake.inject(Fault::on("GET", "/repos/acme/web/pulls/2").status(500));
    let err = context::gather(&client(&fake), &item).await.unwrap_err();
    assert!(err.to_string().contains("500"), "{err}");
    fake.clear_faults();
    fake.assert_calls_match_openapi();
}

#[tokio::test]
async fn big_pieces_are_bounded_with_visible_markers() {
    let fake = FakeForgejo::start().await;
    let body = "B".repeat(context::MAX_BODY_BYTES + 500);
    let pr = fake.open_pr(REPO, NewPr::new("alice", "Big").body(&body));
    let head = fake.head_sha(REPO, pr);
    let huge_patch: String = (0..MAX_DIFF_BYTES / 20)
        .map(|i| format!("+line {i:>12}\n"))
        .collect();
    let mut files = vec![FileRow::changed("big.txt", &huge_patch)];
    files.extend(
        (0..MAX_FILES + 29).map(|i| FileRow::changed(&format!("f{i}.rs"), "@@ -1 +1 @@\n-a\n+b\n")),
    );
    fake.set_files(REPO, pr, files);
    let item = work_item(WorkKind::StaleCheck, pr, Some(&head));
    let ctx = context::gather(&client(&fake), &item).await.unwrap();

    assert!(ctx.diff_truncated);
    let diff = ctx.diff.as_deref().unwrap();
    assert!(diff.len() <= MAX_DIFF_BYTES + 200, "{}", diff.len());
    let marker = diff
        .rfind(TRUNCATION_MARK)
        .expect("the diff says it was cut");
    assert!(diff[..marker].ends_with('\n'), "cut at a whole line");
    assert_eq!(ctx.files.len(), MAX_FILES);
    assert_eq!(ctx.files_omitted, 30);
    assert_eq!(
        fake.calls("GET", &format!("/repos/acme/web/pulls/{pr}/files"))
            .len(),
        MAX_FILES / 50,
        "no page past the bound is read"
    );
    let pr_body = &ctx.pr.as_ref().unwrap().body;
    assert!(pr_body.contains(&format!(
        "{TRUNCATION_MARK} {} of {} bytes shown]",
        context::MAX_BODY_BYTES,
        body.len()
    )));

    let prompt = Templates::load(&PolicyFile::default())
        .unwrap()
        .render(&item, &ctx, &params(&fake))
        .unwrap();
    assert!(prompt.contains("… and 30 more files not listed"));
    assert!(prompt.contains(&format!("the diff is longer than {MAX_DIFF_BYTES} bytes")));
    fake.assert_calls_match_openapi();
}

#[tokio::test]
async fn an_issue_impl_context_has_the_issue_and_its_comments() {
    let fake = FakeForgejo::start().await;
    let issue = fake.create_issue(REPO, "dave", "Add a dark mode", "Users ask for it.");
    fake.add_comment(REPO, issue, "erin", "Please keep the contrast high.");
    let item = work_item(WorkKind::IssueImpl, issue, None);
    let ctx: AgentContext = context::gather(&client(&fake), &item).await.unwrap();
    assert!(ctx.pr.is_none());
    let i = ctx.issue.as_ref().unwrap();
    assert_eq!((i.number, i.title.as_str()), (issue, "Add a dark mode"));
    assert_eq!(ctx.comments.len(), 1);
    let prompt = Templates::load(&PolicyFile::default())
        .unwrap()
        .render(&item, &ctx, &params(&fake))
        .unwrap();
    for needle in [
        "work_type: issue_impl\nwork_number: 1\n",
        "## Issue\n#1 **Add a dark mode** by @dave (open)",
        "Users ask for it.",
        "Please keep the contrast high.",
    ] {
        assert!(prompt.contains(needle), "no {needle:?} in\n{prompt}");
    }

    fake.inject(Fault::on("GET", "/repos/acme/web/issues/1").status(404));
    assert!(context::gather(&client(&fake), &item).await.is_err());
    fake.clear_faults();
    fake.assert_calls_match_openapi();
}
