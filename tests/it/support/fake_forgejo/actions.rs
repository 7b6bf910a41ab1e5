//! The fake's Forgejo Actions runs, jobs and job logs, and the version it reports.
//!
//! Served as Forgejo's source does it (branch `v16.0/forgejo` at `4695780d…`, against
//! tag `v15.0.3`; see `src/forgejo/actions.rs` for the lines read):
//!
//! - `GET /version` → `{"version": …}`: `15.0.3+gitea-1.22.0` unless a test sets
//!   another ([`FakeForgejo::set_forgejo_version`]);
//! - `GET /repos/{o}/{r}/actions/runs` (v15 and v16): `{"workflow_runs": [ActionRun],
//!   "total_count"}`, filtered by `run_number` (the run's `index_in_repo`), paged by
//!   `page`/`limit`;
//! - v16 only (a v15 fake answers 404, as v15's router has no such route):
//!   `GET …/actions/runs/{run_id}/jobs` → the run's jobs (`ActionRunJob`) ordered by
//!   id, 404 for another repository's run; `GET …/actions/jobs/{job_id}/logs` → the
//!   latest attempt's log as `text/plain; charset=utf-8` with `Accept-Ranges: bytes`,
//!   honouring `Range: bytes=-N` / `bytes=A-B` / `bytes=A-` as Go's `http.ServeContent`
//!   does (206 with `Content-Range`; 416 with `bytes */size` when nothing overlaps);
//!   404 when the job never ran or its log expired, or for `?attempt=` other than the
//!   latest (older attempts' logs are not kept by the fake).

use serde_json::{Value, json};

use super::FakeForgejo;
use super::model::Model;
use super::routes::{Reply, lock, page_params};

/// Forgejo v15's version text, the fake's default.
pub const V15: &str = "15.0.3+gitea-1.22.0";
/// A Forgejo v16 version text.
pub const V16: &str = "16.0.0+gitea-1.22.0";

/// The Actions part of the model.
#[derive(Debug, Clone)]
pub struct Actions {
    /// What `GET /version` says.
    pub version: String,
    /// Every run, oldest first.
    pub runs: Vec<RunRow>,
    /// The `Range` header of every log request (`""`: none), oldest first.
    pub log_ranges: Vec<String>,
}

impl Default for Actions {
    fn default() -> Self {
        Self {
            version: V15.into(),
            runs: Vec::new(),
            log_ranges: Vec::new(),
        }
    }
}

impl Actions {
    /// Whether the version is v16 or later (the job and log routes exist).
    fn v16(&self) -> bool {
        self.version
            .split('.')
            .next()
            .and_then(|m| m.parse::<u32>().ok())
            .is_some_and(|m| m >= 16)
    }
}

/// A workflow run.
#[derive(Debug, Clone)]
pub struct RunRow {
    /// Its id.
    pub id: i64,
    /// `owner/name`.
    pub repo: String,
    /// Its number in the repository (`index_in_repo`).
    pub index: u64,
    /// Its jobs, by id.
    pub jobs: Vec<JobRow>,
}

/// A job of a run.
#[derive(Debug, Clone)]
pub struct JobRow {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// `success`, `failure`, …
    pub status: String,
    /// Its latest attempt's log; `None`: it never ran or its log expired.
    pub log: Option<String>,
}

/// `GET /version`.
pub fn version(model: &Model) -> Reply {
    Reply::json(200, json!({"version": model.actions.version}))
}

/// The Actions routes below `/repos/{o}/{r}/` (`rest`), or `None` for other paths.
pub fn route(
    model: &mut Model,
    repo: &str,
    rest: &[&str],
    query: &[(String, String)],
    range: Option<&str>,
) -> Option<Reply> {
    if let ["actions", "jobs", _, "logs"] = rest {
        let seen = range.unwrap_or_default().to_owned();
        model.actions.log_ranges.push(seen);
    }
    let a = &model.actions;
    let reply = match rest {
        ["actions", "runs"] => list_runs(a, repo, query),
        ["actions", "runs", id, "jobs"] if a.v16() => jobs(a, repo, id),
        ["actions", "jobs", id, "logs"] if a.v16() => log(a, repo, id, query, range),
        ["actions", "runs", _, "jobs"] | ["actions", "jobs", _, "logs"] => Reply::not_found(),
        _ => return None,
    };
    Some(reply)
}

fn run_json(model_repo: &str, r: &RunRow) -> Value {
    json!({
        "id": r.id,
        "index_in_repo": r.index,
        "title": format!("run {}", r.index),
        "workflow_id": "ci.yml",
        "status": if r.jobs.iter().any(|j| j.status == "failure") { "failure" } else { "success" },
        "html_url": format!("/{model_repo}/actions/runs/{}", r.index),
    })
}

fn list_runs(a: &Actions, repo: &str, query: &[(String, String)]) -> Reply {
    let number = query
        .iter()
        .find(|(k, _)| k == "run_number")
        .and_then(|(_, v)| v.parse::<u64>().ok())
        .unwrap_or(0);
    let all: Vec<Value> = a
        .runs
        .iter()
        .rev()
        .filter(|r| r.repo == repo && (number == 0 || r.index == number))
        .map(|r| run_json(repo, r))
        .collect();
    let (page, limit) = page_params(query);
    let start = ((page - 1) * limit).min(all.len());
    let end = (start + limit).min(all.len());
    let mut reply = Reply::json(
        200,
        json!({"workflow_runs": all[start..end], "total_count": all.len()}),
    );
    reply.total = Some(all.len());
    reply
}

fn jobs(a: &Actions, repo: &str, id: &str) -> Reply {
    let Some(run) = a
        .runs
        .iter()
        .find(|r| id.parse() == Ok(r.id) && r.repo == repo)
    else {
        return Reply::not_found();
    };
    let list: Vec<Value> = run
        .jobs
        .iter()
        .map(|j| {
            json!({
                "id": j.id, "run_id": run.id, "attempt": 1, "handle": format!("h{}", j.id),
                "repo_id": 1, "owner_id": 1, "name": j.name, "needs": [], "runs_on": ["docker"],
                "task_id": j.id + 100, "status": j.status,
            })
        })
        .collect();
    Reply::json(200, Value::Array(list))
}

fn log(
    a: &Actions,
    repo: &str,
    id: &str,
    query: &[(String, String)],
    range: Option<&str>,
) -> Reply {
    let job = a
        .runs
        .iter()
        .filter(|r| r.repo == repo)
        .flat_map(|r| &r.jobs)
        .find(|j| id.parse() == Ok(j.id));
    let Some(text) = job.and_then(|j| j.log.as_ref()) else {
        return Reply::not_found();
    };
    if query.iter().any(|(k, v)| k == "attempt" && v != "1") {
        return Reply::not_found();
    }
    let size = text.len();
    let reply = match range.map(|r| byte_range(r, size)) {
        None => Reply::text(200, text.clone()),
        Some(None) => {
            return Reply::text(416, String::new())
                .header("Content-Range", format!("bytes */{size}"));
        }
        Some(Some((start, end))) => {
            let body = String::from_utf8_lossy(&text.as_bytes()[start..end]).into_owned();
            Reply::text(206, body)
                .header("Content-Range", format!("bytes {start}-{}/{size}", end - 1))
        }
    };
    reply.header("Accept-Ranges", "bytes".into())
}

/// One range of `Range: bytes=…` over `size` bytes as `[start, end)`, as Go's
/// `parseRange` reads it: `-N` is the last N (all when N ≥ size), `A-` from A, `A-B`
/// inclusive; `None` when it does not overlap (or `size` is 0).
fn byte_range(header: &str, size: usize) -> Option<(usize, usize)> {
    let spec = header.trim().strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    if size == 0 {
        return None;
    }
    if a.is_empty() {
        let n: usize = b.trim().parse().ok()?;
        return (n > 0).then(|| (size - n.min(size), size));
    }
    let start: usize = a.trim().parse().ok()?;
    if start >= size {
        return None;
    }
    let end = match b.trim() {
        "" => size,
        e => (e.parse::<usize>().ok()? + 1).min(size),
    };
    (end > start).then_some((start, end))
}

impl FakeForgejo {
    /// Makes `GET /version` say `version` (e.g. [`V16`]): a v16 fake serves the job
    /// and log routes, a v15 one answers 404 there.
    pub fn set_forgejo_version(&self, version: &str) {
        lock(&self.shared.model).actions.version = version.into();
    }

    /// The `Range` header of every job-log request so far (`""`: none).
    pub fn log_ranges(&self) -> Vec<String> {
        lock(&self.shared.model).actions.log_ranges.clone()
    }

    /// Adds run number `index` of `repo` with `jobs` (`(name, status, log)`, in the
    /// order of their ids); returns the jobs' ids.
    pub fn add_action_run(
        &self,
        repo: &str,
        index: u64,
        jobs: &[(&str, &str, Option<&str>)],
    ) -> Vec<i64> {
        let mut m = lock(&self.shared.model);
        let id = m.id();
        let rows: Vec<JobRow> = jobs
            .iter()
            .map(|(name, status, log)| JobRow {
                id: m.id(),
                name: (*name).into(),
                status: (*status).into(),
                log: log.map(str::to_owned),
            })
            .collect();
        let ids = rows.iter().map(|j| j.id).collect();
        m.actions.runs.push(RunRow {
            id,
            repo: repo.into(),
            index,
            jobs: rows,
        });
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::byte_range;

    #[test]
    fn ranges_as_go_reads_them() {
        assert_eq!(byte_range("bytes=-4", 10), Some((6, 10)));
        assert_eq!(byte_range("bytes=-40", 10), Some((0, 10)));
        assert_eq!(byte_range("bytes=2-", 10), Some((2, 10)));
        assert_eq!(byte_range("bytes=2-4", 10), Some((2, 5)));
        assert_eq!(byte_range("bytes=10-", 10), None);
        assert_eq!(byte_range("bytes=-4", 0), None);
    }
}
