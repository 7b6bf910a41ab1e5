//! `shepherd dlq` and `replay --dead-letter`: the dead-letter streams of every shard.
//!
//! An entry is dead-lettered by the workers (or the executor) with `dl_*` fields in
//! front of the original entry's fields (`store::streams::dead_letter_fields`). Retry
//! appends the original fields to the stream it came from, with `replay =
//! dead-letter:<original id>`, and deletes the dead letter — both in one Lua call, so
//! an entry is never lost between the two nor re-queued twice by concurrent retries.

use serde::{Deserialize, Serialize};
use tracing::instrument;

use super::archive::{self, Archived};
use super::replay::{DryState, ReplayReport, ReplayRequest, ReplayedEntry, describe};
use super::timefmt::{now_ms, rfc3339};
use super::{Ops, OpsError};
use crate::store::event_entry::EventEntry;
use crate::store::streams::dead_letter_fields as dl;
use crate::store::{dead_letters, fields};

/// One dead letter, summarized.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Dead-letter entry id.
    pub id: String,
    /// Shard.
    pub shard: u16,
    /// Why it was dead-lettered.
    pub reason: String,
    /// Stream it came from.
    pub stream: String,
    /// Its id there.
    pub original_id: String,
    /// Deliveries before it was given up on.
    pub deliveries: String,
    /// When it was dead-lettered (RFC 3339).
    pub at: String,
    /// Delivery id (events) or effect id (effects).
    pub delivery: String,
    /// Event type or effect kind.
    pub event: String,
    /// Repository.
    pub repo: String,
    /// Every field (only in `show`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<std::collections::BTreeMap<String, String>>,
}

impl DeadLetter {
    fn of(shard: u16, e: &Archived, full: bool) -> Self {
        let at = e
            .field(dl::AT)
            .parse::<i64>()
            .map(rfc3339)
            .unwrap_or_default();
        let or = |a: &str, b: &str| {
            if e.field(a).is_empty() {
                e.field(b).to_owned()
            } else {
                e.field(a).to_owned()
            }
        };
        DeadLetter {
            id: e.id.clone(),
            shard,
            reason: e.field(dl::REASON).to_owned(),
            stream: e.field(dl::STREAM).to_owned(),
            original_id: e.field(dl::ID).to_owned(),
            deliveries: e.field(dl::DELIVERIES).to_owned(),
            at,
            delivery: or(fields::DELIVERY, "id"),
            event: or(fields::EVENT, "kind"),
            repo: e.field(fields::REPO).to_owned(),
            fields: full.then(|| e.fields.clone().into_iter().collect()),
        }
    }
}

/// Every dead letter of every shard, oldest first per shard.
#[instrument(skip_all)]
pub async fn list(ops: &Ops) -> Result<Vec<DeadLetter>, OpsError> {
    Ok(all(ops)
        .await?
        .iter()
        .map(|(s, e)| DeadLetter::of(*s, e, false))
        .collect())
}

/// One dead letter in full.
#[instrument(skip_all, fields(id))]
pub async fn show(ops: &Ops, id: &str) -> Result<DeadLetter, OpsError> {
    let (shard, e) = find(ops, id).await?;
    Ok(DeadLetter::of(shard, &e, true))
}

/// Deletes dead letters (`None`: all); returns how many were deleted.
#[instrument(skip_all, fields(id))]
pub async fn drop_entries(ops: &Ops, id: Option<&str>) -> Result<u64, OpsError> {
    let mut conn = ops.conn();
    let victims = match id {
        Some(id) => vec![find(ops, id).await?],
        None => all(ops).await?,
    };
    let mut n = 0;
    for (shard, e) in victims {
        let deleted =
            dead_letters::drop_entry(&mut conn, &ops.keys.dead_letters(shard), &e.id).await?;
        tracing::info!(dead_letter = %e.id, "dropped a dead letter");
        n += deleted;
    }
    Ok(n)
}

/// `replay --dead-letter [ID]` and `dlq retry`: re-queue dead letters (all when the id
/// is empty) onto their streams and delete them; with `dry_run`, step them in memory.
#[instrument(skip_all, fields(dry_run = req.dry_run))]
pub async fn replay_dead_letters(
    ops: &Ops,
    req: &ReplayRequest,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<ReplayReport, OpsError> {
    let id = req.dead_letter.as_deref().unwrap_or("");
    let entries = if id.is_empty() {
        all(ops).await?
    } else {
        vec![find(ops, id).await?]
    };
    let mut report = ReplayReport {
        dry_run: req.dry_run,
        replayed: Vec::new(),
    };
    let mut dry = DryState::default();
    let total = entries.len();
    for (i, (shard, e)) in entries.into_iter().enumerate() {
        let original = format!("dead-letter:{}", e.field(dl::ID));
        let item = if req.dry_run {
            dry.run(ops, &e, original).await?
        } else {
            retry_one(ops, shard, &e, &original).await?
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

/// Re-queues one dead letter and deletes it.
async fn retry_one(
    ops: &Ops,
    shard: u16,
    e: &Archived,
    original: &str,
) -> Result<ReplayedEntry, OpsError> {
    let dead = ops.keys.dead_letters(shard);
    let target = e.field(dl::STREAM);
    if target == ops.keys.results() {
        return retry_result(ops, shard, e, original).await;
    }
    let allowed = [ops.keys.events(shard), ops.keys.effects(shard)];
    if !allowed.iter().any(|s| s == target) {
        return Err(OpsError::BadRequest(format!(
            "dead letter {} came from {target:?}, not a stream of shard {shard}",
            e.id
        )));
    }
    let mut conn = ops.conn();
    let received = u64::try_from(now_ms()).unwrap_or(0);
    let new_id = if *target == ops.keys.events(shard) {
        let entry = EventEntry::replay_of(&e.fields, original, received);
        dead_letters::requeue(&mut conn, &dead, &e.id, target, entry).await?
    } else {
        // An effects entry: its own fields, with a fresh `received` and the replay mark.
        let mut names: Vec<&String> = e.fields.keys().collect();
        names.sort();
        let mut pairs: Vec<(&str, String)> = names
            .into_iter()
            .filter(|k| !(k.starts_with("dl_") || *k == fields::REPLAY || *k == fields::RECEIVED))
            .map(|k| (k.as_str(), e.fields[k].clone()))
            .collect();
        pairs.push((fields::RECEIVED, received.to_string()));
        pairs.push((fields::REPLAY, original.to_owned()));
        dead_letters::requeue(&mut conn, &dead, &e.id, target, pairs).await?
    };
    let Some(new_id) = new_id else {
        return Err(OpsError::NotFound(format!(
            "dead letter {} was retried or dropped meanwhile",
            e.id
        )));
    };
    tracing::info!(replay = original, new_id = %new_id, dead_letter = %e.id, "re-queued a dead letter");
    Ok(ReplayedEntry {
        original: original.to_owned(),
        new_id: Some(new_id),
        delivery: e.field(fields::DELIVERY).to_owned(),
        event: e.field(fields::EVENT).to_owned(),
        repo: e.field(fields::REPO).to_owned(),
        transitions: Vec::new(),
        note: None,
    })
}

/// Re-queues a dead-lettered work result onto `<prefix>:results`. That stream has no
/// shard hash tag (a contract name), so the append and the delete are two commands,
/// not one script (`dead_letters::requeue_unsharded`: at worst a crash in between
/// leaves the dead letter to be dropped by hand; the results intake ignores a second
/// report of the same work item).
async fn retry_result(
    ops: &Ops,
    shard: u16,
    e: &Archived,
    original: &str,
) -> Result<ReplayedEntry, OpsError> {
    let mut names: Vec<&String> = e.fields.keys().collect();
    names.sort();
    let pairs: Vec<(&String, &String)> = names
        .into_iter()
        .filter(|k| !k.starts_with("dl_"))
        .map(|k| (k, &e.fields[k]))
        .collect();
    let (dead, results) = (ops.keys.dead_letters(shard), ops.keys.results());
    let new_id =
        dead_letters::requeue_unsharded(&mut ops.conn(), &dead, &e.id, &results, pairs).await?;
    tracing::info!(replay = original, new_id = %new_id, dead_letter = %e.id, "re-queued a dead-lettered result");
    Ok(ReplayedEntry {
        original: original.to_owned(),
        new_id: Some(new_id),
        delivery: e.field(fields::DELIVERY).to_owned(),
        event: "result".to_owned(),
        repo: e.field(fields::REPO).to_owned(),
        transitions: Vec::new(),
        note: None,
    })
}

/// Every dead letter with its shard.
async fn all(ops: &Ops) -> Result<Vec<(u16, Archived)>, OpsError> {
    let mut conn = ops.conn();
    let mut out = Vec::new();
    for shard in ops.shards() {
        let entries =
            archive::scan(&mut conn, &ops.keys.dead_letters(shard), "-", "+", |_| true).await?;
        out.extend(entries.into_iter().map(|e| (shard, e)));
    }
    Ok(out)
}

/// The dead letter `id` in whichever shard holds it.
async fn find(ops: &Ops, id: &str) -> Result<(u16, Archived), OpsError> {
    if !is_stream_id(id) {
        return Err(OpsError::BadRequest(format!("{id:?} is not a stream id")));
    }
    let mut conn = ops.conn();
    for shard in ops.shards() {
        if let Some(e) = archive::entry(&mut conn, &ops.keys.dead_letters(shard), id).await? {
            return Ok((shard, e));
        }
    }
    Err(OpsError::NotFound(format!("no dead letter {id}")))
}

/// `<ms>-<seq>` or `<ms>`.
fn is_stream_id(id: &str) -> bool {
    let mut parts = id.split('-');
    let ok =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let first = ok(parts.next());
    let second = parts.next();
    first && (second.is_none() || ok(second)) && parts.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ids() {
        assert!(is_stream_id("1700000000000-0"));
        assert!(is_stream_id("1700000000000"));
        assert!(!is_stream_id("abc"));
        assert!(!is_stream_id("1-2-3"));
        assert!(!is_stream_id("-1"));
        assert!(!is_stream_id(""));
    }
}
