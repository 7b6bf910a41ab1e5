//! Which held work item a runner starts next, and which ones the volume caps hold
//! back (issue 28). Pure, so the rules are tested without Redis or agents.
//!
//! - **Fair share.** When a slot frees, repositories take turns: the repository whose
//!   last start is the oldest (never started: first) goes next, and within it the
//!   item of the highest kind priority, the oldest among equals. One busy repository
//!   therefore cannot starve the others: with one slot, 20 items of one repository
//!   and 2 of another, the other's items start at its turns (second and fourth).
//! - **Seeing the others.** Turns only help if the runner holds the other
//!   repositories' items: entries past a repository's share of the runner's room
//!   ([`counts_against_room`]) are held without taking room, up to [`EXTRA_HELD`],
//!   so the reader reads on past a long run of one repository's entries.
//! - **Volume caps** ([`held_back`]): policy `max_runs_per_hour` per repository (runs
//!   started in the last hour, from the ledger) and `max_open_agent_prs` (no
//!   `issue-impl` while the bot's open PRs in the repository are at the cap). A held
//!   back item waits, with the cap named in the note of its entry in the runners' table
//!   (`<p>:agents:running`, refreshed by the heartbeat; the status page shows it).

use std::collections::HashMap;

use crate::core::effect::WorkKind;
use crate::core::policy::Policy;

/// Most entries a runner holds beyond its room (one busy repository's entries past
/// its share), so it sees the entries of other repositories behind them.
pub const EXTRA_HELD: usize = 64;

/// Whether a new entry of a repository that already holds `counted` entries against
/// the runner's room takes room too: only within its share (half the room, at
/// least one); past it the entry is held as an extra (see the module docs).
pub fn counts_against_room(counted: usize, room: usize) -> bool {
    counted < (room / 2).max(1)
}

/// A held item, as the choice sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate<'a> {
    /// Its repository.
    pub repo: &'a str,
    /// Kind priority (higher first).
    pub priority: u8,
    /// Arrival order (older first among equals).
    pub seq: u64,
    /// It may start now (its repository is below its cap of running agents, no run
    /// of the same work id, no volume cap holds it back).
    pub eligible: bool,
}

/// When each repository last started an item (a growing turn number).
#[derive(Debug, Clone, Default)]
pub struct Turns {
    /// Repository → turn of its last start.
    last: HashMap<String, u64>,
    /// The last turn given.
    turn: u64,
}

impl Turns {
    /// Notes a start for `repo`.
    pub fn started(&mut self, repo: &str) {
        self.turn += 1;
        self.last.insert(repo.to_owned(), self.turn);
    }

    /// Forgets repositories with nothing held (keeps the map bounded by what is held;
    /// a repository that comes back starts as new, i.e. first).
    pub fn retain(&mut self, held: impl Fn(&str) -> bool) {
        self.last.retain(|repo, _| held(repo));
    }

    /// The turn of `repo`'s last start (0: never).
    fn of(&self, repo: &str) -> u64 {
        self.last.get(repo).copied().unwrap_or(0)
    }
}

/// The index of the item to start next: the repository whose turn is the oldest,
/// then within it the highest priority, the oldest first.
pub fn pick(waiting: &[Candidate<'_>], turns: &Turns) -> Option<usize> {
    waiting
        .iter()
        .enumerate()
        .filter(|(_, c)| c.eligible)
        .min_by_key(|(_, c)| (turns.of(c.repo), std::cmp::Reverse(c.priority), c.seq))
        .map(|(i, _)| i)
}

/// What the runner knows of one repository's volume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Volume {
    /// Runs started in the last hour.
    pub runs_last_hour: u64,
    /// The bot's open PRs, when read.
    pub open_agent_prs: Option<u64>,
}

/// Which volume cap holds an item of `kind` back, if any (its text for the status
/// page).
pub fn held_back(policy: &Policy, kind: WorkKind, v: &Volume) -> Option<String> {
    let runs_cap = u64::from(policy.max_runs_per_hour);
    if runs_cap > 0 && v.runs_last_hour >= runs_cap {
        return Some(format!(
            "held back: max_runs_per_hour ({} runs started in the last hour, cap {runs_cap})",
            v.runs_last_hour
        ));
    }
    let prs_cap = u64::from(policy.max_open_agent_prs);
    if kind == WorkKind::IssueImpl
        && prs_cap > 0
        && let Some(open) = v.open_agent_prs
        && open >= prs_cap
    {
        return Some(format!(
            "held back: max_open_agent_prs ({open} open bot PRs, cap {prs_cap})"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulates one slot over a stream of `(repo, priority)` items read in order:
    /// the runner holds what `counts_against_room` and [`EXTRA_HELD`] let it hold,
    /// starts by [`pick`] whenever the slot is free, and each run ends before the
    /// next start. Returns the repositories in start order.
    fn one_slot(stream: &[(&'static str, u8)]) -> Vec<&'static str> {
        let room = 3; // one slot: the running item and two waiting.
        let mut next = 0;
        let mut held: Vec<(usize, bool)> = Vec::new(); // (stream index, counted)
        let mut turns = Turns::default();
        let mut order = Vec::new();
        loop {
            // The reader: reads while there is room (counted entries below the room)
            // and the extras are below their bound.
            while next < stream.len() {
                let counted_total = held.iter().filter(|(_, c)| *c).count();
                let repo = stream[next].0;
                let counted_repo = held
                    .iter()
                    .filter(|(i, c)| *c && stream[*i].0 == repo)
                    .count();
                let extras = held.iter().filter(|(_, c)| !*c).count();
                if counted_total >= room {
                    break;
                }
                let counted = counts_against_room(counted_repo, room) || extras >= EXTRA_HELD;
                held.push((next, counted));
                next += 1;
            }
            let cands: Vec<Candidate<'_>> = held
                .iter()
                .map(|(i, _)| Candidate {
                    repo: stream[*i].0,
                    priority: stream[*i].1,
                    seq: *i as u64,
                    eligible: true,
                })
                .collect();
            let Some(k) = pick(&cands, &turns) else {
                return order;
            };
            let (i, _) = held.remove(k);
            turns.started(stream[i].0);
            order.push(stream[i].0);
        }
    }

    #[test]
    fn a_busy_repository_does_not_starve_a_quiet_one() {
        let mut stream: Vec<(&str, u8)> = vec![("acme/busy", 50); 20];
        stream.extend([("acme/quiet", 50); 2]);
        let order = one_slot(&stream);
        assert_eq!(order.len(), 22, "every item starts once");
        let quiet: Vec<usize> = order
            .iter()
            .enumerate()
            .filter(|(_, r)| **r == "acme/quiet")
            .map(|(i, _)| i)
            .collect();
        // Within its turns: second and fourth, not after the twenty.
        assert_eq!(quiet, vec![1, 3], "{order:?}");
    }

    #[test]
    fn within_a_repository_kind_priority_then_age_decides() {
        let turns = Turns::default();
        let c = |repo, priority, seq| Candidate {
            repo,
            priority,
            seq,
            eligible: true,
        };
        let waiting = [c("o/a", 10, 1), c("o/a", 50, 2), c("o/a", 50, 3)];
        assert_eq!(pick(&waiting, &turns), Some(1));
        let mut blocked = waiting.clone();
        blocked[1].eligible = false;
        assert_eq!(pick(&blocked, &turns), Some(2));
        assert_eq!(pick(&[], &turns), None);
    }

    #[test]
    fn volume_caps_hold_back_work_and_name_the_cap() {
        let policy = Policy {
            max_runs_per_hour: 3,
            max_open_agent_prs: 2,
            ..Policy::default()
        };
        let v = |runs, open| Volume {
            runs_last_hour: runs,
            open_agent_prs: open,
        };
        assert_eq!(held_back(&policy, WorkKind::CiFix, &v(2, Some(9))), None);
        let runs = held_back(&policy, WorkKind::CiFix, &v(3, None)).unwrap();
        assert!(runs.contains("max_runs_per_hour"), "{runs}");
        let prs = held_back(&policy, WorkKind::IssueImpl, &v(0, Some(2))).unwrap();
        assert!(prs.contains("max_open_agent_prs"), "{prs}");
        // Open PRs only hold back new implementations, and an unread count holds
        // nothing back.
        assert_eq!(held_back(&policy, WorkKind::IssueImpl, &v(0, None)), None);
        assert_eq!(
            held_back(&Policy::default(), WorkKind::IssueImpl, &v(99, Some(99))),
            None
        );
    }
}
