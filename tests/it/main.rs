//! The one integration-test binary: real redis-server processes, the real HTTP server
//! and the real `shepherd` binary, with a stateful fake Forgejo as the only fake.

mod agents;
mod api_bodies;
mod app;
mod bench_lag;
mod bench_smoke;
mod core_purity;
mod deploy;
mod doctor;
pub(crate) mod drills;
mod fake_forgejo;
mod forgejo_client;
mod hostile;
mod ingest;
mod layers;
mod ops;
mod scenarios;
mod security;
mod status_page;
mod support;
mod topologies;
mod worker;
