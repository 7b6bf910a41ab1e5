//! The merge queue's effects (issue 16; rules in `core::queue` and
//! `core::machine::queue`).
//!
//! `Queue(op)`: the op is applied to the branch's queue under compare-and-set
//! (`store::queue`), and every PR whose place changed is told (an `EffectOutcome::Queue`
//! event each). A redelivered op changes nothing and tells its PR and the head again.
//!
//! `QueueAdvance`: the head of a queue goes one step, never two at once per branch:
//! 1. Re-read the PR: merged → `Merged`; closed or moved past the pinned head →
//!    `HeadMoved` (a redelivered advance whose update already happened stops here: the
//!    update moved the head, so it is never done twice).
//!    A PR that targets another branch now is neither updated nor merged: `HeadMoved`,
//!    so its record re-reads it and leaves this branch's queue (`retargeted`).
//! 2. The queue must still name this PR its head; otherwise the PR is told its place.
//! 3. Take the branch's merge lease (the same one plain merges take), renewed while
//!    this executor works and fenced before each write.
//! 4. Read the branch tip; `core::queue::head_action` decides: not built on the tip →
//!    `POST …/update` (200 `Updated`, 409 `Conflict`, a 500 or timeout is ambiguous:
//!    the PR is re-read, a moved head means it happened); on the tip → the plain merge
//!    procedure (CI and reviews re-checked on the pinned head, `head_commit_id`), with
//!    `Do: fast-forward-only` when the repository allows it. A merge that did not
//!    happen for an unclear reason (Forgejo answers 500 with an empty message when it
//!    cannot fast-forward) is resolved by reading the PR and then the tip: a moved tip
//!    is `BaseMoved` (the head is updated again), never a blind retry.

use crate::core::effect::Effect;
use crate::core::event::{EffectOutcome, Event, MergeOutcome};
use crate::core::ids::{Scope, Sha};
use crate::core::policy::{MergeStyle, UpdateStyle};
use crate::core::queue::{HeadAction, HeadReading, QueueOp, head_action};
use crate::forgejo::{Cause, PullRequest, UpdateOutcome};
use crate::store::{queue, streams};

use super::Executor;
use super::act::Failure;
use super::merge::{Keeper, MergeAsk, busy, outcome_event, settled};
use super::queue_freeze::FreezeHolds;

/// How long a PR that is not the head waits before its record may ask again (ms).
const NOT_HEAD_RETRY_MS: u64 = 1_000;

/// The parameters of a `QueueAdvance` effect.
pub(super) struct AdvanceAsk<'a> {
    /// The tested head.
    pub head_sha: &'a Sha,
    /// Target branch.
    pub branch: &'a str,
    /// Update style.
    pub update_style: UpdateStyle,
    /// Merge style where fast-forward-only is not allowed.
    pub style: MergeStyle,
    /// `delete_branch_after_merge`.
    pub delete_branch: bool,
    /// The record may have its head updated once more this turn.
    pub may_update: bool,
    /// When the effect was queued.
    pub queued_ms: u64,
    /// The batch settings (issue 29): `Some` advances the branch's batch instead.
    pub batch: Option<crate::core::effect::BatchSettings>,
}

impl Executor {
    /// Applies a queue op and tells the PRs whose place changed.
    pub(super) async fn queue_op(
        &self,
        effect: &Effect,
        op: &QueueOp,
    ) -> Result<Vec<Event>, Failure> {
        let now = i64::try_from(streams::now_ms()).unwrap_or(i64::MAX);
        let mut conn = self.ctx.store.conn();
        let keys = self.ctx.store.keys();
        let applied = queue::apply(&mut conn, keys, effect.repo.as_str(), op, now).await?;
        tracing::info!(
            branch = %op.branch,
            pr = op.number,
            action = ?op.action,
            head = ?applied.queue.head,
            waiting = applied.queue.order().len(),
            "merge queue op applied"
        );
        self.ctx.metrics.queue_op(
            effect.repo.as_str(),
            op,
            &applied.queue,
            applied.changed,
            now,
        );
        let merged = matches!(
            op.action,
            crate::core::queue::QueueAction::Leave {
                reason: crate::core::queue::Departure::Merged
            }
        );
        if let (true, Some(entry)) = (merged && applied.changed, &applied.entry_before) {
            let waited = now.saturating_sub(entry.entered_ms);
            (self.ctx.metrics).queue_merged_after(effect.repo.as_str(), &op.branch, waited);
        }
        Ok(applied
            .notices
            .into_iter()
            .map(|(number, place)| place_event(effect, number, place))
            .collect())
    }

    /// Runs a `QueueAdvance` effect; the events end with the outcome for the machine.
    pub(super) async fn queue_advance(
        &self,
        effect: &Effect,
        ask: AdvanceAsk<'_>,
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
        let mut conn = self.ctx.store.conn();
        let keys = self.ctx.store.keys();
        if pr.base.ref_name != ask.branch {
            // Never updated or merged by this branch's queue: the record re-reads the
            // PR (`HeadMoved`), sees its new base and leaves the queue itself
            // (`retargeted`), so no two records believe they are the head.
            tracing::info!(
                branch = ask.branch,
                now_targets = %pr.base.ref_name,
                "the queue's head targets another branch now; not advancing"
            );
            return Ok(vec![outcome_event(effect, MergeOutcome::HeadMoved)]);
        }
        let q = queue::load(&mut conn, keys, repo, ask.branch).await?;
        if q.head != Some(effect.number) {
            tracing::info!(head = ?q.head, "not the head of the merge queue; not advancing");
            let mut events = Vec::new();
            if let Some(place) = q.places().remove(&effect.number) {
                events.push(place_event(effect, effect.number, place));
            }
            let wait = MergeOutcome::LockBusy {
                retry_ms: NOT_HEAD_RETRY_MS,
            };
            events.push(outcome_event(effect, wait));
            return Ok(events);
        }
        let holds = self.freeze_holds(effect, &q);
        let keeper = match self.take_merge_lease(effect, ask.branch).await? {
            Ok(keeper) => keeper,
            Err(busy) => return Ok(vec![busy]),
        };
        let result = match &ask.batch {
            Some(settings) => self.batch_advance(effect, &ask, settings, &keeper).await,
            // The serial queue re-tests its head as a batch of one (issue 29).
            None if q.batch.is_some() => {
                let policy = self.ctx.policy.for_repo(&effect.repo);
                let settings = crate::core::effect::BatchSettings {
                    size: 1,
                    wait_secs: 0,
                    flaky_retries: policy.merge_queue_flaky_retries,
                    step_results: false,
                };
                self.batch_advance(effect, &ask, &settings, &keeper).await
            }
            None => self.advance_locked(effect, &ask, &pr, &keeper, holds).await,
        };
        self.release_merge_lease(effect, ask.branch, keeper).await;
        result
    }

    /// Steps 4 on, under the lease.
    async fn advance_locked(
        &self,
        effect: &Effect,
        ask: &AdvanceAsk<'_>,
        pr: &PullRequest,
        keeper: &Keeper,
        holds: FreezeHolds,
    ) -> Result<Vec<Event>, Failure> {
        let repo = effect.repo.as_str();
        let reads = self.forgejo.with_cause(Cause::MergeCheck);
        let tip = parse_sha(&reads.branch_tip(repo, ask.branch).await?)?;
        let reading = HeadReading {
            merged: pr.merged,
            open: pr.is_open(),
            head: parse_sha(&pr.head.sha)?,
            pinned: ask.head_sha.clone(),
            merge_base: pr.merge_base.parse().ok(),
            tip,
        };
        let action = head_action(&reading);
        tracing::info!(?action, "merge queue head");
        if let Some(frozen) = holds.holds(&action, ask.branch) {
            return Ok(vec![outcome_event(effect, frozen)]);
        }
        match action {
            HeadAction::Merged => Ok(vec![outcome_event(effect, MergeOutcome::Merged)]),
            HeadAction::HeadMoved => Ok(vec![outcome_event(effect, MergeOutcome::HeadMoved)]),
            HeadAction::Update { tip } if !ask.may_update => {
                tracing::info!(%tip, "the tip moved again and the turn's updates ran out");
                Ok(vec![outcome_event(effect, MergeOutcome::BaseMoved)])
            }
            HeadAction::Update { tip } => {
                let outcome = self.update(effect, ask, keeper, tip).await?;
                self.ctx.metrics.queue_update(repo, ask.branch, &outcome);
                let mut events = Vec::new();
                if matches!(outcome, MergeOutcome::Updated { .. }) {
                    // CI runs on the new head: counted with the batches' runs.
                    self.write(effect, ask.branch, &mut events, |q| q.serial_ci_run())
                        .await?;
                }
                events.push(outcome_event(effect, outcome));
                Ok(events)
            }
            HeadAction::Merge { tip } => {
                let settings = reads.repo_settings(repo).await?;
                let style = match settings.allow_fast_forward_only_merge {
                    true => MergeStyle::FastForwardOnly,
                    false => ask.style,
                };
                let merge = MergeAsk {
                    head_sha: ask.head_sha,
                    style,
                    delete_branch: ask.delete_branch,
                    title: None,
                    message: None,
                    queued_ms: ask.queued_ms,
                };
                let mut events = self.merge_locked(effect, &merge, pr, keeper).await?;
                let unclear = matches!(
                    events.last(),
                    Some(Event::EffectOutcome {
                        outcome: EffectOutcome::Merge(MergeOutcome::TryAgain),
                        ..
                    })
                );
                if unclear {
                    let now = parse_sha(&reads.branch_tip(repo, ask.branch).await?)?;
                    if now != tip {
                        tracing::info!(%tip, %now, "the tip moved under the merge");
                        events.pop();
                        events.push(outcome_event(effect, MergeOutcome::BaseMoved));
                    } else if let Some(red) = (self.serial_red(
                        effect,
                        ask,
                        &pr.head.ref_name,
                        &tip,
                        keeper,
                        settings.allow_fast_forward_only_merge,
                    ))
                    .await?
                    {
                        // Not merged because its CI is red on the tip: re-test or eject.
                        events.pop();
                        events.extend(red);
                    }
                }
                Ok(events)
            }
        }
    }

    /// Updates the head onto `tip`; a 500 or a timeout is resolved by re-reading the PR.
    async fn update(
        &self,
        effect: &Effect,
        ask: &AdvanceAsk<'_>,
        keeper: &Keeper,
        tip: Sha,
    ) -> Result<MergeOutcome, Failure> {
        let repo = effect.repo.as_str();
        if !keeper.fence().await? {
            tracing::warn!("merge lease lost before the update; not updating");
            return Ok(busy(std::time::Duration::ZERO));
        }
        let answer = self
            .forgejo
            .with_cause(Cause::Effect)
            .update_pull(repo, effect.number, ask.update_style)
            .await?;
        tracing::info!(?answer, "update answered");
        Ok(match answer {
            UpdateOutcome::Updated => MergeOutcome::Updated {
                onto: tip,
                from: ask.head_sha.clone(),
            },
            UpdateOutcome::Conflict { .. } => MergeOutcome::Conflict,
            UpdateOutcome::Refused { code, message } => {
                let pr = self.reread_pr(effect).await?;
                settled(&pr, ask.head_sha).unwrap_or(MergeOutcome::FailedPermanent {
                    message: format!(
                        "updating the PR onto `{}` was refused ({code}): {message}",
                        ask.branch
                    ),
                })
            }
            UpdateOutcome::Ambiguous { .. } => {
                let pr = self.reread_pr(effect).await?;
                match settled(&pr, ask.head_sha) {
                    // The head moved: the update went through.
                    Some(MergeOutcome::HeadMoved) if pr.is_open() => MergeOutcome::Updated {
                        onto: tip,
                        from: ask.head_sha.clone(),
                    },
                    Some(other) => other,
                    None => MergeOutcome::TryAgain,
                }
            }
        })
    }

    /// The PR as it is now.
    async fn reread_pr(&self, effect: &Effect) -> Result<PullRequest, Failure> {
        Ok(self
            .forgejo
            .with_cause(Cause::MergeCheck)
            .get_pull(effect.repo.as_str(), effect.number)
            .await?)
    }
}

/// A sha Forgejo sent; a malformed one is a permanent failure of the effect.
pub(super) fn parse_sha(s: &str) -> Result<Sha, Failure> {
    s.parse()
        .map_err(|_| Failure::Permanent(format!("Forgejo sent {s:?} as a commit sha")))
}

/// The event telling PR `number` its place in the queue, as an outcome of `effect`.
pub(super) fn place_event(effect: &Effect, number: u64, place: crate::core::queue::Place) -> Event {
    Event::EffectOutcome {
        repo: effect.repo.clone(),
        scope: Scope::Pr,
        number,
        effect_id: effect.id.clone(),
        outcome: EffectOutcome::Queue(place),
    }
}
