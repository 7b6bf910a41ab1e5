//! The real Forgejo client against the fake Forgejo: every endpoint, every merge
//! outcome, retry classification and `Retry-After`, pagination, the label cache and the
//! circuit breaker.

use std::time::{Duration, Instant};

use secrecy::SecretString;
use shepherd::core::policy::{MergeStyle, UpdateStyle};
use shepherd::forgejo::{
    BreakerConfig, BreakerState, ClientOptions, ForgejoClient, ForgejoError, MergeConflictKind,
    MergeOutcome, MergeRefusal, MergeRequest, UpdateOutcome,
};
use shepherd::telemetry::Metrics;

use crate::support::fake_forgejo::{FakeForgejo, Fault, NewPr, Protection};

const REPO: &str = "acme/widgets";

fn client(fake: &FakeForgejo) -> ForgejoClient {
    client_with(fake, ClientOptions::default())
}

fn client_with(fake: &FakeForgejo, options: ClientOptions) -> ForgejoClient {
    let token = SecretString::from(fake.token().to_owned());
    ForgejoClient::new(&fake.url(), token, options).expect("client")
}

fn merge_request(sha: &str) -> MergeRequest {
    MergeRequest {
        style: MergeStyle::Squash,
        head_commit_id: sha.to_owned(),
        delete_branch_after_merge: true,
        title: None,
        message: None,
    }
}

/// Opens a mergeable PR and returns (number, head sha).
fn ready_pr(fake: &FakeForgejo) -> (u64, String) {
    let n = fake.open_pr(REPO, NewPr::new("alice", "Add widgets"));
    (n, fake.head_sha(REPO, n))
}

#[tokio::test]
async fn get_pull_reads_the_fields_we_need() {
    let fake = FakeForgejo::start().await;
    let n = fake.open_pr(
        REPO,
        NewPr::new("alice", "Add widgets")
            .body("Closes #9")
            .label("kind/feature")
            .head_ref("alice/widgets")
            .head_sha(&"ab".repeat(20)),
    );
    let pr = client(&fake).get_pull(REPO, n).await.expect("get");
    assert_eq!(pr.number, n);
    assert_eq!(pr.user.login, "alice");
    assert_eq!(pr.body, "Closes #9");
    assert_eq!(pr.head.sha, "ab".repeat(20));
    assert_eq!(pr.head.ref_name, "alice/widgets");
    assert_eq!(pr.base.ref_name, "main");
    assert!(!pr.base.sha.is_empty());
    assert!(pr.mergeable && !pr.merged && !pr.draft && pr.is_open());
    assert_eq!(pr.labels[0].name, "kind/feature");

    fake.set_title(REPO, n, "WIP: Add widgets");
    let pr = client(&fake).get_pull(REPO, n).await.expect("get");
    assert!(pr.draft && !pr.mergeable, "a WIP title makes a draft");

    let calls = fake.calls("GET", &format!("/repos/{REPO}/pulls/{n}"));
    assert_eq!(calls.len(), 2);
    assert!(
        calls[0].user_agent.starts_with("shepherd/"),
        "{:?}",
        calls[0]
    );
}

#[tokio::test]
async fn missing_pull_and_bad_token_are_permanent_errors() {
    let fake = FakeForgejo::start().await;
    fake.create_repo(REPO);
    let e = client(&fake).get_pull(REPO, 77).await.unwrap_err();
    assert!(e.is_not_found() && !e.is_retryable(), "{e}");

    let bad = ForgejoClient::new(
        &fake.url(),
        SecretString::from("wrong".to_owned()),
        ClientOptions::default(),
    )
    .unwrap();
    let e = bad.version().await.unwrap_err();
    assert_eq!(e.status(), Some(401));
    assert!(!e.is_retryable());
    assert!(
        !e.to_string().contains("wrong"),
        "errors never show the token: {e}"
    );
    assert_eq!(
        client(&fake).version().await.unwrap(),
        "15.0.3+gitea-1.22.0"
    );
    let me = client(&fake).current_user().await.unwrap();
    assert_eq!(me.login, fake.bot_login());

    let e = client(&fake).get_pull("not-a-repo", 1).await.unwrap_err();
    assert!(matches!(e, ForgejoError::Invalid(_)), "{e}");
}

#[tokio::test]
async fn open_pulls_are_listed_with_state_open_across_pages() {
    let fake = FakeForgejo::start().await;
    for i in 0..125 {
        let n = fake.open_pr(REPO, NewPr::new("alice", &format!("PR {i}")));
        if i % 25 == 0 {
            fake.close(REPO, n);
        }
    }
    let prs = client(&fake).list_open_pulls(REPO).await.expect("list");
    assert_eq!(prs.len(), 120);
    assert!(prs.iter().all(|p| p.is_open()));
    let mut numbers: Vec<u64> = prs.iter().map(|p| p.number).collect();
    numbers.sort_unstable();
    numbers.dedup();
    assert_eq!(numbers.len(), 120, "no PR twice");
    let calls = fake.calls("GET", &format!("/repos/{REPO}/pulls"));
    assert_eq!(calls.len(), 3);
    for (i, c) in calls.iter().enumerate() {
        assert_eq!(c.query_param("state"), Some("open"));
        assert_eq!(c.query_param("limit"), Some("50"));
        assert_eq!(c.query_param("page"), Some((i + 1).to_string().as_str()));
    }
}

#[tokio::test]
async fn reviews_are_read_across_pages_with_their_flags() {
    let fake = FakeForgejo::start().await;
    let (n, _) = ready_pr(&fake);
    for i in 0..59 {
        fake.add_review(REPO, n, &format!("reviewer{i}"), "COMMENT");
    }
    let approval = fake.add_review(REPO, n, "bob", "APPROVED");
    fake.push(REPO, n, &"cd".repeat(20));
    fake.update_review(REPO, approval, |r| r.dismissed = true);
    let change = fake.add_review(REPO, n, "carol", "REQUEST_CHANGES");
    let reviews = client(&fake).list_reviews(REPO, n).await.expect("reviews");
    assert_eq!(reviews.len(), 61);
    let bob = reviews.iter().find(|r| r.id == approval).unwrap();
    assert_eq!(bob.state, "APPROVED");
    assert!(bob.stale && bob.dismissed && bob.official);
    assert_ne!(bob.commit_id, "cd".repeat(20));
    assert!(bob.submitted_at.is_some());
    let carol = reviews.iter().find(|r| r.id == change).unwrap();
    assert_eq!(
        (carol.state.as_str(), carol.stale, carol.commit_id.as_str()),
        ("REQUEST_CHANGES", false, "cd".repeat(20).as_str())
    );
    assert_eq!(
        fake.calls("GET", &format!("/repos/{REPO}/pulls/{n}/reviews"))
            .len(),
        2
    );
}

#[tokio::test]
async fn combined_status_merges_pages_and_computes_the_state() {
    let fake = FakeForgejo::start().await;
    let (_, sha) = ready_pr(&fake);
    let c = client(&fake);

    let empty = c.combined_status(REPO, &sha).await.expect("status");
    assert_eq!((empty.state.as_str(), empty.total_count), ("", 0));
    assert!(empty.statuses.is_empty());

    for i in 0..60 {
        fake.set_status(REPO, &sha, &format!("ci/job-{i:02}"), "pending", "queued");
    }
    for i in 0..60 {
        fake.set_status(REPO, &sha, &format!("ci/job-{i:02}"), "success", "ok");
    }
    let all = c.combined_status(REPO, &sha).await.expect("status");
    assert_eq!(
        (all.state.as_str(), all.total_count, all.statuses.len()),
        ("success", 60, 60)
    );
    assert_eq!(all.sha, sha);
    let calls = fake.calls("GET", &format!("/repos/{REPO}/commits/{sha}/status"));
    assert_eq!(calls.last().unwrap().query_param("limit"), Some("50"));
    assert_eq!(calls.len(), 1 + 2, "one call when empty, two pages of 60");

    // The one failing context is on the second page: the merged state still sees it.
    fake.set_status(REPO, &sha, "ci/job-59", "error", "boom");
    let failing = c.combined_status(REPO, &sha).await.unwrap();
    assert_eq!(failing.state, "failure", "error is reported as failure");
    let job = failing
        .statuses
        .iter()
        .find(|s| s.context == "ci/job-59")
        .unwrap();
    assert_eq!(
        (job.status.as_str(), job.description.as_str()),
        ("error", "boom")
    );
    fake.set_status(REPO, &sha, "ci/job-59", "warning", "flaky");
    fake.set_status(REPO, &sha, "ci/job-00", "pending", "rerun");
    assert_eq!(
        c.combined_status(REPO, &sha).await.unwrap().state,
        "warning",
        "warning ranks below pending"
    );

    let history = c.list_statuses(REPO, &sha).await.expect("statuses");
    assert_eq!(history.len(), 123, "every status, not only the latest");
    assert!(
        history.iter().all(|s| !s.status.is_empty()),
        "state read from the key `status`"
    );
}

#[tokio::test]
async fn labels_are_added_by_name_created_once_and_removed_by_id() {
    let fake = FakeForgejo::start().await;
    let (n, _) = ready_pr(&fake);
    let existing = fake.create_label(REPO, "needs feedback");
    let c = client(&fake);

    let mut tasks = Vec::new();
    for _ in 0..8 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.add_labels(REPO, n, &["auto/claimed-implementer", "needs feedback"])
                .await
        }));
    }
    for t in tasks {
        let labels = t.await.unwrap().expect("add");
        assert!(labels.iter().any(|l| l.name == "auto/claimed-implementer"));
    }
    assert_eq!(
        fake.calls("POST", &format!("/repos/{REPO}/labels")).len(),
        1,
        "created exactly once"
    );
    assert_eq!(
        fake.calls("GET", &format!("/repos/{REPO}/labels")).len(),
        1,
        "listed once, then cached"
    );
    let post = &fake.calls("POST", &format!("/repos/{REPO}/issues/{n}/labels"))[0];
    assert_eq!(
        post.body["labels"],
        serde_json::json!(["auto/claimed-implementer", "needs feedback"])
    );
    let created = fake
        .repo_labels(REPO)
        .into_iter()
        .find(|l| l.name == "auto/claimed-implementer")
        .unwrap();
    assert_eq!(created.color.len(), 6);
    assert_eq!(
        fake.labels_on(REPO, n),
        vec!["auto/claimed-implementer", "needs feedback"]
    );

    assert!(
        c.remove_label(REPO, n, "needs feedback")
            .await
            .expect("remove")
    );
    assert_eq!(
        fake.calls(
            "DELETE",
            &format!("/repos/{REPO}/issues/{n}/labels/{existing}")
        )
        .len(),
        1,
        "by id"
    );
    assert_eq!(fake.labels_on(REPO, n), vec!["auto/claimed-implementer"]);
    assert!(!c.remove_label(REPO, n, "never-existed").await.unwrap());
    assert!(
        c.remove_label(REPO, n, "needs feedback").await.unwrap(),
        "not on the issue: a quiet 204"
    );

    // A label deleted behind the cache's back is recreated on the next add.
    fake.with_model(|m| {
        m.repo_mut(REPO)
            .labels
            .retain(|l| l.name != "auto/claimed-implementer")
    });
    let labels = c
        .add_labels(REPO, n, &["auto/claimed-implementer"])
        .await
        .unwrap();
    assert_eq!(labels.len(), 1);
    assert_eq!(
        fake.calls("POST", &format!("/repos/{REPO}/labels")).len(),
        2
    );
    assert_eq!(c.list_repo_labels(REPO).await.unwrap().len(), 2);
}

#[tokio::test]
async fn comments_are_created_edited_and_found_by_marker() {
    let fake = FakeForgejo::start().await;
    let (n, _) = ready_pr(&fake);
    fake.add_comment(REPO, n, "mallory", "<!-- shepherd:effect-1 --> fake");
    let c = client(&fake);
    let posted = c
        .create_comment(REPO, n, "Status\n<!-- shepherd:effect-1 -->")
        .await
        .expect("create");
    assert_eq!(posted.user.login, fake.bot_login());
    let found = c
        .find_comment_with_marker(
            REPO,
            n,
            "<!-- shepherd:effect-1 -->",
            Some(fake.bot_login()),
        )
        .await
        .unwrap()
        .expect("found");
    assert_eq!(found.id, posted.id);
    assert!(
        c.find_comment_with_marker(REPO, n, "<!-- other -->", None)
            .await
            .unwrap()
            .is_none()
    );
    let edited = c
        .edit_comment(REPO, posted.id, "Status v2\n<!-- shepherd:effect-1 -->")
        .await
        .expect("edit");
    assert_eq!(edited.id, posted.id);
    assert_eq!(
        fake.calls(
            "PATCH",
            &format!("/repos/{REPO}/issues/comments/{}", posted.id)
        )
        .len(),
        1
    );
    let all = c.list_comments(REPO, n).await.unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(
        fake.comments_on(REPO, n)[1].body,
        "Status v2\n<!-- shepherd:effect-1 -->"
    );
    let e = c.edit_comment(REPO, 999_999, "x").await.unwrap_err();
    assert!(e.is_not_found());
}

#[tokio::test]
async fn collaborator_permissions() {
    let fake = FakeForgejo::start().await;
    fake.create_repo(REPO);
    fake.set_permission(REPO, "dana", "write");
    fake.set_permission(REPO, "erin", "none");
    let c = client(&fake);
    assert!(
        c.collaborator_permission(REPO, "dana")
            .await
            .unwrap()
            .can_write()
    );
    assert_eq!(
        c.collaborator_permission(REPO, "erin")
            .await
            .unwrap()
            .permission,
        "none"
    );
    assert_eq!(
        c.collaborator_permission(REPO, "acme")
            .await
            .unwrap()
            .permission,
        "owner"
    );
    assert!(
        c.collaborator_permission(REPO, "ghost")
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test]
async fn merge_succeeds_with_the_exact_body_and_closes_linked_issues() {
    let fake = FakeForgejo::start().await;
    let issue = fake.create_issue(REPO, "alice", "Widgets are missing", "");
    let n = fake.open_pr(
        REPO,
        NewPr::new("alice", "Add widgets").body(&format!("Closes #{issue}.")),
    );
    let sha = fake.head_sha(REPO, n);
    let c = client(&fake);
    assert!(!c.is_merged(REPO, n).await.unwrap());
    let mut req = merge_request(&sha);
    req.title = Some("Add widgets (#2)".into());
    let outcome = c.merge(REPO, n, &req).await.expect("merge");
    assert!(matches!(outcome, MergeOutcome::Merged), "{outcome:?}");
    assert!(c.is_merged(REPO, n).await.unwrap());

    let call = &fake.calls("POST", &format!("/repos/{REPO}/pulls/{n}/merge"))[0];
    let keys: Vec<&String> = call.body.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "Do",
            "MergeTitleField",
            "delete_branch_after_merge",
            "head_commit_id"
        ]
    );
    assert_eq!(call.body["Do"], "squash");
    assert_eq!(call.body["head_commit_id"], sha.as_str());
    let merges = fake.merges();
    assert_eq!(
        (merges.len(), merges[0].merged_sha.as_str()),
        (1, sha.as_str())
    );

    let pr = c.get_pull(REPO, n).await.unwrap();
    assert!(pr.merged && !pr.is_open() && pr.merged_at.is_some() && pr.merge_commit_sha.is_some());
    assert_eq!(
        fake.issue(REPO, issue).state,
        "closed",
        "Forgejo closes `Closes #N` issues"
    );
    let closed = fake.pr_closed(REPO, n, fake.bot_login());
    let p = &closed.payload["pull_request"];
    assert_eq!(
        (p["merged"].as_bool(), p["state"].as_str()),
        (Some(true), Some("closed"))
    );
    assert_eq!(p["merged_by"]["login"], fake.bot_login());
    assert_eq!(
        p["merge_commit_sha"],
        pr.merge_commit_sha.clone().unwrap().as_str()
    );

    let again = c.merge(REPO, n, &merge_request(&sha)).await.unwrap();
    assert!(
        matches!(
            again,
            MergeOutcome::NotAllowed {
                refusal: MergeRefusal::AlreadyMerged,
                ..
            }
        ),
        "{again:?}"
    );
    assert_eq!(fake.merges().len(), 1);
}

#[tokio::test]
async fn merge_refusals_are_classified() {
    let fake = FakeForgejo::start().await;
    let c = client(&fake);
    let (n, sha) = ready_pr(&fake);
    let refusal = |o: MergeOutcome| match o {
        MergeOutcome::NotAllowed { refusal, .. } => refusal,
        other => panic!("expected 405, got {other:?}"),
    };

    fake.set_mergeable(REPO, n, false);
    assert_eq!(
        refusal(c.merge(REPO, n, &merge_request(&sha)).await.unwrap()),
        MergeRefusal::NotMergeable
    );
    fake.set_mergeable(REPO, n, true);

    fake.set_protection(
        REPO,
        Protection {
            status_checks: Some(vec!["ci/*".into()]),
            required_approvals: 1,
            block_on_rejected_reviews: true,
            ..Protection::default()
        },
    );
    let reason = |r: &str| MergeRefusal::Protection(r.to_owned());
    assert_eq!(
        refusal(c.merge(REPO, n, &merge_request(&sha)).await.unwrap()),
        reason("Not all required status checks successful"),
        "a required pattern without a status is pending"
    );
    fake.set_status(REPO, &sha, "ci/build", "success", "ok");
    assert_eq!(
        refusal(c.merge(REPO, n, &merge_request(&sha)).await.unwrap()),
        reason("Does not have enough approvals")
    );
    let approval = fake.add_review(REPO, n, "bob", "APPROVED");
    fake.update_review(REPO, approval, |r| r.dismissed = true);
    assert_eq!(
        refusal(c.merge(REPO, n, &merge_request(&sha)).await.unwrap()),
        reason("Does not have enough approvals"),
        "dismissed approvals do not count"
    );
    fake.set_permission(REPO, "stranger", "read");
    fake.add_review(REPO, n, "stranger", "APPROVED");
    assert_eq!(
        refusal(c.merge(REPO, n, &merge_request(&sha)).await.unwrap()),
        reason("Does not have enough approvals"),
        "a reader's approval is not official"
    );
    fake.add_review(REPO, n, "bob", "APPROVED");
    fake.add_review(REPO, n, "carol", "REQUEST_CHANGES");
    assert_eq!(
        refusal(c.merge(REPO, n, &merge_request(&sha)).await.unwrap()),
        reason("There are requested changes")
    );
    fake.add_review(REPO, n, "carol", "APPROVED");

    fake.set_title(REPO, n, "[WIP] Add widgets");
    assert_eq!(
        refusal(c.merge(REPO, n, &merge_request(&sha)).await.unwrap()),
        MergeRefusal::WorkInProgress
    );
    fake.set_title(REPO, n, "Add widgets");

    fake.set_permission(REPO, fake.bot_login(), "read");
    assert_eq!(
        refusal(c.merge(REPO, n, &merge_request(&sha)).await.unwrap()),
        MergeRefusal::UserNotAllowed
    );
    fake.set_permission(REPO, fake.bot_login(), "write");

    assert!(fake.merges().is_empty());
    assert!(
        c.merge(REPO, n, &merge_request(&sha))
            .await
            .unwrap()
            .is_merged()
    );
}

#[tokio::test]
async fn merge_conflicts_moved_heads_and_closed_prs() {
    let fake = FakeForgejo::start().await;
    let c = client(&fake);
    let (n, old) = ready_pr(&fake);
    fake.push(REPO, n, &"ee".repeat(20));
    let o = c.merge(REPO, n, &merge_request(&old)).await.unwrap();
    assert!(
        matches!(
            o,
            MergeOutcome::Conflict {
                kind: MergeConflictKind::HeadOutOfDate,
                ..
            }
        ),
        "{o:?}"
    );

    fake.set_merge_conflict(REPO, n, true);
    let o = c
        .merge(REPO, n, &merge_request(&"ee".repeat(20)))
        .await
        .unwrap();
    assert!(
        matches!(
            o,
            MergeOutcome::Conflict {
                kind: MergeConflictKind::Conflict,
                ..
            }
        ),
        "{o:?}"
    );
    assert!(fake.merges().is_empty());

    let (closed, sha) = ready_pr(&fake);
    fake.close(REPO, closed);
    let o = c.merge(REPO, closed, &merge_request(&sha)).await.unwrap();
    assert!(matches!(o, MergeOutcome::NotFound { .. }), "{o:?}");
    let o = c.merge(REPO, 999, &merge_request(&sha)).await.unwrap();
    assert!(matches!(o, MergeOutcome::NotFound { .. }), "{o:?}");
}

#[tokio::test]
async fn merge_that_cannot_delete_the_branch_answers_403_which_alone_is_not_merged() {
    let fake = FakeForgejo::start().await;
    let n = fake.open_pr(REPO, NewPr::new("alice", "Release").head_ref("release"));
    fake.protect_branch(REPO, "release");
    let o = client(&fake)
        .merge(REPO, n, &merge_request(&fake.head_sha(REPO, n)))
        .await
        .unwrap();
    assert!(
        matches!(o, MergeOutcome::Forbidden { .. }) && !o.is_merged(),
        "{o:?}"
    );
    assert!(fake.issue(REPO, n).pull.unwrap().merged);
}

#[tokio::test]
async fn ambiguous_merges_need_a_re_read() {
    let fake = FakeForgejo::start().await;
    let c = client_with(
        &fake,
        ClientOptions {
            timeout: Some(Duration::from_millis(300)),
            ..ClientOptions::default()
        },
    );
    let (n, sha) = ready_pr(&fake);
    let path = format!("/repos/{REPO}/pulls/{n}/merge");

    // Merged, yet the client sees 500.
    fake.inject(Fault::on("POST", &path).apply_then(500).times(1));
    let o = c.merge(REPO, n, &merge_request(&sha)).await.unwrap();
    let MergeOutcome::Ambiguous { error } = o else {
        panic!("expected ambiguous, got {o:?}")
    };
    assert_eq!(error.status(), Some(500));
    assert!(
        c.is_merged(REPO, n).await.unwrap(),
        "the re-read shows it merged"
    );
    assert_eq!(fake.merges().len(), 1);

    // A hung request: timeout, nothing merged.
    let (m, sha) = ready_pr(&fake);
    fake.inject(
        Fault::on("POST", "/repos/*/merge")
            .stall(Duration::from_secs(2))
            .times(1),
    );
    let o = c.merge(REPO, m, &merge_request(&sha)).await.unwrap();
    assert!(
        matches!(
            o,
            MergeOutcome::Ambiguous {
                error: ForgejoError::Timeout { .. }
            }
        ),
        "{o:?}"
    );
    assert!(!c.is_merged(REPO, m).await.unwrap());

    // Refused connections: certainly not merged, and retryable.
    fake.refuse_connections().await;
    let e = c.merge(REPO, m, &merge_request(&sha)).await.unwrap_err();
    assert!(
        matches!(e, ForgejoError::Connect { .. }) && e.is_retryable(),
        "{e}"
    );
    fake.accept_connections().await;
    assert!(
        c.merge(REPO, m, &merge_request(&sha))
            .await
            .unwrap()
            .is_merged()
    );
}

#[tokio::test]
async fn transient_failures_are_retryable_and_carry_retry_after() {
    let fake = FakeForgejo::start().await;
    // A breaker that never opens: this test is about the errors themselves.
    let c = client_with(
        &fake,
        ClientOptions {
            timeout: Some(Duration::from_millis(300)),
            breaker: BreakerConfig {
                threshold: u32::MAX,
                cooldown: Duration::from_secs(1),
            },
            ..ClientOptions::default()
        },
    );
    let (n, _) = ready_pr(&fake);
    let path = format!("/repos/{REPO}/pulls/{n}");

    fake.inject(Fault::on("GET", &path).status_retry_after(503, 7).times(1));
    let e = c.get_pull(REPO, n).await.unwrap_err();
    assert!(e.is_retryable());
    assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));

    fake.inject(Fault::on("GET", &path).status_retry_after(429, 2).times(1));
    let e = c.get_pull(REPO, n).await.unwrap_err();
    assert!(
        e.is_retryable() && e.retry_after() == Some(Duration::from_secs(2)),
        "{e}"
    );

    fake.inject(Fault::on("*", "/repos/*/pulls/*").status(502).times(2));
    for _ in 0..2 {
        assert_eq!(c.get_pull(REPO, n).await.unwrap_err().status(), Some(502));
    }
    assert!(
        c.get_pull(REPO, n).await.is_ok(),
        "the fault was for two calls only"
    );

    fake.inject(
        Fault::on("GET", &path)
            .status_message(422, "validation")
            .times(1),
    );
    let e = c.get_pull(REPO, n).await.unwrap_err();
    assert!(!e.is_retryable() && e.retry_after().is_none() && e.to_string().contains("validation"));

    // An outage of a given length: 5xx until it is over, then answers again.
    fake.inject(
        Fault::on("GET", &path)
            .status(503)
            .for_duration(Duration::from_millis(300)),
    );
    assert_eq!(c.get_pull(REPO, n).await.unwrap_err().status(), Some(503));
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.get_pull(REPO, n).await.is_err() {
        assert!(Instant::now() < deadline, "the outage never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    fake.inject(Fault::on("GET", &path).delay(Duration::from_millis(50)));
    assert!(
        c.get_pull(REPO, n).await.is_ok(),
        "slow but within the timeout"
    );
    fake.clear_faults();
    fake.inject(Fault::on("GET", &path).stall(Duration::from_secs(2)));
    let e = c.get_pull(REPO, n).await.unwrap_err();
    assert!(
        matches!(e, ForgejoError::Timeout { .. }) && e.is_retryable(),
        "{e}"
    );
    fake.clear_faults();

    fake.refuse_connections().await;
    let e = c.get_pull(REPO, n).await.unwrap_err();
    assert!(
        matches!(e, ForgejoError::Connect { .. }) && e.is_retryable(),
        "{e}"
    );
    fake.accept_connections().await;
    assert!(c.get_pull(REPO, n).await.is_ok());
}

#[tokio::test]
async fn circuit_breaker_opens_fails_fast_and_closes_after_a_good_probe() {
    let fake = FakeForgejo::start().await;
    let metrics = Metrics::new();
    let options = ClientOptions {
        breaker: BreakerConfig {
            threshold: 3,
            cooldown: Duration::from_millis(200),
        },
        metrics: Some(metrics.clone()),
        ..ClientOptions::default()
    };
    let c = client_with(&fake, options);
    fake.create_repo(REPO);
    fake.inject(Fault::on("*", "*").status(500));
    for _ in 0..3 {
        assert_eq!(c.version().await.unwrap_err().status(), Some(500));
    }
    assert!(matches!(c.breaker().state(), BreakerState::Open { .. }));
    let seen = fake.all_calls().len();
    let e = c.version().await.unwrap_err();
    assert!(
        matches!(e, ForgejoError::CircuitOpen { .. })
            && e.is_retryable()
            && e.retry_after().is_some(),
        "{e}"
    );
    assert_eq!(
        fake.all_calls().len(),
        seen,
        "an open circuit does not call Forgejo"
    );
    let host = fake.url().trim_start_matches("http://").to_owned();
    assert_eq!(
        metrics
            .circuit_open
            .with_label_values(&[host.as_str()])
            .get(),
        1
    );
    assert!(metrics.render().contains("forgejo_circuit_open"));

    // A failed probe re-opens it; a good one closes it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let probe = loop {
        match c.version().await {
            Err(ForgejoError::CircuitOpen { retry_after, .. }) if Instant::now() < deadline => {
                tokio::time::sleep(retry_after.max(Duration::from_millis(10))).await;
            }
            other => break other,
        }
    };
    assert_eq!(probe.unwrap_err().status(), Some(500));
    assert!(matches!(c.breaker().state(), BreakerState::Open { .. }));
    fake.clear_faults();
    let deadline = Instant::now() + Duration::from_secs(5);
    let probe = loop {
        match c.version().await {
            Err(ForgejoError::CircuitOpen { retry_after, .. }) if Instant::now() < deadline => {
                tokio::time::sleep(retry_after.max(Duration::from_millis(10))).await;
            }
            other => break other,
        }
    };
    assert!(probe.is_ok(), "{probe:?}");
    assert_eq!(c.breaker().state(), BreakerState::Closed { failures: 0 });
    assert_eq!(
        metrics
            .circuit_open
            .with_label_values(&[host.as_str()])
            .get(),
        0
    );

    // 4xx answers show a live host: they never open the circuit.
    for _ in 0..5 {
        assert!(c.get_pull(REPO, 1).await.unwrap_err().is_not_found());
    }
    assert_eq!(c.breaker().state(), BreakerState::Closed { failures: 0 });
}

#[tokio::test]
async fn issues_are_read_and_prs_show_as_issues() {
    let fake = FakeForgejo::start().await;
    let issue = fake.create_issue(REPO, "dana", "Implement gears", "Please");
    fake.add_label(REPO, issue, "auto/implement");
    let (pr, _) = ready_pr(&fake);
    let c = client(&fake);
    let got = c.get_issue(REPO, issue).await.expect("issue");
    assert_eq!(
        (got.number, got.title.as_str(), got.user.login.as_str()),
        (issue, "Implement gears", "dana")
    );
    assert_eq!(
        (got.state.as_str(), got.labels[0].name.as_str()),
        ("open", "auto/implement")
    );
    assert!(got.pull_request.is_none());
    let as_issue = c.get_issue(REPO, pr).await.expect("PR as issue");
    assert!(as_issue.pull_request.is_some_and(|p| !p.merged && !p.draft));
    assert!(c.get_issue(REPO, 404).await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn answers_become_core_observations() {
    use shepherd::core::event::{CiState, PrState};
    use shepherd::core::{ids::RepoName, normalize, payload};

    let fake = FakeForgejo::start().await;
    let n = fake.open_pr(
        REPO,
        NewPr::new("alice", "Add widgets").label("kind/feature"),
    );
    let sha = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha, "ci/build", "failure", "red");
    fake.set_status(REPO, &sha, "ci/lint", "success", "");
    fake.add_review(REPO, n, "bob", "APPROVED");
    let issue = fake.create_issue(REPO, "dana", "Gears", "");
    let c = client(&fake);
    let repo: RepoName = REPO.parse().unwrap();

    let pr: payload::PullRequest = c.get_pull(REPO, n).await.unwrap().into();
    let snap = normalize::pr_snapshot(&repo, &pr);
    assert_eq!(
        (snap.number, snap.state, snap.draft),
        (n, PrState::Open, false)
    );
    assert_eq!(snap.head_sha.map(|s| s.to_string()), Some(sha.clone()));
    assert_eq!(snap.author.map(|a| a.to_string()).as_deref(), Some("alice"));
    assert!(snap.labels.contains("kind/feature") && snap.mergeable == Some(true));
    assert!(snap.updated_ms > 0, "the time survives the conversion");

    let status: payload::CombinedStatus = c.combined_status(REPO, &sha).await.unwrap().into();
    let contexts = normalize::ci_contexts(&status);
    assert_eq!(contexts.len(), 2);
    let build = contexts.iter().find(|x| x.context == "ci/build").unwrap();
    assert_eq!(
        (build.state, build.description.as_str()),
        (CiState::Failure, "red")
    );
    let none: payload::CombinedStatus = c
        .combined_status(REPO, &"ab".repeat(20))
        .await
        .unwrap()
        .into();
    assert!(normalize::ci_contexts(&none).is_empty() && none.statuses.is_none());

    let reviews: Vec<payload::PullReview> = c.list_reviews(REPO, n).await.unwrap();
    let review = normalize::review(&reviews[0]).expect("a reviewer");
    assert_eq!(
        (review.reviewer.to_string().as_str(), review.official),
        ("bob", true)
    );

    let issue: payload::Issue = c.get_issue(REPO, issue).await.unwrap().into();
    let snap = normalize::issue_snapshot(&repo, &issue);
    assert!(snap.open && snap.title == "Gears");
}

#[tokio::test]
async fn the_bots_own_writes_fill_the_outbox_with_forgejos_echoes() {
    let fake = FakeForgejo::start().await;
    let issue = fake.create_issue(REPO, "dana", "Gears", "");
    let n = fake.open_pr(
        REPO,
        NewPr::new("alice", "Gears").body(&format!("Fixes #{issue}")),
    );
    let c = client(&fake);
    let bot = fake.bot_login().to_owned();

    c.add_labels(REPO, n, &["auto/claimed-implementer"])
        .await
        .unwrap();
    c.remove_label(REPO, n, "auto/claimed-implementer")
        .await
        .unwrap();
    c.add_labels(REPO, issue, &["auto/implement"])
        .await
        .unwrap();
    c.create_comment(REPO, n, "hello").await.unwrap();
    c.get_pull(REPO, n).await.unwrap();
    let sha = fake.head_sha(REPO, n);
    fake.inject(Fault::on("POST", "/repos/*/merge").apply_then(500).times(1));
    let o = c.merge(REPO, n, &merge_request(&sha)).await.unwrap();
    assert!(matches!(o, MergeOutcome::Ambiguous { .. }));

    let out = fake.take_outbox();
    let seen: Vec<(&str, &str)> = out
        .iter()
        .map(|w| (w.event_type, w.payload["action"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seen,
        [
            ("pull_request_label", "label_updated"),
            ("pull_request_label", "label_cleared"),
            ("issue_label", "label_updated"),
            ("pull_request_comment", "created"),
            ("pull_request", "closed"),
            ("issues", "closed"),
        ],
        "a merge answered 500 still sends its webhooks"
    );
    assert!(
        out.iter()
            .all(|w| w.payload["sender"]["login"] == bot.as_str())
    );
    assert_eq!(out[4].payload["pull_request"]["merged"], true);
    assert_eq!(out[5].payload["number"], issue);
    assert!(!out[5].payload["commit_id"].as_str().unwrap().is_empty());
    assert!(fake.take_outbox().is_empty(), "taking drains it");
}

#[tokio::test]
async fn malformed_and_unexpected_answers() {
    let fake = FakeForgejo::start().await;
    let (n, sha) = ready_pr(&fake);
    let c = client(&fake);
    let pull = format!("/repos/{REPO}/pulls/{n}");
    fake.inject(
        Fault::on("GET", &pull)
            .json(200, serde_json::json!({"number": n, "head": {"sha": 7}}))
            .times(1),
    );
    let e = c.get_pull(REPO, n).await.unwrap_err();
    let ForgejoError::Decode { json_path, .. } = &e else {
        panic!("expected a decode error, got {e}")
    };
    assert_eq!(json_path, "head.sha");
    assert!(!e.is_retryable());

    // Nulls where Forgejo sometimes sends them are fine.
    let nulls = serde_json::json!({"number": n, "body": null, "labels": null, "user": null, "head": null, "state": "open"});
    fake.inject(Fault::on("GET", &pull).json(200, nulls).times(1));
    let pr = c.get_pull(REPO, n).await.expect("nulls default");
    assert!(pr.labels.is_empty() && pr.body.is_empty() && pr.head.sha.is_empty());

    // 201 would mean auto-merge was scheduled: not a merge, so ambiguous.
    fake.inject(
        Fault::on("POST", &format!("{pull}/merge"))
            .json(201, serde_json::json!({}))
            .times(1),
    );
    let o = c.merge(REPO, n, &merge_request(&sha)).await.unwrap();
    assert!(matches!(o, MergeOutcome::Ambiguous { .. }), "{o:?}");
    assert!(fake.merges().is_empty());
}

#[tokio::test]
async fn sticky_and_one_off_comments_are_idempotent() {
    use shepherd::forgejo::CommentWrite;

    let fake = FakeForgejo::start().await;
    let (n, _) = ready_pr(&fake);
    let c = client(&fake);
    let bot = fake.bot_login().to_owned();
    let marker = "<!-- SHEPHERD-STATE";
    // Someone quoting the marker does not hijack the sticky comment.
    fake.add_comment(REPO, n, "mallory", "<!-- SHEPHERD-STATE: {} -->");

    let (first, w) = c
        .upsert_comment(
            REPO,
            n,
            marker,
            "phase: ci\n<!-- SHEPHERD-STATE: {\"p\":1} -->",
            Some(&bot),
        )
        .await
        .unwrap();
    assert_eq!(w, CommentWrite::Created);
    let (same, w) = c
        .upsert_comment(
            REPO,
            n,
            marker,
            "phase: ci\n<!-- SHEPHERD-STATE: {\"p\":1} -->",
            Some(&bot),
        )
        .await
        .unwrap();
    assert_eq!((w, same.id), (CommentWrite::Unchanged, first.id));
    let (edited, w) = c
        .upsert_comment(
            REPO,
            n,
            marker,
            "phase: review\n<!-- SHEPHERD-STATE: {\"p\":2} -->",
            Some(&bot),
        )
        .await
        .unwrap();
    assert_eq!((w, edited.id), (CommentWrite::Edited, first.id));
    assert_eq!(
        fake.calls("POST", &format!("/repos/{REPO}/issues/{n}/comments"))
            .len(),
        1
    );
    assert_eq!(fake.calls("PATCH", "/repos/*/issues/comments/*").len(), 1);

    let once = "<!-- shepherd:effect:abc -->";
    let (_, w) = c
        .comment_once(REPO, n, once, &format!("Needs a human\n{once}"), Some(&bot))
        .await
        .unwrap();
    assert_eq!(w, CommentWrite::Created);
    let (_, w) = c
        .comment_once(REPO, n, once, &format!("Needs a human\n{once}"), Some(&bot))
        .await
        .unwrap();
    assert_eq!(
        w,
        CommentWrite::Unchanged,
        "a retry finds the comment by its marker"
    );
    assert_eq!(fake.comments_on(REPO, n).len(), 3);
}

/// A reviewer agent's formal review, posted with its own token: stored as that user's
/// review of the named commit with its inline comments, the PR's `updated_at` moved,
/// the review webhook queued with the reviewer as sender; a review of one's own PR
/// and a change request without a body are refused with 422, as Forgejo does.
#[tokio::test]
async fn a_reviewer_posts_a_formal_review_as_its_own_user() {
    use shepherd::forgejo::{NewReview, NewReviewComment};
    let fake = FakeForgejo::start().await;
    fake.add_user_token("rev-agent", "rev-agent-token");
    let (n, head) = ready_pr(&fake);
    let before = fake.issue(REPO, n).updated_at;
    std::thread::sleep(Duration::from_millis(1100));
    let reviewer = ForgejoClient::new(
        &fake.url(),
        SecretString::from("rev-agent-token".to_owned()),
        ClientOptions::default(),
    )
    .expect("client");
    let review = NewReview {
        event: "REQUEST_CHANGES".into(),
        body: "Handle the empty list.".into(),
        commit_id: head.clone(),
        comments: vec![NewReviewComment {
            path: "src/lib.rs".into(),
            body: "here".into(),
            new_position: 12,
            old_position: 0,
        }],
    };
    let posted = reviewer
        .create_review(REPO, n, &review)
        .await
        .expect("posted");
    assert_eq!(posted.state, "REQUEST_CHANGES");
    assert_eq!(posted.user.as_ref().unwrap().login, "rev-agent");
    assert_eq!(posted.commit_id, head);
    assert!(posted.official && !posted.stale);
    let listed = client(&fake).list_reviews(REPO, n).await.expect("reviews");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].body, "Handle the empty list.");
    let inline = client(&fake)
        .review_comments(REPO, n, posted.id)
        .await
        .expect("inline comments");
    assert_eq!(
        (inline[0].path.as_str(), inline[0].position),
        ("src/lib.rs", 12)
    );
    assert_ne!(fake.issue(REPO, n).updated_at, before, "updated_at moved");
    let hooks = fake.take_outbox();
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    assert_eq!(hooks[0].event_type, "pull_request_review_rejected");
    assert_eq!(hooks[0].payload["sender"]["login"], "rev-agent");
    assert_eq!(
        hooks[0].payload["review"]["content"],
        "Handle the empty list."
    );
    // The author cannot approve or reject its own PR.
    fake.add_user_token("alice", "alice-token");
    let alice = ForgejoClient::new(
        &fake.url(),
        SecretString::from("alice-token".to_owned()),
        ClientOptions::default(),
    )
    .expect("client");
    let approve = NewReview {
        event: "APPROVED".into(),
        body: String::new(),
        commit_id: String::new(),
        comments: Vec::new(),
    };
    let err = alice.create_review(REPO, n, &approve).await.unwrap_err();
    assert_eq!(err.status(), Some(422), "{err}");
    assert!(!err.is_retryable());
    let empty = NewReview {
        event: "REQUEST_CHANGES".into(),
        ..approve.clone()
    };
    assert_eq!(
        reviewer
            .create_review(REPO, n, &empty)
            .await
            .unwrap_err()
            .status(),
        Some(422)
    );
    // An approval without a commit is for the head.
    let ok = reviewer
        .create_review(REPO, n, &approve)
        .await
        .expect("approved");
    assert_eq!(
        (ok.state.as_str(), ok.commit_id.as_str()),
        ("APPROVED", head.as_str())
    );
    fake.assert_calls_match_openapi();
}

/// The merge queue's endpoints as Forgejo v15 answers them: a branch's tip, the
/// repository's merge styles, `POST …/update` (200 with a new head built on the tip
/// and a `pull_request_sync` from the bot; 500 with an empty message when the PR is
/// already on the tip; 409 on a conflict; 422 once merged), and a `fast-forward-only`
/// merge that answers 500 with an empty message when the tip is not the head's base.
#[tokio::test]
async fn queue_endpoints_update_branch_tips_and_fast_forward_only() {
    let fake = FakeForgejo::start().await;
    let c = client(&fake);
    let a = fake.open_pr(REPO, NewPr::new("agent-bot", "A"));
    let b = fake.open_pr(REPO, NewPr::new("agent-bot", "B"));
    let tip0 = fake.branch_tip(REPO, "main");
    assert_eq!(c.branch_tip(REPO, "main").await.unwrap(), tip0);
    assert!(
        c.repo_settings(REPO)
            .await
            .unwrap()
            .allow_fast_forward_only_merge
    );
    assert!(c.branch_tip(REPO, "no-such-branch").await.is_err());

    // #a is built on the tip: an update is Forgejo's "up to date", a bare 500.
    let up = c.update_pull(REPO, a, UpdateStyle::Rebase).await.unwrap();
    match &up {
        UpdateOutcome::Ambiguous {
            error: ForgejoError::Status { code, message, .. },
        } => assert_eq!(
            (*code, message.as_str()),
            (500, ""),
            "the message is blanked"
        ),
        other => panic!("up to date is a bare 500: {other:?}"),
    }
    let calls = fake.calls("POST", &format!("/repos/{REPO}/pulls/{a}/update"));
    assert_eq!(calls.len(), 1, "an update is never retried by the client");
    assert_eq!(calls[0].query_param("style"), Some("rebase"));
    assert_eq!(
        fake.head_sha(REPO, a),
        c.get_pull(REPO, a).await.unwrap().head.sha
    );

    // Fast-forward #a: the tip becomes its head.
    let head_a = fake.head_sha(REPO, a);
    let mut ff = merge_request(&head_a);
    ff.style = MergeStyle::FastForwardOnly;
    assert!(c.merge(REPO, a, &ff).await.unwrap().is_merged());
    assert_eq!(c.branch_tip(REPO, "main").await.unwrap(), head_a);

    // #b is built on the old tip: fast-forward-only cannot, and says nothing.
    let head_b = fake.head_sha(REPO, b);
    let mut ff = merge_request(&head_b);
    ff.style = MergeStyle::FastForwardOnly;
    let o = c.merge(REPO, b, &ff).await.unwrap();
    assert!(matches!(o, MergeOutcome::Ambiguous { .. }), "{o:?}");
    assert!(!c.is_merged(REPO, b).await.unwrap());
    assert_eq!(
        c.branch_tip(REPO, "main").await.unwrap(),
        head_a,
        "tip unchanged"
    );
    fake.take_outbox();

    // Update #b onto the tip: a new head whose base is the tip, and the sync webhook.
    let up = c.update_pull(REPO, b, UpdateStyle::Merge).await.unwrap();
    assert!(matches!(up, UpdateOutcome::Updated), "{up:?}");
    let pr = c.get_pull(REPO, b).await.unwrap();
    assert_ne!(pr.head.sha, head_b);
    assert_eq!(pr.merge_base, head_a, "built on the tip");
    let out = fake.take_outbox();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].event_type, "pull_request_sync");
    assert_eq!(out[0].payload["action"], "synchronized");
    assert_eq!(out[0].payload["sender"]["login"], fake.bot_login());
    assert_eq!(
        out[0].payload["pull_request"]["head"]["sha"],
        pr.head.sha.as_str()
    );
    // Now it fast-forwards, pinned to the new head.
    let mut ff = merge_request(&pr.head.sha);
    ff.style = MergeStyle::FastForwardOnly;
    assert!(c.merge(REPO, b, &ff).await.unwrap().is_merged());
    assert_eq!(c.branch_tip(REPO, "main").await.unwrap(), pr.head.sha);
    let merges = fake.merges();
    assert_eq!(merges[1].tip_before, head_a);
    assert_eq!(merges[1].tip_after, pr.head.sha);

    // A merged PR cannot be updated (422); a conflicting update is 409.
    let up = c.update_pull(REPO, a, UpdateStyle::Merge).await.unwrap();
    assert!(
        matches!(up, UpdateOutcome::Refused { code: 422, .. }),
        "{up:?}"
    );
    let d = fake.open_pr(REPO, NewPr::new("agent-bot", "D"));
    fake.push_to_branch(REPO, "main", "someone");
    fake.with_model(|m| {
        m.repo_mut(REPO).update_conflicts.insert(d);
    });
    let up = c.update_pull(REPO, d, UpdateStyle::Rebase).await.unwrap();
    assert!(matches!(up, UpdateOutcome::Conflict { .. }), "{up:?}");

    // Dismiss-stale-approvals protection and an update that changes the diff: the
    // approval on the old head is dismissed.
    fake.set_protection(
        REPO,
        Protection {
            dismiss_stale_approvals: true,
            ..Protection::default()
        },
    );
    let e = fake.open_pr(REPO, NewPr::new("agent-bot", "E"));
    fake.with_model(|m| m.add_review(REPO, e, "reviewer", "APPROVED"));
    fake.push_to_branch(REPO, "main", "someone");
    fake.with_model(|m| m.repo_mut(REPO).updates_change_diff = true);
    let up = c.update_pull(REPO, e, UpdateStyle::Rebase).await.unwrap();
    assert!(matches!(up, UpdateOutcome::Updated), "{up:?}");
    let reviews = c.list_reviews(REPO, e).await.unwrap();
    assert!(
        reviews.iter().all(|r| r.dismissed && r.stale),
        "{reviews:?}"
    );

    // A repository without fast-forward-only: the setting says so, and the merge is 405.
    fake.with_model(|m| m.repo_mut(REPO).no_fast_forward = true);
    assert!(
        !c.repo_settings(REPO)
            .await
            .unwrap()
            .allow_fast_forward_only_merge
    );
    let head_e = fake.head_sha(REPO, e);
    let mut ff = merge_request(&head_e);
    ff.style = MergeStyle::FastForwardOnly;
    let o = c.merge(REPO, e, &ff).await.unwrap();
    assert!(matches!(o, MergeOutcome::NotAllowed { .. }), "{o:?}");
    fake.assert_calls_match_openapi();
}
