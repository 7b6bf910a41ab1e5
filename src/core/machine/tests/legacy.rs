//! What a polling system leaves behind (`core::legacy`, issue 27 item 5): tier labels
//! and the last trusted `ESCALATION-STATE` comment seed a record on first sight; a
//! claim label Shepherd did not set holds dispatch until its TTL; the state block
//! parser is fed garbage.

use proptest::prelude::*;

use super::*;
use crate::core::event::{IssueAction, IssueSnapshot};
use crate::core::legacy::{
    LabelEvent, LegacyComment, MAX_CARRIED_ATTEMPTS, MAX_STATE_COMMENT_BYTES, READ_TIMEOUT_MS,
    STATE_END, STATE_START, parse_escalation_state,
};
use crate::core::record::IssueRecord;

/// `ci / test` failing.
const FAIL: (&str, CiState, &str) = ("ci / test", CiState::Failure, "Failing after 1m2s");
/// The claim label (policy default).
const CLAIM: &str = "auto/claimed-implementer";

/// The test policy with an agent user `agent` and a 10-minute claim TTL.
fn p() -> Policy {
    Policy {
        agent_logins: vec!["agent".into()],
        claim_ttl_secs: 600,
        ..policy()
    }
}

/// A state block in seed 000's format.
fn block(tier: &str, attempts: &str) -> String {
    format!(
        "{STATE_START}\n{{\n  \"subtask\": \"fix overflow\",\n  \"current_tier\": \"{tier}\",\n  \
         \"attempt_count\": {attempts},\n  \"last_updated\": \"then\",\n  \
         \"escalation_trigger\": \"quality_gates\"\n}}\n{STATE_END}\n\n🤖 **Escalation Update**"
    )
}

/// The read's answer for PR 7.
fn observed(comments: Vec<(&str, String)>, claim_events: Vec<LabelEvent>, at: i64) -> Event {
    Event::ObservedLegacy {
        repo: repo(),
        scope: Scope::Pr,
        number: PR,
        comments: comments
            .into_iter()
            .map(|(who, body)| LegacyComment {
                author: Some(login(who)),
                body,
                at_ms: at - 1000,
            })
            .collect(),
        claim_events,
        at_ms: at,
    }
}

/// PR 7 opened with `labels` and `comments` conversation comments.
fn opened_with(labels: &[&str], comments: u64) -> (H, Vec<String>) {
    let mut h = H::with(p());
    let snap = PrSnapshot {
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        comments: Some(comments),
        ..snap('a', T0)
    };
    let fx = h.step(pr_event(PrAction::Opened, snap, "alice"));
    (h, fx)
}

/// The dispatch of the last step: (tier, attempt).
fn dispatched(h: &H) -> Option<(u8, u32)> {
    h.effects().iter().find_map(|e| match &e.kind {
        EffectKind::Dispatch(w) => Some((w.tier, w.attempt)),
        _ => None,
    })
}

/// The status comment body of the last step, if any.
fn status_body(h: &H) -> Option<String> {
    h.effects().iter().find_map(|e| match &e.kind {
        EffectKind::UpsertComment { body, .. } => Some(body.clone()),
        _ => None,
    })
}

#[test]
fn a_tier_label_and_a_trusted_state_comment_seed_the_first_dispatch() {
    let (mut h, fx) = opened_with(&["auto/last-attempt-tier-2"], 4);
    assert!(
        fx.contains(&"observe legacy comments=true claim=-".to_owned()),
        "{fx:?}"
    );
    assert!(fx.contains(&"timer legacy +120s".to_owned()), "{fx:?}");
    assert_eq!(h.r.work.tier, 2, "the label seeds the tier at once");
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    assert_eq!(dispatched(&h), None, "no dispatch before the read answers");
    assert!(h.reason().contains("reading the state"), "{}", h.reason());
    h.later(1);
    let at = h.now;
    h.step(observed(vec![("agent", block("sonnet", "3"))], vec![], at));
    assert_eq!(dispatched(&h), Some((2, 4)), "tier 2, attempt 3 + 1");
    let body = status_body(&h).expect("a status comment");
    assert!(body.contains("attempts: 3"), "{body}");
    assert!(h.r.work.legacy.reading_since.is_none());
}

#[test]
fn the_state_comment_can_raise_the_tier_above_the_label() {
    let (mut h, _) = opened_with(&["auto/last-attempt-tier-1"], 1);
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    let at = h.now;
    // The last trusted block counts: an older one by the bot says less.
    let comments = vec![("bot", block("codex", "1")), ("agent", block("OPUS", "7"))];
    h.step(observed(comments, vec![], at));
    assert_eq!(dispatched(&h), Some((3, 8)));
}

#[test]
fn a_forged_state_comment_by_another_user_changes_nothing() {
    let (mut h, fx) = opened_with(&["auto/last-attempt-tier-0"], 2);
    assert!(fx.iter().any(|l| l.starts_with("observe legacy")), "{fx:?}");
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    let at = h.now;
    // The attacker's block is the newest and well-formed; the agent's is garbage.
    let comments = vec![
        ("agent", format!("{STATE_START} not json {STATE_END}")),
        (
            "agent",
            format!("{STATE_START}{{\"current_tier\":\"opus\"}}{STATE_END}"),
        ),
        ("mallory", block("opus", "50")),
    ];
    h.step(observed(comments, vec![], at));
    assert_eq!(dispatched(&h), Some((0, 1)), "tier 0, first attempt");
    assert_eq!(h.r.work.tier, 0);
    let carried = h.r.work.legacy.carried.clone().expect("the label");
    assert_eq!(carried.attempts, 0);
    assert_eq!(carried.from, ["label `auto/last-attempt-tier-0`"]);
}

#[test]
fn a_pr_without_legacy_labels_reads_nothing() {
    // Comments alone do not cost a read: the old system labels every attempt.
    let (mut h, fx) = opened_with(&[], 3);
    assert!(!fx.iter().any(|l| l.contains("legacy")), "{fx:?}");
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    assert_eq!(dispatched(&h), Some((0, 1)));
}

#[test]
fn a_read_that_never_answers_is_given_up_at_its_deadline() {
    let (mut h, _) = opened_with(&["auto/last-attempt-tier-1"], 0);
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    assert_eq!(dispatched(&h), None);
    let due = T0 + READ_TIMEOUT_MS;
    h.now = due;
    h.step(timer(TimerKind::Legacy, due));
    assert_eq!(
        dispatched(&h),
        Some((1, 1)),
        "the label's tier, no attempts known"
    );
}

#[test]
fn a_foreign_claim_holds_dispatch_until_its_ttl_then_shepherd_takes_over() {
    let (mut h, fx) = opened_with(&[CLAIM], 0);
    let want = format!("observe legacy comments=true claim={CLAIM}");
    assert!(fx.contains(&want), "{fx:?}");
    let at = h.now + 1000;
    // The old dispatcher set the label 5 minutes before Shepherd first saw the PR.
    let set = T0 - 300_000;
    let events = vec![LabelEvent {
        added: true,
        by: Some(login("old-dispatcher")),
        at_ms: set,
    }];
    h.later(1);
    let fx = h.step(observed(vec![], events, at));
    assert!(fx.contains(&"timer legacy +299s".to_owned()), "{fx:?}");
    let claim =
        h.r.work
            .legacy
            .foreign_claim
            .clone()
            .expect("a foreign claim");
    assert_eq!((claim.since_ms, claim.until_ms), (set, set + 600_000));
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    assert_eq!(dispatched(&h), None);
    assert!(h.reason().contains("claimed elsewhere"), "{}", h.reason());
    let body = status_body(&h).expect("a status comment");
    assert!(body.contains("Claimed elsewhere"), "{body}");
    assert!(body.contains(CLAIM), "{body}");
    // Events before the TTL change nothing.
    h.later(60);
    h.step(status('a', &[FAIL], h.now));
    assert_eq!(dispatched(&h), None);
    // The timer at the TTL: Shepherd dispatches and holds the label as its own claim.
    h.now = claim.until_ms;
    let fx = h.step(timer(TimerKind::Legacy, claim.until_ms));
    assert_eq!(dispatched(&h), Some((0, 1)));
    assert!(
        fx.contains(&format!("+{CLAIM},auto/last-attempt-tier-0")),
        "{fx:?}"
    );
    assert!(!fx.iter().any(|l| l.starts_with('-')), "{fx:?}");
    let claim = h.r.work.legacy.foreign_claim.clone().unwrap();
    assert!(claim.expired && claim.swept);
    assert!(!h.reason().contains("claimed elsewhere"));
}

#[test]
fn an_expired_foreign_claim_with_nothing_to_do_is_removed() {
    let (mut h, _) = opened_with(&[CLAIM], 0);
    let at = h.now;
    h.step(observed(vec![], vec![], at));
    // No label event in the timeline: the claim counts from first sight.
    let until = h.r.work.legacy.foreign_claim.as_ref().unwrap().until_ms;
    assert_eq!(until, T0 + 600_000);
    h.now = until;
    let fx = h.step(timer(TimerKind::Legacy, until));
    assert!(fx.contains(&format!("-{CLAIM}")), "{fx:?}");
    // Once only.
    h.later(1);
    let fx = h.step(timer(TimerKind::Legacy, until));
    assert!(fx.is_empty(), "{fx:?}");
}

#[test]
fn a_released_foreign_claim_frees_dispatch_at_once() {
    let (mut h, _) = opened_with(&[CLAIM], 0);
    let at = h.now;
    h.step(observed(vec![], vec![], at));
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    assert_eq!(dispatched(&h), None);
    h.later(5);
    let released = PrSnapshot {
        comments: Some(0),
        ..snap('a', h.now)
    };
    h.step(pr_event(PrAction::Labeled, released, "old-dispatcher"));
    assert_eq!(dispatched(&h), Some((0, 1)));
    assert!(h.r.work.legacy.foreign_claim.is_none());
}

#[test]
fn a_claim_label_put_on_later_by_someone_else_holds_until_its_ttl() {
    let (mut h, _) = opened_with(&[], 0);
    h.later(5);
    let labelled = |h: &H| PrSnapshot {
        labels: BTreeSet::from([CLAIM.to_owned()]),
        comments: Some(0),
        ..snap('a', h.now)
    };
    // Shepherd's own token adding it (an echo), or an agent user, is never a foreign
    // claim.
    h.step(pr_event(PrAction::Labeled, labelled(&h), "bot"));
    assert!(h.r.work.legacy.foreign_claim.is_none());
    h.later(1);
    h.step(pr_event(PrAction::Labeled, labelled(&h), "agent"));
    assert!(h.r.work.legacy.foreign_claim.is_none());
    h.later(5);
    let fx = h.step(pr_event(PrAction::Labeled, labelled(&h), "old-dispatcher"));
    let claim =
        h.r.work
            .legacy
            .foreign_claim
            .clone()
            .expect("a foreign claim");
    assert_eq!(claim.since_ms, h.now, "the webhook's time");
    assert!(fx.contains(&"timer legacy +600s".to_owned()), "{fx:?}");
    h.later(5);
    h.step(status('a', &[FAIL], h.now));
    assert_eq!(dispatched(&h), None);
    h.now = claim.until_ms;
    h.step(timer(TimerKind::Legacy, claim.until_ms));
    assert_eq!(dispatched(&h), Some((0, 1)));
}

#[test]
fn a_labelled_issue_claimed_elsewhere_waits_for_the_ttl() {
    let p = p();
    let mut r = IssueRecord::new(repo(), 9);
    let snap = IssueSnapshot {
        repo: repo(),
        number: 9,
        open: true,
        title: "Widget overflows".into(),
        body: String::new(),
        author: Some(login("alice")),
        labels: BTreeSet::from([
            "auto/implement".to_owned(),
            CLAIM.to_owned(),
            "auto/last-attempt-tier-1".to_owned(),
        ]),
        updated_ms: T0,
    };
    let ev = Event::Issue {
        action: IssueAction::Opened,
        issue: snap,
        sender: Some(login("alice")),
    };
    let t = step_issue_answered(&r, &ev, T0, &p);
    r = t.record;
    assert!(
        !t.effects
            .iter()
            .any(|e| matches!(e.kind, EffectKind::Dispatch(_)))
    );
    assert_eq!(r.work.tier, 1);
    let answer = Event::ObservedLegacy {
        repo: repo(),
        scope: Scope::Issue,
        number: 9,
        comments: vec![],
        claim_events: vec![],
        at_ms: T0 + 1000,
    };
    let t = step_issue_answered(&r, &answer, T0 + 1000, &p);
    r = t.record;
    assert!(
        !t.effects
            .iter()
            .any(|e| matches!(e.kind, EffectKind::Dispatch(_)))
    );
    let until = r.work.legacy.foreign_claim.as_ref().unwrap().until_ms;
    let fire = Event::TimerFired {
        repo: repo(),
        scope: Scope::Issue,
        number: 9,
        timer: Timer {
            due_ms: until,
            kind: TimerKind::Legacy,
            id: "legacy".into(),
        },
    };
    let t = step_issue_answered(&r, &fire, until, &p);
    let tier = t.effects.iter().find_map(|e| match &e.kind {
        EffectKind::Dispatch(w) => Some(w.tier),
        _ => None,
    });
    assert_eq!(tier, Some(1));
}

#[test]
fn the_parser_reads_the_seed_format_and_rejects_what_is_not() {
    let tiers = policy().tiers;
    let ok = parse_escalation_state(&block("sonnet", "3"), &tiers).unwrap();
    assert_eq!((ok.tier, ok.attempt_count), (Some(2), 3));
    let unknown = parse_escalation_state(&block("gpt-9", "2"), &tiers).unwrap();
    assert_eq!((unknown.tier, unknown.attempt_count), (None, 2));
    for bad in [
        block("sonnet", "-1"),
        block("sonnet", "1.5"),
        block("sonnet", "\"3\""),
        block("sonnet", &(MAX_CARRIED_ATTEMPTS + 1).to_string()),
        format!("{STATE_START} [1, 2] {STATE_END}"),
        format!("{STATE_START}{{\"attempt_count\": 1}}"),
        format!("{{\"attempt_count\": 1}}{STATE_END}"),
        format!(
            "{}{}",
            block("sonnet", "3"),
            " ".repeat(MAX_STATE_COMMENT_BYTES)
        ),
        format!("{STATE_START}{}{STATE_END}", "[".repeat(10_000)),
    ] {
        assert_eq!(parse_escalation_state(&bad, &tiers), None, "{bad:.80}");
    }
}

proptest! {
    /// Anything at all, bare or inside the markers: no panic, and whatever parses is
    /// within bounds.
    #[test]
    fn the_parser_never_panics_on_garbage(
        s in any::<String>(),
        inner in "[\\[\\]{}\":,0-9a-z \\\\-]{0,200}",
        wrap in any::<bool>(),
    ) {
        let tiers = policy().tiers;
        for body in [s.clone(), format!("{STATE_START}{inner}{STATE_END}"), format!("{s}{STATE_START}{s}{STATE_END}")] {
            let body = if wrap { format!("x{body}{STATE_END}{STATE_START}") } else { body };
            if let Some(st) = parse_escalation_state(&body, &tiers) {
                prop_assert!(st.attempt_count <= MAX_CARRIED_ATTEMPTS);
                prop_assert!(st.tier.is_none_or(|t| usize::from(t) < tiers.len()));
            }
        }
    }

    /// Every well-formed block parses to what it says.
    #[test]
    fn well_formed_blocks_round_trip(tier in 0usize..4, attempts in 0..=MAX_CARRIED_ATTEMPTS, noise in "[a-z ]{0,40}") {
        let tiers = policy().tiers;
        let body = format!("{noise}\n{}", block(&tiers[tier], &attempts.to_string()));
        let st = parse_escalation_state(&body, &tiers).unwrap();
        prop_assert_eq!(st.tier, Some(u8::try_from(tier).unwrap()));
        prop_assert_eq!(st.attempt_count, attempts);
    }

    /// Whatever the comments say and whoever wrote them, the tier never passes the top
    /// and only the bot's or an agent's comments change anything.
    #[test]
    fn only_trusted_comments_seed_and_never_past_the_top(
        authors in proptest::collection::vec(prop_oneof!["agent", "bot", "mallory", "alice"], 0..6),
        tiers in proptest::collection::vec(0usize..6, 0..6),
        counts in proptest::collection::vec(0u64..2000, 0..6),
    ) {
        let (mut h, _) = opened_with(&["auto/last-attempt-tier-0"], 1);
        let names = ["haiku", "codex", "sonnet", "opus", "tier-9", "7"];
        let comments: Vec<(&str, String)> = authors
            .iter()
            .zip(tiers.iter().zip(counts.iter()))
            .map(|(a, (t, c))| (a.as_str(), block(names[*t], &c.to_string())))
            .collect();
        let trusted = comments.iter().any(|(a, b)| {
            (*a == "agent" || *a == "bot") && parse_escalation_state(b, &h.p.tiers).is_some()
        });
        let at = h.now;
        h.step(observed(comments, vec![], at));
        prop_assert!(h.r.work.tier <= h.p.top_tier());
        let from_comment = h
            .r
            .work
            .legacy
            .carried
            .as_ref()
            .is_some_and(|c| c.from.iter().any(|f| f.contains("ESCALATION-STATE")));
        prop_assert_eq!(from_comment, trusted);
        prop_assert!(h.r.work.legacy.carried_attempts() <= MAX_CARRIED_ATTEMPTS);
    }
}
