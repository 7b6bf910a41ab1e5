//! `shepherd inspect owner/repo#N` for an issue: where its `issue-impl` work stands
//! and why — including what holds a blocked issue (a blocking label, open
//! dependencies) — its dependencies as last read, the work and its attempts, timers
//! and history.

use serde::{Deserialize, Serialize};

use super::archive;
use super::inspect::{TimerView, timers};
use super::timefmt::{duration, rfc3339};
use super::{Ops, OpsError, PrTarget};
use crate::core::event::DependencyFact;
use crate::core::machine::decide_issue;
use crate::core::record::{Attempt, Hold, IssueRecord};
use crate::store::commit;

/// History entries shown.
const HISTORY_SHOWN: usize = 20;

/// One issue in depth.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IssueInspection {
    /// `owner/name`.
    pub repo: String,
    /// Issue index.
    pub number: u64,
    /// Title, when the issue was read.
    pub title: String,
    /// Phase (`implementing`, `blocked`, …).
    pub phase: String,
    /// Why: for a blocked issue, the label or the open dependencies that hold it.
    pub reason: String,
    /// The issue's labels.
    pub labels: Vec<String>,
    /// Its dependencies as last read (Forgejo issue dependencies), and when.
    pub dependencies: Vec<DependencyFact>,
    /// When they were read (unix ms); `None`: never.
    pub dependencies_read_ms: Option<i64>,
    /// The active work item: kind, id, tier, claim expiry (unix ms).
    pub active: Option<String>,
    /// Finished attempts.
    pub attempts: Vec<Attempt>,
    /// Paused or needs-human.
    pub hold: Option<Hold>,
    /// Timers scheduled for this issue.
    pub timers: Vec<TimerView>,
    /// The last history entries, newest first.
    pub history: Vec<std::collections::BTreeMap<String, String>>,
    /// The record itself.
    pub record: serde_json::Value,
}

/// Issue `t` in depth, or `None` when there is no issue record.
#[tracing::instrument(skip_all, fields(repo = %t.repo, issue = t.number))]
pub async fn inspect_issue(ops: &Ops, t: &PrTarget) -> Result<Option<IssueInspection>, OpsError> {
    let repo = t.repo.as_str();
    let key = ops.keys.issue_record(repo, t.number);
    let mut conn = ops.conn();
    let Some(stored) = commit::load(&mut conn, &key).await? else {
        return Ok(None);
    };
    let record = IssueRecord::from_json(&stored.data)
        .map_err(|e| OpsError::Other(anyhow::anyhow!("corrupt record {key}: {e}")))?;
    let policy = ops.policy.for_repo(&t.repo);
    let decision = decide_issue(&record, &policy);
    let history = archive::scan_rev(
        &mut conn,
        &ops.keys.issue_history(repo, t.number),
        HISTORY_SHOWN,
    )
    .await?
    .into_iter()
    .map(|e| e.fields.into_iter().collect())
    .collect();
    let shard = ops.keys.shard_of(repo);
    let read = record.deps.read.as_ref();
    Ok(Some(IssueInspection {
        repo: repo.to_owned(),
        number: t.number,
        title: record
            .issue
            .as_ref()
            .map(|i| i.title.clone())
            .unwrap_or_default(),
        phase: decision.phase.as_str().to_owned(),
        reason: decision.reason,
        labels: record
            .issue
            .as_ref()
            .map(|i| i.labels.iter().cloned().collect())
            .unwrap_or_default(),
        dependencies: read.map(|r| r.items.clone()).unwrap_or_default(),
        dependencies_read_ms: read.map(|r| r.at_ms),
        active: record.work.active.as_ref().map(|a| {
            format!(
                "{} {} tier {} ({}), claim expires {}",
                a.item.kind.as_str(),
                a.item.id,
                a.item.tier,
                a.item.tier_name,
                rfc3339(a.expires_ms)
            )
        }),
        attempts: record.work.attempts.clone(),
        hold: record.work.hold.clone(),
        timers: timers(&mut conn, ops, shard, &key).await?,
        history,
        record: serde_json::to_value(&record).map_err(anyhow::Error::from)?,
    }))
}

/// Human-readable rendering of one issue.
pub fn render_issue(i: &IssueInspection, now: i64) -> String {
    let mut out = format!("{}#{} (issue)  {}\n", i.repo, i.number, i.title);
    out += &format!("phase     {} — {}\n", i.phase, i.reason);
    out += &format!("labels    {}\n", i.labels.join(", "));
    match i.dependencies_read_ms {
        Some(at) => {
            let deps: Vec<String> = i
                .dependencies
                .iter()
                .map(|d| {
                    let state = if d.open { "open" } else { "closed" };
                    format!("{}#{} {state}", d.repo, d.number)
                })
                .collect();
            let list = if deps.is_empty() {
                "none".into()
            } else {
                deps.join(", ")
            };
            out += &format!("depends   {list} (read {} ago)\n", duration(now - at));
        }
        None => out += "depends   not read yet\n",
    }
    out += &format!("work      {}\n", i.active.as_deref().unwrap_or("none"));
    out += &format!("attempts  {}\n", i.attempts.len());
    if let Some(h) = &i.hold {
        out += &format!(
            "hold      {}\n",
            serde_json::to_string(h).unwrap_or_default()
        );
    }
    for t in &i.timers {
        out += &format!("timer     {} at {}\n", t.id, rfc3339(t.due_ms));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_issue_shows_why_and_its_dependencies() {
        let dep = |n: u64, open: bool| DependencyFact {
            repo: "acme/web".parse().expect("repo"),
            number: n,
            open,
            is_pull: false,
            linking_prs: Vec::new(),
        };
        let i = IssueInspection {
            repo: "acme/web".into(),
            number: 9,
            title: "Feature".into(),
            phase: "blocked".into(),
            reason: "blocked by open dependencies: #3 (dispatched when they close)".into(),
            labels: vec!["auto/implement".into(), "Type/Bug".into()],
            dependencies: vec![dep(3, true), dep(4, false)],
            dependencies_read_ms: Some(1_000),
            active: None,
            attempts: Vec::new(),
            hold: None,
            timers: vec![TimerView {
                id: "dependency-recheck".into(),
                due_ms: 301_000,
            }],
            history: Vec::new(),
            record: serde_json::Value::Null,
        };
        let text = render_issue(&i, 61_000);
        assert!(
            text.contains("phase     blocked — blocked by open dependencies: #3"),
            "{text}"
        );
        assert!(
            text.contains("labels    auto/implement, Type/Bug\n"),
            "{text}"
        );
        assert!(
            text.contains("depends   acme/web#3 open, acme/web#4 closed (read 1m"),
            "{text}"
        );
        assert!(text.contains("timer     dependency-recheck at "), "{text}");
        assert!(text.contains("work      none\n"), "{text}");
    }
}
