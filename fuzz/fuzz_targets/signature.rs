//! Fuzz target `signature` (cargo-fuzz): see `shepherd::fuzzing` for what it checks.
//! The checks live in the library (`shepherd::fuzzing::signature`), so the regression test
//! replays `fuzz/regressions/signature/` through exactly the same code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shepherd::fuzzing::signature(data));
