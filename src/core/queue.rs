//! The merge queue of one target branch (issue 16, DESIGN §2.4 "Merge queue"): pure
//! data and rules, no IO.
//!
//! Who decides what:
//! - Each PR record decides whether it *wants* to be in its branch's queue
//!   (`core::machine`, level-triggered: every §2.4 condition holds → `Join`; a problem
//!   appears → `Park`, keeping its ticket; merged, closed, dequeued → `Leave`) and sends
//!   that as a [`QueueOp`] effect.
//! - The executor applies the op to the branch's [`BranchQueue`] (stored under one key
//!   with compare-and-set on [`BranchQueue::version`]) with [`BranchQueue::apply`], and
//!   tells every PR whose place changed ([`BranchQueue::places`], [`changed_places`]).
//! - Only the queue's head is tested: its record asks the executor to advance it
//!   (`EffectKind::QueueAdvance`), and the executor decides with [`head_action`] from
//!   fresh reads whether to update the PR onto the branch tip or to merge it.
//!
//! Ops carry the version of the record that sent them: an op older than the last one
//! applied for that PR is ignored, so redelivered or reordered effects converge on the
//! state the PR's latest op asked for.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ids::Sha;

pub mod batch;
pub mod freeze;
pub mod stats;

/// Position class in the queue (`/shepherd priority high|normal`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Priority {
    /// A PR with the policy's `merge_queue_hotfix_label`: before every other entry,
    /// it takes the head from a PR that is not a hotfix, and merges through a freeze
    /// (`freeze`).
    Hotfix,
    /// Before every `normal` entry (still behind the head under test).
    High,
    /// In order of entry.
    #[default]
    Normal,
}

impl Priority {
    /// The name.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Hotfix => "hotfix",
            Priority::High => "high",
            Priority::Normal => "normal",
        }
    }
}

/// Why a PR left testing but keeps its ticket (it re-enters at its old position).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ejection {
    /// CI failed (on top of the base it was updated onto, or on its own head).
    CiFailed,
    /// The update onto the branch tip conflicted (409), or Forgejo reports conflicts.
    Conflict,
    /// Approvals are missing (dismissed or stale after the update, or withdrawn).
    Approvals,
    /// Change requests, work in progress, a pause or needs-human.
    NotReady,
    /// The base moved more often than `merge_queue_max_updates` while testing: the PR
    /// went to the back of the queue.
    BaseMoving,
    /// CI on the head under test did not settle within `merge_queue_ci_timeout_secs`:
    /// the next PR is tested; this one re-enters at its position once its CI settles.
    CiTimeout,
}

impl Ejection {
    /// The name (metrics label, status page).
    pub fn as_str(self) -> &'static str {
        match self {
            Ejection::CiFailed => "ci-failed",
            Ejection::Conflict => "conflict",
            Ejection::Approvals => "approvals",
            Ejection::NotReady => "not-ready",
            Ejection::BaseMoving => "base-moving",
            Ejection::CiTimeout => "ci-timeout",
        }
    }
}

/// Why a PR left the queue for good (its ticket is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Departure {
    /// Merged.
    Merged,
    /// Closed.
    Closed,
    /// `/shepherd dequeue`, or the queue was turned off by policy.
    Dequeued,
    /// The PR now targets another branch (its record, or the advance, saw it).
    Retargeted,
}

/// What one PR asks of its branch's queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "op")]
pub enum QueueAction {
    /// Enter (or re-enter at the old ticket) with this priority.
    Join {
        /// Position class.
        priority: Priority,
    },
    /// Stop testing, keep the ticket.
    Park {
        /// Why.
        reason: Ejection,
    },
    /// Go to the back of the queue (a new ticket) and wait there, parked, until ready.
    Requeue {
        /// Why.
        reason: Ejection,
    },
    /// Leave for good.
    Leave {
        /// Why.
        reason: Departure,
    },
}

/// One op on a branch's queue, as a PR record sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueOp {
    /// Target branch.
    pub branch: String,
    /// The PR.
    pub number: u64,
    /// The version of the record that sent it (older ops than the last applied one of
    /// the same PR are ignored).
    pub version: u64,
    /// What it asks.
    pub action: QueueAction,
}

/// One PR in the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The PR.
    pub number: u64,
    /// Position class.
    pub priority: Priority,
    /// Order of entry within the class (kept while parked).
    pub ticket: u64,
    /// When it (re-)entered testing order (unix ms), for the time in queue.
    pub since_ms: i64,
    /// When it first entered the queue (unix ms).
    pub entered_ms: i64,
    /// Parked: not tested until it joins again; the reason is shown.
    pub parked: Option<Ejection>,
    /// The record version of the last op applied for it.
    pub op_version: u64,
}

/// Counters of one branch's queue (metrics and the status page).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStats {
    /// PRs merged through the queue.
    pub merged: u64,
    /// Sum of the time in queue (first entry → merge) of the merged PRs, ms.
    pub merged_wait_ms: u64,
    /// Ejections by reason.
    pub ejections: BTreeMap<Ejection, u64>,
    /// The time in queue of the latest merges (bounded: [`stats::WAITS_KEPT`], 7
    /// days), for the percentiles of the last 24 h and 7 d ([`stats`]).
    #[serde(default, skip_serializing_if = "std::collections::VecDeque::is_empty")]
    pub recent_waits: std::collections::VecDeque<stats::WaitSample>,
    /// Batches built and sent to CI (issue 29), re-tests and bisection halves included.
    #[serde(default)]
    pub batches_tested: u64,
    /// Batches tested for the first time (not a re-test, not a bisection half): the
    /// denominator of the first-pass success.
    #[serde(default)]
    pub batches_first_tested: u64,
    /// Batches that were green on their first test (no re-test, not a bisection half).
    #[serde(default)]
    pub batches_first_pass_green: u64,
    /// CI runs the queue asked for: one per batch tip tested, one per update of the
    /// serial queue's head onto the tip (its re-tests are batches of one).
    #[serde(default)]
    pub ci_runs: u64,
    /// Re-tests of a red single PR (alone in a batch, or the serial queue's head)
    /// whose failing checks all passed on the target's tip.
    #[serde(default)]
    pub flaky_retries: u64,
    /// Red results that turned out flaky (a re-test passed, or a bisection ended with
    /// every part green): PRs kept instead of ejected.
    #[serde(default)]
    pub flaky_saved: u64,
    /// Suspected-flaky check contexts → how often they failed and then passed.
    #[serde(default)]
    pub flaky_checks: BTreeMap<String, u64>,
}

/// How many departed PRs a queue remembers the last op version of (so a late,
/// redelivered `Join` of a merged PR does not bring it back).
pub const DEPARTED_KEPT: usize = 256;

/// The queue of one target branch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchQueue {
    /// Compare-and-set version (0: never stored).
    pub version: u64,
    /// Target branch.
    pub branch: String,
    /// Entries, in no particular order (see [`BranchQueue::order`]).
    pub entries: Vec<Entry>,
    /// The PR being tested (updated onto the tip, CI, merge): at most one, and it stays
    /// the head until it parks or leaves, whatever enters with a higher priority.
    pub head: Option<u64>,
    /// The next ticket.
    pub next_ticket: u64,
    /// PRs that left → the version of their last op.
    #[serde(default)]
    pub departed: BTreeMap<u64, u64>,
    /// Counters.
    #[serde(default)]
    pub stats: QueueStats,
    /// Frozen by hand (`/shepherd freeze`): nothing merges until unfrozen ([`freeze`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze: Option<freeze::ManualFreeze>,
    /// The batch under test (issue 29; `merge_queue_batch_size` > 1), led by `head`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<batch::Batch>,
    /// A red batch being bisected: which PRs are still suspected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bisect: Option<batch::Bisection>,
    /// The next batch id (names its temporary branch).
    #[serde(default)]
    pub next_batch: u64,
    /// Temporary branches of batches that ended, still to delete (written before the
    /// batch is dropped, so a crash between the two leaves a name to delete, never a
    /// forgotten branch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale_branches: Vec<String>,
}

/// Where one PR stands in its queue, as its record is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    /// Target branch.
    pub branch: String,
    /// 1-based position among the PRs waiting to be tested (1 = the head); `None`
    /// when parked or not in the queue.
    pub position: Option<u32>,
    /// Being tested.
    pub head: bool,
    /// Entries waiting to be tested in the whole queue.
    pub length: u32,
    /// The queue's version this place was computed at (a record ignores a place older
    /// than the one it has: notices may arrive out of order).
    pub version: u64,
    /// The version of the PR's latest op the queue had applied: a record ignores a
    /// place that does not reflect the latest op it sent.
    #[serde(default)]
    pub op_version: u64,
}

impl BranchQueue {
    /// An empty queue of `branch`.
    pub fn new(branch: &str) -> BranchQueue {
        BranchQueue {
            branch: branch.to_owned(),
            next_ticket: 1,
            ..BranchQueue::default()
        }
    }

    /// Applies one op at `now_ms`; false when it changed nothing (a stale or duplicate
    /// op). The head is re-chosen afterwards ([`BranchQueue::promote`]).
    pub fn apply(&mut self, op: &QueueOp, now_ms: i64) -> bool {
        if op.branch != self.branch {
            return false;
        }
        let before = self.clone();
        let known = self.entries.iter().position(|e| e.number == op.number);
        let last = known
            .map(|i| self.entries[i].op_version)
            .or_else(|| self.departed.get(&op.number).copied());
        if last.is_some_and(|v| op.version <= v) {
            return false;
        }
        match (&op.action, known) {
            (QueueAction::Join { priority }, Some(i)) => {
                let e = &mut self.entries[i];
                if e.parked.is_some() {
                    e.since_ms = now_ms;
                }
                e.parked = None;
                e.priority = *priority;
                e.op_version = op.version;
            }
            (QueueAction::Join { priority }, None) => {
                self.departed.remove(&op.number);
                let ticket = self.take_ticket();
                self.entries.push(Entry {
                    number: op.number,
                    priority: *priority,
                    ticket,
                    since_ms: now_ms,
                    entered_ms: now_ms,
                    parked: None,
                    op_version: op.version,
                });
            }
            (QueueAction::Park { reason }, Some(i)) => {
                if self.entries[i].parked.is_none() {
                    *self.stats.ejections.entry(*reason).or_default() += 1;
                }
                let e = &mut self.entries[i];
                e.parked = Some(*reason);
                e.op_version = op.version;
            }
            (QueueAction::Requeue { reason }, Some(i)) => {
                *self.stats.ejections.entry(*reason).or_default() += 1;
                let ticket = self.take_ticket();
                let e = &mut self.entries[i];
                e.parked = Some(*reason);
                e.ticket = ticket;
                e.op_version = op.version;
            }
            // Parked before it ever joined (ops reordered): remember the version, so the
            // older `Join` it overtook does not start testing it.
            (QueueAction::Park { .. } | QueueAction::Requeue { .. }, None) => {
                self.remember_departure(op.number, op.version);
            }
            (QueueAction::Leave { reason }, Some(i)) => {
                let e = self.entries.remove(i);
                if *reason == Departure::Merged {
                    let waited = now_ms.saturating_sub(e.entered_ms).max(0);
                    self.stats
                        .record_merge(now_ms, u64::try_from(waited).unwrap_or(0));
                }
                self.remember_departure(op.number, op.version);
            }
            (QueueAction::Leave { .. }, None) => self.remember_departure(op.number, op.version),
        }
        self.promote();
        *self != before
    }

    /// A fresh ticket.
    fn take_ticket(&mut self) -> u64 {
        let t = self.next_ticket.max(1);
        self.next_ticket = t + 1;
        t
    }

    /// Remembers the last op version of a PR that left (bounded: the oldest PR
    /// numbers are forgotten first).
    fn remember_departure(&mut self, number: u64, version: u64) {
        self.departed.insert(number, version);
        while self.departed.len() > DEPARTED_KEPT {
            self.departed.pop_first();
        }
    }

    /// The entries waiting to be tested, in order: the head first, then by priority
    /// and ticket.
    pub fn order(&self) -> Vec<&Entry> {
        let mut active: Vec<&Entry> = self.entries.iter().filter(|e| e.parked.is_none()).collect();
        active.sort_by_key(|e| (Some(e.number) != self.head, e.priority, e.ticket));
        active
    }

    /// Parked entries (ejected, waiting to be ready again), by ticket.
    pub fn parked(&self) -> Vec<&Entry> {
        let mut parked: Vec<&Entry> = self.entries.iter().filter(|e| e.parked.is_some()).collect();
        parked.sort_by_key(|e| (e.priority, e.ticket));
        parked
    }

    /// Keeps the head while it is an active entry (and not a non-hotfix PR with a
    /// hotfix waiting: a hotfix must not wait behind a head a freeze holds); otherwise
    /// the first active entry by priority and ticket becomes the head (none when the
    /// queue has no active entry).
    pub fn promote(&mut self) {
        let active = |n: u64, hotfix: bool| {
            (self.entries.iter()).any(|e| {
                e.number == n && e.parked.is_none() && (!hotfix || e.priority == Priority::Hotfix)
            })
        };
        let hotfix_waiting =
            (self.entries.iter()).any(|e| e.parked.is_none() && e.priority == Priority::Hotfix);
        let head_active = self.head.is_some_and(|h| active(h, hotfix_waiting));
        if head_active {
            return;
        }
        self.head = None;
        self.head = self.order().first().map(|e| e.number);
    }

    /// The place of every PR the queue knows, and of `also` (a PR that may have just
    /// left: it gets a place with no position).
    pub fn places(&self) -> BTreeMap<u64, Place> {
        let order = self.order();
        let length = u32::try_from(order.len()).unwrap_or(u32::MAX);
        let mut out = BTreeMap::new();
        for e in &self.entries {
            let position = order
                .iter()
                .position(|o| o.number == e.number)
                .map(|i| u32::try_from(i + 1).unwrap_or(u32::MAX));
            out.insert(
                e.number,
                Place {
                    branch: self.branch.clone(),
                    position,
                    head: self.head == Some(e.number),
                    length,
                    version: self.version,
                    op_version: e.op_version,
                },
            );
        }
        out
    }
}

/// The PRs whose position or headship differs between two states of a queue (a PR
/// that left gets a place with no position), in PR order: who must be told. A change
/// of the queue's length alone tells nobody.
pub fn changed_places(before: &BranchQueue, after: &BranchQueue) -> Vec<(u64, Place)> {
    let (b, a) = (before.places(), after.places());
    let mut out = Vec::new();
    for (n, place) in &a {
        let same = b
            .get(n)
            .is_some_and(|old| old.position == place.position && old.head == place.head);
        if !same {
            out.push((*n, place.clone()));
        }
    }
    for n in b.keys().filter(|n| !a.contains_key(n)) {
        out.push((
            *n,
            Place {
                branch: after.branch.clone(),
                position: None,
                head: false,
                length: u32::try_from(after.order().len()).unwrap_or(u32::MAX),
                version: after.version,
                op_version: after.departed.get(n).copied().unwrap_or(0),
            },
        ));
    }
    out.sort_by_key(|(n, _)| *n);
    out
}

/// What the executor read about the queue's head right before acting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadReading {
    /// The PR is merged.
    pub merged: bool,
    /// The PR is open.
    pub open: bool,
    /// Its head now.
    pub head: Sha,
    /// The commit its record tested and pinned.
    pub pinned: Sha,
    /// Forgejo's `merge_base` of the PR (the base commit its head is built on).
    pub merge_base: Option<Sha>,
    /// The target branch's tip now.
    pub tip: Sha,
}

/// What to do with the queue's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadAction {
    /// Merged already.
    Merged,
    /// Closed, or the head is not the pinned one: nothing to do; the record re-reads.
    HeadMoved,
    /// Not built on the tip: update it onto `tip` (never when it already is: Forgejo
    /// answers 500 "up to date").
    Update {
        /// The tip it will be built on.
        tip: Sha,
    },
    /// Built on the tip: merge the pinned head (after CI and reviews are re-checked
    /// on it), only while the tip is still `tip`.
    Merge {
        /// The base it was tested on.
        tip: Sha,
    },
}

/// The head's next step, from fresh reads.
pub fn head_action(r: &HeadReading) -> HeadAction {
    if r.merged {
        return HeadAction::Merged;
    }
    if !r.open || r.head != r.pinned {
        return HeadAction::HeadMoved;
    }
    match &r.merge_base {
        Some(base) if *base == r.tip => HeadAction::Merge { tip: r.tip.clone() },
        Some(_) | None => HeadAction::Update { tip: r.tip.clone() },
    }
}

#[cfg(test)]
mod tests;
