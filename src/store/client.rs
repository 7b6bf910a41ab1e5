//! Connections to Redis. One shared, multiplexed [`ConnectionManager`] carries every
//! short command (loads, commits, acks) and pipelines them; each blocking reader
//! (`XREADGROUP … BLOCK`) gets a dedicated connection of its own, so a blocked read
//! never stalls the commands queued behind it on the shared one.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{Keys, StoreError};

/// The connection type every store function takes: multiplexed, self-reconnecting,
/// cheap to clone. Everything outside this file names it `store::Conn`, so how
/// Shepherd reaches Redis (one node today) is decided here alone.
pub type Conn = ConnectionManager;

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

/// A lazily connecting, self-reconnecting connection to `url` (nothing is sent until
/// the first command). Fails only when `url` is not a usable Redis URL.
pub fn connect_lazy(url: &str, options: LazyOptions) -> Result<Conn, StoreError> {
    let client = redis::Client::open(url)?;
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
    Ok(ConnectionManager::new_lazy_with_config(client, config)?)
}

/// Runs `pipe` on `conn`: one reply per command. An empty pipeline is answered here with
/// no replies and never sent: Redis refuses it ("empty command"), while a pipeline built
/// over zero keys is an ordinary case (a repository with no open PR record), not an
/// error. Every pipeline of the store goes through here.
pub async fn query_pipeline<T: redis::FromRedisValue>(
    conn: &mut ConnectionManager,
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
    /// Client the connections are made from.
    client: redis::Client,
    /// Shared multiplexed connection for non-blocking commands.
    conn: ConnectionManager,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("keys", &self.keys).finish()
    }
}

impl Store {
    /// Connects to `url` (fails when Redis does not answer).
    pub async fn connect(url: &str, keys: Keys) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_number_of_retries(3);
        let conn = ConnectionManager::new_with_config(client.clone(), config).await?;
        Ok(Self { keys, client, conn })
    }

    /// The key layout.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// A clone of the shared connection (multiplexed: clones share one socket).
    pub fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// A dedicated connection for blocking reads of up to `block`: its response
    /// timeout leaves room for the block time.
    pub async fn blocking_conn(&self, block: Duration) -> Result<ConnectionManager, StoreError> {
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(block + COMMAND_TIMEOUT))
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_number_of_retries(3);
        Ok(ConnectionManager::new_with_config(self.client.clone(), config).await?)
    }
}
