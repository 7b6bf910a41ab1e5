//! `GET /`: a read-only status page, server-rendered HTML with no JavaScript, that
//! refreshes itself every [`REFRESH_SECS`] (`<meta http-equiv="refresh">`).
//!
//! It shows open PRs grouped by phase (reason, age of the phase, tier, active work
//! and claim expiry), the PRs that need a human, the agents running in the agent
//! runners, the agents' spending (per repository today, this month and the budget
//! left; the most expensive open PRs), queue depth and lag of every consumer group,
//! the dead-letter count and the last resync time — the figures of [`crate::ops::status::overview`].
//!
//! Access: off (404, stated in a log line at start) when no `SHEPHERD_ADMIN_TOKEN` is
//! set, never public; otherwise the admin token as
//! `Authorization: Bearer …`, or — for a browser, which cannot set headers on a plain
//! link — as `/?token=…` (the refresh keeps the query). Prefer the header where you
//! can: a token in a URL can end up in browser history and proxy logs.

use std::fmt::Write as _;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;

use super::admin::{AdminError, check};
use crate::ops::costs::{BudgetLeft, Cost, dollars};
use crate::ops::status::{Overview, PrSummary, by_phase};
use crate::ops::timefmt::{duration, rfc3339};
use crate::ops::{Ops, OpsError};

/// Seconds between automatic refreshes.
pub const REFRESH_SECS: u32 = 15;

/// Query of the status page.
#[derive(Debug, Deserialize)]
pub struct PageQuery {
    /// The admin token, for browsers.
    #[serde(default)]
    token: Option<String>,
}

/// The handler.
pub async fn page(
    ops: web::Data<Ops>,
    req: HttpRequest,
    query: web::Query<PageQuery>,
) -> HttpResponse {
    // Without an admin token the page does not exist (404): it shows PR titles and
    // work ids, which are not for the public (issue 12, finding 8).
    if let Err(e) = check(&ops.config, &req, query.token.as_deref()) {
        return text_error(&e);
    }
    match crate::ops::status::overview(&ops).await {
        Ok(o) => HttpResponse::Ok()
            .content_type("text/html; charset=utf-8")
            .insert_header(("Cache-Control", "no-store"))
            .body(render(&o)),
        Err(e) => text_error(&AdminError::Ops(e)),
    }
}

/// A short HTML error page with the admin API's status for the same error.
fn text_error(e: &AdminError) -> HttpResponse {
    use actix_web::ResponseError as _;
    let status = e.status_code();
    let message = match e {
        AdminError::Ops(OpsError::Store(_)) => "Redis is unavailable; this page retries.",
        AdminError::Ops(_) => "The status could not be computed (see the server log).",
        AdminError::Unauthorized => "Give the admin token: Authorization: Bearer … or /?token=…",
        AdminError::Forbidden => "Wrong admin token.",
        AdminError::Disabled => "Not found.",
        AdminError::Body(_) => "Bad request.",
    };
    let refresh = if status == StatusCode::SERVICE_UNAVAILABLE {
        format!("<meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">")
    } else {
        String::new()
    };
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(format!(
            "<!doctype html><html><head><meta charset=\"utf-8\">{refresh}<title>Shepherd</title></head>\
             <body><h1>Shepherd</h1><p>{}</p></body></html>",
            esc(message)
        ))
}

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Inline stylesheet (no external resources).
const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}\
h1{margin:0 0 .3rem}h2{margin:1.4rem 0 .4rem;font-size:1.15rem}\
table{border-collapse:collapse;width:100%;margin-bottom:.5rem}\
th,td{text-align:left;padding:.3rem .6rem;border-bottom:1px solid #ddd;font-size:.92rem}\
th{background:#f3f3f3}.muted{color:#666}.phase{font-family:monospace}\
.cards{display:flex;gap:1rem;flex-wrap:wrap}.card{border:1px solid #ddd;border-radius:6px;padding:.5rem .9rem}\
.card b{display:block;font-size:1.4rem}.alert{color:#a00}";

/// The whole page.
pub fn render(o: &Overview) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
         <title>Shepherd status</title><style>{STYLE}</style></head><body>\
         <h1>Shepherd</h1><p class=\"muted\">as of {} · refreshes every {REFRESH_SECS} s</p>",
        rfc3339(o.now_ms)
    );
    cards(&mut h, o);
    needs_human(&mut h, o);
    phases(&mut h, o);
    merge_queues(&mut h, o);
    active_work(&mut h, o);
    running_agents(&mut h, o);
    spend(&mut h, o);
    queues(&mut h, o);
    h.push_str("</body></html>\n");
    h
}

/// The headline figures.
fn cards(h: &mut String, o: &Overview) {
    let events_lag: u64 = o
        .queues
        .iter()
        .filter(|q| q.group == "workers")
        .map(|q| q.lag.unwrap_or(0) + q.pending)
        .sum();
    let resync = o
        .last_resync_ms
        .map(|t| format!("{} ago", duration(o.now_ms - t)))
        .unwrap_or_else(|| "never".into());
    let dl_class = if o.dead_letters > 0 { " alert" } else { "" };
    let (forgejo_class, forgejo) = match o.forgejo_circuit_open_ms {
        Some(ms) => (
            " alert",
            format!("circuit open, next try in {}", duration(ms)),
        ),
        None => ("", "ok".to_owned()),
    };
    let _ = write!(
        h,
        "<div class=\"cards\">\
         <div class=\"card\" id=\"open-prs\"><b>{}</b>open PRs</div>\
         <div class=\"card\" id=\"events-backlog\"><b>{events_lag}</b>events waiting</div>\
         <div class=\"card{dl_class}\" id=\"dead-letters\"><b>{}</b>dead letters</div>\
         <div class=\"card\" id=\"last-resync\"><b>{}</b>last resync</div>\
         <div class=\"card{forgejo_class}\" id=\"forgejo\"><b>{}</b>Forgejo API</div></div>",
        o.prs.len(),
        o.dead_letters,
        esc(&resync),
        esc(&forgejo)
    );
}

/// PRs in `needs-human`.
fn needs_human(h: &mut String, o: &Overview) {
    let stuck: Vec<&PrSummary> = o.prs.iter().filter(|p| p.phase == "needs-human").collect();
    let _ = write!(
        h,
        "<h2 id=\"needs-human\">Needs a human ({})</h2>",
        stuck.len()
    );
    if stuck.is_empty() {
        h.push_str("<p class=\"muted\">Nobody is stuck.</p>");
        return;
    }
    h.push_str("<table><tr><th>PR</th><th>Title</th><th>Why</th><th>For</th></tr>");
    for p in stuck {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            pr_ref(p),
            esc(&p.title),
            esc(&p.reason),
            age(o, p)
        );
    }
    h.push_str("</table>");
}

/// Open PRs grouped by phase.
fn phases(h: &mut String, o: &Overview) {
    h.push_str("<h2>Open pull requests by phase</h2>");
    if o.prs.is_empty() {
        h.push_str("<p class=\"muted\">No open pull requests.</p>");
    }
    for (phase, prs) in by_phase(&o.prs) {
        let _ = write!(
            h,
            "<h3 class=\"phase\" id=\"phase-{0}\">{0} ({1})</h3><table>\
             <tr><th>PR</th><th>Title</th><th>Reason</th><th>In phase for</th><th>Tier</th><th>Work</th><th>Agent review</th></tr>",
            esc(&phase),
            prs.len()
        );
        for p in prs {
            let _ = write!(
                h,
                "<tr class=\"pr\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ({})</td><td>{}</td><td>{}</td></tr>",
                pr_ref(p),
                esc(&p.title),
                esc(&p.reason),
                age(o, p),
                p.tier,
                esc(&p.tier_name),
                p.active.as_ref().map_or("—".to_owned(), |a| esc(&a.kind)),
                p.review.as_ref().map_or("—".to_owned(), |r| esc(&r.line()))
            );
        }
        h.push_str("</table>");
    }
}

/// The merge queue of each branch that has one: position, PR, state, priority, time
/// in queue (in its current state, and since it first entered).
fn merge_queues(h: &mut String, o: &Overview) {
    if o.merge_queues.is_empty() {
        return;
    }
    h.push_str("<h2 id=\"merge-queues\">Merge queues</h2>");
    for q in &o.merge_queues {
        let ejections: Vec<String> = (q.ejections.iter())
            .map(|(reason, n)| format!("{} {n}", esc(reason)))
            .collect();
        let _ = write!(
            h,
            "<h3 id=\"queue-{0}-{1}\">{0} · {1} ({2} in line, {3} merged{4})</h3>",
            esc(&q.repo),
            esc(&q.branch),
            q.entries
                .iter()
                .filter(|(_, s)| s.position.is_some())
                .count(),
            q.merged,
            match ejections.is_empty() {
                true => String::new(),
                false => format!(", ejections: {}", ejections.join(", ")),
            }
        );
        queue_analytics(h, q);
        if q.entries.is_empty() {
            h.push_str("<p class=\"muted\">Empty.</p>");
            continue;
        }
        h.push_str(
            "<table><tr><th>Position</th><th>PR</th><th>State</th><th>Priority</th>\
             <th>In this state for</th><th>In queue for</th></tr>",
        );
        for (number, s) in &q.entries {
            let _ = write!(
                h,
                "<tr class=\"queued\"><td>{}</td><td>{}#{number}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td></tr>",
                s.position.map_or("—".to_owned(), |p| p.to_string()),
                esc(&q.repo),
                esc(&s.state),
                esc(&s.priority),
                duration(o.now_ms - s.since_ms),
                duration(o.now_ms - s.entered_ms)
            );
        }
        h.push_str("</table>");
    }
}

/// A queue's freeze (why, until when) and its analytics: time in queue over the last
/// 24 h and 7 d.
fn queue_analytics(h: &mut String, q: &crate::ops::status::BranchQueueSummary) {
    if let Some(frozen) = &q.frozen {
        let _ = write!(h, "<p class=\"frozen\">Frozen: {}.</p>", esc(frozen));
    }
    let secs = |ms: u64| duration(i64::try_from(ms).unwrap_or(i64::MAX));
    h.push_str(
        "<table class=\"queue-analytics\"><tr><th>Time in queue</th><th>Merged</th>\
         <th>p50</th><th>p90</th><th>max</th></tr>",
    );
    for (window, w) in [("last 24 h", &q.waits_day), ("last 7 days", &q.waits_week)] {
        let _ = write!(
            h,
            "<tr><td>{window}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            w.count,
            secs(w.p50_ms),
            secs(w.p90_ms),
            secs(w.max_ms)
        );
    }
    h.push_str("</table>");
    let mut batch = Vec::new();
    if let Some((green, tested)) = q.first_pass {
        let pct = green as f64 * 100.0 / tested.max(1) as f64;
        batch.push(format!("first-pass success {green}/{tested} ({pct:.0}%)"));
    }
    if let Some(runs) = q.ci_runs_per_merge {
        batch.push(format!("CI runs per merged PR {runs:.2}"));
    }
    if q.flaky.0 > 0 {
        batch.push(format!(
            "flaky re-tests {} (saved {})",
            q.flaky.0, q.flaky.1
        ));
    }
    if !batch.is_empty() {
        let _ = write!(
            h,
            "<p class=\"queue-batches\">Batches: {}.</p>",
            batch.join(", ")
        );
    }
    if !q.flaky_checks.is_empty() {
        let checks: Vec<String> = (q.flaky_checks.iter())
            .map(|(c, n)| format!("<li>{} ({n})</li>", esc(c)))
            .collect();
        let _ = write!(
            h,
            "<p>Suspected flaky checks (failed, then passed on a re-test):</p><ul class=\"flaky-checks\">{}</ul>",
            checks.concat()
        );
    }
}

/// Active work items with tier and claim expiry.
fn active_work(h: &mut String, o: &Overview) {
    let active: Vec<&PrSummary> = o.prs.iter().filter(|p| p.active.is_some()).collect();
    let _ = write!(
        h,
        "<h2 id=\"active-work\">Active work ({})</h2>",
        active.len()
    );
    if active.is_empty() {
        h.push_str("<p class=\"muted\">No work dispatched.</p>");
        return;
    }
    h.push_str("<table><tr><th>PR</th><th>Kind</th><th>Tier</th><th>Work id</th><th>Claim expires</th></tr>");
    for p in active {
        let Some(a) = &p.active else { continue };
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{} ({})</td><td class=\"muted\">{}</td><td>{} (in {})</td></tr>",
            pr_ref(p),
            esc(&a.kind),
            a.tier,
            esc(&a.tier_name),
            esc(&a.id),
            rfc3339(a.expires_ms),
            duration(a.expires_ms - o.now_ms)
        );
    }
    h.push_str("</table>");
}

/// The work items the agent runners hold: running ones first, then waiting ones.
fn running_agents(h: &mut String, o: &Overview) {
    let _ = write!(
        h,
        "<h2 id=\"running-agents\">Running agents ({})</h2>",
        o.agents
            .iter()
            .filter(|a| a.state.as_str() == "running")
            .count()
    );
    let mut unsandboxed: Vec<&str> = o
        .agents
        .iter()
        .filter(|a| a.unsandboxed)
        .map(|a| a.runner.as_str())
        .chain(o.unsandboxed_runners.iter().map(String::as_str))
        .collect();
    unsandboxed.sort_unstable();
    unsandboxed.dedup();
    if !unsandboxed.is_empty() {
        let _ = write!(
            h,
            "<p class=\"warn\"><strong>agents unsandboxed</strong> \
             (SHEPHERD_AGENT_SANDBOX=off) on runner {}: their agents can read the runner's \
             secrets and outlive their work items.</p>",
            esc(&unsandboxed.join(", "))
        );
    }
    if o.agents.is_empty() {
        h.push_str("<p class=\"muted\">No agent runner holds work.</p>");
        return;
    }
    h.push_str(
        "<table><tr><th>Work item</th><th>Kind</th><th>Tier</th><th>Model</th><th>State</th>\
         <th>For</th><th>Deadline</th><th>Runner</th><th>Work id</th></tr>",
    );
    for a in &o.agents {
        let since = a.started_ms.unwrap_or(a.taken_ms);
        let _ = write!(
            h,
            "<tr class=\"agent\"><td>{}#{}</td><td>{}</td><td>{} ({})</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>in {}</td><td class=\"muted\">{}</td><td class=\"muted\">{}</td></tr>",
            esc(&a.repo),
            a.number,
            esc(&a.kind),
            a.tier,
            esc(&a.tier_name),
            esc(&a.model),
            agent_state(a),
            duration(o.now_ms - since),
            duration(a.deadline_ms - o.now_ms),
            esc(&a.runner),
            esc(&a.work_id)
        );
    }
    h.push_str("</table>");
}

/// Agent spending: per repository today, this month and the budget its caps leave;
/// the most expensive open PRs.
fn spend(h: &mut String, o: &Overview) {
    h.push_str("<h2 id=\"spend\">Agent spending</h2>");
    if o.spend.is_empty() {
        h.push_str("<p class=\"muted\">No agent run counted this month.</p>");
    } else {
        h.push_str(
            "<table><tr><th>Repository</th><th>Today</th><th>This month</th>\
             <th>Budget left</th></tr>",
        );
        for r in &o.spend {
            let _ = write!(
                h,
                "<tr class=\"spend\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&r.repo),
                cost_cell(&r.today),
                cost_cell(&r.month),
                budget_cell(r.budget_left.as_ref())
            );
        }
        h.push_str("</table>");
    }
    if o.expensive_prs.is_empty() {
        return;
    }
    h.push_str(
        "<h3 id=\"expensive-prs\">Most expensive open PRs</h3><table><tr><th>PR</th>\
         <th>Title</th><th>Phase</th><th>Cost so far</th></tr>",
    );
    for p in &o.expensive_prs {
        let _ = write!(
            h,
            "<tr class=\"expensive\"><td>{}#{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&p.repo),
            p.number,
            esc(&p.title),
            esc(&p.phase),
            cost_cell(&p.cost)
        );
    }
    h.push_str("</table>");
}

/// `$1.234567 · 3 runs · 12000 tokens`.
fn cost_cell(c: &Cost) -> String {
    format!(
        "${} · {} runs · {} tokens",
        dollars(c.usd_micros),
        c.runs,
        c.input_tokens.saturating_add(c.output_tokens)
    )
}

/// What the repository's caps leave (`—` without a cap); past a cap in red.
fn budget_cell(b: Option<&BudgetLeft>) -> String {
    let Some(b) = b else {
        return "—".to_owned();
    };
    let mut parts = Vec::new();
    if let (Some(left), Some(scope)) = (b.usd_micros, &b.usd_scope) {
        parts.push(if left < 0 {
            format!(
                "<span class=\"alert\">over by ${} ({scope})</span>",
                dollars(left.unsigned_abs())
            )
        } else {
            format!("${} ({scope})", dollars(left.unsigned_abs()))
        });
    }
    if let (Some(left), Some(scope)) = (b.tokens, &b.tokens_scope) {
        parts.push(if left < 0 {
            format!(
                "<span class=\"alert\">over by {} tokens ({scope})</span>",
                -left
            )
        } else {
            format!("{left} tokens ({scope})")
        });
    }
    parts.join(" · ")
}

/// A held work item's state, with the volume cap that holds a waiting one back
/// (issue 28: the note of its entry in the runners' table says which).
fn agent_state(a: &crate::store::agent_runs::AgentRun) -> String {
    match (&a.state, &a.note) {
        (crate::store::agent_runs::RunState::Waiting, Some(note)) => {
            format!("{} ({})", a.state.as_str(), esc(note))
        }
        _ => a.state.as_str().to_owned(),
    }
}

/// Queue depth and lag per stream and group.
fn queues(h: &mut String, o: &Overview) {
    h.push_str(
        "<h2 id=\"queues\">Queues</h2><table><tr><th>Stream</th><th>Group</th><th>Length</th>\
         <th>Lag (not yet delivered)</th><th>Pending (unacknowledged)</th><th>Consumers</th></tr>",
    );
    for q in &o.queues {
        let lag = q.lag.map_or("?".to_owned(), |l| l.to_string());
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{lag}</td><td>{}</td><td>{}</td></tr>",
            esc(&q.stream),
            esc(&q.group),
            q.length,
            q.pending,
            q.consumers
        );
    }
    h.push_str("</table>");
}

/// `owner/repo#N`.
fn pr_ref(p: &PrSummary) -> String {
    format!("{}#{}", esc(&p.repo), p.number)
}

/// How long the PR has been in its phase.
fn age(o: &Overview, p: &PrSummary) -> String {
    p.phase_since_ms
        .map_or("?".to_owned(), |t| duration(o.now_ms - t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::status::ActiveSummary;
    use crate::store::agent_runs::{AgentRun, RunState};

    fn pr(n: u64, phase: &str) -> PrSummary {
        PrSummary {
            repo: "o/r".into(),
            number: n,
            title: format!("Fix <thing> {n}"),
            phase: phase.into(),
            reason: "because".into(),
            phase_since_ms: Some(1_000),
            tier: 1,
            tier_name: "codex".into(),
            attempts: 0,
            active: None,
            version: 3,
            review: None,
            merge_queue: None,
        }
    }

    #[test]
    fn renders_merge_queues_per_branch() {
        use crate::core::queue::{BranchQueue, Ejection, Priority, QueueAction, QueueOp};
        let mut q = BranchQueue::new("main");
        let op = |number, version, action| QueueOp {
            branch: "main".into(),
            number,
            version,
            action,
        };
        let join = |priority| QueueAction::Join { priority };
        q.apply(&op(7, 1, join(Priority::Normal)), 1_000);
        q.apply(&op(8, 1, join(Priority::Normal)), 2_000);
        q.apply(&op(9, 1, join(Priority::High)), 3_000);
        let park = QueueAction::Park {
            reason: Ejection::CiFailed,
        };
        q.apply(&op(8, 2, park), 4_000);
        // Four merges: 10 s, 20 s, 30 s and 40 s in queue.
        for wait in [10_000, 20_000, 30_000, 40_000] {
            q.stats.record_merge(60_000, wait);
        }
        let freeze = crate::core::queue::freeze::FreezeOp {
            branch: "main".into(),
            by: "alice".into(),
            action: crate::core::queue::freeze::FreezeAction::Freeze {
                reason: "release <2.0>".into(),
            },
        };
        q.apply_freeze(&freeze, 5_000);
        q.stats.batches_first_tested = 4;
        q.stats.batches_first_pass_green = 3;
        q.stats.ci_runs = 6;
        q.stats.flaky_retries = 1;
        q.stats.flaky_saved = 1;
        q.stats.flaky_checks.insert("ci / <e2e>".into(), 1);
        let summary = crate::ops::status::queue_summary("o/r", &q, &[], 63_000);
        let order: Vec<(u64, &str)> = (summary.entries.iter())
            .map(|(n, s)| (*n, s.state.as_str()))
            .collect();
        assert_eq!(
            order,
            [(7, "testing"), (9, "waiting"), (8, "parked: ci-failed")],
            "head, then priority, then the parked"
        );
        let o = Overview {
            now_ms: 63_000,
            merge_queues: vec![summary],
            ..Overview::default()
        };
        let html = render(&o);
        assert!(html.contains("id=\"merge-queues\""), "{html}");
        assert!(
            html.contains("Frozen: the merge queue of `main` is frozen (by @alice: release &lt;2.0&gt;) until `/shepherd unfreeze main`."),
            "{html}"
        );
        assert!(
            html.contains(
                "<tr><td>last 24 h</td><td>4</td><td>20s</td><td>40s</td><td>40s</td></tr>"
            ),
            "{html}"
        );
        assert!(
            html.contains("Batches: first-pass success 3/4 (75%), CI runs per merged PR 1.50, flaky re-tests 1 (saved 1)."),
            "{html}"
        );
        assert!(html.contains("<li>ci / &lt;e2e&gt; (1)</li>"), "{html}");
        assert!(
            html.contains("o/r · main (2 in line, 4 merged, ejections: ci-failed 1)"),
            "{html}"
        );
        let rows: Vec<&str> = html.split("<tr class=\"queued\">").skip(1).collect();
        assert_eq!(rows.len(), 3);
        assert!(
            rows[0]
                .starts_with("<td>1</td><td>o/r#7</td><td>testing</td><td>normal</td><td>1m</td>"),
            "{}",
            rows[0]
        );
        assert!(
            rows[1].starts_with("<td>2</td><td>o/r#9</td><td>waiting</td><td>high</td>"),
            "{}",
            rows[1]
        );
        assert!(
            rows[2].starts_with("<td>—</td><td>o/r#8</td><td>parked: ci-failed</td>"),
            "{}",
            rows[2]
        );
        let none = render(&Overview::default());
        assert!(!none.contains("merge-queues"), "no section without queues");
    }

    #[test]
    fn renders_groups_work_and_escapes() {
        let mut busy = pr(2, "ci-fix");
        busy.active = Some(ActiveSummary {
            id: "o/r/pr/2/w1".into(),
            kind: "ci-fix".into(),
            tier: 1,
            tier_name: "codex".into(),
            expires_ms: 7_201_000,
        });
        let mut reviewed = pr(1, "awaiting-review");
        reviewed.review = Some(crate::ops::status::ReviewSummary {
            round: 2,
            max_rounds: 3,
            reviewer: "rev<bot>".into(),
            verdict: Some("changes-requested".into()),
        });
        let o = Overview {
            now_ms: 61_000,
            prs: vec![reviewed, busy, pr(3, "needs-human")],
            dead_letters: 2,
            ..Overview::default()
        };
        let html = render(&o);
        assert!(html.contains("http-equiv=\"refresh\""));
        assert!(html.contains("Fix &lt;thing&gt; 1"));
        assert!(
            html.contains("<td>round 2/3 by rev&lt;bot&gt;: changes-requested</td>"),
            "{html}"
        );
        assert!(!html.contains("<thing>"));
        assert!(html.contains("id=\"phase-ci-fix\""));
        assert!(html.contains("id=\"phase-awaiting-review\""));
        assert!(html.contains("Needs a human (1)"));
        assert!(html.contains("Active work (1)"));
        assert!(html.contains("o/r#2"));
        assert!(html.contains("<b>2</b>dead letters"));
        assert!(html.contains("never"));
        assert!(html.contains("<b>ok</b>Forgejo API"));
        let open = render(&Overview {
            forgejo_circuit_open_ms: Some(12_000),
            ..o.clone()
        });
        assert!(open.contains("circuit open, next try in"), "{open}");
        assert!(!html.contains("<script"));
        assert!(html.find("phase-needs-human") < html.find("phase-awaiting-review"));
        assert!(html.contains("No agent runner holds work."));
        let run = AgentRun {
            work_id: "o:r:pr:2:1".into(),
            repo: "o/r".into(),
            number: 2,
            kind: "ci-fix".into(),
            tier: 1,
            tier_name: "codex".into(),
            model: "stub/<m>".into(),
            agent: "implementation-worker".into(),
            runner: "host-1-abc".into(),
            state: RunState::Running,
            pid: Some(42),
            taken_ms: 1_000,
            started_ms: Some(1_000),
            ended_ms: None,
            deadline_ms: 3_661_000,
            seen_ms: 60_000,
            outcome: None,
            signature: None,
            note: None,
            output_bytes: None,
            unsandboxed: false,
        };
        let unsandboxed = render(&Overview {
            agents: vec![AgentRun {
                unsandboxed: true,
                ..run.clone()
            }],
            ..o.clone()
        });
        assert!(
            unsandboxed.contains(
                "agents unsandboxed</strong> (SHEPHERD_AGENT_SANDBOX=off) on runner host-1-abc"
            ),
            "{unsandboxed}"
        );
        let busy = render(&Overview {
            agents: vec![run],
            ..o.clone()
        });
        assert!(busy.contains("Running agents (1)"), "{busy}");
        assert!(!busy.contains("agents unsandboxed"), "{busy}");
        assert!(busy.contains("<td>o/r#2</td><td>ci-fix</td><td>1 (codex)</td><td>stub/&lt;m&gt;</td><td>running</td>"), "{busy}");
        assert!(busy.contains("host-1-abc"));
        // An idle unsandboxed runner (no work held) is shown too.
        let idle = render(&Overview {
            unsandboxed_runners: vec!["host-2-def".into()],
            ..o.clone()
        });
        assert!(
            idle.contains(
                "agents unsandboxed</strong> (SHEPHERD_AGENT_SANDBOX=off) on runner host-2-def"
            ),
            "{idle}"
        );
        assert!(idle.contains("No agent runner holds work."), "{idle}");
    }

    #[test]
    fn renders_spending_per_repository_and_the_most_expensive_prs() {
        use crate::ops::costs::{PrSpend, RepoSpend};
        let cost = |usd_micros, runs| {
            Cost::from(crate::store::ledger::Figures {
                usd_micros,
                runs,
                input_tokens: 100,
                output_tokens: 20,
                ..Default::default()
            })
        };
        let quiet = render(&Overview::default());
        assert!(
            quiet.contains("No agent run counted this month."),
            "{quiet}"
        );
        assert!(!quiet.contains("Most expensive open PRs"));
        let o = Overview {
            spend: vec![
                RepoSpend {
                    repo: "o/r".into(),
                    today: cost(1_500_000, 2),
                    month: cost(9_000_000, 7),
                    budget_left: Some(BudgetLeft {
                        usd_micros: Some(-250_000),
                        usd_scope: Some("repo-daily".into()),
                        tokens: Some(800),
                        tokens_scope: Some("repo-monthly".into()),
                    }),
                },
                RepoSpend {
                    repo: "o/<x>".into(),
                    today: cost(0, 0),
                    month: cost(12, 1),
                    budget_left: None,
                },
            ],
            expensive_prs: vec![PrSpend {
                repo: "o/r".into(),
                number: 4,
                title: "Big <one>".into(),
                phase: "ci-fix".into(),
                cost: cost(4_000_000, 3),
            }],
            ..Overview::default()
        };
        let page = render(&o);
        assert!(
            page.contains(
                "<tr class=\"spend\"><td>o/r</td><td>$1.500000 · 2 runs · 120 tokens</td>\
                 <td>$9.000000 · 7 runs · 120 tokens</td><td><span class=\"alert\">over by \
                 $0.250000 (repo-daily)</span> · 800 tokens (repo-monthly)</td></tr>"
            ),
            "{page}"
        );
        assert!(page.contains("<td>o/&lt;x&gt;</td>"), "escaped: {page}");
        assert!(page.contains("<td>—</td></tr>"), "no cap: {page}");
        assert!(
            page.contains(
                "<tr class=\"expensive\"><td>o/r#4</td><td>Big &lt;one&gt;</td><td>ci-fix</td>\
                 <td>$4.000000 · 3 runs · 120 tokens</td></tr>"
            ),
            "{page}"
        );
    }
}
