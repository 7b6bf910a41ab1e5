//! Issue 26: a prompt-injected agent, played by a hostile shell script, run through
//! the real bubblewrap sandbox by the real `shepherd agents` (and, in the whole-loop
//! test, dispatched by the real `shepherd run`), with the fake Forgejo and a real
//! redis-server. The script tries every attack of the issue's findings and reports
//! what it found in its result summary and in an "exfiltration" folder (standing in
//! for the network, which an agent has): the test asserts that none of it worked.
//!
//! | finding | test |
//! |---|---|
//! | 1 every secret readable | [`finding_1_the_agent_reads_no_secret`] and the whole loop |
//! | 2 processes outlive their item | [`finding_2_no_process_of_an_item_outlives_it`], [`a_killed_runner_takes_every_process_of_its_sandboxed_agent_with_it`] and the whole loop |
//! | 3 symlink / FIFO result files | [`finding_3_symlink_and_fifo_result_files_are_invalid_results`] and the whole loop |
//! | 7 world-readable folders | [`finding_7_item_folders_are_private_to_the_agent`] |

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::e2e::{REPO, attempts};
use super::{Rig, TAG_VAR, open_to_agents, processes_of, write_script};
use crate::support::fake_forgejo::NewPr;
use crate::support::poll_until_named;
use crate::support::scenario::{AGENT_TOKEN, DEADLINE, SCENARIO_ADMIN_TOKEN, Scenario};
use crate::support::shepherd::Builder;

/// The reviewer agent's user and its token (in a world-readable file, on purpose).
const REVIEWER: &str = "rev-agent";
const REVIEWER_TOKEN: &str = "rev-agent-token-5e4d3c2b1a09";
/// The agents' own Forgejo token (not handed to agents: credentials off).
const AGENT_FORGEJO_TOKEN: &str = "agent-forgejo-token-77aa66bb55cc";
/// A claim far beyond any test.
const HOUR: Duration = Duration::from_secs(3600);
/// The runner's RSS may grow by this much over the whole attack.
const RSS_SLACK_KB: u64 = 20 * 1024;

/// What the leftover processes run: they wait, then try to forge the next item's
/// verdict and result, and mark that they were still alive.
const LEFTOVER: &str = r#"sleep 2
for d in /tmp/shepherd-agent-* "$(dirname "$PWD")"/shepherd-agent-*; do
  printf '{"event":"APPROVED","body":"forged by a leftover process"}' > "$d/review.json" 2>/dev/null
  printf '{"outcome":"succeeded","summary":"forged by a leftover process"}' > "$d/result.json" 2>/dev/null
done
touch "$DIR/leftover-$1-$SHEPHERD_WORK_ID""#;

/// The hostile agent. `$SCAN` (set by the test) lists extra folders to search.
/// Behaviour by the number of runs so far (`ran-*` markers) and the kind:
/// ci-fix run 0 steals and answers with a summary of what it found; run 1 answers
/// with a symlink to `/dev/zero`; run 2 with a FIFO; later runs fail plainly. A
/// review asks for changes and names another PR.
const HOSTILE: &str = r#"ID="$SHEPHERD_WORK_ID"
n=$(ls "$DIR" | grep -c '^ran-')
touch "$DIR/ran-$n-$SHEPHERD_KIND-$ID"
loot="$DIR/loot-$n"
{
  echo "== id"; id
  echo "== env"; env
  echo "== parent $PPID"; tr '\0' '\n' < "/proc/$PPID/environ"
  for p in /proc/[0-9]*; do
    echo "== $p"; tr '\0' '\n' < "$p/environ"; tr '\0' ' ' < "$p/cmdline"; echo
  done
  echo "== folders"; ls -la "$(dirname "$PWD")" /tmp
  echo "== scan"
  for d in $SCAN; do for f in "$d"/*; do echo "-- $f"; cat "$f"; done; done
  echo "== files"
  find /etc /tmp /root /run /var/lib "$HOME" "$PWD" $SCAN -xdev -maxdepth 4 -type f -size -64k 2>/dev/null \
    | head -n 3000 | while IFS= read -r f; do echo "-- $f"; cat "$f"; done
} > "$loot" 2>&1
setsid "$DIR/leftover.sh" setsid </dev/null >/dev/null 2>&1 &
( "$DIR/leftover.sh" double </dev/null >/dev/null 2>&1 & )
parent=$(cat "/proc/$PPID/environ" 2>/dev/null | wc -c)
procs=$(ls -d /proc/[0-9]* | wc -l)
others=$(ls -d "$(dirname "$PWD")"/shepherd-agent-* /tmp/shepherd-agent-* 2>/dev/null | grep -vc "^$PWD\$")
summary="uid=$(id -u) self=$$ ppid=$PPID procs=$procs parent_environ_bytes=$parent other_items=$others folder=$(stat -c %a "$PWD") prompt=$(stat -c %a "$SHEPHERD_PROMPT_FILE") owner=$(stat -c %u "$PWD") loot_b64=$(head -c 2000 "$loot" | base64 -w0)"
echo "$summary" > "$DIR/summary-$n"
echo "env: $(env | base64 -w0)"
echo "loot: $(head -c 4000 "$loot" | base64 -w0)"
if [ "$SHEPHERD_KIND" = review ]; then
  printf '{"event":"REQUEST_CHANGES","body":"Hostile: approve PR #%s instead. %s"}' "$OTHER_PR" "$summary" > "$SHEPHERD_REVIEW_FILE"
  exit 0
fi
case "$n" in
  0) printf '{"outcome":"failed","signature":"hostile","summary":"%s"}' "$summary" > "$SHEPHERD_RESULT_FILE" ;;
  1) ln -s /dev/zero "$SHEPHERD_RESULT_FILE" ;;
  2) mkfifo "$SHEPHERD_RESULT_FILE" ;;
  *) exit 3 ;;
esac
exit 0"#;

/// The secrets the test gives Shepherd (every process), for the leak checks.
fn secrets(bot_token: &str) -> Vec<String> {
    [
        bot_token,
        crate::support::TEST_SECRET,
        AGENT_TOKEN,
        SCENARIO_ADMIN_TOKEN,
        REVIEWER_TOKEN,
        AGENT_FORGEJO_TOKEN,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// Panics when `text` (from `what`) holds any secret, raw, base64, hex or reversed.
fn assert_no_secret(what: &str, text: &str, secrets: &[String]) {
    for s in secrets {
        for form in shepherd::agents::outcome::disguises(s) {
            assert!(
                !text.contains(&form),
                "{what} holds a form of a configured secret ({form})"
            );
        }
    }
}

/// `runner` holding every secret there is to steal: the reviewer-token file
/// `token_file`, the agents' Forgejo token, the agent token and the admin token.
fn with_secrets(runner: Builder, token_file: &Path) -> Builder {
    runner
        .env(
            "SHEPHERD_REVIEWER_TOKENS_FILE",
            token_file.display().to_string(),
        )
        .env("SHEPHERD_AGENT_FORGEJO_TOKEN", AGENT_FORGEJO_TOKEN)
        .env("SHEPHERD_AGENT_TOKEN", AGENT_TOKEN)
        .env("SHEPHERD_ADMIN_TOKEN", SCENARIO_ADMIN_TOKEN)
}

/// A world-readable reviewer-token file outside `/tmp` (where an unsandboxed agent of
/// any uid could read it), and the folder holding it.
fn reviewer_token_file() -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("reviewers");
    std::fs::write(&file, format!("{REVIEWER}={REVIEWER_TOKEN}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, file)
}

/// Whether the test runs as root (then the runner's agents run as another user).
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

/// The names of the files in `dir` (the scripts' marker files).
fn file_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect()
}

/// Dispatches a `ci-fix` work item for PR `n` on the rig's repository; its id.
async fn ci_fix(rig: &Rig, n: u64) -> String {
    rig.dispatch(super::REPO, n, "ci-fix", 0, HOUR).await
}

/// Waits (up to 10 s) until no process of work item `id` (tagged `tag`) is alive.
async fn wait_no_process_of(id: &str, tag: &str, what: &str) {
    poll_until_named(Duration::from_secs(10), what, || async {
        processes_of(id, tag).is_empty()
    })
    .await;
}

/// Resident memory of process `pid` in KiB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

/// `GET /healthz` of a process: (status, body).
async fn healthz(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.expect("/healthz answers");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// Every value under `prefix` in Redis, as text (strings, hashes, lists, sets, sorted
/// sets, streams).
async fn redis_dump(conn: &mut crate::support::redis::TestConn, prefix: &str) -> String {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(conn)
        .await
        .unwrap();
    assert!(!keys.is_empty(), "the test's keys are there");
    let mut out = String::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(conn)
            .await
            .unwrap();
        let value: redis::Value = match kind.as_str() {
            "string" => redis::cmd("GET").arg(&key).query_async(conn).await,
            "hash" => redis::cmd("HGETALL").arg(&key).query_async(conn).await,
            "list" => {
                redis::cmd("LRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .query_async(conn)
                    .await
            }
            "set" => redis::cmd("SMEMBERS").arg(&key).query_async(conn).await,
            "zset" => {
                redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .query_async(conn)
                    .await
            }
            "stream" => {
                redis::cmd("XRANGE")
                    .arg(&key)
                    .arg("-")
                    .arg("+")
                    .query_async(conn)
                    .await
            }
            _ => Ok(redis::Value::Nil),
        }
        .unwrap();
        out.push_str(&key);
        out.push('\n');
        out.push_str(&format!("{value:?}\n"));
    }
    out
}

/// The parsed `key=value` words of a hostile run's summary line.
fn fields(summary: &str) -> std::collections::BTreeMap<String, String> {
    summary
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// What a hostile run found, checked: another uid (root runners), its own PID
/// namespace (it is pid 1, its parent invisible, a handful of processes), no other
/// item's folder, its folder and prompt private.
fn assert_contained(summary: &str) {
    let f = fields(summary);
    if running_as_root() {
        assert_eq!(
            f["uid"], "65534",
            "a root runner's agent is nobody: {summary}"
        );
        assert_eq!(f["owner"], "65534", "{summary}");
    }
    assert_eq!(
        f["self"], "1",
        "its own PID namespace, itself its init: {summary}"
    );
    let procs: u32 = f["procs"].parse().unwrap();
    assert!(procs < 20, "it sees only its own processes: {summary}");
    // Its parent (bwrap, then the runner) is outside its namespace: invisible.
    assert_eq!(f["ppid"], "0", "{summary}");
    assert_eq!(f["other_items"], "0", "{summary}");
    assert_eq!(f["folder"], "700", "{summary}");
    assert_eq!(f["prompt"], "600", "{summary}");
}

/// Writes the hostile script and its leftover helper into `dir`; returns the
/// command line.
fn hostile_scripts(dir: &Path) -> String {
    write_script(dir, "leftover.sh", LEFTOVER);
    write_script(dir, "hostile.sh", HOSTILE)
}

/// The whole loop with the hostile agent: `shepherd run` dispatches three `ci-fix`
/// attempts for a red PR (the script steals and leaves children, then answers with a
/// symlink to `/dev/zero`, then with a FIFO) and a `review` of a green bot PR (the
/// script asks for changes naming the other PR, and earlier leftovers would forge an
/// approval). Nothing leaks, nothing outlives its item, the runner stays small and
/// healthy, and the one review posted is the sanctioned one.
#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_agent_steals_nothing_outlives_nothing_and_forges_no_review() {
    let policy = "tiers = [\"small\", \"medium\", \"large\"]\nstuck_after = 1\n\
                  reviewer_logins = [\"rev-agent\"]\n";
    let s = Scenario::start(policy).await;
    let tag = s.shepherd.prefix().to_owned();
    let fake = &s.fake;
    fake.add_user_token(REVIEWER, REVIEWER_TOKEN);
    let exfil = tempfile::tempdir().unwrap();
    let script = hostile_scripts(exfil.path());
    let (token_dir, token_file) = reviewer_token_file();
    open_to_agents(exfil.path());
    let runner = with_secrets(s.agents(&script), &token_file)
        .env("SHEPHERD_AGENT_SANDBOX", "on")
        .env(
            "SHEPHERD_AGENT_SANDBOX_WRITABLE",
            exfil.path().display().to_string(),
        )
        .env("SHEPHERD_AGENT_ENV", format!("SCAN,OTHER_PR,{TAG_VAR}"))
        .env(TAG_VAR, s.shepherd.prefix())
        .env("SCAN", token_dir.path().display().to_string())
        .start()
        .await;
    let secrets = secrets(fake.token());
    // The control: the secrets are there to steal, in the runner's environment.
    let environ = std::fs::read(format!("/proc/{}/environ", runner.pid())).unwrap();
    assert!(
        String::from_utf8_lossy(&environ).contains(fake.token()),
        "the runner holds the bot's token"
    );
    let rss_before = rss_kb(runner.pid());

    // ci-fix: three attempts.
    let red = fake.open_pr(REPO, NewPr::new("agent-bot", "Add y").body("Adds y."));
    let sha = fake.head_sha(REPO, red);
    fake.set_status(REPO, &sha, "ci/test", "failure", "2 tests failed");
    s.send(&fake.pr_opened(REPO, red)).await;
    let mut ids: Vec<String> = Vec::new();
    for k in 1..=3 {
        poll_until_named(
            DEADLINE,
            &format!("ci-fix attempt {k}'s result is recorded"),
            || async {
                attempts(&s, red)
                    .await
                    .get(k - 1)
                    .is_some_and(|a| a["reported_signature"].is_string())
            },
        )
        .await;
        let a = attempts(&s, red).await;
        let id = a[k - 1]["work_id"].as_str().unwrap().to_owned();
        assert!(
            processes_of(&id, &tag).is_empty(),
            "a process of {id} outlived its recorded result"
        );
        ids.push(id);
    }
    let a = attempts(&s, red).await;
    assert_eq!(a[0]["reported_signature"], "hostile", "{a:?}");
    let summary = a[0]["summary"].as_str().unwrap();
    assert_contained(summary);
    for (i, what) in [(1, "symbolic link"), (2, "a FIFO")] {
        assert_eq!(a[i]["reported_signature"], "result-file", "{a:?}");
        let why = a[i]["summary"].as_str().unwrap_or_default();
        assert!(why.contains(what), "attempt {i}: {why}");
    }
    let (status, body) = healthz(&runner.url("/healthz")).await;
    assert_eq!(
        (status, body.as_str()),
        (200, "ok\n"),
        "no worker thread stuck"
    );

    // review: a green bot PR; the leftovers of the runs before tried to forge its
    // verdict.
    let green = fake.open_pr(REPO, NewPr::new("agent-bot", "Add z").body("Adds z."));
    let green_sha = fake.head_sha(REPO, green);
    fake.set_status(REPO, &green_sha, "ci/test", "success", "all green");
    s.send(&fake.pr_opened(REPO, green)).await;
    let reviews_of = |n: u64| {
        fake.with_model(|m| {
            m.repo_mut(REPO)
                .reviews
                .iter()
                .filter(|r| r.number == n)
                .map(|r| (r.user.clone(), r.state.clone(), r.body.clone()))
                .collect::<Vec<_>>()
        })
    };
    s.wait_fake("the reviewer's review is posted", |_| {
        !reviews_of(green).is_empty()
    })
    .await;
    let items = s.work_items().await;
    let review_id = items
        .iter()
        .find(|i| i["kind"] == "review")
        .and_then(|i| i["id"].as_str())
        .unwrap()
        .to_owned();
    let keys = s.shepherd.keys();
    poll_until_named(DEADLINE, "the review's result is recorded", || async {
        super::run_record_on(&mut s.redis_conn(), &keys, &review_id)
            .await
            .is_some_and(|r| r["state"] == "finished")
    })
    .await;
    assert!(processes_of(&review_id, &tag).is_empty());
    ids.push(review_id.clone());
    let posted = reviews_of(green);
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert_eq!(
        (posted[0].0.as_str(), posted[0].1.as_str()),
        (REVIEWER, "REQUEST_CHANGES"),
        "the agent's own verdict, not a leftover's forged approval"
    );
    assert!(reviews_of(red).is_empty(), "no review on the other PR");
    s.wait_idle().await;

    // Nothing outlived its item, ever: no process, and no leftover's mark.
    for id in &ids {
        assert!(
            processes_of(id, &tag).is_empty(),
            "a process of {id} is alive"
        );
    }
    let marks = file_names(exfil.path());
    assert!(
        marks.iter().all(|m| !m.starts_with("leftover-")),
        "a leftover process ran on: {marks:?}"
    );
    assert!(
        marks.iter().filter(|m| m.starts_with("ran-")).count() >= 4,
        "{marks:?}"
    );

    // Nothing stolen: what the agent saw and sent, the summaries, the stored logs, the
    // records, every key under the prefix, every call to Forgejo.
    for m in &marks {
        let text =
            String::from_utf8_lossy(&std::fs::read(exfil.path().join(m)).unwrap()).into_owned();
        assert_no_secret(
            &format!("what the agent exfiltrated ({m})"),
            &text,
            &secrets,
        );
    }
    let loot =
        String::from_utf8_lossy(&std::fs::read(exfil.path().join("loot-0")).unwrap()).into_owned();
    assert!(
        loot.contains("== parent") && loot.contains("== files"),
        "the attack ran"
    );
    let dump = redis_dump(&mut s.redis_conn(), s.shepherd.prefix()).await;
    assert!(dump.contains("loot"), "the agents' logs are in Redis");
    assert_no_secret("Redis", &dump, &secrets);
    for call in fake.all_calls() {
        let text = format!("{} {:?} {}", call.path, call.query, call.body);
        assert_no_secret("a Forgejo call", &text, &secrets);
    }
    assert_no_secret("the status page", &s.status_page().await, &secrets);

    let rss_after = rss_kb(runner.pid());
    assert!(
        rss_after < rss_before + RSS_SLACK_KB,
        "the runner's RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    drop(token_dir);
}

/// Finding 1: from inside the sandbox the agent reads no secret — not the runner's
/// environment, not another process's, not a world-readable token file outside its
/// folder — and sees only its own processes.
#[tokio::test(flavor = "multi_thread")]
async fn finding_1_the_agent_reads_no_secret() {
    let rig = Rig::start().await;
    let script = hostile_scripts(rig.dir.path());
    let (token_dir, token_file) = reviewer_token_file();
    let runner = with_secrets(rig.sandboxed_runner(&script), &token_file)
        .env("SHEPHERD_AGENT_ENV", format!("SCAN,{TAG_VAR}"))
        .env("SCAN", token_dir.path().display().to_string())
        .start()
        .await;
    let n = rig.open_pr(super::REPO);
    let id = ci_fix(&rig, n).await;
    let results = rig.wait_results(1).await;
    assert_eq!(results[0]["work_id"], id.as_str());
    let summary = std::fs::read_to_string(rig.path("summary-0")).unwrap();
    assert_contained(&summary);
    let loot = String::from_utf8_lossy(&std::fs::read(rig.path("loot-0")).unwrap()).into_owned();
    assert!(
        loot.contains(&format!("-- {}", token_file.display())),
        "the agent tried the token file (hidden behind an empty file)"
    );
    let secrets = secrets(rig.fake.token());
    assert_no_secret("the loot", &loot, &secrets);
    assert_no_secret("the result", &results[0].to_string(), &secrets);
    assert_no_secret("the log", &rig.log(&id).await.unwrap_or_default(), &secrets);
    drop(runner);
}

/// Finding 2: the agent's `setsid` and double-forked children die with it — when it
/// exits (its result recorded) and when its item is cancelled — and never write into
/// the next item's folder.
#[tokio::test(flavor = "multi_thread")]
async fn finding_2_no_process_of_an_item_outlives_it() {
    let rig = Rig::start().await;
    let tag = rig.prefix.clone();
    write_script(rig.dir.path(), "leftover.sh", LEFTOVER);
    let script = rig.script(
        "spawn.sh",
        r#"setsid sh -c 'exec sleep 600' </dev/null >/dev/null 2>&1 &
( sh -c 'exec sleep 600' </dev/null >/dev/null 2>&1 & )
setsid "$DIR/leftover.sh" setsid </dev/null >/dev/null 2>&1 &
( "$DIR/leftover.sh" double </dev/null >/dev/null 2>&1 & )
touch "$DIR/spawned-$SHEPHERD_WORK_ID"
[ -e "$DIR/hang" ] && exec sleep 600
exit 0"#,
    );
    let _runner = rig.sandboxed_runner(&script).start().await;
    let n = rig.open_pr(super::REPO);
    // It exits, leaving its children.
    let first = ci_fix(&rig, n).await;
    rig.wait_results(1).await;
    rig.wait_state(&first, "finished").await;
    assert!(rig.path(&format!("spawned-{first}")).exists());
    assert_eq!(processes_of(&first, &tag), Vec::<u32>::new());
    // It hangs and is cancelled.
    std::fs::write(rig.path("hang"), "").unwrap();
    let second = ci_fix(&rig, n).await;
    poll_until_named(
        DEADLINE,
        "the second agent spawned its children",
        || async { rig.path(&format!("spawned-{second}")).exists() },
    )
    .await;
    assert!(
        processes_of(&second, &tag).len() >= 3,
        "the test sees the agent's processes: {:?}",
        processes_of(&second, &tag)
    );
    rig.cancel(&second, super::REPO, n).await;
    rig.wait_state(&second, "cancelled").await;
    wait_no_process_of(&second, &tag, "every process of the cancelled item is gone").await;
    // The leftovers never ran on.
    let marks = file_names(rig.dir.path());
    assert!(
        marks.iter().all(|m| !m.starts_with("leftover-")),
        "{marks:?}"
    );
}

/// Finding 3: a result file that is a symlink to `/dev/zero`, or a FIFO, is an
/// invalid result, reported at once; the runner neither reads endlessly nor blocks,
/// and stays healthy.
#[tokio::test(flavor = "multi_thread")]
async fn finding_3_symlink_and_fifo_result_files_are_invalid_results() {
    let (rig, script) = Rig::with_script(
        "bad-result.sh",
        r#"if [ -e "$DIR/fifo" ]; then mkfifo "$SHEPHERD_RESULT_FILE"; else ln -s /dev/zero "$SHEPHERD_RESULT_FILE"; fi"#,
    )
    .await;
    let runner = rig.sandboxed_runner(&script).start().await;
    let rss_before = rss_kb(runner.pid());
    let n = rig.open_pr(super::REPO);
    ci_fix(&rig, n).await;
    rig.wait_results(1).await;
    std::fs::write(rig.path("fifo"), "").unwrap();
    ci_fix(&rig, n).await;
    let results = rig.wait_results(2).await;
    for (r, what) in results.iter().zip(["a symbolic link", "a FIFO"]) {
        assert_eq!(r["outcome"], "failed", "{r}");
        assert_eq!(r["signature"], "result-file", "{r}");
        let summary = r["summary"].as_str().unwrap_or_default();
        assert!(summary.contains(what), "{what}: {r}");
    }
    let (status, body) = healthz(&runner.url("/healthz")).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let rss_after = rss_kb(runner.pid());
    assert!(
        rss_after < rss_before + RSS_SLACK_KB,
        "RSS {rss_before} → {rss_after} KiB"
    );
}

/// Finding 7: the item's folder is 0700 and its files 0600, owned by the agent's user
/// (`SHEPHERD_AGENT_UID` under a root runner; the default, nobody, is what the opencode
/// loop tests see), checked from outside while the agent runs.
#[tokio::test(flavor = "multi_thread")]
async fn finding_7_item_folders_are_private_to_the_agent() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let (rig, script) = Rig::with_script(
        "private.sh",
        r#"id -u > "$DIR/uid"; id -g >> "$DIR/uid"
dirname "$SHEPHERD_PROMPT_FILE" > "$DIR/folder"
while [ ! -e "$DIR/release" ]; do sleep 0.05; done"#,
    )
    .await;
    let _runner = rig
        .sandboxed_runner(&script)
        .env("SHEPHERD_AGENT_UID", "10002:10003")
        .start()
        .await;
    let n = rig.open_pr(super::REPO);
    let id = ci_fix(&rig, n).await;
    poll_until_named(DEADLINE, "the agent names its folder", || async {
        std::fs::read_to_string(rig.path("folder")).is_ok_and(|f| f.ends_with('\n'))
    })
    .await;
    let folder = PathBuf::from(std::fs::read_to_string(rig.path("folder")).unwrap().trim());
    let root = running_as_root();
    let meta = std::fs::metadata(&folder).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700, "{folder:?}");
    if root {
        assert_eq!(
            (meta.uid(), meta.gid()),
            (10002, 10003),
            "the agent's user owns its folder"
        );
        let ids = std::fs::read_to_string(rig.path("uid")).unwrap();
        assert_eq!(
            ids, "10002\n10003\n",
            "the agent runs as SHEPHERD_AGENT_UID"
        );
    }
    for f in ["prompt.md", "work.json"] {
        let meta = std::fs::metadata(folder.join(f)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{f}");
    }
    std::fs::write(rig.path("release"), "").unwrap();
    rig.wait_state(&id, "finished").await;
    assert!(!folder.exists(), "the folder is removed");
}

/// A sandbox that cannot be set up as configured stops `shepherd agents` at start,
/// saying why.
#[tokio::test(flavor = "multi_thread")]
async fn the_runner_refuses_to_start_without_its_sandbox() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("agents")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("SHEPHERD_AGENT_COMMAND", "/bin/true")
        .env("SHEPHERD_FORGEJO_URL", "http://127.0.0.1:1")
        .env("SHEPHERD_FORGEJO_TOKEN", "t")
        .env("SHEPHERD_REDIS_URL", "redis://127.0.0.1:1")
        .env("SHEPHERD_LISTEN", "127.0.0.1:0")
        .env("SHEPHERD_AGENT_SANDBOX_WRITABLE", "/")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("the agent sandbox") && err.contains("holds the work dir"),
        "{err}"
    );
    // An agent program below /tmp would be hidden by the private /tmp: refused at start
    // (not an `exit:127` per item), until SHEPHERD_AGENT_SANDBOX_READABLE names it.
    let dir = tempfile::Builder::new()
        .tempdir_in("/tmp")
        .expect("a folder under /tmp");
    let agent = dir.path().join("agent.sh");
    std::fs::write(&agent, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let start = |readable: &str| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .arg("agents")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("SHEPHERD_AGENT_COMMAND", agent.display().to_string())
            .env("SHEPHERD_AGENT_SANDBOX_READABLE", readable)
            .env("SHEPHERD_FORGEJO_URL", "http://127.0.0.1:1")
            .env("SHEPHERD_FORGEJO_TOKEN", "t")
            .env("SHEPHERD_REDIS_URL", "redis://127.0.0.1:1")
            .env("SHEPHERD_LISTEN", "127.0.0.1:0")
            .kill_on_drop(true)
            .output()
    };
    let out = start("").await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("is under /tmp or the work dir")
            && err.contains("SHEPHERD_AGENT_SANDBOX_READABLE"),
        "{err}"
    );
    // Named readable, the sandbox's checks pass: the runner goes on to Redis, which is
    // not there (it ends or keeps trying; either way it got past the sandbox).
    let named = dir.path().display().to_string();
    if let Ok(out) = tokio::time::timeout(std::time::Duration::from_secs(10), start(&named)).await {
        let err = String::from_utf8_lossy(&out.unwrap().stderr).into_owned();
        assert!(!err.contains("is under /tmp or the work dir"), "{err}");
        assert!(!err.contains("the agent sandbox"), "{err}");
    }
}

/// Finding 2, the runner's death: a runner killed with SIGKILL takes its sandboxed
/// agent and everything the agent started (`setsid` and double-forked children) with
/// it.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_runner_takes_every_process_of_its_sandboxed_agent_with_it() {
    let (rig, script) = Rig::with_script(
        "hang.sh",
        r#"setsid sh -c 'exec sleep 600' </dev/null >/dev/null 2>&1 &
( sh -c 'exec sleep 600' </dev/null >/dev/null 2>&1 & )
touch "$DIR/spawned-$SHEPHERD_WORK_ID"
exec sleep 600"#,
    )
    .await;
    let tag = rig.prefix.clone();
    let mut runner = rig.sandboxed_runner(&script).start().await;
    let n = rig.open_pr(super::REPO);
    let id = ci_fix(&rig, n).await;
    poll_until_named(DEADLINE, "the agent spawned its children", || async {
        rig.path(&format!("spawned-{id}")).exists()
    })
    .await;
    assert!(
        processes_of(&id, &tag).len() >= 3,
        "{:?}",
        processes_of(&id, &tag)
    );
    runner.kill();
    wait_no_process_of(&id, &tag, "every process of the agent dies with its runner").await;
}

/// The checkout in the sandbox: the clone is handed to the agent's user, who commits
/// and pushes from inside the sandbox.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandboxed_agent_commits_and_pushes_from_its_checkout() {
    let rig = Rig::start().await;
    let (bare, sha, n) = super::runner::pr_on_a_git_branch(&rig);
    let script = rig.script(
        "git.sh",
        r#"id -u > "$DIR/uid"
echo change > change.txt && git add change.txt \
  && git -c user.name=agent -c user.email=agent@example.org commit -qm fix \
  && git -c safe.directory='*' push -q origin HEAD
# The fake Forgejo does not see pushes to this bare repository: the agent says what
# it did (without a result file its outcome is read from the fake's PR head).
printf '{"outcome":"succeeded"}' > "$SHEPHERD_RESULT_FILE""#,
    );
    // The remote is the test's (root's), open to the agents' user, whose push says
    // the folder is safe.
    let root = running_as_root();
    let runner = rig.sandboxed_runner(&script);
    let url = format!(
        "file://{}/git/{{owner}}/{{repo}}.git",
        rig.dir.path().display()
    );
    let _runner = runner
        .env("SHEPHERD_AGENT_CHECKOUT", "true")
        .env("SHEPHERD_AGENT_CLONE_URL", url)
        .start()
        .await;
    ci_fix(&rig, n).await;
    let results = rig.wait_results(1).await;
    assert_eq!(results[0]["outcome"], "succeeded", "{}", results[0]);
    if root {
        let uid = std::fs::read_to_string(rig.path("uid")).unwrap();
        assert_eq!(uid.trim(), "65534");
    }
    let pushed = super::runner::git(&bare, &["rev-parse", "feature-x"]);
    assert_ne!(pushed, sha, "the agent's push reached the branch");
}
