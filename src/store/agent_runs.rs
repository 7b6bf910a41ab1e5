//! What the agent runners show of their work (written by `shepherd agents`, read by the
//! status page and `inspect`):
//!
//! - `<p>:agent-run:<work id>`: the state of one work item in a runner ([`AgentRun`]
//!   JSON), kept for the retention window after it finished;
//! - `<p>:agents:running`: work id → the same JSON, while waiting or running; each
//!   runner's heartbeat refreshes `seen_ms`, so an entry left behind by a runner that
//!   crashed is recognisable (and skipped) by its age;
//! - `<p>:agent-log:<work id>`: the agent's captured output (size-capped, secrets
//!   masked), kept for the retention window.

use std::time::Duration;

use crate::store::Conn;
use serde::{Deserialize, Serialize};

use super::{Keys, StoreError};

/// Where a work item stands in a runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunState {
    /// Taken from the dispatch stream, waiting for a free slot.
    Waiting,
    /// The agent runs.
    Running,
    /// The agent ended and its result was handed to the results path.
    Finished,
    /// A cancel notice stopped it (or it was cancelled before it started).
    Cancelled,
    /// Not started: the work was no longer active, its result already reported, or the
    /// entry is not its record's active work (`agents::binding`).
    Skipped,
    /// Stopped without a result: the runner shut down or lost the entry; another
    /// runner takes the work over.
    Released,
}

impl RunState {
    /// The state's name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Waiting => "waiting",
            RunState::Running => "running",
            RunState::Finished => "finished",
            RunState::Cancelled => "cancelled",
            RunState::Skipped => "skipped",
            RunState::Released => "released",
        }
    }

    /// Whether the item still occupies the runner.
    pub fn is_live(self) -> bool {
        matches!(self, RunState::Waiting | RunState::Running)
    }
}

/// Serde's test for a flag left out when false.
fn is_false(b: &bool) -> bool {
    !*b
}

/// One work item in a runner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRun {
    /// Work id.
    pub work_id: String,
    /// Repository.
    pub repo: String,
    /// PR or issue number.
    pub number: u64,
    /// Work kind.
    pub kind: String,
    /// Tier number.
    pub tier: u8,
    /// Tier name.
    pub tier_name: String,
    /// Model id given to the agent.
    pub model: String,
    /// Agent name given to the agent.
    pub agent: String,
    /// The runner's consumer name.
    pub runner: String,
    /// Where it stands.
    pub state: RunState,
    /// The agent's pid while it runs.
    #[serde(default)]
    pub pid: Option<u32>,
    /// When the runner took it (unix ms).
    pub taken_ms: i64,
    /// When the agent started (unix ms).
    #[serde(default)]
    pub started_ms: Option<i64>,
    /// When it ended (unix ms).
    #[serde(default)]
    pub ended_ms: Option<i64>,
    /// The deadline (claim expiry minus the margin, unix ms).
    pub deadline_ms: i64,
    /// The runner's last heartbeat for it (unix ms).
    pub seen_ms: i64,
    /// The reported outcome, once finished.
    #[serde(default)]
    pub outcome: Option<String>,
    /// The reported signature, once finished.
    #[serde(default)]
    pub signature: Option<String>,
    /// What the results path said (`queued`, `ended`, `already-reported`, …) or why
    /// nothing was reported.
    #[serde(default)]
    pub note: Option<String>,
    /// Bytes of output the agent wrote.
    #[serde(default)]
    pub output_bytes: Option<u64>,
    /// The runner runs its agents without the sandbox (`SHEPHERD_AGENT_SANDBOX=off`);
    /// the status page says "agents unsandboxed".
    #[serde(default, skip_serializing_if = "is_false")]
    pub unsandboxed: bool,
}

/// Writes `run` (and keeps the running table in step with its state).
pub async fn save(
    conn: &mut Conn,
    keys: &Keys,
    run: &AgentRun,
    ttl: Duration,
) -> Result<(), StoreError> {
    let json = serde_json::to_string(run).map_err(|e| StoreError::Protocol {
        script: "agent-run",
        reply: format!("cannot encode the run: {e}"),
    })?;
    // Two commands, not one pipeline: the run's key and the running table are in
    // different hash slots, and a Redis Cluster refuses a pipeline that crosses slots.
    let _: () = redis::cmd("SET")
        .arg(keys.agent_run(&run.work_id))
        .arg(&json)
        .arg("EX")
        .arg(ttl.as_secs().max(1))
        .query_async(conn)
        .await?;
    let _: i64 = match run.state.is_live() {
        true => {
            redis::cmd("HSET")
                .arg(keys.agents_running())
                .arg(&run.work_id)
                .arg(&json)
                .query_async(conn)
                .await?
        }
        false => {
            redis::cmd("HDEL")
                .arg(keys.agents_running())
                .arg(&run.work_id)
                .query_async(conn)
                .await?
        }
    };
    Ok(())
}

/// Refreshes the running table's entries of `runs` (one round trip).
pub async fn heartbeat(conn: &mut Conn, keys: &Keys, runs: &[AgentRun]) -> Result<(), StoreError> {
    let mut pipe = redis::pipe();
    for run in runs {
        if let Ok(json) = serde_json::to_string(run) {
            pipe.hset(keys.agents_running(), &run.work_id, json)
                .ignore();
        }
    }
    super::client::query_pipeline::<redis::Value>(conn, &pipe).await?;
    Ok(())
}

/// Records that `runner` runs its agents unsandboxed, at `now_ms` (every heartbeat of
/// such a runner); entries older than a day are dropped on the way.
pub async fn announce_unsandboxed(
    conn: &mut Conn,
    keys: &Keys,
    runner: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut pipe = redis::pipe();
    pipe.zadd(keys.agents_unsandboxed(), runner, now_ms)
        .ignore()
        .cmd("ZREMRANGEBYSCORE")
        .arg(keys.agents_unsandboxed())
        .arg("-inf")
        .arg(now_ms.saturating_sub(24 * 3_600_000))
        .ignore();
    super::client::query_pipeline::<redis::Value>(conn, &pipe).await?;
    Ok(())
}

/// The runners that run agents unsandboxed and whose heartbeat is no older than
/// `fresh` at `now_ms`, by name.
pub async fn unsandboxed_runners(
    conn: &mut Conn,
    keys: &Keys,
    now_ms: i64,
    fresh: Duration,
) -> Result<Vec<String>, StoreError> {
    let fresh_ms = i64::try_from(fresh.as_millis()).unwrap_or(i64::MAX);
    let mut runners: Vec<String> = redis::cmd("ZRANGEBYSCORE")
        .arg(keys.agents_unsandboxed())
        .arg(now_ms.saturating_sub(fresh_ms))
        .arg("+inf")
        .query_async(conn)
        .await?;
    runners.sort();
    Ok(runners)
}

/// The state of work item `work_id` in a runner, if any runner took it.
pub async fn load(
    conn: &mut Conn,
    keys: &Keys,
    work_id: &str,
) -> Result<Option<AgentRun>, StoreError> {
    let json: Option<String> = redis::cmd("GET")
        .arg(keys.agent_run(work_id))
        .query_async(conn)
        .await?;
    Ok(json.and_then(|j| serde_json::from_str(&j).ok()))
}

/// The work items waiting or running in some runner, whose runner's heartbeat is no
/// older than `fresh` at `now_ms` (older ones belong to runners that died), oldest
/// first.
pub async fn live(
    conn: &mut Conn,
    keys: &Keys,
    now_ms: i64,
    fresh: Duration,
) -> Result<Vec<AgentRun>, StoreError> {
    let all: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(keys.agents_running())
        .query_async(conn)
        .await?;
    let fresh_ms = i64::try_from(fresh.as_millis()).unwrap_or(i64::MAX);
    let mut runs: Vec<AgentRun> = all
        .into_iter()
        .filter_map(|(_, json)| serde_json::from_str::<AgentRun>(&json).ok())
        .filter(|r| now_ms.saturating_sub(r.seen_ms) <= fresh_ms)
        .collect();
    runs.sort_by_key(|r| (r.started_ms.unwrap_or(i64::MAX), r.taken_ms));
    Ok(runs)
}

/// Stores the output log of `work_id`.
pub async fn save_log(
    conn: &mut Conn,
    keys: &Keys,
    work_id: &str,
    text: &str,
    ttl: Duration,
) -> Result<(), StoreError> {
    let () = redis::cmd("SET")
        .arg(keys.agent_log(work_id))
        .arg(text)
        .arg("EX")
        .arg(ttl.as_secs().max(1))
        .query_async(conn)
        .await?;
    Ok(())
}

/// The output log of `work_id`, if it is still kept.
pub async fn load_log(
    conn: &mut Conn,
    keys: &Keys,
    work_id: &str,
) -> Result<Option<String>, StoreError> {
    Ok(redis::cmd("GET")
        .arg(keys.agent_log(work_id))
        .query_async(conn)
        .await?)
}
