//! `POST /repos/{o}/{r}/pulls/{n}/merge` as Forgejo v15 decides it (forgejo-facts.md
//! §4.3): 404 missing or closed; 405 already merged / not allowed / WIP / not
//! mergeable / branch protection; 409 head out of date or conflicts; 200 merged, or
//! 403 when the merged branch could not be deleted.

use serde_json::{Value, json};

use super::model::{MergeRecord, Model, RepoRow, combined_state, fake_sha, glob, now};
use super::routes::Reply;

/// Merge styles Forgejo's form binding accepts in `Do`.
const STYLES: [&str; 6] = [
    "merge",
    "rebase",
    "rebase-merge",
    "squash",
    "fast-forward-only",
    "manually-merged",
];

/// A field of the merge form: Go's decoder matches keys case-insensitively.
pub(super) fn field<'a>(body: &'a Value, key: &str) -> Option<&'a Value> {
    body.as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}

/// Handles a merge request by the bot user `doer`.
pub fn merge(model: &mut Model, doer: &str, repo: &str, number: u64, body: &Value) -> Reply {
    let style = field(body, "Do").and_then(Value::as_str).unwrap_or("");
    if !STYLES.contains(&style) {
        return Reply::error(422, "[Do]: In");
    }
    let merge_id = model.id();
    let Some(r) = model.repos.get(repo) else {
        return Reply::not_found();
    };
    if let Some(reply) = refuse(r, doer, number, style) {
        return reply;
    }
    if style == "manually-merged" {
        return super::batch::manual(model, doer, repo, number, body);
    }
    let pull = r.issues[&number].pull.clone().expect("checked by refuse");
    let pinned = field(body, "head_commit_id").and_then(Value::as_str);
    if pinned.is_some_and(|h| !h.is_empty() && h != pull.head_sha) {
        return Reply::error(409, "head out of date");
    }
    if pull.conflict_on_merge {
        let conflict = json!({"Style": style, "StdOut": "", "StdErr": "CONFLICT (content): Merge conflict in src/lib.rs", "Err": {}});
        return Reply::json(409, conflict);
    }
    let r = model.repos.get_mut(repo).expect("checked above");
    let tip_before = r.branches.get(&pull.base_ref).cloned().unwrap_or_default();
    let merge_sha = match style {
        "fast-forward-only" => {
            if r.no_fast_forward {
                return Reply::error(405, "fast-forward-only merge style is not allowed");
            }
            // The tip must be an ancestor of the head (the head is built on it);
            // git's "Not possible to fast-forward" is not mapped: 500, empty message.
            if pull.merge_base != tip_before && !r.is_ancestor(&tip_before, &pull.head_sha) {
                return Reply::error(500, "");
            }
            pull.head_sha.clone()
        }
        _ => {
            let sha = fake_sha(merge_id as u64 + 1_000_000);
            let mut content = super::queue::content_of(r, &tip_before);
            content.extend(super::queue::content_of(r, &pull.head_sha));
            r.content.insert(sha.clone(), content);
            (r.parents).insert(sha.clone(), vec![tip_before.clone(), pull.head_sha.clone()]);
            sha
        }
    };
    let is_default = pull.base_ref == r.default_branch;
    r.branches.insert(pull.base_ref.clone(), merge_sha.clone());
    let issue = r.issues.get_mut(&number).expect("checked above");
    let p = issue.pull.as_mut().expect("checked above");
    p.merged = true;
    p.merged_at = Some(now());
    p.merge_commit_sha = Some(merge_sha);
    p.merged_by = Some(doer.to_owned());
    issue.state = "closed".into();
    issue.closed_at = Some(now());
    issue.updated_at = now();
    let pr_body = issue.body.clone();
    let mut closed_issues = Vec::new();
    if is_default {
        for n in closing_refs(&pr_body) {
            if let Some(linked) = r.issues.get_mut(&n)
                && linked.pull.is_none()
                && linked.state == "open"
            {
                linked.state = "closed".into();
                linked.closed_at = Some(now());
                closed_issues.push(n);
            }
        }
    }
    let delete = field(body, "delete_branch_after_merge").and_then(Value::as_bool) == Some(true);
    let undeletable =
        r.protected_branches.contains(&pull.head_ref) || pull.head_ref == r.default_branch;
    if delete && !undeletable {
        r.branches.remove(&pull.head_ref);
    }
    model.merges.push(MergeRecord {
        repo: repo.to_owned(),
        number,
        style: style.to_owned(),
        head_commit_id: pinned.map(str::to_owned),
        merged_sha: pull.head_sha.clone(),
        body: body.clone(),
        tip_before,
        tip_after: merge_sha_after(model, repo, &pull.base_ref),
        closed_issues,
    });
    super::batch::after_merge(model, repo, number);
    if delete && undeletable {
        return Reply::error(
            403,
            &format!(
                "branch {} is protected and cannot be deleted",
                pull.head_ref
            ),
        );
    }
    Reply::empty(200)
}

/// The tip of `branch` now.
fn merge_sha_after(model: &Model, repo: &str, branch: &str) -> String {
    model.repos[repo]
        .branches
        .get(branch)
        .cloned()
        .unwrap_or_default()
}

/// The checks of `CheckPullMergeable`, in Forgejo's order.
fn refuse(r: &RepoRow, doer: &str, number: u64, style: &str) -> Option<Reply> {
    let Some(issue) = r.issues.get(&number).filter(|i| i.pull.is_some()) else {
        return Some(Reply::not_found());
    };
    let pull = issue.pull.as_ref()?;
    if pull.merged {
        return Some(Reply::error(405, ""));
    }
    if issue.state == "closed" {
        return Some(Reply::not_found());
    }
    let perm = r
        .permissions
        .get(&doer.to_lowercase())
        .map_or("write", String::as_str);
    if !matches!(perm, "write" | "admin" | "owner") {
        return Some(Reply::error(405, "User not allowed to merge PR"));
    }
    // `MergeCheckTypeManually` checks nothing more (services/pull/check.go).
    if style == "manually-merged" {
        return None;
    }
    if issue.is_draft() {
        return Some(Reply::error(405, "Work in progress PRs cannot be merged"));
    }
    if !pull.mergeable {
        return Some(Reply::error(405, "Please try again later"));
    }
    // The fake's one protection rule matches the target branches, not the queue's
    // `shepherd/batch/*` branches (a real rule names its branch pattern).
    if super::batch::is_batch_branch(&pull.base_ref) {
        return None;
    }
    protection_failure(r, number, &pull.head_sha)
        .map(|reason| Reply::error(405, &format!("not allowed to merge [reason: {reason}]")))
}

/// The first unmet branch-protection condition (`CheckPullBranchProtections`).
fn protection_failure(r: &RepoRow, number: u64, head: &str) -> Option<&'static str> {
    let rule = &r.protection;
    if let Some(patterns) = &rule.status_checks {
        let latest = r.latest_statuses(head);
        let ok = if patterns.is_empty() {
            combined_state(&latest) == "success"
        } else {
            patterns.iter().all(|p| {
                let matched: Vec<_> = latest
                    .iter()
                    .filter(|s| glob(p, &s.context))
                    .cloned()
                    .collect();
                combined_state(&matched) == "success"
            })
        };
        if !ok {
            return Some("Not all required status checks successful");
        }
    }
    let reviews = || {
        r.reviews
            .iter()
            .filter(move |v| v.number == number && v.official && !v.dismissed)
    };
    let approvals = reviews()
        .filter(|v| v.state == "APPROVED" && !(rule.ignore_stale_approvals && v.stale))
        .count();
    if approvals < rule.required_approvals as usize {
        return Some("Does not have enough approvals");
    }
    if rule.block_on_rejected_reviews && reviews().any(|v| v.state == "REQUEST_CHANGES") {
        return Some("There are requested changes");
    }
    None
}

/// Issue numbers a PR body closes (`closes #N`, `fixes #N`, `resolves #N`, …).
pub fn closing_refs(body: &str) -> Vec<u64> {
    const KEYWORDS: [&str; 9] = [
        "close", "closes", "closed", "fix", "fixes", "fixed", "resolve", "resolves", "resolved",
    ];
    let words: Vec<String> = body
        .split_whitespace()
        .map(|w| w.trim_end_matches([':', ',', '.']).to_lowercase())
        .collect();
    words
        .windows(2)
        .filter(|w| KEYWORDS.contains(&w[0].as_str()))
        .filter_map(|w| w[1].strip_prefix('#')?.parse().ok())
        .collect()
}
