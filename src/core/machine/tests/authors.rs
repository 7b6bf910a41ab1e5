//! Who gets agents (issue 26): policy `agent_authors` (`bot`, `writers`, `anyone`)
//! against the PR author's kind (the bot, a writer, a read-only user, one whose
//! permission is not read yet), for every kind of agent work; `/shepherd agents on` by
//! a writer lifts the gate, by anyone else it is refused and recorded; merging is not
//! agent work; the work item carries the author's trust for the prompt.

use super::*;
use crate::core::effect::WorkKind;
use crate::core::event::Permission;
use crate::core::policy::{AgentAuthors, AgentScope};
use crate::core::record::PermissionFact;

/// `ci / test` failing.
const FAIL: (&str, CiState, &str) = ("ci / test", CiState::Failure, "Failing after 1m2s");
/// `ci / test` green.
const PASS: (&str, CiState, &str) = ("ci / test", CiState::Success, "ok");

/// Who opened the PR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Author {
    /// The bot user (a bot PR).
    Bot,
    /// A human whose permission read said `write`.
    Writer,
    /// A human whose permission read said `read`.
    ReadOnly,
    /// A human whose permission was never read.
    Unknown,
}

/// The test policy with `agent_authors = which` (the harness's default is `anyone`).
fn with(which: AgentAuthors) -> Policy {
    Policy {
        agent_authors: which,
        ..policy()
    }
}

/// A record under `p` whose PR by `author` was opened, the author's permission known
/// as the kind says.
fn opened(p: Policy, author: Author) -> H {
    let mut h = H::with(p);
    let known = match author {
        Author::Writer => Some(Permission::Write),
        Author::ReadOnly => Some(Permission::Read),
        Author::Bot | Author::Unknown => None,
    };
    if let Some(permission) = known {
        h.r.work.permissions.insert(
            login("alice"),
            PermissionFact {
                permission,
                at_ms: T0,
            },
        );
    }
    let fx = match author {
        Author::Bot => h.step(pr_event(PrAction::Opened, bot_snap('a', T0), "bot")),
        Author::Writer | Author::ReadOnly | Author::Unknown => {
            h.step(pr_event(PrAction::Opened, snap('a', T0), "alice"))
        }
    };
    assert!(
        !fx.iter().any(|l| l.starts_with("observe permission")),
        "opening a PR reads no permission: {fx:?}"
    );
    h
}

/// The kinds of work dispatched by the last step.
fn dispatched(h: &H) -> Vec<WorkKind> {
    h.effects()
        .iter()
        .filter_map(|e| match &e.kind {
            EffectKind::Dispatch(w) => Some(w.kind),
            _ => None,
        })
        .collect()
}

/// The work item dispatched by the last step.
fn item(h: &H) -> crate::core::effect::WorkItem {
    h.effects()
        .iter()
        .find_map(|e| match &e.kind {
            EffectKind::Dispatch(w) => Some(w.clone()),
            _ => None,
        })
        .expect("a dispatch")
}

/// What the gate does with a failing CI: dispatch, read the author's permission, or
/// stay off.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Dispatch,
    ReadPermission,
    Off,
}

#[test]
fn every_policy_value_against_every_author_kind() {
    use AgentAuthors::{Anyone, Bot, Writers};
    let table = [
        (Bot, Author::Bot, Outcome::Dispatch),
        (Bot, Author::Writer, Outcome::Off),
        (Bot, Author::ReadOnly, Outcome::Off),
        (Bot, Author::Unknown, Outcome::Off),
        (Writers, Author::Bot, Outcome::Dispatch),
        (Writers, Author::Writer, Outcome::Dispatch),
        (Writers, Author::ReadOnly, Outcome::Off),
        (Writers, Author::Unknown, Outcome::ReadPermission),
        (Anyone, Author::Bot, Outcome::Dispatch),
        (Anyone, Author::Writer, Outcome::Dispatch),
        (Anyone, Author::ReadOnly, Outcome::Dispatch),
        (Anyone, Author::Unknown, Outcome::Dispatch),
    ];
    for (which, author, want) in table {
        let mut h = opened(with(which), author);
        h.later(5);
        let fx = h.step(status('a', &[FAIL], h.now));
        let got = if fx.iter().any(|l| l.starts_with("dispatch ci-fix")) {
            Outcome::Dispatch
        } else if fx.iter().any(|l| l == "observe permission alice") {
            Outcome::ReadPermission
        } else {
            Outcome::Off
        };
        assert_eq!(got, want, "{which:?} × {author:?}: {fx:?}");
        assert_eq!(h.phase(), Phase::CiFix, "{which:?} × {author:?}");
        let reason = h.reason();
        match got {
            Outcome::Off => {
                let why = match which {
                    Bot => "it is not a bot PR (agent_authors = bot)",
                    Writers | Anyone => "its author has no write access (agent_authors = writers)",
                };
                assert!(
                    reason.contains(&format!("agents off for this PR: {why}"))
                        && reason.contains("can comment `/shepherd agents on`"),
                    "{which:?} × {author:?}: {reason}"
                );
                let body = status_body(&h).expect("a status comment");
                assert!(body.contains("Agents: agents off for this PR"), "{body}");
            }
            Outcome::ReadPermission => assert!(
                reason.contains("waits for the permission of the PR's author @alice"),
                "{reason}"
            ),
            Outcome::Dispatch => {
                let trusted = item(&h).context.author_trusted;
                let want = match author {
                    Author::Bot | Author::Writer => Some(true),
                    Author::ReadOnly => Some(false),
                    Author::Unknown => None,
                };
                assert_eq!(trusted, want, "{which:?} × {author:?}");
            }
        }
    }
}

/// The body of the last status comment of the last step.
fn status_body(h: &H) -> Option<String> {
    h.effects().iter().find_map(|e| match &e.kind {
        EffectKind::UpsertComment { body, .. } => Some(body.clone()),
        _ => None,
    })
}

#[test]
fn an_unknown_author_is_read_once_and_the_answer_decides() {
    for (answer, dispatches) in [(Permission::Write, true), (Permission::Read, false)] {
        let mut h = opened(with(AgentAuthors::Writers), Author::Unknown);
        h.later(5);
        let fx = h.step(status('a', &[FAIL], h.now));
        assert!(
            fx.contains(&"observe permission alice".to_owned()),
            "{fx:?}"
        );
        // Another event while the read is under way asks nothing more.
        h.later(1);
        let fx = h.step(status(
            'a',
            &[FAIL, ("lint", CiState::Success, "ok")],
            h.now,
        ));
        assert!(
            !fx.iter().any(|l| l.starts_with("observe permission")),
            "{fx:?}"
        );
        assert!(!fx.iter().any(|l| l.starts_with("dispatch")), "{fx:?}");
        h.later(1);
        let fx = h.step(permission("alice", answer, h.now));
        assert_eq!(
            fx.iter().any(|l| l.starts_with("dispatch ci-fix")),
            dispatches,
            "{answer:?}: {fx:?}"
        );
        if dispatches {
            assert_eq!(item(&h).context.author_trusted, Some(true));
        } else {
            assert!(
                h.reason().contains("agents off for this PR"),
                "{}",
                h.reason()
            );
        }
    }
}

#[test]
fn a_trusted_user_author_counts_as_a_writer_without_a_read() {
    let mut p = with(AgentAuthors::Writers);
    p.trusted_users = vec!["Alice".into()];
    let mut h = opened(p, Author::Unknown);
    h.later(5);
    let fx = h.step(status('a', &[FAIL], h.now));
    assert_eq!(fx[0], "dispatch ci-fix tier=0 attempt=1 head=aaa", "{fx:?}");
    assert_eq!(item(&h).context.author_trusted, Some(true));
}

#[test]
fn a_read_only_author_gets_no_agent_work_of_any_kind() {
    // merge-conflicts
    let mut h = opened(with(AgentAuthors::Writers), Author::ReadOnly);
    for (i, at) in [(1, 20), (2, 30)] {
        h.later(at);
        h.step(Event::ObservedPr {
            pr: PrSnapshot {
                mergeable: Some(false),
                ..snap('a', T0 + i)
            },
        });
    }
    assert!(dispatched(&h).is_empty(), "{:?}", h.effects());
    assert_eq!(h.phase(), Phase::MergeConflicts);
    assert!(
        h.reason()
            .starts_with("conflicts with the base branch; agents off")
    );
    // review-feedback
    let mut h = opened(with(AgentAuthors::Writers), Author::ReadOnly);
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.step(reviews(
        &[("carol", ReviewState::RequestChanges, 'a')],
        h.now,
    ));
    assert!(dispatched(&h).is_empty(), "{:?}", h.effects());
    assert_eq!(h.phase(), Phase::ReviewFeedback);
    assert!(
        h.reason().contains("agents off for this PR"),
        "{}",
        h.reason()
    );
    // stale-check
    let mut h = opened(with(AgentAuthors::Writers), Author::ReadOnly);
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    h.now = T0 + 86_400_000;
    // A day later the read-only fact is too old (an hour): read again, still read-only.
    h.r.work.permissions.insert(
        login("alice"),
        PermissionFact {
            permission: Permission::Read,
            at_ms: h.now,
        },
    );
    h.step(timer(TimerKind::StaleCheck, h.now));
    assert!(dispatched(&h).is_empty(), "{:?}", h.effects());
    assert!(
        h.reason().contains("agents off for this PR"),
        "{}",
        h.reason()
    );
    // review (reviewer agents on every PR)
    let p = Policy {
        agent_review: AgentScope::All,
        reviewer_logins: vec!["rev".into()],
        ..with(AgentAuthors::Writers)
    };
    let mut h = opened(p.clone(), Author::ReadOnly);
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    assert!(dispatched(&h).is_empty(), "{:?}", h.effects());
    assert!(
        h.reason().contains("agents off for this PR"),
        "{}",
        h.reason()
    );
    // … which a writer's PR under the same policy gets.
    let mut h = opened(p, Author::Writer);
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    assert_eq!(dispatched(&h), vec![WorkKind::Review]);
}

#[test]
fn merging_a_green_approved_pr_is_not_agent_work() {
    let mut h = opened(with(AgentAuthors::Bot), Author::ReadOnly);
    h.later(5);
    h.step(status('a', &[PASS], h.now));
    let fx = h.step(reviews(
        &[
            ("carol", ReviewState::Approved, 'a'),
            ("dave", ReviewState::Approved, 'a'),
        ],
        h.now,
    ));
    assert!(
        fx.contains(&"merge aaa Squash delete=true".to_owned()),
        "{fx:?}"
    );
}

#[test]
fn agents_on_by_a_writer_lifts_the_gate_and_is_recorded() {
    let mut h = opened(with(AgentAuthors::Writers), Author::ReadOnly);
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    assert!(dispatched(&h).is_empty());
    // dave's permission is not known: his command waits for the read.
    h.later(5);
    let fx = h.step(comment(11, "/shepherd agents on", "dave"));
    assert!(fx.contains(&"observe permission dave".to_owned()), "{fx:?}");
    assert!(!fx.iter().any(|l| l.starts_with("dispatch")), "{fx:?}");
    assert_eq!(h.r.agents_on, None);
    h.later(1);
    let fx = h.step(permission("dave", Permission::Write, h.now));
    assert_eq!(fx[0], "dispatch ci-fix tier=0 attempt=1 head=aaa", "{fx:?}");
    let on = h.r.agents_on.clone().expect("recorded");
    assert_eq!((on.by.as_str(), on.at_ms), ("dave", h.now));
    // The author's text stays untrusted in the prompt.
    assert_eq!(item(&h).context.author_trusted, Some(false));
    let body = status_body(&h).expect("a status comment");
    assert!(
        body.contains("Agents: on for this PR (`/shepherd agents on` by `dave`)"),
        "{body}"
    );
    // A trusted user's grant later changes nothing: the first one stands.
    h.p.trusted_users = vec!["erin".into()];
    h.step(comment(12, "/shepherd agents on", "erin"));
    assert_eq!(h.r.agents_on.as_ref().map(|a| a.by.as_str()), Some("dave"));
}

#[test]
fn agents_on_by_a_non_writer_is_refused_and_recorded() {
    let mut h = opened(with(AgentAuthors::Writers), Author::ReadOnly);
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    // The author themself.
    h.later(5);
    let fx = h.step(comment(11, "/shepherd agents on", "alice"));
    assert!(
        fx.contains(&"comment #7".to_owned()),
        "refused at once: {fx:?}"
    );
    assert!(
        !fx.iter()
            .any(|l| l.starts_with("dispatch") || l.starts_with("observe")),
        "{fx:?}"
    );
    assert_eq!(h.r.agents_on, None);
    let refused = h.r.agents_on_refused.clone().expect("recorded");
    assert_eq!((refused.by.as_str(), refused.at_ms), ("alice", h.now));
    // Someone whose read says read-only.
    h.later(5);
    h.step(comment(12, "/shepherd agents on", "mallory"));
    h.later(1);
    let fx = h.step(permission("mallory", Permission::Read, h.now));
    assert_eq!(fx, lines(&["comment #7"]), "{fx:?}");
    assert_eq!(h.r.agents_on, None);
    assert_eq!(
        h.r.agents_on_refused.as_ref().map(|a| a.by.as_str()),
        Some("mallory")
    );
    assert!(
        h.reason().contains("agents off for this PR"),
        "{}",
        h.reason()
    );
}

#[test]
fn a_stale_author_permission_is_read_again() {
    let mut h = opened(with(AgentAuthors::Writers), Author::Writer);
    // An hour later the writer's fact is too old: the next work waits for a new read.
    h.now = T0 + 3_600_000 + 1;
    let fx = h.step(status('a', &[FAIL], h.now));
    assert!(
        fx.contains(&"observe permission alice".to_owned()),
        "{fx:?}"
    );
    assert!(!fx.iter().any(|l| l.starts_with("dispatch")), "{fx:?}");
}

/// What can happen to a read-only author's PR in the property below.
#[derive(Debug, Clone)]
enum Op {
    /// CI reports on the head: failing or green.
    Ci(bool),
    /// A change request by carol on the head.
    ChangeRequest,
    /// Two unmergeable reads (a confirmed conflict).
    Conflict,
    /// The author pushes a new head.
    Push,
    /// Someone without write access (the author or mallory) asks for agents, and the
    /// permission read answers.
    AgentsOnByReader(bool),
    /// A day passes and the stale check fires.
    Stale,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        any::<bool>().prop_map(Op::Ci),
        Just(Op::ChangeRequest),
        Just(Op::Conflict),
        Just(Op::Push),
        any::<bool>().prop_map(Op::AgentsOnByReader),
        Just(Op::Stale),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Whatever happens, a PR by an author without write access gets no agent work
    /// under `writers` until a writer lets the agents in (and the author's permission
    /// is read again whenever the last read is too old).
    #[test]
    fn a_read_only_authors_pr_never_gets_agent_work(ops in proptest::collection::vec(op(), 1..25)) {
        let mut h = opened(with(AgentAuthors::Writers), Author::ReadOnly);
        let mut heads = ['a', 'b', 'c', 'd', 'e', 'f'].into_iter().cycle();
        let mut head = heads.next().unwrap_or('a');
        let mut id = 100;
        for op in ops {
            h.later(30);
            let now = h.now;
            let events: Vec<Event> = match op {
                Op::Ci(fail) => vec![status(head, &[if fail { FAIL } else { PASS }], now)],
                Op::ChangeRequest => {
                    vec![reviews(&[("carol", ReviewState::RequestChanges, head)], now)]
                }
                Op::Conflict => (1..=2)
                    .map(|i| Event::ObservedPr {
                        pr: PrSnapshot {
                            mergeable: Some(false),
                            ..snap(head, now + i)
                        },
                    })
                    .collect(),
                Op::Push => {
                    head = heads.next().unwrap_or('a');
                    vec![pr_event(PrAction::Synchronized, snap(head, now), "alice")]
                }
                Op::AgentsOnByReader(author) => {
                    id += 1;
                    let who = if author { "alice" } else { "mallory" };
                    vec![
                        comment(id, "/shepherd agents on", who),
                        permission(who, Permission::Read, now + 1),
                    ]
                }
                Op::Stale => {
                    h.now += 86_400_000;
                    vec![timer(TimerKind::StaleCheck, h.now)]
                }
            };
            for e in events {
                let fx = h.step(e);
                proptest::prop_assert!(
                    !fx.iter().any(|l| l.starts_with("dispatch")),
                    "agent work for a read-only author: {fx:?}"
                );
                // A permission read of the author answers read-only.
                if fx.iter().any(|l| l == "observe permission alice") {
                    let now = h.now;
                    h.step(permission("alice", Permission::Read, now));
                }
                proptest::prop_assert!(
                    dispatched(&h).is_empty(),
                    "agent work for a read-only author: {:?}",
                    h.effects()
                );
            }
        }
        proptest::prop_assert!(h.r.agents_on.is_none());
    }
}

#[test]
fn the_status_waits_for_the_authors_read_so_a_writers_pr_costs_no_extra_edit() {
    // With status_settle_secs at its default, the "waits for the permission" status is
    // not written: the read answers first, and the dispatch's status is the one edit.
    let p = Policy {
        agent_authors: AgentAuthors::Writers,
        ..settled_policy()
    };
    let mut h = opened(p, Author::Unknown);
    h.later(5);
    let fx = h.step(status('a', &[FAIL], h.now));
    assert!(
        fx.contains(&"observe permission alice".to_owned()),
        "{fx:?}"
    );
    assert!(!fx.iter().any(|l| l.starts_with("status ")), "{fx:?}");
    h.later(1);
    let fx = h.step(permission("alice", Permission::Write, h.now));
    assert_eq!(fx[0], "dispatch ci-fix tier=0 attempt=1 head=aaa", "{fx:?}");
    assert_eq!(
        fx.iter().filter(|l| l.starts_with("status ")).count(),
        1,
        "{fx:?}"
    );
}
