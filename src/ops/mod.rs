//! Operator tools: replay, inspect, rebuild, resync, dead letters, status, costs.
//!
//! Every tool is a function of [`Ops`] (Redis, key layout, policy, configuration)
//! taking a request and returning a serializable report, so the CLI (`crate::app::commands`,
//! which prints) and the admin API (`crate::ingest::admin`, which answers
//! JSON) run exactly the same code. Errors are [`OpsError`]s: the admin API maps them
//! to HTTP statuses in one place, the CLI prints them.
//!
//! ```text
//! archive   reading the events streams (the archive) and decoding entries
//! costs     what the agents cost, from the ledger: per repository and day, PRs, kinds, tiers
//! replay    re-inject archived deliveries (or dead letters); --dry-run
//! inspect   a PR's record, phase and why, CI, reviews, work, effects, timers, history
//! rebuild   fold a PR's archived events from an empty record; diff; --apply (CAS)
//! resync    read open PRs from Forgejo and queue them as observations
//! dlq       list, show, retry and drop dead letters
//! doctor    the configuration checked as on a first deploy (read only)
//! status    the figures behind the status page (queues, dead letters, PRs)
//! timefmt   RFC 3339 / relative times, ages
//! diff      a field-level JSON diff
//! ```

pub mod archive;
pub mod costs;
pub mod diff;
pub mod dlq;
pub mod doctor;
pub mod inspect;
pub mod inspect_issue;
pub mod rebuild;
pub mod replay;
pub mod resync;
pub mod status;
pub mod timefmt;

use std::sync::Arc;
use std::time::Duration;

use crate::store::Conn;
use anyhow::Context as _;

use crate::config::Config;
use crate::core::ids::RepoName;
use crate::core::policy::PolicyFile;
use crate::store::{Keys, StoreError};

/// Response timeout of the operator tools' Redis calls (archive scans are large).
pub const OPS_TIMEOUT: Duration = Duration::from_secs(30);

/// What an operator tool needs: configuration, Redis, key layout and policy. Cheap to
/// share (`Arc`); the connection is multiplexed.
pub struct Ops {
    /// Validated configuration.
    pub config: Arc<Config>,
    /// Redis key layout.
    pub keys: Keys,
    /// The policy file (per-repository policies via `for_repo`).
    pub policy: Arc<PolicyFile>,
    /// Shared, self-reconnecting Redis connection.
    conn: Conn,
}

impl Ops {
    /// Tools on `conn` (an existing connection, e.g. the HTTP server's).
    pub fn new(config: Arc<Config>, conn: Conn) -> anyhow::Result<Self> {
        let policy = Arc::new(crate::config::load_policy(&config)?);
        let keys = Keys::new(config.key_prefix.clone(), config.shards);
        Ok(Self {
            config,
            keys,
            policy,
            conn,
        })
    }

    /// Tools with a connection of their own to `SHEPHERD_REDIS_URL` (lazy and
    /// self-reconnecting). Archive scans move megabytes per call, so the tools never
    /// share the ingest's connection — a scan would hold up deliveries behind it — and
    /// get a longer response timeout ([`OPS_TIMEOUT`]).
    pub fn connect(config: Arc<Config>) -> anyhow::Result<Self> {
        let conn = crate::store::client::connect_lazy(
            &config.redis,
            crate::store::client::LazyOptions {
                connect_timeout: config.redis_timeout.max(Duration::from_secs(2)),
                response_timeout: OPS_TIMEOUT.max(config.redis_timeout),
                retries: 2,
                delays: None,
                pipeline_buffer: None,
            },
        )
        .context("SHEPHERD_REDIS_URL is not a usable Redis URL")?;
        Self::new(config, conn)
    }

    /// A clone of the shared connection.
    pub fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// Every shard number.
    pub fn shards(&self) -> std::ops::Range<u16> {
        0..self.keys.shards()
    }
}

/// Why an operator tool failed; each variant maps to one HTTP status in the admin API.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The request is malformed (bad target, bad time); the message says what.
    #[error("{0}")]
    BadRequest(String),
    /// Nothing matched (unknown delivery, PR without record, no such dead letter).
    #[error("{0}")]
    NotFound(String),
    /// A compare-and-set lost against a concurrent commit; try again.
    #[error("{0}")]
    Conflict(String),
    /// A dependency is not configured or not reachable (Forgejo for resync).
    #[error("{0}")]
    Unavailable(String),
    /// Redis failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Anything else (reported, never shown to HTTP clients in detail).
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl From<redis::RedisError> for OpsError {
    fn from(e: redis::RedisError) -> Self {
        OpsError::Store(StoreError::Redis(e))
    }
}

/// A PR (or issue) named on the command line: `owner/repo#N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrTarget {
    /// Repository.
    pub repo: RepoName,
    /// PR index.
    pub number: u64,
}

impl std::fmt::Display for PrTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.repo, self.number)
    }
}

/// Parses `owner/repo#N`.
pub fn parse_pr(text: &str) -> Result<PrTarget, OpsError> {
    let bad = || OpsError::BadRequest(format!("{text:?} is not owner/repo#N"));
    let (repo, n) = text.split_once('#').ok_or_else(bad)?;
    Ok(PrTarget {
        repo: parse_repo(repo)?,
        number: n.trim().parse().map_err(|_| bad())?,
    })
}

/// Parses `owner/repo`.
pub fn parse_repo(text: &str) -> Result<RepoName, OpsError> {
    text.parse()
        .map_err(|_| OpsError::BadRequest(format!("{text:?} is not owner/repo")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        let t = parse_pr("Org/Repo#12").unwrap();
        assert_eq!(t.repo.as_str(), "org/repo");
        assert_eq!(t.number, 12);
        assert_eq!(t.to_string(), "org/repo#12");
        assert!(matches!(parse_pr("org/repo"), Err(OpsError::BadRequest(_))));
        assert!(matches!(parse_pr("org#1"), Err(OpsError::BadRequest(_))));
        assert!(matches!(parse_pr("o/r#x"), Err(OpsError::BadRequest(_))));
    }
}
