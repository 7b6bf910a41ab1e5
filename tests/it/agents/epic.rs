//! The Epic in the `cleveragents-v2` prompt, read from Forgejo issue dependencies
//! against the fake over real HTTP: the open issue the work's issue blocks (an
//! epic-labelled one first), its unticked items in the compliance gaps, and the fake's
//! dependency routes as Forgejo serves them.

use shepherd::agents::context;
use shepherd::agents::prompt::Templates;
use shepherd::core::effect::WorkKind;
use shepherd::core::policy::PolicyFile;

use super::context::{REPO, client, params, seed_ci_fix, work_item};
use crate::support::fake_forgejo::FakeForgejo;

fn v2() -> Templates {
    let policy = PolicyFile::from_toml("[defaults]\nprompt_profile = \"cleveragents-v2\"\n")
        .expect("policy");
    Templates::load(&policy).expect("templates")
}

/// The text of section `heading` of `prompt` (to the next `## `).
fn section<'a>(prompt: &'a str, heading: &str) -> &'a str {
    let start = prompt.find(&format!("\n{heading}\n")).expect("the section") + heading.len() + 2;
    let rest = &prompt[start..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

#[tokio::test]
async fn an_issues_epic_is_the_epic_labelled_issue_it_blocks() {
    let fake = FakeForgejo::start().await;
    let part = fake.create_issue(REPO, "dave", "Parse empty input", "The parser part.");
    let other = fake.create_issue(REPO, "dave", "Unrelated follow-up", "Later.");
    let epic = fake.create_issue(
        REPO,
        "dave",
        "Epic: robust parsing",
        "- [x] #1 lexer\n- [ ] parse empty input\n- [ ] fuzz it\n",
    );
    fake.add_label(REPO, epic, "Type/Epic");
    fake.add_dependency(REPO, part, other);
    fake.add_dependency(REPO, part, epic);
    let item = work_item(WorkKind::IssueImpl, part, None);
    let ctx = context::gather(&client(&fake), &item)
        .await
        .expect("context");
    assert_eq!(
        ctx.epic.as_ref().map(|e| e.number),
        Some(epic),
        "{:?}",
        ctx.epic
    );
    let prompt = v2().render(&item, &ctx, &params(&fake)).expect("prompt");
    let epic_text = section(&prompt, "## Pre-fetched Epic");
    assert!(
        epic_text.contains(&format!("### #{epic} Epic: robust parsing (open)")),
        "{prompt}"
    );
    let gaps = section(&prompt, "## Compliance gap report");
    assert!(
        gaps.contains(&format!("- Epic #{epic}: parse empty input\n")),
        "{gaps}"
    );
    assert!(
        gaps.contains(&format!("- Epic #{epic}: fuzz it\n")),
        "{gaps}"
    );
    assert!(!gaps.contains("lexer"), "{gaps}");
    assert_eq!(
        fake.calls("GET", &format!("/repos/{REPO}/issues/{part}/blocks"))
            .len(),
        1
    );
    fake.assert_calls_match_openapi();
}

#[tokio::test]
async fn a_prs_epic_comes_through_the_issue_it_closes() {
    let fake = FakeForgejo::start().await;
    let item = seed_ci_fix(&fake);
    // seed_ci_fix's PR closes issue #1.
    let epic = fake.create_issue(REPO, "dave", "Epic: inputs", "- [ ] empty input\n");
    fake.add_dependency(REPO, 1, epic);
    let ctx = context::gather(&client(&fake), &item)
        .await
        .expect("context");
    assert_eq!(ctx.epic.as_ref().map(|e| e.number), Some(epic));
    let prompt = v2().render(&item, &ctx, &params(&fake)).expect("prompt");
    assert!(
        section(&prompt, "## Pre-fetched Epic").contains("Epic: inputs"),
        "{prompt}"
    );
    // Without a dependency the section says there is none, in one line.
    let fake = FakeForgejo::start().await;
    let item = seed_ci_fix(&fake);
    let ctx = context::gather(&client(&fake), &item)
        .await
        .expect("context");
    assert!(ctx.epic.is_none());
    let prompt = v2().render(&item, &ctx, &params(&fake)).expect("prompt");
    let none = section(&prompt, "## Pre-fetched Epic");
    assert_eq!(none.trim().lines().count(), 1, "{none}");
    assert!(none.contains("No Epic"), "{none}");
}

#[tokio::test]
async fn the_fakes_dependency_routes_answer_as_forgejo() {
    let fake = FakeForgejo::start().await;
    let a = fake.create_issue(REPO, "dave", "a", "");
    let b = fake.create_issue(REPO, "dave", "b", "");
    fake.add_dependency(REPO, a, b);
    let http = reqwest::Client::new();
    let get = |path: String| {
        let req = http
            .get(format!("{}/api/v1/repos/{REPO}/{path}", fake.url()))
            .header("Authorization", format!("token {}", fake.token()));
        async move {
            let resp = req.send().await.expect("request");
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            (status, body)
        }
    };
    let (status, blocks) = get(format!("issues/{a}/blocks?limit=1")).await;
    assert_eq!(status, 200);
    assert_eq!(blocks[0]["number"], b, "a blocks b");
    let (_, deps) = get(format!("issues/{b}/dependencies")).await;
    assert_eq!(deps[0]["number"], a, "b depends on a");
    let (_, none) = get(format!("issues/{a}/dependencies?page=2")).await;
    assert_eq!(none, serde_json::json!([]));
    assert_eq!(get("issues/999/blocks".into()).await.0, 404);
}
