//! What an agent's run comes to: the result file it may write
//! (`SHEPHERD_RESULT_FILE`: `{outcome, signature?, summary?, tokens?, cost?}`), else its
//! exit status, else the deadline — turned into the one result the runner reports.
//!
//! | how the run ended | result |
//! |---|---|
//! | the claim's deadline (minus the margin) came first | `failed`, signature `timeout` |
//! | the runner stopped it for a limit ([`super::usage`]) | `failed`, signature the reason (`over-budget`, `over-steps`, `over-tool-calls`, `idle`, `loop`), `stopped` set |
//! | a result file that is valid | as written (summary: the output's tail when none) |
//! | a result file that is not JSON, too large, or has no valid `outcome` | `failed`, signature `result-file`, the reason in the summary |
//! | no result file, exit 0 | `succeeded` (then corrected from Forgejo by [`super::world`]: `no-changes` when nothing was pushed or opened) |
//! | no result file, exit status N | `failed`, signature `exit:N` (`succeeded` when Forgejo shows a push or PR; `transient` when its output's end matches `transient_patterns`: [`super::transient`]) |
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
    /// `succeeded`, `failed`, `no-changes` or `transient` (issue 27).
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

/// How long reading one file the agent wrote may take (a regular file of a few KiB
/// takes microseconds; this bounds a filesystem that hangs).
pub const FILE_READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads of agents' files still running past [`FILE_READ_LIMIT`] (their threads are
/// stuck); `/healthz` of `shepherd agents` fails while there is one.
pub static STUCK_READS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Why a file the agent wrote was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentFileError {
    /// There is none.
    Missing,
    /// Larger than the limit: its size and its first bytes.
    TooLarge(u64, Vec<u8>),
    /// A symlink, FIFO, device, folder…, or unreadable (the reason).
    Refused(String),
}

/// Reads a file the agent wrote as data: opened without following a symlink and
/// without blocking on a FIFO (`O_NOFOLLOW | O_NONBLOCK`), accepted only when the
/// opened file is a regular file (`fstat`), and read up to `max` bytes (one more
/// tells a file that grew). Blocking: call it off the async threads
/// ([`read_agent_file_off_thread`]).
pub fn read_agent_file(path: &Path, max: u64) -> Result<Vec<u8>, AgentFileError> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(AgentFileError::Missing),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
            return Err(AgentFileError::Refused("it is a symbolic link".into()));
        }
        Err(e) => return Err(AgentFileError::Refused(e.to_string())),
    };
    let meta = file
        .metadata()
        .map_err(|e| AgentFileError::Refused(e.to_string()))?;
    if !meta.file_type().is_file() {
        return Err(AgentFileError::Refused(format!(
            "it is not a regular file ({})",
            file_kind(&meta)
        )));
    }
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| AgentFileError::Refused(e.to_string()))?;
    if bytes.len() as u64 > max || meta.len() > max {
        bytes.truncate(BAD_FILE_KEPT);
        return Err(AgentFileError::TooLarge(meta.len().max(max + 1), bytes));
    }
    Ok(bytes)
}

/// What kind of file `meta` describes, for the error.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    let t = meta.file_type();
    match () {
        () if t.is_dir() => "a folder",
        () if t.is_fifo() => "a FIFO",
        () if t.is_socket() => "a socket",
        () if t.is_char_device() => "a character device",
        () if t.is_block_device() => "a block device",
        () => "not a regular file",
    }
}

/// [`read_agent_file`] on tokio's blocking pool, bounded by [`FILE_READ_LIMIT`]: a read
/// that takes longer is refused and its thread counted in [`STUCK_READS`] until it
/// ends.
pub async fn read_agent_file_off_thread(
    path: std::path::PathBuf,
    max: u64,
) -> Result<Vec<u8>, AgentFileError> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let late = Arc::new(AtomicBool::new(false));
    let flag = late.clone();
    let task = tokio::task::spawn_blocking(move || {
        let r = read_agent_file(&path, max);
        if flag.swap(true, Ordering::SeqCst) {
            // The caller gave up on this read and counted it as stuck.
            STUCK_READS.fetch_sub(1, Ordering::SeqCst);
        }
        r
    });
    match tokio::time::timeout(FILE_READ_LIMIT, task).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(AgentFileError::Refused(format!("the read failed: {e}"))),
        Err(_) => {
            if !late.swap(true, Ordering::SeqCst) {
                STUCK_READS.fetch_add(1, Ordering::SeqCst);
                tracing::error!("reading a file an agent wrote is stuck; /healthz reports it");
            }
            Err(AgentFileError::Refused(format!(
                "reading it took longer than {} s",
                FILE_READ_LIMIT.as_secs()
            )))
        }
    }
}

/// Reads the result file at `path`: `Ok(None)` when the agent wrote none (absent or
/// empty). Symlinks, FIFOs and other special files are bad result files.
pub fn read_result_file(path: &Path) -> Result<Option<ResultFile>, BadResultFile> {
    parse_result_file(read_agent_file(path, RESULT_FILE_MAX))
}

/// [`read_result_file`] off the async threads, with a time limit.
pub async fn read_result_file_off_thread(
    path: std::path::PathBuf,
) -> Result<Option<ResultFile>, BadResultFile> {
    parse_result_file(read_agent_file_off_thread(path, RESULT_FILE_MAX).await)
}

/// The result file's bytes (or why there are none) as the result file.
fn parse_result_file(
    read: Result<Vec<u8>, AgentFileError>,
) -> Result<Option<ResultFile>, BadResultFile> {
    let bad = |error, head: &[u8]| BadResultFile {
        error,
        head: String::from_utf8_lossy(&head[..head.len().min(BAD_FILE_KEPT)]).into_owned(),
    };
    let bytes = match read {
        Ok(b) => b,
        Err(AgentFileError::Missing) => return Ok(None),
        Err(AgentFileError::TooLarge(len, head)) => {
            return Err(bad(ResultFileError::TooLarge(len), &head));
        }
        Err(AgentFileError::Refused(why)) => {
            return Err(bad(ResultFileError::Unreadable(why), b""));
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(de)
        .map(Some)
        .map_err(|e| bad(ResultFileError::Invalid(e.to_string()), &bytes))
}

/// How the agent's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// It exited by itself (or was killed by a signal it did not get from us).
    Exited(ExitStatus),
    /// The deadline stopped it.
    Timeout,
    /// The runner stopped it for a limit (the result file is not read).
    Limit(crate::core::usage::StopReason),
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
        usage: None,
        stopped: None,
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
        (Finish::Limit(reason), _) => {
            let what = format!("stopped by the runner: {}", reason.as_str());
            let mut report = failed(reason.as_str(), what);
            report.stopped = Some(reason);
            return plain(report);
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
                    usage: None,
                    stopped: None,
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
            usage: None,
            stopped: None,
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
/// four bytes are ignored: masking them would garble the text and hide nothing) — and
/// of its disguises: reversed, hex (either case) and base64 (standard and URL-safe, at
/// each of the three alignments it can have inside a longer encoded text). Defence in
/// depth: the sandbox keeps secrets from agents in the first place.
pub fn mask(text: &str, secrets: &[String]) -> String {
    mask_forms(text, &masked_forms(secrets))
}

/// Every form [`mask`] hides of `secrets` ([`disguises`] of each secret of four bytes
/// or more), longest first: the runner computes it once at start and masks with
/// [`mask_forms`].
pub fn masked_forms(secrets: &[String]) -> Vec<String> {
    let mut forms: Vec<String> = secrets
        .iter()
        .filter(|s| s.len() >= 4)
        .flat_map(|s| disguises(s))
        .collect();
    forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    forms.dedup();
    forms
}

/// Replaces every occurrence of each of `forms` (from [`masked_forms`]) with `***`.
pub fn mask_forms(text: &str, forms: &[String]) -> String {
    let mut out = text.to_owned();
    for form in forms {
        if out.contains(form.as_str()) {
            out = out.replace(form.as_str(), "***");
        }
    }
    out
}

/// The forms of `secret` [`mask`] hides, longest first.
pub fn disguises(secret: &str) -> Vec<String> {
    let mut forms = vec![
        secret.to_owned(),
        secret.chars().rev().collect(),
        hex::encode(secret),
        hex::encode_upper(secret),
    ];
    for k in 0..3 {
        let mut bytes = vec![0u8; k];
        bytes.extend_from_slice(secret.as_bytes());
        let encoded =
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD_NO_PAD, &bytes);
        // The characters that depend on the secret's bytes alone.
        let start = (4 * k).div_ceil(3);
        let end = 8 * (k + secret.len()) / 6;
        if end >= start + 6 {
            let core = &encoded[start..end];
            forms.push(core.to_owned());
            forms.push(core.replace('+', "-").replace('/', "_"));
        }
    }
    forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
    forms.dedup();
    forms
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
        assert_eq!(r.report.stopped, None);
    }

    #[test]
    fn a_run_stopped_for_a_limit_fails_with_its_reason_whatever_its_file_says() {
        use crate::core::usage::StopReason;
        let file = ResultFile {
            outcome: WorkOutcome::Succeeded,
            signature: None,
            summary: Some("all done".into()),
            tokens: Some(1),
            cost: Some(0.0),
        };
        let r = decide(Finish::Limit(StopReason::Loop), Ok(Some(file)), "bash ls");
        assert_eq!(r.report.outcome, WorkOutcome::Failed);
        assert_eq!(r.report.signature.as_deref(), Some("loop"));
        assert_eq!(r.report.stopped, Some(StopReason::Loop));
        assert_eq!((r.tokens, r.cost), (None, None), "the file is not believed");
        assert!(r.report.summary.unwrap().ends_with("bash ls"));
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
    fn symlinks_fifos_and_folders_are_not_result_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("result.json");
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let bad = read_result_file(&path).unwrap_err();
        assert_eq!(
            bad.error,
            ResultFileError::Unreadable("it is a symbolic link".into())
        );
        std::fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.unwrap().success(), "mkfifo");
        // No writer: a blocking open would hang here.
        let bad = read_result_file(&path).unwrap_err();
        assert!(bad.error.to_string().contains("a FIFO"), "{}", bad.error);
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let bad = read_result_file(&path).unwrap_err();
        assert!(bad.error.to_string().contains("a folder"), "{}", bad.error);
        let r = decide(exit(0), Err(bad), "");
        assert_eq!(r.report.signature.as_deref(), Some("result-file"));
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

    #[test]
    fn disguised_secrets_are_masked() {
        let secret = "tok-3f9a7c2e1b";
        let secrets = [secret.to_owned()];
        let b64 =
            |s: &str| base64::Engine::encode(&base64::engine::general_purpose::STANDARD_NO_PAD, s);
        for text in [
            format!("raw {secret} end"),
            format!("rev {} end", secret.chars().rev().collect::<String>()),
            format!("hex {} end", hex::encode(secret)),
            format!("HEX {} end", hex::encode_upper(secret)),
            format!("b64 {} end", b64(secret)),
            format!("b64 in text {} end", b64(&format!("TOKEN={secret}\n"))),
            format!("b64 off by one {} end", b64(&format!("T={secret}"))),
            format!("b64 off by two {} end", b64(&format!("TO={secret}"))),
        ] {
            let masked = mask(&text, &secrets);
            assert!(masked.contains("***"), "not masked: {text} → {masked}");
            for form in disguises(secret) {
                assert!(!masked.contains(&form), "{form} left in {masked}");
            }
        }
        assert_eq!(mask("nothing here", &secrets), "nothing here");
    }
}
