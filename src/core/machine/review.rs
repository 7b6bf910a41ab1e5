//! Reviewer agents (`review` work): when a PR wants one, whose approvals count, the
//! rounds with their verdicts, and the signature of an agent's change request.
//!
//! Convergence is built in (an automated review/fix loop must not run away):
//! - at most one `review` dispatch per head sha, ever (`AgentReview::rounds` records
//!   each dispatch's head; a failed or expired review is not repeated on that head);
//! - at most `max_review_rounds` dispatches per PR; the one after that is
//!   `needs-human` with the round history, once;
//! - a reviewer agent's review counts only on the head it was written for: a verdict
//!   for an old head stays in its round's history and changes nothing.

use super::super::event::{PrSnapshot, ReviewFact, ReviewState};
use super::super::ids::{Login, Sha};
use super::super::policy::Policy;
use super::super::record::{PrRecord, ReviewRound, ReviewVerdict};
use super::plan::{CiView, ci_view, is_bot_pr};

/// Longest normalized review body kept in a change request's signature (bytes).
const SIGNATURE_BODY_BYTES: usize = 160;

/// What the reviewer agents should do for the PR now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReviewWant {
    /// Nothing (not enabled, not ready for review, or this head had its review).
    Nothing,
    /// Dispatch a review of `head` by `reviewer` as round `round` (1-based).
    Dispatch {
        /// The reviewer agent's user.
        reviewer: Login,
        /// 1-based round.
        round: u32,
        /// The head to review.
        head: Sha,
    },
    /// Every round is used: a human must look (once).
    Exhausted {
        /// Why, for the hold and the status comment.
        reason: String,
    },
    /// The rounds ran out earlier and a human resumed: wait for a human review.
    WaitingForHuman {
        /// Why.
        reason: String,
    },
}

/// Whether `review` (a reviewer's latest APPROVED) counts toward the PR's required
/// approvals: official, not stale, not dismissed, and for a reviewer agent only when
/// the policy counts agents for this PR and the review is on the current head.
pub(crate) fn counts(review: &ReviewFact, pr: &PrSnapshot, policy: &Policy) -> bool {
    if review.state != ReviewState::Approved || !review.official || review.stale || review.dismissed
    {
        return false;
    }
    if !policy.is_reviewer(&review.reviewer) {
        return true;
    }
    policy
        .reviewer_approvals_count
        .applies(is_bot_pr(pr, policy))
        && on_head(review, pr)
}

/// Counted approvals of the record's latest reviews.
pub(crate) fn approvals(r: &PrRecord, pr: &PrSnapshot, policy: &Policy) -> u32 {
    let Some(reviews) = &r.reviews else {
        return 0;
    };
    let n = reviews
        .latest
        .values()
        .filter(|rv| counts(rv, pr, policy))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Approvals the PR needs (bot or human PR).
pub(crate) fn needed(pr: &PrSnapshot, policy: &Policy) -> u32 {
    match is_bot_pr(pr, policy) {
        true => policy.approvals_bot,
        false => policy.approvals_human,
    }
}

/// Whether a review was written for the PR's current head (reviews without a commit,
/// as some old Forgejo answers have, count as on the head).
fn on_head(review: &ReviewFact, pr: &PrSnapshot) -> bool {
    review.commit_id.is_empty()
        || pr
            .head_sha
            .as_ref()
            .is_some_and(|h| h.as_str() == review.commit_id)
}

/// The signature of a change request: a reviewer agent writes a new review (new id)
/// every round, so its change request is known by what it asks for — the body,
/// whitespace collapsed, words with digits masked (line numbers move with every fix),
/// cut to [`SIGNATURE_BODY_BYTES`] — and the same request coming back after a fix
/// escalates the implementer. A human's is `reviewer#review-id` as before.
pub(crate) fn change_request_signature(
    reviewer: &Login,
    review_id: i64,
    body: &str,
    policy: &Policy,
) -> String {
    if !policy.is_reviewer(reviewer) {
        return format!("{reviewer}#{review_id}");
    }
    let words: Vec<&str> = super::super::texts::strip_review_marker(body)
        .split_whitespace()
        .map(|w| match w.chars().any(|c| c.is_ascii_digit()) {
            true => "#",
            false => w,
        })
        .collect();
    let mut text = words.join(" ");
    if text.len() > SIGNATURE_BODY_BYTES {
        let mut end = SIGNATURE_BODY_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    format!("{reviewer}: {text}")
}

/// What the reviewer agents should do now. Called when nothing else is in the way
/// (no hold, no active work, no conflict, CI not failing, no change request wanting
/// work) and the PR is not ready to merge.
pub(crate) fn wanted(r: &PrRecord, pr: &PrSnapshot, policy: &Policy) -> ReviewWant {
    let Some(head) = pr.head_sha.clone() else {
        return ReviewWant::Nothing;
    };
    let bot_pr = is_bot_pr(pr, policy);
    if !policy.agent_review.applies(bot_pr) || pr.draft || ci_view(r, policy) != CiView::Success {
        return ReviewWant::Nothing;
    }
    if approvals(r, pr, policy) >= needed(pr, policy) {
        return ReviewWant::Nothing;
    }
    let latest = r.reviews.as_ref().map(|v| &v.latest);
    let reviews = latest.into_iter().flat_map(|m| m.values());
    for review in reviews {
        let agent = policy.is_reviewer(&review.reviewer);
        // A person's change request blocks whatever the agents say: that person must
        // look again, so an agent's review of this head would change nothing.
        let human_blocks = !agent
            && review.state == ReviewState::RequestChanges
            && review.official
            && !review.dismissed;
        // A reviewer agent already reviewed this head (on its own, or a round whose
        // result came back).
        let reviewed = agent && review.commit_id == head.as_str();
        if human_blocks || reviewed {
            return ReviewWant::Nothing;
        }
    }
    let rounds = &r.agent_review.rounds;
    if rounds.iter().any(|round| round.head_sha == head) {
        return ReviewWant::Nothing;
    }
    let Some(reviewer) = reviewer_for(pr, policy) else {
        return ReviewWant::Nothing;
    };
    let max = policy.max_review_rounds;
    let used = u32::try_from(rounds.len()).unwrap_or(u32::MAX);
    if used >= max {
        let reason = format!(
            "{used} review rounds by reviewer agents without an approval (max_review_rounds \
             = {max}); a human must review"
        );
        return match r.agent_review.exhausted {
            false => ReviewWant::Exhausted { reason },
            true => ReviewWant::WaitingForHuman { reason },
        };
    }
    ReviewWant::Dispatch {
        reviewer,
        round: used + 1,
        head,
    }
}

/// The reviewer of a PR: the first of `reviewer_logins` that is not its author
/// (Forgejo refuses an approval or change request on one's own PR). `None` when
/// every reviewer is the author, or there is none.
pub(crate) fn reviewer_for(pr: &PrSnapshot, policy: &Policy) -> Option<Login> {
    policy
        .reviewer_logins
        .iter()
        .filter_map(|l| l.parse::<Login>().ok())
        .find(|l| pr.author.as_ref() != Some(l))
}

/// Notes a `review` dispatch as a round (the claim itself is in the work state).
pub(crate) fn on_dispatch(r: &mut PrRecord, now: i64) {
    let Some(active) = &r.work.active else {
        return;
    };
    let (Some(head), Some(review)) = (&active.item.head_sha, &active.item.context.review) else {
        return;
    };
    r.agent_review.rounds.push(ReviewRound {
        head_sha: head.clone(),
        work_id: active.item.id.clone(),
        reviewer: review.reviewer.clone(),
        dispatched_ms: now,
        verdict: None,
        review_id: None,
    });
}

/// Fills in the verdicts of rounds from the latest reviews read: a reviewer agent's
/// APPROVED or REQUEST_CHANGES on a round's head. A verdict once noted stays (a later
/// review of a newer head replaces the reviewer's latest, not the round's history).
pub(crate) fn note_verdicts(r: &mut PrRecord, policy: &Policy) {
    let Some(reviews) = &r.reviews else {
        return;
    };
    for round in r
        .agent_review
        .rounds
        .iter_mut()
        .filter(|x| x.verdict.is_none())
    {
        let found = reviews
            .latest
            .values()
            .find(|rv| policy.is_reviewer(&rv.reviewer) && rv.commit_id == round.head_sha.as_str());
        let Some(rv) = found else { continue };
        let verdict = match rv.state {
            ReviewState::Approved => ReviewVerdict::Approved,
            ReviewState::RequestChanges => ReviewVerdict::ChangesRequested,
            ReviewState::Comment
            | ReviewState::Pending
            | ReviewState::RequestReview
            | ReviewState::Unknown => continue,
        };
        round.verdict = Some(verdict);
        round.review_id = Some(rv.id);
    }
}
