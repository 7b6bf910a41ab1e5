//! Turning the Forgejo client's responses into the core's observation types, through
//! the client's `From` conversions into `core::payload` (reviews are read in that
//! shape already) and the core's normalizers:
//! one interpretation of a PR, a review or a status, whether it came by webhook or by
//! API read.

use crate::core::event::{CiContext, Permission, PrSnapshot, ReviewFact};
use crate::core::ids::RepoName;
use crate::core::{normalize, payload};
use crate::forgejo;

/// A PR as the machine sees it.
pub fn pr_snapshot(repo: &RepoName, pr: &forgejo::PullRequest) -> PrSnapshot {
    let p: payload::PullRequest = pr.clone().into();
    normalize::pr_snapshot(repo, &p)
}

/// Reviews as the machine sees them (reviews without a reviewer are dropped).
pub fn reviews(list: &[payload::PullReview]) -> Vec<ReviewFact> {
    list.iter().filter_map(normalize::review).collect()
}

/// The latest status per context (empty when there is none).
pub fn contexts(c: &forgejo::CombinedStatus) -> Vec<CiContext> {
    normalize::ci_contexts(&payload::CombinedStatus::from(c.clone()))
}

/// Forgejo's permission text as a level.
pub fn permission(text: &str) -> Permission {
    match text {
        "owner" | "admin" => Permission::Admin,
        "write" => Permission::Write,
        _ => Permission::Read,
    }
}

/// An issue's dependencies as the machine sees them: each with its repository (the
/// issue's own when Forgejo does not say), state, and the open PRs of `repo` whose
/// body links it (`Closes #N`; only for open dependencies of `repo` itself). Whom to
/// trust among those PRs is the core's decision (`core::machine::issue_deps`).
pub fn dependencies(
    repo: &RepoName,
    list: &[forgejo::Issue],
    open_pulls: &[forgejo::PullRequest],
) -> Vec<crate::core::event::DependencyFact> {
    use crate::core::event::{DependencyFact, LinkingPrFact};
    list.iter()
        .filter_map(|i| {
            let dep_repo = match &i.repository {
                Some(m) if !m.full_name.is_empty() => m.full_name.parse().ok()?,
                Some(_) | None => repo.clone(),
            };
            let open = i.state == "open";
            let linking_prs = match open && dep_repo == *repo && i.pull_request.is_none() {
                true => open_pulls
                    .iter()
                    .filter(|p| crate::core::record::linked_issues(&p.body).contains(&i.number))
                    .map(|p| LinkingPrFact {
                        number: p.number,
                        author: p.user.login.parse().ok(),
                        head_ref: p.head.ref_name.clone(),
                        same_repo: p.head.repo_id != 0 && p.head.repo_id == p.base.repo_id,
                    })
                    .collect(),
                false => Vec::new(),
            };
            Some(DependencyFact {
                repo: dep_repo,
                number: i.number,
                open,
                is_pull: i.pull_request.is_some(),
                linking_prs,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_structs_read_as_core_observations() {
        let pr: forgejo::PullRequest = serde_json::from_value(serde_json::json!({
            "number": 7, "title": "WIP: x", "body": "Closes #3", "state": "open",
            "user": {"id": 1, "login": "Alice"}, "mergeable": true,
            "labels": [{"id": 4, "name": "kind/x"}],
            "head": {"ref": "feat", "sha": "ABCDEF12"}, "base": {"ref": "main", "sha": "00ff"},
            "updated_at": "2026-11-30T10:00:00Z"
        }))
        .unwrap();
        let repo: RepoName = "o/r".parse().unwrap();
        let s = pr_snapshot(&repo, &pr);
        assert_eq!(s.head_sha.unwrap().as_str(), "abcdef12");
        assert!(s.draft);
        assert_eq!(s.base_ref, "main");
        assert!(s.labels.contains("kind/x"));
        assert_eq!(s.author.unwrap().as_str(), "alice");
        assert!(s.updated_ms > 0);

        let status: forgejo::CombinedStatus = serde_json::from_value(serde_json::json!({
            "state": "failure", "sha": "abcd",
            "statuses": [{"id": 1, "status": "failure", "context": "ci", "description": "red"}]
        }))
        .unwrap();
        let cs = contexts(&status);
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].state, crate::core::event::CiState::Failure);

        let review: payload::PullReview = serde_json::from_value(serde_json::json!({
            "id": 9, "user": {"login": "bob"}, "state": "APPROVED", "commit_id": "ABCD",
            "official": true
        }))
        .unwrap();
        let rs = reviews(&[review]);
        assert_eq!(rs[0].commit_id, "abcd");
        assert!(rs[0].official);
        assert_eq!(permission("owner"), Permission::Admin);
        assert_eq!(permission("none"), Permission::Read);
    }
}
