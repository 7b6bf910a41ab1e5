//! Building a commit plan for one entry: load the records its event reaches (decided
//! by `core::route`), step each with the core, and collect the new records, history
//! entries, effects, timers and work-index changes (see `store::commit`).

use std::collections::{BTreeMap, BTreeSet};

use tokio_util::sync::CancellationToken;
use tracing::instrument;

use super::Context;
use super::process::{ApplyError, Job};
use crate::core::effect::{Effect, EffectKind};
use crate::core::ids::{RepoName, Scope};
use crate::core::machine::{decide, decide_issue, step, step_issue};
use crate::core::policy::Policy;
use crate::core::record::{AttemptOutcome, IssueRecord, PrRecord, WorkState};
use crate::core::route::{self, Facts, FanOut, Reach, RecordRef};
use crate::store::commit::{
    self, CommitPlan, RecordWrite, StoredRecord, TimerWrite, effect_fields, history_fields,
};
use crate::store::fields;
use crate::store::streams;
use crate::store::work::WorkOwner;

/// Loads the records the job's event reaches (`core::route`), steps each, and
/// assembles the commit plan. `shutdown` is checked before each record after the
/// named one: a stop interrupts an entry that fans out to many records
/// ([`ApplyError::Interrupted`], nothing committed, the entry stays pending).
#[instrument(skip_all)]
pub(super) async fn build_plan(
    ctx: &Context,
    shard: u16,
    job: &Job,
    shutdown: &CancellationToken,
) -> Result<CommitPlan, ApplyError> {
    let route = route::route(&job.event);
    let mut plan = CommitPlan {
        shard,
        entry_id: Some(job.entry.id.clone()),
        ended_ttl_secs: ctx.config.retention.as_secs(),
        ..CommitPlan::default()
    };
    let Some(repo) = route.repo().cloned() else {
        return Ok(plan);
    };
    if ctx.store.keys().shard_of(repo.as_str()) != shard {
        // One Lua call must stay in one shard; ingest queues by the same hash.
        return Err(ApplyError::Poison(format!(
            "repository {repo} belongs to another shard"
        )));
    }
    let policy = ctx.policy.for_repo(&repo);
    let mut facts = Facts::default();
    if let Some(named) = &route.named {
        facts.linked_issues =
            apply(ctx, job, &policy, named, None, Reach::Named, &mut plan).await?;
    }
    let mut loaded = match &route.fan_out {
        FanOut::OpenPrs(repo) => repo_prs(ctx, repo, &mut facts).await?,
        FanOut::None | FanOut::LinkedIssues => BTreeMap::new(),
    };
    for r in route.fan_out(&facts) {
        interrupted(shutdown)?;
        let old = loaded.remove(&r.record.number);
        apply(ctx, job, &policy, &r.record, old, r.reach, &mut plan).await?;
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

/// Every PR record the store holds for `repo` (the repository index), by number;
/// adds them to `facts` for a repository-wide fan-out. A corrupt record is poison, as
/// when it is named.
async fn repo_prs(
    ctx: &Context,
    repo: &RepoName,
    facts: &mut Facts,
) -> Result<BTreeMap<u64, PrRecord>, ApplyError> {
    let mut conn = ctx.store.conn();
    let index = ctx.store.keys().repo_index(repo.as_str());
    let members = commit::index_members(&mut conn, &index).await?;
    let pr_keys: Vec<String> = members.into_iter().filter(|k| k.contains(":pr:")).collect();
    let stored = commit::load_many(&mut conn, &pr_keys).await?;
    stored_prs(&pr_keys, &stored, facts)
}

/// Decodes the PR records an index read returned (keys and values side by side),
/// leaving out keys with no record, and adds each to `facts`.
fn stored_prs(
    keys: &[String],
    stored: &[Option<StoredRecord>],
    facts: &mut Facts,
) -> Result<BTreeMap<u64, PrRecord>, ApplyError> {
    let mut out = BTreeMap::new();
    for (key, stored) in keys.iter().zip(stored) {
        if let Some(r) = decode_pr(key, stored.as_ref())? {
            facts.add_pr(&r);
            out.insert(r.number, r);
        }
    }
    Ok(out)
}

/// Steps one record the event reaches — `old` when the caller loaded it already,
/// else loaded here (a fresh record when the store has none) — and adds it to the
/// plan. Returns, for a PR, the issues it links before or after the step.
async fn apply(
    ctx: &Context,
    job: &Job,
    policy: &Policy,
    record: &RecordRef,
    old: Option<PrRecord>,
    reach: Reach,
    plan: &mut CommitPlan,
) -> Result<BTreeSet<u64>, ApplyError> {
    let (repo, n) = (&record.repo, record.number);
    match record.scope {
        Scope::Pr => {
            let old = match old {
                Some(old) => old,
                None => load_pr(ctx, repo, n).await?,
            };
            Ok(apply_pr(ctx, job, policy, &old, reach, plan))
        }
        Scope::Issue => {
            let old = load_issue(ctx, repo, n).await?;
            apply_issue(ctx, job, policy, &old, reach, plan);
            Ok(BTreeSet::new())
        }
    }
}

/// The stored record of PR `repo#n`, or a fresh one.
async fn load_pr(ctx: &Context, repo: &RepoName, n: u64) -> Result<PrRecord, ApplyError> {
    let key = ctx.store.keys().pr_record(repo.as_str(), n);
    let stored = commit::load(&mut ctx.store.conn(), &key).await?;
    Ok(decode_pr(&key, stored.as_ref())?.unwrap_or_else(|| PrRecord::new(repo.clone(), n)))
}

/// The stored record of issue `repo#n`, or a fresh one.
async fn load_issue(ctx: &Context, repo: &RepoName, n: u64) -> Result<IssueRecord, ApplyError> {
    let key = ctx.store.keys().issue_record(repo.as_str(), n);
    match commit::load(&mut ctx.store.conn(), &key).await? {
        None => Ok(IssueRecord::new(repo.clone(), n)),
        Some(s) => IssueRecord::from_json(&s.data)
            .map_err(|e| ApplyError::Poison(format!("corrupt record {key}: {e}"))),
    }
}

/// Steps PR record `old` and adds it to the plan; returns the issues its body links,
/// before or after the step (a `pull_request` event reaches them too).
fn apply_pr(
    ctx: &Context,
    job: &Job,
    policy: &Policy,
    old: &PrRecord,
    reach: Reach,
    plan: &mut CommitPlan,
) -> BTreeSet<u64> {
    let (repo, n) = (&old.repo, old.number);
    let now = streams::now_ms() as i64;
    let t = step(old, &job.event, now, policy);
    log_refusals(repo, n, &t.effects);
    observe_ci_poll_end(ctx, old, &t.record);
    super::review_metrics::observe(&ctx.metrics.reviews, old, &t.record);
    let links = route::linked_issues(old, &t.record);
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
        reach.always_recorded() || changed,
        &t.note,
        &t.effects,
    );
    let owner = WorkOwner::encode(false, repo.as_str(), n);
    track_work(plan, old_work, &t.record.work, &t.effects, &owner);
    links
}

/// `shepherd_ci_poll_reads_per_head`: when the CI poll of a head ends in this step
/// (its CI settled, a new head, the PR closed, or an Actions event took the reads
/// over), how many backoff reads it made. A step recomputed after a version conflict
/// can count one poll twice (rare; the figure is for operators, not for decisions).
fn observe_ci_poll_end(ctx: &Context, old: &PrRecord, new: &PrRecord) {
    let Some(poll) = old.ci_poll.as_ref().filter(|p| !p.events) else {
        return;
    };
    let same = new
        .ci_poll
        .as_ref()
        .is_some_and(|p| p.sha == poll.sha && !p.events);
    if !same {
        ctx.metrics.ci_poll_reads.observe(f64::from(poll.n));
    }
}

/// Steps issue record `old` and adds it to the plan.
fn apply_issue(
    ctx: &Context,
    job: &Job,
    policy: &Policy,
    old: &IssueRecord,
    reach: Reach,
    plan: &mut CommitPlan,
) {
    let (repo, n) = (&old.repo, old.number);
    let now = streams::now_ms() as i64;
    let t = step_issue(old, &job.event, now, policy);
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
        reach.always_recorded() || changed,
        &t.note,
        &t.effects,
    );
    let owner = WorkOwner::encode(true, repo.as_str(), n);
    track_work(plan, old_work, &t.record.work, &t.effects, &owner);
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
        (effect_fields::CAUSE_EVENT.to_owned(), job.name.clone()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::route::cases;

    /// The worker's route of every case of the core's routing table: the repository's
    /// records as an index read returns them (with a key whose record is gone), decoded
    /// and gathered by the worker's own code.
    #[test]
    fn the_worker_routes_the_table_like_the_core() {
        for case in cases::all() {
            let route = route::route(&case.event);
            let mut keys: Vec<String> = case
                .stored
                .iter()
                .map(|r| format!("{{t:0}}:pr:{}#{}", r.repo, r.number))
                .collect();
            let mut stored: Vec<Option<StoredRecord>> = case
                .stored
                .iter()
                .map(|r| {
                    Some(StoredRecord {
                        version: r.version,
                        data: r.to_json(),
                    })
                })
                .collect();
            keys.push("{t:0}:pr:acme/widgets#99".into());
            stored.push(None);
            let mut facts = Facts {
                linked_issues: case.linked_issues(),
                ..Facts::default()
            };
            let loaded = stored_prs(&keys, &stored, &mut facts)
                .unwrap_or_else(|_| panic!("{}: records decode", case.name));
            let recipients = route.recipients(&facts);
            assert_eq!(case.summary(&recipients), case.want, "{}", case.name);
            for r in recipients.iter().filter(|r| r.reach == Reach::OpenPr) {
                assert!(
                    loaded.contains_key(&r.record.number),
                    "{}: an open PR is stepped from the record read",
                    case.name
                );
            }
        }
    }

    #[test]
    fn a_corrupt_record_in_the_index_is_poison() {
        let keys = vec!["{t:0}:pr:acme/widgets#1".to_owned()];
        let stored = vec![Some(StoredRecord {
            version: 1,
            data: "{not json".into(),
        })];
        let got = stored_prs(&keys, &stored, &mut Facts::default());
        assert!(matches!(got, Err(ApplyError::Poison(m)) if m.contains("corrupt record")));
    }
}
