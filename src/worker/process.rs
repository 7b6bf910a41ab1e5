//! Processing of events-stream entries: decode → route → load → `core::step` →
//! compare-and-set commit, retried on conflict; poison entries to the dead letters.
//!
//! A batch is split by target record: entries for the same record run one after the
//! other (in stream order), different records run concurrently on the shared
//! multiplexed connection, which pipelines their commands.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures_util::future::join_all;
use rand::Rng;
use tracing::{Instrument, instrument};

use super::Context;
use crate::core::effect::{Effect, EffectKind};
use crate::core::event::{Event, Target};
use crate::core::ids::{RepoName, Scope};
use crate::core::machine::{decide, decide_issue, step, step_issue};
use crate::core::normalize::normalize;
use crate::core::policy::Policy;
use crate::core::record::{IssueRecord, PrRecord, WorkState};
use crate::store::commit::{
    self, CommitOutcome, CommitPlan, RecordWrite, StoredRecord, TimerWrite, effect_fields,
    history_fields,
};
use crate::store::keys::WORKERS_GROUP;
use crate::store::streams::{self, Entry};
use crate::store::work::WorkOwner;
use crate::store::{StoreError, fields};

/// Commit attempts per entry before it is left pending for a later retry.
const MAX_ATTEMPTS: u32 = 32;

/// A decoded entry, ready to be applied.
struct Job {
    /// The entry.
    entry: Entry,
    /// The normalized event.
    event: Event,
    /// Its name (history and metrics label).
    name: String,
    /// Receive time of the entry (unix ms).
    received_ms: u64,
}

/// What to do with an entry after decoding.
enum Decoded {
    /// Apply it.
    Apply(Box<Job>),
    /// Known but nothing to do (ignored event type, no target): ack.
    Ignore(Entry),
    /// Cannot be processed: dead letter with this reason.
    Poison(Entry, String),
}

/// Processes a batch of entries of one shard; returns when every entry is committed,
/// acked, dead-lettered, or left pending after an error (to be retried by reclaim).
pub async fn process_batch(ctx: &Context, shard: u16, entries: Vec<Entry>) {
    let mut groups: HashMap<String, Vec<Job>> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut ignored: Vec<String> = Vec::new();
    for entry in entries {
        match decode(ctx, entry) {
            Decoded::Apply(job) => {
                if let Some(repo) = target_repo(&job.event) {
                    remember_repo(ctx, repo).await;
                }
                let key = route_key(ctx, &job.event);
                if !groups.contains_key(&key) {
                    order.push(key.clone());
                }
                groups.entry(key).or_default().push(*job);
            }
            Decoded::Ignore(entry) => {
                ctx.metrics
                    .events_processed
                    .with_label_values(&["other", "ignored"])
                    .inc();
                ignored.push(entry.id);
            }
            Decoded::Poison(entry, reason) => dead_letter(ctx, shard, &entry, &reason).await,
        }
    }
    if !ignored.is_empty() {
        let ids: Vec<&str> = ignored.iter().map(String::as_str).collect();
        let stream = ctx.store.keys().events(shard);
        if let Err(e) = streams::ack(&mut ctx.store.conn(), &stream, WORKERS_GROUP, &ids).await {
            tracing::warn!(error = %e, "acking ignored entries failed; they will be redelivered");
        }
    }
    let runs = order
        .into_iter()
        .filter_map(|k| groups.remove(&k))
        .map(|jobs| async move {
            for job in jobs {
                apply(ctx, shard, job).await;
            }
        });
    join_all(runs).await;
}

/// Decodes an entry: a webhook through `core::normalize`, an internal event from JSON.
fn decode(ctx: &Context, entry: Entry) -> Decoded {
    let max = u64::from(ctx.config.max_deliveries);
    if entry.deliveries > max {
        let reason = format!(
            "delivered {} times (SHEPHERD_MAX_DELIVERIES = {max})",
            entry.deliveries
        );
        return Decoded::Poison(entry, reason);
    }
    let body = entry.bytes(fields::BODY).unwrap_or_default();
    let kind = entry.text(fields::KIND);
    let event = match kind.as_str() {
        fields::KIND_WEBHOOK => match normalize(&entry.text(fields::EVENT), body) {
            Ok(Some(event)) => event,
            Ok(None) => return Decoded::Ignore(entry),
            Err(e) => {
                let reason = format!("undecodable webhook: {e}");
                return Decoded::Poison(entry, reason);
            }
        },
        fields::KIND_INTERNAL => match serde_json::from_slice::<Event>(body) {
            Ok(event) => event,
            Err(e) => {
                let reason = format!("undecodable internal event: {e}");
                return Decoded::Poison(entry, reason);
            }
        },
        other => {
            let reason = format!("unknown entry kind {other:?}");
            return Decoded::Poison(entry, reason);
        }
    };
    if matches!(event.target(), Target::None) {
        return Decoded::Ignore(entry);
    }
    let received_ms = entry
        .text(fields::RECEIVED)
        .parse()
        .unwrap_or_else(|_| streams::now_ms());
    Decoded::Apply(Box::new(Job {
        name: event.name(),
        event,
        entry,
        received_ms,
    }))
}

/// Adds a repository to the set of known repositories (`resync --all`, periodic
/// resync) the first time this process sees it. Outside the commit script: the set has
/// no shard tag, and losing an addition only delays a resync until the next event.
async fn remember_repo(ctx: &Context, repo: RepoName) {
    let known = ctx
        .known_repos
        .lock()
        .map(|k| k.contains(repo.as_str()))
        .unwrap_or(false);
    if known {
        return;
    }
    let mut conn = ctx.store.conn();
    let added: Result<i64, _> = redis::cmd("SADD")
        .arg(ctx.store.keys().repos())
        .arg(repo.as_str())
        .query_async(&mut conn)
        .await;
    match added {
        Ok(_) => {
            if let Ok(mut k) = ctx.known_repos.lock() {
                k.insert(repo.as_str().to_owned());
            }
        }
        Err(e) => tracing::debug!(error = %e, "remembering a repository failed"),
    }
}

/// Entries with the same key touch the same records and run in order.
fn route_key(ctx: &Context, event: &Event) -> String {
    let keys = ctx.store.keys();
    match event.target() {
        Target::Pr(repo, n) => keys.pr_record(repo.as_str(), n),
        Target::Issue(repo, n) => keys.issue_record(repo.as_str(), n),
        Target::Repo(repo) => keys.repo_index(repo.as_str()),
        Target::None => String::new(),
    }
}

/// Dead-letters one entry (and counts it).
async fn dead_letter(ctx: &Context, shard: u16, entry: &Entry, reason: &str) {
    let keys = ctx.store.keys();
    let (stream, dead) = (keys.events(shard), keys.dead_letters(shard));
    let event = entry.text(fields::EVENT);
    tracing::warn!(entry = %entry.id, event = %event, delivery = %entry.text(fields::DELIVERY), %reason, "dead-lettering a poison entry");
    let r = streams::dead_letter(
        &mut ctx.store.conn(),
        &stream,
        &dead,
        WORKERS_GROUP,
        &entry.id,
        reason,
        entry.deliveries,
    )
    .await;
    match r {
        Ok(_) => ctx
            .metrics
            .events_processed
            .with_label_values(&["other", "dead_lettered"])
            .inc(),
        Err(e) => {
            tracing::warn!(entry = %entry.id, error = %e, "dead-lettering failed; the entry stays pending")
        }
    }
}

/// Why a job could not be committed.
enum ApplyError {
    /// Transient: leave the entry pending (reclaim retries it).
    Store(StoreError),
    /// Permanent for this entry: dead-letter it.
    Poison(String),
}

impl From<StoreError> for ApplyError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Corrupt { key, reason } => {
                ApplyError::Poison(format!("corrupt record {key}: {reason}"))
            }
            other => ApplyError::Store(other),
        }
    }
}

/// Applies one job: build the plan from fresh records, commit, retry on conflict.
async fn apply(ctx: &Context, shard: u16, job: Job) {
    let span = tracing::info_span!("event", entry = %job.entry.id, delivery = %job.entry.text(fields::DELIVERY), event = %job.name);
    async {
        let processed = &ctx.metrics.events_processed;
        let mut conn = ctx.store.conn();
        for attempt in 1..=MAX_ATTEMPTS {
            let plan = match build_plan(ctx, shard, &job).await {
                Ok(plan) => plan,
                Err(ApplyError::Poison(reason)) => {
                    processed
                        .with_label_values(&[job.name.as_str(), "dead_lettered"])
                        .inc();
                    return dead_letter(ctx, shard, &job.entry, &reason).await;
                }
                Err(ApplyError::Store(e)) => {
                    processed
                        .with_label_values(&[job.name.as_str(), "error"])
                        .inc();
                    return tracing::warn!(error = %e, "loading failed; the entry stays pending");
                }
            };
            match commit::commit(&mut conn, ctx.store.keys(), &plan).await {
                Ok(CommitOutcome::Committed) => {
                    processed
                        .with_label_values(&[job.name.as_str(), "committed"])
                        .inc();
                    let lag_ms = streams::now_ms().saturating_sub(job.received_ms);
                    ctx.metrics
                        .lag
                        .with_label_values(&["committed"])
                        .observe(lag_ms as f64 / 1000.0);
                    return;
                }
                Ok(CommitOutcome::Stale) => {
                    processed
                        .with_label_values(&[job.name.as_str(), "duplicate"])
                        .inc();
                    return tracing::info!("entry already committed by another consumer");
                }
                Ok(CommitOutcome::Conflict { index, found }) => {
                    ctx.metrics.commit_conflicts.inc();
                    tracing::debug!(attempt, index, found, "version conflict; reloading");
                    let cap = 1u64 << attempt.min(6);
                    let wait = rand::rng().random_range(0..cap * 500);
                    tokio::time::sleep(Duration::from_micros(wait)).await;
                }
                Err(e) => {
                    processed
                        .with_label_values(&[job.name.as_str(), "error"])
                        .inc();
                    return tracing::warn!(error = %e, "commit failed; the entry stays pending");
                }
            }
        }
        processed
            .with_label_values(&[job.name.as_str(), "error"])
            .inc();
        tracing::warn!(
            attempts = MAX_ATTEMPTS,
            "too many version conflicts; the entry stays pending"
        );
    }
    .instrument(span)
    .await;
}

/// Loads the records the job targets, steps each, and assembles the commit plan.
#[instrument(skip_all)]
async fn build_plan(ctx: &Context, shard: u16, job: &Job) -> Result<CommitPlan, ApplyError> {
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
                    apply_issue(ctx, job, &policy, &repo, issue, false, &mut plan).await?;
                }
            }
        }
        Target::Issue(repo, n) => {
            let policy = ctx.policy.for_repo(&repo);
            apply_issue(ctx, job, &policy, &repo, n, true, &mut plan).await?;
        }
        Target::Repo(repo) => apply_repo(ctx, job, &repo, &mut plan).await?,
        Target::None => {}
    }
    Ok(plan)
}

/// The repository of an event's target.
fn target_repo(event: &Event) -> Option<RepoName> {
    match event.target() {
        Target::Pr(repo, _) | Target::Issue(repo, _) | Target::Repo(repo) => Some(repo),
        Target::None => None,
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
    let mut links = old.linked_issues();
    links.extend(t.record.linked_issues());
    let changed = !t.is_noop();
    let phase = name_of(&decide(&t.record, policy, now).phase);
    let indexed = t.record.is_open() || t.record.pr.is_none();
    let data = changed.then(|| t.record.to_json());
    let old_work = active_work(&old.work);
    let new_work = active_work(&t.record.work);
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
    track_work(plan, old_work, new_work);
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
    let changed = !t.is_noop();
    let phase = name_of(&decide_issue(&t.record, policy).phase);
    let indexed = t.record.issue.as_ref().is_none_or(|i| i.open);
    let data = changed.then(|| t.record.to_json());
    let old_work = active_work(&old.work);
    let new_work = active_work(&t.record.work);
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
    track_work(plan, old_work, new_work);
    Ok(())
}

/// Applies a repository-wide event to every open PR record of the repository.
async fn apply_repo(
    ctx: &Context,
    job: &Job,
    repo: &RepoName,
    plan: &mut CommitPlan,
) -> Result<(), ApplyError> {
    let keys = ctx.store.keys();
    let mut conn = ctx.store.conn();
    let members = commit::index_members(&mut conn, &keys.repo_index(repo.as_str())).await?;
    let pr_keys: Vec<String> = members.into_iter().filter(|k| k.contains(":pr:")).collect();
    let stored = commit::load_many(&mut conn, &pr_keys).await?;
    let policy = ctx.policy.for_repo(repo);
    let now = streams::now_ms() as i64;
    for (key, stored) in pr_keys.iter().zip(stored) {
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
        let new_work = active_work(&t.record.work);
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
        track_work(plan, old_work, new_work);
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
fn track_work(plan: &mut CommitPlan, old: Option<String>, new: Option<String>) {
    if let Some(old) = old
        && new.as_deref() != Some(old.as_str())
        && !plan.work_add.iter().any(|(id, _)| *id == old)
    {
        plan.work_end.push(old);
    }
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
            let fired = Event::TimerFired {
                repo: effect.repo.clone(),
                scope: effect.scope,
                number: effect.number,
                timer: timer.clone(),
            };
            plan.timers.push(TimerWrite {
                due_ms: u64::try_from(timer.due_ms).unwrap_or(0),
                record: record_key.to_owned(),
                id: timer.id.clone(),
                repo: effect.repo.to_string(),
                event: fired.name(),
                body: serde_json::to_string(&fired).unwrap_or_default(),
            });
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
