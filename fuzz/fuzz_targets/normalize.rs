//! Fuzz target `normalize` (cargo-fuzz): see `shepherd::fuzzing` for what it checks.
//! The checks live in the library (`shepherd::fuzzing::normalize_payload`), so the regression test
//! replays `fuzz/regressions/normalize/` through exactly the same code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shepherd::fuzzing::normalize_payload(data));
