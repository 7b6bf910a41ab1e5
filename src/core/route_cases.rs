//! The routing table: one case per way an event reaches records, shared by the core's
//! test of [`super::route`] and by the tests of its three callers (the worker's plan,
//! `replay --dry-run`, `rebuild`), so all of them are held to the same table.

use std::collections::BTreeSet;

use super::{Recipient, RecordRef, route};
use crate::core::effect::{EffectKindName, Timer, TimerKind};
use crate::core::event::{
    CiContext, CiState, EffectOutcome, Event, IssueAction, IssueSnapshot, Permission, PrAction,
    PrSnapshot, PrState, ReviewHint, RunOutcome, WorkOutcome,
};
use crate::core::ids::{Login, RepoName, Scope, Sha, WorkId};
use crate::core::machine::step;
use crate::core::policy::Policy;
use crate::core::record::PrRecord;

/// The clock of the table (unix ms).
const T0: i64 = 1_800_000_000_000;
/// The PR most cases name.
pub(crate) const PR: u64 = 7;

/// One routing case.
pub(crate) struct Case {
    /// What it shows.
    pub name: &'static str,
    /// The event.
    pub event: Event,
    /// The PR records the store holds for the repository before the event (the named
    /// PR's among them when it has one).
    pub stored: Vec<PrRecord>,
    /// The records reached, in order, as `"<scope> <number> <reach>"` lines.
    pub want: Vec<&'static str>,
}

impl Case {
    /// The stored record of PR `n`, if the case has one.
    pub fn stored_pr(&self, n: u64) -> Option<&PrRecord> {
        self.stored.iter().find(|r| r.number == n)
    }

    /// The issues the named PR links before or after the event: the stored record (or a
    /// fresh one) stepped with the core, as every caller does before its fan-out.
    pub fn linked_issues(&self) -> BTreeSet<u64> {
        let Some(named) = route(&self.event).named.filter(|r| r.scope == Scope::Pr) else {
            return BTreeSet::new();
        };
        let before = self
            .stored_pr(named.number)
            .cloned()
            .unwrap_or_else(|| PrRecord::new(named.repo.clone(), named.number));
        let after = step(&before, &self.event, T0, &Policy::default()).record;
        super::linked_issues(&before, &after)
    }

    /// Recipients as the lines of [`Case::want`].
    pub fn summary(&self, recipients: &[Recipient]) -> Vec<String> {
        recipients.iter().map(line).collect()
    }
}

/// A recipient as a `"<scope> <number> <reach>"` line.
fn line(r: &Recipient) -> String {
    let scope = match r.record.scope {
        Scope::Pr => "pr",
        Scope::Issue => "issue",
    };
    let reach = match r.reach {
        super::Reach::Named => "named",
        super::Reach::LinkedIssue => "linked-issue",
        super::Reach::OpenPr => "open-pr",
    };
    format!("{scope} {} {reach}", r.record.number)
}

/// The record a case's recipient line names (for callers that check one record).
pub(crate) fn record_of(repo: &RepoName, line: &str) -> RecordRef {
    let mut parts = line.split(' ');
    let scope = parts.next().unwrap_or_default();
    let n = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    match scope {
        "issue" => RecordRef::issue(repo, n),
        _ => RecordRef::pr(repo, n),
    }
}

/// The repository of the table.
pub(crate) fn repo() -> RepoName {
    "acme/widgets".parse().unwrap()
}

fn login(s: &str) -> Login {
    s.parse().unwrap()
}

fn sha(c: char) -> Sha {
    std::iter::repeat_n(c, 40)
        .collect::<String>()
        .parse()
        .unwrap()
}

/// PR `n` as Forgejo shows it.
fn snapshot(n: u64, state: PrState, body: &str, updated_ms: i64) -> PrSnapshot {
    PrSnapshot {
        repo: repo(),
        number: n,
        state,
        draft: false,
        title: format!("PR {n}"),
        body: body.into(),
        author: Some(login("alice")),
        head_sha: Some(sha('a')),
        head_ref: format!("topic-{n}"),
        base_ref: "main".into(),
        labels: BTreeSet::new(),
        mergeable: Some(true),
        updated_ms,
        comments: None,
    }
}

/// A stored record of PR `n` that has seen `snapshot`.
fn stored(n: u64, state: PrState, body: &str, updated_ms: i64) -> PrRecord {
    let mut r = PrRecord::new(repo(), n);
    r.pr = Some(snapshot(n, state, body, updated_ms));
    r.version = 3;
    r
}

/// A record the store holds without a PR snapshot (only internal events reached it).
fn bare(n: u64) -> PrRecord {
    let mut r = PrRecord::new(repo(), n);
    r.version = 1;
    r
}

/// The records of a repository with open, closed, merged and snapshot-less PRs.
fn mixed_repo() -> Vec<PrRecord> {
    vec![
        stored(12, PrState::Open, "", T0),
        stored(8, PrState::Closed, "", T0),
        stored(9, PrState::Merged, "Closes #3", T0),
        bare(11),
        stored(3, PrState::Open, "Closes #4", T0),
    ]
}

/// A `pull_request` webhook for PR 7.
fn pull_request(action: PrAction, state: PrState, body: &str, updated_ms: i64) -> Event {
    Event::PullRequest {
        action,
        pr: snapshot(PR, state, body, updated_ms),
        base_changed_from: None,
        sender: Some(login("alice")),
    }
}

/// A push to `main` of `repo`.
pub(crate) fn push(repo: &RepoName) -> Event {
    Event::Push {
        repo: repo.clone(),
        branch: "main".into(),
        after: Some(sha('b')),
        sender: Some(login("alice")),
    }
}

/// A work result whose id names no record.
pub(crate) fn orphan_result() -> Event {
    Event::WorkResult {
        work_id: "nonsense".parse().unwrap(),
        outcome: WorkOutcome::Failed,
        signature: None,
        summary: None,
        usage: None,
        stopped: None,
    }
}

/// The records of PR 7 before and after an edit from `before` to `after` body.
pub(crate) fn linking_pair(before: &str, after: &str) -> (PrRecord, PrRecord) {
    let old = stored(PR, PrState::Open, before, T0 - 1_000);
    let edit = pull_request(PrAction::Edited, PrState::Open, after, T0);
    let new = step(&old, &edit, T0, &Policy::default()).record;
    (old, new)
}

fn timer(scope: Scope, number: u64) -> Event {
    Event::TimerFired {
        repo: repo(),
        scope,
        number,
        timer: Timer {
            due_ms: T0,
            kind: TimerKind::StaleCheck,
            id: "stale-check".into(),
        },
    }
}

fn context() -> CiContext {
    CiContext {
        context: "ci/test".into(),
        state: CiState::Success,
        description: String::new(),
        target_url: String::new(),
        updated_ms: T0,
    }
}

/// Every routing case.
pub(crate) fn all() -> Vec<Case> {
    let mut cases = pull_request_cases();
    cases.extend(named_cases());
    cases.extend(repo_wide_cases());
    cases
}

/// `pull_request` webhooks: the PR, then the issues it links before or after.
fn pull_request_cases() -> Vec<Case> {
    vec![
        Case {
            name: "a new PR's webhook reaches the PR, then every issue it links",
            event: pull_request(PrAction::Opened, PrState::Open, "Closes #5, fixes #3", T0),
            stored: Vec::new(),
            want: vec!["pr 7 named", "issue 3 linked-issue", "issue 5 linked-issue"],
        },
        Case {
            name: "an edit reaches the issue it unlinks and the one it links",
            event: pull_request(PrAction::Edited, PrState::Open, "Closes #4", T0),
            stored: vec![stored(PR, PrState::Open, "Closes #3", T0 - 1_000)],
            want: vec!["pr 7 named", "issue 3 linked-issue", "issue 4 linked-issue"],
        },
        Case {
            name: "an older snapshot changes no link: only the record's links are reached",
            event: pull_request(PrAction::Edited, PrState::Open, "Closes #9", T0 - 5_000),
            stored: vec![stored(PR, PrState::Open, "Closes #3", T0 - 1_000)],
            want: vec!["pr 7 named", "issue 3 linked-issue"],
        },
        Case {
            name: "a merge reaches the issues the PR closes",
            event: pull_request(PrAction::Closed, PrState::Merged, "Resolves #3", T0),
            stored: vec![stored(PR, PrState::Open, "Resolves #3", T0 - 1_000)],
            want: vec!["pr 7 named", "issue 3 linked-issue"],
        },
        Case {
            name: "a push to a PR that links nothing reaches the PR alone",
            event: pull_request(PrAction::Synchronized, PrState::Open, "", T0),
            stored: vec![stored(PR, PrState::Open, "", T0 - 1_000)],
            want: vec!["pr 7 named"],
        },
        Case {
            name: "a PR event never reaches the repository's other PRs",
            event: pull_request(PrAction::Labeled, PrState::Open, "", T0),
            stored: mixed_repo(),
            want: vec!["pr 7 named"],
        },
    ]
}

/// Events that name one record and reach nothing else.
fn named_cases() -> Vec<Case> {
    let linking = || vec![stored(PR, PrState::Open, "Closes #3", T0 - 1_000)];
    vec![
        Case {
            name: "a review webhook reaches the PR only, even one that links issues",
            event: Event::Review {
                hint: ReviewHint::Approved,
                pr: snapshot(PR, PrState::Open, "Closes #3", T0),
                sender: Some(login("bob")),
            },
            stored: linking(),
            want: vec!["pr 7 named"],
        },
        Case {
            name: "a PR conversation comment reaches the PR",
            event: comment(true),
            stored: linking(),
            want: vec!["pr 7 named"],
        },
        Case {
            name: "an issue comment reaches the issue",
            event: comment(false),
            stored: linking(),
            want: vec!["issue 7 named"],
        },
        Case {
            name: "an issues webhook reaches the issue",
            event: Event::Issue {
                action: IssueAction::Opened,
                issue: IssueSnapshot {
                    repo: repo(),
                    number: 3,
                    open: true,
                    title: "Widgets need x".into(),
                    body: "Closes #4".into(),
                    author: Some(login("alice")),
                    labels: BTreeSet::new(),
                    updated_ms: T0,
                },
                sender: Some(login("alice")),
            },
            stored: mixed_repo(),
            want: vec!["issue 3 named"],
        },
        Case {
            name: "an Actions run naming its PR reaches that PR",
            event: action_run(Some(PR)),
            stored: mixed_repo(),
            want: vec!["pr 7 named"],
        },
        Case {
            name: "a PR's timer reaches the PR",
            event: timer(Scope::Pr, PR),
            stored: linking(),
            want: vec!["pr 7 named"],
        },
        Case {
            name: "an issue's timer reaches the issue",
            event: timer(Scope::Issue, 3),
            stored: Vec::new(),
            want: vec!["issue 3 named"],
        },
        Case {
            name: "a PR read reaches the PR only, even one that links issues",
            event: Event::ObservedPr {
                pr: snapshot(PR, PrState::Open, "Closes #4", T0),
            },
            stored: linking(),
            want: vec!["pr 7 named"],
        },
        Case {
            name: "a reviews read reaches the PR",
            event: Event::ObservedReviews {
                repo: repo(),
                number: PR,
                reviews: Vec::new(),
                at_ms: T0,
            },
            stored: linking(),
            want: vec!["pr 7 named"],
        },
        Case {
            name: "a status read reaches the PR",
            event: Event::ObservedStatus {
                repo: repo(),
                number: PR,
                sha: sha('a'),
                contexts: vec![context()],
                at_ms: T0,
            },
            stored: mixed_repo(),
            want: vec!["pr 7 named"],
        },
        Case {
            name: "a permission read reaches the record where the command waits",
            event: Event::ObservedPermission {
                repo: repo(),
                scope: Scope::Issue,
                number: 3,
                login: login("carol"),
                permission: Permission::Write,
                at_ms: T0,
            },
            stored: Vec::new(),
            want: vec!["issue 3 named"],
        },
        Case {
            name: "a dependency read reaches the issue it was read for",
            event: Event::ObservedDependencies {
                repo: repo(),
                number: 3,
                dependencies: Vec::new(),
                at_ms: T0,
            },
            stored: mixed_repo(),
            want: vec!["issue 3 named"],
        },
        Case {
            name: "a work result reaches the record its work id names",
            event: Event::WorkResult {
                work_id: WorkId::new(&repo(), Scope::Issue, 3, 1),
                outcome: WorkOutcome::Succeeded,
                signature: None,
                summary: None,
                usage: None,
                stopped: None,
            },
            stored: Vec::new(),
            want: vec!["issue 3 named"],
        },
        Case {
            name: "a work result with a foreign id reaches nothing",
            event: orphan_result(),
            stored: mixed_repo(),
            want: Vec::new(),
        },
        Case {
            name: "an effect outcome reaches the record of the effect",
            event: Event::EffectOutcome {
                repo: repo(),
                scope: Scope::Pr,
                number: PR,
                effect_id: "acme/widgets/pr/7@3.0".parse().unwrap(),
                outcome: EffectOutcome::Failed {
                    kind: EffectKindName::AddLabels,
                    work_id: None,
                    message: "gone".into(),
                },
            },
            stored: linking(),
            want: vec!["pr 7 named"],
        },
        Case {
            name: "a resync observation reaches the PR only, even one that links issues",
            event: Event::ResyncObserved {
                pr: snapshot(PR, PrState::Open, "Closes #3", T0),
                contexts: vec![context()],
                reviews: Vec::new(),
                at_ms: T0,
            },
            stored: linking(),
            want: vec!["pr 7 named"],
        },
    ]
}

/// Repository-wide events: every open PR record, none named.
fn repo_wide_cases() -> Vec<Case> {
    let open = vec!["pr 3 open-pr", "pr 12 open-pr"];
    vec![
        Case {
            name: "a push reaches every open PR record in number order, not closed, \
                   merged or snapshot-less ones",
            event: push(&repo()),
            stored: mixed_repo(),
            want: open.clone(),
        },
        Case {
            name: "a commit status reaches every open PR record",
            event: Event::Status {
                repo: repo(),
                sha: sha('a'),
                context: context(),
                sender: None,
            },
            stored: mixed_repo(),
            want: open.clone(),
        },
        Case {
            name: "an Actions run naming no PR reaches every open PR record",
            event: action_run(None),
            stored: mixed_repo(),
            want: open,
        },
        Case {
            name: "a push to a repository with no PR records reaches nothing",
            event: push(&repo()),
            stored: Vec::new(),
            want: Vec::new(),
        },
    ]
}

fn comment(is_pull: bool) -> Event {
    Event::Comment {
        repo: repo(),
        number: PR,
        is_pull,
        comment_id: 41,
        commands: Vec::new(),
        at_ms: T0,
        sender: Some(login("carol")),
    }
}

fn action_run(pr_number: Option<u64>) -> Event {
    Event::ActionRun {
        repo: repo(),
        sha: sha('a'),
        pr_number,
        outcome: RunOutcome::Failure,
        sender: None,
    }
}
