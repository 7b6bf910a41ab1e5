//! One work item in a runner, from the check that it is still wanted to the report:
//!
//! 1. bound to the record? The work must be active in the work index and not yet
//!    reported (a reclaimed entry of a crashed runner whose result is already queued,
//!    or work cancelled or expired while it waited, never starts), the entry must be
//!    the owning record's active work in every field — repository, number, kind,
//!    head, attempt, reviewer ([`super::binding`]; checked again before a verdict is
//!    posted and before the result is recorded) — and its deadline — the claim's
//!    expiry minus `SHEPHERD_AGENT_DEADLINE_MARGIN_SECS` — not yet passed;
//! 2. context from Forgejo ([`super::context::gather`]; transient failures are retried
//!    a few times, then the entry is handed back: a Forgejo outage never counts as an
//!    attempt) and the prompt ([`super::prompt`]);
//! 3. a fresh folder with `prompt.md`, `work.json` and the result file's path (and,
//!    with `SHEPHERD_AGENT_CHECKOUT`, a clone of the PR's head as the working
//!    directory, [`super::checkout`]), the command line with its placeholders filled
//!    in, the allow-listed environment;
//! 4. the agent runs (its output so far stored every [`LOG_EVERY`], its usage metered
//!    live with `SHEPHERD_AGENT_USAGE`, [`super::usage`]) until it exits, the deadline
//!    passes (the group is stopped, `failed`/`timeout`), a limit of the work item is
//!    reached (budget, steps, tool calls, a loop, idleness: the group is killed at once,
//!    `failed` with the reason as signature and `stopped` set), or a stop comes
//!    (cancel notice, shutdown, the entry lost to another runner: the group is
//!    stopped and nothing is reported);
//! 5. its output (capped, secrets masked) is stored for the retention window, the
//!    result ([`super::outcome::decide`], with the run's usage) goes through
//!    `worker::results::submit` — exactly once per work id — and the folder is removed.

use std::ffi::OsString;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::instrument;

use anyhow::Context as _;

use super::binding::{self, Refusal, Stage};
use super::launch::{Capture, Invocation, Spawner};
use super::outcome::{self, Finish};
use super::prompt::{PromptParams, Templates};
use super::usage::{self, Live};
use super::{checkout, workdir};
use crate::config::{AgentsConfig, Config};
use crate::core::effect::WorkItem;
use crate::core::policy::PolicyFile;
use crate::core::usage::StopReason as Limit;
use crate::forgejo::ForgejoClient;
use crate::store::Store;
use crate::store::agent_runs::{self, AgentRun, RunState};
use crate::telemetry::Metrics;
use crate::worker::results::{self, Submitted};

/// How often a running agent's output so far is stored.
pub const LOG_EVERY: Duration = Duration::from_secs(2);

/// Tries of the context read before the entry is handed back.
const CONTEXT_TRIES: u32 = 3;

/// Why a running job is stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// A cancel notice for the work item: no result is counted.
    Cancel,
    /// The runner shuts down: the entry goes back to the group.
    Shutdown,
    /// Another runner holds the entry now: stop, report nothing, leave it alone.
    Lost,
}

/// What the runner does with the job's entry afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Finished (reported, skipped or cancelled): acknowledge it.
    Ack,
    /// Not finished: hand it back for another try (by any runner).
    GiveBack,
    /// Another runner has it: touch nothing.
    Leave,
}

/// Everything the jobs share (one per runner process).
pub struct Shared {
    /// Redis.
    pub store: Store,
    /// Forgejo, for the context.
    pub forgejo: ForgejoClient,
    /// Policy (agents, models, tiers per repository).
    pub policy: Arc<PolicyFile>,
    /// Prompt templates.
    pub templates: Templates,
    /// Process configuration (retention, Forgejo URL).
    pub config: Arc<Config>,
    /// Runner settings.
    pub agents: AgentsConfig,
    /// The allow-listed part of the runner's environment, read once at start.
    pub base_env: Vec<(OsString, OsString)>,
    /// Every form of the secrets masked in agents' output
    /// ([`outcome::masked_forms`], computed once at start).
    pub secrets: Vec<String>,
    /// Forks the agents.
    pub spawner: Spawner,
    /// What each agent process is contained in ([`super::sandbox`]).
    pub sandbox: super::sandbox::Sandbox,
    /// Metrics.
    pub metrics: Metrics,
    /// This runner's consumer name.
    pub runner: String,
    /// A client per reviewer agent's user (`SHEPHERD_REVIEWER_TOKENS`), to post the
    /// verdicts of `review` work ([`super::review`]).
    pub reviewers: std::collections::BTreeMap<crate::core::ids::Login, ForgejoClient>,
}

/// The run record of a work item just taken by this runner.
pub fn new_run(shared: &Shared, item: &WorkItem, now_ms: i64) -> AgentRun {
    let policy = shared.policy.for_repo(&item.repo);
    AgentRun {
        work_id: item.id.to_string(),
        repo: item.repo.to_string(),
        number: item.number,
        kind: item.kind.as_str().to_owned(),
        tier: item.tier,
        tier_name: item.tier_name.clone(),
        model: policy.model_for(item.tier),
        agent: super::prompt::agent_for(&policy, item.kind, shared.agents.review_agent.as_deref())
            .to_owned(),
        runner: shared.runner.clone(),
        state: RunState::Waiting,
        pid: None,
        taken_ms: now_ms,
        started_ms: None,
        ended_ms: None,
        deadline_ms: deadline_ms(shared, item),
        seen_ms: now_ms,
        outcome: None,
        signature: None,
        note: None,
        output_bytes: None,
        unsandboxed: !shared.sandbox.is_on(),
    }
}

/// The claim's expiry minus the margin.
fn deadline_ms(shared: &Shared, item: &WorkItem) -> i64 {
    let margin = i64::try_from(shared.agents.deadline_margin.as_millis()).unwrap_or(i64::MAX);
    item.claim_expires_at.saturating_sub(margin)
}

/// Runs one work item to its end; returns what to do with its entry and its final run
/// record (already stored).
#[instrument(skip_all, fields(work = %item.id, repo = %item.repo, number = item.number, kind = item.kind.as_str()))]
pub async fn run(
    shared: Arc<Shared>,
    item: WorkItem,
    mut run: AgentRun,
    stop: watch::Receiver<Option<StopReason>>,
) -> (Disposition, AgentRun) {
    let disposition = match execute(&shared, &item, &mut run, stop).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(
                error = format!("{e:#}"),
                "work item not finished; handed back"
            );
            run.state = RunState::Released;
            run.note = Some(format!("{e:#}"));
            Disposition::GiveBack
        }
    };
    run.ended_ms = Some(now_ms());
    run.pid = None;
    let retention = shared.config.retention;
    if let Err(e) = agent_runs::save(
        &mut shared.store.conn(),
        shared.store.keys(),
        &run,
        retention,
    )
    .await
    {
        tracing::warn!(error = %e, "storing the run's state failed");
    }
    (disposition, run)
}

/// Steps 1–5 of the module docs.
async fn execute(
    shared: &Shared,
    item: &WorkItem,
    run: &mut AgentRun,
    mut stop: watch::Receiver<Option<StopReason>>,
) -> anyhow::Result<Disposition> {
    if let Some(refusal) = not_wanted(shared, item, run).await? {
        refused(shared, run, refusal, Stage::Start);
        run.state = RunState::Skipped;
        return Ok(Disposition::Ack);
    }
    if let Err(why) = reviewer_of(shared, item) {
        return fail_early(shared, item, run, "reviewer-token", why).await;
    }
    let Some(ctx) = gather(shared, item, &mut stop).await? else {
        return Ok(stopped(run, *stop.borrow()));
    };
    let dir = tempfile::Builder::new()
        .prefix("shepherd-agent-")
        .tempdir_in(&shared.agents.work_dir)?;
    let prompt = match shared
        .templates
        .render(item, &ctx, &prompt_params(shared, dir.path()))
    {
        Ok(p) => p,
        // A template problem is the operator's to fix; the attempt says so.
        Err(e) => {
            let why = format!("the prompt could not be rendered: {e}");
            return fail_early(shared, item, run, "prompt", why).await;
        }
    };
    let files = workdir::write_files(&shared.sandbox, dir.path(), item, &prompt)?;
    let capture = Arc::new(Mutex::new(Capture::new(shared.agents.log_bytes)));
    let mut inv = workdir::invocation(shared, item, run, &files, prompt);
    if let Some(reason) =
        with_checkout(shared, item, dir.path(), &mut inv, &capture, &mut stop).await?
    {
        return Ok(stopped(run, Some(reason)));
    }
    if shared.agents.checkout.is_some() {
        shared.sandbox.give_tree(dir.path())?;
    }
    workdir::sandboxed(&shared.sandbox, &mut inv, dir.path());
    let live = Arc::new(
        Live::new(shared.agents.usage, &item.limits)
            .counting_cpu_in(shared.metrics.agents.usage_meter_cpu.clone()),
    );
    let agent = match shared
        .spawner
        .launch(&inv, capture.clone(), live.clone())
        .await
    {
        Ok(a) => a,
        Err(e) => {
            let why = format!("the agent could not be started: {e}");
            return fail_early(shared, item, run, "spawn", why).await;
        }
    };
    let ended = supervise(shared, item, run, agent, &capture, &live, &mut stop).await?;
    let disposition = conclude(shared, item, run, ended, &files, &capture, &live).await?;
    drop(dir);
    Ok(disposition)
}

/// The client of the reviewer a `review` item names (`Ok(None)` for other kinds).
fn reviewer_of<'a>(
    shared: &'a Shared,
    item: &WorkItem,
) -> Result<Option<&'a ForgejoClient>, String> {
    if item.kind != crate::core::effect::WorkKind::Review {
        return Ok(None);
    }
    let Some(review) = &item.context.review else {
        return Err("the review work item names no reviewer (context.review)".into());
    };
    match shared.reviewers.get(&review.reviewer) {
        Some(client) => Ok(Some(client)),
        None => Err(format!(
            "no token for the reviewer {} in SHEPHERD_REVIEWER_TOKENS",
            review.reviewer
        )),
    }
}

/// What the prompt is told besides the item and its context.
fn prompt_params(shared: &Shared, dir: &std::path::Path) -> PromptParams {
    let (name, email) = &shared.agents.git_identity;
    PromptParams {
        forgejo_url: shared.config.forgejo_url.clone().unwrap_or_default(),
        forgejo_pat: shared
            .agents
            .credentials
            .then(|| shared.agents.forgejo_token.clone())
            .flatten(),
        git_user_name: name.clone(),
        git_user_email: email.clone(),
        checkout: shared
            .agents
            .checkout
            .is_some()
            .then(|| super::checkout::path(dir).display().to_string()),
    }
}

/// Reports `failed` with `signature` for a run that could not start (the attempt
/// says why, and the claim ends now rather than at its expiry).
async fn fail_early(
    shared: &Shared,
    item: &WorkItem,
    run: &mut AgentRun,
    signature: &str,
    why: String,
) -> anyhow::Result<Disposition> {
    tracing::warn!(signature, reason = %why, "work item failed before its agent ran");
    let report = results::ResultReport {
        id: None,
        outcome: crate::core::event::WorkOutcome::Failed,
        signature: Some(signature.to_owned()),
        summary: Some(why),
        usage: None,
        stopped: None,
    };
    report_result(shared, item, run, &report).await?;
    run.state = RunState::Finished;
    Ok(Disposition::Ack)
}

/// With `SHEPHERD_AGENT_CHECKOUT`: makes the clone in `dir` and points `inv` at it
/// (working directory, git's environment); git's output opens the log. A stop that
/// comes first is returned.
async fn with_checkout(
    shared: &Shared,
    item: &WorkItem,
    dir: &std::path::Path,
    inv: &mut Invocation,
    capture: &Mutex<Capture>,
    stop: &mut watch::Receiver<Option<StopReason>>,
) -> anyhow::Result<Option<StopReason>> {
    let Some(template) = &shared.agents.checkout else {
        return Ok(None);
    };
    let forgejo_url = shared.config.forgejo_url.as_deref().unwrap_or_default();
    let url = checkout::clone_url(template, forgejo_url, item.repo.as_str());
    let git_env = checkout::git_env(shared.agents.forgejo_token.as_ref());
    let mut env = shared.base_env.clone();
    env.extend(git_env.iter().cloned());
    let made = tokio::select! {
        r = checkout::checkout(&shared.forgejo, item, &url, dir, &env) => r,
        reason = stopped_by(stop) => return Ok(Some(reason)),
    };
    let (work, mut log) = made.context("making the agent's checkout")?;
    log += &checkout::set_identity(&env, &work, &shared.agents.git_identity).await?;
    capture.lock().expect("capture lock").push(log.as_bytes());
    inv.dir = work;
    inv.env.extend(git_env);
    Ok(None)
}

/// Step 4: records the start, waits for the agent's exit, the deadline, a limit or a
/// stop (stopping its process group for the last three), and cleans up its group.
async fn supervise(
    shared: &Shared,
    item: &WorkItem,
    run: &mut AgentRun,
    mut agent: super::launch::Agent,
    capture: &Mutex<Capture>,
    live: &Live,
    stop: &mut watch::Receiver<Option<StopReason>>,
) -> anyhow::Result<Ended> {
    let started = Instant::now();
    run.state = RunState::Running;
    run.pid = Some(agent.pid);
    run.started_ms = Some(now_ms());
    agent_runs::save(
        &mut shared.store.conn(),
        shared.store.keys(),
        run,
        shared.config.retention,
    )
    .await?;
    let m = &shared.metrics.agents;
    let running_gauge = RunningGauge::new(&m.running);
    m.started
        .with_label_values(&[run.kind.as_str(), run.tier_name.as_str()])
        .inc();
    tracing::info!(pid = agent.pid, model = %run.model, "agent started");
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(u64::try_from(run.deadline_ms - now_ms()).unwrap_or(0));
    // The output so far is stored now and then, so `inspect` shows a running agent's.
    let mut snapshot = tokio::time::interval_at(tokio::time::Instant::now() + LOG_EVERY, LOG_EVERY);
    let ended = loop {
        tokio::select! {
            status = agent.wait() => break Ended::Exited(status?),
            () = tokio::time::sleep_until(deadline) => {
                tracing::warn!("deadline reached; stopping the agent");
                agent.stop(shared.agents.kill_grace).await?;
                break Ended::Timeout;
            }
            reason = stopped_by(stop) => {
                tracing::info!(?reason, "stopping the agent");
                agent.stop(shared.agents.kill_grace).await?;
                break Ended::Stopped(reason);
            }
            reason = live.verdict() => {
                tracing::warn!(reason = reason.as_str(), "a limit of the run is reached; stopping the agent");
                agent.kill().await?;
                break Ended::Limit(reason);
            }
            () = usage::idle(live, item.limits.idle_secs) => {
                tracing::warn!("the agent is idle; stopping it");
                agent.kill().await?;
                break Ended::Limit(Limit::Idle);
            }
            _ = snapshot.tick() => {
                let text = outcome::mask_forms(&capture.lock().expect("capture lock").text(), &shared.secrets);
                save_log(shared, &run.work_id, &text).await;
            }
        }
    };
    agent.finish().await;
    drop(running_gauge);
    m.duration
        .with_label_values(&[run.kind.as_str()])
        .observe(started.elapsed().as_secs_f64());
    Ok(ended)
}

/// Step 5: the masked output is stored, the result decided and reported (unless a
/// stop ended the run), the usage and the metrics counted.
async fn conclude(
    shared: &Shared,
    item: &WorkItem,
    run: &mut AgentRun,
    ended: Ended,
    files: &workdir::Files,
    capture: &Mutex<Capture>,
    live: &Live,
) -> anyhow::Result<Disposition> {
    let id = item.id.to_string();
    let m = &shared.metrics.agents;
    let (output, total) = {
        let mut c = capture.lock().expect("capture lock");
        (outcome::mask_forms(&c.text(), &shared.secrets), c.total())
    };
    run.output_bytes = Some(total);
    let wall_ms = u64::try_from(now_ms() - run.started_ms.unwrap_or_else(now_ms)).unwrap_or(0);
    let finish = match ended {
        Ended::Exited(status) => Finish::Exited(status),
        Ended::Timeout => Finish::Timeout,
        Ended::Limit(reason) => Finish::Limit(reason),
        Ended::Stopped(reason) => {
            save_log(shared, &id, &output).await;
            // Nothing is reported, but what the agent spent is counted.
            let spent = usage::final_usage(live.usage(), None, None, &run.model, wall_ms);
            usage::count_metrics(m, run, &spent);
            let d = stopped(run, Some(reason));
            count_finished(m, run);
            return Ok(d);
        }
    };
    let file = match finish {
        Finish::Limit(_) => Ok(None),
        _ => outcome::read_result_file_off_thread(files.result.clone()).await,
    };
    let valid_file = matches!(file, Ok(Some(_)));
    let result = outcome::decide(finish, file, &output);
    // No valid result file: what the agent did is read from Forgejo (issue 27).
    let policy = shared.policy.for_repo(&item.repo);
    let result =
        super::world::settle(&shared.forgejo, item, &policy, finish, valid_file, result).await;
    let spent = usage::final_usage(
        live.usage(),
        result.tokens,
        result.cost,
        &run.model,
        wall_ms,
    );
    usage::count_metrics(m, run, &spent);
    let log = match &result.log_note {
        Some(note) => format!("{output}\n{}", outcome::mask_forms(note, &shared.secrets)),
        None => output,
    };
    save_log(shared, &id, &log).await;
    let mut report = result.report;
    // A model provider's 429/5xx, overload or timeout: retried by the core without an
    // attempt (issue 27).
    let patterns = &shared.policy.for_repo(&item.repo).transient_patterns;
    super::transient::Classifier::new(patterns).classify(&mut report, finish, valid_file, &log);
    if let Some(reason) = report.stopped {
        m.stopped.with_label_values(&[reason.as_str()]).inc();
        let why = usage::describe(reason, &spent, &item.limits);
        tracing::warn!(reason = reason.as_str(), "{why}");
        report.summary = Some(match report.summary.take() {
            Some(s) => format!("{why}\n{s}"),
            None => why,
        });
    }
    // A reviewer agent's verdict is posted now, as its own user; what that came to is
    // the result (the agent's own result file only adds its figures to the metrics). An
    // agent that failed without writing a verdict keeps its own failure (exit status).
    let wrote = std::fs::symlink_metadata(&files.review).is_ok();
    let failed = matches!(
        report.outcome,
        crate::core::event::WorkOutcome::Failed | crate::core::event::WorkOutcome::Transient
    );
    if let (Ok(Some(reviewer)), Finish::Exited(_)) = (reviewer_of(shared, item), finish)
        && (wrote || !failed)
    {
        // Bound to the record again: the record may have moved on while the agent ran.
        if let Err(refusal) = binding::check(&shared.store, item, Stage::Post).await? {
            refused(shared, run, refusal, Stage::Post);
            run.state = RunState::Finished;
            count_finished(m, run);
            return Ok(Disposition::Ack);
        }
        report = super::review::post(reviewer, item, &files.review).await;
    }
    report.summary = report
        .summary
        .map(|s| outcome::mask_forms(&s, &shared.secrets));
    report.signature = report
        .signature
        .map(|s| outcome::mask_forms(&s, &shared.secrets));
    // Whatever decided the outcome (the review's post included), the run's usage and
    // its stop go with it.
    report.usage = Some(spent);
    report.stopped = match finish {
        Finish::Limit(reason) => Some(reason),
        _ => None,
    };
    if report.outcome == crate::core::event::WorkOutcome::Transient {
        m.transient.with_label_values(&[run.kind.as_str()]).inc();
    }
    report_result(shared, item, run, &report).await?;
    run.state = RunState::Finished;
    count_finished(m, run);
    Ok(Disposition::Ack)
}

/// Counts a finished run by kind, tier and outcome.
fn count_finished(m: &crate::telemetry::AgentMetrics, run: &AgentRun) {
    m.finished
        .with_label_values(&[
            run.kind.as_str(),
            run.tier_name.as_str(),
            outcome_label(run),
        ])
        .inc();
}

/// Counts one running agent in the gauge for as long as it lives (whatever way the
/// job ends).
struct RunningGauge(prometheus::IntGauge);

impl RunningGauge {
    fn new(g: &prometheus::IntGauge) -> Self {
        g.inc();
        Self(g.clone())
    }
}

impl Drop for RunningGauge {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// How the agent's wait ended.
enum Ended {
    /// It exited.
    Exited(std::process::ExitStatus),
    /// The deadline stopped it.
    Timeout,
    /// A stop request stopped it.
    Stopped(StopReason),
    /// A limit of the run stopped it.
    Limit(Limit),
}

/// The label of a finished run's outcome.
fn outcome_label(run: &AgentRun) -> &'static str {
    match (run.state, run.signature.as_deref(), run.outcome.as_deref()) {
        (RunState::Cancelled, _, _) => "cancelled",
        (RunState::Released, _, _) => "released",
        (_, Some("timeout"), _) => "timeout",
        (_, _, Some("succeeded")) => "succeeded",
        (_, _, Some("no-changes")) => "no-changes",
        (_, _, Some("transient")) => "transient",
        _ => "failed",
    }
}

/// Why the work must not start, if it must not: it is not the record's active work
/// ([`binding::check`]: ended, superseded, reported, or any field differing from the
/// record's), or its deadline passed while it waited.
async fn not_wanted(
    shared: &Shared,
    item: &WorkItem,
    run: &AgentRun,
) -> anyhow::Result<Option<Refusal>> {
    if let Err(refusal) = binding::check(&shared.store, item, Stage::Start).await? {
        return Ok(Some(refusal));
    }
    if now_ms() >= run.deadline_ms {
        return Ok(Some(Refusal::Deadline));
    }
    Ok(None)
}

/// Counts, logs and notes a refusal at `stage` (the entry is acknowledged). A field
/// that contradicts the record is a warning (a forged or corrupted entry); the ends of
/// work that waited are not.
fn refused(shared: &Shared, run: &mut AgentRun, refusal: Refusal, stage: Stage) {
    shared
        .metrics
        .agents
        .refused
        .with_label_values(&[refusal.label()])
        .inc();
    let what = match stage {
        Stage::Start => "work item not started",
        Stage::Post => "verdict not posted: the work item no longer matches its record",
        Stage::Report => "result not recorded: the work item no longer matches its record",
    };
    if refusal.is_mismatch() {
        tracing::warn!(reason = refusal.label(), why = refusal.why(), "{what}");
    } else {
        tracing::info!(reason = refusal.label(), why = refusal.why(), "{what}");
    }
    run.note = Some(match stage {
        Stage::Start => refusal.why().to_owned(),
        Stage::Post | Stage::Report => format!("refused ({}): {}", refusal.label(), refusal.why()),
    });
}

/// Reads the context, retrying transient failures; `None` when a stop came first.
async fn gather(
    shared: &Shared,
    item: &WorkItem,
    stop: &mut watch::Receiver<Option<StopReason>>,
) -> anyhow::Result<Option<super::context::AgentContext>> {
    let mut pause = Duration::from_millis(500);
    for attempt in 1..=CONTEXT_TRIES {
        let read = tokio::select! {
            r = super::context::gather(&shared.forgejo, item) => r,
            _ = stopped_by(stop) => return Ok(None),
        };
        match read {
            Ok(ctx) => return Ok(Some(ctx)),
            Err(e) if e.is_retryable() && attempt < CONTEXT_TRIES => {
                tracing::info!(error = %e, attempt, "reading the context failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    _ = stopped_by(stop) => return Ok(None),
                }
                pause *= 2;
            }
            Err(e) => {
                return Err(
                    anyhow::Error::new(e).context("reading the work item's context from Forgejo")
                );
            }
        }
    }
    unreachable!("the last try returns")
}

/// Waits until a stop is requested; returns its reason.
async fn stopped_by(stop: &mut watch::Receiver<Option<StopReason>>) -> StopReason {
    loop {
        if let Some(reason) = *stop.borrow_and_update() {
            return reason;
        }
        if stop.changed().await.is_err() {
            // The runner dropped the sender: it is going away.
            return StopReason::Shutdown;
        }
    }
}

/// Marks `run` stopped for `reason`; the entry's disposition.
fn stopped(run: &mut AgentRun, reason: Option<StopReason>) -> Disposition {
    match reason {
        Some(StopReason::Cancel) => {
            run.state = RunState::Cancelled;
            run.note = Some("cancelled: no result is counted".into());
            Disposition::Ack
        }
        Some(StopReason::Lost) => {
            run.state = RunState::Released;
            run.note = Some("another runner holds the work item now".into());
            Disposition::Leave
        }
        Some(StopReason::Shutdown) | None => {
            run.state = RunState::Released;
            run.note = Some("the runner stopped; the work item goes to another runner".into());
            Disposition::GiveBack
        }
    }
}

/// Submits `report` once; notes what the results path said.
async fn report_result(
    shared: &Shared,
    item: &WorkItem,
    run: &mut AgentRun,
    report: &results::ResultReport,
) -> anyhow::Result<()> {
    // Bound to the record: a result is recorded only for the record's own active work
    // (or the claim its own push superseded).
    if let Err(refusal) = binding::check(&shared.store, item, Stage::Report).await? {
        refused(shared, run, refusal, Stage::Report);
        return Ok(());
    }
    let id = item.id.to_string();
    let mut conn = shared.store.conn();
    let submitted = results::submit(
        &mut conn,
        shared.store.keys(),
        &id,
        report,
        shared.config.retention,
    )
    .await?;
    run.outcome = Some(outcome_name(report.outcome).to_owned());
    run.signature = report.signature.clone();
    let note = match submitted {
        Submitted::Queued(_) => "reported",
        Submitted::Ended => "refused: the work had ended",
        Submitted::Unknown => "refused: unknown work id",
        Submitted::AlreadyReported => "refused: a result was already reported",
    };
    tracing::info!(
        outcome = outcome_name(report.outcome),
        signature = report.signature.as_deref().unwrap_or(""),
        note,
        "result"
    );
    run.note = Some(note.to_owned());
    Ok(())
}

/// The contract name of an outcome.
fn outcome_name(o: crate::core::event::WorkOutcome) -> &'static str {
    use crate::core::event::WorkOutcome;
    match o {
        WorkOutcome::Succeeded => "succeeded",
        WorkOutcome::Failed => "failed",
        WorkOutcome::NoChanges => "no-changes",
        WorkOutcome::Transient => "transient",
    }
}

/// Stores the output log (a failure is logged: the result matters more).
async fn save_log(shared: &Shared, id: &str, text: &str) {
    let r = agent_runs::save_log(
        &mut shared.store.conn(),
        shared.store.keys(),
        id,
        text,
        shared.config.retention,
    )
    .await;
    if let Err(e) = r {
        tracing::warn!(error = %e, "storing the agent's output failed");
    }
}

/// Now in unix milliseconds.
pub fn now_ms() -> i64 {
    i64::try_from(crate::store::streams::now_ms()).unwrap_or(i64::MAX)
}
