//! The real `shepherd` binary as a child process: a unique key prefix per instance, a
//! free port, waits for `/healthz` (polling with a deadline), killed when dropped.
//! Start `serve` with [`Shepherd::serve`], or anything else through [`Builder`].

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::redis::{Backend, RedisServer, free_port};
use super::{TEST_SECRET, poll_until_named};

/// How long the binary may take to answer `/healthz`.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// Distinguishes instances started by one test process.
static INSTANCE: AtomicU32 = AtomicU32::new(0);

/// A running `shepherd` process.
pub struct Shepherd {
    /// The process.
    child: Child,
    /// `http://127.0.0.1:<port>`.
    base: String,
    /// Its `SHEPHERD_KEY_PREFIX`.
    prefix: String,
    /// Its `SHEPHERD_SHARDS` (1 unless the test set it).
    shards: u16,
    /// The policy file given with [`Builder::policy`] (deleted on drop).
    _policy: Option<tempfile::NamedTempFile>,
}

/// Options for starting `shepherd`.
pub struct Builder {
    /// Subcommand and its arguments (default `serve`).
    args: Vec<String>,
    /// Environment variables on top of the defaults.
    env: Vec<(String, String)>,
    /// Redis URL.
    redis_url: String,
    /// Key prefix shared with other instances (default: a fresh one).
    prefix: Option<String>,
    /// File receiving the process's stderr (default: inherited).
    stderr: Option<std::fs::File>,
    /// Policy file contents (`SHEPHERD_CONFIG`), when the test sets one.
    policy: Option<String>,
}

impl Builder {
    /// Replaces the subcommand and its arguments (e.g. `["run"]`).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// Sets an environment variable (overrides the defaults).
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    /// Uses `prefix` (e.g. another instance's, so a `work` process consumes what a
    /// `serve` process queues).
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = Some(prefix.to_owned());
        self
    }

    /// Runs the process with this policy file (TOML, written to a temporary file that
    /// lives as long as the process), e.g. [`super::QUIET_POLICY`].
    pub fn policy(mut self, toml: &str) -> Self {
        self.policy = Some(toml.to_owned());
        self
    }

    /// Makes it `shepherd agents` running `command` (`SHEPHERD_AGENT_COMMAND`) for
    /// each work item.
    pub fn agents(self, command: &str) -> Self {
        self.args(["agents"]).env("SHEPHERD_AGENT_COMMAND", command)
    }

    /// Sends the process's stderr (its logs) to `file` instead of the test's.
    pub fn stderr_to(mut self, file: std::fs::File) -> Self {
        self.stderr = Some(file);
        self
    }

    /// Starts the process and waits until `/healthz` answers 200.
    pub async fn start(self) -> Shepherd {
        let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let prefix = self
            .prefix
            .clone()
            .unwrap_or_else(|| format!("it{}-{n}", std::process::id()));
        let port = free_port();
        // `BENCH_SHEPHERD_BIN` runs another build (a benchmark's "before" binary).
        let bin = std::env::var("BENCH_SHEPHERD_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_shepherd").to_owned());
        let mut cmd = Command::new(bin);
        // Settings from the developer's shell must not leak into a test.
        for (key, _) in std::env::vars() {
            if key.starts_with("SHEPHERD_") {
                cmd.env_remove(key);
            }
        }
        cmd.args(&self.args)
            .env("SHEPHERD_LISTEN", format!("127.0.0.1:{port}"))
            .env("SHEPHERD_REDIS_URL", &self.redis_url)
            .env("SHEPHERD_KEY_PREFIX", &prefix)
            .env("SHEPHERD_WEBHOOK_SECRETS", TEST_SECRET)
            .env("SHEPHERD_REDIS_TIMEOUT_MS", "500")
            .env("SHEPHERD_LOG", "warn,shepherd=info");
        let policy = self.policy.as_deref().map(|toml| {
            let mut file = tempfile::NamedTempFile::new().expect("policy file");
            std::io::Write::write_all(&mut file, toml.as_bytes()).expect("write policy");
            cmd.env("SHEPHERD_CONFIG", file.path());
            file
        });
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdout(Stdio::inherit())
            .stderr(self.stderr.map_or_else(Stdio::inherit, Stdio::from))
            .spawn()
            .expect("spawn the shepherd binary");
        let shards = self
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "SHEPHERD_SHARDS")
            .map_or(1, |(_, v)| v.parse().expect("SHEPHERD_SHARDS is a number"));
        let mut shepherd = Shepherd {
            child,
            base: format!("http://127.0.0.1:{port}"),
            prefix,
            shards,
            _policy: policy,
        };
        shepherd.wait_healthy().await;
        shepherd
    }
}

impl Shepherd {
    /// Options for a `shepherd` talking to `redis`.
    pub fn builder(redis: &(impl Backend + ?Sized)) -> Builder {
        Builder {
            args: vec!["serve".into()],
            env: redis.env(),
            redis_url: redis.url(),
            prefix: None,
            stderr: None,
            policy: None,
        }
    }

    /// Options for a `shepherd` told to use `url` (where nothing may be running yet:
    /// `shepherd run` starts its own redis-server there).
    pub fn builder_url(url: &str) -> Builder {
        Builder {
            args: vec!["serve".into()],
            env: Vec::new(),
            redis_url: url.to_owned(),
            prefix: None,
            stderr: None,
            policy: None,
        }
    }

    /// `shepherd serve` with the default test secret.
    pub async fn serve(redis: &RedisServer) -> Self {
        Self::builder(redis).start().await
    }

    /// Full URL of `path` on this instance.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The webhook endpoint.
    pub fn webhook_url(&self) -> String {
        self.url("/webhooks/forgejo")
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Its Redis key layout (one shard unless `SHEPHERD_SHARDS` was set otherwise).
    pub fn keys(&self) -> shepherd::store::Keys {
        shepherd::store::Keys::new(self.prefix.clone(), self.shards)
    }

    async fn wait_healthy(&mut self) {
        let client = reqwest::Client::new();
        let url = self.url("/healthz");
        let child = &mut self.child;
        poll_until_named(START_DEADLINE, "shepherd answers /healthz", || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("shepherd exited during start with {status}");
            }
            let request = client.get(&url).send();
            async move { request.await.is_ok_and(|r| r.status().is_success()) }
        })
        .await;
    }
}

impl Shepherd {
    /// Kills the process with SIGKILL (a crash: nothing is finished or cleaned up).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process is still running (it has not exited).
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Sends SIGTERM (a graceful stop request).
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill(1)");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits up to `deadline` for the process to exit; panics when it does not.
    pub async fn wait_exit(&mut self, deadline: Duration) -> std::process::ExitStatus {
        let end = std::time::Instant::now() + deadline;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                std::time::Instant::now() < end,
                "shepherd did not exit within {deadline:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Shepherd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
