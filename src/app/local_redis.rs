//! `shepherd run` on a single machine: when nothing answers at `SHEPHERD_REDIS_URL`, the
//! URL points at this machine, and `redis-server` is on the PATH, start one and keep it
//! running (restarting it if it dies) until shutdown, then stop it cleanly.
//!
//! The server keeps its data under `SHEPHERD_DATA_DIR` with AOF on and `appendfsync
//! always` (acknowledged means on disk), listens on the URL's port on loopback only, and
//! requires the URL's password when the URL has one — given to it on its standard
//! input as configuration (`redis-server -`), never on its command line, where every
//! local user could read it in `/proc/<pid>/cmdline`. Only for a plain `redis://` URL:
//! for `rediss://`, Sentinel and Cluster URLs nothing is started.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use redis::ConnectionAddr;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

/// How long a started server has to answer `PING`.
const START_DEADLINE: Duration = Duration::from_secs(10);
/// How long a probe or a shutdown request may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a stopping server has before it is killed.
const STOP_DEADLINE: Duration = Duration::from_secs(5);
/// Restarts after an unexpected exit before giving up.
const MAX_RESTARTS: u32 = 5;

/// A supervised redis-server; stop it with [`Supervised::stop`].
pub struct Supervised {
    /// The supervision task (restarts, then stops the server on shutdown).
    task: tokio::task::JoinHandle<()>,
    /// Cancels the supervision task.
    stop: CancellationToken,
}

impl Supervised {
    /// Stops the server (`SHUTDOWN`, then a kill after a deadline) and waits for it.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Whether Redis answers `PING` at `url` within a short timeout.
pub async fn answers(url: &str) -> bool {
    crate::store::client::answers_ping(url, PROBE_TIMEOUT).await
}

/// Starts and supervises a redis-server for `url` unless one already answers there.
/// Returns `None` when Redis already answers (or the URL is not local, or no
/// redis-server is installed: then the caller's own connection attempt reports it).
pub async fn ensure(url: &str, data_dir: &Path) -> anyhow::Result<Option<Supervised>> {
    // TLS, Sentinel and Cluster deployments are the operator's: never start a server
    // for them (the connection attempt that follows reports what is wrong).
    if !crate::config::RedisTarget::parse(url).is_ok_and(|t| t.is_plain_single()) {
        return Ok(None);
    }
    if answers(url).await {
        return Ok(None);
    }
    let client =
        redis::Client::open(url).context("SHEPHERD_REDIS_URL is not a usable Redis URL")?;
    let info = client.get_connection_info();
    let ConnectionAddr::Tcp(host, port) = info.addr() else {
        return Ok(None);
    };
    if !matches!(host.as_str(), "127.0.0.1" | "localhost" | "::1" | "[::1]") {
        tracing::warn!(%host, "nothing answers at SHEPHERD_REDIS_URL and it is not local; not starting redis-server");
        return Ok(None);
    }
    let Some(binary) = find_on_path("redis-server") else {
        tracing::warn!("nothing answers at SHEPHERD_REDIS_URL and redis-server is not on the PATH");
        return Ok(None);
    };
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating SHEPHERD_DATA_DIR {}", data_dir.display()))?;
    let data_dir = std::fs::canonicalize(data_dir)?;
    let spec = Spec {
        binary,
        port: *port,
        data_dir,
        password: info.redis_settings().password().map(str::to_owned),
        url: url.to_owned(),
    };
    let child = spec.start().await?;
    tracing::info!(
        port = spec.port,
        data_dir = %spec.data_dir.display(),
        "no Redis answered at SHEPHERD_REDIS_URL: started redis-server (AOF on, appendfsync always)"
    );
    let stop = CancellationToken::new();
    let task = tokio::spawn(supervise(spec, child, stop.clone()));
    Ok(Some(Supervised { task, stop }))
}

/// How to start the server.
struct Spec {
    /// Path of redis-server.
    binary: PathBuf,
    /// Port from the URL.
    port: u16,
    /// Data directory (AOF and dump files).
    data_dir: PathBuf,
    /// Password from the URL, required by the server when set.
    password: Option<String>,
    /// The URL, to probe and to send `SHUTDOWN`.
    url: String,
}

impl Spec {
    /// Starts the server and waits until it answers.
    async fn start(&self) -> anyhow::Result<Child> {
        let mut cmd = Command::new(&self.binary);
        // `-` first: the server reads configuration from its standard input (the
        // password), then the options below.
        // No inherited environment either: it holds the tokens and the Redis URL.
        cmd.env_clear()
            .arg("-")
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1 ::1")
            .arg("--dir")
            .arg(&self.data_dir)
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--daemonize", "no", "--protected-mode", "yes"])
            .arg("--logfile")
            .arg(self.data_dir.join("redis.log"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        {
            use tokio::io::AsyncWriteExt as _;
            let mut stdin = child
                .stdin
                .take()
                .context("redis-server's standard input")?;
            let config = stdin_config(self.password.as_deref());
            // A server that exits at once closes its end: the wait below reports it.
            let _ = stdin.write_all(config.as_bytes()).await;
            // Dropped: end of the configuration.
        }
        let deadline = tokio::time::Instant::now() + START_DEADLINE;
        loop {
            if answers(&self.url).await {
                return Ok(child);
            }
            if let Some(status) = child.try_wait()? {
                anyhow::bail!(
                    "redis-server exited at start ({status}); see {}",
                    self.data_dir.join("redis.log").display()
                );
            }
            if tokio::time::Instant::now() > deadline {
                let _ = child.kill().await;
                anyhow::bail!("redis-server did not answer within {START_DEADLINE:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Asks the server to shut down (it fsyncs the AOF), then kills it after a deadline.
    async fn stop(&self, mut child: Child) {
        crate::store::client::ask_shutdown(&self.url, PROBE_TIMEOUT).await;
        if tokio::time::timeout(STOP_DEADLINE, child.wait())
            .await
            .is_err()
        {
            tracing::warn!("redis-server did not stop in time; killing it");
            let _ = child.kill().await;
        }
        tracing::info!("stopped the redis-server started by shepherd run");
    }
}

/// The configuration written to the server's standard input: `requirepass` with the
/// password quoted byte by byte (`\xHH`), so no character of it can end the line or
/// the string, or nothing.
fn stdin_config(password: Option<&str>) -> String {
    use std::fmt::Write as _;
    let Some(p) = password else {
        return String::new();
    };
    let mut line = String::from("requirepass \"");
    for b in p.bytes() {
        let _ = write!(line, "\\x{b:02x}");
    }
    line.push_str("\"\n");
    line
}

/// Restarts the server when it exits unexpectedly; stops it when `stop` fires.
async fn supervise(spec: Spec, mut child: Child, stop: CancellationToken) {
    let mut restarts = 0;
    loop {
        tokio::select! {
            () = stop.cancelled() => {
                spec.stop(child).await;
                return;
            }
            status = child.wait() => {
                tracing::error!(status = ?status.ok(), "redis-server exited unexpectedly");
                if restarts >= MAX_RESTARTS {
                    tracing::error!("redis-server keeps exiting; giving up on it");
                    return;
                }
                restarts += 1;
                tokio::time::sleep(Duration::from_millis(200 * u64::from(restarts))).await;
                match spec.start().await {
                    Ok(c) => {
                        tracing::info!(restarts, "restarted redis-server");
                        child = c;
                    }
                    Err(e) => {
                        tracing::error!(error = format!("{e:#}"), "restarting redis-server failed");
                        return;
                    }
                }
            }
        }
    }
}

/// The first executable file called `name` in a `PATH` directory.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_password_reaches_the_config_quoted_byte_by_byte() {
        assert_eq!(super::stdin_config(None), "");
        let line = super::stdin_config(Some("p a\"ss\n"));
        assert_eq!(
            line,
            "requirepass \"\\x70\\x20\\x61\\x22\\x73\\x73\\x0a\"\n"
        );
        assert!(!line.contains("a\"ss"));
    }
}
