//! The archive: the events streams keep every delivery and internal event for the
//! replay window (DESIGN §3), so operator tools read them here — one entry by id, a
//! delivery by its dedup marker, or a filtered scan of an id range — and decode
//! entries the way the workers do (webhooks through `core::normalize`, internal events
//! from JSON).

use std::collections::HashMap;

use crate::store::Conn;
use serde::Serialize;

use super::{Ops, OpsError};
use crate::core::event::Event;
use crate::core::normalize::normalize;
use crate::store::{self, fields};

/// Entries read per `XRANGE` page while scanning (webhook bodies run to ~15 KB).
const PAGE: usize = 200;

/// One archived stream entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Archived {
    /// Stream key it was read from.
    pub stream: String,
    /// Stream id (`<ms>-<seq>`).
    pub id: String,
    /// Field → value (text; bodies are JSON).
    pub fields: HashMap<String, String>,
}

impl Archived {
    /// A field, or `""` when absent.
    pub fn field(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", String::as_str)
    }

    /// The unix-ms time in the stream id.
    pub fn time_ms(&self) -> i64 {
        self.id
            .split('-')
            .next()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0)
    }

    /// True when the entry is itself a replay of another.
    pub fn is_replay(&self) -> bool {
        !self.field(fields::REPLAY).is_empty()
    }

    /// True for a Forgejo delivery (as opposed to an internal event).
    pub fn is_webhook(&self) -> bool {
        self.field(fields::KIND) == fields::KIND_WEBHOOK
    }

    /// True when the entry's repository is `repo` (case-insensitive).
    pub fn is_for_repo(&self, repo: &str) -> bool {
        self.field(fields::REPO).eq_ignore_ascii_case(repo)
    }

    /// Decodes the entry as the worker does: `Ok(None)` for a known-but-ignored event.
    pub fn decode(&self) -> Result<Option<Event>, String> {
        let body = self.field(fields::BODY).as_bytes();
        match self.field(fields::KIND) {
            fields::KIND_WEBHOOK => {
                normalize(self.field(fields::EVENT), body).map_err(|e| e.to_string())
            }
            fields::KIND_INTERNAL => serde_json::from_slice(body)
                .map(Some)
                .map_err(|e| e.to_string()),
            other => Err(format!("unknown entry kind {other:?}")),
        }
    }
}

/// Entries of `stream` with ids in `[start, end]` (`-`/`+` for the ends), at most
/// `count`.
async fn range(
    conn: &mut Conn,
    stream: &str,
    start: &str,
    end: &str,
    count: usize,
) -> Result<Vec<Archived>, OpsError> {
    let entries = store::archive::range(conn, stream, start, end, count).await?;
    Ok(convert(stream, entries))
}

/// One entry of `stream` by id.
pub async fn entry(conn: &mut Conn, stream: &str, id: &str) -> Result<Option<Archived>, OpsError> {
    Ok(range(conn, stream, id, id, 1).await?.into_iter().next())
}

/// Every entry of `stream` with ids in `[start, end]` that `keep` accepts, in order.
pub async fn scan(
    conn: &mut Conn,
    stream: &str,
    start: &str,
    end: &str,
    mut keep: impl FnMut(&Archived) -> bool,
) -> Result<Vec<Archived>, OpsError> {
    let mut out = Vec::new();
    let mut from = start.to_owned();
    loop {
        let page = range(conn, stream, &from, end, PAGE).await?;
        let full = page.len() == PAGE;
        let Some(last) = page.last().map(|e| e.id.clone()) else {
            break;
        };
        out.extend(page.into_iter().filter(|e| keep(e)));
        if !full {
            break;
        }
        from = format!("({last}");
    }
    Ok(out)
}

/// The original (non-replay) archived entry of delivery `delivery`: found through its
/// dedup marker, else by scanning every shard's events stream.
pub async fn find_delivery(ops: &Ops, delivery: &str) -> Result<Archived, OpsError> {
    let mut conn = ops.conn();
    for shard in ops.shards() {
        let marker = store::archive::queued_as(&mut conn, &ops.keys, shard, delivery).await?;
        if let Some(id) = marker
            && let Some(e) = entry(&mut conn, &ops.keys.events(shard), &id).await?
        {
            return Ok(e);
        }
    }
    for shard in ops.shards() {
        let found = scan(&mut conn, &ops.keys.events(shard), "-", "+", |e| {
            e.field(fields::DELIVERY) == delivery && !e.is_replay()
        })
        .await?;
        if let Some(e) = found.into_iter().next() {
            return Ok(e);
        }
    }
    Err(OpsError::NotFound(format!(
        "delivery {delivery} is not in the archive (older than the replay window?)"
    )))
}

/// The newest `count` entries of `stream`, newest first.
pub async fn scan_rev(
    conn: &mut Conn,
    stream: &str,
    count: usize,
) -> Result<Vec<Archived>, OpsError> {
    let entries = store::archive::newest(conn, stream, count).await?;
    Ok(convert(stream, entries))
}

/// Entries of `stream` as [`Archived`] values.
fn convert(stream: &str, entries: Vec<store::archive::TextEntry>) -> Vec<Archived> {
    entries
        .into_iter()
        .map(|e| Archived {
            stream: stream.to_owned(),
            id: e.id,
            fields: e.fields,
        })
        .collect()
}
