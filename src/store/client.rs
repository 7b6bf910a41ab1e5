//! Connections to Redis, for every topology `SHEPHERD_REDIS_URL` names
//! ([`RedisTarget`]): one server (plain or TLS), the primary a set of Sentinels names,
//! or a Redis Cluster. Everything else in the crate takes a [`Conn`] and never learns
//! which: how Shepherd reaches Redis is decided in this file alone.
//!
//! One shared, multiplexed [`Conn`] carries every short command (loads, commits, acks)
//! and pipelines them; each blocking reader (`XREADGROUP … BLOCK`) gets a dedicated
//! connection of its own, so a blocked read never stalls the commands queued behind it
//! on the shared one.
//!
//! - **One server**: the redis crate's [`ConnectionManager`] (reconnects by itself).
//! - **Sentinel**: [`SentinelConn`] asks the sentinels for the primary at the first
//!   command and again after any connection error, `READONLY` or `MASTERDOWN` reply,
//!   so a failover moves every process to the new primary without a restart. The
//!   command that met the error fails (the ingest answers 503, a worker retries): a
//!   command is never resent blindly, since it may have run.
//! - **Cluster**: the redis crate's async [`ClusterConnection`]: it routes each command,
//!   script call and pipeline by its keys' hash slot (every key of one call shares the
//!   shard's hash tag `{prefix:shard}`, see `store::keys`), follows `MOVED`/`ASK` and
//!   refreshes its slot map after a node failover.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, Cmd, ConnectionAddr, ErrorKind, RedisError,
    RedisFuture, RedisResult, TlsCertificates, TlsMode, Value,
};
use secrecy::ExposeSecret;

pub use crate::config::{RedisTarget, Topology};

use super::{Keys, StoreError};

/// The connection type every store function takes: multiplexed, self-reconnecting,
/// cheap to clone (clones share the sockets), for whichever topology the URL names.
#[derive(Clone)]
pub enum Conn {
    /// One server (`redis://`, `rediss://`, `unix://`).
    Single(ConnectionManager),
    /// The primary named by the sentinels (`redis+sentinel://`, `rediss+sentinel://`).
    Sentinel(SentinelConn),
    /// A Redis Cluster (`redis+cluster://`, `rediss+cluster://`).
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// `WAIT n timeout` for the writes this connection made to the node holding `key`
    /// (on a cluster, routed to the master of `key`'s slot: `WAIT` has no key of its
    /// own). Returns how many replicas confirmed.
    pub async fn wait_replicas(
        &mut self,
        key: &str,
        n: u32,
        timeout: Duration,
    ) -> Result<u32, StoreError> {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(n).arg(
            u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        let acked: i64 = match self {
            Conn::Cluster(c) => {
                use redis::cluster_routing::{
                    Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
                };
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                redis::from_redis_value(c.route_command(cmd, routing).await?)
                    .map_err(RedisError::from)?
            }
            other => cmd.query_async(other).await?,
        };
        Ok(u32::try_from(acked.max(0)).unwrap_or(u32::MAX))
    }
}

/// Anything that names a Redis: a parsed [`RedisTarget`] (what the processes pass, TLS
/// files included) or a bare URL (tests and tools; no TLS files).
pub trait ToTarget {
    /// The target, or why the URL is not usable.
    fn to_target(&self) -> Result<RedisTarget, StoreError>;
}

impl ToTarget for RedisTarget {
    fn to_target(&self) -> Result<RedisTarget, StoreError> {
        Ok(self.clone())
    }
}

impl ToTarget for str {
    fn to_target(&self) -> Result<RedisTarget, StoreError> {
        RedisTarget::parse(self).map_err(|reason| config_error("SHEPHERD_REDIS_URL", reason))
    }
}

impl ToTarget for String {
    fn to_target(&self) -> Result<RedisTarget, StoreError> {
        self.as_str().to_target()
    }
}

fn config_error(setting: &'static str, reason: String) -> StoreError {
    StoreError::Redis(RedisError::from((
        ErrorKind::InvalidClientConfig,
        setting,
        reason,
    )))
}

/// Timeouts and buffering of a lazily connecting [`Conn`] (see [`connect_lazy`]).
#[derive(Debug, Clone, Copy)]
pub struct LazyOptions {
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// How long one command may take.
    pub response_timeout: Duration,
    /// Reconnection attempts per command before it fails.
    pub retries: usize,
    /// Delays between reconnection attempts (`None`: the client's defaults).
    pub delays: Option<(Duration, Duration)>,
    /// Commands in flight on the socket (`None`: the client's default).
    pub pipeline_buffer: Option<usize>,
}

impl LazyOptions {
    /// The store's own settings for `response_timeout`.
    fn store(response_timeout: Duration) -> Self {
        LazyOptions {
            connect_timeout: CONNECT_TIMEOUT,
            response_timeout,
            retries: 3,
            delays: None,
            pipeline_buffer: None,
        }
    }
}

/// The TLS material of `target` in the redis crate's form (`None` without TLS or
/// without files: then the system roots verify the server).
fn certificates(target: &RedisTarget) -> Option<TlsCertificates> {
    if !target.tls {
        return None;
    }
    let files = &target.tls_files;
    if files.ca.is_none() && files.client.is_none() {
        return None;
    }
    Some(TlsCertificates {
        client_tls: files.client.as_ref().map(|(cert, key)| ClientTlsConfig {
            client_cert: cert.clone(),
            client_key: key.expose_secret().as_bytes().to_vec(),
        }),
        root_cert: files.ca.clone(),
    })
}

/// A client for a single-server target.
fn single_client(target: &RedisTarget) -> Result<redis::Client, StoreError> {
    Ok(match certificates(target) {
        Some(certs) => redis::Client::build_with_tls(target.url(), certs)?,
        None => redis::Client::open(target.url())?,
    })
}

/// `host:port` as a URL authority (IPv6 in brackets).
fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A cluster client for a cluster target, with `options`' timeouts.
fn cluster_client(
    target: &RedisTarget,
    nodes: &[(String, u16)],
    options: &LazyOptions,
) -> Result<redis::cluster::ClusterClient, StoreError> {
    let scheme = if target.tls { "rediss" } else { "redis" };
    let seeds: Vec<String> = nodes
        .iter()
        .map(|(h, p)| format!("{scheme}://{}", authority(h, *p)))
        .collect();
    let mut builder = redis::cluster::ClusterClientBuilder::new(seeds)
        .connection_timeout(options.connect_timeout)
        .response_timeout(options.response_timeout)
        .retries(options.retries.max(1) as u32);
    if let Some((min, max)) = options.delays {
        builder = builder
            .min_retry_wait(min.as_millis() as u64)
            .max_retry_wait(max.as_millis() as u64);
    }
    if let Some(user) = &target.username {
        builder = builder.username(user);
    }
    if let Some(password) = target.password() {
        builder = builder.password(password);
    }
    if target.tls {
        builder = builder.tls(TlsMode::Secure);
    }
    if let Some(certs) = certificates(target) {
        builder = builder.certs(certs);
    }
    Ok(builder.build()?)
}

/// A sentinel client for a sentinel target.
fn sentinel_client(
    target: &RedisTarget,
    sentinels: &[(String, u16)],
    service: &str,
) -> Result<SentinelClient, StoreError> {
    let addrs = sentinels.iter().map(|(h, p)| {
        if target.tls {
            ConnectionAddr::TcpTls {
                host: h.clone(),
                port: *p,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(h.clone(), *p)
        }
    });
    let mut builder = SentinelClientBuilder::new(addrs, service, SentinelServerType::Master)?
        .set_client_to_redis_db(target.db);
    if let Some(user) = &target.username {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = target.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    if target.tls {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        if let Some(certs) = certificates(target) {
            builder = builder
                .set_client_to_redis_certificates(certs.clone())
                .set_client_to_sentinel_certificates(certs);
        }
    }
    Ok(builder.build()?)
}

/// The connection manager settings of a single-server connection.
fn manager_config(options: &LazyOptions) -> ConnectionManagerConfig {
    let mut config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.response_timeout))
        .set_number_of_retries(options.retries);
    if let Some((min, max)) = options.delays {
        config = config.set_min_delay(min).set_max_delay(max);
    }
    if let Some(buffer) = options.pipeline_buffer {
        config = config.set_pipeline_buffer_size(buffer);
    }
    config
}

/// The cluster connection settings.
fn cluster_config(options: &LazyOptions) -> redis::cluster::ClusterConfig {
    redis::cluster::ClusterConfig::new()
        .set_connection_timeout(options.connect_timeout)
        .set_response_timeout(options.response_timeout)
}

/// A connection to `target` that connects at its first command.
fn open_lazy(target: &RedisTarget, options: LazyOptions) -> Result<Conn, StoreError> {
    Ok(match &target.topology {
        Topology::Single => Conn::Single(ConnectionManager::new_lazy_with_config(
            single_client(target)?,
            manager_config(&options),
        )?),
        Topology::Sentinel { sentinels, service } => Conn::Sentinel(SentinelConn::new(
            sentinel_client(target, sentinels, service)?,
            options,
            target.db,
        )),
        Topology::Cluster { nodes } => Conn::Cluster(
            cluster_client(target, nodes, &options)?
                .get_pending_async_connection_with_config(cluster_config(&options)),
        ),
    })
}

/// A connection to `target`, made now (fails when Redis does not answer).
async fn open_now(target: &RedisTarget, options: LazyOptions) -> Result<Conn, StoreError> {
    Ok(match &target.topology {
        Topology::Single => Conn::Single(
            ConnectionManager::new_with_config(single_client(target)?, manager_config(&options))
                .await?,
        ),
        Topology::Sentinel { sentinels, service } => {
            let conn = SentinelConn::new(
                sentinel_client(target, sentinels, service)?,
                options,
                target.db,
            );
            conn.current().await?;
            Conn::Sentinel(conn)
        }
        Topology::Cluster { nodes } => Conn::Cluster(
            cluster_client(target, nodes, &options)?
                .get_async_connection_with_config(cluster_config(&options))
                .await?,
        ),
    })
}

/// A lazily connecting, self-reconnecting connection to `target` (nothing is sent until
/// the first command). Fails only when `target` is not a usable Redis URL.
pub fn connect_lazy(
    target: &(impl ToTarget + ?Sized),
    options: LazyOptions,
) -> Result<Conn, StoreError> {
    open_lazy(&target.to_target()?, options)
}

/// Whether an error means the connection no longer reaches a writable primary (so a
/// Sentinel-managed connection must ask the sentinels again).
fn primary_lost(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

/// A connection to the primary the sentinels name, asked again after a connection
/// error, `READONLY` or `MASTERDOWN` (module docs). Clones share the connection.
#[derive(Clone)]
pub struct SentinelConn {
    /// State shared by the clones.
    shared: Arc<SentinelShared>,
    /// Database number (for `get_db`).
    db: i64,
}

/// What the clones of a [`SentinelConn`] share.
struct SentinelShared {
    /// Asks the sentinels (one resolution at a time).
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// The current primary's connection and its generation.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// Generation counter: an error only drops the connection it happened on.
    generation: AtomicU64,
    /// Timeouts of the connections to the primary.
    config: AsyncConnectionConfig,
    /// Bound on one resolution (sentinels plus primary).
    resolve_timeout: Duration,
}

impl SentinelConn {
    fn new(sentinel: SentinelClient, options: LazyOptions, db: i64) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout));
        SentinelConn {
            shared: Arc::new(SentinelShared {
                sentinel: tokio::sync::Mutex::new(sentinel),
                current: Mutex::new(None),
                generation: AtomicU64::new(0),
                config,
                resolve_timeout: options.connect_timeout * 2,
            }),
            db,
        }
    }

    /// The current primary's connection, resolving it through the sentinels if there
    /// is none.
    async fn current(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.shared.current.lock().expect("not poisoned").clone() {
            return Ok(c);
        }
        let mut sentinel = self.shared.sentinel.lock().await;
        // Another clone may have resolved it while this one waited.
        if let Some(c) = self.shared.current.lock().expect("not poisoned").clone() {
            return Ok(c);
        }
        let resolve = sentinel.get_async_connection_with_config(&self.shared.config);
        let conn = match tokio::time::timeout(self.shared.resolve_timeout, resolve).await {
            Ok(conn) => conn?,
            Err(_) => {
                return Err(RedisError::from((
                    ErrorKind::Io,
                    "no primary reachable through the sentinels in time",
                )));
            }
        };
        let generation = self.shared.generation.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(
            generation,
            "connected to the primary named by the sentinels"
        );
        let entry = (generation, conn);
        *self.shared.current.lock().expect("not poisoned") = Some(entry.clone());
        Ok(entry)
    }

    /// Forgets the connection of `generation` if it is still the current one.
    fn forget(&self, generation: u64, e: &RedisError) {
        let mut current = self.shared.current.lock().expect("not poisoned");
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            tracing::warn!(generation, error = %e, "lost the primary; asking the sentinels again");
            *current = None;
        }
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.current().await?;
            let reply = conn.req_packed_command(cmd).await;
            if let Err(e) = &reply
                && primary_lost(e)
            {
                self.forget(generation, e);
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.current().await?;
            let reply = conn.req_packed_commands(pipeline, offset, count).await;
            if let Err(e) = &reply
                && primary_lost(e)
            {
                self.forget(generation, e);
            }
            reply
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

/// Runs `pipe` on `conn`: one reply per command. An empty pipeline is answered here with
/// no replies and never sent: Redis refuses it ("empty command"), while a pipeline built
/// over zero keys is an ordinary case (a repository with no open PR record), not an
/// error. Every pipeline of the store goes through here, and every one names keys of
/// one hash slot only: a Redis Cluster refuses a pipeline across slots (`CROSSSLOT`,
/// checked by the cluster drills in tests/it/topologies.rs).
pub async fn query_pipeline<T: redis::FromRedisValue>(
    conn: &mut Conn,
    pipe: &redis::Pipeline,
) -> Result<Vec<T>, StoreError> {
    if pipe.is_empty() {
        return Ok(Vec::new());
    }
    Ok(pipe.query_async(conn).await?)
}

/// Whether a Redis answers `PING` at `url` within `timeout`, on a connection of its own
/// (`shepherd run` asks before it starts a local redis-server).
pub async fn answers_ping(url: &str, timeout: Duration) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let probe = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    };
    matches!(tokio::time::timeout(timeout, probe).await, Ok(Ok(_)))
}

/// Asks the Redis at `url` to shut down (`SHUTDOWN`: it writes its data and exits),
/// waiting at most `timeout`. The server closes the connection instead of answering,
/// so there is nothing to report: whether it stopped shows in its process.
pub async fn ask_shutdown(url: &str, timeout: Duration) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let ask = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("SHUTDOWN").query_async::<()>(&mut conn).await
    };
    let _ = tokio::time::timeout(timeout, ask).await;
}

/// How long a short command may take before it counts as failed.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A handle on Shepherd's Redis: the key layout plus the shared connection. Cheap to
/// clone (the connection is multiplexed).
#[derive(Clone)]
pub struct Store {
    /// Key layout (prefix and shard count).
    keys: Keys,
    /// Where Redis is (connections are made from it).
    target: RedisTarget,
    /// Shared multiplexed connection for non-blocking commands.
    conn: Conn,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("keys", &self.keys).finish()
    }
}

impl Store {
    /// Connects to `target` (fails when Redis does not answer).
    pub async fn connect(
        target: &(impl ToTarget + ?Sized),
        keys: Keys,
    ) -> Result<Self, StoreError> {
        let target = target.to_target()?;
        let conn = open_now(&target, LazyOptions::store(COMMAND_TIMEOUT)).await?;
        Ok(Self { keys, target, conn })
    }

    /// The key layout.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// A clone of the shared connection (multiplexed: clones share one socket).
    pub fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// A dedicated connection for blocking reads of up to `block`: its response
    /// timeout leaves room for the block time. On a cluster it is a cluster connection
    /// of its own, which sends each read to the node owning the read stream's slot.
    pub async fn blocking_conn(&self, block: Duration) -> Result<Conn, StoreError> {
        open_now(&self.target, LazyOptions::store(block + COMMAND_TIMEOUT)).await
    }
}
