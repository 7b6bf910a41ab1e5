//! `decide`: what a PR wants now, from its facts and policy alone, with a reason a
//! person can read. Priority (DESIGN §2.1): merge-conflicts > ci-fix >
//! review-feedback > ready-to-merge; holds, merges in flight and active work come
//! first; awaiting-ci and awaiting-review explain why nothing is wanted.

use super::super::effect::{ChangeRequest, FailingCheck, ReviewRequest, WorkContext, WorkKind};
use super::super::event::{CiContext, CiState, PrSnapshot, PrState, ReviewFact, ReviewState};
use super::super::ids::{Login, RepoName, Sha};
use super::super::policy::{AgentAuthors, MergeMode, Policy};
use super::super::record::{ConflictFact, Hold, MergeState, PrRecord};
use super::review::{self, ReviewWant};
use super::{Phase, work};

/// What the record wants done now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Want {
    /// Nothing to start.
    Nothing,
    /// Read the PR (nothing is known yet).
    ObservePr,
    /// Claim the PR for a work item.
    Dispatch {
        /// Kind.
        kind: WorkKind,
        /// The problem's signature.
        signature: String,
        /// Failing checks / change requests.
        context: WorkContext,
    },
    /// Stop: a human must act.
    NeedsHuman {
        /// Why.
        reason: String,
    },
    /// Stop: the reviewer agents' rounds ran out (needs-human with the round history).
    ReviewRoundsExhausted {
        /// Why.
        reason: String,
    },
    /// Read the PR author's permission before any agent work (`agent_authors`).
    ReadAuthor {
        /// The author.
        login: Login,
    },
    /// Merge this head (mode `auto`).
    Merge {
        /// The head every condition was checked for.
        sha: Sha,
    },
}

/// A decision with the wanted action.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    /// Phase.
    pub phase: Phase,
    /// Why.
    pub reason: String,
    /// What to do about it.
    pub want: Want,
}

impl Plan {
    /// A plan that wants nothing.
    fn idle(phase: Phase, reason: impl Into<String>) -> Plan {
        Plan {
            phase,
            reason: reason.into(),
            want: Want::Nothing,
        }
    }
}

/// The CI state of the head, as far as merging is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CiView {
    /// No combined status read yet, or no context reported.
    Missing,
    /// Contexts still running, or required ones not reported (their names).
    Pending(Vec<String>),
    /// Failing contexts.
    Failing(Vec<CiContext>),
    /// Every required context (at least one) is green.
    Success,
}

/// Whether a context name matches a required pattern (`*` and `?` globs).
fn glob(pattern: &str, name: &str) -> bool {
    fn go(p: &[char], n: &[char]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some('*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some('?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &n[1..]),
            (Some(_), Some(_)) | (Some(_), None) | (None, Some(_)) => false,
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    go(&p, &n)
}

/// The CI state of the record's current head.
pub fn ci_view(r: &PrRecord, policy: &Policy) -> CiView {
    let Some(ci) = r.head_sha().and_then(|h| r.ci.get(h)) else {
        return CiView::Missing;
    };
    let mut considered: Vec<&CiContext> = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    if policy.required_contexts.is_empty() {
        considered.extend(ci.contexts.values());
    } else {
        for pattern in &policy.required_contexts {
            let matching: Vec<&CiContext> = ci
                .contexts
                .values()
                .filter(|c| glob(pattern, &c.context))
                .collect();
            if matching.is_empty() {
                missing.push(pattern.clone());
            }
            considered.extend(matching);
        }
    }
    let failing: Vec<CiContext> = considered
        .iter()
        .filter(|c| c.state.is_failing())
        .map(|c| (*c).clone())
        .collect();
    if !failing.is_empty() {
        return CiView::Failing(failing);
    }
    if considered.is_empty() && missing.is_empty() {
        return CiView::Missing;
    }
    missing.extend(
        considered
            .iter()
            .filter(|c| c.state == CiState::Pending)
            .map(|c| c.context.clone()),
    );
    match missing.is_empty() {
        true => CiView::Success,
        false => {
            missing.sort();
            missing.dedup();
            CiView::Pending(missing)
        }
    }
}

/// The ci-fix signature: the sorted failing contexts with their descriptions (words
/// with digits masked, so "Failing after 1m2s" and "Failing after 58s" are the same problem).
pub(crate) fn ci_signature(failing: &[CiContext]) -> String {
    let mut parts: Vec<String> = failing
        .iter()
        .map(|c| {
            let desc: Vec<&str> = c
                .description
                .split_whitespace()
                .map(|w| match w.chars().any(|ch| ch.is_ascii_digit()) {
                    true => "#",
                    false => w,
                })
                .collect();
            let desc = desc.join(" ");
            format!("{}: {}", c.context, desc)
        })
        .collect();
    parts.sort();
    parts.join("\n")
}

/// Whether the PR counts as a bot PR (DESIGN §2.4): its author is the bot login or a
/// configured bot user, and, when the policy requires it, its body has the marker.
/// The marker alone never counts: anyone can paste it into a body.
pub(crate) fn is_bot_pr(pr: &PrSnapshot, policy: &Policy) -> bool {
    let bot_author = pr.author.as_ref().is_some_and(|a| policy.is_bot_author(a));
    let marker_ok = !policy.require_bot_marker
        || (!policy.bot_marker.is_empty() && pr.body.contains(&policy.bot_marker));
    bot_author && marker_ok
}

/// Review facts relevant to merging and to `review-feedback`.
struct ReviewView {
    /// Reviewers whose latest review requests changes (not dismissed): blocks merging.
    blocking: Vec<String>,
    /// Change requests not yet addressed (on the head, not stale): wants work.
    active: Vec<ChangeRequest>,
    /// Reviewers whose latest review is a non-official change request (Forgejo marks
    /// reviews from users without write access `official: false`): shown, never
    /// blocking and never work, or anyone could stop a merge or steer the agents.
    unofficial: Vec<String>,
}

/// Evaluates the latest reviews against the head.
fn review_view(r: &PrRecord, head: Option<&Sha>) -> ReviewView {
    let mut v = ReviewView {
        blocking: Vec::new(),
        active: Vec::new(),
        unofficial: Vec::new(),
    };
    let Some(reviews) = &r.reviews else {
        return v;
    };
    for review in reviews.latest.values() {
        match review.state {
            // Counted by `review::approvals` (reviewer agents count by policy).
            ReviewState::Approved => {}
            ReviewState::RequestChanges => {
                if review.dismissed {
                    continue;
                }
                if !review.official {
                    v.unofficial.push(review.reviewer.to_string());
                    continue;
                }
                v.blocking.push(review.reviewer.to_string());
                let on_head = review.commit_id.is_empty()
                    || head.is_some_and(|h| h.as_str() == review.commit_id);
                if !review.stale && on_head {
                    v.active.push(ChangeRequest {
                        review_id: review.id,
                        reviewer: review.reviewer.clone(),
                        body: review.body.clone(),
                    });
                }
            }
            ReviewState::Comment
            | ReviewState::Pending
            | ReviewState::RequestReview
            | ReviewState::Unknown => {}
        }
    }
    v
}

/// The change requests that want work on `head`, from one full reviews read, by the
/// machine's own rule: each reviewer's latest approval or change request, when it
/// requests changes, is official, not dismissed, not stale and on `head`. For callers
/// outside the machine (the agents' prompt), so the rule is written once.
pub fn active_change_requests(
    repo: &RepoName,
    number: u64,
    reviews: &[ReviewFact],
    head: Option<&Sha>,
) -> Vec<ChangeRequest> {
    let mut scratch = PrRecord::new(repo.clone(), number);
    super::facts::apply_reviews(&mut scratch, reviews, 0);
    review_view(&scratch, head).active
}

/// Reviewers whose latest review is a change request Forgejo does not count
/// (`official: false`): kept as facts and shown in the status comment, but they
/// neither block the merge nor become `review-feedback` work.
pub fn unofficial_change_requests(r: &PrRecord) -> Vec<String> {
    let head = r.pr.as_ref().and_then(|p| p.head_sha.as_ref());
    review_view(r, head).unofficial
}

/// Every §2.4 condition that does not hold (empty: ready to merge). `now` only
/// matters for a merge back-off.
pub fn merge_blockers(r: &PrRecord, policy: &Policy, now_ms: i64) -> Vec<String> {
    let mut out = Vec::new();
    let Some(pr) = &r.pr else {
        return vec!["the PR has not been read yet".into()];
    };
    if pr.state != PrState::Open {
        out.push("not open".into());
    }
    if pr.draft {
        out.push("draft (WIP)".into());
    }
    match &r.work.hold {
        Some(Hold::Paused { .. }) => out.push("paused".into()),
        Some(Hold::NeedsHuman { .. }) => out.push("needs a human".into()),
        None => {}
    }
    if r.work.active.is_some() {
        out.push("work in progress".into());
    }
    match r.conflict {
        ConflictFact::Conflicting => out.push("conflicts with the base branch".into()),
        ConflictFact::Suspected { .. } => out.push("checking mergeability".into()),
        ConflictFact::Clean | ConflictFact::Unknown => {}
    }
    match ci_view(r, policy) {
        CiView::Success => {}
        CiView::Missing => out.push("waiting for CI to report on the head".into()),
        CiView::Pending(names) => out.push(format!("waiting for CI: {}", names.join(", "))),
        CiView::Failing(f) => out.push(format!("CI failing: {}", names_of(&f))),
    }
    let rv = review_view(r, pr.head_sha.as_ref());
    if !rv.blocking.is_empty() {
        out.push(format!("changes requested by {}", rv.blocking.join(", ")));
    }
    let need = review::needed(pr, policy);
    let approvals = review::approvals(r, pr, policy).saturating_add(review::hinted(r, pr, policy));
    if approvals < need {
        let more = need - approvals;
        let s = if more == 1 { "" } else { "s" };
        out.push(format!("waiting for {more} more approval{s}"));
    }
    if let MergeState::Backoff {
        not_before_ms,
        lease_wait,
    } = r.merge
        && now_ms < not_before_ms
        // The queue's head waits in its queue (`queue::ready_plan`), not parked: a
        // batch under test asks again after a back-off while its CI runs.
        && !super::queue::is_head(r)
    {
        out.push(if lease_wait {
            "waiting for the target branch's merge lease (another merge is in progress)".into()
        } else {
            "Forgejo asked to try the merge again later".into()
        });
    }
    out
}

/// Context names, comma-separated.
fn names_of(cs: &[CiContext]) -> String {
    cs.iter()
        .map(|c| c.context.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The phase a kind of work shows as.
fn phase_of(kind: WorkKind) -> Phase {
    match kind {
        WorkKind::CiFix => Phase::CiFix,
        WorkKind::ReviewFeedback => Phase::ReviewFeedback,
        WorkKind::MergeConflicts => Phase::MergeConflicts,
        WorkKind::ReadyToMerge => Phase::Merging,
        WorkKind::StaleCheck | WorkKind::IssueImpl | WorkKind::Review => Phase::AwaitingReview,
    }
}

/// The full decision for a PR record.
pub(crate) fn plan(r: &PrRecord, policy: &Policy, now: i64) -> Plan {
    let Some(pr) = &r.pr else {
        return Plan {
            phase: Phase::AwaitingCi,
            reason: "the PR has not been read yet".into(),
            want: Want::ObservePr,
        };
    };
    match pr.state {
        PrState::Merged => return Plan::idle(Phase::Merged, "merged"),
        PrState::Closed => return Plan::idle(Phase::Closed, "closed without merging"),
        PrState::Open => {}
    }
    if let MergeState::InFlight { sha, .. } = &r.merge {
        return Plan::idle(Phase::Merging, format!("merging {sha}"));
    }
    match &r.work.hold {
        Some(Hold::Paused { by, .. }) => {
            let by = by.as_ref().map(|b| format!(" by @{b}")).unwrap_or_default();
            return Plan::idle(
                Phase::Paused,
                format!("paused{by}; `/shepherd resume` to continue"),
            );
        }
        Some(Hold::NeedsHuman { reason, .. }) => {
            return Plan::idle(Phase::NeedsHuman, reason.clone());
        }
        None => {}
    }
    if let Some(active) = &r.work.active {
        let w = &active.item;
        return Plan::idle(
            phase_of(w.kind),
            format!(
                "{} attempt {} at tier {} ({}) in progress",
                w.kind.as_str(),
                w.attempt,
                w.tier,
                w.tier_name
            ),
        );
    }
    problems(r, pr, policy, now)
}

/// Nothing in the way: the highest-priority problem to work on, else ready or waiting.
fn problems(r: &PrRecord, pr: &PrSnapshot, policy: &Policy, now: i64) -> Plan {
    let head = pr.head_sha.as_ref();
    if r.conflict == ConflictFact::Conflicting {
        return want_work(
            r,
            policy,
            now,
            WorkKind::MergeConflicts,
            "conflict".into(),
            WorkContext::default(),
            "conflicts with the base branch",
        );
    }
    if let Some(plan) = batch_failure_plan(r, policy, now) {
        return plan;
    }
    if let CiView::Failing(failing) = ci_view(r, policy) {
        let note = super::queue::ci_note(r);
        let mut why = format!("CI failing: {}", names_of(&failing));
        if let Some(note) = &note {
            why = format!("{why} ({note})");
        }
        let context = WorkContext {
            failing_checks: failing.iter().map(failing_check).collect(),
            note,
            ..WorkContext::default()
        };
        return want_work(
            r,
            policy,
            now,
            WorkKind::CiFix,
            ci_signature(&failing),
            context,
            &why,
        );
    }
    let rv = review_view(r, head);
    if !rv.active.is_empty() {
        let mut ids: Vec<String> = rv
            .active
            .iter()
            .map(|c| review::change_request_signature(&c.reviewer, c.review_id, &c.body, policy))
            .collect();
        ids.sort();
        let why = format!("changes requested by {}", rv.blocking.join(", "));
        let context = WorkContext {
            change_requests: rv.active,
            ..WorkContext::default()
        };
        return want_work(
            r,
            policy,
            now,
            WorkKind::ReviewFeedback,
            ids.join(","),
            context,
            &why,
        );
    }
    ready_or_waiting(r, pr, policy, now)
}

/// No problem to fix: ready to merge, or waiting for CI or reviews (or stale).
fn ready_or_waiting(r: &PrRecord, pr: &PrSnapshot, policy: &Policy, now: i64) -> Plan {
    let blockers = merge_blockers(r, policy, now);
    let Some(first) = blockers.first() else {
        let Some(sha) = pr.head_sha.clone() else {
            return Plan::idle(Phase::AwaitingCi, "head commit unknown");
        };
        return match policy.merge_mode {
            MergeMode::Auto if policy.merge_queue => super::queue::ready_plan(r, sha, policy, now),
            MergeMode::Auto => Plan {
                phase: Phase::ReadyToMerge,
                reason: format!("every merge condition holds for {sha}"),
                want: Want::Merge { sha },
            },
            MergeMode::Dispatch => want_work(
                r,
                policy,
                now,
                WorkKind::ReadyToMerge,
                format!("ready:{sha}"),
                WorkContext::default(),
                "ready to merge",
            ),
        };
    };
    if let Some(queued) = super::queue::testing_plan(r, policy, &blockers) {
        return queued;
    }
    let phase = match ci_view(r, policy) {
        CiView::Missing | CiView::Pending(_) => Phase::AwaitingCi,
        CiView::Success | CiView::Failing(_) => match r.merge {
            MergeState::Backoff { .. } => Phase::ReadyToMerge,
            MergeState::Idle | MergeState::Verifying { .. } | MergeState::InFlight { .. } => {
                Phase::AwaitingReview
            }
        },
    };
    let mut reason = first.clone();
    match review::wanted(r, pr, policy) {
        ReviewWant::Nothing => {}
        ReviewWant::Dispatch {
            reviewer,
            round,
            head,
        } => {
            let context = WorkContext {
                review: Some(ReviewRequest {
                    reviewer,
                    round,
                    max_rounds: policy.max_review_rounds,
                }),
                ..WorkContext::default()
            };
            let why = format!(
                "{first}; review round {round} of {} by a reviewer agent",
                policy.max_review_rounds
            );
            return want_work(
                r,
                policy,
                now,
                WorkKind::Review,
                format!("review:{head}"),
                context,
                &why,
            );
        }
        ReviewWant::Exhausted { reason } => {
            return Plan {
                phase: Phase::NeedsHuman,
                reason: reason.clone(),
                want: Want::ReviewRoundsExhausted { reason },
            };
        }
        // Still a stale check in a lull, but the reason says who must act.
        ReviewWant::WaitingForHuman { reason: why } => reason = why,
    }
    let stale_ms = i64::try_from(policy.stale_after_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    let lull = r.last_activity_ms > 0 && now.saturating_sub(r.last_activity_ms) >= stale_ms;
    if lull && r.stale_checked_at != Some(r.last_activity_ms) {
        let why = format!(
            "no activity for {} h",
            (now - r.last_activity_ms) / 3_600_000
        );
        return want_work(
            r,
            policy,
            now,
            WorkKind::StaleCheck,
            format!("stale:{}", r.last_activity_ms),
            WorkContext::default(),
            &why,
        );
    }
    // The queue's note on stale approvals, unless a reviewer's wait says more.
    let why = if reason == *first {
        super::queue::approvals_note(r, first).unwrap_or(reason)
    } else {
        reason
    };
    Plan::idle(phase, why)
}

/// A failing context for a work item.
fn failing_check(c: &CiContext) -> FailingCheck {
    FailingCheck {
        context: c.context.clone(),
        state: c.state,
        description: c.description.clone(),
        target_url: c.target_url.clone(),
    }
}

/// The batched merge queue ejected the head (issue 29): `merge-conflicts` work for a
/// conflict while building the batch, `ci-fix` for a failure a bisection pinned on it
/// (its own CI is green: the note says what it failed on top of).
fn batch_failure_plan(r: &PrRecord, policy: &Policy, now: i64) -> Option<Plan> {
    let f = super::queue::batch_failure(r)?;
    let (kind, why) = match f.reason {
        crate::core::queue::Ejection::Conflict => (
            WorkKind::MergeConflicts,
            format!("conflicts in the merge queue's batch ({})", f.note),
        ),
        _ => (
            WorkKind::CiFix,
            format!("CI failing in the merge queue ({})", f.note),
        ),
    };
    let context = WorkContext {
        failing_checks: f
            .failing
            .iter()
            .map(|c| FailingCheck {
                context: c.clone(),
                state: super::super::event::CiState::Failure,
                description: String::new(),
                target_url: String::new(),
            })
            .collect(),
        note: Some(f.note.clone()),
        ..WorkContext::default()
    };
    let signature = format!("batch:{}:{}", f.reason.as_str(), f.head);
    Some(want_work(r, policy, now, kind, signature, context, &why))
}

/// Wants work of `kind` for `signature`, unless the previous attempt's push is still
/// to arrive, or the PR is stuck on it.
fn want_work(
    r: &PrRecord,
    policy: &Policy,
    now: i64,
    kind: WorkKind,
    signature: String,
    mut context: WorkContext,
    why: &str,
) -> Plan {
    let phase = phase_of(kind);
    // The wait ends at `push_grace_secs` even where no timer was armed (a PR closed
    // and reopened meanwhile): the push-grace timer then counts it as `no-changes`.
    if let Some(n) = work::awaiting_result_of(&r.work, kind, &signature, r.head_sha())
        && !work::grace_over(&r.work, now, policy)
    {
        return Plan::idle(phase, format!("{why}; waiting for the push of attempt {n}"));
    }
    // A claim label Shepherd did not set, or the read of what a previous dispatcher
    // left, holds every dispatch (`core::legacy`; its timer ends the wait).
    if let Some(held) = crate::core::legacy::hold(&r.work) {
        return Plan::idle(phase, format!("{why}; {held}"));
    }
    // Merging a ready PR is not agent work: `agent_authors` does not hold it back.
    if kind != WorkKind::ReadyToMerge {
        match agents_gate(r, policy, now) {
            AgentsGate::Open { author_trusted } => context.author_trusted = author_trusted,
            AgentsGate::Off(off) => {
                return Plan::idle(phase, format!("{why}; {}", agents_off_text(&off)));
            }
            AgentsGate::Unknown(login) => {
                return Plan {
                    phase,
                    reason: format!(
                        "{why}; agent work waits for the permission of the PR's author @{login} \
                         (agent_authors = {})",
                        policy.agent_authors.as_str()
                    ),
                    want: Want::ReadAuthor { login },
                };
            }
        }
    }
    if let Some(reason) = work::over_budget(&r.work, policy) {
        return Plan {
            phase: Phase::NeedsHuman,
            reason: reason.clone(),
            want: Want::NeedsHuman { reason },
        };
    }
    if let Some(hold) = super::budget::active_hold(&r.work, now) {
        return Plan::idle(
            Phase::OverBudget,
            format!("{why}; {}", super::budget::reason(hold)),
        );
    }
    if let Some(wait) = super::transient::waiting(&r.work, Some(now), policy) {
        return Plan::idle(phase, format!("{why}; {wait}"));
    }
    if work::is_stuck(&r.work, kind, &signature, policy) {
        let reason = format!(
            "{why}: {} attempts of {} at the top tier ({}) did not fix it.",
            policy.stuck_after,
            kind.as_str(),
            policy.tier_name(policy.top_tier())
        );
        return Plan {
            phase: Phase::NeedsHuman,
            reason: reason.clone(),
            want: Want::NeedsHuman { reason },
        };
    }
    Plan {
        phase,
        reason: why.to_owned(),
        want: Want::Dispatch {
            kind,
            signature,
            context,
        },
    }
}

/// Whether the PR's author lets agents work on it (`agent_authors`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AgentsGate {
    /// Yes. `author_trusted`: the author is the bot, an agent user, a bot user, a
    /// trusted user or has write access (`None`: not read, under `anyone`).
    Open {
        /// Whether the author's text is trusted.
        author_trusted: Option<bool>,
    },
    /// No, and why (without the way out: [`agents_off_text`] adds it).
    Off(String),
    /// Not known until the author's permission is read.
    Unknown(Login),
}

/// The phrase a PR outside `agent_authors` shows in its reason.
pub(crate) fn agents_off_text(why: &str) -> String {
    format!(
        "agents off for this PR: {why}; a user with write access can comment \
         `/shepherd agents on`"
    )
}

/// Whether the PR author's text is trusted: the bot, an agent user or a bot user
/// (Some(true)), else what the record knows of their write access (a trusted user
/// has it; `None`: a permission read is needed). No author: not trusted.
pub(crate) fn author_trusted(r: &PrRecord, policy: &Policy, now: i64) -> Option<bool> {
    let author = r.pr.as_ref().and_then(|p| p.author.as_ref());
    match author {
        None => Some(false),
        Some(a) if policy.is_bot_author(a) || policy.is_agent(a) => Some(true),
        Some(a) => super::commands::writer(&r.work, a, policy, now),
    }
}

/// The `agent_authors` gate of the record's PR: open for bot PRs, for `anyone`, after
/// `/shepherd agents on`, and (under `writers`) for authors with write access.
pub(crate) fn agents_gate(r: &PrRecord, policy: &Policy, now: i64) -> AgentsGate {
    let Some(pr) = &r.pr else {
        return AgentsGate::Off("the PR has not been read yet".into());
    };
    let trusted = author_trusted(r, policy, now);
    if policy.agent_authors == AgentAuthors::Anyone
        || r.agents_on.is_some()
        || is_bot_pr(pr, policy)
    {
        return AgentsGate::Open {
            author_trusted: trusted,
        };
    }
    match (policy.agent_authors, trusted, &pr.author) {
        (AgentAuthors::Bot, _, _) => {
            AgentsGate::Off("it is not a bot PR (agent_authors = bot)".into())
        }
        (_, Some(true), _) => AgentsGate::Open {
            author_trusted: Some(true),
        },
        (_, None, Some(login)) => AgentsGate::Unknown(login.clone()),
        (_, Some(false) | None, _) => {
            AgentsGate::Off("its author has no write access (agent_authors = writers)".into())
        }
    }
}
