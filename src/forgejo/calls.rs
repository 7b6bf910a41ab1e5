//! What a Forgejo API call was for, and which endpoint it hit: the labels of
//! `shepherd_forgejo_api_calls_total{endpoint, cause}`, so operators can see what
//! Shepherd costs their instance and why (issue 17).
//!
//! The endpoint is the request's method and path with every identifier replaced by
//! the name of its OpenAPI parameter (`GET /repos/{owner}/{repo}/pulls/{index}`), so
//! the label values are bounded by the endpoints Shepherd calls, never by PR numbers,
//! shas or comment ids.

/// Why Shepherd called Forgejo. A client carries one ([`super::ForgejoClient::with_cause`]);
/// every request it sends is counted under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Cause {
    /// A read the machine asked for in answer to a webhook (or to an observation that
    /// followed one): the PR, its reviews, a head's combined status, a permission.
    Webhook,
    /// A combined-status read of the CI poll's backoff timer (no event asked for it).
    CiPoll,
    /// The periodic resync or `shepherd resync`.
    Resync,
    /// The executor's re-check right before a merge, and the re-read after an
    /// ambiguous merge answer.
    MergeCheck,
    /// A write the machine decided on: labels, comments, the merge itself.
    Effect,
    /// The agent runner reading context for a prompt.
    Agent,
    /// Anything else (start-up checks, operator tools).
    #[default]
    Other,
}

impl Cause {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Webhook => "webhook",
            Cause::CiPoll => "ci-poll",
            Cause::Resync => "resync",
            Cause::MergeCheck => "merge-check",
            Cause::Effect => "effect",
            Cause::Agent => "agent",
            Cause::Other => "other",
        }
    }
}

/// `METHOD /path/template` of a request to `path` (below `/api/v1`, without the
/// query): owner and repository, then each identifier after a collection name.
pub fn endpoint(method: &str, path: &str) -> String {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let mut out: Vec<&str> = Vec::with_capacity(segs.len());
    for (i, seg) in segs.iter().enumerate() {
        let prev = if i == 0 { "" } else { segs[i - 1] };
        let in_repo = segs.first() == Some(&"repos");
        let templ = match (in_repo, i, prev) {
            (true, 1, _) => "{owner}",
            (true, 2, _) => "{repo}",
            (_, _, "pulls") if seg.ends_with(".diff") => "{index}.diff",
            (_, _, "pulls") if seg.ends_with(".patch") => "{index}.patch",
            (_, _, "pulls" | "issues") if seg.parse::<u64>().is_ok() => "{index}",
            (_, _, "comments" | "reviews" | "labels") if seg.parse::<u64>().is_ok() => "{id}",
            (_, _, "labels") if i + 1 == segs.len() && prev_is_issue_labels(&segs, i) => "{id}",
            (_, _, "runs") if seg.parse::<u64>().is_ok() => "{run_id}",
            (_, _, "jobs") if seg.parse::<u64>().is_ok() => "{job_id}",
            (_, _, "commits") => "{ref}",
            (_, _, "statuses") => "{sha}",
            (_, _, "collaborators") => "{collaborator}",
            // Branch names may hold slashes: everything after `branches` is the name.
            (true, _, _) if i >= 4 && segs[3] == "branches" => {
                if i == 4 {
                    out.push("{branch}");
                }
                continue;
            }
            _ => seg,
        };
        out.push(templ);
    }
    format!("{method} /{}", out.join("/"))
}

/// `…/issues/{index}/labels/{name}`: a label removed by name.
fn prev_is_issue_labels(segs: &[&str], i: usize) -> bool {
    i >= 3 && segs[i - 3] == "issues"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_templates() {
        let cases = [
            ("GET", "/repos/o/r/pulls", "GET /repos/{owner}/{repo}/pulls"),
            (
                "GET",
                "/repos/o/r/pulls/12",
                "GET /repos/{owner}/{repo}/pulls/{index}",
            ),
            (
                "GET",
                "/repos/o/r/pulls/12/reviews",
                "GET /repos/{owner}/{repo}/pulls/{index}/reviews",
            ),
            (
                "GET",
                "/repos/o/r/commits/abc123/status",
                "GET /repos/{owner}/{repo}/commits/{ref}/status",
            ),
            (
                "PATCH",
                "/repos/o/r/issues/comments/99",
                "PATCH /repos/{owner}/{repo}/issues/comments/{id}",
            ),
            (
                "DELETE",
                "/repos/o/r/issues/3/labels/7",
                "DELETE /repos/{owner}/{repo}/issues/{index}/labels/{id}",
            ),
            (
                "GET",
                "/repos/o/r/pulls/3.diff",
                "GET /repos/{owner}/{repo}/pulls/{index}.diff",
            ),
            (
                "GET",
                "/repos/o/r/collaborators/bob/permission",
                "GET /repos/{owner}/{repo}/collaborators/{collaborator}/permission",
            ),
            ("GET", "/version", "GET /version"),
        ];
        for (method, path, want) in cases {
            assert_eq!(endpoint(method, path), want, "{method} {path}");
        }
    }

    #[test]
    fn cause_names() {
        assert_eq!(Cause::CiPoll.as_str(), "ci-poll");
        assert_eq!(Cause::MergeCheck.as_str(), "merge-check");
        assert_eq!(Cause::default(), Cause::Other);
    }
}
