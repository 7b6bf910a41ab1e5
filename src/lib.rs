//! Shepherd makes a Forgejo instance drive its own pull requests.
//!
//! # Layout
//!
//! ```text
//! main.rs     thin: parse the CLI, init telemetry, run a subcommand, exit 1 on error
//! cli.rs      clap subcommands (DESIGN §5)
//! config.rs   SHEPHERD_* settings → one validated Config; secrets as SecretString
//! telemetry   tracing subscriber (text/json) and the Prometheus metrics
//! shutdown    one cancellation token; SIGINT and SIGTERM
//! core/       PURE: ids, events, record, machine (step/decide), effects, policy,
//!             command parser, comment texts, normalization of Forgejo payloads
//! ingest/     actix app: verify HMAC → classify → dedup+XADD → 202; health, metrics
//! store/      Redis: keys, Lua scripts, streams, CAS commit, timers, archive
//! forgejo/    reqwest client for the endpoints effects need; typed errors
//! worker/     consume loop, executor (effects → Forgejo/dispatch), timers, resync
//! ops/        send, replay, inspect, rebuild, resync, dead letters
//! agents/     `shepherd agents`: runs the coding agents of work items, reports results
//! fuzzing     the fuzz targets' checks (fuzz/ wraps them; a test replays regressions)
//! ```
//!
//! Data flow: Forgejo → `ingest` → events stream → `worker` (`core::step`, CAS commit)
//! → effects stream → executor → Forgejo / dispatch sinks; outcomes and observations
//! come back into the events stream as internal events.
// One audited `unsafe` block: setting the agents' parent-death signal between fork and
// exec (src/agents/launch.rs; docs/security.md).
#![deny(unsafe_code)]

pub mod agents;
pub mod cli;
pub mod config;
pub mod core;
pub mod forgejo;
pub mod fuzzing;
pub mod ingest;
pub mod ops;
pub mod shutdown;
pub mod store;
pub mod telemetry;
pub mod worker;
