//! `shepherd replay`: re-inject archived deliveries through the normal path.
//!
//! A replay appends a copy of the archived entry to its shard's events stream with
//! `XADD` directly — bypassing the delivery dedup, which would otherwise answer
//! "duplicate" — plus the field `replay` naming the original (stream id, or
//! `dead-letter:<id>`). Workers then process it like any event and write `replay` into
//! the history entry; the core and the executor are idempotent, so a replay causes no
//! duplicate effects.
//!
//! `--dry-run` commits nothing: per event it loads every record the event reaches
//! (`core::route`, as a worker would: the PR, the issues a `pull_request` event's PR
//! links, the open PRs of a repository-wide event) — the current record, or the record
//! as an earlier event of the same run left it, in memory — runs `core::step` and
//! reports the transitions and effects.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use tracing::instrument;

use super::archive::{self, Archived};
use super::timefmt::{self, now_ms};
use super::{Ops, OpsError, parse_pr, parse_repo};
use crate::core::effect::Effect;
use crate::core::event::Event;
use crate::core::ids::{RepoName, Scope};
use crate::core::machine::{decide, decide_issue, step, step_issue};
use crate::core::record::{IssueRecord, PrRecord};
use crate::core::route::{self, Facts, FanOut, RecordRef};
use crate::store::commit;
use crate::store::event_entry::{self, EventEntry};
use crate::store::fields;

/// What to replay (exactly one of `delivery`, `pr`, `repo`, `dead_letter`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplayRequest {
    /// One delivery by id.
    pub delivery: Option<String>,
    /// Every delivery of a PR, `owner/repo#N`, in original order.
    pub pr: Option<String>,
    /// A repository's deliveries in `[since, until]`.
    pub repo: Option<String>,
    /// Start of the range (RFC 3339 or relative); default: the start of the archive.
    pub since: Option<String>,
    /// End of the range (RFC 3339 or relative); default: now.
    pub until: Option<String>,
    /// Dead letters: `""` for all, or one dead-letter entry id.
    pub dead_letter: Option<String>,
    /// Report what would happen; change nothing.
    pub dry_run: bool,
}

/// What a replay did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReplayReport {
    /// Nothing was changed.
    pub dry_run: bool,
    /// One item per replayed entry, in replay order.
    pub replayed: Vec<ReplayedEntry>,
}

/// One replayed entry.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReplayedEntry {
    /// What the new entry's `replay` field says: the original stream id or
    /// `dead-letter:<id>`.
    pub original: String,
    /// Id of the new events-stream entry (`None` on a dry run).
    pub new_id: Option<String>,
    /// Delivery id of the original.
    pub delivery: String,
    /// Event type of the original.
    pub event: String,
    /// Repository.
    pub repo: String,
    /// Dry run: the transitions the event would cause, one per record it touches.
    pub transitions: Vec<DryTransition>,
    /// Dry run: why the event would do nothing (ignored, undecodable), if so.
    pub note: Option<String>,
}

/// A transition computed in memory.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DryTransition {
    /// `owner/repo#N` (`issue owner/repo#N` for issue records).
    pub record: String,
    /// Phase before.
    pub phase_before: String,
    /// Phase after.
    pub phase_after: String,
    /// Version before and after.
    pub versions: (u64, u64),
    /// The core's note.
    pub note: String,
    /// The effects, as the core returns them.
    pub effects: Vec<Effect>,
}

/// Replays what `req` selects; `progress` receives one line per entry.
#[instrument(skip_all, fields(dry_run = req.dry_run))]
pub async fn replay(
    ops: &Ops,
    req: &ReplayRequest,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<ReplayReport, OpsError> {
    if req.dead_letter.is_some() {
        return super::dlq::replay_dead_letters(ops, req, progress).await;
    }
    let entries = select(ops, req).await?;
    let mut report = ReplayReport {
        dry_run: req.dry_run,
        replayed: Vec::new(),
    };
    let mut dry = DryState::default();
    let total = entries.len();
    for (i, e) in entries.into_iter().enumerate() {
        let item = if req.dry_run {
            dry.run(ops, &e, e.id.clone()).await?
        } else {
            requeue(ops, &e, &e.stream, &e.id).await?
        };
        progress(&format!(
            "[{}/{total}] {} {} {} {}",
            i + 1,
            item.original,
            item.event,
            item.delivery,
            describe(&item)
        ));
        report.replayed.push(item);
    }
    Ok(report)
}

/// A one-line description of a replayed entry for progress output.
pub(crate) fn describe(item: &ReplayedEntry) -> String {
    match (&item.new_id, &item.note) {
        (Some(id), _) => format!("→ queued as {id}"),
        (None, Some(note)) => format!("→ {note}"),
        (None, None) => item
            .transitions
            .iter()
            .map(|t| {
                format!(
                    "{}: {} → {} ({} effects) {}",
                    t.record,
                    t.phase_before,
                    t.phase_after,
                    t.effects.len(),
                    t.note
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    }
}

/// The archived entries `req` selects, oldest first.
async fn select(ops: &Ops, req: &ReplayRequest) -> Result<Vec<Archived>, OpsError> {
    if let Some(d) = &req.delivery {
        return Ok(vec![archive::find_delivery(ops, d).await?]);
    }
    if let Some(pr) = &req.pr {
        let t = parse_pr(pr)?;
        return pr_deliveries(ops, &t.repo, t.number).await;
    }
    if let Some(repo) = &req.repo {
        let repo = parse_repo(repo)?;
        let now = now_ms();
        let time = |t: &Option<String>, default: i64| match t {
            None => Ok(default),
            Some(t) => timefmt::parse_time(t, now).map_err(OpsError::BadRequest),
        };
        let since = time(&req.since, 0)?;
        let until = time(&req.until, now)?;
        if since > until {
            return Err(OpsError::BadRequest("--since is after --until".into()));
        }
        let stream = ops.keys.events(ops.keys.shard_of(repo.as_str()));
        let mut conn = ops.conn();
        return archive::scan(
            &mut conn,
            &stream,
            &format!("{since}-0"),
            &format!("{until}-18446744073709551615"),
            |e| e.is_webhook() && !e.is_replay() && e.is_for_repo(repo.as_str()),
        )
        .await;
    }
    Err(OpsError::BadRequest(
        "name what to replay: delivery, pr, repo (with since/until) or dead_letter".into(),
    ))
}

/// Every original webhook delivery in the archive whose event names PR `repo#n`
/// (`core::route`; repository-wide events are left out: replaying one would reach
/// every open PR).
pub async fn pr_deliveries(ops: &Ops, repo: &RepoName, n: u64) -> Result<Vec<Archived>, OpsError> {
    let stream = ops.keys.events(ops.keys.shard_of(repo.as_str()));
    let mut conn = ops.conn();
    let want = Some(RecordRef::pr(repo, n));
    archive::scan(&mut conn, &stream, "-", "+", |e| {
        e.is_webhook()
            && !e.is_replay()
            && e.is_for_repo(repo.as_str())
            && matches!(e.decode(), Ok(Some(ev)) if route::route(&ev).named == want)
    })
    .await
}

/// Appends a copy of `e` to `stream` with `replay = original` (and a fresh receive
/// time), bypassing the delivery dedup.
pub(crate) async fn requeue(
    ops: &Ops,
    e: &Archived,
    stream: &str,
    original: &str,
) -> Result<ReplayedEntry, OpsError> {
    let received = u64::try_from(now_ms()).unwrap_or(0);
    let entry = EventEntry::replay_of(&e.fields, original, received);
    let new_id = event_entry::append(&mut ops.conn(), stream, &entry).await?;
    tracing::info!(
        replay = original,
        new_id = %new_id,
        delivery = e.field(fields::DELIVERY),
        event = e.field(fields::EVENT),
        "replayed an archived entry"
    );
    Ok(item_of(e, original, Some(new_id)))
}

/// The report item of an entry.
fn item_of(e: &Archived, original: &str, new_id: Option<String>) -> ReplayedEntry {
    ReplayedEntry {
        original: original.to_owned(),
        new_id,
        delivery: e.field(fields::DELIVERY).to_owned(),
        event: e.field(fields::EVENT).to_owned(),
        repo: e.field(fields::REPO).to_owned(),
        transitions: Vec::new(),
        note: None,
    }
}

/// Records as a dry run has left them (or loaded them), by record key.
#[derive(Default)]
pub(crate) struct DryState {
    /// PR records.
    prs: HashMap<String, PrRecord>,
    /// Issue records.
    issues: HashMap<String, IssueRecord>,
}

impl DryState {
    /// Steps `e` in memory against the current (or earlier dry-run) records of every
    /// record its event reaches (`core::route`, as the workers route it). A record the
    /// event names is always reported; one it fans out to only when it changes, as
    /// only then would a worker write it.
    pub(crate) async fn run(
        &mut self,
        ops: &Ops,
        e: &Archived,
        original: String,
    ) -> Result<ReplayedEntry, OpsError> {
        let mut item = item_of(e, &original, None);
        let event = match e.decode() {
            Ok(Some(ev)) => ev,
            Ok(None) => {
                item.note =
                    Some("ignored (an event type or action Shepherd does not act on)".into());
                return Ok(item);
            }
            Err(err) => {
                item.note = Some(format!("undecodable: {err}"));
                return Ok(item);
            }
        };
        let route = route::route(&event);
        if route.is_empty() {
            item.note = Some("no record to route to".into());
            return Ok(item);
        }
        let now = now_ms();
        let mut facts = Facts::default();
        if let Some(named) = &route.named {
            let (t, links) = self.step(ops, named, &event, now).await?;
            facts.linked_issues = links;
            item.transitions.push(t);
        }
        if let FanOut::OpenPrs(repo) = &route.fan_out {
            self.repo_facts(ops, repo, &mut facts).await?;
        }
        for r in route.fan_out(&facts) {
            let (t, _) = self.step(ops, &r.record, &event, now).await?;
            if r.reach.always_recorded() || t.versions.0 != t.versions.1 {
                item.transitions.push(t);
            }
        }
        Ok(item)
    }

    /// Adds to `facts` every PR record of `repo` the dry run knows: the repository
    /// index's, as earlier events of this run left them, and those earlier events
    /// created.
    async fn repo_facts(
        &mut self,
        ops: &Ops,
        repo: &RepoName,
        facts: &mut Facts,
    ) -> Result<(), OpsError> {
        let index = ops.keys.repo_index(repo.as_str());
        let members = commit::index_members(&mut ops.conn(), &index).await?;
        let unloaded: Vec<String> = members
            .into_iter()
            .filter(|k| k.contains(":pr:") && !self.prs.contains_key(k))
            .collect();
        let stored = commit::load_many(&mut ops.conn(), &unloaded).await?;
        for (key, stored) in unloaded.into_iter().zip(stored) {
            if let Some(s) = stored {
                self.prs.insert(key.clone(), decode_pr(&key, &s.data)?);
            }
        }
        self.add_known_prs(repo, facts);
        Ok(())
    }

    /// Adds to `facts` the PR records of `repo` held in memory.
    fn add_known_prs(&self, repo: &RepoName, facts: &mut Facts) {
        for r in self.prs.values().filter(|r| r.repo == *repo) {
            facts.add_pr(r);
        }
    }

    /// Steps one record in memory; returns the transition and, for a PR, the issues it
    /// links before or after.
    async fn step(
        &mut self,
        ops: &Ops,
        record: &RecordRef,
        event: &Event,
        now: i64,
    ) -> Result<(DryTransition, BTreeSet<u64>), OpsError> {
        match record.scope {
            Scope::Pr => {
                self.step_pr(ops, &record.repo, record.number, event, now)
                    .await
            }
            Scope::Issue => {
                let t = (self.step_issue(ops, &record.repo, record.number, event, now)).await?;
                Ok((t, BTreeSet::new()))
            }
        }
    }

    /// One PR step in memory.
    async fn step_pr(
        &mut self,
        ops: &Ops,
        repo: &RepoName,
        n: u64,
        event: &Event,
        now: i64,
    ) -> Result<(DryTransition, BTreeSet<u64>), OpsError> {
        let key = ops.keys.pr_record(repo.as_str(), n);
        let old = match self.prs.get(&key) {
            Some(r) => r.clone(),
            None => load_pr(ops, &key)
                .await?
                .unwrap_or_else(|| PrRecord::new(repo.clone(), n)),
        };
        let policy = ops.policy.for_repo(repo);
        let t = step(&old, event, now, &policy);
        let links = route::linked_issues(&old, &t.record);
        let out = DryTransition {
            record: format!("{repo}#{n}"),
            phase_before: decide(&old, &policy, now).phase.as_str().to_owned(),
            phase_after: decide(&t.record, &policy, now).phase.as_str().to_owned(),
            versions: (old.version, t.record.version),
            note: t.note,
            effects: t.effects,
        };
        self.prs.insert(key, t.record);
        Ok((out, links))
    }

    /// One issue step in memory.
    async fn step_issue(
        &mut self,
        ops: &Ops,
        repo: &RepoName,
        n: u64,
        event: &Event,
        now: i64,
    ) -> Result<DryTransition, OpsError> {
        let key = ops.keys.issue_record(repo.as_str(), n);
        let old = match self.issues.get(&key) {
            Some(r) => r.clone(),
            None => match commit::load(&mut ops.conn(), &key).await? {
                None => IssueRecord::new(repo.clone(), n),
                Some(s) => IssueRecord::from_json(&s.data)
                    .map_err(|e| OpsError::Other(anyhow::anyhow!("corrupt record {key}: {e}")))?,
            },
        };
        let policy = ops.policy.for_repo(repo);
        let t = step_issue(&old, event, now, &policy);
        let name = |r: &IssueRecord| {
            serde_json::to_value(decide_issue(r, &policy).phase)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        };
        let out = DryTransition {
            record: format!("issue {repo}#{n}"),
            phase_before: name(&old),
            phase_after: name(&t.record),
            versions: (old.version, t.record.version),
            note: t.note,
            effects: t.effects,
        };
        self.issues.insert(key, t.record);
        Ok(out)
    }
}

/// Loads and decodes a PR record (`None` when there is none).
pub(crate) async fn load_pr(ops: &Ops, key: &str) -> Result<Option<PrRecord>, OpsError> {
    match commit::load(&mut ops.conn(), key).await? {
        None => Ok(None),
        Some(s) => decode_pr(key, &s.data).map(Some),
    }
}

/// Decodes the stored PR record at `key`.
fn decode_pr(key: &str, data: &str) -> Result<PrRecord, OpsError> {
    PrRecord::from_json(data)
        .map_err(|e| OpsError::Other(anyhow::anyhow!("corrupt record {key}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::route::cases;

    /// The dry run's route of every case of the core's routing table, with the
    /// repository's records in the dry run's memory (next to an open PR of another
    /// repository, which no case reaches).
    #[test]
    fn the_dry_run_routes_the_table_like_the_core() {
        let other: RepoName = "acme/gadgets".parse().unwrap();
        let mut foreign = PrRecord::new(other, 50);
        foreign.pr = cases::all()
            .iter()
            .find_map(|c| c.stored.iter().find(|r| r.is_open()))
            .and_then(|r| r.pr.clone());
        assert!(foreign.is_open(), "an open record of another repository");
        for case in cases::all() {
            let mut dry = DryState::default();
            dry.prs.insert("foreign".into(), foreign.clone());
            for r in &case.stored {
                dry.prs.insert(format!("pr {}", r.number), r.clone());
            }
            let mut facts = Facts {
                linked_issues: case.linked_issues(),
                ..Facts::default()
            };
            let route = route::route(&case.event);
            if let FanOut::OpenPrs(repo) = &route.fan_out {
                dry.add_known_prs(repo, &mut facts);
            }
            assert_eq!(
                case.summary(&route.recipients(&facts)),
                case.want,
                "{}",
                case.name
            );
        }
    }
}
