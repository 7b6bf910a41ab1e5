//! A stateful fake Forgejo for tests, served over real HTTP on 127.0.0.1 by a small
//! actix-web app, so the real reqwest client runs against it.
//!
//! ```text
//! model.rs        the state as plain data and the rules that change it
//! render.rs       Forgejo's JSON shapes of that state
//! routes*.rs      /api/v1/… with real paths, fields, pagination and status codes
//! api_log.rs      the call log as the Forgejo API checker reads it, and the check
//! merge.rs        POST …/merge as Forgejo decides it (405/409/404/403/200)
//! reviews.rs      POST …/pulls/{n}/reviews by any user, as Forgejo decides it (422/404/200)
//! faults.rs       failure injection rules and the call log
//! payloads.rs     webhook payloads for model changes
//! queue.rs        the merge queue's parts: PR update, branch tips, simulated CI
//! ```
//!
//! Tests change the model with the mutators below ([`FakeForgejo::open_pr`],
//! [`FakeForgejo::push`], [`FakeForgejo::set_status`], …), build the matching webhook
//! with the payload builders, and assert on [`FakeForgejo::calls`] and the model.

pub mod actions;
mod api_log;
pub mod batch;
mod dependencies;
pub mod faults;
mod merge;
pub mod model;
mod outbox;
pub mod payloads;
pub mod queue;
mod render;
mod reviews;
mod routes;
mod routes_context;
mod routes_repo;
pub mod sim_failures;
mod timeline;

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpServer, web};

pub use faults::{Call, Fault};
pub use merge::closing_refs;
pub use model::{
    CommentRow, FileRow, IssueRow, LabelRow, MergeRecord, Model, Protection, ReviewRow,
};
use model::{PullData, fake_sha, glob};
pub use payloads::Webhook;
use routes::{Shared, lock};

/// Token the fake accepts by default.
pub const TOKEN: &str = "fake-forgejo-token-0123456789";
/// Login of the token's user (the bot) by default.
pub const BOT: &str = "shepherd-bot";

/// A new pull request for [`FakeForgejo::open_pr`]; fields not set get defaults
/// (head `feature-N` at a fresh sha, base `main`, mergeable).
#[derive(Debug, Clone)]
pub struct NewPr {
    /// Author login.
    pub author: String,
    /// Title (a `WIP:` prefix makes it a draft).
    pub title: String,
    /// Body.
    pub body: String,
    /// Head sha (default: a fresh fake sha).
    pub head_sha: Option<String>,
    /// Head branch (default `feature-<number>`).
    pub head_ref: Option<String>,
    /// Base branch.
    pub base_ref: String,
    /// Labels (created when missing).
    pub labels: Vec<String>,
}

impl NewPr {
    /// A PR by `author` titled `title`.
    pub fn new(author: &str, title: &str) -> Self {
        Self {
            author: author.into(),
            title: title.into(),
            body: String::new(),
            head_sha: None,
            head_ref: None,
            base_ref: "main".into(),
            labels: Vec::new(),
        }
    }

    /// Sets the body.
    pub fn body(mut self, body: &str) -> Self {
        self.body = body.into();
        self
    }

    /// Sets the head sha.
    pub fn head_sha(mut self, sha: &str) -> Self {
        self.head_sha = Some(sha.into());
        self
    }

    /// Sets the head branch.
    pub fn head_ref(mut self, r: &str) -> Self {
        self.head_ref = Some(r.into());
        self
    }

    /// Sets the base branch.
    pub fn base_ref(mut self, r: &str) -> Self {
        self.base_ref = r.into();
        self
    }

    /// Adds a label.
    pub fn label(mut self, name: &str) -> Self {
        self.labels.push(name.into());
        self
    }
}

/// A running fake Forgejo. Dropping it stops the server.
pub struct FakeForgejo {
    /// State shared with the server.
    shared: Arc<Shared>,
    /// Port it listens on (kept across restarts).
    port: u16,
    /// The running server, `None` while connections are refused.
    server: Mutex<Option<ServerHandle>>,
}

impl FakeForgejo {
    /// Starts a fake with the default token and bot login on a free port.
    pub async fn start() -> Self {
        Self::start_with(TOKEN, BOT).await
    }

    /// Starts a fake accepting `token`, which belongs to the user `bot_login`.
    pub async fn start_with(token: &str, bot_login: &str) -> Self {
        let shared = Arc::new(Shared {
            model: Mutex::new(Model::default()),
            faults: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
            token: token.to_owned(),
            bot_login: bot_login.to_owned(),
            user_tokens: Mutex::new(Vec::new()),
            token_scopes: Mutex::new(Vec::new()),
            outbox: Mutex::new(Vec::new()),
        });
        lock(&shared.model).user_id(bot_login);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = listener.local_addr().expect("local addr").port();
        let handle = serve(shared.clone(), listener);
        Self {
            shared,
            port,
            server: Mutex::new(Some(handle)),
        }
    }

    /// Base URL (the client appends `/api/v1`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The accepted API token.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// Accepts `token` as the user `login` too (a reviewer agent's own token).
    pub fn add_user_token(&self, login: &str, token: &str) {
        lock(&self.shared.user_tokens).push((token.to_owned(), login.to_owned()));
        self.with_model(|m| m.user_id(login));
    }

    /// Limits `token` to `scopes` (`read:repository`, `write:issue`, `all`, …): a
    /// route of another scope category answers Forgejo's 403. Tokens never limited
    /// have every scope.
    pub fn limit_token_scopes(&self, token: &str, scopes: &[&str]) {
        lock(&self.shared.token_scopes).push((
            token.to_owned(),
            scopes.iter().map(|s| (*s).to_owned()).collect(),
        ));
    }

    /// The bot's login (the token's user).
    pub fn bot_login(&self) -> &str {
        &self.shared.bot_login
    }

    /// Stops the server: connections are refused until [`Self::accept_connections`].
    pub async fn refuse_connections(&self) {
        let handle = lock(&self.server).take();
        if let Some(h) = handle {
            h.stop(false).await;
        }
        // The stop completes before the listener and the workers' connections are
        // closed: wait until a fresh connection is really refused.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "the fake still accepts connections on port {}",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Serves again on the same port, with the same model.
    pub async fn accept_connections(&self) {
        if lock(&self.server).is_some() {
            return;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(l) => break l,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("cannot rebind port {}: {e}", self.port),
            }
        };
        *lock(&self.server) = Some(serve(self.shared.clone(), listener));
    }

    /// Runs `f` on the model (for anything the helpers below do not cover).
    pub fn with_model<T>(&self, f: impl FnOnce(&mut Model) -> T) -> T {
        f(&mut lock(&self.shared.model))
    }

    // ---- failure injection -------------------------------------------------------

    /// Adds a fault rule (first matching rule wins).
    pub fn inject(&self, fault: Fault) {
        lock(&self.shared.faults).push(fault);
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        lock(&self.shared.faults).clear();
    }

    // ---- call log ----------------------------------------------------------------

    /// Every request so far.
    pub fn all_calls(&self) -> Vec<Call> {
        lock(&self.shared.calls).clone()
    }

    /// Requests with this method (`"*"`: any) and path (below `/api/v1`; `*` in the
    /// path matches any run of characters).
    pub fn calls(&self, method: &str, path: &str) -> Vec<Call> {
        lock(&self.shared.calls)
            .iter()
            .filter(|c| {
                (method == "*" || c.method.eq_ignore_ascii_case(method)) && glob(path, &c.path)
            })
            .cloned()
            .collect()
    }

    /// Requests that changed something (anything but GET).
    pub fn writes(&self) -> Vec<Call> {
        lock(&self.shared.calls)
            .iter()
            .filter(|c| c.method != "GET")
            .cloned()
            .collect()
    }

    /// Forgets the call log.
    pub fn clear_calls(&self) {
        lock(&self.shared.calls).clear();
    }

    /// Takes the webhooks Forgejo would have delivered for the bot's own writes
    /// (labels, comments, merges), oldest first, for the test to send on.
    pub fn take_outbox(&self) -> Vec<Webhook> {
        std::mem::take(&mut lock(&self.shared.outbox))
    }

    /// Every merge carried out.
    pub fn merges(&self) -> Vec<MergeRecord> {
        self.with_model(|m| m.merges.clone())
    }

    // ---- model queries -------------------------------------------------------------

    /// A snapshot of issue or PR `n`.
    pub fn issue(&self, repo: &str, n: u64) -> IssueRow {
        self.with_model(|m| m.repo_mut(repo).issues[&n].clone())
    }

    /// Comments on issue or PR `n`, oldest first.
    pub fn comments_on(&self, repo: &str, n: u64) -> Vec<CommentRow> {
        self.with_model(|m| {
            let r = m.repo_mut(repo);
            r.comments
                .iter()
                .filter(|c| c.number == n)
                .cloned()
                .collect()
        })
    }

    /// Bodies of the comments on PR `n` that hold Shepherd's state block (its sticky
    /// status comment; more than one is a bug).
    pub fn status_comments(&self, repo: &str, n: u64) -> Vec<String> {
        self.comments_on(repo, n)
            .into_iter()
            .map(|c| c.body)
            .filter(|b| b.contains(shepherd::core::texts::STATE_MARKER))
            .collect()
    }

    /// Names of the labels on issue or PR `n`.
    pub fn labels_on(&self, repo: &str, n: u64) -> Vec<String> {
        self.with_model(|m| {
            let r = m.repo_mut(repo);
            let ids = r.issues[&n].labels.clone();
            r.label_rows(&ids).into_iter().map(|l| l.name).collect()
        })
    }

    /// The repository's labels.
    pub fn repo_labels(&self, repo: &str) -> Vec<LabelRow> {
        self.with_model(|m| m.repo_mut(repo).labels.clone())
    }

    // ---- mutators ------------------------------------------------------------------

    /// Creates the repository (owner becomes its admin) if missing.
    pub fn create_repo(&self, repo: &str) {
        self.with_model(|m| {
            m.repo_mut(repo);
        });
    }

    /// Opens a PR; returns its number.
    pub fn open_pr(&self, repo: &str, pr: NewPr) -> u64 {
        self.with_model(|m| {
            let number = m
                .repo_mut(repo)
                .issues
                .keys()
                .next_back()
                .copied()
                .unwrap_or(0)
                + 1;
            let seed = m.next_id as u64 + 1;
            let pull = PullData {
                head_ref: pr.head_ref.unwrap_or_else(|| format!("feature-{number}")),
                head_sha: pr.head_sha.unwrap_or_else(|| fake_sha(seed)),
                base_ref: pr.base_ref,
                mergeable: true,
                conflict_on_merge: false,
                merged: false,
                merged_at: None,
                merge_commit_sha: None,
                merged_by: None,
                files: Vec::new(),
                merge_base: String::new(),
            };
            let n = m.open_issue(repo, &pr.author, &pr.title, &pr.body, Some(pull));
            // Built on the base's tip of now; its commit holds this PR's changes on
            // top of what that tip holds.
            let r = m.repo_mut(repo);
            let p = r.issues[&n].pull.clone().expect("a PR");
            let tip = r.branches.get(&p.base_ref).cloned().unwrap_or_default();
            let mut content = queue::content_of(r, &tip);
            content.insert(n);
            r.content.insert(p.head_sha.clone(), content);
            r.issues
                .get_mut(&n)
                .and_then(|i| i.pull.as_mut())
                .expect("a PR")
                .merge_base = tip;
            queue::start_ci(m, repo, n, &p.head_sha);
            for name in &pr.labels {
                let id = m.ensure_label(repo, name, "ededed");
                m.repo_mut(repo)
                    .issues
                    .get_mut(&n)
                    .expect("just opened")
                    .labels
                    .push(id);
                m.label_event(repo, n, id, true, &pr.author);
            }
            n
        })
    }

    /// Opens a plain issue; returns its number.
    pub fn create_issue(&self, repo: &str, author: &str, title: &str, body: &str) -> u64 {
        self.with_model(|m| m.open_issue(repo, author, title, body, None))
    }

    /// Pushes `sha` to PR `n`'s head branch (reviews on older heads go stale).
    pub fn push(&self, repo: &str, n: u64, sha: &str) {
        self.with_model(|m| m.push(repo, n, sha));
    }

    /// Pushes a fix to PR `n` (a fresh head): the PR no longer breaks CI with others
    /// (see [`queue::SimCi::breaks`]). Returns the new head.
    pub fn push_fix(&self, repo: &str, n: u64) -> String {
        self.with_model(|m| {
            let sha = fake_sha(m.id() as u64 + 5_000_000);
            if let Some(ci) = m.repo_mut(repo).ci.as_mut() {
                ci.fixed.insert(n);
            }
            m.push(repo, n, &sha);
            sha
        })
    }

    /// Turns the simulated CI on for `repo` (statuses of new heads after `duration`).
    pub fn simulate_ci(&self, repo: &str, ci: queue::SimCi) {
        self.with_model(|m| m.repo_mut(repo).ci = Some(ci));
    }

    /// Finishes the simulated CI runs that are due; returns their webhooks.
    pub fn finish_ci_runs(&self) -> Vec<Webhook> {
        self.with_model(queue::finish_due_runs)
    }

    /// The tip of `branch`.
    pub fn branch_tip(&self, repo: &str, branch: &str) -> String {
        self.with_model(|m| m.repo_mut(repo).branches[branch].clone())
    }

    /// Someone else pushes a commit to `branch` (no PR's changes): its tip moves to a
    /// fresh sha. Returns the `push` webhook Forgejo sends for it (sender `pusher`).
    pub fn push_to_branch(&self, repo: &str, branch: &str, pusher: &str) -> Webhook {
        self.with_model(|m| {
            let sha = fake_sha(m.id() as u64 + 7_000_000);
            let r = m.repo_mut(repo);
            let before = r.branches.insert(branch.to_owned(), sha.clone());
            let before = before.unwrap_or_default();
            let content = queue::content_of(r, &before);
            r.content.insert(sha.clone(), content);
            payloads::push(m, repo, branch, &before, &sha, pusher)
        })
    }

    /// Head sha of PR `n`.
    pub fn head_sha(&self, repo: &str, n: u64) -> String {
        self.issue(repo, n).pull.expect("a PR").head_sha
    }

    /// Posts a commit status; returns its id.
    pub fn set_status(
        &self,
        repo: &str,
        sha: &str,
        context: &str,
        state: &str,
        description: &str,
    ) -> i64 {
        self.with_model(|m| m.add_status(repo, sha, context, state, description))
    }

    /// Submits a review (`APPROVED`, `REQUEST_CHANGES`, `COMMENT`) on the current head;
    /// returns its id.
    pub fn add_review(&self, repo: &str, n: u64, reviewer: &str, state: &str) -> i64 {
        self.with_model(|m| m.add_review(repo, n, reviewer, state))
    }

    /// Changes a review in place (dismiss it, make it stale or unofficial, …).
    pub fn update_review(&self, repo: &str, id: i64, f: impl FnOnce(&mut ReviewRow)) {
        self.with_model(|m| {
            let r = m.repo_mut(repo);
            f(r.reviews
                .iter_mut()
                .find(|v| v.id == id)
                .expect("no such review"));
        });
    }

    /// Sets the files PR `n` changes (its diff and file list follow from them).
    pub fn set_files(&self, repo: &str, n: u64, files: Vec<FileRow>) {
        self.with_pull(repo, n, |p| p.files = files);
    }

    /// Sets the body of review `id`.
    pub fn set_review_body(&self, repo: &str, id: i64, body: &str) {
        self.update_review(repo, id, |r| r.body = body.into());
    }

    /// Adds an inline comment to review `review_id`; returns its id.
    pub fn add_review_comment(
        &self,
        repo: &str,
        review_id: i64,
        path: &str,
        line: u64,
        body: &str,
    ) -> i64 {
        self.with_model(|m| m.add_review_comment(repo, review_id, path, line, body))
    }

    /// Sets what the API reports as `mergeable` (false: conflict or still checking).
    pub fn set_mergeable(&self, repo: &str, n: u64, mergeable: bool) {
        self.with_pull(repo, n, |p| p.mergeable = mergeable);
    }

    /// Makes the merge itself fail with 409 conflicts although `mergeable` is true.
    pub fn set_merge_conflict(&self, repo: &str, n: u64, conflict: bool) {
        self.with_pull(repo, n, |p| p.conflict_on_merge = conflict);
    }

    fn with_pull(&self, repo: &str, n: u64, f: impl FnOnce(&mut PullData)) {
        self.with_model(|m| {
            let issue = m.repo_mut(repo).issues.get_mut(&n).expect("no such PR");
            f(issue.pull.as_mut().expect("not a PR"));
        });
    }

    /// Changes the title (a `WIP:` prefix makes a PR a draft).
    pub fn set_title(&self, repo: &str, n: u64, title: &str) {
        self.with_model(|m| {
            m.repo_mut(repo)
                .issues
                .get_mut(&n)
                .expect("no such issue")
                .title = title.into();
            m.touch(repo, n);
        });
    }

    /// Creates a repository label if missing; returns its id.
    pub fn create_label(&self, repo: &str, name: &str) -> i64 {
        self.with_model(|m| m.ensure_label(repo, name, "ededed"))
    }

    /// Puts a label on issue or PR `n` (creating the repository label if missing), as
    /// its author.
    pub fn add_label(&self, repo: &str, n: u64, name: &str) {
        let author = self.issue(repo, n).user;
        self.add_label_by(repo, n, name, &author);
    }

    /// Puts a label on issue or PR `n` as `user` (a `label` timeline entry by them).
    pub fn add_label_by(&self, repo: &str, n: u64, name: &str, user: &str) {
        self.with_model(|m| {
            let id = m.ensure_label(repo, name, "ededed");
            let issue = m.repo_mut(repo).issues.get_mut(&n).expect("no such issue");
            if !issue.labels.contains(&id) {
                issue.labels.push(id);
                m.label_event(repo, n, id, true, user);
            }
            m.touch(repo, n);
        });
    }

    /// Takes a label off issue or PR `n`, as its author.
    pub fn remove_label(&self, repo: &str, n: u64, name: &str) {
        let author = self.issue(repo, n).user;
        self.with_model(|m| {
            let r = m.repo_mut(repo);
            let ids: Vec<i64> = r
                .labels
                .iter()
                .filter(|l| l.name == name)
                .map(|l| l.id)
                .collect();
            let issue = r.issues.get_mut(&n).expect("no such issue");
            let on: Vec<i64> = issue
                .labels
                .iter()
                .copied()
                .filter(|l| ids.contains(l))
                .collect();
            issue.labels.retain(|l| !ids.contains(l));
            for id in on {
                m.label_event(repo, n, id, false, &author);
            }
            m.touch(repo, n);
        });
    }

    /// Adds a comment by `user`; returns its id.
    pub fn add_comment(&self, repo: &str, n: u64, user: &str, body: &str) -> i64 {
        self.with_model(|m| m.add_comment(repo, n, user, body))
    }

    /// Closes issue or PR `n` without merging.
    pub fn close(&self, repo: &str, n: u64) {
        self.with_model(|m| m.close(repo, n));
    }

    /// Sets a user's permission (`admin`, `write`, `read`, `none`).
    pub fn set_permission(&self, repo: &str, user: &str, permission: &str) {
        self.with_model(|m| {
            m.user_id(user);
            m.repo_mut(repo)
                .permissions
                .insert(user.to_lowercase(), permission.into());
        });
    }

    /// Sets the branch protection rule.
    pub fn set_protection(&self, repo: &str, protection: Protection) {
        self.with_model(|m| m.repo_mut(repo).protection = protection);
    }

    /// Marks a branch as undeletable (merging with delete then answers 403).
    pub fn protect_branch(&self, repo: &str, branch: &str) {
        self.with_model(|m| {
            m.repo_mut(repo).protected_branches.insert(branch.into());
        });
    }
}

impl Drop for FakeForgejo {
    fn drop(&mut self) {
        if let Some(h) = lock(&self.server).take() {
            // Stopping is asynchronous; the listener closes when the server task ends.
            drop(h.stop(false));
        }
    }
}

/// Starts serving `shared` on `listener` in the background.
fn serve(shared: Arc<Shared>, listener: TcpListener) -> ServerHandle {
    let data = web::Data::new(shared);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .app_data(web::PayloadConfig::new(16 * 1024 * 1024))
            .default_service(web::to(routes::handle))
    })
    .workers(2)
    // Without keep-alive every request opens a connection, so refusing connections
    // takes effect at once (a stopped actix worker keeps serving idle keep-alive
    // connections for a while).
    .keep_alive(actix_web::http::KeepAlive::Disabled)
    .disable_signals()
    .shutdown_timeout(1)
    .listen(listener)
    .expect("listen on the bound socket")
    .run();
    let handle = server.handle();
    tokio::spawn(server);
    handle
}
