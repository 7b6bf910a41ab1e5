//! The `/shepherd` comment-command parser on arbitrary text: never panics, and every
//! command it finds really is on a `/shepherd` line of the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shepherd::core::command::parse;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let commands = parse(&text);
    let lines = text
        .lines()
        .filter(|l| l.trim_start().to_ascii_lowercase().starts_with("/shepherd"))
        .count();
    assert!(commands.len() <= lines, "{} commands from {lines} lines", commands.len());
});
