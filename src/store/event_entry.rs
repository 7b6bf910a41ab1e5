//! The layout of an events-stream entry, written by [`EventEntry`] and by nothing else
//! on the Rust side.
//!
//! | field | value |
//! |---|---|
//! | `kind` | `webhook` (a Forgejo delivery) or `internal` (timer, observation, result, outcome) |
//! | `delivery` | `X-Forgejo-Delivery`, or a unique id of the internal event (`effect:…`, `result:…`, `resync:…`, `timer:…`) |
//! | `event` | `X-Forgejo-Event-Type`, or the internal event's name |
//! | `repo` | `owner/name` as sent (empty when a payload has none) |
//! | `received` | receive time, unix ms |
//! | `body` | the verified webhook bytes, or the internal event as JSON |
//! | `replay` | only on a replayed copy: the original's stream id, or `dead-letter:<id>` |
//!
//! (Names in [`super::fields`]; readers: the workers' decoder, the archive of the
//! operator tools, the dead-letter views.)
//!
//! Every writer builds an [`EventEntry`] and passes it whole as the arguments of its
//! command (`impl ToRedisArgs`): ingest (`enqueue.lua`: dedup and append in one
//! script), the results (`report.lua`: the reported marker and the entry), the executor
//! (`effect_finish.lua`: an effect's events, its done marker and the ack), and
//! [`append`] for writers with nothing to do atomically beside it (resync, replay, the
//! retry of a dead letter). Those scripts only splice the pairs they are given.
//!
//! **The one exception is `lua/timers.lua`**: it writes the entry of a due timer
//! itself, because that entry only exists when the timer fires inside the script that
//! pops it — the delivery id and receive time are the pop's, and the repository, name
//! and body come from the payload an earlier commit stored — so no Rust code runs
//! between the pop and the append to build it. It writes the fields of
//! [`EventEntry::internal`], in that order; the store tests compare the entry it
//! writes with this layout, so a field added here and not there fails them.

use std::collections::HashMap;

use crate::store::Conn;
use redis::{RedisWrite, ToRedisArgs};

use super::{StoreError, fields};

/// One events-stream entry, borrowed from its parts (a webhook body is copied once,
/// straight into the command buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventEntry<'a> {
    /// [`fields::KIND_WEBHOOK`] or [`fields::KIND_INTERNAL`] (a replayed copy keeps
    /// whatever its original had, even an unknown kind that dead-letters again).
    kind: &'a str,
    /// Delivery id, or the internal event's unique id.
    delivery: &'a str,
    /// Event type or name.
    event: &'a str,
    /// Repository `owner/name`.
    repo: &'a str,
    /// Receive time, unix ms.
    received_ms: u64,
    /// Webhook bytes or event JSON.
    body: &'a [u8],
    /// On a replayed copy: what it replays.
    replay: Option<&'a str>,
}

impl<'a> EventEntry<'a> {
    /// A verified Forgejo delivery.
    pub fn webhook(
        delivery: &'a str,
        event: &'a str,
        repo: &'a str,
        received_ms: u64,
        body: &'a [u8],
    ) -> Self {
        Self {
            kind: fields::KIND_WEBHOOK,
            delivery,
            event,
            repo,
            received_ms,
            body,
            replay: None,
        }
    }

    /// The delivery id (`delivery` field): what deliveries are deduplicated on.
    pub fn delivery(&self) -> &'a str {
        self.delivery
    }

    /// The repository `owner/name` (`repo` field): what picks the shard.
    pub fn repo(&self) -> &'a str {
        self.repo
    }

    /// An internal event (`core::event::Event` as JSON in `body`, its name in `event`).
    pub fn internal(
        delivery: &'a str,
        event: &'a str,
        repo: &'a str,
        received_ms: u64,
        body: &'a str,
    ) -> Self {
        Self {
            kind: fields::KIND_INTERNAL,
            delivery,
            event,
            repo,
            received_ms,
            body: body.as_bytes(),
            replay: None,
        }
    }

    /// A copy of the archived entry `fields` (its kind, delivery, event, repository and
    /// body) received at `received_ms`, marked as a replay of `original`. Fields outside
    /// the layout (a dead letter's `dl_*`, an older replay mark) are not copied.
    pub fn replay_of(
        fields: &'a HashMap<String, String>,
        original: &'a str,
        received_ms: u64,
    ) -> Self {
        let get = |name: &str| fields.get(name).map_or("", String::as_str);
        Self {
            kind: get(self::fields::KIND),
            delivery: get(self::fields::DELIVERY),
            event: get(self::fields::EVENT),
            repo: get(self::fields::REPO),
            received_ms,
            body: get(self::fields::BODY).as_bytes(),
            replay: Some(original),
        }
    }
}

impl ToRedisArgs for EventEntry<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        for (name, value) in [
            (fields::KIND, self.kind.as_bytes()),
            (fields::DELIVERY, self.delivery.as_bytes()),
            (fields::EVENT, self.event.as_bytes()),
            (fields::REPO, self.repo.as_bytes()),
        ] {
            out.write_arg(name.as_bytes());
            out.write_arg(value);
        }
        out.write_arg(fields::RECEIVED.as_bytes());
        out.write_arg_fmt(self.received_ms);
        out.write_arg(fields::BODY.as_bytes());
        out.write_arg(self.body);
        if let Some(original) = self.replay {
            out.write_arg(fields::REPLAY.as_bytes());
            out.write_arg(original.as_bytes());
        }
    }

    fn num_of_args(&self) -> usize {
        if self.replay.is_some() { 14 } else { 12 }
    }
}

/// Appends `entry` to the events stream `stream` (`XADD … *`, no dedup); returns the new
/// entry's id.
pub async fn append(
    conn: &mut Conn,
    stream: &str,
    entry: &EventEntry<'_>,
) -> Result<String, StoreError> {
    Ok(redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg(entry)
        .query_async(conn)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(args: Vec<Vec<u8>>) -> Vec<String> {
        args.into_iter()
            .map(|a| String::from_utf8(a).unwrap())
            .collect()
    }

    #[test]
    fn a_webhook_is_the_six_fields_in_order() {
        let e = EventEntry::webhook("d1", "pull_request_sync", "o/r", 42, b"{}");
        assert_eq!(
            text(e.to_redis_args()),
            [
                "kind",
                "webhook",
                "delivery",
                "d1",
                "event",
                "pull_request_sync",
                "repo",
                "o/r",
                "received",
                "42",
                "body",
                "{}"
            ]
        );
        assert_eq!(e.num_of_args(), 12);
    }

    #[test]
    fn a_replay_keeps_the_original_and_drops_what_is_not_layout() {
        let archived: HashMap<String, String> = [
            ("kind", "martian"),
            ("delivery", "d1"),
            ("event", "push"),
            ("repo", "o/r"),
            ("received", "1"),
            ("body", "{\"a\":1}"),
            ("replay", "1-0"),
            ("dl_reason", "unknown entry kind"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let e = EventEntry::replay_of(&archived, "dead-letter:5-0", 99);
        let args = text(e.to_redis_args());
        assert_eq!(args.len(), e.num_of_args());
        let pairs: HashMap<&str, &str> = args
            .chunks(2)
            .map(|p| (p[0].as_str(), p[1].as_str()))
            .collect();
        assert_eq!(pairs.len(), 7, "{pairs:?}");
        assert_eq!(pairs["kind"], "martian", "an unknown kind stays poison");
        assert_eq!(pairs["received"], "99");
        assert_eq!(pairs["replay"], "dead-letter:5-0");
        assert_eq!(pairs["body"], "{\"a\":1}");
        assert!(!pairs.contains_key("dl_reason"));
    }
}
