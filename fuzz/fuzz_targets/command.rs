//! Fuzz target `command` (cargo-fuzz): see `shepherd::fuzzing` for what it checks.
//! The checks live in the library (`shepherd::fuzzing::commands`), so the regression test
//! replays `fuzz/regressions/command/` through exactly the same code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| shepherd::fuzzing::commands(data));
