//! The error type of the store, for callers that branch on what went wrong. One type
//! for every store operation, the ingest's enqueue included (it only reports it: 503).

use std::time::Duration;

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis did not answer within the configured timeout (the ingest bounds each call
    /// so it answers well inside Forgejo's delivery timeout). Transient.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// Redis refused the command, timed out, or the connection broke. Transient: the
    /// entry stays pending and is retried (and eventually dead-lettered).
    #[error("redis: {}", describe(.0))]
    Redis(#[from] redis::RedisError),
    /// Fewer replicas than `SHEPHERD_REDIS_WAIT_REPLICAS` confirmed a write in time
    /// (`WAIT`). Transient: the write is on the primary and may still replicate.
    #[error("only {acked} of {wanted} Redis replicas confirmed the write within {within:?}")]
    NotReplicated {
        /// Replicas required.
        wanted: u32,
        /// Replicas that confirmed.
        acked: u32,
        /// How long `WAIT` waited.
        within: Duration,
    },
    /// A stored record does not decode (it was written by an incompatible version or
    /// by hand).
    #[error("corrupt record {key}: {reason}")]
    Corrupt {
        /// Record key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A Lua script answered something this version does not understand.
    #[error("unexpected reply from the {script} script: {reply}")]
    Protocol {
        /// Script name.
        script: &'static str,
        /// The reply, rendered for the log.
        reply: String,
    },
}

/// A Redis error as operators read it: a refused TLS certificate (the redis crate
/// reports rustls' reason as an I/O error) says which setting to check.
fn describe(e: &redis::RedisError) -> String {
    let text = e.to_string();
    if text.contains("certificate") || text.contains("Certificate") {
        format!(
            "{text} (the TLS handshake with Redis failed: the server's certificate must \
             chain to SHEPHERD_REDIS_CA_FILE, or to the system roots when it is unset, and \
             name the host of SHEPHERD_REDIS_URL)"
        )
    } else {
        text
    }
}

impl StoreError {
    /// True for connection-level failures worth retrying later (as opposed to data
    /// that will never decode).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Timeout(_) | StoreError::NotReplicated { .. } => true,
            StoreError::Redis(e) => e.is_io_error() || e.is_timeout() || e.is_connection_dropped(),
            StoreError::Corrupt { .. } | StoreError::Protocol { .. } => false,
        }
    }

    /// True when Redis says the consumer group (or its stream) does not exist.
    pub fn is_missing_group(&self) -> bool {
        match self {
            StoreError::Redis(e) => e.code() == Some("NOGROUP"),
            StoreError::Timeout(_)
            | StoreError::NotReplicated { .. }
            | StoreError::Corrupt { .. }
            | StoreError::Protocol { .. } => false,
        }
    }
}
