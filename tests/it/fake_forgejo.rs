//! The fake Forgejo itself: webhook payloads in Forgejo's shapes with the right event
//! headers, and the REST details the client tests do not reach (query-string and
//! bearer auth, unfiltered listing, label quirks, raw shapes).

use serde_json::{Value, json};

use crate::support::fake_forgejo::{
    Call, FakeForgejo, NewPr, Webhook, closing_refs, model::StatusRow, model::combined_state,
};

const REPO: &str = "acme/widgets";

fn headers(w: &Webhook) -> (&str, &str) {
    (w.event, w.event_type)
}

#[tokio::test]
async fn pull_request_payloads() {
    let fake = FakeForgejo::start().await;
    let n = fake.open_pr(
        REPO,
        NewPr::new("alice", "Add widgets")
            .base_ref("main")
            .label("kind/feature"),
    );
    let opened = fake.pr_opened(REPO, n);
    assert_eq!(headers(&opened), ("pull_request", "pull_request"));
    let p = &opened.payload;
    assert_eq!(
        (p["action"].as_str(), p["number"].as_u64()),
        (Some("opened"), Some(n))
    );
    assert_eq!(
        p["pull_request"]["head"]["sha"],
        fake.head_sha(REPO, n).as_str()
    );
    assert_eq!(p["pull_request"]["mergeable"], true);
    assert_eq!(p["repository"]["full_name"], REPO);
    assert_eq!(p["sender"]["login"], "alice");
    assert_eq!((&p["review"], &p["commit_id"]), (&Value::Null, &json!("")));
    let body = opened.body();
    assert!(
        body.starts_with(b"{\n  \"") && !body.ends_with(b"\n"),
        "two-space indent, no newline"
    );

    fake.push(REPO, n, &"1f".repeat(20));
    let sync = fake.pr_synchronized(REPO, n, "alice");
    assert_eq!(headers(&sync), ("pull_request", "pull_request_sync"));
    assert_eq!(sync.payload["action"], "synchronized");
    assert_eq!(
        sync.payload["pull_request"]["mergeable"], false,
        "still checking"
    );
    assert_eq!(
        sync.payload["pull_request"]["head"]["sha"],
        "1f".repeat(20).as_str()
    );

    fake.add_label(REPO, n, "auto/claimed-implementer");
    let labelled = fake.pr_label_updated(REPO, n, "shepherd-bot");
    assert_eq!(headers(&labelled), ("pull_request", "pull_request_label"));
    assert_eq!(labelled.payload["action"], "label_updated");
    let names: Vec<&str> = labelled.payload["pull_request"]["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["kind/feature", "auto/claimed-implementer"]);
    fake.remove_label(REPO, n, "kind/feature");
    fake.remove_label(REPO, n, "auto/claimed-implementer");
    assert_eq!(
        fake.pr_label_updated(REPO, n, "bob").payload["action"],
        "label_cleared"
    );

    let edited = fake.pr_edited(REPO, n, "alice", "WIP: Add widgets");
    assert_eq!(
        edited.payload["changes"]["title"]["from"],
        "WIP: Add widgets"
    );

    fake.close(REPO, n);
    let closed = fake.pr_closed(REPO, n, "alice");
    assert_eq!(
        (
            closed.payload["action"].as_str(),
            closed.payload["pull_request"]["merged"].as_bool()
        ),
        (Some("closed"), Some(false))
    );
    fake.with_model(|m| m.repo_mut(REPO).issues.get_mut(&n).unwrap().state = "open".into());
    assert_eq!(
        fake.pr_reopened(REPO, n, "alice").payload["action"],
        "reopened"
    );
}

#[tokio::test]
async fn review_comment_issue_and_run_payloads() {
    let fake = FakeForgejo::start().await;
    let n = fake.open_pr(REPO, NewPr::new("alice", "Add widgets"));
    let cases = [
        (
            "APPROVED",
            "pull_request_approved",
            "pull_request_review_approved",
        ),
        (
            "REQUEST_CHANGES",
            "pull_request_rejected",
            "pull_request_review_rejected",
        ),
        (
            "COMMENT",
            "pull_request_comment",
            "pull_request_review_comment",
        ),
    ];
    for (state, event, event_type) in cases {
        let id = fake.add_review(REPO, n, "bob", state);
        let w = fake.pr_reviewed(REPO, n, id);
        assert_eq!(headers(&w), (event, event_type));
        assert_eq!(w.payload["action"], "reviewed");
        assert_eq!(w.payload["review"]["type"], event_type);
        assert_eq!(w.payload["sender"]["login"], "bob");
        assert_eq!(w.payload["requested_reviewer"]["login"], "bob");
    }

    let on_pr = fake.add_comment(REPO, n, "carol", "/shepherd resume");
    let w = fake.comment_created(REPO, on_pr);
    assert_eq!(headers(&w), ("issue_comment", "pull_request_comment"));
    assert_eq!(
        (
            w.payload["is_pull"].as_bool(),
            w.payload["comment"]["body"].as_str()
        ),
        (Some(true), Some("/shepherd resume"))
    );
    assert_eq!(w.payload["pull_request"]["number"], n);
    assert_eq!(w.payload["issue"]["pull_request"]["merged"], false);

    let issue = fake.create_issue(REPO, "dana", "Implement gears", "please");
    let w = fake.issue_opened(REPO, issue);
    assert_eq!(headers(&w), ("issues", "issues"));
    assert_eq!(
        (
            w.payload["action"].as_str(),
            w.payload["issue"]["pull_request"].is_null()
        ),
        (Some("opened"), true)
    );
    fake.add_label(REPO, issue, "auto/implement");
    let w = fake.issue_label_updated(REPO, issue, "dana");
    assert_eq!(headers(&w), ("issues", "issue_label"));
    assert_eq!(w.payload["issue"]["labels"][0]["name"], "auto/implement");
    let c = fake.add_comment(REPO, issue, "dana", "any news?");
    let w = fake.comment_created(REPO, c);
    assert_eq!(headers(&w), ("issue_comment", "issue_comment"));
    assert!(w.payload.get("pull_request").is_none() && w.payload["is_pull"] == false);
    fake.close(REPO, issue);
    assert_eq!(
        fake.issue_closed(REPO, issue, "dana").payload["issue"]["state"],
        "closed"
    );

    let sha = fake.head_sha(REPO, n);
    for (action, event_type) in [
        ("success", "action_run_success"),
        ("failure", "action_run_failure"),
        ("recover", "action_run_recover"),
    ] {
        let w = fake.action_run(REPO, &sha, action, Some(n));
        assert_eq!(headers(&w), (event_type, event_type));
        let run = &w.payload["run"];
        assert_eq!(
            (w.payload["action"].as_str(), run["commit_sha"].as_str()),
            (Some(action), Some(sha.as_str()))
        );
        assert!(w.payload.get("repository").is_none() && run.get("ScheduleID").is_some());
        let inner: Value = serde_json::from_str(run["event_payload"].as_str().unwrap()).unwrap();
        assert_eq!(inner["number"], n);
    }
    let push = fake.push_event(REPO, "main", &"0".repeat(40), &"a".repeat(40), "alice");
    assert_eq!(
        (headers(&push), push.payload["ref"].as_str()),
        (("push", "push"), Some("refs/heads/main"))
    );
}

async fn get(
    fake: &FakeForgejo,
    path_and_query: &str,
    auth: Option<&str>,
) -> (u16, Value, Option<String>) {
    let mut req = reqwest::Client::new().get(format!("{}/api/v1{path_and_query}", fake.url()));
    if let Some(a) = auth {
        req = req.header("Authorization", a);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let total = resp
        .headers()
        .get("x-total-count")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, body, total)
}

async fn send(
    fake: &FakeForgejo,
    method: reqwest::Method,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .request(method, format!("{}/api/v1{path}", fake.url()))
        .header("Authorization", format!("token {}", fake.token()))
        .json(&body)
        .send()
        .await
        .expect("request");
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn rest_details_match_forgejo() {
    let fake = FakeForgejo::start().await;
    let open = fake.open_pr(REPO, NewPr::new("alice", "open"));
    let closed = fake.open_pr(REPO, NewPr::new("alice", "closed"));
    fake.close(REPO, closed);
    let token = fake.token().to_owned();

    // `/version` is public in Forgejo; `/user` needs a token.
    assert_eq!(get(&fake, "/version", None).await.0, 200);
    assert_eq!(get(&fake, "/user", None).await.0, 401);
    assert_eq!(get(&fake, "/user", Some("token nope")).await.0, 401);
    assert_eq!(
        get(&fake, "/user", Some(&format!("Bearer {token}")))
            .await
            .0,
        200
    );
    assert_eq!(
        get(&fake, &format!("/user?access_token={token}"), None)
            .await
            .0,
        200
    );
    let auth = format!("TOKEN {token}");
    let auth = Some(auth.as_str());

    let (_, all, total) = get(&fake, &format!("/repos/{REPO}/pulls?limit=1"), auth).await;
    assert_eq!(
        (all.as_array().unwrap().len(), total.as_deref()),
        (1, Some("2")),
        "no state: every PR"
    );
    let (_, open_only, _) = get(&fake, &format!("/repos/{REPO}/pulls?state=open"), auth).await;
    assert_eq!(open_only[0]["number"], open);
    assert_eq!(get(&fake, "/repos/acme/nothing/pulls", auth).await.0, 404);

    let sha = fake.head_sha(REPO, open);
    let (_, empty, _) = get(&fake, &format!("/repos/{REPO}/commits/{sha}/status"), auth).await;
    assert_eq!(
        empty,
        json!({"state": "", "sha": "", "total_count": 0, "statuses": null, "repository": null, "commit_url": "", "url": ""})
    );
    let (code, created) = send(
        &fake,
        reqwest::Method::POST,
        &format!("/repos/{REPO}/statuses/{sha}"),
        json!({"state": "failure", "context": "ci", "description": "red"}),
    )
    .await;
    assert_eq!((code, created["status"].as_str()), (201, Some("failure")));
    let (_, combined, _) = get(
        &fake,
        &format!("/repos/{REPO}/commits/feature-{open}/status"),
        auth,
    )
    .await;
    assert_eq!(
        (combined["state"].as_str(), combined["sha"].as_str()),
        (Some("failure"), Some(sha.as_str())),
        "a branch resolves to its tip"
    );

    // Labels: names or ids, never mixed; unknown names ignored; DELETE by name (v13+).
    let id = fake.create_label(REPO, "bug");
    let labels = format!("/repos/{REPO}/issues/{open}/labels");
    assert_eq!(
        send(
            &fake,
            reqwest::Method::POST,
            &labels,
            json!({"labels": ["bug", 5]})
        )
        .await
        .0,
        400
    );
    let (code, now) = send(
        &fake,
        reqwest::Method::POST,
        &labels,
        json!({"labels": ["bug", "no-such-label"]}),
    )
    .await;
    assert_eq!((code, now.as_array().unwrap().len()), (200, 1));
    assert_eq!(
        send(
            &fake,
            reqwest::Method::DELETE,
            &format!("{labels}/bug"),
            Value::Null
        )
        .await
        .0,
        204
    );
    assert_eq!(
        send(
            &fake,
            reqwest::Method::POST,
            &labels,
            json!({"labels": [id]})
        )
        .await
        .0,
        200
    );
    assert_eq!(
        send(
            &fake,
            reqwest::Method::DELETE,
            &format!("{labels}/424242"),
            Value::Null
        )
        .await
        .0,
        422
    );
    let (code, _) = send(&fake, reqwest::Method::PUT, &labels, json!({"labels": []})).await;
    assert_eq!((code, fake.labels_on(REPO, open).len()), (200, 0));
    assert_eq!(
        send(
            &fake,
            reqwest::Method::POST,
            &format!("/repos/{REPO}/labels"),
            json!({"name": "x", "color": "nothex"})
        )
        .await
        .0,
        422
    );

    let (_, issue, _) = get(&fake, &format!("/repos/{REPO}/issues/{open}"), auth).await;
    assert_eq!(issue["pull_request"]["merged"], false);
    let comment = fake.add_comment(REPO, open, "alice", "hi");
    assert_eq!(
        send(
            &fake,
            reqwest::Method::DELETE,
            &format!("/repos/{REPO}/issues/comments/{comment}"),
            Value::Null
        )
        .await
        .0,
        204
    );
    assert!(fake.comments_on(REPO, open).is_empty());

    let logged: Vec<Call> = fake.calls("*", "/user");
    assert_eq!(logged.len(), 4);
    assert_eq!(logged[0].status, 401);
    assert_eq!(logged[3].query_param("access_token"), Some(token.as_str()));
    assert_eq!(fake.calls("GET", "/version")[0].status, 200);
    assert!(fake.writes().iter().all(|c| c.method != "GET"));
    fake.clear_calls();
    assert!(fake.all_calls().is_empty());
}

#[test]
fn model_helpers() {
    assert_eq!(
        closing_refs("Closes #3, fixes #4. Resolved: #5 see #6"),
        vec![3, 4, 5]
    );
    let row = |state: &str| StatusRow {
        id: 1,
        sha: String::new(),
        state: state.into(),
        context: String::new(),
        description: String::new(),
        target_url: String::new(),
        created_at: String::new(),
    };
    assert_eq!(combined_state(&[]), "");
    assert_eq!(combined_state(&[row("success"), row("error")]), "failure");
    assert_eq!(combined_state(&[row("pending"), row("warning")]), "warning");
}

/// Key paths present in `expected` but missing from `actual` (recursing into objects
/// and the first element of arrays; `null` on either side is not compared further).
fn missing_keys(expected: &Value, actual: &Value, path: &str, out: &mut Vec<String>) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, v) in e {
                match a.get(k) {
                    None => out.push(format!("{path}.{k}")),
                    Some(av) => missing_keys(v, av, &format!("{path}.{k}"), out),
                }
            }
        }
        (Value::Array(e), Value::Array(a)) if !e.is_empty() && !a.is_empty() => {
            missing_keys(&e[0], &a[0], &format!("{path}[0]"), out);
        }
        _ => {}
    }
}

#[tokio::test]
async fn payloads_have_every_field_of_the_webhook_fixtures() {
    let fake = FakeForgejo::start().await;
    let pr = fake.open_pr(REPO, NewPr::new("alice", "Fix overflow").body("Closes #1"));
    fake.add_label(REPO, pr, "kind/bug");
    let issue = fake.create_issue(REPO, "alice", "Overflow", "");
    fake.add_label(REPO, issue, "auto/implement");
    let approved = fake.add_review(REPO, pr, "bob", "APPROVED");
    let rejected = fake.add_review(REPO, pr, "bob", "REQUEST_CHANGES");
    let commented = fake.add_review(REPO, pr, "bob", "COMMENT");
    let pr_comment = fake.add_comment(REPO, pr, "carol", "/shepherd pause");
    let issue_comment = fake.add_comment(REPO, issue, "alice", "/shepherd implement");
    let sha = fake.head_sha(REPO, pr);
    let mut built: Vec<(&str, Webhook)> = vec![
        ("pull_request_opened", fake.pr_opened(REPO, pr)),
        ("pull_request_reopened", fake.pr_reopened(REPO, pr, "alice")),
        (
            "pull_request_edited",
            fake.pr_edited(REPO, pr, "alice", "WIP: Fix overflow"),
        ),
        ("pull_request_sync", fake.pr_synchronized(REPO, pr, "alice")),
        (
            "pull_request_label",
            fake.pr_label_updated(REPO, pr, "alice"),
        ),
        (
            "pull_request_review_approved",
            fake.pr_reviewed(REPO, pr, approved),
        ),
        (
            "pull_request_review_rejected",
            fake.pr_reviewed(REPO, pr, rejected),
        ),
        (
            "pull_request_review_comment",
            fake.pr_reviewed(REPO, pr, commented),
        ),
        (
            "pull_request_comment",
            fake.comment_created(REPO, pr_comment),
        ),
        ("issues_opened", fake.issue_opened(REPO, issue)),
        (
            "issue_label",
            fake.issue_label_updated(REPO, issue, "alice"),
        ),
        ("issue_comment", fake.comment_created(REPO, issue_comment)),
        (
            "action_run_success",
            fake.action_run(REPO, &sha, "success", Some(pr)),
        ),
        (
            "action_run_failure",
            fake.action_run(REPO, &sha, "failure", Some(pr)),
        ),
        (
            "action_run_recover",
            fake.action_run(REPO, &sha, "recover", Some(pr)),
        ),
        (
            "push",
            fake.push_event(REPO, "main", &"0".repeat(40), &sha, "alice"),
        ),
    ];
    fake.with_model(|m| {
        let p = m.repo_mut(REPO).issues.get_mut(&pr).unwrap();
        p.state = "closed".into();
    });
    built.push(("pull_request_closed", fake.pr_closed(REPO, pr, "alice")));
    fake.with_model(|m| m.repo_mut(REPO).issues.get_mut(&pr).unwrap().state = "open".into());
    let c = client_for(&fake);
    let merge = shepherd::forgejo::MergeRequest {
        style: shepherd::core::policy::MergeStyle::Squash,
        head_commit_id: sha.clone(),
        delete_branch_after_merge: true,
        title: None,
        message: None,
    };
    assert!(c.merge(REPO, pr, &merge).await.unwrap().is_merged());
    built.push((
        "pull_request_closed_merged",
        fake.pr_closed(REPO, pr, "alice"),
    ));
    built.push(("issues_closed", fake.issue_closed(REPO, issue, "alice")));

    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("webhooks");
    let mut problems = Vec::new();
    for (name, hook) in &built {
        let path = dir.join(format!("{name}.json"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let fixture: Value = serde_json::from_str(&text).unwrap();
        let mut missing = Vec::new();
        missing_keys(&fixture, &hook.payload, "", &mut missing);
        if !missing.is_empty() {
            problems.push(format!("{name}: {missing:?}"));
        }
        assert_eq!(fixture.get("action"), hook.payload.get("action"), "{name}");
    }
    assert!(
        problems.is_empty(),
        "fields the fake's payloads lack:\n{}",
        problems.join("\n")
    );
}

fn client_for(fake: &FakeForgejo) -> shepherd::forgejo::ForgejoClient {
    let token = secrecy::SecretString::from(fake.token().to_owned());
    shepherd::forgejo::ForgejoClient::new(&fake.url(), token, Default::default()).unwrap()
}

/// The timeline (`…/issues/{n}/timeline`) lists comments and the `label` entries
/// Forgejo writes for every label change (`models/issues/issue_label.go`: content `"1"`
/// when added, empty when removed; the doer as `user`), through the API and the test
/// mutators alike, oldest first and paginated.
#[tokio::test]
async fn the_timeline_has_label_events_with_doer_and_time() {
    let fake = FakeForgejo::start().await;
    let n = fake.open_pr(REPO, NewPr::new("alice", "claimed"));
    fake.add_label_by(REPO, n, "auto/claimed-implementer", "old-dispatcher");
    fake.add_comment(REPO, n, "alice", "hello");
    let id = fake
        .repo_labels(REPO)
        .iter()
        .find(|l| l.name == "auto/claimed-implementer")
        .expect("the label")
        .id;
    let one = format!("/repos/{REPO}/issues/{n}/labels/{id}");
    assert_eq!(
        send(&fake, reqwest::Method::DELETE, &one, Value::Null)
            .await
            .0,
        204
    );
    // Removing a label that is not on the PR writes nothing.
    assert_eq!(
        send(&fake, reqwest::Method::DELETE, &one, Value::Null)
            .await
            .0,
        204
    );
    let auth = format!("token {}", fake.token());
    let path = format!("/repos/{REPO}/issues/{n}/timeline");
    let (code, items, total) = get(&fake, &path, Some(&auth)).await;
    assert_eq!(code, 200);
    assert_eq!(total.as_deref(), Some("3"));
    let items = items.as_array().unwrap();
    let row = |i: usize| {
        let it = &items[i];
        (
            it["type"].as_str().unwrap().to_owned(),
            it["body"].as_str().unwrap().to_owned(),
            it["user"]["login"].as_str().unwrap().to_owned(),
            it["label"]["name"].as_str().unwrap_or("").to_owned(),
        )
    };
    let claim = "auto/claimed-implementer".to_owned();
    assert_eq!(
        row(0),
        (
            "label".into(),
            "1".into(),
            "old-dispatcher".into(),
            claim.clone()
        )
    );
    assert_eq!(
        row(1),
        (
            "comment".into(),
            "hello".into(),
            "alice".into(),
            String::new()
        )
    );
    assert_eq!(
        row(2),
        (
            "label".into(),
            String::new(),
            fake.bot_login().into(),
            claim
        )
    );
    assert!(
        items[0]["created_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    let (_, page, _) = get(&fake, &format!("{path}?page=2&limit=2"), Some(&auth)).await;
    assert_eq!(page.as_array().unwrap().len(), 1);
    fake.assert_calls_match_openapi();
}
