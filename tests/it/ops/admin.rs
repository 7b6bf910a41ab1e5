//! The admin API: 401 without a token, 403 with a wrong one, 200 with the right one,
//! 404 when no admin token is configured; the same operations as the CLI.

use reqwest::Method;
use serde_json::{Value, json};

use super::{ADMIN, REPO, Scenario};

/// Every admin route with a valid request.
fn routes(n: u64) -> Vec<(Method, String, Option<Value>)> {
    vec![
        (Method::GET, "/api/v1/admin/status".into(), None),
        (Method::GET, format!("/api/v1/admin/inspect/{REPO}"), None),
        (
            Method::GET,
            format!("/api/v1/admin/inspect/{REPO}/{n}"),
            None,
        ),
        (Method::GET, "/api/v1/admin/dlq".into(), None),
        (
            Method::POST,
            "/api/v1/admin/replay".into(),
            Some(json!({"pr": format!("{REPO}#{n}"), "dry_run": true})),
        ),
        (
            Method::POST,
            "/api/v1/admin/rebuild".into(),
            Some(json!({"target": format!("{REPO}#{n}")})),
        ),
        (
            Method::POST,
            "/api/v1/admin/resync".into(),
            Some(json!({"repo": REPO})),
        ),
        (
            Method::POST,
            "/api/v1/admin/dlq/drop".into(),
            Some(json!({"all": true})),
        ),
    ]
}

/// Sends one request with `token` (none: no header); returns status and body.
async fn call(
    s: &Scenario,
    (method, path, body): &(Method, String, Option<Value>),
    token: Option<&str>,
) -> (u16, Value) {
    let mut r = s.http.request(method.clone(), s.app.url(path));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(b) = body {
        r = r.json(b);
    }
    let answer = r.send().await.expect("an answer");
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn admin_api_answers_401_403_and_200() {
    let s = Scenario::start(&[]).await;
    let n = s.open_pr("alice", "Add the widget");
    let d = s.send(&s.fake.pr_opened(REPO, n)).await;
    s.wait_delivery(n, &d).await;
    for route in routes(n) {
        let (status, body) = call(&s, &route, None).await;
        assert_eq!(status, 401, "{route:?}: {body}");
        assert_eq!(body["error"], "missing bearer token");
        let (status, body) = call(&s, &route, Some("wrong-token")).await;
        assert_eq!(status, 403, "{route:?}: {body}");
        let (status, body) = call(&s, &route, Some(ADMIN)).await;
        assert_eq!(status, 200, "{route:?}: {body}");
    }
    let (_, inspected) = call(&s, &routes(n)[2], Some(ADMIN)).await;
    assert_eq!(inspected["summary"]["number"], n);
    let (_, dry) = call(&s, &routes(n)[4], Some(ADMIN)).await;
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["replayed"][0]["delivery"], d.as_str());

    // Errors map to statuses without internals.
    let bad = (
        Method::POST,
        "/api/v1/admin/replay".to_owned(),
        Some(json!({"pr": "nonsense"})),
    );
    assert_eq!(call(&s, &bad, Some(ADMIN)).await.0, 400);
    let unknown = (
        Method::POST,
        "/api/v1/admin/replay".to_owned(),
        Some(json!({"colour": 1})),
    );
    assert_eq!(call(&s, &unknown, Some(ADMIN)).await.0, 400);
    let missing = (
        Method::GET,
        format!("/api/v1/admin/inspect/{REPO}/999"),
        None,
    );
    assert_eq!(call(&s, &missing, Some(ADMIN)).await.0, 404);
    let no_dl = (Method::GET, "/api/v1/admin/dlq/1-0".to_owned(), None);
    assert_eq!(call(&s, &no_dl, Some(ADMIN)).await.0, 404);
    let both = (
        Method::POST,
        "/api/v1/admin/dlq/drop".to_owned(),
        Some(json!({"id": "1-0", "all": true})),
    );
    assert_eq!(call(&s, &both, Some(ADMIN)).await.0, 400);
    let (_, status) = call(&s, &routes(n)[0], Some(ADMIN)).await;
    assert_eq!(status["prs"][0]["number"], n);
    assert_eq!(status["dead_letters"], 0);

    // The status page: header or ?token=.
    let page = |q: &str| s.http.get(s.app.url(&format!("/{q}"))).send();
    assert_eq!(page("").await.unwrap().status().as_u16(), 401);
    assert_eq!(page("?token=nope").await.unwrap().status().as_u16(), 403);
    let ok = page(&format!("?token={ADMIN}")).await.unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    assert!(ok.text().await.unwrap().contains(&format!("{REPO}#{n}")));
    let bearer = s
        .http
        .get(s.app.url("/"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status().as_u16(), 200);
}

#[tokio::test]
/// Issue 12, finding 8: the status page (PR titles, work ids) used to be public
/// without an admin token; now it is off like the admin API.
async fn without_an_admin_token_the_admin_api_and_the_status_page_are_not_public() {
    let s = Scenario::start(&[("SHEPHERD_ADMIN_TOKEN", "")]).await;
    for route in routes(1) {
        assert_eq!(call(&s, &route, Some(ADMIN)).await.0, 404, "{route:?}");
        assert_eq!(call(&s, &route, None).await.0, 404, "{route:?}");
    }
    let page = s.http.get(s.app.url("/")).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 404);
    assert!(!page.text().await.unwrap().contains("phase-"));
}
