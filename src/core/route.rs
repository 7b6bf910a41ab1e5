//! Routing: which records an event is applied to. Decided here, once, for the three
//! places that apply events — the worker (`worker::plan`), `replay --dry-run`
//! (`ops::replay`) and `rebuild` (`ops::rebuild`) — so they cannot drift apart.
//!
//! An event reaches, in this order:
//! 1. the record it names ([`Event::target`]): one PR or one issue, a fresh record when
//!    the store has none;
//! 2. for a `pull_request` webhook only, every issue the PR's body links (`Closes #N`)
//!    in the PR's record before the event or after it — an edit that removes a link
//!    still reaches the issue it unlinks;
//! 3. for a repository-wide event (`push`, `status`, an Actions run naming no PR),
//!    every PR record of the repository the store holds that is open, in number order.
//!
//! The router does no IO. [`route`] looks at the event alone and says what it names
//! and what the caller must load for the rest ([`FanOut`]); the caller loads that into
//! [`Facts`], and [`Route::fan_out`] lists the remaining records. The named record is
//! written with a history entry even when the event changes nothing in it; the records
//! of a fan-out only when it does ([`Reach`]).

use std::collections::{BTreeMap, BTreeSet};

use super::event::{Event, Target};
use super::ids::{RepoName, Scope};
use super::record::PrRecord;

/// One record: a PR's or an issue's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordRef {
    /// PR or issue record.
    pub scope: Scope,
    /// Repository.
    pub repo: RepoName,
    /// PR or issue index.
    pub number: u64,
}

impl RecordRef {
    /// The record of PR `repo#number`.
    pub fn pr(repo: &RepoName, number: u64) -> Self {
        Self {
            scope: Scope::Pr,
            repo: repo.clone(),
            number,
        }
    }

    /// The record of issue `repo#number`.
    pub fn issue(repo: &RepoName, number: u64) -> Self {
        Self {
            scope: Scope::Issue,
            repo: repo.clone(),
            number,
        }
    }
}

/// How an event reaches a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The record the event names: it gets a history entry even when nothing changes.
    Named,
    /// An issue the named PR links: written only when the event changes it.
    LinkedIssue,
    /// An open PR reached by a repository-wide event: written only when changed.
    OpenPr,
}

impl Reach {
    /// Whether the record is written (and reported) even when the event changes nothing.
    pub fn always_recorded(self) -> bool {
        match self {
            Reach::Named => true,
            Reach::LinkedIssue | Reach::OpenPr => false,
        }
    }
}

/// One record an event is applied to, and how it got there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    /// The record.
    pub record: RecordRef,
    /// How the event reaches it.
    pub reach: Reach,
}

/// What an event reaches beyond the record it names — and so what the caller must load
/// before [`Route::fan_out`] can list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FanOut {
    /// Nothing more.
    None,
    /// The issues the named PR links: step the named PR first, then pass
    /// [`linked_issues`] of its record before and after the step in
    /// [`Facts::linked_issues`].
    LinkedIssues,
    /// Every open PR record of this repository: pass the PR records the store holds
    /// for it in [`Facts::prs`] (see [`Facts::add_pr`]).
    OpenPrs(RepoName),
}

/// How an event is routed, decided from the event alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The record the event names, applied first (`None`: repository-wide, or nothing).
    pub named: Option<RecordRef>,
    /// What it reaches beyond that.
    pub fan_out: FanOut,
}

/// What the caller loaded for a [`FanOut`]: the part of the store the route depends on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// [`FanOut::LinkedIssues`]: the issues the named PR links before or after the
    /// event ([`linked_issues`]).
    pub linked_issues: BTreeSet<u64>,
    /// [`FanOut::OpenPrs`]: every PR record the store holds for the repository, by
    /// number: whether it is open ([`PrRecord::is_open`]; a record without a snapshot
    /// is not).
    pub prs: BTreeMap<u64, bool>,
}

impl Facts {
    /// Adds a stored PR record to [`Facts::prs`].
    pub fn add_pr(&mut self, record: &PrRecord) {
        self.prs.insert(record.number, record.is_open());
    }
}

/// The issues a PR links in its record before an event or after it
/// ([`PrRecord::linked_issues`]): those a `pull_request` event reaches.
pub fn linked_issues(before: &PrRecord, after: &PrRecord) -> BTreeSet<u64> {
    let mut links = before.linked_issues();
    links.extend(after.linked_issues());
    links
}

/// Routes an event: the record it names and what it fans out to.
pub fn route(event: &Event) -> Route {
    let (named, repo_wide) = match event.target() {
        Target::Pr(repo, n) => (Some(RecordRef::pr(&repo, n)), None),
        Target::Issue(repo, n) => (Some(RecordRef::issue(&repo, n)), None),
        Target::Repo(repo) => (None, Some(repo)),
        Target::None => (None, None),
    };
    let fan_out = match (event, repo_wide) {
        (_, Some(repo)) => FanOut::OpenPrs(repo),
        // Only a `pull_request` webhook tells the linked issues: it is the event that
        // reports what happened to the PR (opened, edited, merged, closed). An edit that
        // only a read or a resync saw reaches them with the PR's next webhook.
        (Event::PullRequest { .. }, None) => FanOut::LinkedIssues,
        (
            Event::Review { .. }
            | Event::Comment { .. }
            | Event::Issue { .. }
            | Event::ActionRun { .. }
            | Event::Status { .. }
            | Event::Push { .. }
            | Event::TimerFired { .. }
            | Event::ObservedPr { .. }
            | Event::ObservedReviews { .. }
            | Event::ObservedStatus { .. }
            | Event::ObservedPermission { .. }
            | Event::ObservedLegacy { .. }
            | Event::ObservedDependencies { .. }
            | Event::WorkResult { .. }
            | Event::EffectOutcome { .. }
            | Event::ResyncObserved { .. },
            None,
        ) => FanOut::None,
    };
    Route { named, fan_out }
}

impl Route {
    /// The repository of the records the event reaches (`None`: it reaches none).
    pub fn repo(&self) -> Option<&RepoName> {
        match (&self.named, &self.fan_out) {
            (Some(r), _) => Some(&r.repo),
            (None, FanOut::OpenPrs(repo)) => Some(repo),
            (None, FanOut::None | FanOut::LinkedIssues) => None,
        }
    }

    /// Whether the event reaches no record at all.
    pub fn is_empty(&self) -> bool {
        self.repo().is_none()
    }

    /// The records of the fan-out, given what the caller loaded, in the order to apply
    /// them (after the named record).
    pub fn fan_out(&self, facts: &Facts) -> Vec<Recipient> {
        match (&self.fan_out, &self.named) {
            (FanOut::None, _) => Vec::new(),
            (FanOut::LinkedIssues, Some(named)) => facts
                .linked_issues
                .iter()
                .map(|&n| Recipient {
                    record: RecordRef::issue(&named.repo, n),
                    reach: Reach::LinkedIssue,
                })
                .collect(),
            // Links are a PR's; `route` never fans out from nothing.
            (FanOut::LinkedIssues, None) => Vec::new(),
            (FanOut::OpenPrs(repo), _) => facts
                .prs
                .iter()
                .filter(|&(_, &open)| open)
                .map(|(&n, _)| Recipient {
                    record: RecordRef::pr(repo, n),
                    reach: Reach::OpenPr,
                })
                .collect(),
        }
    }

    /// Every record the event reaches, in the order to apply them: the named one, then
    /// the fan-out.
    pub fn recipients(&self, facts: &Facts) -> Vec<Recipient> {
        let named = self.named.iter().map(|r| Recipient {
            record: r.clone(),
            reach: Reach::Named,
        });
        named.chain(self.fan_out(facts)).collect()
    }
}

#[cfg(test)]
#[path = "route_cases.rs"]
pub(crate) mod cases;

#[cfg(test)]
mod tests {
    use super::cases::{self, Case};
    use super::*;

    /// The route of every case, with the facts taken straight from its stored records.
    #[test]
    fn every_case_reaches_exactly_the_records_it_should() {
        let all = cases::all();
        assert!(all.len() >= 20, "the table covers every event kind");
        for case in &all {
            let route = route(&case.event);
            let mut facts = Facts {
                linked_issues: case.linked_issues(),
                ..Facts::default()
            };
            for r in &case.stored {
                facts.add_pr(r);
            }
            assert_eq!(
                case.summary(&route.recipients(&facts)),
                case.want,
                "{}",
                case.name
            );
        }
    }

    /// Every event variant appears in the table (a new variant must be routed there).
    #[test]
    fn the_table_covers_every_event_kind() {
        let names: BTreeSet<String> = cases::all()
            .iter()
            .map(|c: &Case| c.event.name().split('/').next().unwrap_or("").to_owned())
            .collect();
        for kind in [
            "pull_request",
            "review",
            "comment",
            "issue",
            "action_run",
            "status",
            "push",
            "timer",
            "observed",
            "work-result",
            "effect-outcome",
            "resync",
        ] {
            assert!(names.contains(kind), "no case for {kind}: {names:?}");
        }
    }

    #[test]
    fn linked_issues_of_a_pr_are_its_links_before_and_after() {
        let (before, after) = cases::linking_pair("Closes #3 and fixes #5", "Closes #4");
        assert_eq!(
            linked_issues(&before, &after),
            BTreeSet::from([3, 4, 5]),
            "the unlinked issues hear of the edit"
        );
        assert_eq!(linked_issues(&before, &before), BTreeSet::from([3, 5]));
    }

    #[test]
    fn a_route_names_its_repository() {
        let repo: RepoName = "acme/widgets".parse().unwrap();
        let push = cases::push(&repo);
        assert_eq!(route(&push).repo(), Some(&repo));
        assert!(!route(&push).is_empty());
        let orphan = cases::orphan_result();
        assert!(route(&orphan).is_empty());
        assert_eq!(route(&orphan).recipients(&Facts::default()), Vec::new());
    }
}
