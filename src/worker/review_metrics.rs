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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::record::{ReviewRound, ReviewVerdict};

    fn round(n: u64, verdict: Option<ReviewVerdict>) -> ReviewRound {
        ReviewRound {
            head_sha: format!("{n:040x}").parse().unwrap(),
            work_id: format!("o:r:pr:1:{n}").parse().unwrap(),
            reviewer: "rev".parse().unwrap(),
            dispatched_ms: 0,
            verdict,
            review_id: None,
        }
    }

    #[test]
    fn dispatches_verdicts_and_rounds_at_merge_are_counted_once() {
        let m = crate::telemetry::Metrics::new();
        let old = PrRecord::new("o/r".parse().unwrap(), 1);
        let mut new = old.clone();
        new.agent_review.rounds = vec![round(1, None)];
        observe(&m.reviews, &old, &new);
        let mut later = new.clone();
        later.agent_review.rounds[0].verdict = Some(ReviewVerdict::ChangesRequested);
        later
            .agent_review
            .rounds
            .push(round(2, Some(ReviewVerdict::Approved)));
        observe(&m.reviews, &new, &later);
        // The same step seen again (a replayed no-op) counts nothing.
        observe(&m.reviews, &later, &later);
        let mut merged = later.clone();
        merged.pr = Some(crate::core::event::PrSnapshot {
            state: PrState::Merged,
            ..serde_json::from_value(serde_json::json!({
                "repo": "o/r", "number": 1, "state": "open", "draft": false, "title": "t",
                "body": "", "author": null, "head_sha": null, "head_ref": "", "base_ref": "main",
                "labels": [], "mergeable": null, "updated_ms": 0
            }))
            .unwrap()
        });
        observe(&m.reviews, &later, &merged);
        observe(&m.reviews, &merged, &merged);
        assert_eq!(m.reviews.dispatched.get(), 2);
        let v = |name: &str| m.reviews.verdicts.with_label_values(&[name]).get();
        assert_eq!((v("approved"), v("changes-requested")), (1, 1));
        assert_eq!(m.reviews.rounds_per_merged_pr.get_sample_count(), 1);
        assert_eq!(m.reviews.rounds_per_merged_pr.get_sample_sum(), 2.0);
    }
}
