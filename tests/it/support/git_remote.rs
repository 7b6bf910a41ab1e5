//! A real git repository behind the fake Forgejo: a bare repository the agents clone
//! (`SHEPHERD_AGENT_CLONE_URL=file://…`) and push to, and [`GitRemote::sync`], which
//! does what Forgejo does after a push (`services/repository/push.go`: the branch is
//! updated, and each open PR whose head branch it is gets its new head and a
//! `pull_request` `synchronized` delivery, `services/pull/pull.go`
//! `AddTestPullRequestTask`): it copies the bare repository's branch tips into the
//! fake's model and returns the webhooks for the test to deliver.
//!
//! Forgejo does this asynchronously after the push returns, so an agent that opens a PR
//! for a branch it just pushed may find the branch missing for a moment; the test agent
//! waits for `GET /repos/{owner}/{repo}/branches/{branch}` as a careful client would.

use std::path::{Path, PathBuf};

use super::fake_forgejo::FakeForgejo;
use super::fake_forgejo::payloads::Webhook;

/// The bare repository of one fake repository.
pub struct GitRemote {
    /// The bare repository.
    pub bare: PathBuf,
    /// `owner/name` in the fake.
    pub repo: String,
}

/// Runs git in `dir`; panics with git's error output when it fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

impl GitRemote {
    /// Creates `<root>/git/<owner>/<name>.git` with one commit on `main` (its `HEAD`),
    /// and makes that commit `main`'s tip in the fake. The clone URL template for the
    /// runner is [`GitRemote::clone_url`].
    pub fn create(root: &Path, fake: &FakeForgejo, repo: &str) -> Self {
        let bare = root.join(format!("git/{repo}.git"));
        std::fs::create_dir_all(&bare).expect("bare dir");
        git(&bare, &["init", "-q", "--bare", "--initial-branch=main"]);
        let seed = root.join(format!("seed/{repo}"));
        std::fs::create_dir_all(&seed).expect("seed dir");
        git(&seed, &["init", "-q", "--initial-branch=main"]);
        std::fs::write(seed.join("README"), "widgets\n").expect("README");
        git(&seed, &["add", "README"]);
        commit(&seed, "the first commit");
        let url = format!("file://{}", bare.display());
        git(&seed, &["push", "-q", &url, "HEAD:refs/heads/main"]);
        let remote = Self {
            bare,
            repo: repo.to_owned(),
        };
        let main = remote.tip("main").expect("main was pushed");
        fake.with_model(|m| m.repo_mut(repo).branches.insert("main".into(), main));
        remote
    }

    /// `SHEPHERD_AGENT_CLONE_URL` for this remote (`{owner}`/`{repo}` filled by the
    /// runner).
    pub fn clone_url(root: &Path) -> String {
        format!("file://{}/git/{{owner}}/{{repo}}.git", root.display())
    }

    /// Makes a commit adding `file` on a new branch `branch` off `main` and pushes it;
    /// returns the commit's sha. The fake learns it at the next [`GitRemote::sync`].
    pub fn branch_with(&self, branch: &str, file: &str, text: &str) -> String {
        let work = self.bare.with_extension(format!("work-{branch}"));
        let url = format!("file://{}", self.bare.display());
        git(
            self.bare.parent().expect("parent"),
            &["clone", "-q", &url, &work.display().to_string()],
        );
        git(&work, &["checkout", "-q", "-b", branch]);
        std::fs::write(work.join(file), text).expect("write the file");
        git(&work, &["add", file]);
        commit(&work, &format!("add {file}"));
        git(
            &work,
            &["push", "-q", "origin", &format!("HEAD:refs/heads/{branch}")],
        );
        git(&work, &["rev-parse", "HEAD"])
    }

    /// The tip of `branch` in the bare repository.
    pub fn tip(&self, branch: &str) -> Option<String> {
        let out = std::process::Command::new("git")
            .args([
                "rev-parse",
                "--verify",
                "-q",
                &format!("refs/heads/{branch}"),
            ])
            .current_dir(&self.bare)
            .output()
            .expect("run git");
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Every branch of the bare repository with its tip.
    pub fn branches(&self) -> Vec<(String, String)> {
        git(
            &self.bare,
            &[
                "for-each-ref",
                "--format=%(refname:short) %(objectname)",
                "refs/heads",
            ],
        )
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(b, s)| (b.to_owned(), s.to_owned()))
        .collect()
    }

    /// Forgejo's handling of the pushes since the last call: every branch whose tip
    /// moved is updated in the fake; each open PR on it gets the new head, and a
    /// `synchronized` webhook with `pusher` as its sender is returned.
    pub fn sync(&self, fake: &FakeForgejo, pusher: &str) -> Vec<Webhook> {
        let mut moved_prs = Vec::new();
        for (branch, sha) in self.branches() {
            let (known, prs) = fake.with_model(|m| {
                let r = m.repo_mut(&self.repo);
                let known = r.branches.get(&branch).cloned();
                let prs: Vec<u64> = r
                    .issues
                    .values()
                    .filter(|i| i.state == "open")
                    .filter(|i| i.pull.as_ref().is_some_and(|p| p.head_ref == branch))
                    .map(|i| i.number)
                    .collect();
                (known, prs)
            });
            if known.as_deref() == Some(sha.as_str()) {
                continue;
            }
            if prs.is_empty() {
                fake.with_model(|m| m.repo_mut(&self.repo).branches.insert(branch, sha));
                continue;
            }
            for n in prs {
                fake.push(&self.repo, n, &sha);
                moved_prs.push(n);
            }
        }
        moved_prs
            .into_iter()
            .map(|n| fake.pr_synchronized(&self.repo, n, pusher))
            .collect()
    }

    /// The author (`name <email>`) and subject of `rev`'s commit.
    pub fn commit_of(&self, rev: &str) -> (String, String) {
        let out = git(&self.bare, &["log", "-1", "--format=%an <%ae>%n%s", rev]);
        let (author, subject) = out.split_once('\n').unwrap_or((&out, ""));
        (author.to_owned(), subject.to_owned())
    }
}

/// Commits the index in `dir` as the test's own user.
fn commit(dir: &Path, message: &str) {
    git(
        dir,
        &[
            "-c",
            "user.name=seed",
            "-c",
            "user.email=seed@example.org",
            "commit",
            "-qm",
            message,
        ],
    );
}
