//! The whole loop: `shepherd run` (ingest, worker, executor) and `shepherd agents`.
