//! End-to-end scenario harness: a real redis-server, the fake Forgejo, and the real
//! `shepherd run` binary (ingest + worker + executor in one process) pointed at both,
//! with a policy file of short timers. Test actions change the fake's model and send
//! the matching signed webhook through the real ingest; assertions read the fake's
//! call log and model and the dispatch stream. Everything waits by polling with a
//! deadline, never by sleeping.

use std::collections::HashMap;
use std::io::Write as _;
use std::time::Duration;

use serde_json::Value;

use super::fake_forgejo::{FakeForgejo, Webhook};
use super::redis::{Backend, RedisServer, TestConn, stream_entries};
use super::shepherd::Shepherd;
use super::{poll_until_named, webhook};

/// The agents' bearer token in scenarios.
pub const AGENT_TOKEN: &str = "scenario-agent-token";
/// The admin token of every scenario process (callers may override it): without one
/// the status page is off (issue 12, finding 8).
pub const SCENARIO_ADMIN_TOKEN: &str = "scenario-admin-token";
/// How long one condition may take to come true.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Policy settings every scenario starts from: fast CI polls and retries, and a stale
/// time far beyond any scenario (set here, not left to the one-day default, so no
/// scenario depends on the date of the times it observes). The agents open their PRs
/// as `agent-bot`, a configured bot user: only the author makes a PR a bot PR.
pub const FAST_POLICY: &str = "\
bot_users = [\"agent-bot\"]
stale_after_secs = 31536000
ci_poll_initial_secs = 1
ci_poll_max_secs = 1
mergeability_delay_secs = 1
merge_retry_secs = 1
";

/// One running scenario.
pub struct Scenario {
    /// The fake Forgejo.
    pub fake: FakeForgejo,
    /// The `shepherd run` process (or `shepherd serve` in a split scenario).
    pub shepherd: Shepherd,
    /// The `shepherd work` process of a split scenario.
    _worker: Option<Shepherd>,
    /// Redis (kept alive for the scenario).
    _redis: Box<dyn Backend + Send + Sync>,
    /// A connection for assertions.
    conn: crate::support::redis::TestConn,
    /// HTTP client for webhooks and the results API.
    http: reqwest::Client,
    /// The policy file (deleted on drop).
    _policy: tempfile::NamedTempFile,
    /// The extra environment of the processes (for [`Scenario::restart`]).
    env: Vec<(String, String)>,
}

impl Scenario {
    /// Starts everything with [`FAST_POLICY`] plus `extra` lines under `[defaults]`.
    pub async fn start(extra: &str) -> Self {
        Self::start_with_env(extra, &[]).await
    }

    /// [`Scenario::start`] with extra environment variables for `shepherd run`.
    pub async fn start_with_env(extra: &str, env: &[(&str, &str)]) -> Self {
        Self::launch(&format!("{FAST_POLICY}{extra}"), env, false).await
    }

    /// Starts everything with exactly `defaults` under `[defaults]` (no
    /// [`FAST_POLICY`]), e.g. to push the CI poll out of a benchmark's way.
    pub async fn start_with_defaults(defaults: &str) -> Self {
        Self::launch(defaults, &[], false).await
    }

    /// Like [`Scenario::start`], but with `shepherd serve` and `shepherd work` as two
    /// processes sharing the key prefix (the scaled-out deployment).
    pub async fn start_split(extra: &str) -> Self {
        Self::launch(&format!("{FAST_POLICY}{extra}"), &[], true).await
    }

    async fn launch(defaults: &str, env: &[(&str, &str)], split: bool) -> Self {
        let redis = RedisServer::start();
        let conn = redis.conn().await;
        Self::launch_on(Box::new(redis), conn, defaults, env, split).await
    }

    /// Starts everything with [`FAST_POLICY`] plus `extra` against `redis` (a TLS
    /// server, a cluster…), `conn` being a connection to it for the assertions;
    /// `env` goes to every process (e.g. `SHEPHERD_SHARDS`).
    pub async fn start_on(
        redis: Box<dyn Backend + Send + Sync>,
        conn: TestConn,
        extra: &str,
        env: &[(&str, &str)],
    ) -> Self {
        Self::launch_on(redis, conn, &format!("{FAST_POLICY}{extra}"), env, true).await
    }

    async fn launch_on(
        redis: Box<dyn Backend + Send + Sync>,
        conn: TestConn,
        defaults: &str,
        env: &[(&str, &str)],
        split: bool,
    ) -> Self {
        let fake = FakeForgejo::start().await;
        let mut policy = tempfile::NamedTempFile::new().expect("policy file");
        write!(policy, "[defaults]\n{defaults}\n").expect("write policy");
        let builder = |args: &[&str]| {
            let b = Shepherd::builder(&*redis)
                .args(args.iter().copied())
                .env("SHEPHERD_FORGEJO_URL", fake.url())
                .env("SHEPHERD_FORGEJO_TOKEN", fake.token())
                .env("SHEPHERD_BOT_LOGIN", fake.bot_login())
                .env("SHEPHERD_AGENT_TOKEN", AGENT_TOKEN)
                .env("SHEPHERD_ADMIN_TOKEN", SCENARIO_ADMIN_TOKEN)
                .env("SHEPHERD_CONFIG", policy.path().display().to_string())
                .env("SHEPHERD_RECLAIM_IDLE_SECS", "15");
            env.iter().fold(b, |b, (k, v)| b.env(k, *v))
        };
        let (shepherd, worker) = match split {
            false => (builder(&["run"]).start().await, None),
            true => {
                let serve = builder(&["serve"]).start().await;
                let work = builder(&["work"]).prefix(serve.prefix()).start().await;
                (serve, Some(work))
            }
        };
        Self {
            fake,
            shepherd,
            _worker: worker,
            _redis: redis,
            conn,
            http: reqwest::Client::new(),
            _policy: policy,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    /// A crash and a restart of every Shepherd process: `shepherd run` is killed with
    /// SIGKILL (nothing finished or cleaned up) and started again on the same Redis,
    /// key prefix, Forgejo and policy. Only for a scenario with one process.
    pub async fn restart(&mut self) {
        assert!(
            self._worker.is_none(),
            "restart is for one-process scenarios"
        );
        self.shepherd.kill();
        let b = Shepherd::builder(&*self._redis)
            .args(["run"])
            .prefix(self.shepherd.prefix())
            .env("SHEPHERD_FORGEJO_URL", self.fake.url())
            .env("SHEPHERD_FORGEJO_TOKEN", self.fake.token())
            .env("SHEPHERD_BOT_LOGIN", self.fake.bot_login())
            .env("SHEPHERD_AGENT_TOKEN", AGENT_TOKEN)
            .env("SHEPHERD_ADMIN_TOKEN", SCENARIO_ADMIN_TOKEN)
            .env("SHEPHERD_CONFIG", self._policy.path().display().to_string())
            .env("SHEPHERD_RECLAIM_IDLE_SECS", "15");
        let b = self.env.iter().fold(b, |b, (k, v)| b.env(k, v.clone()));
        self.shepherd = b.start().await;
    }

    /// `shepherd agents` for this scenario (same Redis, key prefix, Forgejo and policy
    /// file) running `command` for each work item; start it with `.start()`. Its
    /// agents run unsandboxed (`SHEPHERD_AGENT_SANDBOX=off`: the scenarios follow
    /// their host pids and marker files); a test sets `SHEPHERD_AGENT_SANDBOX=on`
    /// (later settings win) for the real sandbox.
    pub fn agents(&self, command: &str) -> super::shepherd::Builder {
        Shepherd::builder(&*self._redis)
            .agents(command)
            .env("SHEPHERD_AGENT_SANDBOX", "off")
            .prefix(self.shepherd.prefix())
            .env("SHEPHERD_FORGEJO_URL", self.fake.url())
            .env("SHEPHERD_FORGEJO_TOKEN", self.fake.token())
            .env("SHEPHERD_BOT_LOGIN", self.fake.bot_login())
            .env("SHEPHERD_CONFIG", self._policy.path().display().to_string())
            .env("SHEPHERD_RECLAIM_IDLE_SECS", "15")
    }

    /// Signs `hook` with a fresh delivery id and posts it to the ingest (202 expected);
    /// returns the delivery id.
    pub async fn send(&self, hook: &Webhook) -> String {
        let delivery = webhook::new_delivery();
        let status = self.send_as(hook, &delivery).await;
        assert_eq!(status, 202, "webhook {} accepted", hook.event_type);
        delivery
    }

    /// Posts `hook` with delivery id `delivery`; returns the HTTP status.
    pub async fn send_as(&self, hook: &Webhook, delivery: &str) -> u16 {
        let request = webhook::signed(&hook.body(), hook.event_type, delivery);
        webhook::post(&self.http, &self.shepherd.webhook_url(), &request)
            .await
            .status()
            .as_u16()
    }

    /// The entries of `<prefix>:dispatch`, in order, as (field, JSON).
    pub async fn dispatch_entries(&self) -> Vec<(String, Value)> {
        let key = self.shepherd.keys().dispatch();
        let mut conn = self.conn.clone();
        stream_entries(&mut conn, &key)
            .await
            .into_iter()
            .flat_map(|(_, fields): (String, HashMap<String, String>)| fields.into_iter())
            .map(|(k, v)| {
                let json = serde_json::from_str(&v).expect("dispatch entries are JSON");
                (k, json)
            })
            .collect()
    }

    /// The work items dispatched so far.
    pub async fn work_items(&self) -> Vec<Value> {
        self.dispatch_entries()
            .await
            .into_iter()
            .filter(|(k, _)| k == "work")
            .map(|(_, v)| v)
            .collect()
    }

    /// The cancel notices dispatched so far.
    pub async fn cancels(&self) -> Vec<Value> {
        self.dispatch_entries()
            .await
            .into_iter()
            .filter(|(k, _)| k == "cancel")
            .map(|(_, v)| v)
            .collect()
    }

    /// Waits until at least `n` work items were dispatched; returns them all.
    pub async fn wait_work_items(&self, n: usize) -> Vec<Value> {
        let what = format!("{n} work item(s) dispatched");
        poll_until_named(DEADLINE, &what, || async {
            self.work_items().await.len() >= n
        })
        .await;
        self.work_items().await
    }

    /// Waits until `cond` holds on the fake Forgejo; on a timeout, prints the history
    /// of every record before failing.
    pub async fn wait_fake(&self, what: &str, cond: impl Fn(&FakeForgejo) -> bool) {
        let end = std::time::Instant::now() + DEADLINE;
        while !cond(&self.fake) {
            if std::time::Instant::now() >= end {
                self.dump().await;
                panic!("timed out after {DEADLINE:?} waiting until {what}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Prints every record's history and the fake's calls (for a failing scenario).
    pub async fn dump(&self) {
        let mut conn = self.conn.clone();
        let pattern = format!("{{{}:0}}:*hist:*", self.shepherd.prefix());
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        for key in keys {
            eprintln!("== {key}");
            for (_, f) in stream_entries(&mut conn, &key).await {
                let get = |k: &str| f.get(k).cloned().unwrap_or_default();
                eprintln!(
                    "  {} [{}] {} :: {}",
                    get("event"),
                    get("phase"),
                    get("effects"),
                    get("note")
                );
            }
        }
        for c in self.fake.all_calls() {
            eprintln!("  {} {} {:?} -> {}", c.method, c.path, c.query, c.status);
        }
    }

    /// Reports a work result through the results API; returns the HTTP status.
    pub async fn report(&self, work_id: &str, outcome: &str, signature: Option<&str>) -> u16 {
        let mut body = serde_json::json!({ "outcome": outcome });
        if let Some(s) = signature {
            body["signature"] = s.into();
        }
        self.http
            .post(self.shepherd.url(&format!("/api/v1/work/{work_id}/result")))
            .bearer_auth(AGENT_TOKEN)
            .json(&body)
            .send()
            .await
            .expect("results API answers")
            .status()
            .as_u16()
    }

    /// The stored phase of PR `n`'s record (`""` when there is no record).
    pub async fn phase(&self, repo: &str, n: u64) -> String {
        let key = self.shepherd.keys().pr_record(repo, n);
        let mut conn = self.conn.clone();
        let phase: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg("phase")
            .query_async(&mut conn)
            .await
            .expect("HGET phase");
        phase.unwrap_or_default()
    }

    /// Waits until PR `n`'s record is in `phase`.
    pub async fn wait_phase(&self, repo: &str, n: u64, phase: &str) {
        let what = format!("{repo}#{n} is in phase {phase}");
        poll_until_named(DEADLINE, &what, || async {
            self.phase(repo, n).await == phase
        })
        .await;
    }

    /// Waits until nothing is in flight: both consumer groups have read and acked
    /// everything, and no effect waits for a retry (checked twice in a row, so an
    /// effect that queues an observation is seen through).
    pub async fn wait_idle(&self) {
        self.wait_idle_for(DEADLINE).await;
    }

    /// [`Scenario::wait_idle`] with another deadline.
    pub async fn wait_idle_for(&self, deadline: Duration) {
        let end = std::time::Instant::now() + deadline;
        let mut calm = 0;
        while calm < 3 {
            calm = if self.is_idle().await { calm + 1 } else { 0 };
            assert!(
                std::time::Instant::now() < end,
                "timed out waiting until events and effects are all processed"
            );
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }

    fn is_idle(&self) -> impl std::future::Future<Output = bool> + use<> {
        let keys = self.shepherd.keys();
        let mut conn = self.conn.clone();
        async move {
            for shard in 0..keys.shards() {
                for (stream, group) in [
                    (keys.events(shard), "workers"),
                    (keys.effects(shard), "executors"),
                ] {
                    if !group_drained(&mut conn, &stream, group).await {
                        return false;
                    }
                }
                let retries: u64 = redis::cmd("ZCARD")
                    .arg(keys.effect_retries(shard))
                    .query_async(&mut conn)
                    .await
                    .unwrap_or(0);
                if retries != 0 {
                    return false;
                }
            }
            true
        }
    }

    /// Runs an operator subcommand (`inspect`, `dlq`…) of the real binary against the
    /// scenario's Redis (its URL and TLS files) and key prefix.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        self.cli_with(args, &[])
    }

    /// [`Scenario::cli`] with environment overrides (e.g. another CA file).
    pub fn cli_with(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"));
        for (key, _) in std::env::vars() {
            if key.starts_with("SHEPHERD_") {
                cmd.env_remove(key);
            }
        }
        cmd.args(args)
            .env("SHEPHERD_REDIS_URL", self._redis.url())
            .env("SHEPHERD_KEY_PREFIX", self.shepherd.prefix())
            .env("SHEPHERD_SHARDS", self.shepherd.keys().shards().to_string())
            .env("SHEPHERD_LOG", "warn");
        for (k, v) in self._redis.env() {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("run the shepherd binary")
    }

    /// [`Scenario::cli`] with the workers' policy file, bot login and Forgejo (what
    /// `rebuild` needs to fold as the workers did and to read from Forgejo).
    pub fn cli_as_workers(&self, args: &[&str]) -> std::process::Output {
        let policy = self._policy.path().display().to_string();
        let env = [
            ("SHEPHERD_CONFIG", policy.as_str()),
            ("SHEPHERD_BOT_LOGIN", self.fake.bot_login()),
            ("SHEPHERD_FORGEJO_URL", &self.fake.url()),
            ("SHEPHERD_FORGEJO_TOKEN", self.fake.token()),
        ];
        self.cli_with(args, &env)
    }

    /// A connection to the scenario's Redis.
    pub fn redis_conn(&self) -> crate::support::redis::TestConn {
        self.conn.clone()
    }

    /// The HTML of the status page `GET /` (no admin token in scenarios).
    pub async fn status_page(&self) -> String {
        self.http
            .get(self.shepherd.url("/"))
            .bearer_auth(SCENARIO_ADMIN_TOKEN)
            .send()
            .await
            .expect("status page answer")
            .text()
            .await
            .expect("status page text")
    }

    /// The Prometheus text of `GET /metrics`.
    pub async fn metrics(&self) -> String {
        self.http
            .get(self.shepherd.url("/metrics"))
            .send()
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("metrics text")
    }

    /// Waits until a line of `/metrics` starting with `name` contains `text`; returns
    /// the metrics text.
    pub async fn wait_metric(&self, name: &str, text: &str) -> String {
        let end = std::time::Instant::now() + DEADLINE;
        loop {
            let metrics = self.metrics().await;
            if metrics
                .lines()
                .any(|l| l.starts_with(name) && l.contains(text))
            {
                return metrics;
            }
            assert!(
                std::time::Instant::now() < end,
                "no {name} line with {text:?} in:\n{metrics}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the text of `/metrics` satisfies `holds` (a gauge or counter is set
    /// just after the stored write a test waits for); returns it.
    pub async fn metrics_until(&self, what: &str, holds: impl Fn(&str) -> bool) -> String {
        let end = std::time::Instant::now() + DEADLINE;
        loop {
            let metrics = self.metrics().await;
            if holds(&metrics) {
                return metrics;
            }
            assert!(
                std::time::Instant::now() < end,
                "/metrics never showed {what}:\n{metrics}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Comments on issue or PR `n` whose body contains `text`.
    pub fn comments_containing(&self, repo: &str, n: u64, text: &str) -> usize {
        self.fake
            .comments_on(repo, n)
            .iter()
            .filter(|c| c.body.contains(text))
            .count()
    }

    /// Asserts that the bot posted no comment body twice on `n` and that the sticky
    /// status comment exists at most once.
    pub fn assert_no_duplicate_comments(&self, repo: &str, n: u64) {
        let mut comments = self.fake.comments_on(repo, n);
        comments.retain(|c| c.user == self.fake.bot_login());
        let mut seen = std::collections::HashSet::new();
        for c in &comments {
            assert!(
                seen.insert(c.body.clone()),
                "duplicate comment on #{n}: {}",
                c.body
            );
        }
        let sticky = comments
            .iter()
            .filter(|c| c.body.contains("<!-- SHEPHERD-STATE: "))
            .count();
        assert!(sticky <= 1, "{sticky} status comments on #{n}");
    }

    /// Asserts that every work item id was dispatched once.
    pub async fn assert_no_duplicate_dispatch(&self) {
        let items = self.work_items().await;
        let mut ids = std::collections::HashSet::new();
        for item in &items {
            let id = item["id"].as_str().expect("work id").to_owned();
            assert!(ids.insert(id.clone()), "work item {id} dispatched twice");
        }
    }
}

/// Whether `group` on `stream` has nothing pending and nothing unread.
async fn group_drained(
    conn: &mut crate::support::redis::TestConn,
    stream: &str,
    group: &str,
) -> bool {
    let info: redis::Value = match redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(conn)
        .await
    {
        Ok(v) => v,
        // No stream yet: nothing to process.
        Err(_) => return true,
    };
    let redis::Value::Array(groups) = info else {
        return true;
    };
    for g in groups {
        let map = flat_map(g);
        if map.get("name").map(String::as_str) != Some(group) {
            continue;
        }
        let pending = map.get("pending").map(String::as_str) == Some("0");
        let lag = map.get("lag").map(String::as_str) == Some("0");
        return pending && lag;
    }
    // The group does not exist yet: its consumer has not started reading.
    false
}

/// A RESP map or flat key/value array as text pairs.
fn flat_map(v: redis::Value) -> HashMap<String, String> {
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Int(i) => i.to_string(),
        redis::Value::Nil => "nil".into(),
        other => format!("{other:?}"),
    };
    match v {
        redis::Value::Array(items) => items
            .chunks(2)
            .filter_map(|c| match c {
                [k, v] => Some((text(k), text(v))),
                _ => None,
            })
            .collect(),
        redis::Value::Map(pairs) => pairs.iter().map(|(k, v)| (text(k), text(v))).collect(),
        _ => HashMap::new(),
    }
}
