//! `shepherd resync`: Forgejo never retries a failed delivery (forgejo-facts §1.5), so
//! Shepherd reconciles by reading the truth from the API and feeding it in as
//! observations through the normal path.
//!
//! Per repository: every open PR (`state=open`, all pages) with its head's combined
//! status and its reviews becomes one internal `ResyncObserved` event; every PR that
//! Shepherd still holds open but the API no longer lists (closed or merged during an
//! outage) is read alone and becomes an `ObservedPr` event. The events go onto the
//! repository's events stream, so workers apply them with `core::step` like any
//! other event (older observations never overwrite newer facts). The time of the last
//! completed resync is kept at `Keys::last_resync`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use tracing::instrument;

use super::timefmt::now_ms;
use super::{Ops, OpsError, parse_repo};
use crate::core::event::{Event, PrSnapshot};
use crate::core::ids::RepoName;
use crate::core::normalize;
use crate::core::payload;
use crate::forgejo::ForgejoClient;
use crate::forgejo::{CombinedStatus, PullRequest};
use crate::store::event_entry::{self, EventEntry};
use crate::store::{commit, markers, repos};

/// What to resync.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResyncRequest {
    /// One repository, `owner/name`.
    pub repo: Option<String>,
    /// Every repository Shepherd has seen.
    pub all: bool,
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

/// Resyncs the repositories `req` names.
#[instrument(skip_all, fields(repo = req.repo.as_deref().unwrap_or(""), all = req.all))]
pub async fn resync(ops: &Ops, req: &ResyncRequest) -> Result<ResyncReport, OpsError> {
    let client = ForgejoClient::from_config(&ops.config, None)
        .map_err(|e| OpsError::Unavailable(format!("resync needs the Forgejo API: {e:#}")))?;
    let repos = match (&req.repo, req.all) {
        (Some(r), false) => vec![parse_repo(r)?],
        (None, true) => known_repos(ops).await?,
        _ => {
            return Err(OpsError::BadRequest(
                "name one repository (repo) or all of them (all)".into(),
            ));
        }
    };
    resync_repos(ops, &client, &repos).await
}

/// Every repository in `Keys::repos()`.
pub async fn known_repos(ops: &Ops) -> Result<Vec<RepoName>, OpsError> {
    let names = repos::known(&mut ops.conn(), &ops.keys).await?;
    let set: BTreeSet<RepoName> = names.iter().filter_map(|n| n.parse().ok()).collect();
    Ok(set.into_iter().collect())
}

/// Resyncs `repos` with `client` and records the time.
pub async fn resync_repos(
    ops: &Ops,
    client: &ForgejoClient,
    repos: &[RepoName],
) -> Result<ResyncReport, OpsError> {
    let mut report = ResyncReport::default();
    for repo in repos {
        report.repos.push(resync_repo(ops, client, repo).await?);
    }
    report.finished_ms = now_ms();
    markers::set_last_resync(&mut ops.conn(), &ops.keys, report.finished_ms).await?;
    Ok(report)
}

/// One repository. Forgejo failures are reported in the result; Redis failures fail.
#[instrument(skip_all, fields(repo = %repo))]
async fn resync_repo(
    ops: &Ops,
    client: &ForgejoClient,
    repo: &RepoName,
) -> Result<RepoResync, OpsError> {
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
    repos::remember(&mut ops.conn(), &ops.keys, repo.as_str()).await?;
    for pr in &pulls {
        out.open_prs.push(pr.number);
        match observe_open(client, repo, pr).await {
            Ok(event) => {
                queue(ops, repo, &event).await?;
                out.queued += 1;
            }
            Err(e) => out.errors.push(format!("#{}: {e}", pr.number)),
        }
    }
    for n in held_open(ops, repo).await? {
        if out.open_prs.contains(&n) {
            continue;
        }
        out.no_longer_open.push(n);
        match client.get_pull(repo.as_str(), n).await {
            Ok(pr) => {
                queue(
                    ops,
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
async fn held_open(ops: &Ops, repo: &RepoName) -> Result<Vec<u64>, OpsError> {
    let mut conn = ops.conn();
    let keys: Vec<String> = commit::index_members(&mut conn, &ops.keys.repo_index(repo.as_str()))
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
async fn queue(ops: &Ops, repo: &RepoName, event: &Event) -> Result<String, OpsError> {
    let body = serde_json::to_string(event).map_err(anyhow::Error::from)?;
    let (delivery, name) = (format!("resync:{}", uuid::Uuid::new_v4()), event.name());
    let received = u64::try_from(now_ms()).unwrap_or(0);
    let entry = EventEntry::internal(&delivery, &name, repo.as_str(), received, &body);
    let stream = ops.keys.events(ops.keys.shard_of(repo.as_str()));
    Ok(event_entry::append(&mut ops.conn(), &stream, &entry).await?)
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
