//! Payload normalization over arbitrary event types and bodies: `normalize` never
//! panics, whatever the JSON (deep nesting, huge numbers, wrong types, odd UTF-8).
//!
//! Input layout: byte 0 picks an event type (one of those Shepherd routes, or, above
//! the table, the bytes up to the first `\n` as a free-form name); the rest is the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shepherd::core::normalize::normalize;

/// Every event type `normalize` routes, plus a few it ignores.
const EVENTS: [&str; 18] = [
    "pull_request",
    "pull_request_sync",
    "pull_request_label",
    "pull_request_review_approved",
    "pull_request_review_rejected",
    "pull_request_review_comment",
    "pull_request_comment",
    "issue_comment",
    "issues",
    "issue_label",
    "action_run_success",
    "action_run_failure",
    "action_run_recover",
    "status",
    "push",
    "create",
    "release",
    "",
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let i = usize::from(selector);
    if i < EVENTS.len() * 8 {
        let _ = normalize(EVENTS[i % EVENTS.len()], rest);
    } else {
        let (name, body) = match rest.iter().position(|b| *b == b'\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &[][..]),
        };
        let _ = normalize(&String::from_utf8_lossy(name), body);
    }
});
