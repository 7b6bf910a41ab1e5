//! Redis: keys, Lua scripts, streams and the one consumer loop, compare-and-set
//! commits, timers, locks, the merge queues, the archive, dead letters and the fleet's
//! markers.
//! Everything that touches Redis lives under this module: the rest of the crate calls
//! named functions here, never a raw command.

pub mod enqueue;
pub mod keys;

pub use keys::Keys;

/// Field names of an events-stream entry, shared by its one writer
/// ([`event_entry::EventEntry`], which documents the layout) and its readers (workers,
/// operator tools). Every entry has all of `kind`, `delivery`, `event`, `repo`,
/// `received` and `body`; `replay` only on replays.
pub mod fields {
    /// `webhook` (a Forgejo delivery) or `internal` (timer, observation, result, outcome).
    pub const KIND: &str = "kind";
    /// Value of [`KIND`] for Forgejo deliveries.
    pub const KIND_WEBHOOK: &str = "webhook";
    /// Value of [`KIND`] for internal events.
    pub const KIND_INTERNAL: &str = "internal";
    /// Delivery id (`X-Forgejo-Delivery`) for webhooks; a unique event id for internal.
    pub const DELIVERY: &str = "delivery";
    /// Fine-grained event type (`X-Forgejo-Event-Type`) or the internal event's name.
    pub const EVENT: &str = "event";
    /// Repository full name `owner/name` as sent by Forgejo; empty when the payload has none.
    pub const REPO: &str = "repo";
    /// Receive time, unix milliseconds.
    pub const RECEIVED: &str = "received";
    /// Raw webhook body (the verified JSON bytes), or the internal event as JSON.
    pub const BODY: &str = "body";
    /// On a replayed entry: the stream id of the original entry (or `dead-letter:<id>`).
    pub const REPLAY: &str = "replay";
}

pub mod agent_runs;
pub mod archive;
pub mod client;
pub mod commit;
pub mod consumer;
pub mod dead_letters;
pub mod effects;
mod error;
pub mod event_entry;
pub mod ledger;
pub mod lock;
pub mod markers;
pub mod queue;
pub mod repos;
pub mod server;
pub mod status_comment;
pub mod streams;
pub mod timers;
pub mod work;

pub use client::{Conn, Store};
pub use error::StoreError;
