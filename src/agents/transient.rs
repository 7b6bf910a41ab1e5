//! Transient agent failures (issue 27): which failed runs the runner reports as
//! outcome `transient`, so the core retries the same work after a back-off without
//! counting an attempt or raising the tier (`core::machine::transient`, bounded by
//! `transient_retries`).
//!
//! | the run | reported |
//! |---|---|
//! | exited with a status other than 0 (or a signal it did not get from us), no result file, and a policy `transient_patterns` pattern matches the end of its output | `transient` (signature kept, e.g. `exit:1`; the summary names the pattern) |
//! | its result file says `{"outcome":"transient"}` | `transient` (as written) |
//! | anything else — exit 0, a result file with another outcome, a bad result file, the claim's deadline, a stop for a limit (budget, runaway: `usage::StopReason`) | unchanged: never transient |
//!
//! **What is matched.** opencode prints a failed model request last, after its own
//! retries (`Error: Rate limit reached for requests`, or with `--format json` an
//! `{"type":"error",…,"statusCode":429,"isRetryable":true,…}` line), so only the end of
//! the output counts: its last [`TAIL_LINES`] lines that are not blank, at most
//! [`TAIL_BYTES`], with terminal colour codes removed (opencode colours `Error:`). A
//! transient-looking line earlier in a run (a test's own `timeout`) does not make a
//! failure transient.
//!
//! Agents are hostile: one can print `429` or claim `transient` on every run. That
//! only delays the count — the core turns the next transient failure past
//! `transient_retries` in a row into a failed attempt.

use crate::core::event::WorkOutcome;
use crate::worker::results::ResultReport;

use super::outcome::Finish;

/// Lines at the end of the output that are matched (blank ones not counted).
pub const TAIL_LINES: usize = 5;

/// Bytes at the end of the output that are matched at most.
pub const TAIL_BYTES: usize = 16 * 1024;

/// The compiled `transient_patterns` of one repository's policy.
#[derive(Debug, Clone)]
pub struct Classifier {
    /// Each pattern as written, and compiled.
    patterns: Vec<(String, regex_lite::Regex)>,
}

impl Classifier {
    /// Compiles `patterns` ([`crate::core::policy::transient_regex`]); a pattern that
    /// does not compile is left out and logged (the policy's validation refuses such
    /// a policy at start, so this is a policy changed under a running process).
    pub fn new(patterns: &[String]) -> Self {
        let patterns = patterns
            .iter()
            .filter_map(|p| match crate::core::policy::transient_regex(p) {
                Ok(re) => Some((p.clone(), re)),
                Err(why) => {
                    tracing::warn!(pattern = %p, why, "a transient_patterns entry does not compile; skipped");
                    None
                }
            })
            .collect();
        Self { patterns }
    }

    /// The first pattern that matches the end of `output` ([`tail`]), if any.
    pub fn matching(&self, output: &str) -> Option<&str> {
        let tail = tail(output);
        self.patterns
            .iter()
            .find(|(_, re)| re.is_match(&tail))
            .map(|(p, _)| p.as_str())
    }

    /// Turns `report` (from [`super::outcome::decide`]) into a `transient` one when the
    /// run failed by itself without a result file (`had_file`: the agent wrote a
    /// valid one) and a pattern matches the end of `output`. Returns whether the
    /// report is `transient` now — this way or because the result file said so.
    pub fn classify(
        &self,
        report: &mut ResultReport,
        finish: Finish,
        had_file: bool,
        output: &str,
    ) -> bool {
        let failed_exit = match finish {
            Finish::Exited(status) => !status.success(),
            Finish::Timeout | Finish::Limit(_) => {
                // The deadline or a limit stopped it: never transient, whatever it wrote.
                if report.outcome == WorkOutcome::Transient {
                    report.outcome = WorkOutcome::Failed;
                }
                return false;
            }
        };
        if !failed_exit || had_file || report.outcome != WorkOutcome::Failed {
            return report.outcome == WorkOutcome::Transient;
        }
        let Some(pattern) = self.matching(output) else {
            return false;
        };
        report.outcome = WorkOutcome::Transient;
        let why = format!("transient failure: the output's end matches `{pattern}`");
        report.summary = Some(match report.summary.take() {
            Some(s) => format!("{why}\n{s}"),
            None => why,
        });
        true
    }
}

/// The end of `output` that is matched: its last [`TAIL_LINES`] non-blank lines, at
/// most [`TAIL_BYTES`] (cut on a char boundary), without terminal escape sequences.
pub fn tail(output: &str) -> String {
    let mut start = output.len().saturating_sub(TAIL_BYTES);
    while !output.is_char_boundary(start) {
        start += 1;
    }
    let end = &output[start..];
    let mut lines: Vec<&str> = end
        .lines()
        .rev()
        .filter(|l| !strip_escapes(l).trim().is_empty())
        .take(TAIL_LINES)
        .collect();
    lines.reverse();
    strip_escapes(&lines.join("\n"))
}

/// `text` without ANSI escape sequences (`ESC [ … final byte`, and a lone `ESC x`):
/// opencode colours its `Error:` prefix, and a code right before a number would hide
/// the number's word boundary.
fn strip_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            // Parameters and intermediates, then one final byte in `@`..=`~`.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::ExitStatus;

    use super::*;
    use crate::core::policy::{DEFAULT_TRANSIENT_PATTERNS, Policy};
    use crate::core::usage::StopReason;

    /// The default patterns.
    fn defaults() -> Classifier {
        Classifier::new(&Policy::default().transient_patterns)
    }

    /// A run that exited with `code`.
    fn exit(code: i32) -> Finish {
        Finish::Exited(ExitStatus::from_raw(code << 8))
    }

    /// What `decide` reports for an output and an ending, and whether it is
    /// transient after classification.
    fn run(finish: Finish, file: Option<&str>, output: &str) -> ResultReport {
        let file = file.map(|f| serde_json::from_str(f).expect("a valid result file"));
        let had_file = file.is_some();
        let mut report = super::super::outcome::decide(finish, Ok(file), output).report;
        defaults().classify(&mut report, finish, had_file, output);
        report
    }

    /// opencode-ai 1.18.33's banner on stderr, then its error line as printed after its
    /// own retries (colour codes included), as `opencode run` showed them against a
    /// model server answering each status (this crate's tests' setup, by hand).
    fn opencode(message: &str) -> String {
        format!(
            "\u{1b}[0m\n> implementation-worker \u{b7} m1\n\u{1b}[0m\n\
             \u{1b}[91m\u{1b}[1mError: \u{1b}[0m{message}\n"
        )
    }

    #[test]
    fn opencodes_own_error_texts_of_provider_failures_are_transient() {
        for message in [
            // 429 with an OpenAI-style JSON body: the provider's message.
            "Rate limit reached for requests",
            // 529 Anthropic-style overload.
            "Overloaded",
            // 500 with a JSON body.
            "Internal server error",
            // 503 with a plain body.
            "Service Unavailable: Service Unavailable",
            // Nothing listening.
            "Cannot connect to API: Unable to connect. Is the computer able to access the url?",
            // 429 with a plain body.
            "Too Many Requests: Too Many Requests",
        ] {
            let r = run(exit(1), None, &opencode(message));
            assert_eq!(r.outcome, WorkOutcome::Transient, "{message}");
            assert_eq!(r.signature.as_deref(), Some("exit:1"), "{message}");
            let summary = r.summary.unwrap();
            assert!(summary.starts_with("transient failure: "), "{summary}");
            assert!(summary.contains(message), "{summary}");
        }
    }

    #[test]
    fn opencodes_json_error_event_is_transient() {
        let line = r#"{"type":"error","timestamp":1700000000000,"sessionID":"ses_1","error":{"name":"APIError","data":{"message":"Too Many Requests: Too Many Requests","statusCode":429,"isRetryable":true,"responseHeaders":{"content-type":"application/json"},"responseBody":"Too Many Requests","metadata":{"url":"http://127.0.0.1:1/v1/chat/completions"}}}}"#;
        let out = format!("{{\"type\":\"step_start\"}}\n{line}\n");
        assert_eq!(run(exit(1), None, &out).outcome, WorkOutcome::Transient);
        // A retryable error whose body is a long HTML page still matches: the
        // status comes before the body on the line.
        let long = line.replace(
            r#""responseBody":"Too Many Requests""#,
            &format!(r#""responseBody":"{}""#, "<p>busy</p>".repeat(500)),
        );
        assert!(long.len() > 4096);
        assert_eq!(run(exit(1), None, &long).outcome, WorkOutcome::Transient);
    }

    #[test]
    fn other_failures_stay_failed() {
        for output in [
            // A 400: the model id is wrong; no retry helps.
            opencode("Invalid model parameter"),
            // The agent's own failure.
            "cargo test\ntest result: FAILED. 3 passed; 2 failed\nerror: could not fix it\n"
                .to_owned(),
            String::new(),
        ] {
            let r = run(exit(1), None, &output);
            assert_eq!(r.outcome, WorkOutcome::Failed, "{output}");
            assert_eq!(r.signature.as_deref(), Some("exit:1"));
        }
    }

    #[test]
    fn only_the_end_of_the_output_counts() {
        let early = format!(
            "test slow_case ... timed out\n{}error: 2 tests failed\n",
            "more output\n".repeat(TAIL_LINES + 1)
        );
        assert_eq!(run(exit(1), None, &early).outcome, WorkOutcome::Failed);
        // Blank lines after the error do not push it out of the tail.
        let late = format!("{}\n\n\n\n\n\n\n", opencode("Overloaded"));
        assert_eq!(run(exit(1), None, &late).outcome, WorkOutcome::Transient);
        // Megabytes before it cost nothing: only the last 16 KiB are looked at.
        let big = format!("{}{}", "é".repeat(1 << 20), opencode("Overloaded"));
        assert!(tail(&big).len() <= TAIL_BYTES);
        assert_eq!(run(exit(1), None, &big).outcome, WorkOutcome::Transient);
    }

    #[test]
    fn successes_deadlines_limits_and_result_files_are_never_matched() {
        let out = opencode("Rate limit reached for requests");
        assert_eq!(run(exit(0), None, &out).outcome, WorkOutcome::Succeeded);
        assert_eq!(
            run(Finish::Timeout, None, &out).outcome,
            WorkOutcome::Failed
        );
        for reason in [StopReason::OverBudget, StopReason::Loop, StopReason::Idle] {
            let mut r = super::super::outcome::decide(Finish::Limit(reason), Ok(None), &out).report;
            assert!(!defaults().classify(&mut r, Finish::Limit(reason), false, &out));
            assert_eq!(r.outcome, WorkOutcome::Failed, "{reason:?}");
        }
        // The agent said what happened: believed, not second-guessed.
        let failed = r#"{"outcome":"failed","summary":"gave up"}"#;
        assert_eq!(
            run(exit(1), Some(failed), &out).outcome,
            WorkOutcome::Failed
        );
    }

    #[test]
    fn a_result_file_may_say_transient_but_not_past_a_deadline_or_a_limit() {
        let said = r#"{"outcome":"transient","summary":"the provider said 529"}"#;
        let r = run(exit(0), Some(said), "");
        assert_eq!(r.outcome, WorkOutcome::Transient);
        assert_eq!(r.summary.as_deref(), Some("the provider said 529"));
        let r = run(exit(1), Some(said), "");
        assert_eq!(r.outcome, WorkOutcome::Transient);
        // A stop for a limit never reads the file; and a report that says
        // transient after a stop is made a failure.
        let mut forged =
            super::super::outcome::decide(exit(0), Ok(serde_json::from_str(said).ok()), "").report;
        assert!(!defaults().classify(&mut forged, Finish::Limit(StopReason::OverBudget), true, ""));
        assert_eq!(forged.outcome, WorkOutcome::Failed);
        let mut late =
            super::super::outcome::decide(exit(0), Ok(serde_json::from_str(said).ok()), "").report;
        assert!(!defaults().classify(&mut late, Finish::Timeout, true, ""));
        assert_eq!(late.outcome, WorkOutcome::Failed);
    }

    #[test]
    fn escapes_are_stripped_and_numbers_keep_their_word_boundary() {
        assert_eq!(
            strip_escapes("\u{1b}[91m\u{1b}[1mError: \u{1b}[0m429"),
            "Error: 429"
        );
        let c = Classifier::new(&[r"\b429\b".to_owned()]);
        assert_eq!(
            c.matching("\u{1b}[0m429 from the provider"),
            Some(r"\b429\b")
        );
        assert_eq!(c.matching("request id 14290"), None);
    }

    #[test]
    fn every_default_pattern_compiles_and_a_bad_one_is_skipped() {
        assert_eq!(defaults().patterns.len(), DEFAULT_TRANSIENT_PATTERNS.len());
        let c = Classifier::new(&["(unclosed".to_owned(), "overloaded".to_owned()]);
        assert_eq!(c.matching("Error: Overloaded"), Some("overloaded"));
    }
}
