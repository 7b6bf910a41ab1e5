//! What a polling system leaves behind (issue 27, item 5; docs/migrating.md).
//!
//! The team's polling dispatchers keep their state on Forgejo itself:
//!
//! - `auto/last-attempt-tier-N` labels (policy `label_tier_prefix`; Shepherd writes the
//!   same labels for its own tier),
//! - the `<!-- ESCALATION-STATE: START --> {json} <!-- ESCALATION-STATE: END -->`
//!   comments of the subtask loop (seed `000`, "State Persistence Format"), whose
//!   `current_tier` (a tier name) and `attempt_count` say where the loop stood,
//! - a claim label (policy `label_claimed`, `auto/claimed-implementer`) while one of
//!   their workers holds the PR, released by the worker or swept by the merge driver
//!   after the claim's TTL.
//!
//! On the first sight of a PR or issue the record reads them: the tier labels seed the
//! tier at once; when a tier or claim label shows the old system worked on it, one
//! read of the comments and, for a claim label, of the issue timeline
//! (`Observe(Legacy)`) is asked for, and no work is dispatched until it answers or
//! [`READ_TIMEOUT_MS`] passes. A claim label Shepherd did not set holds
//! every dispatch until `claim_ttl_secs` after it was set (the label webhook's time,
//! or the timeline's label event); then a timer lets Shepherd take over (the stale
//! label is removed, or adopted as Shepherd's own claim when it dispatches at once).
//!
//! Comments are hostile input: anyone can write one. Only comments by the bot user or
//! an agent user count (the old system's workers posted them as the agent account),
//! bodies over [`MAX_STATE_COMMENT_BYTES`] are ignored, and anything that does not
//! parse is ignored; the parser never panics (a property test feeds it garbage).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::effect::{EffectKind, ObserveWhat, Timer, TimerKind};
use super::ids::{Login, Scope};
use super::policy::Policy;
use super::record::WorkState;

/// Opening line of the subtask loop's state block (seed 000).
pub const STATE_START: &str = "<!-- ESCALATION-STATE: START -->";
/// Closing line of the state block.
pub const STATE_END: &str = "<!-- ESCALATION-STATE: END -->";
/// Longest comment body read for a state block; longer ones are ignored whole (the
/// seed's block is a few hundred bytes).
pub const MAX_STATE_COMMENT_BYTES: usize = 16 * 1024;
/// Most attempts a state block may carry over; a larger count is garbage.
pub const MAX_CARRIED_ATTEMPTS: u64 = 1_000;
/// How many candidate comments an observation carries (the newest).
pub const COMMENTS_KEPT: usize = 8;
/// How many label events of the claim label an observation carries (the newest).
pub const LABEL_EVENTS_KEPT: usize = 16;
/// How long dispatch waits for the read of the old system's state (ms): a read that
/// fails for good (its effect dead-lettered) never answers.
pub const READ_TIMEOUT_MS: i64 = 120_000;
/// The id of the record's one legacy timer (read deadline or claim expiry).
const TIMER_ID: &str = "legacy";

/// What a state block says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EscalationState {
    /// `current_tier` as a tier index of the policy (`None`: not a known tier).
    pub tier: Option<u8>,
    /// `attempt_count`.
    pub attempt_count: u64,
}

/// A comment that may hold a state block, as read from the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegacyComment {
    /// Its author.
    pub author: Option<Login>,
    /// Its body (bounded by the reader; bounded again here).
    pub body: String,
    /// When it was posted (unix ms; 0 if unknown).
    pub at_ms: i64,
}

/// One timeline event of the claim label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelEvent {
    /// Added (`true`) or removed.
    pub added: bool,
    /// Who did it.
    pub by: Option<Login>,
    /// When (unix ms).
    pub at_ms: i64,
}

/// The old system's state a record took over, and a claim it respects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LegacyFacts {
    /// The read of the comments / timeline was asked for at this time (unix ms) and
    /// has not answered: dispatch waits until [`READ_TIMEOUT_MS`] after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reading_since: Option<i64>,
    /// What was carried over (tier and attempts), once found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carried: Option<Carried>,
    /// A claim label Shepherd did not set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub foreign_claim: Option<ForeignClaim>,
    /// Due time of the legacy timer last scheduled (to schedule it only on change).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timer_due: Option<i64>,
}

impl LegacyFacts {
    /// Nothing known (records without legacy facts keep their JSON as before).
    pub fn is_empty(&self) -> bool {
        *self == LegacyFacts::default()
    }

    /// Attempts the old system made (added to the attempt number of work items).
    pub fn carried_attempts(&self) -> u64 {
        self.carried.as_ref().map_or(0, |c| c.attempts)
    }
}

/// Tier and attempts carried over from the old system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carried {
    /// The tier it reached (the record's tier is at least this).
    pub tier: u8,
    /// Its attempt count.
    pub attempts: u64,
    /// Where they were read ("label …", "ESCALATION-STATE comment by …").
    pub from: Vec<String>,
}

/// A claim label Shepherd did not set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForeignClaim {
    /// The label.
    pub label: String,
    /// When it was set (unix ms): the label event's time, or when Shepherd first saw
    /// it until the timeline says.
    pub since_ms: i64,
    /// `since_ms` + `claim_ttl_secs`: no dispatch before.
    pub until_ms: i64,
    /// `since_ms` came from a label event (webhook or timeline), not first sight.
    pub timed: bool,
    /// The TTL passed: Shepherd may take over.
    pub expired: bool,
    /// The stale label was removed (or adopted by a dispatch).
    pub swept: bool,
}

/// Parses the last state block of `body` (seed 000's format). `None` for anything
/// that is not one: too long, no block, not JSON, no valid `attempt_count`.
pub fn parse_escalation_state(body: &str, tiers: &[String]) -> Option<EscalationState> {
    if body.len() > MAX_STATE_COMMENT_BYTES {
        return None;
    }
    let start = body.rfind(STATE_START)? + STATE_START.len();
    let len = body[start..].find(STATE_END)?;
    let inner = body[start..start + len].trim();
    let value: serde_json::Value = serde_json::from_str(inner).ok()?;
    let obj = value.as_object()?;
    let attempt_count = obj
        .get("attempt_count")?
        .as_u64()
        .filter(|n| *n <= MAX_CARRIED_ATTEMPTS)?;
    let top = u8::try_from(tiers.len().saturating_sub(1)).unwrap_or(u8::MAX);
    let tier = obj.get("current_tier").and_then(|t| tier_of(t, tiers, top));
    Some(EscalationState {
        tier,
        attempt_count,
    })
}

/// A `current_tier` value as a tier index: a tier name (any case), `tier-N`, or N.
fn tier_of(v: &serde_json::Value, tiers: &[String], top: u8) -> Option<u8> {
    let n = match v {
        serde_json::Value::Number(n) => n.as_u64()?,
        serde_json::Value::String(s) => {
            let s = s.trim();
            if let Some(i) = tiers.iter().position(|t| t.eq_ignore_ascii_case(s)) {
                return u8::try_from(i).ok();
            }
            let digits = s.strip_prefix("tier-").unwrap_or(s);
            if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return None;
            }
            digits.parse().ok()?
        }
        _ => return None,
    };
    u8::try_from(n).ok().filter(|t| *t <= top)
}

/// The highest tier the tier labels (`<prefix>N`) name, clamped to the top tier.
pub fn tier_from_labels(labels: &BTreeSet<String>, policy: &Policy) -> Option<(u8, String)> {
    labels
        .iter()
        .filter_map(|l| {
            let n = l.strip_prefix(policy.label_tier_prefix.as_str())?;
            let ok = !n.is_empty() && n.len() <= 3 && n.bytes().all(|b| b.is_ascii_digit());
            let n: u16 = n.parse().ok().filter(|_| ok)?;
            Some((u8::try_from(n).unwrap_or(u8::MAX).min(policy.top_tier()), l))
        })
        .max_by_key(|(t, _)| *t)
        .map(|(t, l)| (t, l.clone()))
}

/// The state of the last comment by the bot or an agent user that holds a valid
/// state block, with its author. Others' comments never count (anyone can comment).
pub fn trusted_state(
    comments: &[LegacyComment],
    policy: &Policy,
) -> Option<(EscalationState, Login)> {
    let newest = comments.len().saturating_sub(COMMENTS_KEPT);
    comments[newest..].iter().rev().find_map(|c| {
        let author = c.author.as_ref().filter(|a| policy.is_bot_or_agent(a))?;
        let state = parse_escalation_state(&c.body, &policy.tiers)?;
        Some((state, author.clone()))
    })
}

/// What a snapshot of the PR or issue shows of the old system.
pub(crate) struct Sight<'a> {
    /// The snapshot's labels.
    pub labels: &'a BTreeSet<String>,
    /// Forgejo's `updated_at` of the snapshot (unix ms; 0 if unknown).
    pub updated_ms: i64,
}

/// The first snapshot of a record: seed the tier from the labels, note a foreign claim,
/// and ask for the comments / timeline when they may hold more.
pub(crate) fn first_sight(
    ws: &mut WorkState,
    s: &Sight<'_>,
    now: i64,
    policy: &Policy,
    fx: &mut super::machine::Fx,
) {
    let tier_label = tier_from_labels(s.labels, policy);
    if let Some((tier, label)) = &tier_label {
        carry(ws, *tier, 0, format!("label `{label}`"), policy);
    }
    let claim = foreign_label(ws, s.labels, policy);
    if let Some(label) = &claim {
        ws.legacy.foreign_claim = Some(new_claim(label, now, false, policy));
    }
    // Only where the old system left a label: it labels every attempt it makes, and a
    // PR it never touched costs no extra API call (the economy tests count them).
    let comments = tier_label.is_some() || claim.is_some();
    if comments {
        ws.legacy.reading_since = Some(now);
        fx.push(EffectKind::Observe(ObserveWhat::Legacy {
            comments,
            claim_label: claim,
        }));
    }
}

/// A later snapshot: a claim label that went away releases the hold; a label webhook
/// that put it on (`labeled_by`: its sender) while Shepherd holds no claim starts one.
pub(crate) fn later_sight(
    ws: &mut WorkState,
    s: &Sight<'_>,
    labeled_by: Option<Option<&Login>>,
    now: i64,
    policy: &Policy,
) {
    let present = s.labels.contains(&policy.label_claimed);
    if let Some(c) = &ws.legacy.foreign_claim
        && !present
        && c.label == policy.label_claimed
    {
        ws.legacy.foreign_claim = None;
        return;
    }
    let Some(sender) = labeled_by else { return };
    // Shepherd's own label change (its token) is never someone else's claim, nor is an
    // agent user's: Shepherd's agents claim the PRs they work on themselves (seed 004's
    // claim step), and a late echo of that must not hold the PR for a whole TTL.
    if sender.is_none_or(|s| policy.is_bot_or_agent(s)) {
        return;
    }
    let fresh = ws
        .legacy
        .foreign_claim
        .as_ref()
        .is_none_or(|c| c.expired && c.swept);
    if fresh && let Some(label) = foreign_label(ws, s.labels, policy) {
        let at = if s.updated_ms > 0 {
            s.updated_ms.min(now)
        } else {
            now
        };
        ws.legacy.foreign_claim = Some(new_claim(&label, at, true, policy));
    }
}

/// The read's answer: the trusted state block and the claim label's set time.
pub(crate) fn observed(
    ws: &mut WorkState,
    comments: &[LegacyComment],
    claim_events: &[LabelEvent],
    policy: &Policy,
) {
    ws.legacy.reading_since = None;
    if let Some((state, author)) = trusted_state(comments, policy) {
        let tier = state.tier.unwrap_or(0);
        let from = format!("ESCALATION-STATE comment by `{author}`");
        carry(ws, tier, state.attempt_count, from, policy);
    }
    let ttl = ttl_ms(policy);
    if let Some(c) = ws.legacy.foreign_claim.as_mut().filter(|c| !c.timed) {
        let newest = claim_events.len().saturating_sub(LABEL_EVENTS_KEPT);
        // The newest addition of the label is when the current claim was set.
        if let Some(e) = claim_events[newest..].iter().rev().find(|e| e.added) {
            c.since_ms = e.at_ms.min(c.since_ms);
            c.until_ms = c.since_ms.saturating_add(ttl);
            c.timed = true;
        }
    }
}

/// Brings the time-dependent facts to `now`: a read that never answered is given up,
/// a claim whose TTL passed expires. Schedules the legacy timer when its due time
/// changes.
pub(crate) fn tick(ws: &mut WorkState, now: i64, fx: &mut super::machine::Fx) {
    let l = &mut ws.legacy;
    if l.reading_since
        .is_some_and(|t| now >= t.saturating_add(READ_TIMEOUT_MS))
    {
        l.reading_since = None;
    }
    if let Some(c) = l
        .foreign_claim
        .as_mut()
        .filter(|c| !c.expired && now >= c.until_ms)
    {
        c.expired = true;
    }
    let read_due = l.reading_since.map(|t| t.saturating_add(READ_TIMEOUT_MS));
    let claim_due = l
        .foreign_claim
        .as_ref()
        .filter(|c| !c.expired)
        .map(|c| c.until_ms);
    let due = match (read_due, claim_due) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if due != l.timer_due {
        l.timer_due = due;
        if let Some(due_ms) = due {
            fx.push(EffectKind::Schedule(Timer {
                due_ms,
                kind: TimerKind::Legacy,
                id: TIMER_ID.into(),
            }));
        }
    }
}

/// The legacy timer the record has scheduled, if any (`rebuild --apply` arms it for a
/// rebuilt record, whose fold discarded the effects).
pub fn timer(ws: &WorkState) -> Option<Timer> {
    ws.legacy.timer_due.map(|due_ms| Timer {
        due_ms,
        kind: TimerKind::Legacy,
        id: TIMER_ID.into(),
    })
}

/// What a record still has to read of a previous dispatcher's state (`rebuild` reads
/// it when the folded record's read never answered): (comments, claim label to time).
pub fn unread(ws: &WorkState) -> Option<(bool, Option<String>)> {
    ws.legacy.reading_since?;
    let claim = ws
        .legacy
        .foreign_claim
        .as_ref()
        .filter(|c| !c.timed)
        .map(|c| c.label.clone());
    Some((true, claim))
}

/// After the step's dispatch decision: an expired foreign claim's label is removed,
/// unless Shepherd dispatched at once and holds the label as its own claim now.
pub(crate) fn sweep(ws: &mut WorkState, open: bool, fx: &mut super::machine::Fx) {
    let adopted = ws.active.is_some();
    let Some(c) = ws.legacy.foreign_claim.as_mut() else {
        return;
    };
    if !c.expired || c.swept {
        return;
    }
    c.swept = true;
    if open && !adopted && !ws.labels_applied.contains(&c.label) {
        fx.push(EffectKind::RemoveLabels {
            labels: vec![c.label.clone()],
        });
    }
}

/// Why no work may be dispatched now, if so.
pub fn hold(ws: &WorkState) -> Option<String> {
    if let Some(c) = &ws.legacy.foreign_claim
        && !c.expired
    {
        return Some(claimed_elsewhere(c));
    }
    ws.legacy.reading_since.map(|_| {
        "reading the state a previous dispatcher left (tier labels, ESCALATION-STATE \
         comments, claim label)"
            .to_owned()
    })
}

/// The "claimed elsewhere" text of a held foreign claim.
pub fn claimed_elsewhere(c: &ForeignClaim) -> String {
    let since = match c.timed {
        true => utc(c.since_ms),
        false => format!("{} (first seen)", utc(c.since_ms)),
    };
    format!(
        "claimed elsewhere: `{}` since {since}, until {} (claim_ttl_secs)",
        c.label,
        utc(c.until_ms)
    )
}

/// `ms` as `YYYY-MM-DD HH:MM:SS UTC`.
fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// One line for `inspect`: what was carried over and the claim, if any.
pub fn summary(ws: &WorkState) -> Option<String> {
    let l = &ws.legacy;
    let mut parts = Vec::new();
    if let Some(c) = &l.carried {
        parts.push(format!(
            "carried over: tier {}, {} attempt(s) (from {})",
            c.tier,
            c.attempts,
            c.from.join(", ")
        ));
    }
    if let Some(c) = &l.foreign_claim {
        parts.push(match (c.expired, c.swept) {
            (false, _) => claimed_elsewhere(c),
            (true, _) => format!(
                "foreign claim `{}` expired at {}; Shepherd took over",
                c.label,
                utc(c.until_ms)
            ),
        });
    }
    if l.reading_since.is_some() {
        parts.push("reading the previous dispatcher's state".into());
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The claim label, when it is on the PR/issue and Shepherd did not put it there (and
/// holds no claim of its own).
fn foreign_label(ws: &WorkState, labels: &BTreeSet<String>, policy: &Policy) -> Option<String> {
    let label = &policy.label_claimed;
    let ours = ws.labels_applied.contains(label) || ws.active.is_some();
    (labels.contains(label) && !ours).then(|| label.clone())
}

/// A new foreign claim set at `since_ms`.
fn new_claim(label: &str, since_ms: i64, timed: bool, policy: &Policy) -> ForeignClaim {
    ForeignClaim {
        label: label.to_owned(),
        since_ms,
        until_ms: since_ms.saturating_add(ttl_ms(policy)),
        timed,
        expired: false,
        swept: false,
    }
}

/// `claim_ttl_secs` in ms.
fn ttl_ms(policy: &Policy) -> i64 {
    i64::try_from(policy.claim_ttl_secs.saturating_mul(1000)).unwrap_or(i64::MAX)
}

/// Raises the record's tier to `tier` (never down, never past the top) and notes what
/// was carried over.
fn carry(ws: &mut WorkState, tier: u8, attempts: u64, from: String, policy: &Policy) {
    let tier = tier.min(policy.top_tier());
    ws.tier = ws.tier.max(tier);
    let c = ws.legacy.carried.get_or_insert(Carried {
        tier: 0,
        attempts: 0,
        from: Vec::new(),
    });
    c.tier = c.tier.max(tier);
    c.attempts = c.attempts.max(attempts.min(MAX_CARRIED_ATTEMPTS));
    if c.from.len() < 4 {
        c.from.push(from);
    }
}

/// The record a step is for.
pub(crate) struct Me<'a> {
    /// Repository.
    pub repo: &'a super::ids::RepoName,
    /// PR or issue.
    pub scope: Scope,
    /// Index.
    pub number: u64,
}

/// How a step sees the record for [`fold`]: its current snapshot when the event brought
/// one, whether the record had none before (`unseen`), the sender of a `labeled`
/// webhook (`Some(sender)`), and whether the event matters to the record (`relevant`).
pub(crate) struct Seen<'a> {
    /// The record's current snapshot, when the event brought one.
    pub current: Option<Sight<'a>>,
    /// The record had no snapshot before this event.
    pub unseen: bool,
    /// `Some(sender)` for a `labeled` webhook.
    pub labeled_by: Option<Option<&'a Login>>,
    /// The event matters to the record.
    pub relevant: bool,
}

/// One step's part in a record's legacy facts, PRs and issues alike: [`on_event`] with
/// the snapshot when the event is relevant, then the hold's [`tick`]. Returns whether
/// the event was for the legacy facts alone.
pub(crate) fn fold(
    ws: &mut WorkState,
    me: &Me<'_>,
    event: &super::event::Event,
    seen: Seen<'_>,
    now: i64,
    policy: &Policy,
    fx: &mut super::machine::Fx,
) -> bool {
    let Seen {
        current,
        unseen,
        labeled_by,
        relevant,
    } = seen;
    let sight = current
        .filter(|_| relevant)
        .map(|c| (c, unseen, labeled_by));
    let concerned = on_event(ws, me, event, sight, now, policy, fx);
    if relevant || concerned {
        tick(ws, now, fx);
    }
    concerned
}

/// Folds `event` into the record's legacy facts. `sight`: the record's current snapshot
/// when the event brought one (`unseen`: the record had none before it; `labeled_by`:
/// the event was a label webhook by this sender). Returns whether the event was the
/// legacy read's answer or timer for this record.
pub(crate) fn on_event(
    ws: &mut WorkState,
    me: &Me<'_>,
    event: &super::event::Event,
    sight: Option<(Sight<'_>, bool, Option<Option<&Login>>)>,
    now: i64,
    policy: &Policy,
    fx: &mut super::machine::Fx,
) -> bool {
    use super::event::Event;
    let mine = |repo: &super::ids::RepoName, scope: Scope, number: u64| {
        repo == me.repo && scope == me.scope && number == me.number
    };
    let concerned = match event {
        Event::ObservedLegacy {
            repo,
            scope,
            number,
            comments,
            claim_events,
            ..
        } if mine(repo, *scope, *number) => {
            observed(ws, comments, claim_events, policy);
            true
        }
        Event::TimerFired {
            repo,
            scope,
            number,
            timer,
        } => timer.kind == TimerKind::Legacy && mine(repo, *scope, *number),
        _ => false,
    };
    if let Some((s, unseen, labeled_by)) = sight {
        match unseen {
            true => first_sight(ws, &s, now, policy, fx),
            false => later_sight(ws, &s, labeled_by, now, policy),
        }
    }
    concerned
}
