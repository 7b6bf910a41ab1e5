//! The sticky status comment's place, cached (`Keys::status_comment`): its comment id,
//! the effect that last wrote it and a digest of the body written, so the executor
//! edits it in place with one `PATCH` instead of listing every comment of the PR to
//! find it before each edit (issue 17). Read and written under the PR's status lock.
//! The cache is a hint: a comment deleted behind Shepherd's back makes the edit answer
//! 404, and the executor drops the entry and finds or creates the comment again.

use std::time::Duration;

use crate::store::Conn;
use serde::{Deserialize, Serialize};

use super::StoreError;

/// How long an entry lives without a write: a PR quiet for longer pays one listing.
pub const TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// What is known of a PR's status comment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusComment {
    /// Forgejo's comment id; 0 while a create is being tried ([`StatusComment::creating`]),
    /// which says nothing of where the comment is (it may exist if the answer was lost).
    pub id: i64,
    /// Id of the effect whose body the comment holds now.
    pub effect: String,
    /// Digest of the status body written (without the effect stamp).
    pub digest: String,
}

impl StatusComment {
    /// The note left before creating a PR's first status comment without listing its
    /// comments (by `effect`): a later try that finds it lists them instead.
    pub fn creating(effect: &str) -> StatusComment {
        StatusComment {
            id: 0,
            effect: effect.to_owned(),
            digest: String::new(),
        }
    }

    /// Whether this is a [`StatusComment::creating`] note rather than a known comment.
    pub fn is_creating(&self) -> bool {
        self.id == 0
    }
}

/// The cached entry of `key`, if any (an undecodable one counts as none).
pub async fn get(conn: &mut Conn, key: &str) -> Result<Option<StatusComment>, StoreError> {
    let raw: Option<String> = redis::cmd("GET").arg(key).query_async(conn).await?;
    Ok(raw.and_then(|r| serde_json::from_str(&r).ok()))
}

/// Stores `entry` at `key` for [`TTL`].
pub async fn set(conn: &mut Conn, key: &str, entry: &StatusComment) -> Result<(), StoreError> {
    // Plain data: serialization cannot fail.
    let json = serde_json::to_string(entry).unwrap_or_default();
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(json)
        .arg("PX")
        .arg(u64::try_from(TTL.as_millis()).unwrap_or(u64::MAX))
        .query_async(conn)
        .await?;
    Ok(())
}

/// Forgets the entry at `key` (the comment it names is gone).
pub async fn clear(conn: &mut Conn, key: &str) -> Result<(), StoreError> {
    let _: i64 = redis::cmd("DEL").arg(key).query_async(conn).await?;
    Ok(())
}
