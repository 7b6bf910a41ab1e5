//! The set of every repository Shepherd has seen (`Keys::repos`, no shard tag): what
//! `resync --all`, the periodic resync and the status page walk. Writers add to it
//! outside their scripts (it lives in another Redis Cluster slot than the shards), and
//! losing an addition only delays a resync until the repository's next event.

use crate::store::Conn;

use super::{Keys, StoreError};

/// Adds `repo` (`owner/name`) to the set; true when it was not there yet.
pub async fn remember(conn: &mut Conn, keys: &Keys, repo: &str) -> Result<bool, StoreError> {
    let added: i64 = redis::cmd("SADD")
        .arg(keys.repos())
        .arg(repo)
        .query_async(conn)
        .await?;
    Ok(added == 1)
}

/// Every repository in the set, as stored (unsorted).
pub async fn known(conn: &mut Conn, keys: &Keys) -> Result<Vec<String>, StoreError> {
    Ok(redis::cmd("SMEMBERS")
        .arg(keys.repos())
        .query_async(conn)
        .await?)
}
