//! The fake Forgejo's state as plain data: repositories with their issues and PRs
//! (one numbering, as in Forgejo), labels, comments, reviews, commit statuses,
//! permissions, branch protection and merges. Handlers and test mutators both change
//! it through the methods here, so both see the same rules.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;

/// Current time as Forgejo prints it (RFC 3339, seconds).
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A deterministic fake 40-hex sha from a seed.
pub fn fake_sha(seed: u64) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut out = String::with_capacity(40);
    while out.len() < 40 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push_str(&format!("{x:016x}"));
    }
    out.truncate(40);
    out
}

/// A repository label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelRow {
    /// Label id (unique across the instance).
    pub id: i64,
    /// Name (Forgejo does not enforce uniqueness).
    pub name: String,
    /// Hex colour without `#`.
    pub color: String,
    /// Description.
    pub description: String,
}

/// PR-only data of an issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullData {
    /// Head branch.
    pub head_ref: String,
    /// Head sha.
    pub head_sha: String,
    /// Base branch.
    pub base_ref: String,
    /// No conflict and not checking (the API's `mergeable`, before the WIP rule).
    pub mergeable: bool,
    /// The merge itself runs into conflicts (409) although `mergeable` said yes.
    pub conflict_on_merge: bool,
    /// Merged.
    pub merged: bool,
    /// When.
    pub merged_at: Option<String>,
    /// Merge commit.
    pub merge_commit_sha: Option<String>,
    /// Merger.
    pub merged_by: Option<String>,
    /// The files the PR changes (its diff and `…/files` are made from them).
    pub files: Vec<FileRow>,
    /// The base commit the head is built on (the API's `merge_base`): the base's tip
    /// when the PR was opened or last updated onto it.
    pub merge_base: String,
}

/// One file a PR changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRow {
    /// Path in the head.
    pub filename: String,
    /// `added`, `deleted`, `changed` or `renamed`.
    pub status: String,
    /// Path before a rename.
    pub previous_filename: String,
    /// The hunks, `git diff` style (`@@ … @@` lines, then ` `, `+`, `-` lines).
    pub patch: String,
}

impl FileRow {
    /// A changed file with these hunks.
    pub fn changed(filename: &str, patch: &str) -> Self {
        Self {
            filename: filename.into(),
            status: "changed".into(),
            previous_filename: String::new(),
            patch: patch.into(),
        }
    }

    /// Lines added and deleted by the hunks.
    pub fn counts(&self) -> (u64, u64) {
        let count = |c: char| {
            self.patch
                .lines()
                .filter(|l| l.starts_with(c) && !l.starts_with("+++") && !l.starts_with("---"))
                .count() as u64
        };
        (count('+'), count('-'))
    }

    /// The file's part of the PR's diff, as `git diff` prints it.
    pub fn diff(&self, base_sha: &str, head_sha: &str) -> String {
        let old = if self.previous_filename.is_empty() {
            &self.filename
        } else {
            &self.previous_filename
        };
        let (from, to) = match self.status.as_str() {
            "added" => ("/dev/null".to_owned(), format!("b/{}", self.filename)),
            "deleted" => (format!("a/{old}"), "/dev/null".to_owned()),
            _ => (format!("a/{old}"), format!("b/{}", self.filename)),
        };
        let mut out = format!("diff --git a/{old} b/{}\n", self.filename);
        match self.status.as_str() {
            "added" => out.push_str("new file mode 100644\n"),
            "deleted" => out.push_str("deleted file mode 100644\n"),
            "renamed" => out.push_str(&format!("rename from {old}\nrename to {}\n", self.filename)),
            _ => {}
        }
        out.push_str(&format!(
            "index {}..{} 100644\n--- {from}\n+++ {to}\n",
            &base_sha[..7.min(base_sha.len())],
            &head_sha[..7.min(head_sha.len())]
        ));
        out.push_str(&self.patch);
        if !self.patch.ends_with('\n') {
            out.push('\n');
        }
        out
    }
}

/// An inline comment of a review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewCommentRow {
    /// Comment id.
    pub id: i64,
    /// The review it belongs to.
    pub review_id: i64,
    /// Author login.
    pub user: String,
    /// File.
    pub path: String,
    /// Line in the new version.
    pub line: u64,
    /// Body.
    pub body: String,
    /// The diff lines it is on.
    pub diff_hunk: String,
    /// The commit it was made on.
    pub commit_id: String,
    /// Posted.
    pub created_at: String,
}

/// An issue or pull request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueRow {
    /// Internal id.
    pub id: i64,
    /// Index in the repository.
    pub number: u64,
    /// Title (a `WIP:`/`[WIP]` prefix makes a PR a draft).
    pub title: String,
    /// Body.
    pub body: String,
    /// Author login.
    pub user: String,
    /// `open` or `closed`.
    pub state: String,
    /// Label ids on it, in the order added.
    pub labels: Vec<i64>,
    /// PR data; `None` for a plain issue.
    pub pull: Option<PullData>,
    /// Creation time.
    pub created_at: String,
    /// Last change.
    pub updated_at: String,
    /// When closed.
    pub closed_at: Option<String>,
    /// The milestone's title, when it has one.
    pub milestone: Option<String>,
}

impl IssueRow {
    /// True when the title carries Forgejo's default WIP prefix.
    pub fn is_draft(&self) -> bool {
        let t = self.title.to_ascii_uppercase();
        self.pull.is_some() && (t.starts_with("WIP:") || t.starts_with("[WIP]"))
    }
}

/// A conversation comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommentRow {
    /// Comment id.
    pub id: i64,
    /// Issue/PR number.
    pub number: u64,
    /// Author login.
    pub user: String,
    /// Markdown body.
    pub body: String,
    /// Created.
    pub created_at: String,
    /// Last edit.
    pub updated_at: String,
}

/// A formal review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewRow {
    /// Review id.
    pub id: i64,
    /// PR number.
    pub number: u64,
    /// Reviewer login.
    pub user: String,
    /// `APPROVED`, `REQUEST_CHANGES`, `COMMENT`, `REQUEST_REVIEW`, `PENDING`.
    pub state: String,
    /// Body.
    pub body: String,
    /// Head sha reviewed.
    pub commit_id: String,
    /// New commits since.
    pub stale: bool,
    /// Official reviewer (only the latest official review of a reviewer stays official).
    pub official: bool,
    /// Dismissed.
    pub dismissed: bool,
    /// Submitted.
    pub submitted_at: String,
}

/// One posted commit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusRow {
    /// Status id (increasing: a higher id is newer).
    pub id: i64,
    /// Commit sha.
    pub sha: String,
    /// `pending`, `success`, `error`, `failure`, `warning`.
    pub state: String,
    /// CI context.
    pub context: String,
    /// Description.
    pub description: String,
    /// Link.
    pub target_url: String,
    /// Posted.
    pub created_at: String,
}

/// Branch protection of the repository's base branches (one rule for all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protection {
    /// Official, undismissed approvals needed.
    pub required_approvals: u32,
    /// `enable_status_check` with these glob patterns (empty: all statuses must pass).
    pub status_checks: Option<Vec<String>>,
    /// Official change requests block the merge.
    pub block_on_rejected_reviews: bool,
    /// A push dismisses approvals.
    pub dismiss_stale_approvals: bool,
    /// Stale approvals do not count.
    pub ignore_stale_approvals: bool,
}

/// A merge Forgejo carried out.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeRecord {
    /// Repository `owner/name`.
    pub repo: String,
    /// PR number.
    pub number: u64,
    /// `Do`.
    pub style: String,
    /// `head_commit_id` as sent.
    pub head_commit_id: Option<String>,
    /// Head sha that was merged.
    pub merged_sha: String,
    /// The request body as sent.
    pub body: Value,
    /// The target branch's tip before the merge.
    pub tip_before: String,
    /// Its tip after (the head itself for a fast-forward).
    pub tip_after: String,
    /// Issues the merge closed (`Closes #N` in the PR body).
    pub closed_issues: Vec<u64>,
}

/// One repository.
#[derive(Debug, Clone, Default)]
pub struct RepoRow {
    /// Repository id.
    pub id: i64,
    /// Owner login.
    pub owner: String,
    /// Name.
    pub name: String,
    /// Default branch.
    pub default_branch: String,
    /// Branch tips.
    pub branches: BTreeMap<String, String>,
    /// Branches that may not be deleted (a 403 after merging with delete).
    pub protected_branches: HashSet<String>,
    /// Issues and PRs by number.
    pub issues: BTreeMap<u64, IssueRow>,
    /// Repository labels.
    pub labels: Vec<LabelRow>,
    /// Comments, in creation order.
    pub comments: Vec<CommentRow>,
    /// Label additions and removals (the timeline's `label` entries), in order.
    pub label_events: Vec<super::timeline::LabelEventRow>,
    /// Reviews, in submission order.
    pub reviews: Vec<ReviewRow>,
    /// Inline comments of reviews, in posting order.
    pub review_comments: Vec<ReviewCommentRow>,
    /// Commit statuses by sha, in posting order.
    pub statuses: HashMap<String, Vec<StatusRow>>,
    /// Collaborator permissions by login (`admin`, `write`, `read`, `none`).
    pub permissions: HashMap<String, String>,
    /// Branch protection.
    pub protection: Protection,
    /// The simulated CI (merge queue scenarios), if any.
    pub ci: Option<super::queue::SimCi>,
    /// Which PRs' changes each commit contains (the simulated CI's input).
    pub content: HashMap<String, std::collections::BTreeSet<u64>>,
    /// PRs whose update onto the base conflicts (409).
    pub update_conflicts: HashSet<u64>,
    /// Updates change the PR's diff (reviews go stale; dismissed under protection).
    pub updates_change_diff: bool,
    /// `allow_fast_forward_only_merge` is off.
    pub no_fast_forward: bool,
    /// `allow_rebase_update` is off: a `style=rebase` update is refused (403, no body).
    pub no_rebase_update: bool,
    /// Every update done: (PR, old head, new head, the tip it was built on).
    pub updates: Vec<(u64, String, String, String)>,
    /// Branches made through the API → the commit they were made at (the merge base
    /// of a PR from such a branch).
    pub made_at: HashMap<String, String>,
    /// The parents of each merge commit the fake made (`[base tip, head]`): enough of
    /// the commit graph for "the tip is an ancestor of the head" of a fast-forward
    /// from a branch made at an intermediate commit of a batch branch.
    pub parents: HashMap<String, Vec<String>>,
    /// The repository does not allow `manually-merged` (`allow_manual_merge` off).
    pub no_manual_merge: bool,
}

impl RepoRow {
    /// Whether `ancestor` is `commit` or reachable from it through [`Self::parents`].
    pub fn is_ancestor(&self, ancestor: &str, commit: &str) -> bool {
        let mut seen = std::collections::HashSet::new();
        let mut todo = vec![commit.to_owned()];
        while let Some(c) = todo.pop() {
            if c == ancestor {
                return true;
            }
            if seen.insert(c.clone()) {
                todo.extend(self.parents.get(&c).into_iter().flatten().cloned());
            }
        }
        false
    }

    /// `owner/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.owner, self.name)
    }

    /// The labels with these ids, as rows.
    pub fn label_rows(&self, ids: &[i64]) -> Vec<LabelRow> {
        ids.iter()
            .filter_map(|id| self.labels.iter().find(|l| l.id == *id).cloned())
            .collect()
    }

    /// Latest status per context for `sha`, oldest context first.
    pub fn latest_statuses(&self, sha: &str) -> Vec<StatusRow> {
        let mut latest: BTreeMap<String, StatusRow> = BTreeMap::new();
        for s in self.statuses.get(sha).into_iter().flatten() {
            latest.insert(s.context.clone(), s.clone());
        }
        let mut out: Vec<StatusRow> = latest.into_values().collect();
        out.sort_by_key(|s| s.id);
        out
    }

    /// A user's permission: explicit, else `admin` for the owner, else `read`.
    pub fn permission_of(&self, login: &str) -> String {
        if let Some(p) = self.permissions.get(&login.to_lowercase()) {
            return p.clone();
        }
        if login.eq_ignore_ascii_case(&self.owner) {
            "owner".into()
        } else {
            "read".into()
        }
    }
}

/// Forgejo's combined state (error < failure < warning < pending < success; error
/// shown as failure; `""` for none), computed independently of the client's version.
pub fn combined_state(statuses: &[StatusRow]) -> &'static str {
    const ORDER: [&str; 5] = ["error", "failure", "warning", "pending", "success"];
    let worst = statuses
        .iter()
        .filter_map(|s| ORDER.iter().position(|o| *o == s.state))
        .min();
    match worst {
        None => "",
        Some(0) | Some(1) => "failure",
        Some(i) => ORDER[i],
    }
}

/// Glob match with `*` (any run) and `?` (one character), as protection contexts use.
pub fn glob(pattern: &str, text: &str) -> bool {
    fn go(p: &[char], t: &[char]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some(('*', rest)) => (0..=t.len()).any(|i| go(rest, &t[i..])),
            Some(('?', rest)) => !t.is_empty() && go(rest, &t[1..]),
            Some((c, rest)) => t.first() == Some(c) && go(rest, &t[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    go(&p, &t)
}

/// The whole fake instance.
#[derive(Debug, Default)]
pub struct Model {
    /// Next id for anything with an id (labels, comments, reviews, statuses, issues).
    pub next_id: i64,
    /// Repositories by `owner/name`.
    pub repos: BTreeMap<String, RepoRow>,
    /// Every merge done, in order.
    pub merges: Vec<MergeRecord>,
    /// Users by login → id (assigned on first sight).
    pub users: BTreeMap<String, i64>,
    /// The version, Actions runs, jobs and logs.
    pub actions: super::actions::Actions,
    /// Issue dependencies: `(repo, blocker, blocked)` (blocked depends on blocker).
    pub dependencies: Vec<(String, u64, u64)>,
}

impl Model {
    /// A fresh id.
    pub fn id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }

    /// The id of a user, assigned on first sight.
    pub fn user_id(&mut self, login: &str) -> i64 {
        if let Some(id) = self.users.get(login) {
            return *id;
        }
        let id = 1000 + self.users.len() as i64;
        self.users.insert(login.to_owned(), id);
        id
    }

    /// The repository, created (branch `main`) when missing.
    pub fn repo_mut(&mut self, full: &str) -> &mut RepoRow {
        if !self.repos.contains_key(full) {
            let id = self.id();
            let (owner, name) = full.split_once('/').expect("repository as owner/name");
            self.user_id(owner);
            let mut repo = RepoRow {
                id,
                owner: owner.into(),
                name: name.into(),
                default_branch: "main".into(),
                ..RepoRow::default()
            };
            repo.branches.insert("main".into(), fake_sha(id as u64));
            self.repos.insert(full.to_owned(), repo);
        }
        self.repos.get_mut(full).expect("just inserted")
    }

    /// A repository label by name, created with `color` when missing; returns its id.
    pub fn ensure_label(&mut self, repo: &str, name: &str, color: &str) -> i64 {
        if let Some(l) = self.repo_mut(repo).labels.iter().find(|l| l.name == name) {
            return l.id;
        }
        let id = self.id();
        self.repo_mut(repo).labels.push(LabelRow {
            id,
            name: name.into(),
            color: color.trim_start_matches('#').into(),
            description: String::new(),
        });
        id
    }

    /// Opens an issue or PR; returns its number.
    pub fn open_issue(
        &mut self,
        repo: &str,
        user: &str,
        title: &str,
        body: &str,
        pull: Option<PullData>,
    ) -> u64 {
        let id = self.id();
        self.user_id(user);
        let r = self.repo_mut(repo);
        let number = r.issues.keys().next_back().copied().unwrap_or(0) + 1;
        if let Some(p) = &pull {
            r.branches.insert(p.head_ref.clone(), p.head_sha.clone());
            if !r.branches.contains_key(&p.base_ref) {
                r.branches
                    .insert(p.base_ref.clone(), fake_sha(id as u64 + 7));
            }
        }
        let t = now();
        r.issues.insert(
            number,
            IssueRow {
                id,
                number,
                title: title.into(),
                body: body.into(),
                user: user.into(),
                state: "open".into(),
                labels: Vec::new(),
                pull,
                created_at: t.clone(),
                updated_at: t,
                closed_at: None,
                milestone: None,
            },
        );
        number
    }

    /// Moves a PR's head: earlier reviews become stale (and approvals dismissed when
    /// protection says so).
    pub fn push(&mut self, repo: &str, number: u64, sha: &str) {
        let r = self.repo_mut(repo);
        let dismiss = r.protection.dismiss_stale_approvals;
        let issue = r.issues.get_mut(&number).expect("no such PR");
        let pull = issue.pull.as_mut().expect("not a PR");
        pull.head_sha = sha.into();
        let head_ref = pull.head_ref.clone();
        issue.updated_at = now();
        let old = r.branches.insert(head_ref, sha.into()).unwrap_or_default();
        for review in r.reviews.iter_mut().filter(|x| x.number == number) {
            if review.commit_id != sha {
                review.stale = true;
                if dismiss && review.state == "APPROVED" {
                    review.dismissed = true;
                }
            }
        }
        // New commits on the old head: the same PRs' changes.
        let content = super::queue::content_of(r, &old);
        r.content.insert(sha.to_owned(), content);
        super::queue::start_ci(self, repo, number, sha);
    }

    /// Records a review on the PR's current head. Approvals and change requests by
    /// writers are official, and an official review makes the same reviewer's earlier
    /// reviews unofficial, as Forgejo does.
    pub fn add_review(&mut self, repo: &str, number: u64, user: &str, state: &str) -> i64 {
        let head = self.repo_mut(repo).issues[&number]
            .pull
            .as_ref()
            .expect("not a PR")
            .head_sha
            .clone();
        self.submit_review(repo, number, user, state, "", &head)
    }

    /// Records a review with `body` on `commit_id` (as `POST …/reviews` does: the
    /// commit may be an older one; the review is stale when it is not the head).
    pub fn submit_review(
        &mut self,
        repo: &str,
        number: u64,
        user: &str,
        state: &str,
        body: &str,
        commit_id: &str,
    ) -> i64 {
        let id = self.id();
        self.user_id(user);
        let r = self.repo_mut(repo);
        let head = r.issues[&number]
            .pull
            .as_ref()
            .expect("not a PR")
            .head_sha
            .clone();
        let stale = commit_id != head;
        // Only approvals and change requests can be official, and only from writers
        // (users without an explicit permission count as writers here).
        let writer = r
            .permissions
            .get(&user.to_lowercase())
            .is_none_or(|p| matches!(p.as_str(), "write" | "admin" | "owner"));
        let official = writer && matches!(state, "APPROVED" | "REQUEST_CHANGES");
        if official {
            for old in r.reviews.iter_mut() {
                if old.number == number && old.user == user {
                    old.official = false;
                }
            }
        }
        r.reviews.push(ReviewRow {
            id,
            number,
            user: user.into(),
            state: state.into(),
            body: body.into(),
            commit_id: commit_id.into(),
            stale,
            official,
            dismissed: false,
            submitted_at: now(),
        });
        // Forgejo stores a submitted review as a comment of type `review`, and creating
        // any comment sets the issue's `updated_unix` (models/issues/comment.go,
        // `updateCommentInfos`).
        self.touch(repo, number);
        id
    }

    /// Posts a commit status; returns its id.
    pub fn add_status(
        &mut self,
        repo: &str,
        sha: &str,
        context: &str,
        state: &str,
        description: &str,
    ) -> i64 {
        let id = self.id();
        self.repo_mut(repo)
            .statuses
            .entry(sha.to_owned())
            .or_default()
            .push(StatusRow {
                id,
                sha: sha.into(),
                state: state.into(),
                context: context.into(),
                description: description.into(),
                target_url: format!("https://ci.example/{id}"),
                created_at: now(),
            });
        id
    }

    /// Adds a comment; returns its id.
    pub fn add_comment(&mut self, repo: &str, number: u64, user: &str, body: &str) -> i64 {
        let id = self.id();
        self.user_id(user);
        let t = now();
        self.repo_mut(repo).comments.push(CommentRow {
            id,
            number,
            user: user.into(),
            body: body.into(),
            created_at: t.clone(),
            updated_at: t,
        });
        self.touch(repo, number);
        id
    }

    /// Adds an inline comment by the review's author to review `review_id`, on
    /// `path` line `line`; returns its id.
    pub fn add_review_comment(
        &mut self,
        repo: &str,
        review_id: i64,
        path: &str,
        line: u64,
        body: &str,
    ) -> i64 {
        let id = self.id();
        let r = self.repo_mut(repo);
        let review = r
            .reviews
            .iter()
            .find(|v| v.id == review_id)
            .expect("no such review")
            .clone();
        r.review_comments.push(ReviewCommentRow {
            id,
            review_id,
            user: review.user,
            path: path.into(),
            line,
            body: body.into(),
            diff_hunk: format!("@@ -{line},1 +{line},1 @@"),
            commit_id: review.commit_id,
            created_at: now(),
        });
        id
    }

    /// Marks issue or PR `number` as just changed (`updated_at`), as Forgejo does on
    /// label, title and comment changes and submitted reviews (each creates a comment);
    /// not on comment edits, commit statuses or a review changed in place.
    pub fn touch(&mut self, repo: &str, number: u64) {
        if let Some(issue) = self.repo_mut(repo).issues.get_mut(&number) {
            issue.updated_at = now();
        }
    }

    /// Closes an issue or PR (without merging).
    pub fn close(&mut self, repo: &str, number: u64) {
        let issue = self
            .repo_mut(repo)
            .issues
            .get_mut(&number)
            .expect("no such issue");
        issue.state = "closed".into();
        issue.closed_at = Some(now());
        issue.updated_at = now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("ci/*", "ci/build"));
        assert!(glob("*", ""));
        assert!(glob("a?c", "abc"));
        assert!(!glob("ci/*", "cd/build"));
    }
}
