//! `shepherd inspect owner/repo#N` (one PR in depth) and `inspect owner/repo` (every
//! open PR, one line each).
//!
//! Pending effects are the PR's entries of its shard's effects stream that the
//! executors have not acknowledged: delivered and pending (`in-progress`) or not yet
//! delivered (`queued`, after the group's last-delivered id).

use std::collections::BTreeMap;

use crate::store::Conn;
use serde::{Deserialize, Serialize};

use super::archive::{self, Archived};
use super::costs::{Cost, dollars};
use super::status::{self, PrSummary};
use super::timefmt::{duration, now_ms, rfc3339};
use super::{Ops, OpsError, PrTarget, parse_pr, parse_repo};
use crate::core::event::{CiContext, ReviewFact};
use crate::core::machine::decide;
use crate::core::record::{Attempt, Hold, PrRecord};
use crate::store::agent_runs::{self, AgentRun};
use crate::store::commit::effect_fields;
use crate::store::keys::EXECUTORS_GROUP;
use crate::store::ledger::{self, RunEntry};
use crate::store::streams;
use crate::store::timers as store_timers;

/// History entries shown.
const HISTORY_SHOWN: usize = 20;
/// Most effects-stream entries examined for a PR's pending effects.
const PENDING_SCAN: usize = 10_000;

/// One PR in depth.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Inspection {
    /// Summary: phase, reason, age of the phase, tier, active work.
    pub summary: PrSummary,
    /// Head commit.
    pub head_sha: Option<String>,
    /// CI contexts of the head.
    pub ci: Vec<CiContext>,
    /// Latest review per reviewer.
    pub reviews: Vec<ReviewFact>,
    /// Finished attempts: the last ones the record keeps in full.
    pub attempts: Vec<Attempt>,
    /// Older attempts the record only counts (it keeps the last 10 in full).
    #[serde(default)]
    pub attempts_dropped: u64,
    /// Reviewer agents' rounds (`review` work), oldest first, with their verdicts.
    #[serde(default)]
    pub review_rounds: Vec<crate::core::record::ReviewRound>,
    /// Paused or needs-human.
    pub hold: Option<Hold>,
    /// `/shepherd agents on` (policy `agent_authors`): who let the agents in and when,
    /// and the last refused one; absent when neither happened.
    #[serde(default)]
    pub agents: Option<String>,
    /// The budget hold (`over-budget`: the cap, what it left, the reset) and what a
    /// `/shepherd budget` grant left (issue 28); absent when neither.
    #[serde(default)]
    pub budget: Option<String>,
    /// What a previous dispatcher left (`core::legacy`): "claimed elsewhere: … since …,
    /// until …" while a claim label Shepherd did not set holds the PR, the tier and
    /// attempts carried over; absent when none.
    #[serde(default)]
    pub legacy: Option<String>,
    /// Effects not yet done by the executors.
    pub pending_effects: Vec<PendingEffect>,
    /// Timers scheduled for this PR.
    pub timers: Vec<TimerView>,
    /// The last history entries, newest first.
    pub history: Vec<BTreeMap<String, String>>,
    /// The work item in the agent runners (`shepherd agents`): the active one, else
    /// the latest attempt's, when a runner took it.
    #[serde(default)]
    pub agent: Option<AgentView>,
    /// What the PR's agent runs cost (the ledger): its lifetime figures and each run
    /// counted, with its usage, oldest first.
    #[serde(default)]
    pub costs: Option<PrCosts>,
    /// The record itself.
    pub record: serde_json::Value,
}

/// A PR's agent runs and what they cost (`store::ledger`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PrCosts {
    /// The PR's lifetime figures.
    pub total: Cost,
    /// Each run counted, oldest first.
    pub runs: Vec<RunEntry>,
}

/// A work item as an agent runner sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentView {
    /// The runner's record: state, runner, model, times, outcome.
    pub run: AgentRun,
    /// The end of the agent's captured output, while it is kept.
    pub log_tail: Option<String>,
}

/// Bytes of an agent's log shown by `inspect`.
const LOG_TAIL_BYTES: usize = 2000;

/// An effect waiting for the executors.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingEffect {
    /// Effects-stream id.
    pub entry: String,
    /// Effect id.
    pub id: String,
    /// Effect kind.
    pub kind: String,
    /// `queued` (not delivered yet) or `in-progress` (delivered, not acknowledged).
    pub state: String,
}

/// A scheduled timer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimerView {
    /// Timer id within the record.
    pub id: String,
    /// Due time (unix ms).
    pub due_ms: i64,
}

/// What `inspect` answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum InspectReport {
    /// One PR.
    Pr(Box<Inspection>),
    /// Every open PR of a repository.
    Repo(Vec<PrSummary>),
    /// One issue (`issue-impl` work, what blocks it).
    Issue(Box<super::inspect_issue::IssueInspection>),
}

/// Inspects `owner/repo#N` or `owner/repo`.
pub async fn inspect(ops: &Ops, target: &str) -> Result<InspectReport, OpsError> {
    if target.contains('#') {
        let t = parse_pr(target)?;
        // PRs and issues share the index space: a number is one or the other.
        return match inspect_pr(ops, &t).await {
            Err(OpsError::NotFound(e)) => match super::inspect_issue::inspect_issue(ops, &t).await?
            {
                Some(i) => Ok(InspectReport::Issue(Box::new(i))),
                None => Err(OpsError::NotFound(e)),
            },
            other => Ok(InspectReport::Pr(Box::new(other?))),
        };
    }
    let repo = parse_repo(target)?;
    Ok(InspectReport::Repo(status::repo_prs(ops, &repo).await?))
}

/// One PR in depth.
#[tracing::instrument(skip_all, fields(repo = %t.repo, pr = t.number))]
pub async fn inspect_pr(ops: &Ops, t: &PrTarget) -> Result<Inspection, OpsError> {
    let repo = t.repo.as_str();
    let key = ops.keys.pr_record(repo, t.number);
    let record = super::replay::load_pr(ops, &key)
        .await?
        .ok_or_else(|| OpsError::NotFound(format!("no record for {t}")))?;
    let mut conn = ops.conn();
    let now = now_ms();
    let hist_key = ops.keys.history(repo, t.number);
    let summary = status::summarize(ops, &mut conn, &record, &hist_key, now).await?;
    let head = record.head_sha().cloned();
    let ci = head
        .as_ref()
        .and_then(|h| record.ci.get(h))
        .map(|c| c.contexts.values().cloned().collect())
        .unwrap_or_default();
    let reviews = record
        .reviews
        .as_ref()
        .map(|r| r.latest.values().cloned().collect())
        .unwrap_or_default();
    let shard = ops.keys.shard_of(repo);
    let history = archive::scan_rev(&mut conn, &hist_key, HISTORY_SHOWN)
        .await?
        .into_iter()
        .map(|e| e.fields.into_iter().collect())
        .collect();
    let work_id = record
        .work
        .active
        .as_ref()
        .map(|a| a.item.id.to_string())
        .or_else(|| record.work.attempts.last().map(|a| a.work_id.to_string()));
    let agent = match work_id {
        Some(id) => agent_view(ops, &mut conn, &id).await?,
        None => None,
    };
    let (total, runs) = ledger::subject(&mut conn, &ops.keys, false, &t.repo, t.number).await?;
    Ok(Inspection {
        agent,
        costs: (!runs.is_empty()).then(|| PrCosts {
            total: total.into(),
            runs,
        }),
        summary,
        head_sha: head.map(|h| h.to_string()),
        ci,
        reviews,
        attempts: record.work.attempts.clone(),
        attempts_dropped: record.work.attempts_dropped,
        review_rounds: record.agent_review.rounds.clone(),
        hold: record.work.hold.clone(),
        agents: agents_line(&record),
        budget: budget_line(&record.work),
        legacy: crate::core::legacy::summary(&record.work),
        pending_effects: pending_effects(&mut conn, &ops.keys.effects(shard), &key).await?,
        timers: timers(&mut conn, ops, shard, &key).await?,
        history,
        record: serde_json::to_value(&record).map_err(anyhow::Error::from)?,
    })
}

/// The `agents` line of a record: `/shepherd agents on` given and refused.
fn agents_line(record: &crate::core::record::PrRecord) -> Option<String> {
    let on = record
        .agents_on
        .as_ref()
        .map(|a| format!("on by @{} at {}", a.by, rfc3339(a.at_ms)));
    let refused = record.agents_on_refused.as_ref().map(|a| {
        format!(
            "refused for @{} at {} (no write access)",
            a.by,
            rfc3339(a.at_ms)
        )
    });
    let parts: Vec<String> = on.into_iter().chain(refused).collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The agent runners' record of work item `id` and the end of its log.
async fn agent_view(ops: &Ops, conn: &mut Conn, id: &str) -> Result<Option<AgentView>, OpsError> {
    let Some(run) = agent_runs::load(conn, &ops.keys, id).await? else {
        return Ok(None);
    };
    let log_tail = agent_runs::load_log(conn, &ops.keys, id).await?.map(|log| {
        let mut start = log.len().saturating_sub(LOG_TAIL_BYTES);
        while !log.is_char_boundary(start) {
            start += 1;
        }
        log[start..].to_owned()
    });
    Ok(Some(AgentView { run, log_tail }))
}

/// Effects of record `key` not yet acknowledged by the executors.
async fn pending_effects(
    conn: &mut Conn,
    stream: &str,
    key: &str,
) -> Result<Vec<PendingEffect>, OpsError> {
    let group = streams::group_figures(conn, stream, EXECUTORS_GROUP).await;
    let last = group.ok().flatten().map(|g| g.last_delivered_id);
    let mine = |e: &Archived| e.field(effect_fields::RECORD) == key;
    let view = |e: Archived, state: &str| PendingEffect {
        id: e.field(effect_fields::ID).to_owned(),
        kind: e.field(effect_fields::KIND).to_owned(),
        entry: e.id,
        state: state.to_owned(),
    };
    let mut out = Vec::new();
    let Some(last) = last else {
        // No executor has ever read the stream: everything is queued.
        let all = archive::scan(conn, stream, "-", "+", mine).await?;
        return Ok(all.into_iter().map(|e| view(e, "queued")).collect());
    };
    let pending = streams::pending_ids(conn, stream, EXECUTORS_GROUP, PENDING_SCAN).await?;
    for id in pending {
        if let Some(e) = archive::entry(conn, stream, &id).await?
            && mine(&e)
        {
            out.push(view(e, "in-progress"));
        }
    }
    let queued = archive::scan(conn, stream, &format!("({last}"), "+", mine).await?;
    out.extend(queued.into_iter().map(|e| view(e, "queued")));
    Ok(out)
}

/// Timers of record `key` (members `<key>/<timer id>` of the shard's timers set).
pub(super) async fn timers(
    conn: &mut Conn,
    ops: &Ops,
    shard: u16,
    key: &str,
) -> Result<Vec<TimerView>, OpsError> {
    let all = store_timers::scheduled(conn, &ops.keys, shard).await?;
    let prefix = format!("{key}/");
    Ok(all
        .into_iter()
        .filter_map(|(m, due)| {
            m.strip_prefix(&prefix).map(|id| TimerView {
                id: id.to_owned(),
                due_ms: due,
            })
        })
        .collect())
}

/// The budget line of `inspect`: the `over-budget` hold and the grant left.
fn budget_line(work: &crate::core::record::WorkState) -> Option<String> {
    let b = &work.budget;
    let mut parts = Vec::new();
    if let Some(h) = &b.hold {
        parts.push(format!(
            "{} (since {})",
            crate::core::texts::over_budget(&h.stop),
            crate::ops::timefmt::rfc3339(h.since_ms)
        ));
    }
    if !b.grant.is_empty() {
        parts.push(format!(
            "grant left: {} and {} tokens",
            crate::core::texts::dollars(b.grant.usd_micros),
            b.grant.tokens
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Human-readable rendering of one PR.
pub fn render_pr(i: &Inspection, now: i64) -> String {
    let s = &i.summary;
    let mut out = format!("{}#{}  {}\n", s.repo, s.number, s.title);
    let age = s
        .phase_since_ms
        .map(|t| format!(" (for {})", duration(now - t)))
        .unwrap_or_default();
    out += &format!("phase     {}{age} — {}\n", s.phase, s.reason);
    out += &format!("version   {}\n", s.version);
    out += &format!("head      {}\n", i.head_sha.as_deref().unwrap_or("-"));
    out += &format!(
        "tier      {} ({}), {} attempts\n",
        s.tier, s.tier_name, s.attempts
    );
    if let Some(r) = &s.review {
        out += &format!("review    {}\n", r.line());
    }
    if let Some(a) = &i.agents {
        out += &format!("agents    {a}\n");
    }
    if let Some(l) = &i.legacy {
        out += &format!("legacy    {l}\n");
    }
    if let Some(b) = &i.budget {
        out += &format!("budget    {b}\n");
    }
    if let Some(q) = &s.merge_queue {
        out += &format!(
            "queue     {} for {} (entered {} ago)\n",
            q.line(),
            duration(now - q.since_ms),
            duration(now - q.entered_ms)
        );
    }
    match &s.active {
        Some(a) => {
            out += &format!(
                "work      {} {} tier {} ({}), claim expires {} (in {})\n",
                a.kind,
                a.id,
                a.tier,
                a.tier_name,
                rfc3339(a.expires_ms),
                duration(a.expires_ms - now)
            )
        }
        None => out += "work      none\n",
    }
    if let Some(a) = &i.agent {
        out += &render_agent(a, now);
    }
    if let Some(c) = &i.costs {
        out += &render_costs(c);
    }
    if let Some(h) = &i.hold {
        out += &format!(
            "hold      {}\n",
            serde_json::to_string(h).unwrap_or_default()
        );
    }
    out + &render_lists(i)
}

/// The `agent` lines of [`render_pr`]: the runner's state of the work item and the end
/// of its output.
fn render_agent(a: &AgentView, now: i64) -> String {
    let r = &a.run;
    let since = r.started_ms.unwrap_or(r.taken_ms);
    let mut out = format!(
        "agent     {} {} on {} for {} (agent {}, model {}), deadline {}\n",
        r.work_id,
        r.state.as_str(),
        r.runner,
        duration(r.ended_ms.unwrap_or(now) - since),
        r.agent,
        r.model,
        rfc3339(r.deadline_ms)
    );
    if let Some(o) = &r.outcome {
        out += &format!(
            "          outcome {o} {}\n",
            r.signature.as_deref().unwrap_or("")
        );
    }
    if let Some(n) = &r.note {
        out += &format!("          {n}\n");
    }
    if let Some(tail) = &a.log_tail {
        out += "agent output (end)\n";
        for line in tail.lines() {
            out += &format!("  | {line}\n");
        }
    }
    out
}

/// The `cost` lines of [`render_pr`]: the PR's cost so far and each run's usage.
fn render_costs(c: &PrCosts) -> String {
    let t = &c.total;
    let mut out = format!(
        "cost      ${} so far, {} runs ({} input, {} output tokens)\n",
        dollars(t.usd_micros),
        t.runs,
        t.input_tokens,
        t.output_tokens
    );
    for r in &c.runs {
        let u = &r.usage;
        out += &format!(
            "  run     {} {} tier {} {} at {}: ${}, {} in / {} out / {} reasoning / {} cache-read / \
             {} cache-write tokens, {} steps, {} tool calls, {}, model {}\n",
            r.work_id,
            r.kind,
            r.tier,
            r.outcome,
            rfc3339(r.at_ms),
            dollars(u.cost_micros),
            u.input_tokens,
            u.output_tokens,
            u.reasoning_tokens,
            u.cache_read_tokens,
            u.cache_write_tokens,
            u.steps,
            u.tool_calls,
            duration(i64::try_from(u.wall_ms).unwrap_or(i64::MAX)),
            u.model.as_deref().unwrap_or("-")
        );
    }
    out
}

/// The list sections of [`render_pr`]: CI, reviews, attempts, effects, timers, history.
fn render_lists(i: &Inspection) -> String {
    let mut out = String::from("ci\n");
    for c in &i.ci {
        out += &format!("  {:?}  {}  {}\n", c.state, c.context, c.description);
    }
    out += "reviews\n";
    for r in &i.reviews {
        let flags = [
            (r.stale, " stale"),
            (r.dismissed, " dismissed"),
            (!r.official, " unofficial"),
        ];
        let f: String = flags
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, s)| *s)
            .collect();
        out += &format!("  {:?}  {}{f}\n", r.state, r.reviewer);
    }
    out += "attempts\n";
    if i.attempts_dropped > 0 {
        out += &format!(
            "  ({} older attempts counted, not kept)\n",
            i.attempts_dropped
        );
    }
    for a in &i.attempts {
        out += &format!(
            "  {} tier {} {} — {}\n",
            a.kind.as_str(),
            a.tier,
            a.outcome.as_str(),
            a.signature
        );
    }
    out += "review rounds\n";
    for (n, r) in i.review_rounds.iter().enumerate() {
        out += &format!(
            "  {} {} by {} on {} — {}\n",
            n + 1,
            r.work_id,
            r.reviewer,
            r.head_sha,
            r.verdict.map_or("no review read", |v| v.as_str())
        );
    }
    out += "pending effects\n";
    for e in &i.pending_effects {
        out += &format!("  {} {} {} ({})\n", e.entry, e.kind, e.id, e.state);
    }
    out += "timers\n";
    for t in &i.timers {
        out += &format!("  {} due {}\n", t.id, rfc3339(t.due_ms));
    }
    out += "history (newest first)\n";
    for h in &i.history {
        let get = |k: &str| h.get(k).map_or("", String::as_str);
        let at = get("at").parse().map(rfc3339).unwrap_or_default();
        let replay = if get("replay").is_empty() {
            String::new()
        } else {
            format!(" [replay of {}]", get("replay"))
        };
        out += &format!(
            "  {at} v{} {}{replay}: {}\n",
            get("version"),
            get("event"),
            get("note")
        );
    }
    out
}

/// One line per PR.
pub fn render_line(s: &PrSummary, now: i64) -> String {
    let age = s
        .phase_since_ms
        .map(|t| duration(now - t))
        .unwrap_or_else(|| "?".into());
    let work = s
        .active
        .as_ref()
        .map(|a| {
            format!(
                "  work {} tier {} until {}",
                a.kind,
                a.tier_name,
                rfc3339(a.expires_ms)
            )
        })
        .unwrap_or_default();
    let queue = s
        .merge_queue
        .as_ref()
        .map(|q| format!("  queue {}", q.line()))
        .unwrap_or_default();
    format!(
        "#{:<5} {:<16} {:>7}  {}{work}{queue}  — {}",
        s.number, s.phase, age, s.title, s.reason
    )
}

/// The phase of a record now (for callers outside this module).
pub fn phase_of(ops: &Ops, record: &PrRecord) -> String {
    let policy = ops.policy.for_repo(&record.repo);
    decide(record, &policy, now_ms()).phase.as_str().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::budget::{Grant, Stop};
    use crate::core::record::{BudgetHold, WorkState};

    #[test]
    fn the_budget_line_names_the_cap_the_reset_and_the_grant() {
        assert_eq!(budget_line(&WorkState::default()), None);
        let mut work = WorkState::default();
        work.budget.hold = Some(BudgetHold {
            stop: Stop {
                cap: "org-monthly-usd".into(),
                left: 0,
                needed: 0,
                tokens: false,
                // 2031-01-01 00:00 UTC.
                resets_at_ms: Some(1_924_992_000_000),
            },
            since_ms: 1_924_900_000_000,
        });
        work.budget.grant = Grant {
            usd_micros: 2_500_000,
            tokens: 0,
        };
        let line = budget_line(&work).unwrap();
        assert!(line.contains("`org-monthly-usd` is reached"), "{line}");
        assert!(line.contains("resumes at 2031-01-01 00:00 UTC"), "{line}");
        assert!(line.contains("grant left: $2.50 and 0 tokens"), "{line}");
    }
}
