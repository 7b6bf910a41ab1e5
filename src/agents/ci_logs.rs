//! The logs of the failing Forgejo Actions checks, for the prompt: for each failing
//! check whose link is a job of this repository's Actions
//! (`/{owner}/{repo}/actions/runs/{run}/jobs/{job}`, [`crate::forgejo`]'s `actions.rs`
//! says why), the tail of the job's log and the lines that look like errors.
//!
//! Forgejo serves job logs over its API from v16 on; the version is read once per
//! client. On an older instance no log route is called and the prompt says so with
//! the job's web link. Everything is bounded: [`MAX_TAIL_BYTES`] of tail and
//! [`MAX_ERROR_BYTES`] of error lines per check, [`MAX_TOTAL_BYTES`] for every log
//! together, [`MAX_LOGGED_CHECKS`] checks; a cut is always said. Log text is untrusted
//! (a PR's code printed it): it is cleaned of terminal escapes and control characters
//! and the templates fence it.

use serde::Serialize;

use super::context::{CheckContext, MAX_LINE_BYTES, TRUNCATION_MARK, bounded};
use crate::forgejo::{ForgejoClient, ForgejoError, ForgejoVersion};

/// Most bytes of a log's tail shown per check.
pub const MAX_TAIL_BYTES: usize = 16 * 1024;
/// Most bytes of a log read to look for error lines (the tail included).
pub const MAX_SCAN_BYTES: usize = 256 * 1024;
/// Most bytes of error-looking lines shown per check.
pub const MAX_ERROR_BYTES: usize = 8 * 1024;
/// Most bytes of log text (tails and error lines) in one prompt.
pub const MAX_TOTAL_BYTES: usize = 64 * 1024;
/// Most failing checks whose logs are read.
pub const MAX_LOGGED_CHECKS: usize = 8;

/// Words that make a log line look like an error (matched without case).
const ERROR_WORDS: [&str; 8] = [
    "error",
    "fail",
    "panic",
    "fatal",
    "exception",
    "traceback",
    "assert",
    "denied",
];

/// What the prompt shows of one failing check's log.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct CheckLog {
    /// The check's context (one line).
    pub context: String,
    /// The job's web page.
    pub url: String,
    /// The job's name, when read.
    pub job: String,
    /// The log's last bytes (cleaned; `""` when not read).
    pub tail: String,
    /// How much of the log the tail is, e.g. `the last 16384 of 901234 bytes`.
    pub tail_note: String,
    /// Error-looking lines before the tail, one per line (`""`: none or not read).
    pub errors: String,
    /// Why the log is not shown (`""` when it is).
    pub unavailable: String,
}

/// A job link of `repo`'s Actions: `(run number, job position)`.
pub fn job_link(url: &str, repo: &str) -> Option<(u64, usize)> {
    let parsed = reqwest::Url::parse(url).ok()?;
    let marker = format!("/{repo}/actions/runs/");
    let path = parsed.path();
    let at = path.find(&marker)?;
    let rest = &path[at + marker.len()..];
    let mut parts = rest.trim_end_matches('/').split('/');
    let run = parts.next()?.parse().ok()?;
    let (Some("jobs"), Some(job), None) = (parts.next(), parts.next(), parts.next()) else {
        return None;
    };
    Some((run, job.parse().ok()?))
}

/// The logs of the failing checks among `checks` (each link once).
pub async fn gather(forgejo: &ForgejoClient, repo: &str, checks: &[CheckContext]) -> Vec<CheckLog> {
    let mut seen = std::collections::BTreeSet::new();
    let wanted: Vec<(&CheckContext, (u64, usize))> = checks
        .iter()
        .filter(|c| c.failing)
        .filter_map(|c| job_link(&c.target_url, repo).map(|j| (c, j)))
        .filter(|(c, _)| seen.insert(c.target_url.clone()))
        .take(MAX_LOGGED_CHECKS)
        .collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let version = forgejo.forgejo_version().await;
    let mut budget = MAX_TOTAL_BYTES;
    let mut out = Vec::new();
    for (check, (run, job)) in wanted {
        let mut log = CheckLog {
            context: check.context.clone(),
            url: check.target_url.clone(),
            ..CheckLog::default()
        };
        match &version {
            Ok(v) if !v.serves_job_logs() => log.unavailable = too_old(v),
            _ if budget == 0 => {
                log.unavailable = format!(
                    "not read: the {MAX_TOTAL_BYTES} bytes of CI logs a prompt carries are spent"
                );
            }
            _ => match read(forgejo, repo, run, job).await {
                Ok((name, text, total)) => {
                    log.job = super::context::one_line(&name);
                    budget = fill(&mut log, &text, total, budget);
                }
                Err(why) => log.unavailable = why,
            },
        }
        out.push(log);
    }
    out
}

/// The line an older Forgejo's check gets.
fn too_old(v: &ForgejoVersion) -> String {
    format!(
        "Forgejo {} does not serve job logs over its API (v{} and later do): read the log on the job's page",
        super::context::one_line(&v.text),
        crate::forgejo::JOB_LOGS_SINCE
    )
}

/// The job's name, its log's last [`MAX_SCAN_BYTES`] and the log's length; or why not.
async fn read(
    forgejo: &ForgejoClient,
    repo: &str,
    run: u64,
    job: usize,
) -> Result<(String, String, Option<u64>), String> {
    let why = |what: &str, e: ForgejoError| match e {
        ForgejoError::Status { code: 404, .. } => format!(
            "{what} answered 404 (this Forgejo has no such route, or the job never ran or its log expired)"
        ),
        e => format!("{what} could not be read: {e}"),
    };
    let run_row = forgejo
        .action_run_by_number(repo, run)
        .await
        .map_err(|e| why("the run", e))?
        .ok_or_else(|| format!("run {run} was not found"))?;
    let jobs = forgejo
        .action_run_jobs(repo, run_row.id)
        .await
        .map_err(|e| why("the run's jobs", e))?;
    let job_row = jobs
        .get(job)
        .ok_or_else(|| format!("run {run} has no job {job}"))?;
    let tail = forgejo
        .action_job_log_tail(repo, job_row.id, MAX_SCAN_BYTES)
        .await
        .map_err(|e| why("the job's log", e))?;
    Ok((job_row.name.clone(), clean(&tail.text), tail.total))
}

/// Puts the tail and the error lines of `text` (the log's last bytes; the log has
/// `total` bytes) into `log` within `budget`; returns what is left of the budget.
fn fill(log: &mut CheckLog, text: &str, total: Option<u64>, budget: usize) -> usize {
    let tail_max = MAX_TAIL_BYTES.min(budget);
    let (head, tail) = split_tail(text, tail_max);
    log.tail = tail.to_owned();
    let whole = total.map_or_else(
        || "a log of unknown length".into(),
        |t| format!("{t} bytes"),
    );
    log.tail_note = if head.is_empty() && total.is_none_or(|t| t as usize <= text.len()) {
        format!("the whole log ({whole})")
    } else {
        format!("the last {} bytes of {whole}", tail.len())
    };
    let left = budget - tail.len();
    log.errors = error_lines(head, MAX_ERROR_BYTES.min(left));
    left - log.errors.len()
}

/// `text` split before its last `max` bytes, at a line start when there is one.
fn split_tail(text: &str, max: usize) -> (&str, &str) {
    if text.len() <= max {
        return ("", text);
    }
    let mut at = text.len() - max;
    while !text.is_char_boundary(at) {
        at += 1;
    }
    if let Some(nl) = text[at..].find('\n')
        && nl + 1 < text.len() - at
    {
        at += nl + 1;
    }
    text.split_at(at)
}

/// The lines of `text` that look like errors, each cut to [`MAX_LINE_BYTES`], at most
/// `max` bytes in all (the last ones kept: the failure is near the end), with a note
/// when some were left out.
pub fn error_lines(text: &str, max: usize) -> String {
    let found: Vec<String> = text
        .lines()
        .filter(|l| {
            let l = l.to_lowercase();
            ERROR_WORDS.iter().any(|w| l.contains(w))
        })
        .map(|l| bounded(l.trim_end(), MAX_LINE_BYTES).replace('\n', " "))
        .collect();
    let note_room = TRUNCATION_MARK.len() + 64;
    let mut kept: Vec<&String> = Vec::new();
    let mut used = 0;
    for line in found.iter().rev() {
        if used + line.len() + 1 + note_room > max {
            break;
        }
        used += line.len() + 1;
        kept.push(line);
    }
    if kept.is_empty() && found.is_empty() {
        return String::new();
    }
    kept.reverse();
    let mut out: String = kept.iter().map(|l| format!("{l}\n")).collect();
    let left_out = found.len() - kept.len();
    if left_out > 0 && used + note_room <= max {
        out.push_str(&format!(
            "{TRUNCATION_MARK} {left_out} earlier error lines]\n"
        ));
    }
    out
}

/// Log text without terminal escapes (`ESC [ … letter`) and with every other control
/// character but line breaks and tabs turned into a space; `\r\n` becomes `\n`.
pub fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for n in chars.by_ref() {
                        if n.is_ascii_alphabetic() {
                            break;
                        }
                    }
                }
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\t' => out.push(c),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_links_of_this_repository_only() {
        let repo = "o/r";
        assert_eq!(
            job_link("https://f.example/sub/o/r/actions/runs/12/jobs/3", repo),
            Some((12, 3))
        );
        assert_eq!(
            job_link("https://f.example/o/r/actions/runs/12", repo),
            None
        );
        assert_eq!(
            job_link("https://f.example/x/o/r2/actions/runs/1/jobs/0", repo),
            None
        );
        assert_eq!(
            job_link("https://f.example/o/r/actions/runs/1/jobs/0/x", repo),
            None
        );
        assert_eq!(job_link("https://ci.example/build/7", repo), None);
    }

    #[test]
    fn tails_start_on_a_line_and_fit_the_budget() {
        let text = format!("{}\nlast line\n", "x".repeat(100));
        let (head, tail) = split_tail(&text, 20);
        assert_eq!(tail, "last line\n");
        assert_eq!(head.len() + tail.len(), text.len());
        let mut log = CheckLog::default();
        let log_text = format!("error: one\n{}\nerror: two\n", "y".repeat(MAX_TAIL_BYTES));
        let left = fill(&mut log, &log_text, Some(1_000_000), MAX_TOTAL_BYTES);
        assert!(log.tail.len() <= MAX_TAIL_BYTES, "{}", log.tail.len());
        assert!(log.tail.ends_with("error: two\n"));
        assert_eq!(log.errors, "error: one\n");
        assert!(
            log.tail_note.ends_with("of 1000000 bytes"),
            "{}",
            log.tail_note
        );
        assert_eq!(left, MAX_TOTAL_BYTES - log.tail.len() - log.errors.len());
        let mut small = CheckLog::default();
        let left_small = fill(&mut small, &log_text, None, 100);
        assert!(small.tail.len() <= 100);
        assert_eq!(small.tail.len() + small.errors.len() + left_small, 100);
    }

    #[test]
    fn error_lines_are_bounded_and_say_so() {
        let text: String = (0..5000)
            .map(|i| format!("ERROR case {i}\nok {i}\n"))
            .collect();
        let lines = error_lines(&text, MAX_ERROR_BYTES);
        assert!(lines.len() <= MAX_ERROR_BYTES, "{}", lines.len());
        assert!(lines.contains("ERROR case 4999"), "the last ones are kept");
        assert!(!lines.contains("ok 1"));
        assert!(lines.contains(TRUNCATION_MARK), "{lines}");
        let huge = format!("panic: {}\n", "z".repeat(100_000));
        let one = error_lines(&huge, MAX_ERROR_BYTES);
        assert!(one.len() < MAX_LINE_BYTES + 200, "{}", one.len());
        assert_eq!(error_lines("all good\n", 100), "");
    }

    #[test]
    fn logs_are_cleaned_of_escapes_and_controls() {
        let raw = "\u{1b}[31merror\u{1b}[0m: x\r\nbell\u{7}\tok\r";
        assert_eq!(clean(raw), "error: x\nbell \tok ");
    }
}
