//! `shepherd agents` (issue 14): the real runner binary with plain shell scripts as
//! agents, a real redis-server and the fake Forgejo (for the work items' context).
//!
//! - `runner`: work items put straight into the dispatch stream (and the work index,
//!   as a commit would): placeholders, environment, prompt, result files, caps and
//!   priority, deadline, two runners, a missing program.
//! - `e2e`: the whole loop through `shepherd run` and the scenario harness: cancel by
//!   a human push, the agent's own push then its result, a runner crash, escalation.
//! - `review_runner`: `review` work in the runner alone: the verdict posted once as
//!   the reviewer, and each way it can fail.
//! - `review_e2e`: reviewer agents (issue 15): change request → feedback → push →
//!   approval → merge, and three rounds of the same change request → needs-human.
//! - `binding`: every action bound to the record (issue 26): forged entries refused
//!   and counted, verdicts for a moved head not posted, a record that moved on while
//!   the agent ran.
//! - `hostile_agent`: the agent sandbox (issue 26): a hostile script as the agent, in
//!   the real bubblewrap sandbox, tries every attack of the issue's findings.
//! - `ledger_e2e`: the cost ledger (issue 28) after two real opencode runs through
//!   `shepherd run` and `shepherd agents` equals the stub model server's sums.
//! - `v2_life`: seed 004's worker (`v2_worker.py`, written from its rules) through
//!   opencode, the stub model and the sandbox, under the `cleveragents-v2` profile: a
//!   red PR fixed from its job log to merge, and a labelled issue to a merged PR.
//! - `v2_startup`: the same worker run directly on a `cleveragents-v2` prompt: the
//!   `printenv` fallback, and the startup stop when a required parameter is missing.
//! - `transient`: transient agent failures (issue 27): a rate-limited agent retried at
//!   the same tier without an attempt; one that always claims `transient` escalates.
//! - `world`: outcomes read from Forgejo when an agent writes no result file (issue
//!   27): pushed, opened-pr, `no-changes`, Forgejo unreadable; a `cleveragents-v2`
//!   worker that stops at startup, and a success no push follows, escalating to
//!   needs-human.
//!
//! The runner tests of the runner's protocol (`runner`, `e2e`, `review_*`) run their
//! script agents with `SHEPHERD_AGENT_SANDBOX=off`: they follow the agents' host pids
//! and marker files in the test's temp dirs, which a sandboxed agent cannot see.
//! `hostile_agent` and the opencode tests run with the sandbox on.

mod bench;
mod binding;
mod ci_logs;
mod context;
mod e2e;
mod epic;
mod hostile_agent;
mod issue_inputs;
mod ledger_e2e;
mod opencode;
mod opencode_loop;
mod profile_v2;
mod review_e2e;
mod review_runner;
mod runner;
mod transient;
mod usage;
mod v2_life;
mod v2_startup;
mod world;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use shepherd::store::Keys;

use crate::support::fake_forgejo::{FakeForgejo, NewPr};
use crate::support::redis::{RedisServer, stream_entries};
use crate::support::shepherd::{Builder, Shepherd};
use crate::support::{poll_until_named, scenario::DEADLINE};

/// The repository of the injected work items.
pub const REPO: &str = "acme/agents";

/// The reviewer agent named by injected `review` work items.
pub const REVIEWER: &str = "rev-agent";

/// A redis-server, a fake Forgejo, a key prefix and a folder for the agents' scripts
/// and the marker files they write.
pub struct Rig {
    /// Redis.
    pub redis: RedisServer,
    /// The fake Forgejo (the runner reads each work item's PR or issue from it).
    pub fake: FakeForgejo,
    /// Scripts and markers.
    pub dir: tempfile::TempDir,
    /// The key prefix every runner of the rig shares.
    pub prefix: String,
    /// A connection for assertions.
    pub conn: crate::support::redis::TestConn,
    /// Work items dispatched so far (their sequence numbers).
    seq: std::sync::atomic::AtomicU64,
}

impl Rig {
    /// Starts Redis and the fake.
    pub async fn start() -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let redis = RedisServer::start();
        let fake = FakeForgejo::start().await;
        let conn = redis.conn().await;
        Self {
            redis,
            fake,
            dir: tempfile::tempdir().expect("temp dir"),
            prefix: format!("ag{}-{n}", std::process::id()),
            conn,
            seq: Default::default(),
        }
    }

    /// Starts a rig with the agent script `name` written (see [`Self::script`]);
    /// returns it and the script's path.
    pub async fn with_script(name: &str, body: &str) -> (Self, String) {
        let rig = Self::start().await;
        let script = rig.script(name, body);
        (rig, script)
    }

    /// The rig's key layout.
    pub fn keys(&self) -> Keys {
        Keys::new(self.prefix.clone(), 1)
    }

    /// A path in the rig's folder.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes an executable `/bin/sh` script `name` (`$DIR` in `body` is the rig's
    /// folder); returns its path.
    pub fn script(&self, name: &str, body: &str) -> String {
        write_script(self.dir.path(), name, body)
    }

    /// `shepherd agents` on the rig running `command`, with the fake's URL and token,
    /// unsandboxed (see the module docs; [`Self::sandboxed_runner`] for the sandbox).
    pub fn runner(&self, command: &str) -> Builder {
        self.runner_with(command)
            .env("SHEPHERD_AGENT_SANDBOX", "off")
    }

    /// `shepherd agents` on the rig running `command` in the real sandbox, with the
    /// rig's folder (scripts, marker files) open to the agents' user and writable.
    pub fn sandboxed_runner(&self, command: &str) -> Builder {
        open_to_agents(self.dir.path());
        self.runner_with(command)
            .env("SHEPHERD_AGENT_SANDBOX", "on")
            .env("SHEPHERD_AGENT_ENV", TAG_VAR)
            .env(TAG_VAR, self.prefix.clone())
            .env(
                "SHEPHERD_AGENT_SANDBOX_WRITABLE",
                self.dir.path().display().to_string(),
            )
    }

    /// The runner's settings, the sandbox's left to the caller.
    fn runner_with(&self, command: &str) -> Builder {
        Shepherd::builder(&self.redis)
            .agents(command)
            .prefix(&self.prefix)
            .env("SHEPHERD_FORGEJO_URL", self.fake.url())
            .env("SHEPHERD_FORGEJO_TOKEN", self.fake.token())
            .env("SHEPHERD_BOT_LOGIN", self.fake.bot_login())
            .env("SHEPHERD_AGENT_DEADLINE_MARGIN_SECS", "1")
            .env("SHEPHERD_AGENT_KILL_GRACE_SECS", "2")
    }

    /// Opens a PR in the fake; returns its number.
    pub fn open_pr(&self, repo: &str) -> u64 {
        self.fake.open_pr(
            repo,
            NewPr::new("agent-bot", "Fix the thing").body("Fixes it."),
        )
    }

    /// Dispatches a work item for `repo#number` of `kind` as a commit would (the
    /// record's active work, the work index entry, then the dispatch entry); returns its
    /// id. The claim expires in `expires_in`.
    pub async fn dispatch(
        &self,
        repo: &str,
        number: u64,
        kind: &str,
        tier: u8,
        expires_in: Duration,
    ) -> String {
        let item = self.activate(repo, number, kind, tier, expires_in).await;
        self.enqueue(&item).await;
        item["id"].as_str().expect("id").to_owned()
    }

    /// Makes a new work item the active work of `repo#number` (record and work index)
    /// without putting it on the dispatch stream; returns its JSON.
    pub async fn activate(
        &self,
        repo: &str,
        number: u64,
        kind: &str,
        tier: u8,
        expires_in: Duration,
    ) -> Value {
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let issue = kind == "issue-impl";
        let scope = if issue { "issue" } else { "pr" };
        let (owner, name) = repo.split_once('/').expect("owner/name");
        let id = format!("{owner}:{name}:{scope}:{number}:{seq}");
        let priority = match kind {
            "merge-conflicts" => 50,
            "ci-fix" => 40,
            "review-feedback" => 30,
            "review" => 25,
            "stale-check" => 20,
            _ => 10,
        };
        let tiers = ["haiku", "codex", "sonnet", "opus"];
        let expires =
            chrono::Utc::now() + chrono::Duration::from_std(expires_in).expect("duration");
        let item = json!({
            "id": id, "kind": kind, "repo": repo, "number": number,
            "head_sha": if issue { Value::Null } else { json!(self.fake.head_sha(repo, number)) },
            "tier": tier, "tier_name": tiers[usize::from(tier)], "attempt": 1, "priority": priority,
            "claim_expires_at": expires.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "context": {"failing_checks": [], "change_requests": [], "attempts": []},
        });
        let mut item = item;
        if kind == "review" {
            item["context"]["review"] = json!({"reviewer": REVIEWER, "round": 1, "max_rounds": 3});
        }
        let keys = self.keys();
        let mut conn = self.conn.clone();
        set_active_work(&mut conn, &keys, &item).await;
        let owner = format!("{scope}\t{repo}\t{number}");
        let () = redis::cmd("HSET")
            .arg(keys.work_index(0))
            .arg(&id)
            .arg(owner)
            .query_async(&mut conn)
            .await
            .expect("HSET work index");
        item
    }

    /// Appends `item` (any JSON, forged or not) to the dispatch stream as a work entry.
    pub async fn enqueue(&self, item: &Value) {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("XADD")
            .arg(self.keys().dispatch())
            .arg("*")
            .arg("work")
            .arg(item.to_string())
            .query_async(&mut conn)
            .await
            .expect("XADD dispatch");
    }

    /// Appends a cancel notice for work item `id` of `repo#number`.
    pub async fn cancel(&self, id: &str, repo: &str, number: u64) {
        let notice = json!({"id": id, "kind": "cancel", "repo": repo, "number": number});
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("XADD")
            .arg(self.keys().dispatch())
            .arg("*")
            .arg("cancel")
            .arg(notice.to_string())
            .query_async(&mut conn)
            .await
            .expect("XADD cancel");
    }

    /// The work results queued on the events stream so far (`work_id`, `outcome`,
    /// `signature`, `summary`).
    pub async fn results(&self) -> Vec<Value> {
        results_on(&mut self.conn.clone(), &self.keys()).await
    }

    /// Waits until `n` results are queued; returns them all.
    pub async fn wait_results(&self, n: usize) -> Vec<Value> {
        poll_until_named(DEADLINE, &format!("{n} work result(s) queued"), || async {
            self.results().await.len() >= n
        })
        .await;
        self.results().await
    }

    /// The runner's record of work item `id` (`<p>:agent-run:<id>`).
    pub async fn run_record(&self, id: &str) -> Option<Value> {
        run_record_on(&mut self.conn.clone(), &self.keys(), id).await
    }

    /// Waits until the runner's record of `id` is in `state`; returns it.
    pub async fn wait_state(&self, id: &str, state: &str) -> Value {
        let what = format!("work item {id} is {state} in a runner");
        poll_until_named(DEADLINE, &what, || async {
            self.run_record(id)
                .await
                .is_some_and(|r| r["state"] == state)
        })
        .await;
        self.run_record(id).await.expect("run record")
    }

    /// The stored output log of `id`.
    pub async fn log(&self, id: &str) -> Option<String> {
        let mut conn = self.conn.clone();
        redis::cmd("GET")
            .arg(self.keys().agent_log(id))
            .query_async(&mut conn)
            .await
            .expect("GET agent log")
    }

    /// Entries pending (delivered, not acked) in the `agents` group.
    pub async fn pending(&self) -> u64 {
        pending_on(&mut self.conn.clone(), &self.keys()).await
    }
}

/// Makes `item` (a work item's JSON) the active work of its PR or issue record, as the
/// commit of its dispatch does (the runner runs, posts and reports only the record's
/// active work, issue 26); creates the record when there is none.
pub async fn set_active_work(
    conn: &mut crate::support::redis::TestConn,
    keys: &Keys,
    item: &Value,
) {
    use shepherd::core::record::{IssueRecord, PrRecord};
    let repo: shepherd::core::ids::RepoName = item["repo"].as_str().unwrap().parse().unwrap();
    let number = item["number"].as_u64().unwrap();
    let issue = item["kind"] == "issue-impl";
    let key = if issue {
        keys.issue_record(repo.as_str(), number)
    } else {
        keys.pr_record(repo.as_str(), number)
    };
    let stored: Option<String> = redis::cmd("HGET")
        .arg(&key)
        .arg("data")
        .query_async(conn)
        .await
        .expect("HGET record");
    let active = json!({
        "item": item, "signature": format!("test:{}", item["id"].as_str().unwrap()),
        "dispatched_ms": chrono::Utc::now().timestamp_millis(),
        "expires_ms": chrono::DateTime::parse_from_rfc3339(item["claim_expires_at"].as_str().unwrap())
            .unwrap()
            .timestamp_millis(),
    });
    let active = serde_json::from_value(active).expect("active work");
    // The stored record (or a new one) of type `$record`, holding the item as its
    // active work, one version on.
    macro_rules! with_active {
        ($record:ident, $what:literal) => {{
            let mut r = stored.map_or_else(
                || $record::new(repo.clone(), number),
                |d| $record::from_json(&d).expect($what),
            );
            r.work.active = Some(active);
            r.version += 1;
            r.to_json()
        }};
    }
    let data = if issue {
        with_active!(IssueRecord, "issue record")
    } else {
        with_active!(PrRecord, "PR record")
    };
    let version: u64 = serde_json::from_str::<Value>(&data).unwrap()["version"]
        .as_u64()
        .unwrap();
    let () = redis::cmd("HSET")
        .arg(&key)
        .arg("v")
        .arg(version)
        .arg("data")
        .arg(data)
        .query_async(conn)
        .await
        .expect("HSET record");
}

/// Writes an executable `/bin/sh` script `name` into `dir` (`$DIR` in `body` is
/// `dir`); returns its path.
pub fn write_script(dir: &std::path::Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    let text = format!("#!/bin/sh\nDIR='{}'\n{body}\n", dir.display());
    std::fs::write(&path, text).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path.display().to_string()
}

/// The work results queued on shard 0's events stream.
pub async fn results_on(conn: &mut crate::support::redis::TestConn, keys: &Keys) -> Vec<Value> {
    stream_entries(conn, &keys.events(0))
        .await
        .into_iter()
        .filter(|(_, f)| f.get("event").is_some_and(|e| e.starts_with("work-result")))
        .map(|(_, f)| {
            let body: Value = serde_json::from_str(&f["body"]).expect("event JSON");
            find_work_id(&body).cloned().unwrap_or(body)
        })
        .collect()
}

/// The object holding `work_id` inside an event's JSON (whatever its tagging).
fn find_work_id(v: &Value) -> Option<&Value> {
    match v {
        Value::Object(m) if m.contains_key("work_id") => Some(v),
        Value::Object(m) => m.values().find_map(find_work_id),
        _ => None,
    }
}

/// A runner's record of `id`.
pub async fn run_record_on(
    conn: &mut crate::support::redis::TestConn,
    keys: &Keys,
    id: &str,
) -> Option<Value> {
    let json: Option<String> = redis::cmd("GET")
        .arg(keys.agent_run(id))
        .query_async(conn)
        .await
        .expect("GET agent run");
    json.map(|j| serde_json::from_str(&j).expect("run JSON"))
}

/// Pending entries of the `agents` group on the dispatch stream.
pub async fn pending_on(conn: &mut crate::support::redis::TestConn, keys: &Keys) -> u64 {
    let v: redis::Value = redis::cmd("XPENDING")
        .arg(keys.dispatch())
        .arg("agents")
        .query_async(conn)
        .await
        .expect("XPENDING");
    match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::Int(n)) => *n as u64,
            _ => 0,
        },
        _ => 0,
    }
}

/// Whether process `pid` is alive (`kill -0`), zombies counting as gone.
pub fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state is the field after the parenthesised command name.
    let state = stat
        .rsplit_once(')')
        .map(|(_, r)| r.trim_start().chars().next());
    matches!(state, Some(Some(s)) if s != 'Z' && s != 'X')
}

/// Reads a pid that a script wrote to `path` (waiting until it is there).
pub async fn read_pid(path: &std::path::Path) -> u32 {
    let what = format!("{} is written", path.display());
    poll_until_named(DEADLINE, &what, || async {
        std::fs::read_to_string(path).is_ok_and(|t| t.trim().parse::<u32>().is_ok())
    })
    .await;
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Opens `dir` and everything in it to every user (folders 0777, files 0666, scripts
/// keep their execute bits): the sandboxed agent runs as another uid.
pub fn open_to_agents(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777));
            for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                stack.push(e.path());
            }
        } else if meta.is_file() {
            let mode = meta.permissions().mode() | 0o666;
            let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode));
        }
    }
}

/// The variable a sandboxed runner of the tests passes to its agents (through
/// `SHEPHERD_AGENT_ENV`), holding the test's key prefix: work ids repeat across tests
/// running at the same time, the prefix does not.
pub const TAG_VAR: &str = "IT_AGENT_TAG";

/// The host pids of the live processes whose environment holds
/// `SHEPHERD_WORK_ID=<id>` and [`TAG_VAR`]`=<tag>` — every process an agent of work
/// item `id` of this test started, whatever namespace, session or process group it is
/// in (zombies do not count).
pub fn processes_of(work_id: &str, tag: &str) -> Vec<u32> {
    let needle = format!("SHEPHERD_WORK_ID={work_id}");
    let tag = format!("{TAG_VAR}={tag}");
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let env = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let has = |v: &str| env.split(|b| *b == 0).any(|var| var == v.as_bytes());
        if has(&needle) && has(&tag) && alive(pid) {
            out.push(pid);
        }
    }
    out
}
