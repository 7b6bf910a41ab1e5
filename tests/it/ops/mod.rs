//! Operator tools end to end: the real `shepherd run` (ingest + workers) on a real
//! redis-server with the fake Forgejo, and the real binary's `replay`, `inspect`,
//! `rebuild`, `resync` and `dlq` subcommands — plus the admin API over HTTP.

mod admin;
mod costs;
mod hostile_input;
mod rebuild;
mod replay;
mod resync;

use std::collections::HashMap;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use crate::support::fake_forgejo::{FakeForgejo, NewPr, TOKEN, Webhook};
use crate::support::poll_until_named;
use crate::support::redis::{RedisServer, stream_entries};
use crate::support::shepherd::Shepherd;
use crate::support::webhook::{new_delivery, post, signed};

/// Repository of the scenarios.
pub const REPO: &str = "acme/widgets";
/// Admin token of the scenarios.
pub const ADMIN: &str = "it-admin-token-0123456789";
/// Generous bound for what the workers should reach quickly.
pub const WAIT: Duration = Duration::from_secs(20);

/// Redis, the fake Forgejo and `shepherd run` against both.
pub struct Scenario {
    /// The Redis server.
    pub redis: RedisServer,
    /// The fake Forgejo.
    pub fake: FakeForgejo,
    /// `shepherd run`.
    pub app: Shepherd,
    /// Key prefix of the run.
    pub prefix: String,
    /// A connection for assertions.
    pub conn: crate::support::redis::TestConn,
    /// HTTP client.
    pub http: reqwest::Client,
    /// Extra environment of the run (kept for restarts and CLI calls).
    env: Vec<(String, String)>,
}

impl Scenario {
    /// Starts everything with the admin token set and `extra` settings.
    pub async fn start(extra: &[(&str, &str)]) -> Self {
        let redis = RedisServer::start();
        let fake = FakeForgejo::start().await;
        fake.create_repo(REPO);
        let mut env: Vec<(String, String)> = vec![
            ("SHEPHERD_ADMIN_TOKEN".into(), ADMIN.into()),
            ("SHEPHERD_FORGEJO_URL".into(), fake.url()),
            ("SHEPHERD_FORGEJO_TOKEN".into(), TOKEN.into()),
            ("SHEPHERD_BOT_LOGIN".into(), fake.bot_login().into()),
            ("SHEPHERD_RESYNC_INTERVAL_SECS".into(), "0".into()),
        ];
        for (k, v) in extra {
            // An empty value leaves the setting out entirely.
            env.retain(|(key, _)| key != k);
            if !v.is_empty() {
                env.push(((*k).into(), (*v).into()));
            }
        }
        let app = start_app(&redis, None, &env).await;
        let prefix = app.prefix().to_owned();
        let conn = redis.conn().await;
        Self {
            redis,
            fake,
            app,
            prefix,
            conn,
            http: reqwest::Client::new(),
            env,
        }
    }

    /// Stops `shepherd run` (SIGKILL: an outage).
    pub fn stop_app(&mut self) {
        self.app.kill();
    }

    /// Starts `shepherd run` again on the same Redis and prefix.
    pub async fn restart_app(&mut self) {
        self.app = start_app(&self.redis, Some(&self.prefix), &self.env).await;
    }

    /// Key layout.
    pub fn keys(&self) -> shepherd::store::Keys {
        shepherd::store::Keys::new(self.prefix.clone(), 1)
    }

    /// Opens PR `title` by `author` on the fake; returns its number.
    pub fn open_pr(&self, author: &str, title: &str) -> u64 {
        self.fake.open_pr(REPO, NewPr::new(author, title))
    }

    /// Signs and posts a webhook (expects 202); returns its delivery id.
    pub async fn send(&self, w: &Webhook) -> String {
        let delivery = new_delivery();
        let answer = post(
            &self.http,
            &self.app.webhook_url(),
            &signed(&w.body(), w.event_type, &delivery),
        )
        .await;
        assert_eq!(answer.status().as_u16(), 202, "webhook {}", w.event_type);
        delivery
    }

    /// History entries of PR `n`, oldest first.
    pub async fn history(&self, n: u64) -> Vec<HashMap<String, String>> {
        let mut c = self.conn.clone();
        stream_entries(&mut c, &self.keys().history(REPO, n))
            .await
            .into_iter()
            .map(|(_, f)| f)
            .collect()
    }

    /// Waits until PR `n`'s history has an entry `pred` accepts.
    pub async fn wait_history(
        &self,
        n: u64,
        what: &str,
        pred: impl Fn(&HashMap<String, String>) -> bool,
    ) {
        poll_until_named(WAIT, what, || {
            let h = self.history(n);
            let pred = &pred;
            async move { h.await.iter().any(pred) }
        })
        .await;
    }

    /// Waits until the delivery has been committed to PR `n`'s history.
    pub async fn wait_delivery(&self, n: u64, delivery: &str) {
        self.wait_history(n, &format!("delivery {delivery} committed"), |h| {
            h.get("delivery").map(String::as_str) == Some(delivery) && !h.contains_key("replay")
        })
        .await;
    }

    /// The stored record of PR `n`: (version, data).
    pub async fn record(&self, n: u64) -> (u64, Value) {
        let (v, data): (Option<u64>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys().pr_record(REPO, n))
            .arg("v")
            .arg("data")
            .query_async(&mut self.conn.clone())
            .await
            .expect("HMGET");
        let data = data.map_or(Value::Null, |d| serde_json::from_str(&d).expect("JSON"));
        (v.unwrap_or(0), data)
    }

    /// Entries of a stream.
    pub async fn entries(&self, key: &str) -> Vec<(String, HashMap<String, String>)> {
        stream_entries(&mut self.conn.clone(), key).await
    }

    /// Runs a `shepherd` subcommand against this scenario's Redis and prefix.
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_shepherd"));
        for (key, _) in std::env::vars() {
            if key.starts_with("SHEPHERD_") {
                cmd.env_remove(key);
            }
        }
        cmd.args(args)
            .env("SHEPHERD_REDIS_URL", self.redis.url())
            .env("SHEPHERD_KEY_PREFIX", &self.prefix)
            .env("SHEPHERD_CONFIG", quiet_policy_file().path())
            .env("SHEPHERD_LOG", "warn");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.output().expect("run the shepherd binary")
    }

    /// Runs a subcommand that must succeed and prints JSON on stdout; returns it.
    pub fn cli_json(&self, args: &[&str]) -> Value {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "shepherd {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "shepherd {args:?} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Effects-stream entries caused by any of the events-stream entries `causes`.
    pub async fn effects_caused_by(&self, causes: &[String]) -> Vec<HashMap<String, String>> {
        self.entries(&self.keys().effects(0))
            .await
            .into_iter()
            .filter(|(_, f)| f.get("cause").is_some_and(|c| causes.contains(c)))
            .map(|(_, f)| f)
            .collect()
    }

    /// Asserts that Forgejo saw no write twice (same method, path and body).
    pub fn assert_no_duplicate_writes(&self) {
        let writes = self.fake.writes();
        let mut seen = std::collections::HashSet::new();
        for w in &writes {
            let key = format!("{} {} {}", w.method, w.path, w.body);
            assert!(
                seen.insert(key.clone()),
                "duplicate write to Forgejo: {key}"
            );
        }
    }

    /// Effects-stream entries of PR `n`: (kind, effect id).
    pub async fn effects_of(&self, n: u64) -> Vec<(String, String)> {
        let record = self.keys().pr_record(REPO, n);
        self.entries(&self.keys().effects(0))
            .await
            .into_iter()
            .filter(|(_, f)| f.get("record") == Some(&record))
            .map(|(_, f)| (f["kind"].clone(), f["id"].clone()))
            .collect()
    }
}

/// [`crate::support::QUIET_POLICY`] in a file: the subcommands that fold records
/// (`replay`, `rebuild`) decide with the policy `shepherd run` runs with here (its
/// `agent_authors = "anyone"` dispatches work the default would hold for a
/// permission read).
fn quiet_policy_file() -> &'static tempfile::NamedTempFile {
    static FILE: std::sync::LazyLock<tempfile::NamedTempFile> = std::sync::LazyLock::new(|| {
        use std::io::Write as _;
        let mut f = tempfile::NamedTempFile::new().expect("policy file");
        f.write_all(crate::support::QUIET_POLICY.as_bytes())
            .expect("write the policy");
        f
    });
    &FILE
}

/// Starts `shepherd run` with `env` (on `prefix` when given).
async fn start_app(
    redis: &RedisServer,
    prefix: Option<&str>,
    env: &[(String, String)],
) -> Shepherd {
    // The tests count transitions and effects: no timer of the default policy may add one.
    let mut b = Shepherd::builder(redis)
        .args(["run"])
        .policy(crate::support::QUIET_POLICY);
    if let Some(p) = prefix {
        b = b.prefix(p);
    }
    for (k, v) in env {
        b = b.env(k, v.clone());
    }
    b.start().await
}
