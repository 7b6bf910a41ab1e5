//! `shepherd resync` and `POST /api/v1/admin/resync`: one resync of the named
//! repositories now, by the worker's own mechanism (`crate::worker::resync`, which
//! the periodic resync runs too).
//!
//! An operator's resync is always a full pass (every open PR's status and reviews
//! read): it is what one runs after an outage. The periodic resync reads only what may
//! have changed between its full passes (`crate::worker::resync::decide`).
//!
//! What it does, per repository: every open PR (`state=open`, all pages) with its head's combined
//! status and its reviews becomes one internal `ResyncObserved` event; every PR that
//! Shepherd still holds open but the API no longer lists (closed or merged during an
//! outage) is read alone and becomes an `ObservedPr` event. The events go onto the
//! repository's events stream, so workers apply them with `core::step` like any
//! other event (older observations never overwrite newer facts). The time of the last
//! completed resync is kept at `Keys::last_resync`.

use serde::{Deserialize, Serialize};
use tracing::instrument;

use super::{Ops, OpsError, parse_repo};
use crate::core::ids::RepoName;
use crate::forgejo::ForgejoClient;
pub use crate::worker::resync::{RepoResync, ResyncReport};
use crate::worker::resync::{Resync, Sweep, known_repos, resync_repos};

/// What to resync.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResyncRequest {
    /// One repository, `owner/name`.
    pub repo: Option<String>,
    /// Every repository Shepherd has seen.
    pub all: bool,
}

/// Resyncs the repositories `req` names.
#[instrument(skip_all, fields(repo = req.repo.as_deref().unwrap_or(""), all = req.all))]
pub async fn resync(ops: &Ops, req: &ResyncRequest) -> Result<ResyncReport, OpsError> {
    let client = ForgejoClient::from_config(&ops.config, None)
        .map_err(|e| OpsError::Unavailable(format!("resync needs the Forgejo API: {e:#}")))?;
    let handle = handle(ops);
    let repos = match (&req.repo, req.all) {
        (Some(r), false) => vec![parse_repo(r)?],
        (None, true) => known_repos(&handle).await?,
        _ => {
            return Err(OpsError::BadRequest(
                "name one repository (repo) or all of them (all)".into(),
            ));
        }
    };
    Ok(resync_repos(&handle, &client, &repos, Sweep::Full, None).await?)
}

/// The worker's resync mechanism on the tools' connection.
fn handle(ops: &Ops) -> Resync {
    Resync {
        conn: ops.conn(),
        keys: ops.keys.clone(),
        policy: ops.policy.clone(),
    }
}

/// Every repository Shepherd has seen (`Keys::repos()`), in name order.
pub async fn known(ops: &Ops) -> Result<Vec<RepoName>, OpsError> {
    Ok(known_repos(&handle(ops)).await?)
}
