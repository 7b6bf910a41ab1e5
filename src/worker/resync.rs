//! Resync (DESIGN §5): Forgejo never retries a failed delivery (forgejo-facts §1.5), so
//! Shepherd reconciles by reading the truth from the API and feeding it in as
//! observations through the normal path. `shepherd resync` (`crate::ops::resync`)
//! runs it on demand; every `SHEPHERD_RESYNC_INTERVAL_SECS` one worker runs it for
//! every known repository ([`run_periodic_resync`]).
//!
//! Per repository: every open PR (`state=open`, all pages) with its head's combined
//! status and its reviews becomes one internal `ResyncObserved` event; every PR that
//! Shepherd still holds open but the API no longer lists (closed or merged during an
//! outage) is read alone and becomes an `ObservedPr` event. The events go onto the
//! repository's events stream, so workers apply them with `core::step` like any
//! other event (older observations never overwrite newer facts). The time of the last
//! completed resync is kept at `Keys::last_resync`.
//!
//! One worker at a time: a worker resyncs only after taking `Keys::resync_lock()` with
//! `SET NX PX <interval>`. The lock is not released after the run — it expires — so
//! however many workers run, the fleet resyncs once per interval; if the holder dies,
//! the lock expires and another worker takes the next turn.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::store::Conn;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::instrument;

use crate::config::Config;
use crate::core::event::{Event, PrSnapshot};
use crate::core::ids::RepoName;
use crate::core::normalize;
use crate::core::payload;
use crate::forgejo::ForgejoClient;
use crate::forgejo::{CombinedStatus, PullRequest};
use crate::store::event_entry::{self, EventEntry};
use crate::store::{Keys, StoreError, commit, markers, repos};

/// What a resync works with: a Redis connection (its own, since the reads and
/// appends of a whole pass should not queue behind anything) and the key layout.
#[derive(Clone)]
pub struct Resync {
    /// Shared, self-reconnecting Redis connection.
    pub conn: Conn,
    /// Redis key layout.
    pub keys: Keys,
}

/// Wall-clock unix ms (observation times).
fn now_ms() -> i64 {
    i64::try_from(crate::store::streams::now_ms()).unwrap_or(i64::MAX)
}

/// What a resync queued.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ResyncReport {
    /// Per repository.
    pub repos: Vec<RepoResync>,
    /// When it finished (unix ms).
    pub finished_ms: i64,
}

/// One repository's resync.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RepoResync {
    /// Repository.
    pub repo: String,
    /// Open PRs read from the API.
    pub open_prs: Vec<u64>,
    /// PRs open in Shepherd's records but not in the API's list (re-read one by one).
    pub no_longer_open: Vec<u64>,
    /// Events queued.
    pub queued: usize,
    /// Failures (the rest of the repository was still resynced).
    pub errors: Vec<String>,
}

/// Runs the periodic resync until `shutdown`; returns at once when the interval is
/// off or Forgejo is not configured. Failures are logged, never fatal to the worker.
pub async fn run_periodic_resync(
    config: Arc<Config>,
    resync: Resync,
    owner: String,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Some(interval) = config.resync_interval else {
        return Ok(());
    };
    let client = match ForgejoClient::from_config(&config, None) {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(error = %e, "periodic resync off: no Forgejo API configured");
            return Ok(());
        }
    };
    // The first turn comes one interval after start: a restarted fleet does not
    // hammer the API, and `shepherd resync --all` is there for right after an outage.
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(interval) => {}
        }
        match take_turn(&resync, &owner, interval).await {
            Ok(false) => tracing::debug!("another worker holds the resync turn"),
            Ok(true) => run_once(&resync, &client).await,
            Err(e) => tracing::warn!(error = %e, "resync lock: redis failed"),
        }
    }
}

/// One resync of every known repository.
async fn run_once(r: &Resync, client: &ForgejoClient) {
    let repos = match known_repos(r).await {
        Ok(r) => r,
        Err(e) => return tracing::warn!(error = %e, "periodic resync: listing repositories failed"),
    };
    match resync_repos(r, client, &repos).await {
        Ok(report) => {
            let queued: usize = report.repos.iter().map(|r| r.queued).sum();
            let errors: usize = report.repos.iter().map(|r| r.errors.len()).sum();
            tracing::info!(repos = repos.len(), queued, errors, "periodic resync done");
        }
        Err(e) => tracing::warn!(error = %e, "periodic resync failed"),
    }
}

/// Takes this interval's resync turn (`SET NX PX`); true when it is ours.
async fn take_turn(r: &Resync, owner: &str, interval: Duration) -> Result<bool, StoreError> {
    markers::take_resync_turn(&mut r.conn.clone(), &r.keys, owner, interval).await
}

/// Every repository in `Keys::repos()`.
pub async fn known_repos(r: &Resync) -> Result<Vec<RepoName>, StoreError> {
    let names = repos::known(&mut r.conn.clone(), &r.keys).await?;
    let set: BTreeSet<RepoName> = names.iter().filter_map(|n| n.parse().ok()).collect();
    Ok(set.into_iter().collect())
}

/// Resyncs `repos` with `client` and records the time.
pub async fn resync_repos(
    r: &Resync,
    client: &ForgejoClient,
    repos: &[RepoName],
) -> Result<ResyncReport, StoreError> {
    let mut report = ResyncReport::default();
    for repo in repos {
        report.repos.push(resync_repo(r, client, repo).await?);
    }
    report.finished_ms = now_ms();
    markers::set_last_resync(&mut r.conn.clone(), &r.keys, report.finished_ms).await?;
    Ok(report)
}

/// One repository. Forgejo failures are reported in the result; Redis failures fail.
#[instrument(skip_all, fields(repo = %repo))]
async fn resync_repo(
    r: &Resync,
    client: &ForgejoClient,
    repo: &RepoName,
) -> Result<RepoResync, StoreError> {
    let mut out = RepoResync {
        repo: repo.to_string(),
        ..RepoResync::default()
    };
    let pulls = match client.list_open_pulls(repo.as_str()).await {
        Ok(p) => p,
        Err(e) => {
            out.errors.push(format!("listing open PRs: {e}"));
            return Ok(out);
        }
    };
    repos::remember(&mut r.conn.clone(), &r.keys, repo.as_str()).await?;
    for pr in &pulls {
        out.open_prs.push(pr.number);
        match observe_open(client, repo, pr).await {
            Ok(event) => {
                queue(r, repo, &event).await?;
                out.queued += 1;
            }
            Err(e) => out.errors.push(format!("#{}: {e}", pr.number)),
        }
    }
    for n in held_open(r, repo).await? {
        if out.open_prs.contains(&n) {
            continue;
        }
        out.no_longer_open.push(n);
        match client.get_pull(repo.as_str(), n).await {
            Ok(pr) => {
                queue(
                    r,
                    repo,
                    &Event::ObservedPr {
                        pr: snapshot(repo, &pr),
                    },
                )
                .await?;
                out.queued += 1;
            }
            Err(e) => out.errors.push(format!("#{n}: {e}")),
        }
    }
    tracing::info!(
        open = out.open_prs.len(),
        queued = out.queued,
        errors = out.errors.len(),
        "resynced"
    );
    Ok(out)
}

/// The observation of one open PR: snapshot, combined status of its head, reviews.
async fn observe_open(
    client: &ForgejoClient,
    repo: &RepoName,
    pr: &PullRequest,
) -> Result<Event, crate::forgejo::ForgejoError> {
    let contexts = if pr.head.sha.is_empty() {
        Vec::new()
    } else {
        contexts(client.combined_status(repo.as_str(), &pr.head.sha).await?)
    };
    let reviews = reviews(client.list_reviews(repo.as_str(), pr.number).await?);
    Ok(Event::ResyncObserved {
        pr: snapshot(repo, pr),
        contexts,
        reviews,
        at_ms: now_ms(),
    })
}

/// PR numbers whose records Shepherd holds open in `repo`.
async fn held_open(r: &Resync, repo: &RepoName) -> Result<Vec<u64>, StoreError> {
    let mut conn = r.conn.clone();
    let keys: Vec<String> = commit::index_members(&mut conn, &r.keys.repo_index(repo.as_str()))
        .await?
        .into_iter()
        .filter(|k| k.contains(":pr:"))
        .collect();
    let stored = commit::load_many(&mut conn, &keys).await?;
    Ok(stored
        .into_iter()
        .flatten()
        .filter_map(|s| crate::core::record::PrRecord::from_json(&s.data).ok())
        .filter(|r| r.is_open())
        .map(|r| r.number)
        .collect())
}

/// Appends an internal event to the repository's events stream.
async fn queue(r: &Resync, repo: &RepoName, event: &Event) -> Result<String, StoreError> {
    // An `Event` always serializes (plain data, string keys).
    let body = serde_json::to_string(event).unwrap_or_default();
    let (delivery, name) = (format!("resync:{}", uuid::Uuid::new_v4()), event.name());
    let received = u64::try_from(now_ms()).unwrap_or(0);
    let entry = EventEntry::internal(&delivery, &name, repo.as_str(), received, &body);
    let stream = r.keys.events(r.keys.shard_of(repo.as_str()));
    event_entry::append(&mut r.conn.clone(), &stream, &entry).await
}

/// A PR snapshot from the API.
fn snapshot(repo: &RepoName, pr: &PullRequest) -> PrSnapshot {
    normalize::pr_snapshot(repo, &payload::PullRequest::from(pr.clone()))
}

/// CI contexts from a combined status.
fn contexts(c: CombinedStatus) -> Vec<crate::core::event::CiContext> {
    normalize::ci_contexts(&payload::CombinedStatus::from(c))
}

/// Reviews from the API.
fn reviews(rs: Vec<payload::PullReview>) -> Vec<crate::core::event::ReviewFact> {
    rs.iter().filter_map(normalize::review).collect()
}
