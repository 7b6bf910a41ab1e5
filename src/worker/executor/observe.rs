//! Turning the Forgejo client's responses into the core's observation types. The
//! client's structs serialize with Forgejo's own field names, so each one is passed
//! through the core's payload type of the same shape and the core's normalizers —
//! one interpretation of a PR, a review or a status, whether it came by webhook or by
//! API read.

use crate::core::event::{CiContext, Permission, PrSnapshot, Review};
use crate::core::ids::RepoName;
use crate::core::{normalize, payload};
use crate::forgejo;

use super::act::Failure;

/// Re-reads `value` (a client struct) as the core payload type `T`.
fn convert<T: serde::de::DeserializeOwned>(
    what: &str,
    value: &impl serde::Serialize,
) -> Result<T, Failure> {
    serde_json::to_value(value)
        .and_then(serde_json::from_value)
        .map_err(|e| Failure::Permanent(format!("cannot read the {what}: {e}")))
}

/// A PR as the machine sees it.
pub fn pr_snapshot(repo: &RepoName, pr: &forgejo::PullRequest) -> Result<PrSnapshot, Failure> {
    let p: payload::PullRequest = convert("pull request", pr)?;
    Ok(normalize::pr_snapshot(repo, &p))
}

/// Reviews as the machine sees them (reviews without a reviewer are dropped).
pub fn reviews(list: &[forgejo::Review]) -> Result<Vec<Review>, Failure> {
    let mut out = Vec::with_capacity(list.len());
    for r in list {
        let p: payload::PullReview = convert("review", r)?;
        out.extend(normalize::review(&p));
    }
    Ok(out)
}

/// The latest status per context (empty when there is none).
pub fn contexts(c: &forgejo::CombinedStatus) -> Result<Vec<CiContext>, Failure> {
    let p: payload::CombinedStatus = convert("combined status", c)?;
    Ok(normalize::ci_contexts(&p))
}

/// Forgejo's permission text as a level.
pub fn permission(text: &str) -> Permission {
    match text {
        "owner" | "admin" => Permission::Admin,
        "write" => Permission::Write,
        _ => Permission::Read,
    }
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
        let s = pr_snapshot(&repo, &pr).unwrap();
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
        let cs = contexts(&status).unwrap();
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].state, crate::core::event::CiState::Failure);

        let review: forgejo::Review = serde_json::from_value(serde_json::json!({
            "id": 9, "user": {"login": "bob"}, "state": "APPROVED", "commit_id": "ABCD",
            "official": true
        }))
        .unwrap();
        let rs = reviews(&[review]).unwrap();
        assert_eq!(rs[0].commit_id, "abcd");
        assert!(rs[0].official);
        assert_eq!(permission("owner"), Permission::Admin);
        assert_eq!(permission("none"), Permission::Read);
    }
}
