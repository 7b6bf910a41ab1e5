//! Blocked issues and where issue work starts (`machine::issue_deps`): a blocking
//! label, an open dependency (read from Forgejo before every dispatch, re-read by the
//! recheck timer), and the base branch from a dependency's open PR by the agents.

use super::*;
use crate::core::effect::IssueWork;
use crate::core::event::{DependencyFact, IssueAction, IssueSnapshot, LinkingPrFact};
use crate::core::machine::{IssuePhase, decide_issue, step_issue};
use crate::core::record::IssueRecord;

/// The issue of these tests.
const ISSUE: u64 = 9;

/// The issue, open with the trigger label and `extra` labels.
fn issue(extra: &[&str], body: &str, updated: i64) -> IssueSnapshot {
    let mut labels = BTreeSet::from(["auto/implement".to_owned()]);
    labels.extend(extra.iter().map(|l| (*l).to_owned()));
    IssueSnapshot {
        repo: repo(),
        number: ISSUE,
        open: true,
        title: "Widget overflows".into(),
        body: body.into(),
        author: Some(login("alice")),
        labels,
        updated_ms: updated,
    }
}

fn labelled(snap: IssueSnapshot) -> Event {
    Event::Issue {
        action: IssueAction::Labeled,
        issue: snap,
        sender: Some(login("alice")),
    }
}

/// Dependency `n` of this repository, open or closed, with the PRs linking it.
fn dep(n: u64, open: bool, prs: Vec<LinkingPrFact>) -> DependencyFact {
    DependencyFact {
        repo: repo(),
        number: n,
        open,
        is_pull: false,
        linking_prs: prs,
    }
}

/// An open PR linking a dependency.
fn linking(number: u64, author: &str, head: &str, same_repo: bool) -> LinkingPrFact {
    LinkingPrFact {
        number,
        author: Some(login(author)),
        head_ref: head.into(),
        same_repo,
    }
}

fn read(deps: Vec<DependencyFact>, at: i64) -> Event {
    Event::ObservedDependencies {
        repo: repo(),
        number: ISSUE,
        dependencies: deps,
        at_ms: at,
    }
}

fn recheck() -> Event {
    Event::TimerFired {
        repo: repo(),
        scope: Scope::Issue,
        number: ISSUE,
        timer: Timer {
            due_ms: T0,
            kind: TimerKind::DependencyRecheck,
            id: "dependency-recheck".into(),
        },
    }
}

/// Steps `r` and returns the effects as lines.
fn go(r: &mut IssueRecord, e: Event, now: i64, p: &Policy) -> Vec<String> {
    let t = step_issue(r, &e, now, p);
    *r = t.record.clone();
    t.effects.iter().map(|x| show(x, now)).collect()
}

/// The `context.issue` of the active work item.
fn work_of(r: &IssueRecord) -> IssueWork {
    let a = r.work.active.as_ref().expect("dispatched");
    *a.item.context.issue.clone().expect("context.issue")
}

const READ: &str = "observe dependencies";
const RECHECK: &str = "timer dependency-recheck +300s";

#[test]
fn every_dispatch_is_preceded_by_a_read_and_uses_the_issue_branch() {
    let p = Policy {
        issue_branch: "agents/{number}-impl".into(),
        ..policy()
    };
    let mut r = IssueRecord::new(repo(), ISSUE);
    let fx = go(&mut r, labelled(issue(&[], "", T0)), T0, &p);
    assert_eq!(fx, lines(&[READ, RECHECK]));
    assert!(r.work.active.is_none(), "no dispatch before the read");
    let d = decide_issue(&r, &p);
    assert_eq!(d.phase, IssuePhase::Implementing);
    assert!(d.reason.contains("dependencies"), "{}", d.reason);
    // The same delivery again: the read is in flight, nothing new.
    assert!(step_issue(&r, &labelled(issue(&[], "", T0)), T0, &p).is_noop());
    let fx = go(
        &mut r,
        read(vec![dep(3, false, Vec::new())], T0 + 1),
        T0 + 1,
        &p,
    );
    assert_eq!(fx[0], "dispatch issue-impl tier=0 attempt=1 head=-");
    let work = work_of(&r);
    assert_eq!(work.branch, "agents/9-impl");
    assert_eq!(work.base, None, "the default branch");
    assert!(!r.deps.fresh, "the dispatch used the read up");
    let json = serde_json::to_value(&r.work.active.as_ref().unwrap().item).unwrap();
    assert_eq!(json["context"]["issue"]["branch"], "agents/9-impl");
}

#[test]
fn a_blocked_label_holds_the_issue_until_it_is_removed() {
    let p = policy();
    let mut r = IssueRecord::new(repo(), ISSUE);
    let fx = go(&mut r, labelled(issue(&["Blocked"], "", T0)), T0, &p);
    assert_eq!(fx, Vec::<String>::new(), "no read, no dispatch");
    let d = decide_issue(&r, &p);
    assert_eq!(d.phase, IssuePhase::Blocked);
    assert!(d.reason.contains("`Blocked`"), "{}", d.reason);
    // `State/Paused` (any case) holds it as well.
    let mut paused = IssueRecord::new(repo(), ISSUE);
    go(
        &mut paused,
        labelled(issue(&["state/paused"], "", T0)),
        T0,
        &p,
    );
    assert_eq!(decide_issue(&paused, &p).phase, IssuePhase::Blocked);
    assert!(paused.work.active.is_none());
    // The label goes: a read, then the dispatch.
    let fx = go(&mut r, labelled(issue(&[], "", T0 + 5)), T0 + 5, &p);
    assert_eq!(fx, lines(&[READ, RECHECK]));
    let fx = go(&mut r, read(Vec::new(), T0 + 6), T0 + 6, &p);
    assert_eq!(fx[0], "dispatch issue-impl tier=0 attempt=1 head=-");
    // A policy without blocked labels dispatches despite the label.
    let open = Policy {
        blocked_labels: Vec::new(),
        ..policy()
    };
    let mut r = IssueRecord::new(repo(), ISSUE);
    assert_eq!(
        go(&mut r, labelled(issue(&["Blocked"], "", T0)), T0, &open),
        lines(&[READ, RECHECK])
    );
}

#[test]
fn an_open_dependency_holds_the_issue_until_the_recheck_finds_it_closed() {
    let p = policy();
    let mut r = IssueRecord::new(repo(), ISSUE);
    go(&mut r, labelled(issue(&[], "", T0)), T0, &p);
    let fx = go(
        &mut r,
        read(vec![dep(3, true, Vec::new())], T0 + 1),
        T0 + 1,
        &p,
    );
    assert_eq!(fx, lines(&[RECHECK]), "blocked: only the next recheck");
    let d = decide_issue(&r, &p);
    assert_eq!(d.phase, IssuePhase::Blocked);
    assert!(d.reason.contains("open dependencies: #3"), "{}", d.reason);
    // Other events on the blocked issue change nothing (the read is fresh).
    assert!(
        step_issue(&r, &labelled(issue(&[], "", T0 + 2)), T0 + 2, &p)
            .record
            .work
            .active
            .is_none()
    );
    // The timer: a new read; #3 closed meanwhile: dispatched.
    let fx = go(&mut r, recheck(), T0 + 301_000, &p);
    assert_eq!(fx, lines(&[READ, RECHECK]));
    assert_eq!(
        decide_issue(&r, &p).phase,
        IssuePhase::Blocked,
        "still shown"
    );
    let fx = go(
        &mut r,
        read(vec![dep(3, false, Vec::new())], T0 + 301_001),
        T0 + 301_001,
        &p,
    );
    assert_eq!(fx[0], "dispatch issue-impl tier=0 attempt=1 head=-");
    assert_eq!(work_of(&r).base, None);
}

#[test]
fn a_read_that_never_comes_back_is_asked_for_again() {
    let p = policy();
    let mut r = IssueRecord::new(repo(), ISSUE);
    go(&mut r, labelled(issue(&[], "", T0)), T0, &p);
    assert!(r.deps.requested_ms.is_some());
    let fx = go(&mut r, recheck(), T0 + 300_000, &p);
    assert_eq!(fx, lines(&[READ, RECHECK]), "the lost read is asked again");
    // A late read older than the last one is ignored.
    go(
        &mut r,
        read(vec![dep(3, true, Vec::new())], T0 + 300_500),
        T0 + 300_500,
        &p,
    );
    assert_eq!(decide_issue(&r, &p).phase, IssuePhase::Blocked);
    assert!(step_issue(&r, &read(Vec::new(), T0 + 10), T0 + 300_600, &p).is_noop());
}

#[test]
fn the_base_is_the_head_branch_of_the_agents_open_pr_of_the_dependency() {
    let p = policy();
    let mut r = IssueRecord::new(repo(), ISSUE);
    go(&mut r, labelled(issue(&[], "", T0)), T0, &p);
    let prs = vec![
        linking(14, "bot", "shepherd/issue-3-again", true),
        linking(12, "bot", "shepherd/issue-3", true),
    ];
    let fx = go(
        &mut r,
        read(vec![dep(3, true, prs), dep(2, false, Vec::new())], T0 + 1),
        T0 + 1,
        &p,
    );
    assert_eq!(fx[0], "dispatch issue-impl tier=0 attempt=1 head=-");
    let work = work_of(&r);
    assert_eq!(
        work.base.as_deref(),
        Some("shepherd/issue-3"),
        "the lowest PR"
    );
    assert_eq!(work.base_of, Some((3, 12)));
    assert_eq!(work.branch, "shepherd/issue-9");
}

/// Anyone can open a PR that says `Closes #3`, and an issue's body is anyone's
/// text: neither an outsider's PR, a fork's branch, a branch name git refuses, nor
/// "depends on #N" in the body decides the base or the blocking.
#[test]
fn untrusted_prs_and_body_text_decide_nothing() {
    let p = policy();
    for bad in [
        linking(12, "mallory", "evil", true),
        linking(12, "bot", "shepherd/issue-3", false),
        linking(12, "bot", "a..b", true),
        linking(12, "bot", "x -c core.hooksPath=/tmp", true),
    ] {
        let mut r = IssueRecord::new(repo(), ISSUE);
        go(&mut r, labelled(issue(&[], "", T0)), T0, &p);
        go(
            &mut r,
            read(vec![dep(3, true, vec![bad.clone()])], T0 + 1),
            T0 + 1,
            &p,
        );
        assert!(r.work.active.is_none(), "{bad:?} must not unblock");
        assert_eq!(decide_issue(&r, &p).phase, IssuePhase::Blocked);
    }
    // "Depends on #3" in the body, no dependency in Forgejo: dispatched, default base.
    let mut r = IssueRecord::new(repo(), ISSUE);
    go(
        &mut r,
        labelled(issue(&[], "Depends on #3. Blocked by #4.", T0)),
        T0,
        &p,
    );
    go(&mut r, read(Vec::new(), T0 + 1), T0 + 1, &p);
    assert_eq!(work_of(&r).base, None);
}

#[test]
fn two_stacked_dependencies_or_another_repositorys_open_one_block() {
    let p = policy();
    let mut r = IssueRecord::new(repo(), ISSUE);
    go(&mut r, labelled(issue(&[], "", T0)), T0, &p);
    let two = vec![
        dep(3, true, vec![linking(12, "bot", "shepherd/issue-3", true)]),
        dep(4, true, vec![linking(13, "bot", "shepherd/issue-4", true)]),
    ];
    go(&mut r, read(two, T0 + 1), T0 + 1, &p);
    let d = decide_issue(&r, &p);
    assert_eq!(d.phase, IssuePhase::Blocked);
    assert!(d.reason.contains("#3 and #4"), "{}", d.reason);
    let mut r = IssueRecord::new(repo(), ISSUE);
    go(&mut r, labelled(issue(&[], "", T0)), T0, &p);
    let other = DependencyFact {
        repo: "acme/gears".parse().unwrap(),
        ..dep(3, true, vec![linking(12, "bot", "shepherd/issue-3", true)])
    };
    go(&mut r, read(vec![other], T0 + 1), T0 + 1, &p);
    let d = decide_issue(&r, &p);
    assert!(d.reason.contains("acme/gears#3"), "{}", d.reason);
    assert!(r.work.active.is_none());
}

#[test]
fn issue_branch_and_blocked_labels_are_validated() {
    let check = |branch: &str| {
        let toml = format!("[defaults]\nissue_branch = {branch:?}\n");
        crate::core::policy::PolicyFile::from_toml(&toml).map(|_| ())
    };
    assert!(check("shepherd/issue-{number}").is_ok());
    assert!(check("feature/{number}").is_ok());
    for bad in [
        "shepherd/issue",
        "issue {number}",
        "x..y/{number}",
        "{number}.lock",
        "-{number}",
        "a//{number}",
        "a/.hidden/{number}",
        "a~{number}",
        "a/{number}/",
    ] {
        let e = check(bad).expect_err(bad).to_string();
        assert!(e.contains("issue_branch"), "{bad}: {e}");
    }
    let e = crate::core::policy::PolicyFile::from_toml("[defaults]\nblocked_labels = [\" \"]\n")
        .expect_err("an empty label")
        .to_string();
    assert!(e.contains("blocked_labels"), "{e}");
}
