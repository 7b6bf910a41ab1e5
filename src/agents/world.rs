//! Outcomes read from the world (issue 27): when an agent exits without a valid
//! result file, what it did is read from Forgejo instead of guessed from its exit
//! status (an agent that stops early at startup exits 0, one that pushed and then
//! crashed exits non-zero).
//!
//! | work | what Forgejo shows | result |
//! |---|---|---|
//! | PR work (`ci-fix`, `review-feedback`, `merge-conflicts`, `stale-check`) | the PR's head is no longer the one the item was dispatched on | `succeeded` ("pushed"), whatever the exit status |
//! | PR work | the head is unchanged | exit 0: `no-changes`; else the exit status's `failed` |
//! | `issue-impl` | an open PR by the bot, a bot user or an agent user links the issue | `succeeded` ("opened-pr"), whatever the exit status |
//! | `issue-impl` | no such PR | exit 0: `no-changes`; else the exit status's `failed` |
//! | any | Forgejo cannot be read | the exit status's result, and the summary says so |
//!
//! `review` (its verdict file decides) and `ready-to-merge` (a merge, not a push) keep
//! the exit status's result. A valid result file, a deadline and a runner's stop are
//! never second-guessed. Both reads are v15 routes (`GET /repos/{o}/{r}/pulls/{n}`
//! and `GET /repos/{o}/{r}/pulls?state=open`).

use crate::core::effect::{WorkItem, WorkKind};
use crate::core::event::WorkOutcome;
use crate::core::ids::Login;
use crate::core::policy::Policy;
use crate::core::record::linked_issues;
use crate::forgejo::ForgejoClient;

use super::outcome::{AgentResult, Finish};

/// What Forgejo shows of an agent's work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum World {
    /// The PR's head moved from the dispatched head.
    HeadMoved {
        /// The head the item was dispatched on.
        from: String,
        /// The head now.
        to: String,
    },
    /// The PR's head is the one the item was dispatched on.
    HeadUnchanged,
    /// An open agent PR links the issue.
    PrOpened {
        /// Its number.
        number: u64,
    },
    /// No open agent PR links the issue.
    NoPr,
    /// Forgejo could not be read (why).
    Unknown(String),
}

/// Whether the world decides `kind`'s outcome when there is no valid result file.
fn judged(kind: WorkKind) -> bool {
    match kind {
        WorkKind::CiFix
        | WorkKind::ReviewFeedback
        | WorkKind::MergeConflicts
        | WorkKind::StaleCheck
        | WorkKind::IssueImpl => true,
        WorkKind::Review | WorkKind::ReadyToMerge => false,
    }
}

/// Reads what `item`'s agent left in Forgejo.
pub async fn read(forgejo: &ForgejoClient, item: &WorkItem, policy: &Policy) -> World {
    let repo = item.repo.as_str();
    if item.kind == WorkKind::IssueImpl {
        return match forgejo.list_open_pulls(repo).await {
            Ok(prs) => {
                let agent = |login: &str| {
                    login
                        .parse::<Login>()
                        .is_ok_and(|l| policy.is_bot_author(&l) || policy.is_agent(&l))
                };
                prs.iter()
                    .filter(|p| agent(&p.user.login))
                    .filter(|p| linked_issues(&p.body).contains(&item.number))
                    .map(|p| p.number)
                    .min()
                    .map_or(World::NoPr, |number| World::PrOpened { number })
            }
            Err(e) => World::Unknown(format!("listing the open PRs failed: {e}")),
        };
    }
    match forgejo.get_pull(repo, item.number).await {
        Ok(pr) => {
            let dispatched = item.head_sha.as_ref().map(|s| s.as_str().to_owned());
            let now = pr.head.sha.to_ascii_lowercase();
            match dispatched {
                _ if now.is_empty() => World::Unknown("the PR's head is not known".into()),
                None => World::Unknown("the work item names no head to compare with".into()),
                Some(d) if d.eq_ignore_ascii_case(&now) => World::HeadUnchanged,
                Some(from) => World::HeadMoved { from, to: now },
            }
        }
        Err(e) => World::Unknown(format!("reading the PR failed: {e}")),
    }
}

/// The result of a run without a valid result file, corrected by `world` (see the
/// module's table). `result` is what the exit status gave ([`super::outcome::decide`]).
pub fn apply(world: &World, mut result: AgentResult) -> AgentResult {
    // Only the exit status's `succeeded` (no file, exit 0) becomes `no-changes`: a
    // failed exit or a bad result file keeps its failure and signature.
    let exit_said_ok = result.report.outcome == WorkOutcome::Succeeded;
    let report = &mut result.report;
    let prepend = |summary: &mut Option<String>, line: String| {
        *summary = Some(match summary.take() {
            Some(s) => format!("{line}\n{s}"),
            None => line,
        });
    };
    match world {
        World::HeadMoved { from, to } => {
            report.outcome = WorkOutcome::Succeeded;
            report.signature = None;
            let line = format!(
                "no result file; the PR's head moved from {} to {} since dispatch: pushed",
                short(from),
                short(to)
            );
            prepend(&mut report.summary, line);
        }
        World::PrOpened { number } => {
            report.outcome = WorkOutcome::Succeeded;
            report.signature = None;
            prepend(
                &mut report.summary,
                format!("no result file; #{number} is open and links the issue: opened-pr"),
            );
        }
        World::HeadUnchanged | World::NoPr if exit_said_ok => {
            report.outcome = WorkOutcome::NoChanges;
            report.signature = None;
            let what = match world {
                World::NoPr => "no open agent PR links the issue",
                _ => "the PR's head is the one it was dispatched on",
            };
            prepend(
                &mut report.summary,
                format!("no result file and exit 0, but {what}: no-changes"),
            );
        }
        World::HeadUnchanged | World::NoPr => {}
        World::Unknown(why) => prepend(
            &mut report.summary,
            format!(
                "no result file; the outcome comes from the exit status: Forgejo could not be read ({why})"
            ),
        ),
    }
    result
}

/// The first ten characters of a sha.
fn short(sha: &str) -> &str {
    sha.get(..10).unwrap_or(sha)
}

/// Settles a run's result from the world when the agent exited (by itself) without a
/// valid result file (`valid_file`: it wrote one that was read); otherwise `result`
/// as it is.
pub async fn settle(
    forgejo: &ForgejoClient,
    item: &WorkItem,
    policy: &Policy,
    finish: Finish,
    valid_file: bool,
    result: AgentResult,
) -> AgentResult {
    if valid_file || !matches!(finish, Finish::Exited(_)) || !judged(item.kind) {
        return result;
    }
    let world = read(forgejo, item, policy).await;
    tracing::info!(work = %item.id, ?world, "no valid result file: the outcome is read from Forgejo");
    apply(&world, result)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::ExitStatus;

    use super::*;
    use crate::agents::outcome::{self, ResultFileError};

    fn exit(code: i32) -> Finish {
        Finish::Exited(ExitStatus::from_raw(code << 8))
    }

    /// What the exit status alone gives (no result file).
    fn by_exit(f: Finish) -> AgentResult {
        outcome::decide(f, Ok(None), "the agent's last words")
    }

    #[test]
    fn an_early_exit_without_a_push_or_pr_is_no_changes() {
        for world in [World::HeadUnchanged, World::NoPr] {
            let r = apply(&world, by_exit(exit(0)));
            assert_eq!(r.report.outcome, WorkOutcome::NoChanges, "{world:?}");
            let s = r.report.summary.unwrap();
            assert!(
                s.contains("no-changes") && s.ends_with("the agent's last words"),
                "{s}"
            );
        }
    }

    #[test]
    fn a_push_or_a_pr_is_success_whatever_the_exit_status() {
        let moved = World::HeadMoved {
            from: "a".repeat(40),
            to: "b".repeat(40),
        };
        for f in [exit(0), exit(2)] {
            let r = apply(&moved, by_exit(f));
            assert_eq!(r.report.outcome, WorkOutcome::Succeeded);
            assert_eq!(r.report.signature, None);
            assert!(r.report.summary.unwrap().contains("bbbbbbbbbb"));
            let r = apply(&World::PrOpened { number: 12 }, by_exit(f));
            assert_eq!(r.report.outcome, WorkOutcome::Succeeded);
            assert!(r.report.summary.unwrap().contains("#12"));
        }
    }

    #[test]
    fn a_failed_exit_without_changes_keeps_its_failure() {
        let r = apply(&World::HeadUnchanged, by_exit(exit(3)));
        assert_eq!(r.report.outcome, WorkOutcome::Failed);
        assert_eq!(r.report.signature.as_deref(), Some("exit:3"));
        // A bad result file without changes stays a bad result file.
        let bad = outcome::BadResultFile {
            error: ResultFileError::Invalid("x".into()),
            head: "x".into(),
        };
        let r = apply(&World::NoPr, outcome::decide(exit(0), Err(bad), ""));
        assert_eq!(r.report.signature.as_deref(), Some("result-file"));
        assert!(r.log_note.is_some(), "the file's head is still kept");
    }

    #[test]
    fn an_unreadable_forgejo_keeps_the_exit_status_and_says_so() {
        let world = World::Unknown("HTTP 503".into());
        let r = apply(&world, by_exit(exit(0)));
        assert_eq!(r.report.outcome, WorkOutcome::Succeeded);
        let s = r.report.summary.unwrap();
        assert!(s.contains("Forgejo could not be read (HTTP 503)"), "{s}");
    }

    #[test]
    fn only_push_and_pr_work_is_judged() {
        assert!(judged(WorkKind::CiFix) && judged(WorkKind::IssueImpl));
        assert!(!judged(WorkKind::Review) && !judged(WorkKind::ReadyToMerge));
    }
}
