//! A real `redis-server` per test: a free port on 127.0.0.1, its own temporary data
//! directory, AOF on or off, killed when dropped. It can be stopped and started again
//! on the same port and data directory (the 503 test). When `redis-server` is not on
//! the PATH the test fails at once, naming it: never a silent skip.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a fresh redis-server may take to answer PING.
const START_DEADLINE: Duration = Duration::from_secs(15);

/// Persistence of a test Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aof {
    /// No persistence at all (fastest; most tests).
    Off,
    /// `appendonly yes` with `appendfsync always` (what production ships).
    Always,
}

/// A running (or stopped) redis-server owned by one test.
pub struct RedisServer {
    /// TCP port, kept across restarts.
    port: u16,
    /// Data directory (AOF, dump), removed on drop.
    dir: tempfile::TempDir,
    /// Persistence mode.
    aof: Aof,
    /// The process while it runs.
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a redis-server without persistence.
    pub fn start() -> Self {
        Self::start_with(Aof::Off)
    }

    /// Starts a redis-server with the given persistence, on a free port.
    pub fn start_with(aof: Aof) -> Self {
        let mut server = Self {
            port: free_port(),
            dir: tempfile::tempdir().expect("a temporary directory for redis-server"),
            aof,
            child: None,
        };
        let mut last_error = String::new();
        for _ in 0..5 {
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => {
                    // Most likely another process took the port between probe and bind.
                    last_error = e;
                    server.port = free_port();
                }
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL: a crash, not a clean shutdown) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server (SIGSTOP): connections are accepted by the kernel but nothing
    /// is answered, like a hung Redis.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Sends `signal` (a `kill(1)` option) to the running server.
    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("redis-server is running");
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("run kill(1)");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Starts the server again on the same port and data directory.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("redis-server did not restart: {e}"),
                // The old socket may linger for a moment; try again.
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// A multiplexed connection for assertions.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        // The tests' own reads (a whole stream after a drill, say) must not fail on
        // redis-rs's default 500 ms response timeout when CI loads both cores; the
        // code under test keeps its own, configured timeouts.
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(30)));
        redis::Client::open(self.url())
            .expect("valid url")
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("connect to the test redis-server")
    }

    /// Spawns redis-server and waits until it answers PING.
    fn spawn(&mut self) -> Result<(), String> {
        let (appendonly, fsync) = match self.aof {
            Aof::Off => ("no", "everysec"),
            Aof::Always => ("yes", "always"),
        };
        let mut child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir.path())
            .args([
                "--save",
                "",
                "--appendonly",
                appendonly,
                "--appendfsync",
                fsync,
            ])
            .args(["--daemonize", "no", "--loglevel", "warning"])
            // DEBUG SLEEP simulates a Redis that is slow to answer.
            .args(["--enable-debug-command", "local"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run `redis-server` ({e}): the integration tests need a real Redis; \
                     install it (Debian/Ubuntu: apt-get install redis-server)"
                )
            });
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "redis-server exited with {status} on port {}",
                    self.port
                ));
            }
            if ping(self.port) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "no PONG on port {} within {START_DEADLINE:?}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether a Redis on `port` answers `PING` (loading an AOF answers an error: not yet).
fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// One stream entry: its id and its fields (values as UTF-8 text).
pub type Entry = (String, std::collections::HashMap<String, String>);

/// Every entry of a stream, oldest first.
pub async fn stream_entries(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<Entry> {
    let raw: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .expect("XRANGE");
    raw.into_iter()
        .map(|(id, flat)| {
            let fields = flat
                .chunks(2)
                .map(|kv| {
                    (
                        String::from_utf8_lossy(&kv[0]).into_owned(),
                        String::from_utf8_lossy(&kv[1]).into_owned(),
                    )
                })
                .collect();
            (id, fields)
        })
        .collect()
}

/// Length of a stream (0 when it does not exist).
pub async fn xlen(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> usize {
    redis::cmd("XLEN")
        .arg(key)
        .query_async(conn)
        .await
        .expect("XLEN")
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}
