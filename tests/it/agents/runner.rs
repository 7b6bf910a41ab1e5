//! The runner on work items put straight into the dispatch stream.

use std::collections::HashSet;
use std::time::Duration;

use super::{REPO, Rig, alive, read_pid};
use crate::support::fake_forgejo::NewPr;
use crate::support::poll_until_named;
use crate::support::scenario::DEADLINE;

/// An hour: a claim that never gets in the way.
const HOUR: Duration = Duration::from_secs(3600);

/// The command line of a script agent that records everything it was given.
const RECORDER: &str = r#"
printf '%s\n' "$@" > "$DIR/argv"
env > "$DIR/env"
cat > "$DIR/stdin"
cp "$9" "$DIR/prompt"
cp "${10}" "$DIR/work"
pwd > "$DIR/pwd"
echo "leaked it-admin-token-1234 here"
printf '{"outcome":"no-changes","summary":"nothing to do","tokens":12,"cost":0.25}' > "$SHEPHERD_RESULT_FILE"
"#;

/// Placeholders, the mapped model and agent, the allow-listed environment (no secret
/// of Shepherd's), the prompt on stdin and in its file, the work item file, the result
/// file reported once, masked output kept, metrics, the folder removed afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_gets_its_command_line_environment_and_prompt_and_its_result_is_reported() {
    let rig = Rig::start().await;
    let script = rig.script("recorder.sh", RECORDER);
    let n = rig.open_pr(REPO);
    let command = format!(
        "{script} --agent {{agent}} --model {{model}} --tier {{tier}} {{tier_name}} {{kind}} {{prompt_file}} {{work_file}}"
    );
    let runner = rig
        .runner(&command)
        .policy("[defaults]\nmodels = { codex = \"stub/codex-model\" }\nagents = { \"ci-fix\" = \"fixer\" }\n")
        .env("SHEPHERD_ADMIN_TOKEN", "it-admin-token-1234")
        .env("SHEPHERD_AGENT_TOKEN", "it-agent-token-5678")
        .env("SHEPHERD_AGENT_ENV", "IT_EXTRA_VAR")
        .env("IT_EXTRA_VAR", "passed-through")
        .env("IT_OTHER_VAR", "not-passed")
        .start()
        .await;
    let id = rig.dispatch(REPO, n, "ci-fix", 1, HOUR).await;
    let results = rig.wait_results(1).await;
    assert_eq!(results[0]["work_id"], id.as_str());
    assert_eq!(results[0]["outcome"], "no-changes");
    assert_eq!(results[0]["summary"], "nothing to do");

    let argv: Vec<String> = std::fs::read_to_string(rig.path("argv"))
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(
        &argv[..8],
        [
            "--agent",
            "fixer",
            "--model",
            "stub/codex-model",
            "--tier",
            "1",
            "codex",
            "ci-fix"
        ]
    );
    let env = std::fs::read_to_string(rig.path("env")).unwrap();
    let sha = rig.fake.head_sha(REPO, n);
    for line in [
        format!("SHEPHERD_WORK_ID={id}"),
        format!("SHEPHERD_REPO={REPO}"),
        format!("SHEPHERD_NUMBER={n}"),
        format!("SHEPHERD_HEAD_SHA={sha}"),
        "SHEPHERD_TIER=1".to_owned(),
        "SHEPHERD_MODEL=stub/codex-model".to_owned(),
        "IT_EXTRA_VAR=passed-through".to_owned(),
    ] {
        assert!(
            env.lines().any(|l| l == line),
            "{line} missing from the agent's environment:\n{env}"
        );
    }
    assert!(env.contains("SHEPHERD_RESULT_FILE="), "{env}");
    for secret in [
        rig.fake.token(),
        crate::support::TEST_SECRET,
        "it-admin-token-1234",
        "it-agent-token-5678",
        "SHEPHERD_REDIS_URL",
        "SHEPHERD_FORGEJO_TOKEN",
        "IT_OTHER_VAR",
    ] {
        assert!(
            !env.contains(secret),
            "the agent's environment has {secret}:\n{env}"
        );
    }
    let stdin = std::fs::read_to_string(rig.path("stdin")).unwrap();
    assert_eq!(stdin, std::fs::read_to_string(rig.path("prompt")).unwrap());
    assert!(stdin.contains(&format!("work_number: {n}")), "{stdin}");
    assert!(stdin.contains("release_claim_on_exit: false"), "{stdin}");
    assert!(
        !stdin.contains("forgejo_pat"),
        "no token in the prompt unless opted in"
    );
    let work: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rig.path("work")).unwrap()).unwrap();
    assert_eq!(work["id"], id.as_str());
    assert!(
        !rig.fake
            .calls("GET", &format!("/repos/{REPO}/pulls/{n}"))
            .is_empty(),
        "context read"
    );

    let run = rig.wait_state(&id, "finished").await;
    assert_eq!(run["note"], "reported");
    assert_eq!(run["model"], "stub/codex-model");
    let log = rig.log(&id).await.expect("output kept");
    assert!(log.contains("leaked *** here"), "{log}");
    assert!(!log.contains("it-admin-token-1234"));
    let pwd = std::fs::read_to_string(rig.path("pwd")).unwrap();
    assert!(
        !std::path::Path::new(pwd.trim()).exists(),
        "the work folder is removed"
    );
    poll_until_named(DEADLINE, "the entry is acked", || async {
        rig.pending().await == 0
    })
    .await;
    let metrics = reqwest::get(runner.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = |name: &str, has: &str| {
        metrics
            .lines()
            .any(|l| l.starts_with(name) && l.contains(has))
    };
    assert!(line("shepherd_agent_tokens_total", "} 12"), "{metrics}");
    assert!(
        line("shepherd_agents_finished_total", "outcome=\"no-changes\""),
        "{metrics}"
    );
    assert!(
        line("shepherd_agents_started_total", "tier=\"codex\""),
        "{metrics}"
    );
    assert!(
        line("shepherd_agent_run_seconds_count", "kind=\"ci-fix\""),
        "{metrics}"
    );
    assert_eq!(rig.results().await.len(), 1, "reported once");
}

/// A script agent that logs its start and waits until the test releases it.
const WAIT_FOR_RELEASE: &str = r#"
echo "$SHEPHERD_WORK_ID" >> "$DIR/order"
while [ ! -e "$DIR/release-$SHEPHERD_WORK_ID" ]; do sleep 0.05; done
"#;

/// Lets the waiting agent of work item `id` exit.
fn release(rig: &Rig, id: &str) {
    std::fs::write(rig.path(&format!("release-{id}")), "").unwrap();
}

/// The order the agents started in.
fn order(rig: &Rig) -> Vec<String> {
    std::fs::read_to_string(rig.path("order"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// With one slot, the waiting items go by priority (PR work before `issue-impl`,
/// then the oldest), whatever their order in the stream.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_runner_starts_higher_priority_work_first() {
    let rig = Rig::start().await;
    let script = rig.script("wait.sh", WAIT_FOR_RELEASE);
    let first = rig.open_pr(REPO);
    let fix = rig.open_pr(REPO);
    let issue = rig
        .fake
        .create_issue(REPO, "alice", "Implement z", "We need z.");
    let _runner = rig
        .runner(&script)
        .env("SHEPHERD_AGENTS_MAX", "1")
        .start()
        .await;
    let a = rig.dispatch(REPO, first, "review-feedback", 0, HOUR).await;
    rig.wait_state(&a, "running").await;
    let b = rig.dispatch(REPO, issue, "issue-impl", 0, HOUR).await;
    let c = rig.dispatch(REPO, fix, "ci-fix", 0, HOUR).await;
    rig.wait_state(&b, "waiting").await;
    rig.wait_state(&c, "waiting").await;
    assert_eq!(order(&rig), std::slice::from_ref(&a), "one slot: one agent");
    release(&rig, &a);
    rig.wait_state(&c, "running").await;
    assert_eq!(rig.run_record(&b).await.unwrap()["state"], "waiting");
    release(&rig, &c);
    release(&rig, &b);
    rig.wait_results(3).await;
    assert_eq!(order(&rig), [a, c, b]);
}

/// Fair share (issue 28): one slot, twenty items of one repository queued before two
/// of another; the other repository's items start at its turns (second and fourth),
/// not after the twenty — the runner reads past the busy repository's entries.
#[tokio::test(flavor = "multi_thread")]
async fn one_slot_takes_repositories_in_turn_so_a_quiet_one_is_not_starved() {
    let rig = Rig::start().await;
    let script = rig.script("wait.sh", WAIT_FOR_RELEASE);
    let quiet = "acme/quiet";
    let _runner = rig
        .runner(&script)
        .env("SHEPHERD_AGENTS_MAX", "1")
        .start()
        .await;
    let mut busy = Vec::new();
    for _ in 0..20 {
        let n = rig.open_pr(REPO);
        busy.push(rig.dispatch(REPO, n, "ci-fix", 0, HOUR).await);
    }
    let mut calm = Vec::new();
    for _ in 0..2 {
        let n = rig.open_pr(quiet);
        calm.push(rig.dispatch(quiet, n, "ci-fix", 0, HOUR).await);
    }
    rig.wait_state(&busy[0], "running").await;
    // The runner holds the quiet repository's items although twenty came first.
    rig.wait_state(&calm[1], "waiting").await;
    release(&rig, &busy[0]);
    rig.wait_state(&calm[0], "running").await;
    release(&rig, &calm[0]);
    rig.wait_state(&busy[1], "running").await;
    release(&rig, &busy[1]);
    rig.wait_state(&calm[1], "running").await;
    release(&rig, &calm[1]);
    rig.wait_results(4).await;
    // (The next busy item may have started already: only the first four are fixed.)
    assert_eq!(
        order(&rig)[..4],
        [&busy[0], &calm[0], &busy[1], &calm[1]].map(String::clone),
        "the quiet repository's items start at its turns"
    );
    for id in &busy[2..] {
        release(&rig, id);
    }
    rig.wait_results(22).await;
}

/// Two slots, one agent per repository: the second item of a repository waits while
/// another repository's item runs.
#[tokio::test(flavor = "multi_thread")]
async fn the_per_repository_cap_holds_back_a_busy_repository() {
    let rig = Rig::start().await;
    let script = rig.script("wait.sh", WAIT_FOR_RELEASE);
    let other = "acme/other";
    let one = rig.open_pr(REPO);
    let two = rig.open_pr(REPO);
    let three = rig.open_pr(other);
    let _runner = rig
        .runner(&script)
        .env("SHEPHERD_AGENTS_MAX", "2")
        .env("SHEPHERD_AGENTS_PER_REPO", "1")
        .start()
        .await;
    let a = rig.dispatch(REPO, one, "ci-fix", 0, HOUR).await;
    let b = rig.dispatch(REPO, two, "ci-fix", 0, HOUR).await;
    let c = rig.dispatch(other, three, "ci-fix", 0, HOUR).await;
    rig.wait_state(&a, "running").await;
    rig.wait_state(&c, "running").await;
    assert_eq!(rig.run_record(&b).await.unwrap()["state"], "waiting");
    release(&rig, &a);
    rig.wait_state(&a, "finished").await;
    rig.wait_state(&b, "running").await;
    release(&rig, &b);
    release(&rig, &c);
    rig.wait_results(3).await;
}

/// Work item `id`'s entry in the runners' table of the status page.
async fn table_entry(rig: &Rig, id: &str) -> Option<serde_json::Value> {
    let json: Option<String> = redis::cmd("HGET")
        .arg(rig.keys().agents_running())
        .arg(id)
        .query_async(&mut rig.conn.clone())
        .await
        .expect("HGET agents running");
    json.map(|j| serde_json::from_str(&j).expect("run JSON"))
}

/// `max_open_agent_prs` (issue 28): with the bot's open PRs at the cap, an
/// `issue-impl` item waits, its run record naming the cap, while PR work of the same
/// repository starts; once one bot PR is closed in the forge, the runner's next read
/// of the bot's open PRs lets the issue item start.
#[tokio::test(flavor = "multi_thread")]
async fn issue_work_waits_while_the_bots_open_prs_are_at_the_cap() {
    let rig = Rig::start().await;
    let script = rig.script("wait.sh", WAIT_FOR_RELEASE);
    let bot = rig.fake.bot_login().to_owned();
    let bot_pr = |title: &str| {
        rig.fake
            .open_pr(REPO, NewPr::new(&bot, title).body("Bot work."))
    };
    let first = bot_pr("Bot one");
    bot_pr("Bot two");
    // A human's PR does not count against the bot's cap.
    let human = rig
        .fake
        .open_pr(REPO, NewPr::new("alice", "Human").body("Mine."));
    let issue = rig
        .fake
        .create_issue(REPO, "alice", "Implement z", "We need z.");
    let _runner = rig
        .runner(&script)
        .env("SHEPHERD_AGENTS_MAX", "2")
        .env("SHEPHERD_AGENTS_PER_REPO", "2")
        .policy("[defaults]\nmax_open_agent_prs = 2\n")
        .start()
        .await;
    let held = rig.dispatch(REPO, issue, "issue-impl", 0, HOUR).await;
    // The note is in the runners' table of the status page, refreshed by the
    // heartbeat (at most every 20 s): bounded, not timed.
    let what = "the issue item is held back by max_open_agent_prs";
    poll_until_named(Duration::from_secs(90), what, || async {
        table_entry(&rig, &held).await.is_some_and(|r| {
            r["state"] == "waiting"
                && r["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("max_open_agent_prs (2 open bot PRs, cap 2)"))
        })
    })
    .await;
    let fix = rig.dispatch(REPO, human, "ci-fix", 0, HOUR).await;
    rig.wait_state(&fix, "running").await;
    assert_eq!(rig.run_record(&held).await.unwrap()["state"], "waiting");
    assert_eq!(
        order(&rig),
        std::slice::from_ref(&fix),
        "a free slot, yet held"
    );

    rig.fake.close(REPO, first);
    // The open PRs are read again on the heartbeat (every 30 s): bounded, not timed.
    poll_until_named(
        Duration::from_secs(120),
        "the issue item starts",
        || async {
            rig.run_record(&held)
                .await
                .is_some_and(|r| r["state"] == "running")
        },
    )
    .await;
    release(&rig, &fix);
    release(&rig, &held);
    rig.wait_results(2).await;
    assert_eq!(order(&rig), [fix, held]);
}

/// A hanging agent is stopped at its claim's end (less the margin): its whole process
/// group goes, and `failed`/`timeout` is reported exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_agent_is_stopped_at_the_deadline_and_timeout_is_reported_once() {
    let rig = Rig::start().await;
    let script = rig.script(
        "hang.sh",
        r#"sleep 600 & echo $! > "$DIR/child"; echo $$ > "$DIR/leader"; echo "still thinking"; wait"#,
    );
    let n = rig.open_pr(REPO);
    let _runner = rig.runner(&script).start().await;
    let id = rig
        .dispatch(REPO, n, "ci-fix", 0, Duration::from_secs(4))
        .await;
    let leader = read_pid(&rig.path("leader")).await;
    let child = read_pid(&rig.path("child")).await;
    let results = rig.wait_results(1).await;
    assert_eq!(results[0]["work_id"], id.as_str());
    assert_eq!(results[0]["outcome"], "failed");
    assert_eq!(results[0]["signature"], "timeout");
    assert!(
        results[0]["summary"]
            .as_str()
            .unwrap()
            .contains("still thinking"),
        "{}",
        results[0]
    );
    poll_until_named(DEADLINE, "the agent's process group is gone", || async {
        !alive(leader) && !alive(child)
    })
    .await;
    rig.wait_state(&id, "finished").await;
    poll_until_named(DEADLINE, "the entry is acked", || async {
        rig.pending().await == 0
    })
    .await;
    assert_eq!(rig.results().await.len(), 1, "timeout reported once");
}

/// A cancel notice stops the running agent's whole process group; nothing is reported.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_notice_kills_the_process_group_and_reports_nothing() {
    let rig = Rig::start().await;
    let script = rig.script(
        "hang.sh",
        r#"sleep 600 & echo $! > "$DIR/child"; echo $$ > "$DIR/leader"; wait"#,
    );
    let n = rig.open_pr(REPO);
    let _runner = rig.runner(&script).start().await;
    let id = rig.dispatch(REPO, n, "ci-fix", 0, HOUR).await;
    let leader = read_pid(&rig.path("leader")).await;
    let child = read_pid(&rig.path("child")).await;
    rig.cancel(&id, REPO, n).await;
    poll_until_named(DEADLINE, "the agent's process group is gone", || async {
        !alive(leader) && !alive(child)
    })
    .await;
    let run = rig.wait_state(&id, "cancelled").await;
    assert!(run["note"].as_str().unwrap().contains("no result"), "{run}");
    poll_until_named(DEADLINE, "the entries are acked", || async {
        rig.pending().await == 0
    })
    .await;
    assert!(
        rig.results().await.is_empty(),
        "no result for cancelled work"
    );
}

/// A result file that is not JSON, and one that is huge: each is a clear `failed`
/// (`result-file`, the reason in the summary), reported once, the file's beginning
/// kept with the log, the entries acked.
#[tokio::test(flavor = "multi_thread")]
async fn bad_result_files_are_clear_failures_and_lose_nothing() {
    let rig = Rig::start().await;
    let bad = rig.open_pr(REPO);
    let huge = rig.open_pr(REPO);
    let script = rig.script(
        "bad.sh",
        &format!(
            r#"if [ "$SHEPHERD_NUMBER" = "{bad}" ]; then echo 'this is {{not json' > "$SHEPHERD_RESULT_FILE"
else head -c 200000 /dev/zero | tr '\0' 'x' > "$SHEPHERD_RESULT_FILE"; fi"#
        ),
    );
    let _runner = rig
        .runner(&script)
        .env("SHEPHERD_AGENTS_PER_REPO", "2")
        .start()
        .await;
    let a = rig.dispatch(REPO, bad, "ci-fix", 0, HOUR).await;
    let b = rig.dispatch(REPO, huge, "ci-fix", 0, HOUR).await;
    let results = rig.wait_results(2).await;
    let of = |id: &str| {
        results
            .iter()
            .find(|r| r["work_id"] == id)
            .expect("a result")
            .clone()
    };
    let (ra, rb) = (of(&a), of(&b));
    for r in [&ra, &rb] {
        assert_eq!(r["outcome"], "failed", "{r}");
        assert_eq!(r["signature"], "result-file", "{r}");
    }
    assert!(
        ra["summary"]
            .as_str()
            .unwrap()
            .contains("not a valid result"),
        "{ra}"
    );
    assert!(
        rb["summary"]
            .as_str()
            .unwrap()
            .contains("more than the 65536 accepted"),
        "{rb}"
    );
    rig.wait_state(&a, "finished").await;
    rig.wait_state(&b, "finished").await;
    assert!(rig.log(&a).await.unwrap().contains("this is {not json"));
    let log_b = rig.log(&b).await.unwrap();
    assert!(
        log_b.contains("refused") && log_b.contains("xxxx"),
        "{}",
        &log_b[..200.min(log_b.len())]
    );
    poll_until_named(DEADLINE, "the entries are acked", || async {
        rig.pending().await == 0
    })
    .await;
    assert_eq!(rig.results().await.len(), 2);
}

/// Two runner processes share the stream: 20 work items run exactly once each, and
/// both runners take part.
#[tokio::test(flavor = "multi_thread")]
async fn two_runners_run_twenty_work_items_exactly_once() {
    let rig = Rig::start().await;
    let script = rig.script(
        "once.sh",
        r#"echo "$SHEPHERD_WORK_ID $$" >> "$DIR/ran"; sleep 0.2"#,
    );
    let prs: Vec<u64> = (0..20).map(|_| rig.open_pr(REPO)).collect();
    let start = |_: u8| {
        rig.runner(&script)
            .env("SHEPHERD_AGENTS_MAX", "2")
            .env("SHEPHERD_AGENTS_PER_REPO", "2")
            .start()
    };
    let _one = start(1).await;
    let _two = start(2).await;
    let mut ids = Vec::new();
    for n in &prs {
        ids.push(rig.dispatch(REPO, *n, "ci-fix", 0, HOUR).await);
    }
    let results = rig.wait_results(20).await;
    let reported: HashSet<String> = results
        .iter()
        .map(|r| r["work_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(reported, ids.iter().cloned().collect::<HashSet<_>>());
    assert_eq!(results.len(), 20, "each result once");
    let ran = std::fs::read_to_string(rig.path("ran")).unwrap();
    let started: Vec<&str> = ran.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(started.len(), 20, "each agent started once:\n{ran}");
    assert_eq!(started.iter().collect::<HashSet<_>>().len(), 20, "{ran}");
    let mut runners = HashSet::new();
    for id in &ids {
        let run = rig.wait_state(id, "finished").await;
        runners.insert(run["runner"].as_str().unwrap().to_owned());
    }
    assert_eq!(runners.len(), 2, "both runners ran work: {runners:?}");
    poll_until_named(DEADLINE, "every entry is acked", || async {
        rig.pending().await == 0
    })
    .await;
}

/// A program that does not exist (by path or on PATH), an unset command and an
/// unbalanced quote are clear errors at start, naming the setting.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_agent_command_is_a_clear_error_at_start() {
    for (command, expected) in [
        (Some("/no/such/agent --x"), "does not exist"),
        (Some("no-such-agent-xyz {model}"), "not found on PATH"),
        (Some("agent 'unclosed"), "cannot be split"),
        (None, "is required"),
    ] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"));
        for (key, _) in std::env::vars() {
            if key.starts_with("SHEPHERD_") {
                cmd.env_remove(key);
            }
        }
        cmd.arg("agents")
            .env("SHEPHERD_FORGEJO_URL", "http://127.0.0.1:9")
            .env("SHEPHERD_FORGEJO_TOKEN", "t0ken")
            .env("SHEPHERD_REDIS_URL", "redis://127.0.0.1:9");
        if let Some(c) = command {
            cmd.env("SHEPHERD_AGENT_COMMAND", c);
        }
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command:?} must fail");
        assert!(
            stderr.contains("SHEPHERD_AGENT_COMMAND") && stderr.contains(expected),
            "{command:?}: {stderr}"
        );
    }
}

/// A bare repository `git/acme/agents.git` in the rig's folder (where a clone URL
/// `file://<rig>/git/{owner}/{repo}.git` points for the rig's repository), its branch
/// `feature-x` one commit, and the fake's PR on that branch: the bare repository's
/// path, the commit and the PR's number.
pub(super) fn pr_on_a_git_branch(rig: &Rig) -> (std::path::PathBuf, String, u64) {
    let bare = rig.path("git/acme/agents.git");
    std::fs::create_dir_all(&bare).unwrap();
    git(&bare, &["init", "-q", "--bare"]);
    let seed = rig.path("seed");
    std::fs::create_dir_all(&seed).unwrap();
    git(&seed, &["init", "-q"]);
    std::fs::write(seed.join("README"), "hello\n").unwrap();
    git(&seed, &["add", "README"]);
    git(
        &seed,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.org",
            "commit",
            "-qm",
            "one",
        ],
    );
    git(
        &seed,
        &[
            "push",
            "-q",
            &format!("file://{}", bare.display()),
            "HEAD:refs/heads/feature-x",
        ],
    );
    let sha = git(&seed, &["rev-parse", "HEAD"]);
    let n = rig.fake.open_pr(
        REPO,
        crate::support::fake_forgejo::NewPr::new("agent-bot", "Fix")
            .head_sha(&sha)
            .head_ref("feature-x"),
    );
    (bare, sha, n)
}

/// Runs git in `dir` for the test's repository setup.
pub(super) fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `SHEPHERD_AGENT_CHECKOUT`: the agent runs in a fresh clone on the PR's head branch
/// at its head commit, can commit and `git push origin HEAD`, the agent token reaches
/// git only through the environment (not the clone's config), and the clone is
/// removed afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_works_in_a_fresh_checkout_of_the_pr_head_and_can_push() {
    let rig = Rig::start().await;
    let (bare, sha, n) = pr_on_a_git_branch(&rig);
    let script = rig.script(
        "git.sh",
        r#"git rev-parse HEAD > "$DIR/head"
git rev-parse --abbrev-ref HEAD > "$DIR/branch"
cp .git/config "$DIR/gitconfig"
env > "$DIR/env"
pwd > "$DIR/pwd"
echo change > change.txt && git add change.txt \
  && git -c user.name=agent -c user.email=agent@example.org commit -qm fix \
  && git push -q origin HEAD
# The fake Forgejo does not see pushes to this bare repository, so the agent says
# what it did (without a result file its outcome is read from the fake's PR head).
printf '{"outcome":"succeeded"}' > "$SHEPHERD_RESULT_FILE""#,
    );
    let url = format!(
        "file://{}/git/{{owner}}/{{repo}}.git",
        rig.dir.path().display()
    );
    let _runner = rig
        .runner(&script)
        .env("SHEPHERD_AGENT_CHECKOUT", "true")
        .env("SHEPHERD_AGENT_CLONE_URL", url)
        .env("SHEPHERD_AGENT_FORGEJO_TOKEN", "agent-tok-98765")
        .start()
        .await;
    let id = rig.dispatch(REPO, n, "ci-fix", 0, HOUR).await;
    let results = rig.wait_results(1).await;
    assert_eq!(results[0]["outcome"], "succeeded", "{}", results[0]);
    let read = |f: &str| {
        std::fs::read_to_string(rig.path(f))
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(read("head"), sha);
    assert_eq!(read("branch"), "feature-x");
    assert!(
        !read("gitconfig").contains("agent-tok-98765"),
        "no token in the clone's config"
    );
    assert!(
        read("env").contains("SHEPHERD_GIT_TOKEN=agent-tok-98765"),
        "git's credential helper reads it"
    );
    let pushed = git(&bare, &["rev-parse", "feature-x"]);
    assert_ne!(pushed, sha, "the agent's push reached the branch");
    assert_eq!(git(&bare, &["rev-parse", "feature-x~1"]), sha);
    rig.wait_state(&id, "finished").await;
    assert!(
        !std::path::Path::new(&read("pwd")).exists(),
        "the checkout is removed"
    );
}

/// A runner that finds another runner holding its entry (it was cut off from Redis
/// past the reclaim idle time, and the entry was reclaimed) stops its agent and
/// reports nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_runner_whose_entry_was_taken_over_stops_its_agent_without_a_report() {
    let rig = Rig::start().await;
    let script = rig.script("hang.sh", r#"echo $$ > "$DIR/leader"; exec sleep 600"#);
    let n = rig.open_pr(REPO);
    let _runner = rig
        .runner(&script)
        .env("SHEPHERD_RECLAIM_IDLE_SECS", "3")
        .start()
        .await;
    let id = rig.dispatch(REPO, n, "ci-fix", 0, HOUR).await;
    let leader = read_pid(&rig.path("leader")).await;
    // Another runner takes the entry over (as its XAUTOCLAIM would).
    let mut conn = rig.conn.clone();
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(rig.keys().dispatch())
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg(rig.keys().dispatch())
        .arg("agents")
        .arg("another-runner")
        .arg(0)
        .arg(&entries[0].0)
        .query_async(&mut conn)
        .await
        .unwrap();
    poll_until_named(DEADLINE, "the agent is stopped", || async {
        !alive(leader)
    })
    .await;
    let run = rig.wait_state(&id, "released").await;
    assert!(
        run["note"].as_str().unwrap().contains("another runner"),
        "{run}"
    );
    assert!(rig.results().await.is_empty(), "nothing reported");
    assert_eq!(
        rig.pending().await,
        1,
        "the entry stays with the other runner"
    );
}

/// SIGTERM: the runner stops its agent, reports nothing, and hands the entry back, so
/// another runner runs the work item at once (and reports it once).
#[tokio::test(flavor = "multi_thread")]
async fn a_stopping_runner_hands_its_work_to_another_runner() {
    let rig = Rig::start().await;
    let script = rig.script(
        "once.sh",
        r#"echo $$ >> "$DIR/starts"
if [ -e "$DIR/second" ]; then printf '{"outcome":"succeeded"}' > "$SHEPHERD_RESULT_FILE"; exit 0; fi
exec sleep 600"#,
    );
    let n = rig.open_pr(REPO);
    let mut first = rig
        .runner(&script)
        .env("SHEPHERD_RECLAIM_IDLE_SECS", "2")
        .start()
        .await;
    let id = rig.dispatch(REPO, n, "ci-fix", 0, HOUR).await;
    let leader = read_pid(&rig.path("starts")).await;
    first.terminate();
    let status = first.wait_exit(DEADLINE).await;
    assert!(status.success(), "a graceful stop: {status}");
    assert!(!alive(leader), "its agent is stopped");
    rig.wait_state(&id, "released").await;
    assert!(
        rig.results().await.is_empty(),
        "nothing reported on the way out"
    );
    std::fs::write(rig.path("second"), "").unwrap();
    let _second = rig
        .runner(&script)
        .env("SHEPHERD_RECLAIM_IDLE_SECS", "2")
        .start()
        .await;
    let results = rig.wait_results(1).await;
    assert_eq!(results[0]["work_id"], id.as_str());
    assert_eq!(results[0]["outcome"], "succeeded");
    rig.wait_state(&id, "finished").await;
    let starts = std::fs::read_to_string(rig.path("starts")).unwrap();
    assert_eq!(starts.lines().count(), 2, "one start per runner: {starts}");
    poll_until_named(DEADLINE, "the entry is acked", || async {
        rig.pending().await == 0
    })
    .await;
    assert_eq!(rig.results().await.len(), 1);
}

/// `SHEPHERD_AGENT_CHECKOUT` for `issue-impl` (issue 27, item 6): the agent starts on
/// the branch its work item names (policy `issue_branch`), made at the base the item
/// names — a dependency's PR branch (stacked work) — not at the default branch.
#[tokio::test(flavor = "multi_thread")]
async fn an_issue_agent_starts_on_its_branch_made_at_the_stacked_base() {
    let rig = Rig::start().await;
    let (bare, base_sha, _pr) = pr_on_a_git_branch(&rig);
    // The default branch has another commit than the dependency's PR branch.
    let seed = rig.path("seed");
    std::fs::write(seed.join("MAIN"), "main only\n").unwrap();
    git(&seed, &["add", "MAIN"]);
    git(
        &seed,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.org",
            "commit",
            "-qm",
            "main",
        ],
    );
    let remote = format!("file://{}", bare.display());
    git(&seed, &["push", "-q", &remote, "HEAD:refs/heads/main"]);
    git(&bare, &["symbolic-ref", "HEAD", "refs/heads/main"]);
    let issue = rig
        .fake
        .create_issue(REPO, "alice", "Stack on the parser", "");
    let script = rig.script(
        "issue.sh",
        r#"git rev-parse HEAD > "$DIR/head"
git rev-parse --abbrev-ref HEAD > "$DIR/branch""#,
    );
    let url = format!(
        "file://{}/git/{{owner}}/{{repo}}.git",
        rig.dir.path().display()
    );
    let _runner = rig
        .runner(&script)
        .env("SHEPHERD_AGENT_CHECKOUT", "true")
        .env("SHEPHERD_AGENT_CLONE_URL", url)
        .start()
        .await;
    let mut item = rig.activate(REPO, issue, "issue-impl", 0, HOUR).await;
    item["context"]["issue"] = serde_json::json!({
        "branch": format!("shepherd/issue-{issue}"),
        "base": "feature-x",
        "base_of": [issue + 100, 1],
    });
    // The record's active work is the item as dispatched (the runner checks).
    let mut conn = rig.conn.clone();
    super::set_active_work(&mut conn, &rig.keys(), &item).await;
    rig.enqueue(&item).await;
    rig.wait_results(1).await;
    let read = |f: &str| {
        std::fs::read_to_string(rig.path(f))
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    assert_eq!(read("branch"), format!("shepherd/issue-{issue}"));
    assert_eq!(
        read("head"),
        base_sha,
        "made at the stacked base, not at main"
    );
}
