//! JSON shapes of the fake's model, as Forgejo's API and webhooks print them
//! (forgejo-facts.md §3): users, repositories, labels, issues, pull requests, reviews,
//! comments and commit statuses. REST answers and webhook payloads share these.

use serde_json::{Value, json};

use super::model::{
    CommentRow, FileRow, IssueRow, LabelRow, Model, RepoRow, ReviewCommentRow, ReviewRow, StatusRow,
};

/// Base URL that HTML links in payloads point to (never fetched).
pub const HTML_BASE: &str = "https://forgejo.test";

/// A user object, with every field of Forgejo's `User` (as a webhook shows it: no viewer, so `is_admin`/`active` false and no last login).
pub fn user(model: &Model, login: &str) -> Value {
    let id = model.users.get(login).copied().unwrap_or(0);
    json!({
        "id": id,
        "login": login,
        "login_name": "",
        "source_id": 0,
        "full_name": "",
        "email": format!("{login}@noreply.forgejo.test"),
        "avatar_url": format!("{HTML_BASE}/avatars/{id:032x}"),
        "html_url": format!("{HTML_BASE}/{login}"),
        "language": "",
        "is_admin": false,
        "last_login": "0001-01-01T00:00:00Z",
        "created": "2025-01-01T00:00:00Z",
        "restricted": false,
        "active": false,
        "prohibit_login": false,
        "location": "",
        "pronouns": "",
        "website": "",
        "description": "",
        "visibility": "public",
        "followers_count": 0,
        "following_count": 0,
        "starred_repos_count": 0,
        "username": login,
    })
}

/// A repository object with every field of Forgejo's `Repository` (serde_json sorts the
/// keys; consumers never depend on the order).
pub fn repo(model: &Model, r: &RepoRow) -> Value {
    let full = r.full_name();
    let open_issues = r
        .issues
        .values()
        .filter(|i| i.pull.is_none() && i.state == "open")
        .count();
    let open_prs = r
        .issues
        .values()
        .filter(|i| i.pull.is_some() && i.state == "open")
        .count();
    // Two halves: one `json!` this large exceeds the macro recursion limit.
    let identity = json!({
        "id": r.id,
        "owner": user(model, &r.owner),
        "name": r.name,
        "full_name": full,
        "description": "",
        "empty": false,
        "private": false,
        "fork": false,
        "template": false,
        "parent": null,
        "mirror": false,
        "size": 100,
        "language": "Rust",
        "languages_url": format!("{HTML_BASE}/api/v1/repos/{full}/languages"),
        "html_url": format!("{HTML_BASE}/{full}"),
        "url": format!("{HTML_BASE}/api/v1/repos/{full}"),
        "link": "",
        "ssh_url": format!("ssh://git@forgejo.test/{full}.git"),
        "clone_url": format!("{HTML_BASE}/{full}.git"),
        "original_url": "",
        "website": "",
        "stars_count": 0,
        "forks_count": 0,
        "watchers_count": 1,
        "open_issues_count": open_issues,
        "open_pr_counter": open_prs,
        "release_counter": 0,
        "default_branch": r.default_branch,
        "archived": false,
    });
    let settings = json!({
        "created_at": "2025-01-01T00:00:00Z",
        "updated_at": super::model::now(),
        "archived_at": "1970-01-01T00:00:00Z",
        "permissions": {"admin": false, "push": true, "pull": true},
        "has_issues": true,
        "internal_tracker": {"enable_time_tracker": true, "allow_only_contributors_to_track_time": true, "enable_issue_dependencies": true},
        "has_wiki": false,
        "wiki_branch": r.default_branch,
        "globally_editable_wiki": false,
        "has_pull_requests": true,
        "has_projects": false,
        "has_releases": true,
        "has_packages": false,
        "has_actions": true,
        "ignore_whitespace_conflicts": false,
        "allow_merge_commits": true,
        "allow_rebase": true,
        "allow_rebase_explicit": true,
        "allow_squash_merge": true,
        "allow_fast_forward_only_merge": true,
        "allow_rebase_update": true,
        "default_delete_branch_after_merge": false,
        "default_merge_style": "merge",
        "default_allow_maintainer_edit": false,
        "default_update_style": "merge",
        "avatar_url": "",
        "internal": false,
        "mirror_interval": "",
        "object_format_name": "sha1",
        "mirror_updated": "0001-01-01T00:00:00Z",
        "repo_transfer": null,
        "topics": null,
    });
    let mut out = identity;
    if let (Some(o), Value::Object(rest)) = (out.as_object_mut(), settings) {
        o.extend(rest);
    }
    out
}

/// A label object.
pub fn label(r: &RepoRow, l: &LabelRow) -> Value {
    json!({
        "id": l.id,
        "name": l.name,
        "exclusive": false,
        "is_archived": false,
        "color": l.color,
        "description": l.description,
        "url": format!("{HTML_BASE}/api/v1/repos/{}/labels/{}", r.full_name(), l.id),
    })
}

/// The labels on an issue.
pub fn labels_of(r: &RepoRow, issue: &IssueRow) -> Value {
    Value::Array(
        r.label_rows(&issue.labels)
            .iter()
            .map(|l| label(r, l))
            .collect(),
    )
}

/// An issue object (also how PRs appear in issue and comment payloads).
pub fn issue(model: &Model, r: &RepoRow, i: &IssueRow) -> Value {
    let full = r.full_name();
    let kind = if i.pull.is_some() { "pulls" } else { "issues" };
    let pull_request = i.pull.as_ref().map(|p| {
        json!({
            "merged": p.merged,
            "merged_at": p.merged_at,
            "draft": i.is_draft(),
            "html_url": format!("{HTML_BASE}/{full}/pulls/{}", i.number),
        })
    });
    json!({
        "id": i.id,
        "url": format!("{HTML_BASE}/api/v1/repos/{full}/issues/{}", i.number),
        "html_url": format!("{HTML_BASE}/{full}/{kind}/{}", i.number),
        "number": i.number,
        "user": user(model, &i.user),
        "original_author": "",
        "original_author_id": 0,
        "title": i.title,
        "body": i.body,
        "ref": "",
        "assets": [],
        "labels": labels_of(r, i),
        "milestone": milestone(i),
        "assignee": null,
        "assignees": null,
        "state": i.state,
        "is_locked": false,
        "comments": r.comments.iter().filter(|c| c.number == i.number).count(),
        "created_at": i.created_at,
        "updated_at": i.updated_at,
        "closed_at": i.closed_at,
        "due_date": null,
        "pull_request": pull_request,
        "repository": {"id": r.id, "name": r.name, "owner": r.owner, "full_name": full},
        "pin_order": 0,
    })
}

/// A pull-request object; `i` must be a PR.
pub fn pull(model: &Model, r: &RepoRow, i: &IssueRow) -> Value {
    let p = i.pull.as_ref().expect("a pull request");
    let full = r.full_name();
    let html = format!("{HTML_BASE}/{full}/pulls/{}", i.number);
    let repo_json = repo(model, r);
    let base_sha = r.branches.get(&p.base_ref).cloned().unwrap_or_default();
    let (additions, deletions) = p
        .files
        .iter()
        .map(|f| f.counts())
        .fold((0, 0), |a, c| (a.0 + c.0, a.1 + c.1));
    let review_comments = r
        .review_comments
        .iter()
        .filter(|c| {
            r.reviews
                .iter()
                .any(|v| v.id == c.review_id && v.number == i.number)
        })
        .count();
    json!({
        "id": i.id,
        "url": html,
        "number": i.number,
        "user": user(model, &i.user),
        "title": i.title,
        "body": i.body,
        "labels": labels_of(r, i),
        "milestone": milestone(i),
        "assignee": null,
        "assignees": null,
        "requested_reviewers": [],
        "requested_reviewers_teams": [],
        "state": i.state,
        "draft": i.is_draft(),
        "is_locked": false,
        "comments": r.comments.iter().filter(|c| c.number == i.number).count(),
        "review_comments": review_comments,
        "additions": additions,
        "deletions": deletions,
        "changed_files": p.files.len(),
        "html_url": html,
        "diff_url": format!("{html}.diff"),
        "patch_url": format!("{html}.patch"),
        "mergeable": p.mergeable && !i.is_draft() && !p.merged,
        "merged": p.merged,
        "merged_at": p.merged_at,
        "merge_commit_sha": p.merge_commit_sha,
        "merged_by": p.merged_by.as_ref().map(|m| user(model, m)),
        "allow_maintainer_edit": false,
        "base": {"label": p.base_ref, "ref": p.base_ref, "sha": base_sha, "repo_id": r.id, "repo": repo_json},
        "head": {"label": p.head_ref, "ref": p.head_ref, "sha": p.head_sha, "repo_id": r.id, "repo": repo_json},
        "merge_base": if p.merge_base.is_empty() { base_sha.clone() } else { p.merge_base.clone() },
        "due_date": null,
        "created_at": i.created_at,
        "updated_at": i.updated_at,
        "closed_at": i.closed_at,
        "pin_order": 0,
        "flow": 0,
    })
}

/// A review object.
pub fn review(model: &Model, r: &RepoRow, v: &ReviewRow) -> Value {
    let full = r.full_name();
    json!({
        "id": v.id,
        "user": user(model, &v.user),
        "team": null,
        "state": v.state,
        "body": v.body,
        "commit_id": v.commit_id,
        "stale": v.stale,
        "official": v.official,
        "dismissed": v.dismissed,
        "comments_count": r.review_comments.iter().filter(|c| c.review_id == v.id).count(),
        "submitted_at": v.submitted_at,
        "updated_at": v.submitted_at,
        "html_url": format!("{HTML_BASE}/{full}/pulls/{}#issuecomment-{}", v.number, v.id),
        "pull_request_url": format!("{HTML_BASE}/{full}/pulls/{}", v.number),
    })
}

/// A comment object.
pub fn comment(model: &Model, r: &RepoRow, c: &CommentRow) -> Value {
    let full = r.full_name();
    let is_pull = r.issues.get(&c.number).is_some_and(|i| i.pull.is_some());
    let kind = if is_pull { "pulls" } else { "issues" };
    let parent = format!("{HTML_BASE}/{full}/{kind}/{}", c.number);
    json!({
        "id": c.id,
        "html_url": format!("{parent}#issuecomment-{}", c.id),
        "pull_request_url": if is_pull { parent.clone() } else { String::new() },
        "issue_url": if is_pull { String::new() } else { parent },
        "user": user(model, &c.user),
        "original_author": "",
        "original_author_id": 0,
        "body": c.body,
        "assets": [],
        "created_at": c.created_at,
        "updated_at": c.updated_at,
    })
}

/// A commit status object: the state is under the key `status`.
pub fn status(s: &StatusRow) -> Value {
    json!({
        "id": s.id,
        "status": s.state,
        "target_url": s.target_url,
        "description": s.description,
        "url": format!("{HTML_BASE}/api/v1/statuses/{}", s.sha),
        "context": s.context,
        "creator": {"id": 7, "login": "ci-bot"},
        "created_at": s.created_at,
        "updated_at": s.created_at,
    })
}

/// A changed-file object (`ChangedFile`), with links into the head commit.
pub fn changed_file(r: &RepoRow, f: &FileRow, head_sha: &str) -> Value {
    let full = r.full_name();
    let (additions, deletions) = f.counts();
    json!({
        "filename": f.filename,
        "previous_filename": f.previous_filename,
        "status": f.status,
        "additions": additions,
        "deletions": deletions,
        "changes": additions + deletions,
        "html_url": format!("{HTML_BASE}/{full}/src/commit/{head_sha}/{}", f.filename),
        "contents_url": format!("{HTML_BASE}/api/v1/repos/{full}/contents/{}?ref={head_sha}", f.filename),
        "raw_url": format!("{HTML_BASE}/{full}/raw/commit/{head_sha}/{}", f.filename),
    })
}

/// An inline review comment object (`PullReviewComment`).
pub fn review_comment(model: &Model, r: &RepoRow, number: u64, c: &ReviewCommentRow) -> Value {
    let full = r.full_name();
    json!({
        "id": c.id,
        "body": c.body,
        "user": user(model, &c.user),
        "resolver": null,
        "pull_request_review_id": c.review_id,
        "created_at": c.created_at,
        "updated_at": c.created_at,
        "path": c.path,
        "commit_id": c.commit_id,
        "original_commit_id": c.commit_id,
        "diff_hunk": c.diff_hunk,
        "position": c.line,
        "original_position": 0,
        "html_url": format!("{HTML_BASE}/{full}/pulls/{number}#issuecomment-{}", c.id),
        "pull_request_url": format!("{HTML_BASE}/{full}/pulls/{number}"),
    })
}

/// An issue's milestone as Forgejo's `Milestone` (v15 definition), or `null`.
fn milestone(i: &IssueRow) -> Value {
    let Some(title) = &i.milestone else {
        return Value::Null;
    };
    json!({
        "id": i.id + 10_000,
        "title": title,
        "description": "",
        "state": "open",
        "open_issues": 1,
        "closed_issues": 0,
        "created_at": i.created_at,
        "updated_at": i.updated_at,
        "closed_at": null,
        "due_on": null,
    })
}
