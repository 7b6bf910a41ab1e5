//! Running one effect against Forgejo and the dispatch sinks, idempotently:
//!
//! - labels by name (added through the label cache, which creates a missing label
//!   once; removed by id) — adding or removing twice changes nothing;
//! - the sticky status comment, edited in place by the id cached once it was found
//!   (`store::status_comment`), else found again by its `SHEPHERD-STATE` block (created
//!   when absent, found again when the cached one was deleted);
//! - a comment, found by the hidden marker of its effect id before it is posted;
//! - observations, read from the API and returned as events for the machine;
//! - dispatches, appended once per effect id (see [`crate::worker::dispatch`]);
//! - merges (see [`super::merge`]).

use std::time::Duration;

use crate::core::effect::{Effect, EffectKind, ObserveWhat};
use crate::core::event::{Event, Permission};
use crate::core::texts;
use crate::forgejo::{Cause, ForgejoError};
use crate::store::{lock, status_comment};
use crate::worker::dispatch::{CancelNotice, Gate, SinkError, budget_gate};

use super::Executor;
use super::observe;

/// Forgejo calls the status lock must outlast (list the comments, then write; one
/// spare for a second page).
const STATUS_LOCK_CALLS: u32 = 3;

/// When a status effect that found the lock busy is tried again, at the soonest.
const STATUS_LOCK_RETRY: Duration = Duration::from_millis(200);

/// Why an effect did not complete.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Worth another try later (timeout, connection, 429, 5xx, open circuit).
    #[error("{message}")]
    Transient {
        /// What happened.
        message: String,
        /// The server's `Retry-After` or the breaker's cool-down.
        retry_after: Option<Duration>,
    },
    /// Will not succeed by trying again.
    #[error("{0}")]
    Permanent(String),
    /// Redis failed: the entry stays pending and is redelivered.
    #[error("redis: {0}")]
    Store(#[from] crate::store::StoreError),
}

impl From<ForgejoError> for Failure {
    fn from(e: ForgejoError) -> Self {
        if e.is_retryable() {
            Failure::Transient {
                retry_after: e.retry_after(),
                message: e.to_string(),
            }
        } else {
            Failure::Permanent(e.to_string())
        }
    }
}

impl From<SinkError> for Failure {
    fn from(e: SinkError) -> Self {
        match e {
            SinkError::Store(s) => Failure::Store(s),
            SinkError::Transient {
                message,
                retry_after,
            } => Failure::Transient {
                message,
                retry_after,
            },
            SinkError::Refused(m) => Failure::Permanent(m),
        }
    }
}

impl Executor {
    /// Runs `effect`, queued at `queued_ms` (its stream entry's time); returns the
    /// events it produced for the machine.
    /// `reads` is what an `Observe` is counted under (`shepherd_forgejo_api_calls_total`).
    pub(super) async fn act(
        &self,
        effect: &Effect,
        queued_ms: u64,
        reads: Cause,
    ) -> Result<Vec<Event>, Failure> {
        let repo = effect.repo.as_str();
        let n = effect.number;
        let writes = self.forgejo.with_cause(Cause::Effect);
        match &effect.kind {
            EffectKind::AddLabels { labels } => {
                let names: Vec<&str> = labels.iter().map(String::as_str).collect();
                if !names.is_empty() {
                    writes.add_labels(repo, n, &names).await?;
                }
                Ok(Vec::new())
            }
            EffectKind::RemoveLabels { labels } => {
                for name in labels {
                    writes.remove_label(repo, n, name).await?;
                }
                Ok(Vec::new())
            }
            EffectKind::UpsertComment { body, first } => {
                self.upsert_status_locked(effect, body, *first).await?;
                Ok(Vec::new())
            }
            EffectKind::Comment { number, body } => {
                self.comment_once(effect, *number, body).await?;
                Ok(Vec::new())
            }
            EffectKind::Observe(what) => self.observe(effect, what, queued_ms, reads).await,
            EffectKind::Dispatch(item) => {
                let mut conn = self.ctx.store.conn();
                let policy = self.ctx.policy.for_repo(&effect.repo);
                let keys = self.ctx.store.keys();
                let now = super::merge::now_ms();
                let item = match budget_gate(&mut conn, keys, &policy, item, now).await? {
                    Gate::Go(item) => item,
                    Gate::Stop(stop) => return Ok(vec![over_budget(effect, item, stop)]),
                };
                self.sinks
                    .send_work(&mut conn, effect.id.as_str(), &item)
                    .await?;
                Ok(Vec::new())
            }
            EffectKind::CancelWork { work_id } => {
                let notice = CancelNotice {
                    id: work_id.clone(),
                    kind: "cancel".into(),
                    repo: effect.repo.clone(),
                    number: n,
                };
                let mut conn = self.ctx.store.conn();
                self.sinks
                    .send_cancel(&mut conn, effect.id.as_str(), &notice)
                    .await?;
                Ok(Vec::new())
            }
            EffectKind::Merge {
                head_sha,
                style,
                delete_branch,
                title,
                message,
            } => {
                let request = super::merge::MergeAsk {
                    head_sha,
                    style: *style,
                    delete_branch: *delete_branch,
                    title: title.clone(),
                    message: message.clone(),
                    queued_ms,
                };
                self.merge(effect, request).await
            }
            EffectKind::Queue(op) => self.queue_op(effect, op).await,
            EffectKind::QueueFreeze(op) => self.queue_freeze(effect, op).await,
            EffectKind::QueueAdvance {
                head_sha,
                branch,
                update_style,
                style,
                delete_branch,
                may_update,
                batch,
            } => {
                let ask = super::queue::AdvanceAsk {
                    head_sha,
                    branch,
                    update_style: *update_style,
                    style: *style,
                    delete_branch: *delete_branch,
                    may_update: *may_update,
                    queued_ms,
                    batch: *batch,
                };
                self.queue_advance(effect, ask).await
            }
            // The commit script turns these into timers; one here has nothing to do.
            EffectKind::Schedule(_) => Ok(Vec::new()),
        }
    }

    /// [`Self::upsert_status`] under the PR's status lock. Without it two executors
    /// running status effects of one PR at once (a reclaimed one and a newer one) can
    /// both find no status comment and both create one (found by fault drill 7.2).
    /// A busy lock is a transient failure, tried again shortly; a holder that died
    /// frees it when its TTL ends.
    async fn upsert_status_locked(
        &self,
        effect: &Effect,
        body: &str,
        first: bool,
    ) -> Result<(), Failure> {
        let key = (self.ctx.store.keys()).status_lock(effect.repo.as_str(), effect.number);
        let token = effect.id.to_string();
        // Covers the look-up and the write, each bounded by the Forgejo timeout.
        let ttl = self.ctx.config.forgejo_timeout * STATUS_LOCK_CALLS;
        let mut conn = self.ctx.store.conn();
        if !lock::try_lock(&mut conn, &key, &token, ttl).await? {
            return Err(Failure::Transient {
                message: "the status comment is being written by another executor".into(),
                retry_after: Some(STATUS_LOCK_RETRY),
            });
        }
        let result = self.upsert_status(effect, body, first).await;
        if let Err(e) = lock::unlock(&mut conn, &key, &token).await {
            tracing::warn!(error = %e, "releasing the status lock failed; it expires");
        }
        result
    }

    /// Edits the sticky status comment in place, or creates it when there is none.
    /// The comment carries the effect id that wrote it, so an older effect (a
    /// redelivery reclaimed after newer ones ran) never puts back a stale status.
    /// Where the comment is comes from the cache (`store::status_comment`) when it
    /// can: one `PATCH`, or nothing when the body is already there; a cached comment
    /// that was deleted (404) is found again or created. A `first` status (the PR
    /// showed no comments at all and none was ever asked for) is created without
    /// listing the comments, after noting the attempt in the cache: any later try
    /// finds that note and lists them, so a create whose answer was lost is found
    /// instead of repeated.
    async fn upsert_status(&self, effect: &Effect, body: &str, first: bool) -> Result<(), Failure> {
        let (repo, n) = (effect.repo.as_str(), effect.number);
        let forgejo = self.forgejo.with_cause(Cause::Effect);
        let key = self.ctx.store.keys().status_comment(repo, n);
        let mut conn = self.ctx.store.conn();
        let stamped = stamp(body, &effect.id);
        let written = |id: i64| status_comment::StatusComment {
            id,
            effect: effect.id.to_string(),
            digest: digest(body),
        };
        let cached = status_comment::get(&mut conn, &key).await?;
        if cached.is_none() && first {
            status_comment::set(
                &mut conn,
                &key,
                &status_comment::StatusComment::creating(effect.id.as_str()),
            )
            .await?;
            let created = forgejo.create_comment(repo, n, &stamped).await?;
            return Ok(status_comment::set(&mut conn, &key, &written(created.id)).await?);
        }
        if let Some(cached) = cached.filter(|c| !c.is_creating()) {
            if effect_order(&cached.effect) > effect_order(effect.id.as_str()) {
                tracing::info!("the status comment is newer than this effect; left alone");
                return Ok(());
            }
            if cached.digest == digest(body) {
                return Ok(());
            }
            match forgejo.edit_comment(repo, cached.id, &stamped).await {
                Ok(_) => {
                    return Ok(status_comment::set(&mut conn, &key, &written(cached.id)).await?);
                }
                Err(e) if e.status() == Some(404) => {
                    tracing::info!(
                        id = cached.id,
                        "the cached status comment is gone; looking again"
                    );
                    status_comment::clear(&mut conn, &key).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        let bot = self.ctx.config.bot_login.as_deref();
        let existing = forgejo
            .find_comment_with_marker(repo, n, texts::STATE_MARKER, bot)
            .await?;
        let Some(existing) = existing else {
            let created = forgejo.create_comment(repo, n, &stamped).await?;
            return Ok(status_comment::set(&mut conn, &key, &written(created.id)).await?);
        };
        let written_by = texts::find_effect_marker(&existing.body).and_then(effect_order);
        if written_by.is_some_and(|w| Some(w) > effect_order(effect.id.as_str())) {
            tracing::info!("the status comment is newer than this effect; left alone");
            return Ok(());
        }
        if existing.body != stamped && unstamp(&existing.body) != body {
            forgejo.edit_comment(repo, existing.id, &stamped).await?;
        }
        Ok(status_comment::set(&mut conn, &key, &written(existing.id)).await?)
    }

    /// Posts a comment unless one carrying this effect's marker exists already (a try
    /// that crashed after posting).
    async fn comment_once(
        &self,
        effect: &Effect,
        number: u64,
        body: &str,
    ) -> Result<(), ForgejoError> {
        let marker = texts::effect_marker(&effect.id);
        let body = match body.contains(&marker) {
            true => body.to_owned(),
            false => format!("{body}\n\n{marker}"),
        };
        let bot = self.ctx.config.bot_login.as_deref();
        let (_, write) = self
            .forgejo
            .with_cause(Cause::Effect)
            .comment_once(effect.repo.as_str(), number, &marker, &body, bot)
            .await?;
        tracing::debug!(number, ?write, "comment");
        Ok(())
    }

    /// Reads what `what` names and returns it as an observation event. Its time is
    /// taken when the answer is in, and is never earlier than just after `queued_ms`:
    /// the machine trusts only reads taken after it asked (a read in the very
    /// millisecond of the request still counts as after it).
    async fn observe(
        &self,
        effect: &Effect,
        what: &ObserveWhat,
        queued_ms: u64,
        cause: Cause,
    ) -> Result<Vec<Event>, Failure> {
        let forgejo = self.forgejo.with_cause(cause);
        let repo = effect.repo.as_str();
        let n = effect.number;
        let at = || read_time(queued_ms);
        let event = match what {
            ObserveWhat::Pr => Event::ObservedPr {
                pr: observe::pr_snapshot(&effect.repo, &forgejo.get_pull(repo, n).await?),
            },
            ObserveWhat::Reviews => Event::ObservedReviews {
                repo: effect.repo.clone(),
                number: n,
                reviews: observe::reviews(&forgejo.list_reviews(repo, n).await?),
                at_ms: at(),
            },
            ObserveWhat::CombinedStatus { sha } => Event::ObservedStatus {
                repo: effect.repo.clone(),
                number: n,
                sha: sha.clone(),
                contexts: observe::contexts(&forgejo.combined_status(repo, sha.as_str()).await?),
                at_ms: at(),
            },
            ObserveWhat::Dependencies => {
                // 404: dependencies are turned off for the repository: none hold it.
                let list = forgejo
                    .issue_dependencies(repo, n)
                    .await?
                    .unwrap_or_default();
                let needs_prs = list
                    .iter()
                    .any(|i| i.state == "open" && i.pull_request.is_none());
                let pulls = match needs_prs {
                    true => forgejo.list_open_pulls(repo).await?,
                    false => Vec::new(),
                };
                Event::ObservedDependencies {
                    repo: effect.repo.clone(),
                    number: n,
                    dependencies: observe::dependencies(&effect.repo, &list, &pulls),
                    at_ms: at(),
                }
            }
            ObserveWhat::Permission { login } => {
                let permission = match forgejo.collaborator_permission(repo, login.as_str()).await {
                    Ok(p) => observe::permission(&p.permission),
                    // Not a collaborator (or not even a user): no write access.
                    Err(e) if matches!(e.status(), Some(403 | 404)) => Permission::Read,
                    Err(e) => return Err(e.into()),
                };
                Event::ObservedPermission {
                    repo: effect.repo.clone(),
                    scope: effect.scope,
                    number: n,
                    login: login.clone(),
                    permission,
                    at_ms: at(),
                }
            }
            ObserveWhat::Legacy {
                comments,
                claim_label,
            } => {
                let what = crate::worker::legacy::LegacyRead {
                    repo: &effect.repo,
                    scope: effect.scope,
                    number: n,
                    comments: *comments,
                    claim_label: claim_label.as_deref(),
                };
                crate::worker::legacy::read(&forgejo, &what, at).await?
            }
        };
        Ok(vec![event])
    }
}

/// The time of a read that finished now, for an effect queued at `queued_ms`.
pub(super) fn read_time(queued_ms: u64) -> i64 {
    let now = crate::store::streams::now_ms().max(queued_ms + 1);
    i64::try_from(now).unwrap_or(i64::MAX)
}

/// A digest of a status body (hex SHA-256), to tell whether the cached comment holds
/// it already.
fn digest(body: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(body.as_bytes()))
}

/// The status body with the hidden marker of the effect writing it, right after the
/// state block (the footer stays last).
fn stamp(body: &str, id: &crate::core::ids::EffectId) -> String {
    let marker = texts::effect_marker(id);
    let end = body.find(texts::STATE_MARKER).and_then(|start| {
        body[start..]
            .find(" -->")
            .map(|len| start + len + " -->".len())
    });
    match end {
        Some(at) => format!("{}\n{marker}{}", &body[..at], &body[at..]),
        None => format!("{body}\n{marker}"),
    }
}

/// A stamped status body without its effect marker line.
fn unstamp(body: &str) -> String {
    match texts::find_effect_marker(body) {
        Some(id) => {
            let marker = format!("\n{}{id} -->", texts::EFFECT_MARKER);
            body.replacen(&marker, "", 1)
        }
        None => body.to_owned(),
    }
}

/// The (record version, index) of an effect id `…@<version>.<index>`: orders the
/// effects of one record.
fn effect_order(id: &str) -> Option<(u64, u64)> {
    let (_, tail) = id.rsplit_once('@')?;
    let (version, index) = tail.split_once('.')?;
    Some((version.parse().ok()?, index.parse().ok()?))
}

/// The event telling the record that `item` was held back by a spend cap.
fn over_budget(
    effect: &Effect,
    item: &crate::core::effect::WorkItem,
    stop: crate::core::budget::Stop,
) -> Event {
    tracing::info!(work = %item.id, cap = %stop.cap, "dispatch held back: over budget");
    Event::EffectOutcome {
        repo: effect.repo.clone(),
        scope: effect.scope,
        number: effect.number,
        effect_id: effect.id.clone(),
        outcome: crate::core::event::EffectOutcome::OverBudget {
            work_id: item.id.clone(),
            stop,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_stamps_round_trip_and_order() {
        let id: crate::core::ids::EffectId = "o/r/pr/3@12.1".parse().unwrap();
        let body = "**Shepherd status:** x\n\n<!-- SHEPHERD-STATE: {\"a\":1} -->\n---\nfooter";
        let stamped = stamp(body, &id);
        assert!(stamped.ends_with("---\nfooter"), "{stamped}");
        assert_eq!(texts::find_effect_marker(&stamped), Some("o/r/pr/3@12.1"));
        assert_eq!(unstamp(&stamped), body);
        assert_eq!(effect_order("o/r/pr/3@12.1"), Some((12, 1)));
        assert!(effect_order("o/r/pr/3@9.4") < effect_order("o/r/pr/3@12.0"));
        assert_eq!(effect_order("nonsense"), None);
    }
}
