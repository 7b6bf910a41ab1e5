//! Fuzz target `json_probe` (cargo-fuzz): see `shepherd::fuzzing` for what it checks.
//! The checks live in the library (`shepherd::fuzzing::json_probe`), so the regression
//! test replays `fuzz/regressions/json_probe/` through exactly the same code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shepherd::fuzzing::json_probe(data));
