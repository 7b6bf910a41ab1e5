//! `shepherd rebuild owner/repo#N`: fold the PR's archived events from an empty record
//! through the same decode + `core::step` path the workers use, diff the result with
//! the stored record, and with `--apply` replace the stored record (compare-and-set on
//! the version read, through the workers' commit script, with a history entry).
//!
//! Events folded: every archived entry of the PR's repository whose event reaches the
//! PR as `core::route` routes it for the workers — events naming the PR, and
//! repository-wide events (pushes, statuses) while the folded record is open — each
//! stepped at the time it was received. Only the replay window is archived: a PR older
//! than the window folds from its first retained event. Effects of the fold are
//! discarded — they happened when the events were first processed; the work index and
//! claim timers are brought in line with the rebuilt record instead (`track_work`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::instrument;

use super::diff::{self, Change};
use super::{Ops, OpsError, PrTarget, archive, parse_pr};
use crate::core::event::Event;
use crate::core::ids::Scope;
use crate::core::machine::{claim_timer, decide, standing_timers, step};
use crate::core::record::PrRecord;
use crate::core::route::{self, Facts, RecordRef};
use crate::store::commit::{
    self, CommitOutcome, CommitPlan, RecordWrite, TimerWrite, history_fields,
};
use crate::store::fields;
use crate::store::work::WorkOwner;

/// What `rebuild` asks for.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RebuildRequest {
    /// `owner/repo#N`.
    pub target: String,
    /// Replace the stored record.
    pub apply: bool,
}

/// What `rebuild` found (and did).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RebuildReport {
    /// `owner/repo#N`.
    pub target: String,
    /// Archived events folded.
    pub events_folded: usize,
    /// Version of the stored record (0: none).
    pub stored_version: u64,
    /// Differences stored → folded (the version is not compared).
    pub changes: Vec<Change>,
    /// The folded record.
    pub folded: Value,
    /// The folded record replaced the stored one.
    pub applied: bool,
    /// Version written when applied.
    pub new_version: Option<u64>,
    /// The read of what a previous dispatcher left (`core::legacy`), made here when the
    /// folded record's read never answered in the archive: what it found, or why not.
    #[serde(default)]
    pub legacy: Option<String>,
}

/// Folds, diffs and (with `apply`) replaces.
#[instrument(skip_all, fields(target = %req.target, apply = req.apply))]
pub async fn rebuild(ops: &Ops, req: &RebuildRequest) -> Result<RebuildReport, OpsError> {
    let t = parse_pr(&req.target)?;
    let (mut folded, n_events) = fold(ops, &t).await?;
    let legacy = read_legacy(ops, &t, &mut folded).await;
    let key = ops.keys.pr_record(t.repo.as_str(), t.number);
    let stored = commit::load(&mut ops.conn(), &key).await?;
    let stored_version = stored.as_ref().map_or(0, |s| s.version);
    let stored_json: Value = stored
        .as_ref()
        .map(|s| serde_json::from_str(&s.data).unwrap_or(Value::String(s.data.clone())))
        .unwrap_or(Value::Null);
    let mut folded_json = serde_json::to_value(&folded).map_err(anyhow::Error::from)?;
    let changes = diff::diff(
        &without_version(&stored_json),
        &without_version(&folded_json),
    );
    let mut report = RebuildReport {
        target: t.to_string(),
        events_folded: n_events,
        stored_version,
        changes,
        folded: folded_json.clone(),
        applied: false,
        new_version: None,
        legacy,
    };
    if req.apply {
        if n_events == 0 {
            return Err(OpsError::NotFound(format!(
                "no archived events for {t}: nothing to rebuild from"
            )));
        }
        let stored_work = stored
            .as_ref()
            .and_then(|s| PrRecord::from_json(&s.data).ok())
            .and_then(|r| r.work.active.map(|a| a.item.id.to_string()));
        let version = apply(ops, &t, folded, stored_version, stored_work).await?;
        folded_json["version"] = version.into();
        report.folded = folded_json;
        report.applied = true;
        report.new_version = Some(version);
    }
    Ok(report)
}

/// The PR record folded from the archive, and how many events went in.
pub async fn fold(ops: &Ops, t: &PrTarget) -> Result<(PrRecord, usize), OpsError> {
    let repo = t.repo.clone();
    let stream = ops.keys.events(ops.keys.shard_of(repo.as_str()));
    let entries = archive::scan(&mut ops.conn(), &stream, "-", "+", |e| {
        e.is_for_repo(repo.as_str())
    })
    .await?;
    let policy = ops.policy.for_repo(&repo);
    let mut record = PrRecord::new(repo.clone(), t.number);
    let mut n = 0;
    for e in entries {
        let Ok(Some(event)) = e.decode() else {
            continue;
        };
        if !reaches(&event, &record) {
            continue;
        }
        let at = e
            .field(fields::RECEIVED)
            .parse::<i64>()
            .ok()
            .filter(|ms| *ms > 0)
            .unwrap_or_else(|| e.time_ms());
        record = step(&record, &event, at, &policy).record;
        n += 1;
    }
    Ok((record, n))
}

/// The first sight in the fold asked for the comments / timeline of a previous
/// dispatcher (`core::legacy`) and the archive holds no answer (it was trimmed, or the
/// read never finished): read them now and fold the answer in, so the rebuilt record
/// is seeded as the workers' would be. `None` when nothing was to read.
async fn read_legacy(ops: &Ops, t: &PrTarget, folded: &mut PrRecord) -> Option<String> {
    let (comments, claim_label) = crate::core::legacy::unread(&folded.work)?;
    let client = match crate::forgejo::ForgejoClient::from_config(&ops.config, None) {
        Ok(c) => c,
        Err(e) => {
            return Some(format!(
                "not read (no Forgejo API: {e:#}); the record's timer ends the wait"
            ));
        }
    };
    let what = crate::worker::legacy::LegacyRead {
        repo: &t.repo,
        scope: Scope::Pr,
        number: t.number,
        comments,
        claim_label: claim_label.as_deref(),
    };
    let now = super::timefmt::now_ms();
    match crate::worker::legacy::read(&client, &what, || now).await {
        Ok(event) => {
            let policy = ops.policy.for_repo(&t.repo);
            *folded = step(folded, &event, now, &policy).record;
            Some(match crate::core::legacy::summary(&folded.work) {
                Some(s) => format!("read from Forgejo: {s}"),
                None => "read from Forgejo: nothing carried over".to_owned(),
            })
        }
        Err(e) => Some(format!(
            "read failed ({e}); the record's timer ends the wait"
        )),
    }
}

/// Whether a worker would apply `event` to the PR whose record is folded so far
/// (`core::route`, with that record as all the store knows): events naming the PR, and
/// repository-wide ones while the record is open.
fn reaches(event: &Event, record: &PrRecord) -> bool {
    let mut facts = Facts::default();
    facts.add_pr(record);
    let me = RecordRef::pr(&record.repo, record.number);
    route::route(event)
        .recipients(&facts)
        .iter()
        .any(|r| r.record == me)
}

/// Writes `folded` over the stored record at `expect` (CAS); returns the new version.
/// `stored_work` is the active work id of the record replaced: the work index must
/// follow the record, as on every worker commit (see [`track_work`]).
async fn apply(
    ops: &Ops,
    t: &PrTarget,
    mut folded: PrRecord,
    expect: u64,
    stored_work: Option<String>,
) -> Result<u64, OpsError> {
    let repo = t.repo.as_str();
    let version = expect + 1;
    folded.version = version;
    let policy = ops.policy.for_repo(&t.repo);
    let now = super::timefmt::now_ms();
    let phase = decide(&folded, &policy, now).phase.as_str().to_owned();
    let history = vec![
        (history_fields::ENTRY.to_owned(), String::new()),
        (history_fields::DELIVERY.to_owned(), "rebuild".to_owned()),
        (history_fields::EVENT.to_owned(), "rebuild".to_owned()),
        (
            history_fields::NOTE.to_owned(),
            "rebuild --apply: record replaced by the fold of the archived events".to_owned(),
        ),
        (history_fields::PHASE.to_owned(), phase.clone()),
        (history_fields::VERSION.to_owned(), version.to_string()),
        (history_fields::EFFECTS.to_owned(), "0".to_owned()),
        (history_fields::AT.to_owned(), now.to_string()),
    ];
    let mut plan = CommitPlan {
        shard: ops.keys.shard_of(repo),
        entry_id: None,
        records: vec![RecordWrite {
            key: ops.keys.pr_record(repo, t.number),
            history_key: ops.keys.history(repo, t.number),
            index_key: ops.keys.repo_index(repo),
            expect,
            data: Some(folded.to_json()),
            phase,
            history,
            indexed: folded.is_open() || folded.pr.is_none(),
        }],
        ended_ttl_secs: ops.config.retention.as_secs(),
        ..CommitPlan::default()
    };
    track_work(&mut plan, &folded, stored_work, t);
    // The fold discarded the effects: the timers the record stands on (legacy read
    // deadline or foreign claim's TTL, push grace, transient back-off) are armed here,
    // or the record could wait for good.
    for timer in standing_timers(&folded.work, &policy) {
        let record = plan.records[0].key.clone();
        plan.timers.push(TimerWrite::for_timer(
            &record,
            &t.repo,
            Scope::Pr,
            t.number,
            &timer,
        ));
    }
    match commit::commit(&mut ops.conn(), &ops.keys, &plan).await? {
        CommitOutcome::Committed => {
            tracing::info!(target = %t, version, "rebuilt record applied");
            Ok(version)
        }
        CommitOutcome::Conflict { found, .. } => Err(OpsError::Conflict(format!(
            "{t} changed meanwhile (version {found}, expected {expect}); run rebuild again"
        ))),
        CommitOutcome::Stale => Err(OpsError::Conflict(format!("{t}: commit refused"))),
    }
}

/// Keeps the work index and the claim timers true to the rebuilt record. The fold
/// discards effects, so without this (issue 12) the replaced record's work id stayed
/// in the index for good (results accepted for work no record holds), and a work item
/// the fold made active had no index entry (its result refused) and no claim-expiry
/// timer (nothing would ever end it).
///
/// - The replaced record's active work, unless the rebuilt record holds the same id,
///   ends (index entry removed, ended marker set).
/// - A work item only the rebuilt record holds was never dispatched by this fold: it
///   gets its index entry and its claim-expiry timer at its recorded expiry (already
///   due when that is past), so the core itself expires it and dispatches again.
fn track_work(plan: &mut CommitPlan, folded: &PrRecord, stored: Option<String>, t: &PrTarget) {
    let active = folded.work.active.as_ref().map(|a| &a.item);
    let new = active.map(|item| item.id.to_string());
    if new == stored {
        return;
    }
    if let Some(old) = stored {
        plan.work_end.push(old);
    }
    let Some(item) = active else { return };
    let id = item.id.to_string();
    let record = plan.records[0].key.clone();
    plan.work_add.push((
        id.clone(),
        WorkOwner::encode(false, t.repo.as_str(), t.number),
    ));
    let timer = claim_timer(item);
    plan.timers.push(TimerWrite::for_timer(
        &record,
        &t.repo,
        Scope::Pr,
        t.number,
        &timer,
    ));
}

/// A record's JSON without its version (which a fold cannot reproduce).
fn without_version(v: &Value) -> Value {
    let mut v = v.clone();
    if let Value::Object(m) = &mut v {
        m.remove("version");
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::route::cases;

    /// The fold's choice for every case of the core's routing table: each PR record of
    /// the case (and the named PR, stored or fresh) is folded with the event exactly
    /// when the table's recipients include it.
    #[test]
    fn the_fold_routes_the_table_like_the_core() {
        let repo = cases::repo();
        for case in cases::all() {
            let mut records = case.stored.clone();
            if let Some(named) = route::route(&case.event).named
                && named.scope == crate::core::ids::Scope::Pr
                && case.stored_pr(named.number).is_none()
            {
                records.push(PrRecord::new(named.repo, named.number));
            }
            for r in &records {
                let me = RecordRef::pr(&repo, r.number);
                let want = case
                    .want
                    .iter()
                    .any(|line| cases::record_of(&repo, line) == me);
                assert_eq!(
                    reaches(&case.event, r),
                    want,
                    "{}: #{}",
                    case.name,
                    r.number
                );
            }
        }
    }
}
