//! Shepherd makes a Forgejo instance drive its own pull requests.
//!
//! # Layout
//!
//! Imports point one way (`tests/it/layers.rs` checks it):
//! `core` ← `store`, `forgejo` ← `worker` ← `agents` ← `ops` ← `ingest` ← `app` ←
//! `main.rs`; `config`, `telemetry` and `shutdown` are utilities anyone imports; only
//! `main.rs` and `app/` import `cli`. The map, with what each folder owns, is in
//! `docs/development.md`.
//!
//! ```text
//! main.rs     thin: parse the CLI, init telemetry, app::run, exit 1 on error
//! cli.rs      clap subcommands (DESIGN §5)
//! config.rs   SHEPHERD_* settings → one validated Config; secrets as SecretString;
//!             load_policy (the SHEPHERD_CONFIG policy file)
//! telemetry   tracing subscriber (text/json) and the Prometheus metrics
//! shutdown    one cancellation token; SIGINT and SIGTERM
//! core/       PURE: ids, events, record, machine (step/decide), route (which records
//!             an event reaches), effects, policy, command parser, comment texts,
//!             normalization of Forgejo payloads, the branches' merge queues
//! store/      Redis: keys, Lua scripts, streams, the one consumer loop, CAS commit,
//!             timers, locks, merge queues, archive
//! forgejo/    reqwest client for the endpoints effects need; typed errors
//! worker/     consume loop, executor (effects → Forgejo/dispatch), timers, resync
//! agents/     `shepherd agents`: runs the coding agents of work items (context from
//!             Forgejo, prompt, launch, result)
//! ops/        replay, inspect, rebuild, resync, dead letters, status: request → report
//! ingest/     the HTTP surface: webhooks (verify HMAC → classify → dedup+XADD → 202),
//!             health, metrics, results API, admin API, status page
//! app/        the composition root: what serve, work and run start; the CLI printers
//!             of the operator commands; send
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
pub mod app;
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
