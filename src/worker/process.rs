//! Processing of events-stream entries, the handler of the events consumer loop:
//! decode → route → load → `core::step` → compare-and-set commit, retried on conflict;
//! poison entries are answered `DeadLetter` (the loop moves them).
//!
//! A batch is split by target record: entries for the same record run one after the
//! other (in stream order), different records run concurrently on the shared
//! multiplexed connection, which pipelines their commands.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use rand::Rng;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Context, plan};
use crate::core::event::{Event, Target};
use crate::core::ids::RepoName;
use crate::core::normalize::normalize;
use crate::store::commit::{self, CommitOutcome};
use crate::store::consumer::{Handled, Outcome};
use crate::store::streams::{self, Entry};
use crate::store::{StoreError, fields, repos};

/// Commit attempts per entry before it is left pending for a later retry.
const MAX_ATTEMPTS: u32 = 32;

/// A decoded entry, ready to be applied.
pub(super) struct Job {
    /// The entry.
    pub(super) entry: Entry,
    /// The normalized event.
    pub(super) event: Event,
    /// Its name (history and metrics label).
    pub(super) name: String,
    /// Receive time of the entry (unix ms).
    pub(super) received_ms: u64,
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

/// Processes a batch of entries of one shard; answers what became of each (committed,
/// acked, to be dead-lettered, left pending after an error for the reclaimer, or never
/// started). Once `shutdown` fires, entries not yet started are answered
/// `NotStarted` (the loop hands them back uncounted), so a stop does not wait for the
/// rest of a batch and loses none of it.
pub async fn process_batch(
    ctx: &Context,
    shard: u16,
    entries: Vec<Entry>,
    shutdown: &CancellationToken,
) -> Vec<Handled> {
    let mut groups: HashMap<String, Vec<Job>> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        match decode(entry) {
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
                out.push(Handled::new(entry, Outcome::Ack));
            }
            Decoded::Poison(entry, reason) => {
                out.push(Handled::new(entry, Outcome::DeadLetter(reason)));
            }
        }
    }
    let runs = order
        .into_iter()
        .filter_map(|k| groups.remove(&k))
        .map(|jobs| async move {
            let mut handled = Vec::with_capacity(jobs.len());
            for job in jobs {
                if shutdown.is_cancelled() {
                    tracing::info!(entry = %job.entry.id, "shutting down; the entry stays pending");
                    handled.push(Handled::new(job.entry, Outcome::NotStarted));
                    continue;
                }
                handled.push(apply(ctx, shard, job, shutdown).await);
            }
            handled
        });
    out.extend(join_all(runs).await.into_iter().flatten());
    out
}

/// Decodes an entry: a webhook through `core::normalize`, an internal event from JSON.
/// (Entries delivered too often never get here: the consumer loop dead-letters them.)
fn decode(entry: Entry) -> Decoded {
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
    let added = repos::remember(&mut ctx.store.conn(), ctx.store.keys(), repo.as_str()).await;
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

/// Why a job could not be committed.
pub(super) enum ApplyError {
    /// Transient: leave the entry pending (reclaim retries it).
    Store(StoreError),
    /// Permanent for this entry: dead-letter it.
    Poison(String),
    /// Shutdown fired half-way: leave the entry pending (nothing was committed).
    Interrupted,
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
/// Shutdown stops it between attempts and between the records of its plan.
async fn apply(ctx: &Context, shard: u16, job: Job, shutdown: &CancellationToken) -> Handled {
    let replay = job.entry.text(fields::REPLAY);
    let span = tracing::info_span!("event", entry = %job.entry.id, delivery = %job.entry.text(fields::DELIVERY), event = %job.name, replay = %replay);
    let outcome = apply_inner(ctx, shard, &job, shutdown)
        .instrument(span)
        .await;
    Handled::new(job.entry, outcome)
}

/// [`apply`]: what became of the job.
async fn apply_inner(
    ctx: &Context,
    shard: u16,
    job: &Job,
    shutdown: &CancellationToken,
) -> Outcome {
    let processed = &ctx.metrics.events_processed;
    let mut conn = ctx.store.conn();
    for attempt in 1..=MAX_ATTEMPTS {
        let plan = match plan::build_plan(ctx, shard, job, shutdown).await {
            Ok(plan) => plan,
            // Counted where the loop has moved it (`dead_lettered`).
            Err(ApplyError::Poison(reason)) => return Outcome::DeadLetter(reason),
            Err(ApplyError::Store(e)) => {
                processed
                    .with_label_values(&[job.name.as_str(), "error"])
                    .inc();
                tracing::warn!(error = %e, "loading failed; the entry stays pending");
                return Outcome::Retry;
            }
            Err(ApplyError::Interrupted) => {
                tracing::info!("shutting down mid-entry; the entry stays pending");
                return Outcome::Retry;
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
                return Outcome::Finished;
            }
            Ok(CommitOutcome::Stale) => {
                processed
                    .with_label_values(&[job.name.as_str(), "duplicate"])
                    .inc();
                tracing::info!("entry already committed by another consumer");
                return Outcome::Finished;
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
                tracing::warn!(error = %e, "commit failed; the entry stays pending");
                return Outcome::Retry;
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
    Outcome::Retry
}

/// The repository of an event's target.
pub(super) fn target_repo(event: &Event) -> Option<RepoName> {
    match event.target() {
        Target::Pr(repo, _) | Target::Issue(repo, _) | Target::Repo(repo) => Some(repo),
        Target::None => None,
    }
}
