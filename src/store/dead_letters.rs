//! Bringing dead letters back and dropping them (`shepherd dlq`, `replay
//! --dead-letter`). Moving a poison entry in is `streams::dead_letter`; the fields it
//! adds are `streams::dead_letter_fields`.

use std::sync::LazyLock;

use crate::store::Conn;
use redis::{Script, ToRedisArgs};

use super::StoreError;

/// Re-queues a dead letter and deletes it (see `lua/dead_letter_retry.lua`).
static RETRY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/dead_letter_retry.lua")));

/// Appends `fields` (field/value pairs: an `event_entry::EventEntry`, or an effects
/// entry's own pairs) to `target` and deletes dead letter `id` of `dead_letters`, in
/// one script; both streams must be of one shard. Returns the new entry's id, or
/// `None` when the dead letter was retried or dropped meanwhile.
pub async fn requeue<A: ToRedisArgs>(
    conn: &mut Conn,
    dead_letters: &str,
    id: &str,
    target: &str,
    fields: A,
) -> Result<Option<String>, StoreError> {
    let mut inv = RETRY.prepare_invoke();
    inv.key(dead_letters).key(target).arg(id).arg(fields);
    Ok(inv.invoke_async(conn).await?)
}

/// Appends `fields` to `target`, then deletes dead letter `id`: two commands, for a
/// target without the shard's hash tag (`<prefix>:results`, a contract name), which no
/// script may touch together with the dead letters. The delete follows only a
/// successful append; a crash in between leaves the dead letter to be dropped by hand
/// (a second report of one work item is refused anyway). Returns the new entry's id.
pub async fn requeue_unsharded<A: ToRedisArgs>(
    conn: &mut Conn,
    dead_letters: &str,
    id: &str,
    target: &str,
    fields: A,
) -> Result<String, StoreError> {
    let new_id: String = redis::cmd("XADD")
        .arg(target)
        .arg("*")
        .arg(fields)
        .query_async(conn)
        .await?;
    drop_entry(conn, dead_letters, id).await?;
    Ok(new_id)
}

/// Deletes dead letter `id`; returns how many entries went (0 when it was gone).
pub async fn drop_entry(conn: &mut Conn, dead_letters: &str, id: &str) -> Result<u64, StoreError> {
    Ok(redis::cmd("XDEL")
        .arg(dead_letters)
        .arg(id)
        .query_async(conn)
        .await?)
}
