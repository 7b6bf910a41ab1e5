//! What an agent's run comes to: the result file it may write
//! (`SHEPHERD_RESULT_FILE`: `{outcome, signature?, summary?, tokens?, cost?}`), else its
//! exit status, else the deadline — turned into the one result the runner reports.
//!
//! | how the run ended | result |
//! |---|---|
//! | the claim's deadline (minus the margin) came first | `failed`, signature `timeout` |
//! | a result file that is valid | as written (summary: the output's tail when none) |
//! | a result file that is not JSON, too large, or has no valid `outcome` | `failed`, signature `result-file`, the reason in the summary |
//! | no result file, exit 0 | `succeeded` |
//! | no result file, exit status N | `failed`, signature `exit:N` |
//! | no result file, killed by a signal | `failed`, signature `signal:SIGNAME` |
//!
//! Nothing is lost on a bad result file: the result is still reported (so the claim
//! ends now, not at its expiry), and the file's beginning is kept with the output log.

use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::ExitStatus;

use serde::Deserialize;

use crate::core::event::WorkOutcome;
use crate::worker::results::ResultReport;

/// Largest result file read; a larger one is a bad result file.
pub const RESULT_FILE_MAX: u64 = 64 * 1024;
/// Bytes of the output's tail that go into a summary.
const TAIL_BYTES: usize = 1500;
/// Bytes of a bad result file kept with the output log.
const BAD_FILE_KEPT: usize = 4096;

/// The result file as agents write it.
#[derive(Debug, Clone, Deserialize)]
pub struct ResultFile {
    /// `succeeded`, `failed` or `no-changes`.
    pub outcome: WorkOutcome,
    /// The agent's failure signature.
    #[serde(default)]
    pub signature: Option<String>,
    /// One paragraph for the attempt history.
    #[serde(default)]
    pub summary: Option<String>,
    /// Tokens the agent used, when it knows.
    #[serde(default)]
    pub tokens: Option<u64>,
    /// What the run cost (in the operator's currency), when the agent knows.
    #[serde(default)]
    pub cost: Option<f64>,
}

/// Why a result file was not usable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResultFileError {
    /// Larger than [`RESULT_FILE_MAX`].
    #[error("the result file has {0} bytes, more than the {RESULT_FILE_MAX} accepted")]
    TooLarge(u64),
    /// Not JSON, or not the expected object (the message names the path).
    #[error("the result file is not a valid result: {0}")]
    Invalid(String),
    /// It could not be read.
    #[error("the result file cannot be read: {0}")]
    Unreadable(String),
}

/// A bad result file: why, and its beginning (kept with the log).
#[derive(Debug, Clone)]
pub struct BadResultFile {
    /// Why it was refused.
    pub error: ResultFileError,
    /// Its first bytes, lossy UTF-8.
    pub head: String,
}

/// Reads the result file at `path`: `Ok(None)` when the agent wrote none (absent or
/// empty).
pub fn read_result_file(path: &Path) -> Result<Option<ResultFile>, BadResultFile> {
    let bad = |error, head: &[u8]| BadResultFile {
        error,
        head: String::from_utf8_lossy(&head[..head.len().min(BAD_FILE_KEPT)]).into_owned(),
    };
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(ResultFileError::Unreadable(e.to_string()), b"")),
    };
    if len > RESULT_FILE_MAX {
        let head = read_head(path);
        return Err(bad(ResultFileError::TooLarge(len), &head));
    }
    let bytes =
        std::fs::read(path).map_err(|e| bad(ResultFileError::Unreadable(e.to_string()), b""))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(de)
        .map(Some)
        .map_err(|e| bad(ResultFileError::Invalid(e.to_string()), &bytes))
}

/// The first bytes of a file too large to read whole.
fn read_head(path: &Path) -> Vec<u8> {
    use std::io::Read as _;
    let mut head = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(BAD_FILE_KEPT as u64).read_to_end(&mut head);
    }
    head
}

/// How the agent's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// It exited by itself (or was killed by a signal it did not get from us).
    Exited(ExitStatus),
    /// The deadline stopped it.
    Timeout,
}

/// The result to report, and what goes with it.
#[derive(Debug, Clone)]
pub struct AgentResult {
    /// What is reported (`worker::results::submit`).
    pub report: ResultReport,
    /// Tokens, when the result file said.
    pub tokens: Option<u64>,
    /// Cost, when the result file said.
    pub cost: Option<f64>,
    /// Text appended to the stored log (a bad result file's beginning).
    pub log_note: Option<String>,
}

/// Decides the result of a run (see the module's table). `tail_of` is the masked
/// output, whose end goes into summaries.
pub fn decide(
    finish: Finish,
    file: Result<Option<ResultFile>, BadResultFile>,
    output: &str,
) -> AgentResult {
    let tail = tail(output);
    let with_tail = |what: String| match tail.is_empty() {
        true => what,
        false => format!("{what}\n--- output (end) ---\n{tail}"),
    };
    let failed = |signature: &str, what: String| ResultReport {
        id: None,
        outcome: WorkOutcome::Failed,
        signature: Some(signature.to_owned()),
        summary: Some(with_tail(what)),
    };
    let plain = |report| AgentResult {
        report,
        tokens: None,
        cost: None,
        log_note: None,
    };
    let status = match (finish, file) {
        (Finish::Timeout, _) => {
            return plain(failed("timeout", "stopped at the claim's deadline".into()));
        }
        (Finish::Exited(_), Err(bad)) => {
            let note = format!("--- result file (refused: {}) ---\n{}", bad.error, bad.head);
            return AgentResult {
                log_note: Some(note),
                ..plain(failed("result-file", bad.error.to_string()))
            };
        }
        (Finish::Exited(_), Ok(Some(f))) => {
            let summary = f
                .summary
                .or_else(|| (!tail.is_empty()).then(|| tail.clone()));
            return AgentResult {
                report: ResultReport {
                    id: None,
                    outcome: f.outcome,
                    signature: f.signature,
                    summary,
                },
                tokens: f.tokens,
                cost: f.cost.filter(|c| c.is_finite() && *c >= 0.0),
                log_note: None,
            };
        }
        (Finish::Exited(status), Ok(None)) => status,
    };
    if status.success() {
        return plain(ResultReport {
            id: None,
            outcome: WorkOutcome::Succeeded,
            signature: None,
            summary: (!tail.is_empty()).then_some(tail),
        });
    }
    let signature = exit_signature(status);
    plain(failed(
        &signature,
        format!("the agent ended with {signature}"),
    ))
}

/// `exit:N` or `signal:SIGNAME` of a failed exit status.
pub fn exit_signature(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit:{code}"),
        (None, Some(sig)) => match nix::sys::signal::Signal::try_from(sig) {
            Ok(s) => format!("signal:{}", s.as_str()),
            Err(_) => format!("signal:{sig}"),
        },
        (None, None) => "exit:unknown".into(),
    }
}

/// The last [`TAIL_BYTES`] of `text`, cut at a line start where one is near (and
/// always on a char boundary).
fn tail(text: &str) -> String {
    let text = text.trim_end();
    if text.len() <= TAIL_BYTES {
        return text.to_owned();
    }
    let mut start = text.len() - TAIL_BYTES;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let rest = &text[start..];
    match rest.find('\n') {
        Some(i) if i < 200 => rest[i + 1..].to_owned(),
        _ => rest.to_owned(),
    }
}

/// Replaces every occurrence of each secret in `text` with `***` (secrets shorter than
/// four bytes are ignored: masking them would garble the text and hide nothing).
pub fn mask(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for s in secrets.iter().filter(|s| s.len() >= 4) {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "***");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: i32) -> Finish {
        Finish::Exited(ExitStatus::from_raw(code << 8))
    }

    #[test]
    fn exit_status_without_a_file() {
        let r = decide(exit(0), Ok(None), "all good\n");
        assert_eq!(r.report.outcome, WorkOutcome::Succeeded);
        assert_eq!(r.report.summary.as_deref(), Some("all good"));
        let r = decide(exit(3), Ok(None), "");
        assert_eq!(r.report.outcome, WorkOutcome::Failed);
        assert_eq!(r.report.signature.as_deref(), Some("exit:3"));
        let killed = Finish::Exited(ExitStatus::from_raw(9));
        let r = decide(killed, Ok(None), "");
        assert_eq!(r.report.signature.as_deref(), Some("signal:SIGKILL"));
        let r = decide(Finish::Timeout, Ok(None), "working…");
        assert_eq!(r.report.signature.as_deref(), Some("timeout"));
        assert!(r.report.summary.unwrap().ends_with("working…"));
    }

    #[test]
    fn result_files_good_and_bad() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        assert!(read_result_file(&path).unwrap().is_none(), "absent");
        std::fs::write(&path, " \n").unwrap();
        assert!(read_result_file(&path).unwrap().is_none(), "empty");
        std::fs::write(&path, r#"{"outcome":"no-changes","tokens":12,"cost":0.5}"#).unwrap();
        let f = read_result_file(&path).unwrap().unwrap();
        let r = decide(exit(1), Ok(Some(f)), "tail");
        assert_eq!(r.report.outcome, WorkOutcome::NoChanges);
        assert_eq!(r.report.summary.as_deref(), Some("tail"));
        assert_eq!((r.tokens, r.cost), (Some(12), Some(0.5)));
        std::fs::write(&path, "not json").unwrap();
        let bad = read_result_file(&path).unwrap_err();
        assert!(matches!(bad.error, ResultFileError::Invalid(_)));
        let r = decide(exit(0), Err(bad), "");
        assert_eq!(r.report.signature.as_deref(), Some("result-file"));
        assert!(r.log_note.unwrap().contains("not json"));
        std::fs::write(&path, r#"{"outcome":"maybe"}"#).unwrap();
        let bad = read_result_file(&path).unwrap_err();
        assert!(bad.error.to_string().contains("outcome"), "{}", bad.error);
        std::fs::write(&path, vec![b'x'; RESULT_FILE_MAX as usize + 1]).unwrap();
        let bad = read_result_file(&path).unwrap_err();
        assert_eq!(bad.error, ResultFileError::TooLarge(RESULT_FILE_MAX + 1));
        assert_eq!(bad.head.len(), BAD_FILE_KEPT);
    }

    #[test]
    fn tails_are_bounded_and_secrets_masked() {
        let long = "line\n".repeat(1000) + "é".repeat(2000).as_str();
        assert!(tail(&long).len() <= TAIL_BYTES);
        let masked = mask(
            "token=s3cr3t-value and s3cr3t-value; ab",
            &["s3cr3t-value".into(), "ab".into()],
        );
        assert_eq!(masked, "token=*** and ***; ab");
    }
}
