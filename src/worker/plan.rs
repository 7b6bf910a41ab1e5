//! Building a commit plan for one entry: load the records its event targets, step
//! each with the core, and collect the new records, history entries, effects, timers
//! and work-index changes (see `store::commit`).

use std::collections::BTreeSet;

use tokio_util::sync::CancellationToken;
use tracing::instrument;

use super::Context;
use super::process::{ApplyError, Job, target_repo};
use crate::core::effect::{Effect, EffectKind};
use crate::core::event::{Event, Target};
use crate::core::ids::{RepoName, Scope};
use crate::core::machine::{decide, decide_issue, step, step_issue};
use crate::core::policy::Policy;
use crate::core::record::{AttemptOutcome, IssueRecord, PrRecord, WorkState};
use crate::store::commit::{
    self, CommitPlan, RecordWrite, StoredRecord, TimerWrite, effect_fields, history_fields,
};
use crate::store::fields;
use crate::store::streams;
use crate::store::work::WorkOwner;

/// Loads the records the job targets, steps each, and assembles the commit plan.
/// `shutdown` is checked before each record after the first: a stop interrupts an
/// entry that fans out to many records ([`ApplyError::Interrupted`], nothing
/// committed, the entry stays pending).
#[instrument(skip_all)]
pub(super) async fn build_plan(
    ctx: &Context,
    shard: u16,
    job: &Job,
    shutdown: &CancellationToken,
) -> Result<CommitPlan, ApplyError> {
    if let Some(repo) = target_repo(&job.event)
        && ctx.store.keys().shard_of(repo.as_str()) != shard
    {
        // One Lua call must stay in one shard; ingest queues by the same hash.
        return Err(ApplyError::Poison(format!(
            "repository {repo} belongs to another shard"
        )));
    }
    let mut plan = CommitPlan {
        shard,
        entry_id: Some(job.entry.id.clone()),
        ended_ttl_secs: ctx.config.retention.as_secs(),
        ..CommitPlan::default()
    };
    match job.event.target() {
        Target::Pr(repo, n) => {
            let policy = ctx.policy.for_repo(&repo);
            let prev_links = apply_pr(ctx, job, &policy, &repo, n, true, &mut plan).await?;
            if matches!(job.event, Event::PullRequest { .. }) {
                for issue in prev_links {
                    interrupted(shutdown)?;
                    apply_issue(ctx, job, &policy, &repo, issue, false, &mut plan).await?;
                }
            }
        }
        Target::Issue(repo, n) => {
            let policy = ctx.policy.for_repo(&repo);
            apply_issue(ctx, job, &policy, &repo, n, true, &mut plan).await?;
        }
        Target::Repo(repo) => apply_repo(ctx, job, &repo, &mut plan, shutdown).await?,
        Target::None => {}
    }
    Ok(plan)
}

/// `Err(Interrupted)` once shutdown has fired.
fn interrupted(shutdown: &CancellationToken) -> Result<(), ApplyError> {
    match shutdown.is_cancelled() {
        true => Err(ApplyError::Interrupted),
        false => Ok(()),
    }
}

/// Steps the PR record `repo#n` and adds it to the plan; returns the issues its body
/// links, before or after the step (they get the event too).
async fn apply_pr(
    ctx: &Context,
    job: &Job,
    policy: &Policy,
    repo: &RepoName,
    n: u64,
    direct: bool,
    plan: &mut CommitPlan,
) -> Result<BTreeSet<u64>, ApplyError> {
    let key = ctx.store.keys().pr_record(repo.as_str(), n);
    let stored = commit::load(&mut ctx.store.conn(), &key).await?;
    let old = decode_pr(&key, stored.as_ref())?.unwrap_or_else(|| PrRecord::new(repo.clone(), n));
    let now = streams::now_ms() as i64;
    let t = step(&old, &job.event, now, policy);
    log_refusals(repo, n, &t.effects);
    let mut links = old.linked_issues();
    links.extend(t.record.linked_issues());
    let changed = !t.is_noop();
    let phase = name_of(&decide(&t.record, policy, now).phase);
    let indexed = t.record.is_open() || t.record.pr.is_none();
    let data = changed.then(|| t.record.to_json());
    let old_work = active_work(&old.work);
    push_record(
        ctx,
        job,
        plan,
        Scope::Pr,
        repo,
        n,
        (old.version, data, phase, indexed),
        direct || changed,
        &t.note,
        &t.effects,
    );
    let owner = WorkOwner::encode(false, repo.as_str(), n);
    track_work(plan, old_work, &t.record.work, &t.effects, &owner);
    Ok(links)
}

/// Steps the issue record `repo#n` and adds it to the plan.
async fn apply_issue(
    ctx: &Context,
    job: &Job,
    policy: &Policy,
    repo: &RepoName,
    n: u64,
    direct: bool,
    plan: &mut CommitPlan,
) -> Result<(), ApplyError> {
    let key = ctx.store.keys().issue_record(repo.as_str(), n);
    let stored = commit::load(&mut ctx.store.conn(), &key).await?;
    let old = match stored {
        None => IssueRecord::new(repo.clone(), n),
        Some(s) => IssueRecord::from_json(&s.data)
            .map_err(|e| ApplyError::Poison(format!("corrupt record {key}: {e}")))?,
    };
    let now = streams::now_ms() as i64;
    let t = step_issue(&old, &job.event, now, policy);
    log_refusals(repo, n, &t.effects);
    let changed = !t.is_noop();
    let phase = name_of(&decide_issue(&t.record, policy).phase);
    let indexed = t.record.issue.as_ref().is_none_or(|i| i.open);
    let data = changed.then(|| t.record.to_json());
    let old_work = active_work(&old.work);
    push_record(
        ctx,
        job,
        plan,
        Scope::Issue,
        repo,
        n,
        (old.version, data, phase, indexed),
        direct || changed,
        &t.note,
        &t.effects,
    );
    let owner = WorkOwner::encode(true, repo.as_str(), n);
    track_work(plan, old_work, &t.record.work, &t.effects, &owner);
    Ok(())
}

/// Applies a repository-wide event to every open PR record of the repository.
async fn apply_repo(
    ctx: &Context,
    job: &Job,
    repo: &RepoName,
    plan: &mut CommitPlan,
    shutdown: &CancellationToken,
) -> Result<(), ApplyError> {
    let keys = ctx.store.keys();
    let mut conn = ctx.store.conn();
    let members = commit::index_members(&mut conn, &keys.repo_index(repo.as_str())).await?;
    let pr_keys: Vec<String> = members.into_iter().filter(|k| k.contains(":pr:")).collect();
    let stored = commit::load_many(&mut conn, &pr_keys).await?;
    let policy = ctx.policy.for_repo(repo);
    let now = streams::now_ms() as i64;
    for (key, stored) in pr_keys.iter().zip(stored) {
        interrupted(shutdown)?;
        let Some(old) = decode_pr(key, stored.as_ref())? else {
            continue;
        };
        if !old.is_open() {
            continue;
        }
        let t = step(&old, &job.event, now, &policy);
        let changed = !t.is_noop();
        let phase = name_of(&decide(&t.record, &policy, now).phase);
        let indexed = t.record.is_open();
        let data = changed.then(|| t.record.to_json());
        let old_work = active_work(&old.work);
        let n = old.number;
        push_record(
            ctx,
            job,
            plan,
            Scope::Pr,
            repo,
            n,
            (old.version, data, phase, indexed),
            changed,
            &t.note,
            &t.effects,
        );
        let owner = WorkOwner::encode(false, repo.as_str(), n);
        track_work(plan, old_work, &t.record.work, &t.effects, &owner);
    }
    Ok(())
}

/// Decodes a stored PR record (`None` when there is none).
fn decode_pr(key: &str, stored: Option<&StoredRecord>) -> Result<Option<PrRecord>, ApplyError> {
    match stored {
        None => Ok(None),
        Some(s) => PrRecord::from_json(&s.data)
            .map(Some)
            .map_err(|e| ApplyError::Poison(format!("corrupt record {key}: {e}"))),
    }
}

/// The id of a record's active work item.
fn active_work(work: &WorkState) -> Option<String> {
    work.active.as_ref().map(|w| w.item.id.to_string())
}

/// The serialized name of a unit enum value (phases, effect kinds).
fn name_of<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Records that the active work changed: the old id ends unless it is still active.
/// When its claim ended because the agent's own push superseded it (no cancel), the
/// ended marker names the owner (`owner`), so the agent's late result is still
/// recorded on that attempt (`store/lua/report.lua`, docs/state-machine.md).
fn track_work(
    plan: &mut CommitPlan,
    old: Option<String>,
    new_work: &WorkState,
    effects: &[Effect],
    owner: &str,
) {
    let new = active_work(new_work);
    if let Some(old) = old
        && new.as_deref() != Some(old.as_str())
        && !plan.work_add.iter().any(|(id, _)| *id == old)
    {
        if superseded_by_push(new_work, effects, &old) {
            plan.work_superseded.push((old.clone(), owner.to_owned()));
        }
        plan.work_end.push(old);
    }
}

/// Whether work `id` ended as `superseded` without a `CancelWork` (a human push
/// supersedes *and* cancels: that agent's result stays refused).
fn superseded_by_push(work: &WorkState, effects: &[Effect], id: &str) -> bool {
    let superseded = work
        .attempts
        .iter()
        .rev()
        .find(|a| a.work_id.as_str() == id)
        .is_some_and(|a| a.outcome == AttemptOutcome::Superseded);
    let cancelled = effects
        .iter()
        .any(|e| matches!(&e.kind, EffectKind::CancelWork { work_id } if work_id.as_str() == id));
    superseded && !cancelled
}

/// The state a record is committed in: (expected version, data when changed, phase,
/// whether it stays in the repository index).
type RecordState = (u64, Option<String>, String, bool);

/// Adds one stepped record, its history entry and its effects to the plan.
#[expect(
    clippy::too_many_arguments,
    reason = "one call site per record kind; a struct would only rename them"
)]
fn push_record(
    ctx: &Context,
    job: &Job,
    plan: &mut CommitPlan,
    scope: Scope,
    repo: &RepoName,
    number: u64,
    (expect, data, phase, indexed): RecordState,
    with_history: bool,
    note: &str,
    effects: &[Effect],
) {
    let keys = ctx.store.keys();
    let (key, history_key) = match scope {
        Scope::Pr => (
            keys.pr_record(repo.as_str(), number),
            keys.history(repo.as_str(), number),
        ),
        Scope::Issue => (
            keys.issue_record(repo.as_str(), number),
            keys.issue_history(repo.as_str(), number),
        ),
    };
    let version = if data.is_some() { expect + 1 } else { expect };
    let history = if with_history {
        history_entry(job, note, &phase, version, effects.len())
    } else {
        Vec::new()
    };
    for effect in effects {
        add_effect(job, plan, &key, version, effect);
    }
    plan.records.push(RecordWrite {
        key,
        history_key,
        index_key: keys.repo_index(repo.as_str()),
        expect,
        data,
        phase,
        history,
        indexed,
    });
}

/// The history entry of a transition.
fn history_entry(
    job: &Job,
    note: &str,
    phase: &str,
    version: u64,
    effects: usize,
) -> Vec<(String, String)> {
    let mut h = vec![
        (history_fields::ENTRY.to_owned(), job.entry.id.clone()),
        (
            history_fields::DELIVERY.to_owned(),
            job.entry.text(fields::DELIVERY),
        ),
        (history_fields::EVENT.to_owned(), job.name.clone()),
        (history_fields::NOTE.to_owned(), note.to_owned()),
        (history_fields::PHASE.to_owned(), phase.to_owned()),
        (history_fields::VERSION.to_owned(), version.to_string()),
        (history_fields::EFFECTS.to_owned(), effects.to_string()),
        (history_fields::AT.to_owned(), streams::now_ms().to_string()),
    ];
    let replay = job.entry.text(fields::REPLAY);
    if !replay.is_empty() {
        h.push((history_fields::REPLAY.to_owned(), replay));
    }
    h
}

/// Adds one effect: a timer for `Schedule`, an effects-stream entry otherwise (and the
/// work index entry of a `Dispatch`).
fn add_effect(job: &Job, plan: &mut CommitPlan, record_key: &str, version: u64, effect: &Effect) {
    let kind = match &effect.kind {
        EffectKind::Schedule(timer) => {
            plan.timers.push(TimerWrite::for_timer(
                record_key,
                &effect.repo,
                effect.scope,
                effect.number,
                timer,
            ));
            return;
        }
        EffectKind::Dispatch(item) => {
            let owner = WorkOwner::encode(
                effect.scope == Scope::Issue,
                effect.repo.as_str(),
                effect.number,
            );
            plan.work_add.push((item.id.to_string(), owner));
            effect.kind.name()
        }
        other => other.name(),
    };
    let kind = name_of(&kind);
    plan.effects.push(vec![
        (effect_fields::ID.to_owned(), effect.id.to_string()),
        (effect_fields::KIND.to_owned(), kind),
        (
            effect_fields::EFFECT.to_owned(),
            serde_json::to_string(effect).unwrap_or_default(),
        ),
        (effect_fields::RECORD.to_owned(), record_key.to_owned()),
        (effect_fields::REPO.to_owned(), effect.repo.to_string()),
        (effect_fields::NUMBER.to_owned(), effect.number.to_string()),
        (effect_fields::VERSION.to_owned(), version.to_string()),
        (effect_fields::CAUSE.to_owned(), job.entry.id.clone()),
        (
            effect_fields::RECEIVED.to_owned(),
            job.received_ms.to_string(),
        ),
    ]);
}

/// Says in the log when `/shepherd` commands were refused because the commenter has no
/// write access (the core answers them with a refusal comment and does nothing else).
fn log_refusals(repo: &RepoName, number: u64, effects: &[Effect]) {
    for e in effects {
        if let EffectKind::Comment { body, .. } = &e.kind
            && let Some(login) = crate::core::texts::refused_login(body)
        {
            tracing::info!(
                repo = %repo,
                number,
                %login,
                "ignored /shepherd commands: the commenter has no write access"
            );
        }
    }
}
