//! Freezes of a branch's merge queue (issue 29, docs/merge-queue.md "Freezes"): a
//! frozen queue merges nothing; it keeps testing its head unless the policy's
//! `merge_queue_freeze_test` is off. A queue is frozen by hand (`/shepherd freeze
//! <branch> [reason]` by a user with write access, until `/shepherd unfreeze
//! <branch>`; stored in [`BranchQueue::freeze`]) or by a window of the policy's
//! `merge_queue_freeze` (days and hours, UTC). A PR labelled with the policy's
//! `merge_queue_hotfix_label` joins with priority [`Priority::Hotfix`]: it goes to the
//! front of the queue and merges through any freeze.
//!
//! Pure: the executor asks [`gate`] right before it updates or merges the head, with
//! the clock it read.

use chrono::{DateTime, Datelike, Timelike};
use serde::{Deserialize, Serialize};

use super::{BranchQueue, Priority};
use crate::core::policy::Policy;

/// One day in ms.
const DAY_MS: i64 = 86_400_000;

/// The longest reason kept (a longer one is cut): it is shown in comments and on the
/// status page.
pub const MAX_REASON_CHARS: usize = 200;

/// A freeze set by hand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManualFreeze {
    /// Who froze the queue.
    pub by: String,
    /// Why (may be empty).
    pub reason: String,
    /// When (unix ms).
    pub since_ms: i64,
}

/// One freeze window of the policy (`[[merge_queue_freeze]]`): every listed day (UTC)
/// from `from` to `to`; a `to` at or before `from` ends on the next day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreezeWindow {
    /// The branch it freezes (`*`: every branch).
    pub branch: String,
    /// Days it starts on (`mon` … `sun`); empty: every day.
    #[serde(default)]
    pub days: Vec<String>,
    /// Start, `HH:MM` (or `HH:MM:SS`) UTC.
    pub from: String,
    /// End, `HH:MM` (or `HH:MM:SS`) UTC (`24:00`: midnight at the end of the day).
    pub to: String,
    /// Shown as the reason of the freeze.
    #[serde(default)]
    pub reason: String,
}

/// What to change about a queue's freeze (`/shepherd freeze|unfreeze`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "op")]
pub enum FreezeAction {
    /// Freeze until unfrozen.
    Freeze {
        /// Why.
        reason: String,
    },
    /// End the manual freeze (a policy window still holds while it lasts).
    Unfreeze,
}

/// A freeze command for one branch's queue, as a PR record sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreezeOp {
    /// Target branch.
    pub branch: String,
    /// Who asked (a user with write access).
    pub by: String,
    /// What.
    pub action: FreezeAction,
}

/// Why and until when a queue is frozen now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frozen {
    /// The reason given (may be empty).
    pub reason: String,
    /// Who froze it by hand (`None`: a policy window).
    pub by: Option<String>,
    /// When it thaws (unix ms); `None`: at `/shepherd unfreeze`.
    pub until_ms: Option<i64>,
}

impl Frozen {
    /// One line for comments and the status page: why and until when.
    pub fn describe(&self, branch: &str) -> String {
        let why = match (&self.by, self.reason.is_empty()) {
            (Some(by), true) => format!("by @{by}"),
            (Some(by), false) => format!("by @{by}: {}", self.reason),
            (None, true) => "policy window".to_owned(),
            (None, false) => format!("policy window: {}", self.reason),
        };
        let until = match self.until_ms {
            Some(ms) => format!("until {}", utc(ms)),
            None => format!("until `/shepherd unfreeze {branch}`"),
        };
        format!("the merge queue of `{branch}` is frozen ({why}) {until}")
    }
}

/// `ms` as `YYYY-MM-DD HH:MM UTC` (`HH:MM:SS` when not on a whole minute).
pub fn utc(ms: i64) -> String {
    let format = match ms.rem_euclid(60_000) {
        0 => "%Y-%m-%d %H:%M UTC",
        _ => "%Y-%m-%d %H:%M:%S UTC",
    };
    DateTime::from_timestamp_millis(ms)
        .map(|t| t.format(format).to_string())
        .unwrap_or_else(|| format!("{ms} ms"))
}

impl BranchQueue {
    /// Applies a freeze command at `now_ms`; false when it changed nothing (a second
    /// freeze keeps the first one's time but takes the new reason).
    pub fn apply_freeze(&mut self, op: &FreezeOp, now_ms: i64) -> bool {
        if op.branch != self.branch {
            return false;
        }
        let before = self.freeze.clone();
        self.freeze = match &op.action {
            FreezeAction::Freeze { reason } => Some(ManualFreeze {
                by: op.by.clone(),
                reason: reason.chars().take(MAX_REASON_CHARS).collect(),
                since_ms: before.as_ref().map_or(now_ms, |f| f.since_ms),
            }),
            FreezeAction::Unfreeze => None,
        };
        self.freeze != before
    }
}

/// Whether the queue of `q.branch` is frozen at `now_ms` (by hand first, else by a
/// window of `windows`), and until when.
pub fn frozen(q: &BranchQueue, windows: &[FreezeWindow], now_ms: i64) -> Option<Frozen> {
    if let Some(f) = &q.freeze {
        return Some(Frozen {
            reason: f.reason.clone(),
            by: Some(f.by.clone()),
            until_ms: None,
        });
    }
    let mine: Vec<&FreezeWindow> = windows
        .iter()
        .filter(|w| w.branch == q.branch || w.branch == "*")
        .collect();
    let first = mine
        .iter()
        .find_map(|w| end_of(w, now_ms).map(|e| (w, e)))?;
    // Windows that touch or overlap make one freeze: it lasts until the last one ends
    // (bounded: a freeze every day all day still reports an end two weeks ahead).
    let mut until = first.1;
    for _ in 0..14 {
        match mine.iter().filter_map(|w| end_of(w, until)).max() {
            Some(next) if next > until => until = next,
            Some(_) | None => break,
        }
    }
    Some(Frozen {
        reason: first.0.reason.clone(),
        by: None,
        until_ms: Some(until),
    })
}

/// What the freeze asks of the PRs the executor is about to move: the head, or the
/// PRs of a batch.
///
/// `merging`: they are tested on the tip and would be merged (landed) now; otherwise
/// they would be updated onto the tip or batched (tested). Hotfixes pass (every one of
/// `numbers` must be one); a frozen queue holds merges, and holds testing too when
/// `merge_queue_freeze_test` is off. `None`: go.
pub fn gate(
    q: &BranchQueue,
    numbers: &[u64],
    policy: &Policy,
    now_ms: i64,
    merging: bool,
) -> Option<Frozen> {
    let is_hotfix =
        |n: &u64| (q.entries.iter()).any(|e| e.number == *n && e.priority == Priority::Hotfix);
    let hotfix = !numbers.is_empty() && numbers.iter().all(is_hotfix);
    if hotfix || (!merging && policy.merge_queue_freeze_test) {
        return None;
    }
    frozen(q, &policy.merge_queue_freeze, now_ms)
}

/// When the record of a held head should ask again (ms from now): at the window's end,
/// and at least every five minutes (an unfreeze also tells the head at once; a
/// changed policy is seen on the next try).
pub fn retry_ms(f: &Frozen, now_ms: i64) -> u64 {
    const RECHECK_MS: i64 = 300_000;
    let wait = f
        .until_ms
        .map_or(RECHECK_MS, |u| (u - now_ms).clamp(1_000, RECHECK_MS));
    u64::try_from(wait).unwrap_or(1_000)
}

/// The end (unix ms) of the occurrence of `w` that covers `t`, if one does.
fn end_of(w: &FreezeWindow, t: i64) -> Option<i64> {
    let (from, to) = (seconds(&w.from)?, seconds(&w.to)?);
    let length = match to > from {
        true => i64::from(to - from),
        false => i64::from(DAY_SECS - from + to),
    } * 1_000;
    let today = t.div_euclid(DAY_MS) * DAY_MS;
    // An occurrence starts today or (crossing midnight) yesterday.
    [today, today - DAY_MS].into_iter().find_map(|day| {
        let start = day + i64::from(from) * 1_000;
        let on_day = w.days.is_empty()
            || (w.days.iter()).any(|d| weekday(d).is_some() && weekday(d) == day_index(day));
        (on_day && start <= t && t < start + length).then_some(start + length)
    })
}

/// Seconds in a day.
const DAY_SECS: u32 = 24 * 3600;

/// Seconds after midnight of `HH:MM` or `HH:MM:SS` (`24:00` allowed), or `None`.
fn seconds(s: &str) -> Option<u32> {
    let mut parts = s.split(':');
    let (h, m, sec) = (parts.next()?, parts.next()?, parts.next().unwrap_or("00"));
    if parts.next().is_some() || !(1..=2).contains(&h.len()) || m.len() != 2 || sec.len() != 2 {
        return None;
    }
    let digits = |x: &str| x.bytes().all(|b| b.is_ascii_digit());
    if !(digits(h) && digits(m) && digits(sec)) {
        return None;
    }
    let (h, m, sec): (u32, u32, u32) = (h.parse().ok()?, m.parse().ok()?, sec.parse().ok()?);
    let total = h * 3600 + m * 60 + sec;
    (m < 60 && sec < 60 && total <= DAY_SECS).then_some(total)
}

/// Monday = 0 … Sunday = 6 of a day name, or `None`.
fn weekday(s: &str) -> Option<u32> {
    let names = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
    let lower = s.to_ascii_lowercase();
    names
        .iter()
        .position(|n| *n == lower)
        .and_then(|i| u32::try_from(i).ok())
}

/// Monday = 0 … Sunday = 6 of the UTC day starting at `day_ms`.
fn day_index(day_ms: i64) -> Option<u32> {
    DateTime::from_timestamp_millis(day_ms).map(|t| t.weekday().num_days_from_monday())
}

/// The minute of the UTC day of `ms` (tests and the status page).
pub fn minute_of_day(ms: i64) -> Option<u32> {
    DateTime::from_timestamp_millis(ms).map(|t| t.hour() * 60 + t.minute())
}

/// Checks the policy's windows: the problem with the first bad one, if any.
pub fn validate(windows: &[FreezeWindow]) -> Result<(), String> {
    for (i, w) in windows.iter().enumerate() {
        let at = format!("window {} (branch {:?})", i + 1, w.branch);
        if w.branch.trim().is_empty() {
            return Err(format!("{at}: needs a branch (or \"*\")"));
        }
        if let Some(d) = w.days.iter().find(|d| weekday(d).is_none()) {
            return Err(format!(
                "{at}: {d:?} is not a day (mon, tue, wed, thu, fri, sat, sun)"
            ));
        }
        let (Some(from), Some(to)) = (seconds(&w.from), seconds(&w.to)) else {
            return Err(format!(
                "{at}: from and to are times \"HH:MM\" or \"HH:MM:SS\" (UTC, 00:00 to 24:00)"
            ));
        };
        if from == to || from == DAY_SECS {
            return Err(format!(
                "{at}: from {:?} and to {:?} make an empty window",
                w.from, w.to
            ));
        }
        if w.reason.chars().count() > MAX_REASON_CHARS {
            return Err(format!(
                "{at}: reason is longer than {MAX_REASON_CHARS} characters"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
