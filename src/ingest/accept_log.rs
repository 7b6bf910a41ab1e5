//! The log of accepted webhook deliveries: one `info` line each (event, repository,
//! number, delivery id), up to [`SINGLE_LINES_PER_SECOND`] a second; above that rate
//! the deliveries are only counted per event and each second ends with one summary
//! line, so a load test does not flood the log ([`AcceptLog`], lock-free on the
//! ingest path). `ingest::webhook` calls [`log_accepted`] for every delivery it queued
//! (or found already queued); the HTTP server runs [`summarise_deliveries`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ingest::Delivery;
use crate::ingest::webhook::KNOWN_EVENTS;

/// Accepted deliveries logged one line each per second; above this, one summary line
/// a second instead.
pub const SINGLE_LINES_PER_SECOND: u64 = 50;

/// The process's log of accepted deliveries.
static ACCEPTED: AcceptLog = AcceptLog::new();

/// Counter slots: one per [`KNOWN_EVENTS`] entry, then one for every other event.
const EVENT_SLOTS: usize = KNOWN_EVENTS.len() + 1;

/// Bits of the window word holding the count of the current second.
const COUNT_BITS: u32 = 21;
/// Largest count kept (the count saturates there).
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
/// Bit of the window word set when the whole second is summarised (the second
/// before it was above the limit).
const QUIET: u64 = 1 << COUNT_BITS;
/// Shift of the unix second in the window word.
const SECOND_SHIFT: u32 = COUNT_BITS + 1;

/// The rate limiter of the accepted-delivery lines, lock-free on the ingest path: one
/// atomic word holds the current second, its count so far and whether the whole
/// second is summarised (it follows a second above the limit, so a sustained load
/// logs one summary a second and nothing else); the summarised deliveries are counted
/// per event in atomics of the second's parity, read and reset once when the second
/// is closed (by the next delivery of a later second, or by [`summarise_deliveries`]).
/// Nothing is allocated per delivery beyond the one line itself.
pub struct AcceptLog {
    /// `second << SECOND_SHIFT | QUIET? | count`.
    window: AtomicU64,
    /// Summarised deliveries per event slot, by the parity of their second.
    summarised: [[AtomicU64; EVENT_SLOTS]; 2],
}

/// What to do with one accepted delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    /// Log it on a line of its own.
    Line,
    /// Only counted: the second's summary line shows it.
    Counted,
}

/// A closed second in which some deliveries were summarised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The unix second.
    pub second: u64,
    /// Deliveries accepted in it (logged singly or summarised).
    pub accepted: u64,
    /// Summarised deliveries by event type (event names bounded like the metric's).
    pub counts: Vec<(&'static str, u64)>,
}

impl Summary {
    /// Summarised deliveries in all.
    pub fn summarised(&self) -> u64 {
        self.counts.iter().map(|(_, n)| n).sum()
    }
}

impl Default for AcceptLog {
    fn default() -> Self {
        Self::new()
    }
}

impl AcceptLog {
    /// An empty log (no second open yet).
    pub const fn new() -> Self {
        Self {
            window: AtomicU64::new(0),
            summarised: [
                [const { AtomicU64::new(0) }; EVENT_SLOTS],
                [const { AtomicU64::new(0) }; EVENT_SLOTS],
            ],
        }
    }

    /// Notes one accepted delivery of `event` in unix second `second`: whether it gets
    /// a line of its own, and the summary of the second this one closed, if any.
    pub fn note(&self, second: u64, event: &str) -> (Note, Option<Summary>) {
        let step = |w| Some(advance(w, second, 1));
        let prev = match self
            .window
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, step)
        {
            Ok(w) | Err(w) => w,
        };
        let next = advance(prev, second, 1);
        let (current, quiet, count) = unpack(next);
        let note = if quiet || count > SINGLE_LINES_PER_SECOND {
            self.summarised[parity(current)][event_slot(event)].fetch_add(1, Ordering::Relaxed);
            Note::Counted
        } else {
            Note::Line
        };
        (note, self.close(prev, next))
    }

    /// Closes the open second when `now` (a unix second) is past it, returning its
    /// summary when it has one. Called about every quarter second, so the summary of a
    /// burst is written even when no delivery follows it.
    pub fn tick(&self, now: u64) -> Option<Summary> {
        let step = |w| (unpack(w).0 < now).then(|| advance(w, now, 0));
        let prev = self
            .window
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, step)
            .ok()?;
        self.close(prev, advance(prev, now, 0))
    }

    /// The summary of the second `prev` held, when the step to `next` left it (only
    /// the one caller whose update moved the window reads and resets its counters).
    fn close(&self, prev: u64, next: u64) -> Option<Summary> {
        let (second, _, accepted) = unpack(prev);
        if unpack(next).0 == second {
            return None;
        }
        let counts: Vec<(&'static str, u64)> = self.summarised[parity(second)]
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| {
                let n = c.swap(0, Ordering::AcqRel);
                (n > 0).then(|| (slot_event(slot), n))
            })
            .collect();
        (!counts.is_empty()).then_some(Summary {
            second,
            accepted,
            counts,
        })
    }
}

/// The window word after `add` deliveries in `second`: a later second opens a new
/// window (summarised as a whole when it directly follows one above the limit); the
/// same or an earlier second (another thread read the clock a moment before) counts in
/// the open window.
fn advance(window: u64, second: u64, add: u64) -> u64 {
    let (open, quiet, count) = unpack(window);
    if second > open {
        let quiet = second == open + 1 && count > SINGLE_LINES_PER_SECOND;
        pack(second, quiet, add)
    } else {
        pack(open, quiet, (count + add).min(COUNT_MAX))
    }
}

fn pack(second: u64, quiet: bool, count: u64) -> u64 {
    (second << SECOND_SHIFT) | if quiet { QUIET } else { 0 } | count.min(COUNT_MAX)
}

fn unpack(window: u64) -> (u64, bool, u64) {
    (
        window >> SECOND_SHIFT,
        window & QUIET != 0,
        window & COUNT_MAX,
    )
}

fn parity(second: u64) -> usize {
    (second % 2) as usize
}

fn event_slot(event: &str) -> usize {
    KNOWN_EVENTS
        .iter()
        .position(|k| *k == event)
        .unwrap_or(KNOWN_EVENTS.len())
}

fn slot_event(slot: usize) -> &'static str {
    KNOWN_EVENTS.get(slot).copied().unwrap_or("other")
}

/// Logs an accepted delivery: its own `info` line, or only counted (and a summary
/// line when this delivery closed a summarised second).
pub fn log_accepted(delivery: &Delivery, duplicate: bool) {
    let log = &ACCEPTED;
    let second = u64::try_from(delivery.received_ms() / 1000).unwrap_or(0);
    let (note, closed) = log.note(second, delivery.event());
    if let Some(summary) = closed {
        log_summary(&summary);
    }
    if note == Note::Counted {
        return;
    }
    let repo = Some(delivery.repo())
        .filter(|r| !r.is_empty())
        .map(tracing::field::display);
    let number = number_of(delivery.verified().payload());
    let (event, id) = (delivery.event(), delivery.id());
    // Outside the request's span: the line carries its own fields.
    if duplicate {
        tracing::info!(parent: None, event = %event, repo, number, delivery = %id,
            "delivery already queued (a redelivery)");
    } else {
        tracing::info!(parent: None, event = %event, repo, number, delivery = %id,
            "delivery queued");
    }
}

/// One line for a second in which more than [`SINGLE_LINES_PER_SECOND`] deliveries
/// arrived (or that followed such a second).
fn log_summary(s: &Summary) {
    let at = chrono::DateTime::from_timestamp(i64::try_from(s.second).unwrap_or(0), 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default();
    let per_event = s
        .counts
        .iter()
        .map(|(e, n)| format!("{e}={n}"))
        .collect::<Vec<_>>()
        .join(",");
    tracing::info!(
        parent: None,
        second = %at,
        accepted = s.accepted,
        summarised = s.summarised(),
        per_event = %per_event,
        "deliveries summarised: more than {SINGLE_LINES_PER_SECOND} a second"
    );
}

/// Closes each second of the accepted-delivery log as it passes, writing its summary
/// line, until `shutdown` (then the open second is closed too). Started with the HTTP
/// server.
pub async fn summarise_deliveries(shutdown: CancellationToken) {
    let now = || u64::try_from(chrono::Utc::now().timestamp()).unwrap_or(0);
    let mut every = tokio::time::interval(Duration::from_millis(250));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = every.tick() => {}
        }
        if let Some(summary) = ACCEPTED.tick(now()) {
            log_summary(&summary);
        }
    }
    if let Some(summary) = ACCEPTED.tick(now() + 1) {
        log_summary(&summary);
    }
}

/// The pull request or issue number a payload is about, when it names one: `number`
/// (pull request events), else `pull_request.number` (reviews), else `issue.number`
/// (issue and comment events). Parsed only for deliveries that get a line.
fn number_of(payload: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Numbered {
        number: Option<u64>,
    }
    #[derive(serde::Deserialize)]
    struct Payload {
        number: Option<u64>,
        pull_request: Option<Numbered>,
        issue: Option<Numbered>,
    }
    let p: Payload = serde_json::from_slice(payload).ok()?;
    p.number
        .or(p.pull_request.and_then(|n| n.number))
        .or(p.issue.and_then(|n| n.number))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_rates_get_a_line_each_and_no_summary() {
        let log = AcceptLog::new();
        for second in 100..103 {
            for _ in 0..SINGLE_LINES_PER_SECOND {
                assert_eq!(log.note(second, "push"), (Note::Line, None));
            }
        }
        assert_eq!(log.tick(200), None);
    }

    #[test]
    fn above_the_limit_the_rest_of_the_second_is_counted_then_summarised() {
        let log = AcceptLog::new();
        for _ in 0..SINGLE_LINES_PER_SECOND {
            assert_eq!(log.note(10, "push").0, Note::Line);
        }
        assert_eq!(log.note(10, "push").0, Note::Counted);
        assert_eq!(log.note(10, "pull_request").0, Note::Counted);
        assert_eq!(log.note(10, "no_such_event").0, Note::Counted);
        assert_eq!(log.tick(10), None, "the second is still open");
        let summary = log.tick(11).expect("closing the second summarises it");
        assert_eq!(summary.second, 10);
        assert_eq!(summary.accepted, SINGLE_LINES_PER_SECOND + 3);
        assert_eq!(
            summary.counts,
            vec![("push", 1), ("pull_request", 1), ("other", 1)]
        );
        assert_eq!(log.tick(12), None, "a second is summarised once");
    }

    #[test]
    fn a_second_after_one_above_the_limit_is_summarised_whole() {
        let log = AcceptLog::new();
        for _ in 0..=SINGLE_LINES_PER_SECOND {
            log.note(20, "push");
        }
        // The first delivery of the next second closes the previous one.
        let (note, closed) = log.note(21, "status");
        assert_eq!(note, Note::Counted);
        assert_eq!(closed.expect("second 20 closed").counts, vec![("push", 1)]);
        assert_eq!(log.note(21, "status").0, Note::Counted);
        let summary = log.tick(22).expect("second 21 summarised");
        assert_eq!((summary.accepted, summary.summarised()), (2, 2));
        // Quiet seconds reset it: after a gap, lines again.
        assert_eq!(log.note(30, "push").0, Note::Line);
    }

    #[test]
    fn a_late_clock_reading_counts_in_the_open_second() {
        let log = AcceptLog::new();
        log.note(40, "push");
        assert_eq!(log.note(39, "push"), (Note::Line, None));
        assert_eq!(unpack(log.window.load(Ordering::Acquire)), (40, false, 2));
    }

    #[test]
    fn numbers_come_from_the_payload_kinds_that_have_one() {
        assert_eq!(
            number_of(br#"{"number": 7, "pull_request": {"number": 7}}"#),
            Some(7)
        );
        assert_eq!(number_of(br#"{"pull_request": {"number": 8}}"#), Some(8));
        assert_eq!(
            number_of(br#"{"issue": {"number": 9}, "comment": {}}"#),
            Some(9)
        );
        assert_eq!(
            number_of(br#"{"ref": "refs/heads/main", "pull_request": null}"#),
            None
        );
        assert_eq!(number_of(b"{not json"), None);
    }
}
