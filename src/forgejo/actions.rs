//! Forgejo Actions reads for the agents' CI logs: the instance's version (read once),
//! a run by its number, the jobs of a run, and the tail of a job's log.
//!
//! Source read: Forgejo branch `v16.0/forgejo` at `4695780d410cbb362ed6db9270be71867b43eb0a`
//! (GitHub mirror `rohitkumarankam/forgejo`), against tag `v15.0.3`
//! (`f6d4219f10a29dd6d59dfb5d8e44b7ff7aed4274`):
//!
//! - `routers/api/v1/api.go` (v16, lines 883–907), in the repository group
//!   `/repos/{owner}/{repo}/actions`, `reqRepoReader(unit.TypeActions)`:
//!   `GET /jobs/{job_id}/logs` → `repo.GetActionJobLogs`,
//!   `GET /runs` → `repo.ListActionRuns`, `GET /runs/{run_id}/jobs` →
//!   `repo.ListActionRunJobs`. v15.0.3 has only `GET /runs` and `GET /runs/{run_id}`
//!   there, so the two others answer 404 on v15.
//! - `routers/api/v1/repo/action.go` (v16): `ListActionRuns` filters by `run_number`
//!   (`FindRunOptions.RunNumber`) and answers `{"workflow_runs": [ActionRun],
//!   "total_count"}` (`modules/structs/action.go` `ListActionRunResponse`);
//!   `ListActionRunJobs` answers a JSON array of `ActionRunJob` (`id`, `run_id`,
//!   `attempt`, `name`, `status`, `task_id`, …) from `GetRunJobsByRunID`, ordered by
//!   id; `GetActionJobLogs` serves the latest attempt's plain text (`?attempt=N` for
//!   an older one) through `http.ServeContent` with `Accept-Ranges: bytes` and
//!   `Content-Type: text/plain; charset=utf-8`, so `Range` gives 206 with
//!   `Content-Range`; 404 when the job does not exist, never ran, or its logs expired.
//! - `services/actions/commit_status.go` (v16, also v15): a job's commit status links
//!   `{run.Link()}/jobs/{index}` where `run.Link()` is `/{owner}/{repo}/actions/runs/
//!   {run.Index}` and `index` is the job's position in `GetRunJobsByRunID` — the same
//!   order `ListActionRunJobs` answers in. So a status link gives the run's number and
//!   the job's position, and these three calls give its log.

use serde::Deserialize;
use tracing::instrument;

use super::client::repo_path;
use super::{ForgejoClient, ForgejoError};

/// The first Forgejo major version whose API serves job logs.
pub const JOB_LOGS_SINCE: u32 = 16;

/// The instance's version as `GET /version` says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForgejoVersion {
    /// The text, e.g. `16.0.0+gitea-1.22.0`.
    pub text: String,
    /// Its major number, when it starts with one.
    pub major: Option<u32>,
}

impl ForgejoVersion {
    /// The version of `text` (`15.0.3+gitea-1.22.0` → major 15).
    pub fn parse(text: &str) -> Self {
        let major = text
            .trim()
            .trim_start_matches('v')
            .split(['.', '-', '+'])
            .next()
            .and_then(|m| m.parse().ok());
        Self {
            text: text.trim().to_owned(),
            major,
        }
    }

    /// Whether the API serves job logs: v16 and later. An unknown version is tried
    /// (a 404 then says the route is missing).
    pub fn serves_job_logs(&self) -> bool {
        self.major.is_none_or(|m| m >= JOB_LOGS_SINCE)
    }
}

/// A workflow run (the fields Shepherd reads of `ActionRun`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ActionRun {
    /// Its id (what `/runs/{run_id}` takes).
    pub id: i64,
    /// Its number in the repository (what web links and `run_number` use).
    #[serde(default)]
    pub index_in_repo: i64,
}

/// A job of a run (the fields Shepherd reads of `ActionRunJob`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ActionRunJob {
    /// Its id (what `/jobs/{job_id}/logs` takes).
    pub id: i64,
    /// The job's name.
    #[serde(default)]
    pub name: String,
    /// `success`, `failure`, `running`, …
    #[serde(default)]
    pub status: String,
    /// How many times it ran, this one included.
    #[serde(default)]
    pub attempt: i64,
}

/// The end of a job's log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogTail {
    /// Its last bytes (lossy UTF-8).
    pub text: String,
    /// The whole log's length in bytes, when Forgejo said it.
    pub total: Option<u64>,
}

/// The body of `GET …/actions/runs`.
#[derive(Deserialize)]
struct RunList {
    /// The runs.
    #[serde(default)]
    workflow_runs: Vec<ActionRun>,
}

impl ForgejoClient {
    /// `GET /version`, read once per client and kept: whether job logs can be read is
    /// decided once (a failed read is not kept, so the next need tries again).
    #[instrument(skip_all)]
    pub async fn forgejo_version(&self) -> Result<ForgejoVersion, ForgejoError> {
        let text = self
            .inner
            .version
            .get_or_try_init(|| self.version())
            .await?;
        Ok(ForgejoVersion::parse(text))
    }

    /// `GET /repos/{o}/{r}/actions/runs?run_number=N`: the run numbered `number`
    /// (`None` when there is none).
    #[instrument(skip_all, fields(repo = %repo, run = number))]
    pub async fn action_run_by_number(
        &self,
        repo: &str,
        number: u64,
    ) -> Result<Option<ActionRun>, ForgejoError> {
        let path = format!("{}/actions/runs", repo_path(repo)?);
        let q = [("run_number", number.to_string()), ("limit", "1".into())];
        let list: RunList = self.get_json(&path, &q).await?;
        Ok(list
            .workflow_runs
            .into_iter()
            .find(|r| r.index_in_repo == 0 || r.index_in_repo == number as i64))
    }

    /// `GET /repos/{o}/{r}/actions/runs/{run_id}/jobs` (v16+): the run's jobs in
    /// Forgejo's order (by id), the order of the job positions in status links.
    #[instrument(skip_all, fields(repo = %repo, run_id))]
    pub async fn action_run_jobs(
        &self,
        repo: &str,
        run_id: i64,
    ) -> Result<Vec<ActionRunJob>, ForgejoError> {
        // Not in the v15 API definition: Forgejo v16 `routers/api/v1/api.go` at
        // `4695780d` (the module's source notes); allowed by the static scan's list.
        let path = format!("{}/actions/runs/{run_id}/jobs", repo_path(repo)?);
        self.get_json(&path, &[]).await
    }

    /// `GET /repos/{o}/{r}/actions/jobs/{job_id}/logs` (v16+) with
    /// `Range: bytes=-{max_bytes}`: the last `max_bytes` of the latest attempt's log.
    #[instrument(skip_all, fields(repo = %repo, job_id))]
    pub async fn action_job_log_tail(
        &self,
        repo: &str,
        job_id: i64,
        max_bytes: usize,
    ) -> Result<LogTail, ForgejoError> {
        // Not in the v15 API definition: Forgejo v16 `routers/api/v1/api.go` at
        // `4695780d` (the module's source notes); allowed by the static scan's list.
        let path = format!("{}/actions/jobs/{job_id}/logs", repo_path(repo)?);
        let (bytes, total) = self.get_text_tail(&path, max_bytes).await?;
        let cut = total.is_none_or(|t| t > bytes.len() as u64);
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if cut {
            // The cut may have split a character: drop its replacement character.
            text = text.trim_start_matches('\u{FFFD}').to_owned();
        }
        Ok(LogTail { text, total })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decide_the_job_log_route() {
        let v15 = ForgejoVersion::parse("15.0.3+gitea-1.22.0");
        assert_eq!(v15.major, Some(15));
        assert!(!v15.serves_job_logs());
        let v16 = ForgejoVersion::parse("16.0.0-dev-12-abc+gitea-1.22.0");
        assert_eq!(v16.major, Some(16));
        assert!(v16.serves_job_logs());
        assert!(ForgejoVersion::parse("v17.1.0").serves_job_logs());
        let odd = ForgejoVersion::parse("development");
        assert_eq!(odd.major, None);
        assert!(odd.serves_job_logs(), "an unknown version is tried");
    }
}
