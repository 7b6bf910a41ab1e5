//! What the batched merge queue (issue 29) needs of the fake, as Forgejo v15 does it:
//!
//! - `POST …/branches` `{new_branch_name, old_ref_name | old_branch_name}`: 404 when the
//!   old ref does not exist, 409 when the branch exists, else 201 and the `Branch`. The
//!   fake remembers the commit a branch was made at (the merge base of a PR from it).
//! - `DELETE …/branches/{branch…}`: 404 missing, 403 the default or a protected branch,
//!   else 204; every unmerged PR whose head or base was that branch is closed
//!   (`CloseBranchPulls`, `services/pull/pull.go`).
//! - `POST …/pulls` `{head, base, title, body}`: 404 when either branch is missing,
//!   422 when they are the same, 409 when an open PR with the same head and base exists,
//!   else 201 and the PR (built on its base's tip, or on the commit its head branch was
//!   made at); the `pull_request` opened webhook follows (outbox). A PR from a queued
//!   PR's branch conflicts on merge when that PR conflicts with its base
//!   (`update_conflicts`).
//! - `Do: manually-merged` (`merge.rs` calls [`manual`]): `services/pull/merge.go`
//!   `MergedManually` — 405 when the repository does not allow manual merges, 409
//!   "Wrong commit ID" when `MergeCommitID` is not a full sha of a known commit on the
//!   PR's base branch, else 200: the PR is merged with that commit (closed, the merged
//!   webhook follows).
//! - CI: a merge into a `shepherd/batch/*` branch starts a simulated CI run on the new
//!   tip, as a CI configured to run on pushes to those branches does.

use serde_json::{Value, json};

use super::model::{MergeRecord, Model, PullData, now};
use super::routes::Reply;

/// Whether `branch` is one of the queue's temporary batch branches.
pub fn is_batch_branch(branch: &str) -> bool {
    branch.starts_with("shepherd/batch/")
}

/// `POST …/branches`.
pub fn create_branch(model: &mut Model, repo: &str, body: &Value) -> Reply {
    let name = body["new_branch_name"].as_str().unwrap_or("");
    if name.is_empty() {
        return Reply::error(422, "[BranchName]: Required");
    }
    let old = body["old_ref_name"]
        .as_str()
        .or_else(|| body["old_branch_name"].as_str())
        .unwrap_or("");
    let r = model.repo_mut(repo);
    let from = match r.branches.get(old) {
        Some(sha) => sha.clone(),
        None if r.content.contains_key(old) || r.branches.values().any(|s| s == old) => {
            old.to_owned()
        }
        None => return Reply::error(404, "The old branch does not exist"),
    };
    if r.branches.contains_key(name) {
        return Reply::error(409, "The branch already exists.");
    }
    r.branches.insert(name.to_owned(), from.clone());
    r.made_at.insert(name.to_owned(), from);
    let mut reply = super::queue::branch(model, repo, name);
    reply.status = 201;
    reply
}

/// `DELETE …/branches/{branch…}`.
pub fn delete_branch(model: &mut Model, repo: &str, name: &str) -> Reply {
    let r = model.repo_mut(repo);
    if !r.branches.contains_key(name) {
        return Reply::error(404, "branch does not exist");
    }
    if name == r.default_branch || r.protected_branches.contains(name) {
        return Reply::error(403, "branch is protected");
    }
    r.branches.remove(name);
    r.made_at.remove(name);
    for issue in r.issues.values_mut() {
        let Some(p) = &issue.pull else { continue };
        if !p.merged && issue.state == "open" && (p.head_ref == name || p.base_ref == name) {
            issue.state = "closed".into();
            issue.closed_at = Some(now());
        }
    }
    Reply::empty(204)
}

/// `POST …/pulls` by `doer`.
pub fn create_pull(model: &mut Model, doer: &str, repo: &str, body: &Value) -> Reply {
    let head = body["head"].as_str().unwrap_or("").to_owned();
    let base = body["base"].as_str().unwrap_or("").to_owned();
    let title = body["title"].as_str().unwrap_or("").to_owned();
    let text = body["body"].as_str().unwrap_or("").to_owned();
    let r = model.repo_mut(repo);
    let (Some(head_sha), Some(tip)) = (r.branches.get(&head).cloned(), r.branches.get(&base))
    else {
        return Reply::not_found();
    };
    if head == base {
        return Reply::error(
            422,
            "Invalid PullRequest: There are no changes between the head and the base",
        );
    }
    let exists = r.issues.values().any(|i| {
        i.state == "open"
            && i.pull
                .as_ref()
                .is_some_and(|p| p.head_ref == head && p.base_ref == base)
    });
    if exists {
        return Reply::error(409, "pull request already exists for these targets");
    }
    let merge_base = r.made_at.get(&head).cloned().unwrap_or_else(|| tip.clone());
    // A queued PR's branch conflicts in the batch as it would on an update.
    let source = r.issues.values().find(|i| {
        i.state == "open"
            && i.pull
                .as_ref()
                .is_some_and(|p| p.head_ref == head && !is_batch_branch(&p.base_ref))
    });
    let conflict = source.is_some_and(|i| r.update_conflicts.contains(&i.number));
    let pull = PullData {
        head_ref: head,
        head_sha,
        base_ref: base,
        mergeable: true,
        conflict_on_merge: conflict,
        merged: false,
        merged_at: None,
        merge_commit_sha: None,
        merged_by: None,
        files: Vec::new(),
        merge_base,
    };
    let n = model.open_issue(repo, doer, &title, &text, Some(pull));
    let r = &model.repos[repo];
    Reply::json(201, super::render::pull(model, r, &r.issues[&n]))
}

/// `Do: manually-merged` on PR `number`, after the checks every merge shares
/// (`CheckPullMergeable` with `MergeCheckTypeManually` stops after merged, closed and
/// permission: `merge.rs` ran them).
pub fn manual(model: &mut Model, doer: &str, repo: &str, number: u64, body: &Value) -> Reply {
    let commit = super::merge::field(body, "MergeCommitID")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_lowercase();
    let r = model.repo_mut(repo);
    if r.no_manual_merge {
        return Reply::error(
            405,
            "manually-merged is not allowed an allowed merge style for this repository",
        );
    }
    let pull = r.issues[&number].pull.clone().expect("checked by refuse");
    let tip = r.branches.get(&pull.base_ref).cloned().unwrap_or_default();
    // `IsCommitInBranch`: the fake has no commit graph; a commit is on the branch when
    // it is the tip, or a known commit whose changes the tip holds.
    let known = r.content.contains_key(&commit);
    let on_branch = commit == tip
        || (known
            && super::queue::content_of(r, &commit).is_subset(&super::queue::content_of(r, &tip)));
    if commit.len() != 40 || !on_branch {
        return Reply::json(409, json!({}));
    }
    let issue = r.issues.get_mut(&number).expect("checked");
    let p = issue.pull.as_mut().expect("checked");
    p.merged = true;
    p.merged_at = Some(now());
    p.merge_commit_sha = Some(commit.clone());
    p.merged_by = Some(doer.to_owned());
    issue.state = "closed".into();
    issue.closed_at = Some(now());
    issue.updated_at = now();
    model.merges.push(MergeRecord {
        repo: repo.to_owned(),
        number,
        style: "manually-merged".into(),
        head_commit_id: None,
        merged_sha: pull.head_sha,
        body: body.clone(),
        tip_before: tip.clone(),
        tip_after: tip,
        closed_issues: Vec::new(),
    });
    Reply::empty(200)
}

/// After a merge into a batch branch: CI runs on its new tip.
pub fn after_merge(model: &mut Model, repo: &str, number: u64) {
    let r = &model.repos[repo];
    let Some(p) = r.issues.get(&number).and_then(|i| i.pull.clone()) else {
        return;
    };
    if !is_batch_branch(&p.base_ref) {
        return;
    }
    if let Some(tip) = r.branches.get(&p.base_ref).cloned() {
        super::queue::start_ci(model, repo, number, &tip);
    }
}
