//! The pure heart of Shepherd (DESIGN §2): identities, events, the per-PR record,
//! `step`/`decide`, routing (which records an event reaches), effects, policy, the
//! command parser, comment texts, budget decisions (`budget`), and the rules of a target branch's merge queue
//! (`queue`).
//! No IO and no async here: no tokio, redis, reqwest or actix (checked by
//! `tests/it/core_purity.rs`).
#![warn(missing_docs)]

pub mod budget;
pub mod command;
pub mod effect;
pub mod event;
pub mod ids;
pub mod legacy;
pub mod machine;
pub mod normalize;
pub mod observation;
pub mod payload;
pub mod policy;
pub mod queue;
pub mod record;
pub mod route;
pub mod texts;
pub mod usage;
