//! The status page (`GET /`) rendered by a real browser: headless Chromium loads it
//! from the real `shepherd run` after a known scenario and must show its PRs, grouped
//! by phase, with the active work. The test fails — naming `chromium` — when the
//! browser is missing (`scripts/test`, which CI runs, installs Debian's `chromium`).
//!
//! `SHEPHERD_UPDATE_SCREENSHOT=1` also writes the screenshot to
//! `docs/screenshot-status.png` (the one docs/operations.md shows).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ops::{ADMIN, REPO, Scenario, WAIT};
use crate::support::fake_forgejo::NewPr;
use crate::support::poll_until_named;

/// How long one Chromium run may take.
const CHROMIUM_DEADLINE: Duration = Duration::from_secs(90);

/// The Chromium binary, or a loud failure naming it.
fn chromium() -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("chromium"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "chromium is not installed (not on the PATH): the status page test needs headless \
             Chromium — install Debian's `chromium` package"
        )
    })
}

/// Runs headless Chromium with `args` then `url`; returns its stdout.
async fn run_chromium(profile: &Path, args: &[String], url: &str) -> String {
    let mut cmd = tokio::process::Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .arg(url)
    .kill_on_drop(true);
    let out = tokio::time::timeout(CHROMIUM_DEADLINE, cmd.output())
        .await
        .expect("chromium finishes within the deadline")
        .expect("chromium starts");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The phase of PR `n`'s latest history entry.
async fn phase(s: &Scenario, n: u64) -> String {
    s.history(n)
        .await
        .last()
        .map(|h| h["phase"].clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn status_page_renders_a_known_scenario_in_headless_chromium() {
    // Fail first, and loudly, when there is no browser.
    chromium();
    let s = Scenario::start(&[]).await;
    // #1 red CI (a ci-fix is dispatched), #2 waiting for CI, #3 waiting for reviews.
    let red = s.open_pr("alice", "Fix the flaky parser");
    let sha = s.fake.head_sha(REPO, red);
    s.fake
        .set_status(REPO, &sha, "ci/test", "failure", "2 tests failed");
    let waiting = s.open_pr("bob", "Add the widget catalogue");
    let review = s
        .fake
        .open_pr(REPO, NewPr::new("carol", "Document the API"));
    let sha = s.fake.head_sha(REPO, review);
    s.fake.set_status(REPO, &sha, "ci/test", "success", "ok");
    for n in [red, waiting, review] {
        s.send(&s.fake.pr_opened(REPO, n)).await;
    }
    for (n, want) in [(red, "ci-fix"), (review, "awaiting-review")] {
        poll_until_named(WAIT, &format!("#{n} reaches {want}"), || async {
            phase(&s, n).await == want
        })
        .await;
    }
    poll_until_named(WAIT, "#2 has a record", || async {
        s.record(waiting).await.0 > 0
    })
    .await;

    let profile = tempfile::tempdir().unwrap();
    let url = s.app.url(&format!("/?token={ADMIN}"));
    let dom = run_chromium(profile.path(), &["--dump-dom".into()], &url).await;
    for want in [
        "<title>Shepherd status</title>",
        &format!("{REPO}#{red}"),
        &format!("{REPO}#{waiting}"),
        &format!("{REPO}#{review}"),
        "Fix the flaky parser",
        "id=\"phase-ci-fix\"",
        "id=\"phase-awaiting-ci\"",
        "id=\"phase-awaiting-review\"",
        "Active work (1)",
        "Needs a human (0)",
        "dead letters",
        "last resync",
    ] {
        assert!(dom.contains(want), "the page shows {want:?}:\n{dom}");
    }
    let ci_fix = dom.find("id=\"phase-ci-fix\"").unwrap();
    let awaiting = dom.find("id=\"phase-awaiting-ci\"").unwrap();
    assert!(ci_fix < awaiting, "work phases come before waiting phases");

    let shot = profile.path().join("status.png");
    run_chromium(
        profile.path(),
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,900".into(),
        ],
        &url,
    )
    .await;
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(png.len() > 10_000, "a real rendering, not a blank page");
    if std::env::var_os("SHEPHERD_UPDATE_SCREENSHOT").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/screenshot-status.png");
        std::fs::write(&docs, &png).expect("write docs/screenshot-status.png");
    }
}
