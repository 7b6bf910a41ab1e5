//! Reviewer agents (`review` work): when a PR wants one, whose approvals count, the
//! rounds with their verdicts, and the signature of an agent's change request; and
//! which approval webhooks count before the reviews are read (approval hints, issue 17).
//!
//! Convergence is built in (an automated review/fix loop must not run away):
//! - at most one `review` dispatch per head sha, ever (`AgentReview::rounds` records
//!   each dispatch's head; a failed or expired review is not repeated on that head);
//! - at most `max_review_rounds` dispatches per PR; the one after that is
//!   `needs-human` with the round history, once;
//! - a reviewer agent's review counts only on the head it was written for: a verdict
//!   for an old head stays in its round's history and changes nothing.

use super::super::event::{PrSnapshot, ReviewFact, ReviewHint, ReviewState};
use super::super::ids::{Login, Sha};
use super::super::policy::{MergeMode, Policy};
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
/// the policy counts agents for this PR and the review is on the current head. The
/// bot's and the agent users' (`agent_logins`) approvals never count.
pub(crate) fn counts(review: &ReviewFact, pr: &PrSnapshot, policy: &Policy) -> bool {
    if review.state != ReviewState::Approved || !review.official || review.stale || review.dismissed
    {
        return false;
    }
    if policy.is_bot_or_agent(&review.reviewer) {
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

/// Approvals announced by review webhooks since the last reviews read
/// (`PrRecord::approval_hints`, merge mode `auto` only) by reviewers the read does not
/// already count. They may start a merge attempt; the executor's pre-merge re-check,
/// which reads the reviews and counts them with [`counts`], decides the merge. Reviewer
/// agents' approvals are always read (their verdicts are rounds' facts), never hinted.
pub(crate) fn hinted(r: &PrRecord, pr: &PrSnapshot, policy: &Policy) -> u32 {
    match policy.merge_mode {
        MergeMode::Auto => {}
        MergeMode::Dispatch => return 0,
    }
    let counted = |who: &Login| {
        r.reviews
            .as_ref()
            .and_then(|v| v.latest.get(who))
            .is_some_and(|v| counts(v, pr, policy))
    };
    let n = r
        .approval_hints
        .keys()
        .filter(|who| !policy.is_reviewer(who) && !policy.is_bot_or_agent(who) && !counted(who))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The reviewer of an approval webhook that needs no reviews read (issue 17): in
/// merge mode `auto`, an approval only matters to the decision to try a merge, and the
/// executor's pre-merge re-check reads the reviews right before the merge call anyway
/// (and alone decides). Every other review webhook is read at once: a change request
/// or a comment (its id and body become work), dispatch mode (an agent merges without
/// the executor's re-check), and an approval by someone whose known latest review is
/// not an approval (it may end a change request, which stops or starts work), and
/// any review by a reviewer agent (its verdict is a fact of its review round).
pub(crate) fn approval_hint(
    r: &PrRecord,
    hint: ReviewHint,
    sender: Option<&Login>,
    policy: &Policy,
) -> Option<Login> {
    let reviewer = sender?;
    // A reviewer agent's verdict is a fact of its review round: always read. The
    // bot's and agent users' approvals never count: read (to show them as such).
    if policy.is_reviewer(reviewer) || policy.is_bot_or_agent(reviewer) {
        return None;
    }
    let known = r
        .reviews
        .as_ref()
        .and_then(|v| v.latest.get(reviewer))
        .map(|v| v.state);
    let approval = match hint {
        ReviewHint::Approved => true,
        ReviewHint::Rejected | ReviewHint::Comment => false,
    };
    let auto = match policy.merge_mode {
        MergeMode::Auto => true,
        MergeMode::Dispatch => false,
    };
    let no_stance = known.is_none_or(|s| s == ReviewState::Approved);
    (approval && auto && no_stance).then(|| reviewer.clone())
}

/// Reviewers whose latest review is an approval by the bot user or an agent user:
/// never counted, and shown as such in the status comment.
pub(crate) fn uncounted_approvals(r: &PrRecord, policy: &Policy) -> Vec<String> {
    let latest = r.reviews.as_ref().map(|v| &v.latest);
    latest
        .into_iter()
        .flat_map(|m| m.values())
        .filter(|rv| rv.state == ReviewState::Approved && policy.is_bot_or_agent(&rv.reviewer))
        .map(|rv| rv.reviewer.to_string())
        .collect()
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
    let announced = hinted(r, pr, policy);
    if approvals(r, pr, policy).saturating_add(announced) >= needed(pr, policy) {
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
