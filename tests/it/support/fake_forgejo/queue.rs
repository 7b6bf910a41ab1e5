//! What the merge queue needs of the fake, as Forgejo v15 does it
//! (forgejo-facts.md §4, the v15 API definition):
//!
//! - `POST …/pulls/{n}/update?style=merge|rebase`: 404 missing, 422 closed or merged,
//!   409 when the base does not apply cleanly (`conflict_on_update`), **500 with an
//!   empty message when the PR is already built on the tip** ("up to date" is not
//!   mapped), else 200: a new head sha built on the tip, and the `pull_request_sync`
//!   webhook with the bot as sender (in the outbox). Approvals are dismissed on it
//!   only when the update changes the PR's diff (`updates_change_diff`, e.g. a rebase
//!   that resolves differently) and protection `dismiss_stale_approvals` is on.
//! - `GET …/branches/{branch}`: the tip (`commit.id`), which merges move.
//! - a simulated CI ([`SimCi`]): every new head of a PR gets a `pending` status at
//!   once and its result after a fixed duration, with an `action_run_*` webhook; the
//!   result depends on what the commit contains (which PRs' changes), so a PR can
//!   break CI only on top of another one.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::model::{Model, RepoRow, fake_sha, now};
use super::payloads::{self, Webhook};
use super::routes::Reply;

/// A CI that passes or fails by the content of the commit, after `duration`.
#[derive(Debug, Clone)]
pub struct SimCi {
    /// The status context it posts.
    pub context: String,
    /// How long a run takes.
    pub duration: Duration,
    /// `(a, b)`: a commit with the changes of both PR `a` and PR `b` fails, until PR
    /// `a` is fixed ([`super::FakeForgejo::push_fix`]).
    pub breaks: Vec<(u64, u64)>,
    /// PRs whose breakage was fixed.
    pub fixed: BTreeSet<u64>,
    /// Flaky runs: the next run on a commit holding exactly one of these sets of PRs'
    /// changes fails though nothing is broken (once per set).
    pub flake_once: Vec<BTreeSet<u64>>,
    /// Random flaky runs (the benchmark's failure model, `sim_failures`).
    pub flaky: Option<super::sim_failures::Flaky>,
    /// Runs not finished yet.
    pub runs: Vec<Run>,
    /// Every run finished: (sha, green).
    pub finished: Vec<(String, bool)>,
}

impl SimCi {
    /// A CI posting `context` after `duration`.
    pub fn new(context: &str, duration: Duration) -> SimCi {
        SimCi {
            context: context.into(),
            duration,
            breaks: Vec::new(),
            fixed: BTreeSet::new(),
            flake_once: Vec::new(),
            flaky: None,
            runs: Vec::new(),
            finished: Vec::new(),
        }
    }
}

/// One CI run in progress.
#[derive(Debug, Clone)]
pub struct Run {
    /// The commit.
    pub sha: String,
    /// The PR it runs for.
    pub pr: u64,
    /// When it finishes.
    pub due: Instant,
    /// Its result.
    pub green: bool,
}

/// The PRs whose changes commit `sha` contains (empty for an unknown commit).
pub fn content_of(r: &RepoRow, sha: &str) -> BTreeSet<u64> {
    r.content.get(sha).cloned().unwrap_or_default()
}

/// Starts a CI run on PR `pr`'s new head `sha` (nothing without a simulated CI).
pub fn start_ci(model: &mut Model, repo: &str, pr: u64, sha: &str) {
    let id = model.id();
    let r = model.repo_mut(repo);
    let content = content_of(r, sha);
    let Some(ci) = r.ci.as_mut() else {
        return;
    };
    let mut green = !ci
        .breaks
        .iter()
        .any(|(a, b)| content.contains(a) && content.contains(b) && !ci.fixed.contains(a));
    if let Some(i) = ci.flake_once.iter().position(|set| *set == content) {
        ci.flake_once.remove(i);
        green = false;
    }
    if super::sim_failures::flaky_run(ci) {
        green = false;
    }
    ci.runs.push(Run {
        sha: sha.into(),
        pr,
        due: Instant::now() + ci.duration,
        green,
    });
    let context = ci.context.clone();
    r.statuses
        .entry(sha.to_owned())
        .or_default()
        .push(super::model::StatusRow {
            id,
            sha: sha.into(),
            state: "pending".into(),
            context,
            description: "Running".into(),
            target_url: format!("https://ci.example/{id}"),
            created_at: now(),
        });
}

/// Finishes the runs that are due: their statuses, and the `action_run_*` webhooks
/// Forgejo Actions sends (sender: the PR's author, as for a run its push triggered).
pub fn finish_due_runs(model: &mut Model) -> Vec<Webhook> {
    let mut done = Vec::new();
    for (name, r) in model.repos.iter_mut() {
        let Some(ci) = r.ci.as_mut() else { continue };
        let now_i = Instant::now();
        let (due, rest): (Vec<Run>, Vec<Run>) = ci.runs.drain(..).partition(|x| x.due <= now_i);
        ci.runs = rest;
        for run in due {
            ci.finished.push((run.sha.clone(), run.green));
            done.push((name.clone(), ci.context.clone(), run));
        }
    }
    let mut hooks = Vec::new();
    for (repo, context, run) in done {
        let state = if run.green { "success" } else { "failure" };
        let desc = if run.green {
            "Successful"
        } else {
            "Failing: tests failed"
        };
        model.add_status(&repo, &run.sha, &context, state, desc);
        let run_id = model.id();
        hooks.push(payloads::action_run(
            model,
            &repo,
            &run.sha,
            state,
            Some(run.pr),
            run_id,
        ));
    }
    hooks
}

/// `POST …/pulls/{n}/update?style=…` by the bot.
pub fn update(model: &mut Model, repo: &str, n: u64, query: &[(String, String)]) -> Reply {
    let style = query
        .iter()
        .find(|(k, _)| k == "style")
        .map_or("merge", |(_, v)| v.as_str());
    if !matches!(style, "merge" | "rebase" | "") {
        return Reply::error(422, "[style]: In");
    }
    let seed = model.id() as u64;
    let r = model.repo_mut(repo);
    let Some(issue) = r.issues.get(&n).filter(|i| i.pull.is_some()) else {
        return Reply::not_found();
    };
    let pull = issue.pull.clone().expect("a PR");
    if pull.merged || issue.state == "closed" {
        return Reply::error(422, "PR is closed or merged");
    }
    // routers/api/v1/repo/pull.go UpdatePullRequest: `IsUserAllowedToUpdate` says no
    // rebase update when the repository's `allow_rebase_update` is off → a bare 403,
    // before the update (and its "up to date" check) is tried.
    if style == "rebase" && r.no_rebase_update {
        return Reply::empty(403);
    }
    let tip = r.branches.get(&pull.base_ref).cloned().unwrap_or_default();
    if pull.merge_base == tip {
        // services/pull/update.go: "up to date" comes back as a plain error → 500.
        return Reply::error(500, "");
    }
    if r.update_conflicts.contains(&n) {
        return Reply::error(409, "merge conflict");
    }
    let head = fake_sha(seed + 3_000_000);
    let mut content = content_of(r, &pull.head_sha);
    content.extend(content_of(r, &tip));
    r.content.insert(head.clone(), content);
    r.updates
        .push((n, pull.head_sha.clone(), head.clone(), tip.clone()));
    let dismiss = r.updates_change_diff && r.protection.dismiss_stale_approvals;
    let stale = r.updates_change_diff;
    r.branches.insert(pull.head_ref.clone(), head.clone());
    let issue = r.issues.get_mut(&n).expect("checked");
    let p = issue.pull.as_mut().expect("checked");
    p.head_sha = head.clone();
    p.merge_base = tip;
    issue.updated_at = now();
    for review in r.reviews.iter_mut().filter(|x| x.number == n) {
        if stale && review.commit_id != head {
            review.stale = true;
            if dismiss && review.state == "APPROVED" {
                review.dismissed = true;
            }
        }
    }
    start_ci(model, repo, n, &head);
    Reply::empty(200)
}

/// `GET …/branches/{branch…}`: Forgejo's `Branch`.
pub fn branch(model: &Model, repo: &str, name: &str) -> Reply {
    let r = &model.repos[repo];
    let Some(sha) = r.branches.get(name) else {
        return Reply::error(404, "branch does not exist");
    };
    Reply::json(
        200,
        json!({
            "name": name,
            "commit": {
                "id": sha,
                "message": "tip\n",
                "url": format!("https://forgejo.test/{repo}/commit/{sha}"),
                "author": {"name": "someone", "email": "someone@example.org", "username": "someone"},
                "committer": {"name": "someone", "email": "someone@example.org", "username": "someone"},
                "verification": null,
                "timestamp": now(),
                "added": null,
                "removed": null,
                "modified": null,
            },
            "protected": r.protected_branches.contains(name),
            "required_approvals": r.protection.required_approvals,
            "enable_status_check": r.protection.status_checks.is_some(),
            "status_check_contexts": r.protection.status_checks.clone().unwrap_or_default(),
            "user_can_push": true,
            "user_can_merge": true,
            "effective_branch_protection_name": "",
        }),
    )
}

/// The repository object with the repository's own fast-forward and rebase-update
/// settings.
pub fn repo(model: &Model, repo: &str) -> Reply {
    let r = &model.repos[repo];
    let mut v: Value = super::render::repo(model, r);
    v["allow_fast_forward_only_merge"] = (!r.no_fast_forward).into();
    v["allow_rebase_update"] = (!r.no_rebase_update).into();
    Reply::json(200, v)
}
