//! A real `redis-server` per test: a free port on 127.0.0.1, its own temporary data
//! directory, AOF on or off, killed when dropped. It can be stopped and started again
//! on the same port and data directory (the 503 test). When `redis-server` is not on
//! the PATH the test fails at once, naming it: never a silent skip.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
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
    /// TLS only (`--port 0 --tls-port`), with these files, when set.
    tls: Option<Arc<TestCa>>,
    /// More `redis-server` arguments (cluster mode, `--replicaof`).
    extra: Vec<String>,
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
        Self::start_custom(aof, None, Vec::new())
    }

    /// Starts a redis-server that speaks TLS only, with `ca`'s server certificate.
    pub fn start_tls(ca: &Arc<TestCa>) -> Self {
        Self::start_custom(Aof::Off, Some(ca.clone()), Vec::new())
    }

    /// Starts a redis-server with `extra` arguments (and optionally TLS), on a free port.
    pub fn start_custom(aof: Aof, tls: Option<Arc<TestCa>>, extra: Vec<String>) -> Self {
        let mut server = Self {
            port: free_port(),
            dir: tempfile::tempdir().expect("a temporary directory for redis-server"),
            aof,
            tls,
            extra,
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

    /// `redis://127.0.0.1:<port>` (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The TCP port (the TLS port of a TLS server).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Environment a `shepherd` needs for this server besides its URL (the CA file of a
    /// TLS server).
    pub fn env(&self) -> Vec<(String, String)> {
        self.tls
            .iter()
            .map(|ca| ("SHEPHERD_REDIS_CA_FILE".to_owned(), ca.ca_path()))
            .collect()
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
    pub async fn conn(&self) -> TestConn {
        // The tests' own reads (a whole stream after a drill, say) must not fail on
        // redis-rs's default 500 ms response timeout when CI loads both cores; the
        // code under test keeps its own, configured timeouts.
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(30)));
        let client = match &self.tls {
            None => redis::Client::open(self.url()),
            Some(ca) => redis::Client::build_with_tls(
                self.url(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(std::fs::read(ca.ca_path()).expect("read the test CA")),
                },
            ),
        }
        .expect("valid url");
        TestConn::Single(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .expect("connect to the test redis-server"),
        )
    }

    /// Runs `redis-cli` against this server with `args`; its stdout, or the error.
    pub fn cli(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(ca) = &self.tls {
            cmd.args(["--tls", "--cacert", &ca.ca_path()]);
        }
        let out = cmd
            .args(args)
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("cannot run redis-cli: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || text.starts_with("ERR") || text.starts_with("(error)") {
            return Err(format!(
                "redis-cli {args:?}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(text)
    }

    /// Spawns redis-server and waits until it answers PING.
    fn spawn(&mut self) -> Result<(), String> {
        let (appendonly, fsync) = match self.aof {
            Aof::Off => ("no", "everysec"),
            Aof::Always => ("yes", "always"),
        };
        let mut command = Command::new("redis-server");
        match &self.tls {
            None => command.args(["--port", &self.port.to_string()]),
            Some(ca) => command
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .args(["--tls-cert-file", &ca.cert_path()])
                .args(["--tls-key-file", &ca.key_path()])
                .args(["--tls-ca-cert-file", &ca.ca_path()])
                .args(["--tls-auth-clients", "no"])
                .args(["--tls-replication", "yes"]),
        };
        let mut child = command
            .args(["--bind", "127.0.0.1"])
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
            .args(&self.extra)
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
            if self.answers_ping() {
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

impl RedisServer {
    /// Whether the server answers `PING` (loading an AOF answers an error: not yet).
    fn answers_ping(&self) -> bool {
        match &self.tls {
            None => ping(self.port),
            Some(_) => self.cli(&["PING"]).is_ok_and(|t| t.trim() == "PONG"),
        }
    }
}

/// Whether a Redis on `port` answers `PING` (loading an AOF answers an error: not yet).
pub fn ping(port: u16) -> bool {
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
pub async fn stream_entries(conn: &mut TestConn, key: &str) -> Vec<Entry> {
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
pub async fn xlen(conn: &mut TestConn, key: &str) -> usize {
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

/// Something a `shepherd` process can be pointed at: one server, a Sentinel set, a
/// cluster.
pub trait Backend {
    /// Its `SHEPHERD_REDIS_URL`.
    fn url(&self) -> String;
    /// Environment besides the URL (a TLS server's CA file).
    fn env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

impl Backend for RedisServer {
    fn url(&self) -> String {
        RedisServer::url(self)
    }
    fn env(&self) -> Vec<(String, String)> {
        RedisServer::env(self)
    }
}

impl Backend for SentinelSet {
    fn url(&self) -> String {
        SentinelSet::url(self)
    }
}

impl Backend for RedisCluster {
    fn url(&self) -> String {
        RedisCluster::url(self)
    }
}

/// A connection for the tests' own assertions: to one server, or to a cluster (routed
/// by key, like the code under test). Cheap to clone.
#[derive(Clone)]
pub enum TestConn {
    /// One server (plain or TLS).
    Single(redis::aio::MultiplexedConnection),
    /// A Redis Cluster.
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for TestConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            TestConn::Single(c) => c.req_packed_command(cmd),
            TestConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            TestConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            TestConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A certificate authority made for one test with `openssl`, and a server certificate
/// it signed for `127.0.0.1` and `localhost`. Files live as long as the value.
pub struct TestCa {
    /// Holds `ca.crt`, `server.crt` and `server.key`.
    dir: tempfile::TempDir,
}

impl TestCa {
    /// Generates a CA and a server certificate (RSA 2048, valid one day).
    pub fn generate() -> Arc<Self> {
        let dir = tempfile::tempdir().expect("a directory for the test CA");
        let path = |f: &str| dir.path().join(f).display().to_string();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("cannot run openssl ({e}): the TLS drills need it"));
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=Shepherd test CA",
            "-keyout",
            &path("ca.key"),
            "-out",
            &path("ca.crt"),
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            &path("server.key"),
            "-out",
            &path("server.csr"),
        ]);
        std::fs::write(
            path("ext.cnf"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .expect("write the extension file");
        openssl(&[
            "x509",
            "-req",
            "-in",
            &path("server.csr"),
            "-CA",
            &path("ca.crt"),
            "-CAkey",
            &path("ca.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &path("ext.cnf"),
            "-out",
            &path("server.crt"),
        ]);
        Arc::new(Self { dir })
    }

    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The CA certificate (PEM).
    pub fn ca_path(&self) -> String {
        self.file("ca.crt")
    }

    /// The server certificate (PEM).
    pub fn cert_path(&self) -> String {
        self.file("server.crt")
    }

    /// The server's private key (PEM).
    pub fn key_path(&self) -> String {
        self.file("server.key")
    }
}

/// The name the sentinels monitor.
pub const SENTINEL_SERVICE: &str = "mymaster";

/// A primary, two replicas and three sentinels (quorum 2, `down-after` 1 s), all
/// processes of their own on free ports.
pub struct SentinelSet {
    /// The servers; index 0 starts as the primary.
    pub servers: Vec<RedisServer>,
    /// The sentinels' ports.
    sentinel_ports: Vec<u16>,
    /// The sentinel processes.
    sentinels: Vec<Child>,
    /// Their configuration files (sentinels rewrite them).
    _dir: tempfile::TempDir,
}

impl SentinelSet {
    /// Starts the set with AOF `appendfsync always` on every server and waits until
    /// the replicas are in sync and the sentinels agree (`SENTINEL CKQUORUM`).
    pub fn start() -> Self {
        let primary = RedisServer::start_with(Aof::Always);
        let replica = || {
            RedisServer::start_custom(
                Aof::Always,
                None,
                vec![
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    primary.port.to_string(),
                ],
            )
        };
        let (replica1, replica2) = (replica(), replica());
        let dir = tempfile::tempdir().expect("sentinel directory");
        let mut sentinel_ports = Vec::new();
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let conf = dir.path().join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\nloglevel warning\n\
                     sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n\
                     sentinel failover-timeout {SENTINEL_SERVICE} 5000\n\
                     sentinel parallel-syncs {SENTINEL_SERVICE} 1\n",
                    primary.port
                ),
            )
            .expect("write sentinel.conf");
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start redis-server --sentinel");
            sentinel_ports.push(port);
            sentinels.push(child);
        }
        let set = Self {
            servers: vec![primary, replica1, replica2],
            sentinel_ports,
            sentinels,
            _dir: dir,
        };
        set.wait(
            Duration::from_secs(30),
            "the sentinels agree and the replicas are in sync",
            |s| {
                s.sentinel_ports.iter().all(|p| {
                    cli_port(*p, &["SENTINEL", "CKQUORUM", SENTINEL_SERVICE])
                        .is_ok_and(|t| t.starts_with("OK"))
                        && cli_port(*p, &["SENTINEL", "REPLICAS", SENTINEL_SERVICE]).is_ok_and(
                            |t| {
                                s.servers[1..]
                                    .iter()
                                    .all(|r| t.contains(&r.port.to_string()))
                            },
                        )
                }) && s.servers[1..].iter().all(|r| {
                    r.cli(&["INFO", "replication"])
                        .is_ok_and(|t| t.contains("master_link_status:up"))
                })
            },
        );
        set
    }

    fn wait(&self, deadline: Duration, what: &str, cond: impl Fn(&Self) -> bool) {
        wait_blocking(deadline, what, || cond(self));
    }

    /// `redis+sentinel://127.0.0.1:<s1>,…/mymaster`.
    pub fn url(&self) -> String {
        let hosts = loopback_hosts(self.sentinel_ports.iter().copied());
        format!("redis+sentinel://{hosts}/{SENTINEL_SERVICE}")
    }

    /// The port the first answering sentinel names as the primary.
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinel_ports.iter().find_map(|p| {
            let out = cli_port(
                *p,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_SERVICE],
            )
            .ok()?;
            out.lines().nth(1)?.trim().parse().ok()
        })
    }

    /// The server that is the primary now.
    pub fn primary(&self) -> &RedisServer {
        let port = self.primary_port().expect("a sentinel names the primary");
        self.servers
            .iter()
            .find(|s| s.port == port)
            .expect("the primary is one of the set's servers")
    }

    /// SIGKILLs the current primary; returns its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary_port().expect("a sentinel names the primary");
        let server = self
            .servers
            .iter_mut()
            .find(|s| s.port == port)
            .expect("the primary is one of the set's servers");
        server.stop();
        port
    }

    /// Waits until the sentinels name a primary other than `old` and it accepts writes.
    pub fn wait_failover(&self, old: u16, deadline: Duration) {
        self.wait(deadline, "the sentinels promote the replica", |s| {
            s.primary_port().is_some_and(|p| {
                p != old
                    && s.servers.iter().any(|srv| {
                        srv.port == p
                            && srv
                                .cli(&["INFO", "replication"])
                                .is_ok_and(|t| t.contains("role:master"))
                    })
            })
        });
    }

    /// A connection to the current primary, for assertions.
    pub async fn conn(&self) -> TestConn {
        self.primary().conn().await
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        for child in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Polls `cond` (blocking the thread) until it holds; panics after `deadline`, naming
/// `what`.
pub fn wait_blocking(deadline: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !cond() {
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `redis://`-style host list `127.0.0.1:<p1>,127.0.0.1:<p2>,…`.
fn loopback_hosts(ports: impl Iterator<Item = u16>) -> String {
    ports
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `redis-cli -p <port> args…` on 127.0.0.1 without TLS.
fn cli_port(port: u16, args: &[&str]) -> Result<String, String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map_err(|e| format!("cannot run redis-cli: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || text.starts_with("ERR") {
        return Err(text);
    }
    Ok(text)
}

/// A Redis Cluster of `n` primaries (no replicas), each a redis-server process with
/// `--cluster-enabled yes`, joined by `redis-cli --cluster create`.
pub struct RedisCluster {
    /// The nodes.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `n` nodes, creates the cluster (the 16,384 slots spread evenly) and waits
    /// until every node reports `cluster_state:ok`.
    pub fn start(n: usize) -> Self {
        Self::start_replicated(n, 0)
    }

    /// Starts `primaries × (1 + replicas)` nodes (AOF `appendfsync always`) and creates
    /// a cluster with `replicas` replicas per primary.
    pub fn start_replicated(primaries: usize, replicas: usize) -> Self {
        let aof = if replicas > 0 { Aof::Always } else { Aof::Off };
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas))
            .map(|_| {
                RedisServer::start_custom(
                    aof,
                    None,
                    vec![
                        "--cluster-enabled".into(),
                        "yes".into(),
                        "--cluster-config-file".into(),
                        "nodes.conf".into(),
                        "--cluster-node-timeout".into(),
                        "2000".into(),
                    ],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { nodes };
        cluster.wait_ok(Duration::from_secs(30));
        cluster
    }

    /// Waits until every running node says `cluster_state:ok` and agrees on the slots.
    pub fn wait_ok(&self, deadline: Duration) {
        wait_blocking(deadline, "the cluster is ok", || {
            self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                n.cli(&["CLUSTER", "INFO"]).is_ok_and(|t| {
                    t.contains("cluster_state:ok") && t.contains("cluster_slots_ok:16384")
                })
            })
        });
    }

    /// `redis+cluster://127.0.0.1:<p1>,…`.
    pub fn url(&self) -> String {
        format!(
            "redis+cluster://{}",
            loopback_hosts(self.nodes.iter().map(|s| s.port))
        )
    }

    /// A cluster connection for assertions.
    pub async fn conn(&self) -> TestConn {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect();
        let client = redis::cluster::ClusterClientBuilder::new(seeds)
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(30))
            .build()
            .expect("cluster client");
        TestConn::Cluster(
            client
                .get_async_connection()
                .await
                .expect("connect to the test cluster"),
        )
    }

    /// The node id of node `i` (`CLUSTER MYID`).
    pub fn node_id(&self, i: usize) -> String {
        self.nodes[i]
            .cli(&["CLUSTER", "MYID"])
            .expect("CLUSTER MYID")
            .trim()
            .to_owned()
    }

    /// The port of the node that owns `key`'s slot.
    pub fn owner_port(&self, key: &str) -> u16 {
        self.try_owner_port(key)
            .unwrap_or_else(|| panic!("no live node owns the slot of {key}"))
    }

    /// The port of the live node that owns `key`'s slot, if one does.
    pub fn try_owner_port(&self, key: &str) -> Option<u16> {
        let slot = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a running node")
            .cli(&["CLUSTER", "KEYSLOT", key])
            .expect("CLUSTER KEYSLOT")
            .trim()
            .parse::<u16>()
            .expect("a slot number");
        // `CLUSTER NODES` lines: id addr@cport flags master - ping pong epoch state slots…
        let nodes = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .find_map(|n| n.cli(&["CLUSTER", "NODES"]).ok())
            .expect("CLUSTER NODES");
        for line in nodes.lines() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() < 9 {
                continue;
            }
            let port: u16 = parts[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .expect("a node address");
            if parts[2].contains("fail") {
                continue;
            }
            for range in &parts[8..] {
                if range.starts_with('[') {
                    continue;
                }
                let (lo, hi) = match range.split_once('-') {
                    Some((lo, hi)) => (lo.parse().unwrap_or(u16::MAX), hi.parse().unwrap_or(0)),
                    None => {
                        let s = range.parse().unwrap_or(u16::MAX);
                        (s, s)
                    }
                };
                if (lo..=hi).contains(&slot) {
                    return Some(port);
                }
            }
        }
        None
    }

    /// SIGKILLs the node listening on `port`.
    pub fn kill_node(&mut self, port: u16) {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of the cluster")
            .stop();
    }

    /// Moves `slots` slots (with their keys) from node `from` to node `to` with
    /// `redis-cli --cluster reshard` (MIGRATE, ASK redirections while it runs).
    pub fn reshard(&self, from: usize, to: usize, slots: usize) {
        let out = Command::new("redis-cli")
            .args([
                "--cluster",
                "reshard",
                &format!("127.0.0.1:{}", self.nodes[0].port),
            ])
            .args(["--cluster-from", &self.node_id(from)])
            .args(["--cluster-to", &self.node_id(to)])
            .args(["--cluster-slots", &slots.to_string()])
            .args(["--cluster-yes", "--cluster-pipeline", "100"])
            .output()
            .expect("run redis-cli --cluster reshard");
        assert!(
            out.status.success(),
            "redis-cli --cluster reshard: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
