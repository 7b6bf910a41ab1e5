//! Freezes of a branch's merge queue (issue 29; rules in `core::queue::freeze`).
//!
//! `QueueFreeze(op)`: the manual freeze of the queue is set or ended under
//! compare-and-set (`store::queue::change`), and the queue's head is told its place,
//! so a head the freeze held asks to advance again at once after an unfreeze.
//!
//! Right before a head is updated or merged, [`FreezeHolds`] (read with the queue and
//! the clock at the same moment) says whether a freeze holds it; the head's record is
//! then told `Frozen` with why and until when, and asks again later.

use crate::core::effect::Effect;
use crate::core::event::{Event, MergeOutcome};
use crate::core::queue::batch::BatchStage;
use crate::core::queue::freeze::{self, FreezeOp, Frozen};
use crate::core::queue::{BranchQueue, HeadAction};
use crate::store::{queue, streams};

use super::Executor;
use super::act::Failure;
use super::queue::place_event;

/// Whether a freeze holds the head's next step, read before the step is chosen.
pub(super) struct FreezeHolds {
    /// What holds an update onto the tip (only with `merge_queue_freeze_test` off).
    update: Option<Frozen>,
    /// What holds a merge.
    merge: Option<Frozen>,
    /// When it was read (unix ms).
    now_ms: i64,
}

impl FreezeHolds {
    /// The `Frozen` outcome when a freeze holds `action`.
    pub(super) fn holds(&self, action: &HeadAction, branch: &str) -> Option<MergeOutcome> {
        let frozen = match action {
            HeadAction::Update { .. } => self.update.as_ref(),
            HeadAction::Merge { .. } => self.merge.as_ref(),
            HeadAction::Merged | HeadAction::HeadMoved => None,
        }?;
        tracing::info!(
            ?action,
            ?frozen,
            "the merge queue is frozen; holding its head"
        );
        Some(MergeOutcome::Frozen {
            note: frozen.describe(branch),
            retry_ms: freeze::retry_ms(frozen, self.now_ms),
        })
    }
}

impl Executor {
    /// Whether a freeze holds the head of `q` (the effect's PR), by the repository's
    /// policy and the clock now.
    pub(super) fn freeze_holds(&self, effect: &Effect, q: &BranchQueue) -> FreezeHolds {
        let policy = self.ctx.policy.for_repo(&effect.repo);
        let now_ms = i64::try_from(streams::now_ms()).unwrap_or(i64::MAX);
        let frozen = freeze::frozen(q, &policy.merge_queue_freeze, now_ms).is_some();
        (self.ctx.metrics).queue_frozen(effect.repo.as_str(), &q.branch, frozen);
        FreezeHolds {
            update: freeze::gate(q, &[effect.number], &policy, now_ms, false),
            merge: freeze::gate(q, &[effect.number], &policy, now_ms, true),
            now_ms,
        }
    }

    /// Whether a freeze holds the batched queue `q` (the effect's PR its head): no
    /// batch is formed (with `merge_queue_freeze_test` off) and no green batch lands
    /// unless every PR in it is a hotfix. Cleaning up old batch branches and a landing
    /// already begun are never held.
    pub(super) fn batch_frozen(&self, effect: &Effect, q: &BranchQueue) -> Option<MergeOutcome> {
        if !q.stale_branches.is_empty() {
            return None;
        }
        let (numbers, merging) = match &q.batch {
            None => (vec![effect.number], false),
            Some(b) if b.stage != BatchStage::Landing => (b.numbers(), false),
            Some(b) if b.landing_pr.is_none() => (b.numbers(), true),
            Some(_) => return None,
        };
        let policy = self.ctx.policy.for_repo(&effect.repo);
        let now_ms = i64::try_from(streams::now_ms()).unwrap_or(i64::MAX);
        let frozen = freeze::frozen(q, &policy.merge_queue_freeze, now_ms).is_some();
        (self.ctx.metrics).queue_frozen(effect.repo.as_str(), &q.branch, frozen);
        let held = freeze::gate(q, &numbers, &policy, now_ms, merging)?;
        tracing::info!(
            ?numbers,
            merging,
            ?held,
            "the merge queue is frozen; holding its batch"
        );
        Some(MergeOutcome::Frozen {
            note: held.describe(&q.branch),
            retry_ms: freeze::retry_ms(&held, now_ms),
        })
    }

    /// Sets or ends the manual freeze of a branch's queue and tells its head.
    pub(super) async fn queue_freeze(
        &self,
        effect: &Effect,
        op: &FreezeOp,
    ) -> Result<Vec<Event>, Failure> {
        let now = i64::try_from(streams::now_ms()).unwrap_or(i64::MAX);
        let mut conn = self.ctx.store.conn();
        let keys = self.ctx.store.keys();
        let repo = effect.repo.as_str();
        let (q, changed) = queue::change(&mut conn, keys, repo, &op.branch, |q| {
            q.apply_freeze(op, now)
        })
        .await?;
        tracing::info!(branch = %op.branch, by = %op.by, action = ?op.action, changed, "merge queue freeze");
        self.ctx
            .metrics
            .queue_frozen(repo, &op.branch, q.freeze.is_some());
        let head = q.head.and_then(|h| q.places().remove(&h).map(|p| (h, p)));
        Ok(head
            .into_iter()
            .map(|(number, place)| place_event(effect, number, place))
            .collect())
    }
}
