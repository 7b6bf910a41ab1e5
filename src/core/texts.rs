//! Every text Shepherd posts, in one place: the sticky status comment with its
//! machine-readable `<!-- SHEPHERD-STATE: {json} -->` block, the needs-human comment
//! with the attempt history, the merged notice for linked issues, the hidden effect-id
//! marker and the footer every comment ends with.

use serde::{Deserialize, Serialize};

use super::ids::{EffectId, Sha};
use super::machine::Phase;
use super::record::{Attempt, ReviewRound, ReviewVerdict};

/// Opening of the state block in the sticky status comment (executors find the
/// comment to edit by it).
pub const STATE_MARKER: &str = "<!-- SHEPHERD-STATE: ";
/// Opening of the hidden effect-id marker in posted comments.
pub const EFFECT_MARKER: &str = "<!-- shepherd-effect: ";
/// Opening of the hidden marker a reviewer agent's review carries (the work id): a
/// runner that retries a work item finds the review it already posted.
pub const REVIEW_MARKER: &str = "<!-- shepherd-review: ";
/// Closing of both markers.
const MARKER_END: &str = " -->";

/// The machine-readable state in the sticky status comment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusState {
    /// Current phase.
    pub phase: Phase,
    /// Why (human-readable).
    pub reason: String,
    /// Current tier.
    pub tier: u8,
    /// Its name.
    pub tier_name: String,
    /// Attempts so far.
    pub attempts: usize,
    /// Signature of the last attempt's problem.
    pub last_signature: Option<String>,
    /// The head the state is about.
    pub head_sha: Option<Sha>,
    /// The record version this state belongs to: an executor that finds a comment with
    /// a higher version is replaying an older upsert and should leave it alone.
    #[serde(default)]
    pub version: u64,
    /// Reviewers whose change requests Forgejo does not count (no write access):
    /// shown so people see them, never blocking and never work.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unofficial_change_requests: Vec<String>,
    /// Reviewers whose approval never counts: the bot user and the agent users.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uncounted_approvals: Vec<String>,
    /// The reviewer agents' latest round and its verdict (absent before the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<ReviewStatus>,
    /// Whether agents work on this PR when its author is outside `agent_authors`:
    /// "on for this PR …" after `/shepherd agents on`, or why they are off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<String>,
    /// The PR's place in its branch's merge queue (absent when not in one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStatus>,
    /// What the PR's agent runs cost so far (absent until a result said; issue 28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostStatus>,
    /// A claim label Shepherd did not set holds the PR: "claimed elsewhere: … since …,
    /// until …" (`core::legacy`; absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_elsewhere: Option<String>,
}

/// The cost so far and per attempt, shown in the status comment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostStatus {
    /// Micro-dollars spent by every run whose result said.
    pub total_micros: u64,
    /// Their input + output tokens.
    pub tokens: u64,
    /// How many runs said.
    pub runs: u64,
    /// The kept attempts that said: (attempt number, kind, micro-dollars).
    pub attempts: Vec<(u64, crate::core::effect::WorkKind, u64)>,
}

/// Dollars for people: cents, or four decimals below a cent.
pub fn dollars(micros: u64) -> String {
    let usd = crate::core::usage::micros_to_usd(micros);
    if micros > 0 && micros < 10_000 {
        format!("${usd:.4}")
    } else {
        format!("${usd:.2}")
    }
}

/// The cost line of the status comment.
fn cost_line(c: &CostStatus) -> String {
    let s = if c.runs == 1 { "" } else { "s" };
    let mut text = format!(
        "Cost so far: {} over {} run{s} ({} tokens)",
        dollars(c.total_micros),
        c.runs,
        c.tokens
    );
    if !c.attempts.is_empty() {
        let per: Vec<String> = c
            .attempts
            .iter()
            .map(|(n, kind, micros)| format!("#{n} {} {}", kind.as_str(), dollars(*micros)))
            .collect();
        text.push_str(&format!(" · per attempt: {}", per.join(", ")));
    }
    text
}

/// Why a record is `over-budget`, with the way out.
pub fn over_budget(stop: &crate::core::budget::Stop) -> String {
    let amount = |v: u64| match stop.tokens {
        true => format!("{v} tokens"),
        false => dollars(v),
    };
    let why = match (stop.left, stop.needed) {
        (0, 0) => format!("the spend cap `{}` is reached", one_line(&stop.cap)),
        (left, needed) => format!(
            "the spend cap `{}` has {} left and a run needs {}",
            one_line(&stop.cap),
            amount(left),
            amount(needed)
        ),
    };
    let when = stop
        .resets_at_ms
        .and_then(chrono::DateTime::<chrono::Utc>::from_timestamp_millis)
        .map(|t| format!("resumes at {} UTC, or when", t.format("%Y-%m-%d %H:%M")))
        .unwrap_or_else(|| "resumes when".to_owned());
    format!(
        "over budget: {why}; {when} a user with write access comments \
         `/shepherd budget +<amount>`"
    )
}

/// A PR's place in its branch's merge queue, shown in the status comment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStatus {
    /// Target branch.
    pub branch: String,
    /// 1-based position among the PRs waiting to be tested (1 = being tested), once
    /// the queue said; `None` while parked or before the queue answered.
    pub position: Option<u32>,
    /// Being tested (the queue's head).
    pub testing: bool,
    /// Parked (ejected, keeping its ticket) and why.
    pub parked: Option<crate::core::queue::Ejection>,
    /// `/shepherd priority`.
    pub priority: crate::core::queue::Priority,
}

/// The reviewer agents' round shown in the status comment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewStatus {
    /// The latest round (1-based).
    pub round: u32,
    /// `max_review_rounds`.
    pub max_rounds: u32,
    /// Its reviewer agent.
    pub reviewer: String,
    /// Its verdict, once the review was read (`None`: not yet, or no review posted).
    pub verdict: Option<ReviewVerdict>,
}

/// The hidden marker carrying an effect id.
pub fn effect_marker(id: &EffectId) -> String {
    format!("{EFFECT_MARKER}{id}{MARKER_END}")
}

/// The hidden marker of the review posted for work item `work_id`.
pub fn review_marker(work_id: &str) -> String {
    format!("{REVIEW_MARKER}{work_id}{MARKER_END}")
}

/// `body` without a review marker and what follows it (the marker is ours, not
/// the reviewer's words).
pub fn strip_review_marker(body: &str) -> &str {
    body.find(REVIEW_MARKER).map_or(body, |i| &body[..i])
}

/// The effect id in a comment body's marker, if any.
pub fn find_effect_marker(body: &str) -> Option<&str> {
    let start = body.find(EFFECT_MARKER)? + EFFECT_MARKER.len();
    let len = body[start..].find(MARKER_END)?;
    Some(&body[start..start + len])
}

/// A comment body: the text, the hidden effect marker, then the footer.
pub fn finish_comment(text: &str, id: &EffectId, footer: &str) -> String {
    format!("{}\n\n{}\n{footer}", text.trim_end(), effect_marker(id))
}

/// Most unofficial change requesters the status comment names (any account can
/// review; the rest are counted, not listed).
const UNOFFICIAL_SHOWN: usize = 10;

/// The sticky status comment body.
pub fn status_comment(state: &StatusState, footer: &str) -> String {
    // `>` only occurs inside JSON strings, where `\u003e` means the same: this keeps
    // a `-->` in a reason or signature from ending the HTML comment early.
    let json = serde_json::to_string(state)
        .unwrap_or_default()
        .replace('>', "\\u003e");
    let mut text = format!(
        "**Shepherd status:** `{}` — {}\n\nTier: {} (`{}`) · attempts: {}",
        state.phase.as_str(),
        state.reason,
        state.tier,
        state.tier_name,
        state.attempts
    );
    if let Some(sig) = &state.last_signature {
        text.push_str(&format!(" · last problem: `{}`", one_line(sig)));
    }
    if !state.unofficial_change_requests.is_empty() {
        let all = &state.unofficial_change_requests;
        let mut who: Vec<String> = all
            .iter()
            .take(UNOFFICIAL_SHOWN)
            // In code spans: showing a reviewer must not @mention them.
            .map(|w| code(&one_line(w)))
            .collect();
        if all.len() > UNOFFICIAL_SHOWN {
            who.push(format!("and {} more", all.len() - UNOFFICIAL_SHOWN));
        }
        text.push_str(&format!(
            "\n\nNot counted (no write access): changes requested by {}",
            who.join(", ")
        ));
    }
    for who in state.uncounted_approvals.iter().take(UNOFFICIAL_SHOWN) {
        text.push_str(&format!(
            "\n\nApproval by {} (bot/agent) not counted",
            code(&one_line(who))
        ));
    }
    if let Some(agents) = &state.agents {
        // Shepherd's own words and a validated login: its code spans stay.
        text.push_str(&format!("\n\nAgents: {}", agents.replace('\n', " ")));
    }
    if let Some(review) = &state.review {
        let verdict = review.verdict.map_or("pending", ReviewVerdict::as_str);
        text.push_str(&format!(
            "\n\nAgent review: round {} of {} by {} · verdict: {verdict}",
            review.round,
            review.max_rounds,
            code(&one_line(&review.reviewer)),
        ));
    }
    if let Some(q) = &state.queue {
        let at = match (q.parked, q.testing, q.position) {
            (Some(reason), _, _) => format!(
                "parked ({}), keeping its place until it is ready again",
                reason.as_str()
            ),
            (None, true, _) => "being tested (head of the queue)".to_owned(),
            (None, false, Some(p)) => format!("position {p}"),
            (None, false, None) => "entering".to_owned(),
        };
        text.push_str(&format!(
            "\n\nMerge queue of {}: {at} · priority {}",
            code(&one_line(&q.branch)),
            q.priority.as_str()
        ));
    }
    if let Some(c) = &state.cost {
        text.push_str(&format!("\n\n{}", cost_line(c)));
    }
    if let Some(claim) = &state.claimed_elsewhere {
        // Shepherd's own words around a label name of the policy.
        text.push_str(&format!(
            "\n\n**Claimed elsewhere** — no agent work until the claim is released or \
             expires: {}",
            one_line(claim)
        ));
    }
    format!("{text}\n\n{STATE_MARKER}{json}{MARKER_END}\n{footer}")
}

/// The state block of a status comment body, if it has one.
pub fn parse_status_comment(body: &str) -> Option<StatusState> {
    let start = body.find(STATE_MARKER)? + STATE_MARKER.len();
    let len = body[start..].find(MARKER_END)?;
    serde_json::from_str(&body[start..start + len]).ok()
}

/// The record version in a status comment body (0 when absent or unreadable).
pub fn status_version(body: &str) -> u64 {
    parse_status_comment(body).map_or(0, |s| s.version)
}

/// The needs-human comment text (before the marker and footer). `first` is the
/// number of `attempts[0]` among all attempts (the record keeps the last few).
pub fn needs_human(
    reason: &str,
    attempts: &[Attempt],
    first: u64,
    tier_name: impl Fn(u8) -> String,
) -> String {
    let mut text = format!(
        "**Shepherd needs a human here.** {reason}\n\n\
         No more work will be dispatched until a user with write access removes the \
         label, comments `/shepherd resume`, or pushes a commit.\n"
    );
    if !attempts.is_empty() {
        if first > 1 {
            text.push_str(&format!(
                "\nThe last {} attempts ({} before them are counted, not kept):\n",
                attempts.len(),
                first - 1
            ));
        }
        text.push_str("\n| # | kind | tier | outcome | problem |\n|---|---|---|---|---|\n");
        for (i, a) in attempts.iter().enumerate() {
            text.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                first.saturating_add(u64::try_from(i).unwrap_or(u64::MAX)),
                a.kind.as_str(),
                tier_name(a.tier),
                a.outcome.as_str(),
                code(&one_line(&a.signature).replace('|', "\\|"))
            ));
        }
    }
    text
}

/// The reviewer agents' rounds as a table (the needs-human comment when they run out).
pub fn review_rounds(rounds: &[ReviewRound]) -> String {
    let mut text = String::from(
        "Review rounds by reviewer agents:\n\n| round | head | reviewer | verdict |\n|---|---|---|---|\n",
    );
    for (i, round) in rounds.iter().enumerate() {
        let head: String = round.head_sha.as_str().chars().take(10).collect();
        let verdict = round.verdict.map_or("no review", ReviewVerdict::as_str);
        text.push_str(&format!(
            "| {} | `{head}` | {} | {verdict} |\n",
            i + 1,
            code(&one_line(round.reviewer.as_str()))
        ));
    }
    text
}

/// The notice posted on an issue the merged PR links.
pub fn merged_notice(pr_number: u64) -> String {
    format!("Pull request #{pr_number}, which links this issue, has been merged.")
}

/// The reply to a command from someone without write access.
pub fn command_refused(login: &str) -> String {
    format!("@{login} only users with write access can give `/shepherd` commands.")
}

/// The login a refusal comment (see [`command_refused`]) answers, when `body` is one;
/// the worker logs refusals with it.
pub fn refused_login(body: &str) -> Option<&str> {
    let (login, tail) = body.strip_prefix('@')?.split_once(' ')?;
    tail.starts_with("only users with write access can give")
        .then_some(login)
}

/// Flattens a signature for inline display inside a code span. Signatures quote CI
/// descriptions and review texts, which a PR author controls: a backtick would end the
/// code span (markdown, mentions and images after it), and a copy of our own markers
/// (`<!--`) would make the comment look like the sticky status comment to the marker
/// search. Both are neutralised.
fn one_line(s: &str) -> String {
    let flat: String = s
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('`', "'")
        .replace("<!--", "<!- -")
        .replace("-->", "- ->");
    if flat.chars().count() > 120 {
        format!("{}…", flat.chars().take(120).collect::<String>())
    } else {
        flat
    }
}

/// `text` as an inline code span (empty text stays empty).
fn code(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!("`{text}`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_signatures_stay_inside_their_code_span() {
        let sig = "x` [click](http://evil) @admin ![i](http://t) <!-- SHEPHERD-STATE: {} -->";
        let cell = code(&one_line(sig));
        assert_eq!(cell.matches('`').count(), 2, "{cell}");
        assert!(cell.starts_with('`') && cell.ends_with('`'), "{cell}");
        assert!(!cell.contains("<!--") && !cell.contains("-->"), "{cell}");
        assert!(!cell.contains(STATE_MARKER));
    }

    #[test]
    fn comments_carry_marker_and_end_with_footer() {
        let id: EffectId = "o/r/pr/1@2.0".parse().unwrap();
        let body = finish_comment("hello\n", &id, "---\n**Automated by Shepherd**");
        assert!(body.ends_with("---\n**Automated by Shepherd**"));
        assert_eq!(find_effect_marker(&body), Some("o/r/pr/1@2.0"));
    }

    #[test]
    fn status_block_round_trips() {
        let state = StatusState {
            phase: Phase::CiFix,
            reason: "ci-fix attempt 1 in progress".into(),
            tier: 1,
            tier_name: "codex".into(),
            attempts: 2,
            last_signature: Some("ci / test: failed -->".into()),
            head_sha: Some("abcd1234".parse().unwrap()),
            version: 4,
            unofficial_change_requests: vec!["mallory".into()],
            uncounted_approvals: Vec::new(),
            agents: None,
            review: Some(ReviewStatus {
                round: 2,
                max_rounds: 3,
                reviewer: "rev-bot".into(),
                verdict: Some(ReviewVerdict::ChangesRequested),
            }),
            queue: Some(QueueStatus {
                branch: "main".into(),
                position: None,
                testing: false,
                parked: Some(crate::core::queue::Ejection::CiFailed),
                priority: crate::core::queue::Priority::High,
            }),
            cost: Some(CostStatus {
                total_micros: 1_234_567,
                tokens: 4_200,
                runs: 2,
                attempts: vec![(2, crate::core::effect::WorkKind::CiFix, 1_230_000)],
            }),
            claimed_elsewhere: None,
        };
        let body = status_comment(&state, "--footer");
        assert!(
            body.contains(
                "Cost so far: $1.23 over 2 runs (4200 tokens) · per attempt: #2 ci-fix $1.23"
            ),
            "{body}"
        );
        assert!(
            body.contains("Merge queue of `main`: parked (ci-failed)"),
            "{body}"
        );
        assert!(body.contains("changes requested by `mallory`"), "{body}");
        assert!(
            body.contains("Agent review: round 2 of 3 by `rev-bot` · verdict: changes-requested"),
            "{body}"
        );
        assert!(body.ends_with("--footer"));
        assert_eq!(parse_status_comment(&body), Some(state));
        assert_eq!(status_version(&body), 4);
        assert_eq!(status_version("no block"), 0);
    }

    #[test]
    fn many_unofficial_change_requesters_are_counted_not_all_named() {
        let state = StatusState {
            phase: Phase::AwaitingReview,
            reason: "waiting".into(),
            tier: 0,
            tier_name: "haiku".into(),
            attempts: 0,
            last_signature: None,
            head_sha: None,
            version: 1,
            unofficial_change_requests: (0..20).map(|i| format!("sock{i}")).collect(),
            uncounted_approvals: Vec::new(),
            agents: None,
            review: None,
            queue: None,
            cost: None,
            claimed_elsewhere: None,
        };
        let body = status_comment(&state, "--footer");
        assert!(body.contains("`sock9`, and 10 more"), "{body}");
        assert!(!body.contains("`sock10`"), "{body}");
    }

    #[test]
    fn refusals_name_the_commenter() {
        assert_eq!(refused_login(&command_refused("mallory")), Some("mallory"));
        assert_eq!(refused_login("@alice thanks!"), None);
        assert_eq!(refused_login("only users with write access"), None);
    }
}
