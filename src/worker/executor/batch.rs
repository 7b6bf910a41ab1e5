//! The batched merge queue's steps (issue 29; rules in `core::queue::batch`), run by
//! the queue head's `QueueAdvance` when `merge_queue_batch_size` > 1, under the
//! branch's merge lease (fenced before every write).
//!
//! Each call goes as far as it can and returns when it must wait (CI runs, a partial
//! batch waits for more PRs): the head's record asks again after `LockBusy`'s delay,
//! which is the backoff read of the batch tip's combined status (Forgejo sends no
//! webhook for commit statuses). Every step is written to the stored queue before or
//! right after its Forgejo call, and each call is idempotent on a restart:
//! 1. stale batch branches (of batches that ended) are deleted first;
//! 2. no batch: the next one is formed from fresh reads of its PRs' heads and written
//!    (its branch name follows from its id, so a crash right after leaves a name);
//! 3. building: the branch is made at the base (409 = made before the crash), and
//!    each PR is merged in through a helper PR (PR branch → batch branch, `Do: merge`,
//!    `head_commit_id` pinned); a helper found merged was merged before the crash; a
//!    conflict ejects that PR (`merge-conflicts`) and the batch goes on without it;
//! 4. testing: the batch tip's combined status, and on red the target tip's, go to
//!    `core::queue::batch::decide` (wait, land, rebuild, re-test, bisect, eject);
//! 5. landing (written before any landing call): the landing PR (batch branch →
//!    target) is created and recorded, then merged `fast-forward-only` pinned to the
//!    tested tip while the target's tip is still the batch's base; a landing PR found
//!    merged was fast-forwarded before a crash. Then each PR is marked merged
//!    (`Do: manually-merged`, `MergeCommitID` = the tip; "already merged" = done
//!    before a crash), and the batch ends.

use crate::core::effect::{BatchSettings, Effect};
use crate::core::event::{EffectOutcome, Event, MergeOutcome};
use crate::core::ids::{Scope, Sha};
use crate::core::policy::MergeStyle;
use crate::core::queue::batch::{
    Batch, BatchCi, BatchConfig, BatchDecision, BatchPr, BatchStage, NextBatch, Retest, StepCi,
    decide, next_batch,
};
use crate::core::queue::{BranchQueue, Ejection};
use crate::core::record::BatchFailure;
use crate::forgejo::{self, Cause, MergeRequest};
use crate::store::{queue, streams};

use super::Executor;
use super::act::Failure;
use super::merge::{Keeper, busy, outcome_event};
use super::queue::{AdvanceAsk, parse_sha, place_event};

/// Steps one advance may take before it returns (a batch of k needs about k + 4).
const MAX_STEPS: usize = 64;

/// The least and most time between two reads of a batch tip's CI (ms).
const POLL_MIN_MS: i64 = 200;
/// See [`POLL_MIN_MS`].
const POLL_MAX_MS: i64 = 10_000;

/// What one step did.
enum Step {
    /// Go on with the next step.
    Next,
    /// Stop; this outcome goes to the head's record.
    Done(MergeOutcome),
}

/// The config of the core's rules from the effect's settings.
fn config(s: &BatchSettings) -> BatchConfig {
    BatchConfig {
        size: usize::try_from(s.size).unwrap_or(usize::MAX).max(1),
        wait_ms: i64::try_from(s.wait_secs.saturating_mul(1000)).unwrap_or(i64::MAX),
        flaky_retries: s.flaky_retries,
        step_results: s.step_results,
    }
}

/// The current time (unix ms).
fn now_ms() -> i64 {
    i64::try_from(streams::now_ms()).unwrap_or(i64::MAX)
}

/// Asks again after `ms`.
fn again(ms: i64) -> MergeOutcome {
    MergeOutcome::LockBusy {
        retry_ms: u64::try_from(ms.clamp(POLL_MIN_MS, POLL_MAX_MS)).unwrap_or(1000),
    }
}

impl Executor {
    /// Advances the branch's batch as far as it goes now (the head is this effect's
    /// PR and the lease is held).
    pub(super) async fn batch_advance(
        &self,
        effect: &Effect,
        ask: &AdvanceAsk<'_>,
        settings: &BatchSettings,
        keeper: &Keeper,
    ) -> Result<Vec<Event>, Failure> {
        let cfg = config(settings);
        let mut events = Vec::new();
        for _ in 0..MAX_STEPS {
            let mut conn = self.ctx.store.conn();
            let keys = self.ctx.store.keys();
            let q = queue::load(&mut conn, keys, effect.repo.as_str(), ask.branch).await?;
            if !keeper.fence().await? {
                events.push(outcome_event(effect, busy(std::time::Duration::ZERO)));
                return Ok(events);
            }
            if !q.stale_branches.is_empty() {
                self.delete_stale(effect, &q, &mut events).await?;
                continue;
            }
            if q.head != Some(effect.number) {
                // Landed, ejected or overtaken on the way: the new head's record
                // carries on.
                let landed = q.departed.contains_key(&effect.number)
                    && !q.entries.iter().any(|e| e.number == effect.number);
                let outcome = match landed {
                    true => MergeOutcome::Merged,
                    false => again(POLL_MIN_MS),
                };
                events.push(outcome_event(effect, outcome));
                return Ok(events);
            }
            if let Some(frozen) = self.batch_frozen(effect, &q) {
                events.push(outcome_event(effect, frozen));
                return Ok(events);
            }
            let step = match q.batch.clone() {
                // The serial queue's re-test ended without landing (the target
                // moved): the head goes on as a serial head (updated again).
                None if cfg.size <= 1 => Step::Done(again(POLL_MIN_MS)),
                None => self.form(effect, &q, &cfg, &mut events).await?,
                Some(b) => match b.stage {
                    BatchStage::Building => self.build(effect, &q, &b, &mut events).await?,
                    BatchStage::Testing => self.test(effect, &q, &b, &cfg, &mut events).await?,
                    BatchStage::Landing => self.land(effect, &q, &b, keeper, &mut events).await?,
                },
            };
            if let Step::Done(outcome) = step {
                events.push(outcome_event(effect, outcome));
                return Ok(events);
            }
        }
        events.push(outcome_event(effect, again(POLL_MIN_MS)));
        Ok(events)
    }

    /// Writes `f` to the stored queue and tells the PRs whose place changed.
    pub(super) async fn write(
        &self,
        effect: &Effect,
        branch: &str,
        events: &mut Vec<Event>,
        f: impl Fn(&mut BranchQueue),
    ) -> Result<BranchQueue, Failure> {
        let mut conn = self.ctx.store.conn();
        let keys = self.ctx.store.keys();
        let applied = queue::update(&mut conn, keys, effect.repo.as_str(), branch, f).await?;
        let now = i64::try_from(streams::now_ms()).unwrap_or(i64::MAX);
        (self.ctx.metrics).queue_written(effect.repo.as_str(), branch, &applied.queue, now);
        for (number, place) in applied.notices {
            events.push(place_event(effect, number, place));
        }
        Ok(applied.queue)
    }

    /// [`Self::write`] of a change to batch `id`: applied only while `id` is still
    /// the queue's batch (a step that lost a race to another executor, or a batch that
    /// ended meanwhile, changes nothing).
    async fn write_batch(
        &self,
        effect: &Effect,
        branch: &str,
        events: &mut Vec<Event>,
        id: u64,
        f: impl Fn(&mut BranchQueue),
    ) -> Result<BranchQueue, Failure> {
        self.write(effect, branch, events, move |q| {
            if q.batch.as_ref().is_some_and(|x| x.id == id) {
                f(q);
            }
        })
        .await
    }

    /// Deletes the branches of batches that ended.
    async fn delete_stale(
        &self,
        effect: &Effect,
        q: &BranchQueue,
        events: &mut Vec<Event>,
    ) -> Result<(), Failure> {
        let writes = self.forgejo.with_cause(Cause::Effect);
        for name in &q.stale_branches {
            let deleted = writes.delete_branch(effect.repo.as_str(), name).await?;
            tracing::info!(branch = %name, deleted, "batch branch removed");
            let name = name.clone();
            self.write(effect, &q.branch, events, move |q| q.branch_deleted(&name))
                .await?;
        }
        Ok(())
    }

    /// Forms the next batch from fresh reads of its PRs.
    async fn form(
        &self,
        effect: &Effect,
        q: &BranchQueue,
        cfg: &BatchConfig,
        events: &mut Vec<Event>,
    ) -> Result<Step, Failure> {
        let repo = effect.repo.as_str();
        let numbers = match next_batch(q, cfg, now_ms()) {
            NextBatch::Empty => return Ok(Step::Done(again(POLL_MAX_MS))),
            NextBatch::Wait(ms) => return Ok(Step::Done(again(ms))),
            NextBatch::Eject { number, failing } => {
                self.eject_unrun(effect, q, number, failing, events).await?;
                return Ok(Step::Next);
            }
            NextBatch::Form(numbers) => numbers,
        };
        let reads = self.forgejo.with_cause(Cause::MergeCheck);
        let mut prs = Vec::new();
        for n in numbers {
            let pr = reads.get_pull(repo, n).await?;
            // A PR that left (merged, closed, retargeted) is not batched; its record
            // leaves the queue on its own.
            if !pr.is_open() || pr.merged || pr.base.ref_name != q.branch {
                continue;
            }
            prs.push(BatchPr {
                number: n,
                head: parse_sha(&pr.head.sha)?,
                head_ref: pr.head.ref_name.clone(),
            });
        }
        if prs.is_empty() {
            return Ok(Step::Done(again(POLL_MAX_MS)));
        }
        let tip = parse_sha(&reads.branch_tip(repo, &q.branch).await?)?;
        let now = now_ms();
        tracing::info!(prs = ?prs.iter().map(|p| p.number).collect::<Vec<_>>(), %tip, "batch formed");
        self.write(effect, &q.branch, events, move |q| {
            if q.batch.is_none() {
                q.start_batch(prs.clone(), tip.clone(), now);
            }
        })
        .await?;
        Ok(Step::Next)
    }

    /// Ejects the last suspect of a bisection whose failure two red runs reproduced,
    /// without a run of its own ([`NextBatch::Eject`]).
    async fn eject_unrun(
        &self,
        effect: &Effect,
        q: &BranchQueue,
        number: u64,
        failing: Vec<String>,
        events: &mut Vec<Event>,
    ) -> Result<(), Failure> {
        let repo = effect.repo.as_str();
        let reads = self.forgejo.with_cause(Cause::MergeCheck);
        let head = parse_sha(&reads.get_pull(repo, number).await?.head.sha)?;
        let with = q
            .bisect
            .as_ref()
            .map(|b| b.tested_with.clone())
            .unwrap_or_default();
        let note = format!(
            "failed on top of {} in the merge queue of `{}` (bisected: the PRs before it \
             landed green, and {} failed on two runs that held it)",
            list(&with, number),
            q.branch,
            failing.join(", ")
        );
        tracing::info!(
            pr = number,
            ?failing,
            "last suspect ejected: its failure was reproduced"
        );
        events.push(ejected(
            effect,
            number,
            head,
            Ejection::CiFailed,
            failing,
            note,
        ));
        self.write(effect, &q.branch, events, move |q| {
            let lone =
                q.batch.is_none() && q.bisect.as_ref().is_some_and(|b| b.suspects == [number]);
            if lone {
                q.batch_eject(number);
            }
        })
        .await?;
        Ok(())
    }

    /// The serial queue's head (`merge_queue_batch_size` = 1) is red on top of `tip`
    /// (`None` when its CI is not red): [`Retest`] decides. A re-test is a batch of
    /// one on a new branch (`BranchQueue::start_retest`), carried on at once by
    /// [`Self::batch_advance`]; otherwise the head is ejected to `ci-fix` (the
    /// `QueueEjected` event, then `TryAgain`: its record parks it). A re-test lands by
    /// a fast-forward, so a repository that does not allow `fast-forward-only` merges
    /// (`fast_forward` false) gets none.
    pub(super) async fn serial_red(
        &self,
        effect: &Effect,
        ask: &AdvanceAsk<'_>,
        head_ref: &str,
        tip: &Sha,
        keeper: &Keeper,
        fast_forward: bool,
    ) -> Result<Option<Vec<Event>>, Failure> {
        let repo = effect.repo.as_str();
        let BatchCi::Red {
            failing, tip_green, ..
        } = self.batch_ci(repo, ask.head_sha, tip, &[]).await?
        else {
            return Ok(None);
        };
        let policy = self.ctx.policy.for_repo(&effect.repo);
        let max = match fast_forward {
            true => policy.merge_queue_flaky_retries,
            false => 0,
        };
        let retest = Retest {
            failing: &failing,
            tip_green: &tip_green,
            failed_before: &[],
            retries: 0,
            max,
        };
        let mut events = Vec::new();
        tracing::info!(
            ?failing,
            retest = retest.wanted(),
            "the serial head is red on the tip"
        );
        if !retest.wanted() {
            let unknown: Vec<&str> = (failing.iter())
                .filter(|f| !tip_green.contains(*f))
                .map(String::as_str)
                .collect();
            let why = match (unknown.is_empty(), fast_forward, max) {
                (false, _, _) => format!(
                    "; not re-tested: {} did not pass on the tip (a new test)",
                    unknown.join(", ")
                ),
                (true, false, _) => "; not re-tested: the repository does not allow \
                                     fast-forward-only merges, which a re-test lands with"
                    .into(),
                (true, true, 0) => String::new(),
                (true, true, _) => "; not re-tested".into(),
            };
            let head = ask.head_sha.clone();
            let note = format!(
                "CI failed on {head}, the head after Shepherd's merge queue updated this PR \
                 onto `{}` at {tip}: it passed before and fails only on top of the new base{why}",
                ask.branch
            );
            events.push(ejected(
                effect,
                effect.number,
                head,
                Ejection::CiFailed,
                failing,
                note,
            ));
            events.push(outcome_event(effect, MergeOutcome::TryAgain));
            return Ok(Some(events));
        }
        let pr = BatchPr {
            number: effect.number,
            head: ask.head_sha.clone(),
            head_ref: head_ref.to_owned(),
        };
        let (base, now) = (tip.clone(), now_ms());
        self.write(effect, ask.branch, &mut events, move |q| {
            if q.batch.is_none() && q.head == Some(pr.number) {
                q.start_retest(pr.clone(), base.clone(), failing.clone(), now);
            }
        })
        .await?;
        let settings = BatchSettings {
            size: 1,
            wait_secs: 0,
            flaky_retries: max,
            step_results: false,
        };
        events.extend(self.batch_advance(effect, ask, &settings, keeper).await?);
        Ok(Some(events))
    }

    /// Makes the branch and merges the next PR into it (or records the built tip).
    async fn build(
        &self,
        effect: &Effect,
        q: &BranchQueue,
        b: &Batch,
        events: &mut Vec<Event>,
    ) -> Result<Step, Failure> {
        let repo = effect.repo.as_str();
        let name = b.branch_name(&q.branch);
        let writes = self.forgejo.with_cause(Cause::Effect);
        if b.built == 0 {
            let made = writes.create_branch(repo, &name, b.base.as_str()).await?;
            tracing::info!(branch = %name, ?made, "batch branch");
        }
        let Some(p) = b.prs.get(b.built) else {
            let tip = parse_sha(&writes.branch_tip(repo, &name).await?)?;
            self.write(effect, &q.branch, events, move |q| {
                if q.batch
                    .as_ref()
                    .is_some_and(|x| x.stage == BatchStage::Building)
                {
                    q.batch_built(tip.clone());
                }
            })
            .await?;
            return Ok(Step::Next);
        };
        let title = format!(
            "Shepherd merge queue batch {} of `{}`: #{}",
            b.id, q.branch, p.number
        );
        let helper = match b.helpers.get(&p.number) {
            Some(h) => {
                let reads = self.forgejo.with_cause(Cause::MergeCheck);
                reads.get_pull(repo, *h).await?
            }
            None => {
                let helper = writes
                    .create_helper_pull(repo, &p.head_ref, &name, &title)
                    .await?;
                let (n, h, id) = (p.number, helper.number, b.id);
                self.write_batch(effect, &q.branch, events, id, move |q| q.batch_helper(n, h))
                    .await?;
                helper
            }
        };
        let merged = helper.merged || self.merge_helper(repo, helper.number, &p.head).await?;
        let (number, id) = (p.number, b.id);
        if merged {
            // Only the queue writes to its batch branch, and the next merge waits for
            // this write: its tip is this merge's commit (a step CI tests).
            let step = parse_sha(&writes.branch_tip(repo, &name).await?)?;
            self.write(effect, &q.branch, events, move |q| {
                if q.batch.as_ref().is_some_and(|x| {
                    x.id == id && x.prs.get(x.built).is_some_and(|p| p.number == number)
                }) {
                    q.batch_merged_one(step.clone());
                }
            })
            .await?;
            return Ok(Step::Next);
        }
        tracing::info!(pr = number, "conflicts while building the batch: ejected");
        events.push(conflict_event(effect, q, b, p));
        self.write_batch(effect, &q.branch, events, id, move |q| {
            q.batch_conflict(number)
        })
        .await?;
        Ok(Step::Next)
    }

    /// Merges PR `number` of `repo` with `style`, pinned to `head` (Forgejo's own
    /// title and message, no branch deleted): Forgejo's answer.
    async fn merge_pinned(
        &self,
        repo: &str,
        number: u64,
        head: &Sha,
        style: MergeStyle,
    ) -> Result<forgejo::MergeOutcome, Failure> {
        let request = MergeRequest {
            style,
            head_commit_id: head.to_string(),
            delete_branch_after_merge: false,
            title: None,
            message: None,
        };
        Ok(self
            .forgejo
            .with_cause(Cause::Effect)
            .merge(repo, number, &request)
            .await?)
    }

    /// Merges a helper PR into the batch branch pinned to `head`: true when merged,
    /// false on a conflict (or a moved head); anything unclear is read back.
    async fn merge_helper(&self, repo: &str, number: u64, head: &Sha) -> Result<bool, Failure> {
        match self
            .merge_pinned(repo, number, head, MergeStyle::Merge)
            .await?
        {
            forgejo::MergeOutcome::Merged => Ok(true),
            forgejo::MergeOutcome::Conflict { .. } => Ok(false),
            other => {
                let pr = self
                    .forgejo
                    .with_cause(Cause::MergeCheck)
                    .get_pull(repo, number)
                    .await?;
                if pr.merged {
                    return Ok(true);
                }
                Err(Failure::Transient {
                    message: format!(
                        "merging #{number} into its batch branch did not happen: {other:?}"
                    ),
                    retry_after: None,
                })
            }
        }
    }

    /// Reads the batch tip's CI (and the target tip's on red) and acts on the core's
    /// decision.
    async fn test(
        &self,
        effect: &Effect,
        q: &BranchQueue,
        b: &Batch,
        cfg: &BatchConfig,
        events: &mut Vec<Event>,
    ) -> Result<Step, Failure> {
        let repo = effect.repo.as_str();
        let reads = self.forgejo.with_cause(Cause::MergeCheck);
        let tip = parse_sha(&reads.branch_tip(repo, &q.branch).await?)?;
        let Some(batch_tip) = &b.tip else {
            return Err(Failure::Permanent(
                "a batch under test without a tip".into(),
            ));
        };
        // The intermediate commits (prefixes of 1 … k − 1 PRs), read only on red.
        let steps = match (cfg.step_results, b.steps.split_last()) {
            (true, Some((_, before))) if b.steps.len() == b.prs.len() => before,
            _ => &[],
        };
        let ci = self.batch_ci(repo, batch_tip, &tip, steps).await?;
        let decision = decide(b, cfg, &ci, &tip);
        tracing::info!(batch = b.id, prs = ?b.numbers(), ?decision, "batch CI");
        let failing = match &ci {
            BatchCi::Red { failing, .. } => failing.clone(),
            BatchCi::Pending | BatchCi::Green => Vec::new(),
        };
        let change: Change = match decision {
            BatchDecision::Wait => {
                // An eighth of the batch's age: a result is seen at most ~12 % of the
                // run's time late (a 10-minute CI is read every 10 s, the bound).
                let waited = now_ms().saturating_sub(b.started_ms);
                return Ok(Step::Done(again(waited / 8)));
            }
            BatchDecision::Land => match self.changed_member(repo, q, b).await? {
                Some(number) => {
                    tracing::info!(pr = number, "a batched PR changed since it was tested");
                    Box::new(move |q| q.batch_drop(number))
                }
                None => Box::new(BranchQueue::batch_landing),
            },
            BatchDecision::Rebuild => Box::new(BranchQueue::batch_rebuild),
            BatchDecision::Retry => {
                let now = now_ms();
                Box::new(move |q| q.batch_retry(failing.clone(), tip.clone(), now))
            }
            BatchDecision::Bisect(narrowed) => {
                // The green prefix lands: none of its PRs may have changed since.
                let prefix = Batch {
                    prs: b.prs[..narrowed.green.min(b.prs.len())].to_vec(),
                    ..b.clone()
                };
                let changed = match prefix.prs.is_empty() {
                    true => None,
                    false => self.changed_member(repo, q, &prefix).await?,
                };
                match changed {
                    Some(number) => {
                        tracing::info!(
                            pr = number,
                            "a PR of the green prefix changed since it was tested"
                        );
                        Box::new(move |q| q.batch_drop(number))
                    }
                    None => {
                        tracing::info!(
                            green = narrowed.green,
                            red = narrowed.red,
                            "red batch narrowed by its intermediate commits' CI"
                        );
                        let now = now_ms();
                        Box::new(move |q| q.batch_bisect(failing.clone(), narrowed.clone(), now))
                    }
                }
            }
            BatchDecision::Eject { number } => {
                let note = match cfg.size <= 1 {
                    true => serial_note(q, b, &tip, "re-tested once on a new branch: failed again"),
                    false => culprit_note(q, number, &tip),
                };
                let head = b
                    .prs
                    .first()
                    .map_or_else(|| tip.clone(), |p| p.head.clone());
                let reason = Ejection::CiFailed;
                events.push(ejected(effect, number, head, reason, failing, note));
                Box::new(move |q| {
                    q.batch_eject(number);
                })
            }
        };
        let id = b.id;
        self.write_batch(effect, &q.branch, events, id, move |q| change(q))
            .await?;
        Ok(Step::Next)
    }

    /// A PR of the batch that is no longer what was tested: parked or gone from the
    /// queue, closed, merged otherwise, or pushed to (its head is not the pinned one).
    async fn changed_member(
        &self,
        repo: &str,
        q: &BranchQueue,
        b: &Batch,
    ) -> Result<Option<u64>, Failure> {
        if let Some(n) = q.batch_left().first() {
            return Ok(Some(*n));
        }
        let reads = self.forgejo.with_cause(Cause::MergeCheck);
        for p in &b.prs {
            let pr = reads.get_pull(repo, p.number).await?;
            let same = pr.head.sha.eq_ignore_ascii_case(p.head.as_str());
            if !pr.is_open() || pr.merged || !same || pr.base.ref_name != q.branch {
                return Ok(Some(p.number));
            }
        }
        Ok(None)
    }

    /// The CI of `batch_tip`; on red, with the checks that passed on the target's tip
    /// and the CI of the intermediate commits `steps`.
    async fn batch_ci(
        &self,
        repo: &str,
        batch_tip: &Sha,
        tip: &Sha,
        steps: &[Sha],
    ) -> Result<BatchCi, Failure> {
        let reads = self.forgejo.with_cause(Cause::MergeCheck);
        let combined = reads.combined_status(repo, batch_tip.as_str()).await?;
        let failing: Vec<String> = combined
            .statuses
            .iter()
            .filter(|s| matches!(s.status.as_str(), "failure" | "error" | "warning"))
            .map(|s| s.context.clone())
            .collect();
        let pending =
            combined.statuses.is_empty() || combined.statuses.iter().any(|s| s.status == "pending");
        if failing.is_empty() {
            return Ok(match pending {
                true => BatchCi::Pending,
                false => BatchCi::Green,
            });
        }
        let on_tip = reads.combined_status(repo, tip.as_str()).await?;
        let tip_green = on_tip
            .statuses
            .iter()
            .filter(|s| s.status == "success")
            .map(|s| s.context.clone())
            .collect();
        let mut step_ci = Vec::with_capacity(steps.len());
        for step in steps {
            let combined = reads.combined_status(repo, step.as_str()).await?;
            step_ci.push(step_result(&combined));
        }
        Ok(BatchCi::Red {
            failing,
            tip_green,
            steps: step_ci,
        })
    }

    /// Lands a green batch: the landing PR, the fast-forward, the PRs marked merged.
    async fn land(
        &self,
        effect: &Effect,
        q: &BranchQueue,
        b: &Batch,
        keeper: &Keeper,
        events: &mut Vec<Event>,
    ) -> Result<Step, Failure> {
        let repo = effect.repo.as_str();
        let name = b.branch_name(&q.branch);
        let Some(batch_tip) = b.tip.clone() else {
            return Err(Failure::Permanent("a landing batch without a tip".into()));
        };
        let id = b.id;
        let Some(landing) = b.landing_pr else {
            if let Some(at) = &b.made_at {
                // A green prefix of a red batch: its branch at the intermediate commit
                // CI passed (409: made before a crash).
                let made = (self.forgejo.with_cause(Cause::Effect))
                    .create_branch(repo, &name, at.as_str())
                    .await?;
                tracing::info!(branch = %name, %at, ?made, "green prefix branch");
            }
            let title = format!("Shepherd merge queue batch {id} of `{}`", q.branch);
            let pr = self
                .forgejo
                .with_cause(Cause::Effect)
                .create_helper_pull(repo, &name, &q.branch, &title)
                .await?;
            self.write_batch(effect, &q.branch, events, id, move |q| {
                q.batch_landing_pr(pr.number)
            })
            .await?;
            return Ok(Step::Next);
        };
        let reads = self.forgejo.with_cause(Cause::MergeCheck);
        let pr = reads.get_pull(repo, landing).await?;
        if !pr.merged {
            let tip = parse_sha(&reads.branch_tip(repo, &q.branch).await?)?;
            if tip != b.base
                || !keeper.fence().await?
                || !self.fast_forward(repo, landing, &batch_tip).await?
            {
                let moved = tip != b.base
                    || parse_sha(&reads.branch_tip(repo, &q.branch).await?)? != b.base;
                if !moved {
                    return Ok(Step::Done(MergeOutcome::TryAgain));
                }
                tracing::info!(
                    batch = id,
                    "the target moved before the batch landed: rebuilt"
                );
                self.write_batch(effect, &q.branch, events, id, move |q| q.batch_rebuild())
                    .await?;
                return Ok(Step::Next);
            }
        }
        let writes = self.forgejo.with_cause(Cause::Effect);
        for p in &b.prs {
            // Marked before a crash: Forgejo would refuse it (405) now.
            if reads.get_pull(repo, p.number).await?.merged {
                continue;
            }
            let answer = writes
                .mark_manually_merged(repo, p.number, batch_tip.as_str())
                .await?;
            if let forgejo::ManualMerge::Refused { code, message } = &answer {
                tracing::warn!(pr = p.number, code, %message, "not marked merged; its changes landed");
            }
            tracing::info!(pr = p.number, ?answer, "batched PR marked merged");
        }
        let now = now_ms();
        self.write_batch(effect, &q.branch, events, id, move |q| q.batch_landed(now))
            .await?;
        Ok(Step::Next)
    }

    /// The fast-forward of the target to the tested tip: true when it happened.
    async fn fast_forward(&self, repo: &str, landing: u64, tip: &Sha) -> Result<bool, Failure> {
        let answer = self
            .merge_pinned(repo, landing, tip, MergeStyle::FastForwardOnly)
            .await?;
        tracing::info!(?answer, "batch fast-forward");
        if answer.is_merged() {
            return Ok(true);
        }
        let pr = self
            .forgejo
            .with_cause(Cause::MergeCheck)
            .get_pull(repo, landing)
            .await?;
        Ok(pr.merged)
    }
}

/// What an intermediate commit's combined status says: unknown while a check is
/// pending, when nothing ran there, or when a failure is a cancellation (Forgejo
/// Actions writes a cancelled job as `failure` with the description "Has been
/// cancelled": `services/actions/commit_status.go`, forgejo-facts.md §3.8).
fn step_result(combined: &forgejo::CombinedStatus) -> StepCi {
    let s = &combined.statuses;
    let cancelled = s
        .iter()
        .any(|x| x.status == "failure" && x.description.starts_with("Has been cancelled"));
    if s.is_empty() || cancelled || s.iter().any(|x| x.status == "pending") {
        return StepCi::Unknown;
    }
    let failing: Vec<String> = (s.iter())
        .filter(|x| matches!(x.status.as_str(), "failure" | "error" | "warning"))
        .map(|x| x.context.clone())
        .collect();
    match failing.is_empty() {
        true => StepCi::Green,
        false => StepCi::Red { failing },
    }
}

/// A change of the stored queue, applied only while the batch it was decided for is
/// still the queue's batch.
type Change = Box<dyn Fn(&mut BranchQueue) + Send + Sync>;

/// The note of a culprit: what it was tested with (the red batch that started the
/// bisection), or the tip alone.
fn culprit_note(q: &BranchQueue, number: u64, tip: &Sha) -> String {
    let with = q
        .bisect
        .as_ref()
        .map(|x| x.tested_with.clone())
        .unwrap_or_default();
    match with.iter().any(|n| *n != number) {
        true => format!(
            "failed on top of {} in the merge queue of `{}` (bisected: it fails alone on {tip})",
            list(&with, number),
            q.branch
        ),
        false => format!(
            "failed on top of `{}` at {tip} in the merge queue",
            q.branch
        ),
    }
}

/// The note of the serial queue's head ejected after its re-test (`why`).
fn serial_note(q: &BranchQueue, b: &Batch, tip: &Sha, why: &str) -> String {
    let head = b
        .prs
        .first()
        .map(|p| p.head.to_string())
        .unwrap_or_default();
    format!(
        "CI failed on {head}, the head after Shepherd's merge queue updated this PR onto `{}` \
         at {tip}: it passed before and fails only on top of the new base ({why})",
        q.branch
    )
}

/// The event ejecting batched PR `p` whose merge into the batch branch conflicted.
fn conflict_event(effect: &Effect, q: &BranchQueue, b: &Batch, p: &BatchPr) -> Event {
    let note = format!(
        "it does not merge cleanly into the merge queue's batch {} of `{}` \
         (built on {} with {})",
        b.id,
        q.branch,
        b.base,
        list(&b.numbers(), p.number)
    );
    let reason = Ejection::Conflict;
    ejected(effect, p.number, p.head.clone(), reason, Vec::new(), note)
}

/// `#1, #2` of `numbers` without `but`.
fn list(numbers: &[u64], but: u64) -> String {
    let others: Vec<String> = numbers
        .iter()
        .filter(|n| **n != but)
        .map(|n| format!("#{n}"))
        .collect();
    match others.is_empty() {
        true => "nothing else".into(),
        false => others.join(", "),
    }
}

/// The event telling PR `number` the batched queue ejected its `head`.
fn ejected(
    effect: &Effect,
    number: u64,
    head: Sha,
    reason: Ejection,
    failing: Vec<String>,
    note: String,
) -> Event {
    Event::EffectOutcome {
        repo: effect.repo.clone(),
        scope: Scope::Pr,
        number,
        effect_id: effect.id.clone(),
        outcome: EffectOutcome::QueueEjected(BatchFailure {
            head,
            reason,
            failing,
            note,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn combined(statuses: &[(&str, &str, &str)]) -> forgejo::CombinedStatus {
        forgejo::CombinedStatus {
            statuses: (statuses.iter())
                .map(|(context, status, description)| forgejo::CommitStatus {
                    context: (*context).into(),
                    status: (*status).into(),
                    description: (*description).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// An intermediate commit's statuses: a cancelled Forgejo Actions job (`failure`,
    /// "Has been cancelled") or a pending or missing check is no result; a real
    /// failure is red with its contexts.
    #[test]
    fn a_cancelled_or_running_step_is_no_result() {
        let cases = [
            (combined(&[]), StepCi::Unknown),
            (
                combined(&[("ci / test (push)", "failure", "Has been cancelled")]),
                StepCi::Unknown,
            ),
            (
                combined(&[
                    ("ci / lint (push)", "success", "Successful in 3s"),
                    ("ci / test (push)", "pending", "Has started running"),
                ]),
                StepCi::Unknown,
            ),
            (
                combined(&[("ci / test (push)", "success", "Successful in 1m2s")]),
                StepCi::Green,
            ),
            (
                combined(&[
                    ("ci / lint (push)", "success", "Successful in 3s"),
                    ("ci / test (push)", "failure", "Failing after 1m2s"),
                ]),
                StepCi::Red {
                    failing: vec!["ci / test (push)".into()],
                },
            ),
        ];
        for (status, want) in cases {
            assert_eq!(step_result(&status), want, "{status:?}");
        }
    }
}
