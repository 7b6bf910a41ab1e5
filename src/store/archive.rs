//! Reading streams back as the archive (DESIGN §3: every delivery stays for the replay
//! window): entries by id range, the newest entries, and the stream id a delivery was
//! queued as (its dedup marker). What the entries mean is the operator tools' business
//! (`crate::ops::archive`); here they are ids and text fields.

use std::collections::HashMap;

use crate::store::Conn;
use redis::streams::StreamRangeReply;

use super::{Keys, StoreError};

/// One stream entry with its fields as text (lossy: a field that is not UTF-8 reads as
/// empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextEntry {
    /// Stream id (`<ms>-<seq>`).
    pub id: String,
    /// Field → value.
    pub fields: HashMap<String, String>,
}

/// Entries of `stream` with ids in `[start, end]` (`-`/`+` for the ends; `(id` for an
/// exclusive start), oldest first, at most `count`.
pub async fn range(
    conn: &mut Conn,
    stream: &str,
    start: &str,
    end: &str,
    count: usize,
) -> Result<Vec<TextEntry>, StoreError> {
    let reply: StreamRangeReply = redis::cmd("XRANGE")
        .arg(stream)
        .arg(start)
        .arg(end)
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?;
    Ok(text_entries(reply))
}

/// The newest `count` entries of `stream`, newest first.
pub async fn newest(
    conn: &mut Conn,
    stream: &str,
    count: usize,
) -> Result<Vec<TextEntry>, StoreError> {
    let reply: StreamRangeReply = redis::cmd("XREVRANGE")
        .arg(stream)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?;
    Ok(text_entries(reply))
}

/// The events-stream id delivery `delivery` was queued as in `shard`, while its dedup
/// marker lives (the replay window).
pub async fn queued_as(
    conn: &mut Conn,
    keys: &Keys,
    shard: u16,
    delivery: &str,
) -> Result<Option<String>, StoreError> {
    Ok(redis::cmd("GET")
        .arg(keys.seen(shard, delivery))
        .query_async(conn)
        .await?)
}

/// A range reply as [`TextEntry`] values.
fn text_entries(reply: StreamRangeReply) -> Vec<TextEntry> {
    reply
        .ids
        .into_iter()
        .map(|s| TextEntry {
            id: s.id,
            fields: s
                .map
                .into_iter()
                .map(|(k, v)| {
                    let text = redis::from_redis_value::<String>(v).unwrap_or_default();
                    (k, text)
                })
                .collect(),
        })
        .collect()
}
