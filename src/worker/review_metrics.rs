//! The reviewer agents' figures (`shepherd_reviews_dispatched_total`,
//! `shepherd_review_verdicts_total{verdict}`, `shepherd_review_rounds_per_merged_pr`),
//! read off the difference between a PR record before and after a step. A step
//! recomputed after a version conflict can count twice (rare; the figures are for
//! operators, not for decisions), as `shepherd_ci_poll_reads_per_head` can.

use crate::core::event::PrState;
use crate::core::record::PrRecord;
use crate::telemetry::ReviewMetrics;

/// Counts what the step from `old` to `new` did for reviewer agents.
pub fn observe(m: &ReviewMetrics, old: &PrRecord, new: &PrRecord) {
    let (before, after) = (&old.agent_review.rounds, &new.agent_review.rounds);
    let added = after.len().saturating_sub(before.len());
    m.dispatched.inc_by(added as u64);
    for (i, round) in after.iter().enumerate() {
        let had = before.get(i).and_then(|r| r.verdict);
        if let (None, Some(v)) = (had, round.verdict) {
            m.verdicts.with_label_values(&[v.as_str()]).inc();
        }
    }
    let merged = |r: &PrRecord| r.pr.as_ref().is_some_and(|p| p.state == PrState::Merged);
    if merged(new) && !merged(old) {
        m.rounds_per_merged_pr.observe(after.len() as f64);
    }
}
