//! The merge procedure of DESIGN §2.4.
//!
//! 1. Re-read the PR: already merged → `Merged` (a redelivered merge effect never
//!    merges twice); closed or the head moved past the pinned sha → `HeadMoved`.
//! 2. Take the merge lease of the target branch (`store::lock::Lease`: `SET NX PX`
//!    with a few seconds of life, renewed every second while this executor works,
//!    the merge call included); busy → `LockBusy`, retried when the holder's lease
//!    runs out. A SIGKILLed holder blocks the branch for at most [`LEASE_TTL`],
//!    wherever it died.
//! 3. Re-check readiness against the API: the combined status of the head and the
//!    reviews are read and folded, with the PR, into a fresh record by the core's own
//!    `step`, and the core's `merge_blockers` must be empty. Otherwise the fresh reads
//!    go back to the machine (a `ResyncObserved` event) with `TryAgain`. The fresh
//!    record also takes the stored record's hold and active work, which no API read
//!    shows: a `/shepherd pause` (or needs-human) that arrived while this effect was
//!    queued or parked for retry wins over it.
//! 4. The fence: right before the merge call the lease is extended by a whole
//!    lifetime only if this taking still holds it (compare-and-`PEXPIRE`); a holder
//!    that lost its lease (renewals failed, a pause longer than its life) stops here
//!    with `LockBusy` and never calls merge. Then `POST …/merge` with `Do`,
//!    `head_commit_id` and `delete_branch_after_merge` — never `force_merge`. The
//!    renewals go on during the call: a holder that dies in it frees the branch within
//!    [`LEASE_TTL`], and its call, if Forgejo still completes it, is pinned to its
//!    head like any other (the next holder re-reads the PR first).
//! 5. A 403/405/409/404 or an ambiguous answer (timeout, 5xx) is never retried
//!    blindly: the PR is re-read; merged means `Merged`, anything else is reported as
//!    the outcome (`Conflict`, `HeadMoved`, `TryAgain`, `FailedPermanent`). A 403 is
//!    never taken as "merged" on its own: Forgejo answers it both after a merge that
//!    could not delete the branch and for a refused one.

use crate::core::effect::Effect;
use crate::core::event::{EffectOutcome, Event, MergeOutcome};
use crate::core::ids::Sha;
use crate::core::machine::{merge_blockers, step};
use crate::core::policy::MergeStyle;
use crate::core::record::PrRecord;
use crate::forgejo::{self, Cause, MergeConflictKind, MergeRefusal, MergeRequest, PullRequest};
use crate::store::lock::{self, Lease, Taken, Waiter};
use crate::store::{Conn, commit, streams};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Executor;
use super::act::Failure;
use super::observe;

/// The merge lease's life: how long a branch stays blocked after its holder died
/// (it is renewed every [`RENEW_EVERY`] while the holder lives).
pub const LEASE_TTL: Duration = Duration::from_secs(5);

/// How often a living holder renews its merge lease.
const RENEW_EVERY: Duration = Duration::from_secs(1);

/// The least wait before a merge retries a busy lease (also added to the holder's
/// remaining time, so the retry comes after the lease ran out).
const BUSY_RETRY_MIN: Duration = Duration::from_millis(200);

/// The parameters of a `Merge` effect.
pub(super) struct MergeAsk<'a> {
    /// The pinned head.
    pub head_sha: &'a Sha,
    /// `Do`.
    pub style: MergeStyle,
    /// `delete_branch_after_merge`.
    pub delete_branch: bool,
    /// `MergeTitleField`.
    pub title: Option<String>,
    /// `MergeMessageField`.
    pub message: Option<String>,
    /// When the effect was queued (unix ms): fresh reads are dated after it.
    pub queued_ms: u64,
}

impl Executor {
    /// Runs a `Merge` effect; the events end with the outcome for the machine.
    pub(super) async fn merge(
        &self,
        effect: &Effect,
        ask: MergeAsk<'_>,
    ) -> Result<Vec<Event>, Failure> {
        let repo = effect.repo.as_str();
        let pr = self
            .forgejo
            .with_cause(Cause::MergeCheck)
            .get_pull(repo, effect.number)
            .await?;
        if let Some(outcome) = settled(&pr, ask.head_sha) {
            return Ok(vec![outcome_event(effect, outcome)]);
        }
        let branch = pr.base.ref_name.as_str();
        let keeper = match self.take_merge_lease(effect, branch).await? {
            Ok(keeper) => keeper,
            Err(busy) => return Ok(vec![busy]),
        };
        let result = self.merge_locked(effect, &ask, &pr, &keeper).await;
        self.release_merge_lease(effect, branch, keeper).await;
        result
    }

    /// Takes the merge lease of `branch` for the effect's PR and starts renewing it;
    /// when another holder has it, the PR joins the branch's waiters and the answer is
    /// the `LockBusy` outcome event (retried when the holder's lease runs out, or
    /// sooner when the holder wakes it).
    pub(super) async fn take_merge_lease(
        &self,
        effect: &Effect,
        branch: &str,
    ) -> Result<Result<Keeper, Event>, Failure> {
        let repo = effect.repo.as_str();
        let keys = self.ctx.store.keys();
        let lock_key = keys.merge_lock(repo, branch);
        let waiters = keys.merge_waiters(repo, branch);
        let waiter = Waiter::of_record(keys.shard_of(repo), &keys.pr_record(repo, effect.number));
        let mut conn = self.ctx.store.conn();
        let lease =
            match Lease::try_take(&mut conn, &lock_key, &self.ctx.consumer, LEASE_TTL).await? {
                Taken::Held(lease) => lease,
                Taken::Busy { holder, remaining } => {
                    tracing::info!(branch, ?holder, ?remaining, "merge lease busy");
                    lock::add_waiter(&mut conn, &waiters, &waiter, now_ms()).await?;
                    return Ok(Err(outcome_event(effect, busy(remaining))));
                }
            };
        if let Err(e) = lock::remove_waiter(&mut conn, &waiters, &waiter).await {
            tracing::warn!(error = %e, "leaving the merge waiters failed; a later wake skips it");
        }
        Ok(Ok(Keeper::start(lease, self.ctx.store.conn())))
    }

    /// Stops renewing the merge lease of `branch`, releases it and wakes the next PR
    /// waiting for the branch (it tries now instead of at its fallback). Failures are
    /// logged: the lease expires and the waiter retries at its fallback anyway.
    pub(super) async fn release_merge_lease(&self, effect: &Effect, branch: &str, keeper: Keeper) {
        keeper.stop();
        let mut conn = self.ctx.store.conn();
        if let Err(e) = keeper.lease.release(&mut conn).await {
            tracing::warn!(error = %e, "releasing the merge lease failed; it expires");
        }
        let keys = self.ctx.store.keys();
        let waiters = keys.merge_waiters(effect.repo.as_str(), branch);
        match lock::wake_next_waiter(&mut conn, keys, &waiters, now_ms()).await {
            Ok(woken) => tracing::debug!(?woken, "merge lease released"),
            Err(e) => {
                tracing::warn!(error = %e, "waking a merge waiter failed; it retries at its fallback")
            }
        }
    }

    /// Steps 3–5, under the lease.
    pub(super) async fn merge_locked(
        &self,
        effect: &Effect,
        ask: &MergeAsk<'_>,
        pr: &PullRequest,
        keeper: &Keeper,
    ) -> Result<Vec<Event>, Failure> {
        let repo = effect.repo.as_str();
        let head = ask.head_sha.as_str();
        let status = self
            .forgejo
            .with_cause(Cause::MergeCheck)
            .combined_status(repo, head)
            .await?;
        let reviews = self
            .forgejo
            .with_cause(Cause::MergeCheck)
            .list_reviews(repo, effect.number)
            .await?;
        let observed = Event::ResyncObserved {
            pr: observe::pr_snapshot(&effect.repo, pr),
            contexts: observe::contexts(&status),
            reviews: observe::reviews(&reviews),
            at_ms: super::act::read_time(ask.queued_ms),
        };
        let stored = self.stored_record(effect).await?;
        let blockers = self.blockers(effect, &observed, stored.as_ref());
        if !blockers.is_empty() {
            tracing::info!(?blockers, "not ready on re-check; merge not attempted");
            return Ok(vec![
                observed,
                outcome_event(effect, MergeOutcome::TryAgain),
            ]);
        }
        let request = MergeRequest {
            style: ask.style,
            head_commit_id: head.to_owned(),
            delete_branch_after_merge: ask.delete_branch,
            title: ask.title.clone(),
            message: ask.message.clone(),
        };
        if !keeper.fence().await? {
            tracing::warn!(
                lease = keeper.lease.key(),
                "merge lease lost before the merge call; not merging"
            );
            return Ok(vec![outcome_event(effect, busy(Duration::ZERO))]);
        }
        let answer = self
            .forgejo
            .with_cause(Cause::Effect)
            .merge(repo, effect.number, &request)
            .await?;
        tracing::info!(?answer, "merge answered");
        let outcome = match answer {
            forgejo::MergeOutcome::Merged => MergeOutcome::Merged,
            // A 403 comes after a merge whose branch could not be deleted, and also
            // from a refusal (token scope, write access): only the PR tells which.
            forgejo::MergeOutcome::Forbidden { message } => {
                let refused = MergeOutcome::FailedPermanent {
                    message: format!("merge refused (403): {message}"),
                };
                self.reread(effect, ask.head_sha, refused).await?
            }
            forgejo::MergeOutcome::NotAllowed { refusal, message } => match refusal {
                MergeRefusal::NotMergeable => MergeOutcome::TryAgain,
                MergeRefusal::AlreadyMerged | MergeRefusal::WorkInProgress => {
                    self.reread(effect, ask.head_sha, MergeOutcome::TryAgain)
                        .await?
                }
                MergeRefusal::Protection(_)
                | MergeRefusal::UserNotAllowed
                | MergeRefusal::StyleNotAllowed
                | MergeRefusal::Other => MergeOutcome::FailedPermanent { message },
            },
            forgejo::MergeOutcome::Conflict { kind, .. } => match kind {
                MergeConflictKind::HeadOutOfDate => MergeOutcome::HeadMoved,
                MergeConflictKind::Conflict => MergeOutcome::Conflict,
                MergeConflictKind::AlreadyMerged | MergeConflictKind::Other => {
                    self.reread(effect, ask.head_sha, MergeOutcome::TryAgain)
                        .await?
                }
            },
            forgejo::MergeOutcome::NotFound { .. } | forgejo::MergeOutcome::Ambiguous { .. } => {
                self.reread(effect, ask.head_sha, MergeOutcome::TryAgain)
                    .await?
            }
        };
        Ok(vec![outcome_event(effect, outcome)])
    }

    /// Re-reads the PR after an unclear answer: what it shows, or `otherwise`.
    async fn reread(
        &self,
        effect: &Effect,
        head: &Sha,
        otherwise: MergeOutcome,
    ) -> Result<MergeOutcome, Failure> {
        let pr = self
            .forgejo
            .with_cause(Cause::MergeCheck)
            .get_pull(effect.repo.as_str(), effect.number)
            .await?;
        Ok(settled(&pr, head).unwrap_or(otherwise))
    }

    /// The PR's record as stored now (read under the merge lock, right before the
    /// merge call). `Err(blocker)` when it cannot be decoded: no merge then.
    async fn stored_record(
        &self,
        effect: &Effect,
    ) -> Result<Result<Option<PrRecord>, String>, Failure> {
        let key = self
            .ctx
            .store
            .keys()
            .pr_record(effect.repo.as_str(), effect.number);
        let stored = commit::load(&mut self.ctx.store.conn(), &key).await?;
        Ok(match stored {
            None => Ok(None),
            Some(s) => PrRecord::from_json(&s.data)
                .map(Some)
                .map_err(|e| format!("the record {key} cannot be read: {e}")),
        })
    }

    /// The §2.4 conditions that fail on the fresh reads, by the core's own rules, with
    /// the stored record's hold and active work (facts only the record has).
    fn blockers(
        &self,
        effect: &Effect,
        observed: &Event,
        stored: Result<&Option<PrRecord>, &String>,
    ) -> Vec<String> {
        let policy = self.ctx.policy.for_repo(&effect.repo);
        let now = streams::now_ms() as i64;
        let fresh = PrRecord::new(effect.repo.clone(), effect.number);
        let mut t = step(&fresh, observed, now, &policy);
        match stored {
            Ok(Some(r)) => {
                t.record.work.hold = r.work.hold.clone();
                t.record.work.active = r.work.active.clone();
            }
            // A merge comes only from a record: without one, nothing says the PR is
            // not paused or held, so it is not merged (fail closed, as for a record
            // that cannot be read).
            Ok(None) => return vec!["no record of the PR".to_owned()],
            Err(why) => return vec![why.clone()],
        }
        merge_blockers(&t.record, &policy, now)
    }
}

/// Unix milliseconds now.
pub(super) fn now_ms() -> i64 {
    i64::try_from(crate::store::streams::now_ms()).unwrap_or(i64::MAX)
}

/// The outcome of a busy (or lost) lease: retry when the holder's lease runs out.
pub(super) fn busy(remaining: Duration) -> MergeOutcome {
    let wait = remaining.clamp(BUSY_RETRY_MIN, LEASE_TTL) + BUSY_RETRY_MIN;
    MergeOutcome::LockBusy {
        retry_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
    }
}

/// Renews a merge lease every [`RENEW_EVERY`] while its holder works, on a task of its
/// own (a slow Forgejo read does not delay the renewal). A renewal that finds the lease
/// gone marks it lost; [`Keeper::fence`] then refuses.
pub(super) struct Keeper {
    lease: Lease,
    conn: Conn,
    lost: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Keeper {
    pub(super) fn start(lease: Lease, conn: Conn) -> Keeper {
        let lost = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (lease, mut conn, lost) = (lease.clone(), conn.clone(), lost.clone());
            async move {
                let mut tick = tokio::time::interval(RENEW_EVERY);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    match lease.renew(&mut conn).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(lease = lease.key(), "merge lease lost");
                            lost.store(true, Ordering::SeqCst);
                            return;
                        }
                        // Not known to be lost: the fence asks Redis again.
                        Err(e) => tracing::warn!(error = %e, "renewing the merge lease failed"),
                    }
                }
            }
        });
        Keeper {
            lease,
            conn,
            lost,
            task,
        }
    }

    /// Extends the lease by a whole lifetime from now if this taking still holds it:
    /// true means the protected call may be made (the renewals go on meanwhile).
    pub(super) async fn fence(&self) -> Result<bool, Failure> {
        if self.lost.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let held = self.lease.renew(&mut self.conn.clone()).await?;
        if !held {
            self.lost.store(true, Ordering::SeqCst);
        }
        Ok(held)
    }

    pub(super) fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The outcome a PR read already decides: merged, closed, or a moved head.
pub(super) fn settled(pr: &PullRequest, head: &Sha) -> Option<MergeOutcome> {
    if pr.merged {
        return Some(MergeOutcome::Merged);
    }
    let moved = !pr.head.sha.eq_ignore_ascii_case(head.as_str());
    (!pr.is_open() || moved).then_some(MergeOutcome::HeadMoved)
}

/// The `EffectOutcome` event of a merge.
pub(super) fn outcome_event(effect: &Effect, outcome: MergeOutcome) -> Event {
    Event::EffectOutcome {
        repo: effect.repo.clone(),
        scope: effect.scope,
        number: effect.number,
        effect_id: effect.id.clone(),
        outcome: EffectOutcome::Merge(outcome),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_settles_merged_closed_and_moved() {
        let head: Sha = "abcd1234".parse().unwrap();
        let mut pr = PullRequest {
            state: "open".into(),
            ..PullRequest::default()
        };
        pr.head.sha = "ABCD1234".into();
        assert_eq!(settled(&pr, &head), None);
        pr.head.sha = "ffff0000".into();
        assert_eq!(settled(&pr, &head), Some(MergeOutcome::HeadMoved));
        pr.merged = true;
        assert_eq!(settled(&pr, &head), Some(MergeOutcome::Merged));
        pr.merged = false;
        pr.head.sha = "abcd1234".into();
        pr.state = "closed".into();
        assert_eq!(settled(&pr, &head), Some(MergeOutcome::HeadMoved));
    }
}
