//! Every action of the runner is bound to the record (issue 26): before a work item
//! runs, before a reviewer's verdict is posted and before a result is recorded, the
//! item from the dispatch stream is checked against the owning record's active work —
//! repository, number, kind, head, attempt and (for `review` work) reviewer, then the
//! rest of the item. The dispatch stream is not trusted beyond what the record says: an
//! entry that names an active work id with another repository, PR, kind, head or
//! reviewer (a forged entry, or one the record has moved past) is never run and never
//! posted; it is logged, counted in `shepherd_agent_items_refused_total{reason}` and
//! acknowledged.
//!
//! [`compare`] is the pure check (unit-tested below); [`check`] reads what it needs
//! from Redis (the work index, then the owner's record).

use crate::core::effect::{WorkItem, WorkKind};
use crate::core::record::{IssueRecord, PrRecord, WorkState};
use crate::store::Store;
use crate::store::commit;
use crate::store::work::{self, WorkLookup, WorkOwner};

/// Why a work item is refused (its label on `shepherd_agent_items_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The work id is not in the work index and never was (within retention).
    Unknown,
    /// The work has ended (cancelled, expired, reported), or the record's active work
    /// is another item.
    Ended,
    /// A push already superseded the work (before it ran, or before its verdict).
    Superseded,
    /// Its result is already reported.
    Reported,
    /// Its deadline passed before a slot was free.
    Deadline,
    /// The entry names another repository than the record.
    Repo,
    /// The entry names another PR or issue than the record.
    Number,
    /// The entry's kind is not the record's active work's.
    Kind,
    /// The entry's head is not the one the work was dispatched for.
    Head,
    /// The entry's attempt is not the record's active one.
    Attempt,
    /// The entry names another reviewer than the record's active `review` work.
    Reviewer,
    /// Some other part of the entry (tier, claim, context) differs from the record's.
    Item,
}

impl Refusal {
    /// Every refusal, in label order (for docs and tests).
    pub const ALL: [Refusal; 12] = [
        Refusal::Unknown,
        Refusal::Ended,
        Refusal::Superseded,
        Refusal::Reported,
        Refusal::Deadline,
        Refusal::Repo,
        Refusal::Number,
        Refusal::Kind,
        Refusal::Head,
        Refusal::Attempt,
        Refusal::Reviewer,
        Refusal::Item,
    ];

    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Unknown => "unknown",
            Refusal::Ended => "ended",
            Refusal::Superseded => "superseded",
            Refusal::Reported => "reported",
            Refusal::Deadline => "deadline",
            Refusal::Repo => "repo",
            Refusal::Number => "number",
            Refusal::Kind => "kind",
            Refusal::Head => "head",
            Refusal::Attempt => "attempt",
            Refusal::Reviewer => "reviewer",
            Refusal::Item => "item",
        }
    }

    /// One line saying why (for the run record and the log).
    pub fn why(self) -> &'static str {
        match self {
            Refusal::Unknown => "the work id is unknown",
            Refusal::Ended => "the work has ended (cancelled, expired or reported)",
            Refusal::Superseded => "a push already superseded the work",
            Refusal::Reported => "its result is already reported",
            Refusal::Deadline => "its deadline passed before a slot was free",
            Refusal::Repo => "the entry names another repository than the record's active work",
            Refusal::Number => "the entry names another PR or issue than the record's active work",
            Refusal::Kind => "the entry's kind is not the record's active work's",
            Refusal::Head => "the entry's head is not the record's active work's",
            Refusal::Attempt => "the entry's attempt is not the record's active work's",
            Refusal::Reviewer => "the entry's reviewer is not the record's active work's",
            Refusal::Item => "the entry differs from the record's active work",
        }
    }

    /// Whether the entry contradicts the record (a forged or corrupted entry): these
    /// are logged as warnings; the others are the normal ends of work that waited.
    pub fn is_mismatch(self) -> bool {
        !matches!(
            self,
            Refusal::Unknown
                | Refusal::Ended
                | Refusal::Superseded
                | Refusal::Reported
                | Refusal::Deadline
        )
    }
}

/// Which action the check guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Before the agent runs: the work must be active, not reported, and match.
    Start,
    /// Before a reviewer's verdict is posted: the work must still be active and match.
    Post,
    /// Before a result is recorded: active and matching, or superseded by the agent's
    /// own push (its result is still taken once) with the same owner, kind and head.
    Report,
}

/// The reviewer an item names (`review` work only).
fn reviewer(item: &WorkItem) -> Option<&crate::core::ids::Login> {
    item.context.review.as_ref().map(|r| &r.reviewer)
}

/// Whether the index's owner of the work id is the record `item` names.
fn owner_matches(item: &WorkItem, owner: &WorkOwner) -> Result<(), Refusal> {
    if owner.repo != item.repo.as_str() {
        return Err(Refusal::Repo);
    }
    if owner.number != item.number {
        return Err(Refusal::Number);
    }
    if owner.issue != (item.kind == WorkKind::IssueImpl) {
        return Err(Refusal::Kind);
    }
    Ok(())
}

/// The pure check: `item` (from the dispatch stream) against the work index's `owner`
/// of its id and the owner record's `active` work item. The first field that differs
/// names the refusal; an item equal to the record's in every field passes.
pub fn compare(
    item: &WorkItem,
    owner: &WorkOwner,
    active: Option<&WorkItem>,
) -> Result<(), Refusal> {
    owner_matches(item, owner)?;
    let Some(active) = active.filter(|a| a.id == item.id) else {
        return Err(Refusal::Ended);
    };
    if active.repo != item.repo {
        return Err(Refusal::Repo);
    }
    if active.number != item.number {
        return Err(Refusal::Number);
    }
    if active.kind != item.kind {
        return Err(Refusal::Kind);
    }
    if active.head_sha != item.head_sha {
        return Err(Refusal::Head);
    }
    if active.attempt != item.attempt {
        return Err(Refusal::Attempt);
    }
    if reviewer(active) != reviewer(item) {
        return Err(Refusal::Reviewer);
    }
    // The dispatch path fills the budget part of `limits` after the record committed
    // the item (from the ledger, issue 28): those three fields are not the record's.
    // Every other limit (the runaway guards) must match.
    let mut seen = item.clone();
    seen.limits.usd_micros = active.limits.usd_micros;
    seen.limits.tokens = active.limits.tokens;
    seen.limits
        .budget_scope
        .clone_from(&active.limits.budget_scope);
    if *active != seen {
        return Err(Refusal::Item);
    }
    Ok(())
}

/// The check of a superseded item's result: the owner, and the attempt the record
/// closed for it (kind and head), when the record still has it.
pub fn compare_superseded(
    item: &WorkItem,
    owner: &WorkOwner,
    work: Option<&WorkState>,
) -> Result<(), Refusal> {
    owner_matches(item, owner)?;
    let attempt = work.and_then(|w| w.attempts.iter().rev().find(|a| a.work_id == item.id));
    if let Some(a) = attempt {
        if a.kind != item.kind {
            return Err(Refusal::Kind);
        }
        if a.head_sha != item.head_sha {
            return Err(Refusal::Head);
        }
    }
    Ok(())
}

/// Checks `item` against the store for `stage`: `Ok(Ok(()))` when the action may go
/// on, `Ok(Err(refusal))` when it must not. A Redis failure or an unreadable record is
/// an error (the caller hands the entry back).
pub async fn check(
    store: &Store,
    item: &WorkItem,
    stage: Stage,
) -> anyhow::Result<Result<(), Refusal>> {
    let mut conn = store.conn();
    let keys = store.keys();
    let id = item.id.to_string();
    let owner = match work::lookup(&mut conn, keys, &id).await? {
        WorkLookup::Active(owner) => owner,
        WorkLookup::Superseded(owner) if stage == Stage::Report => {
            let work = load_work(store, &owner).await?;
            return Ok(compare_superseded(item, &owner, work.as_ref()));
        }
        WorkLookup::Superseded(_) => return Ok(Err(Refusal::Superseded)),
        WorkLookup::Ended => return Ok(Err(Refusal::Ended)),
        WorkLookup::Unknown => return Ok(Err(Refusal::Unknown)),
    };
    if stage == Stage::Start && work::is_reported(&mut conn, keys, &owner, &id).await? {
        return Ok(Err(Refusal::Reported));
    }
    let work = load_work(store, &owner).await?;
    let active = work
        .as_ref()
        .and_then(|w| w.active.as_ref())
        .map(|a| &a.item);
    Ok(compare(item, &owner, active))
}

/// The work state of `owner`'s record (`None` when there is no record).
async fn load_work(store: &Store, owner: &WorkOwner) -> anyhow::Result<Option<WorkState>> {
    let keys = store.keys();
    let key = if owner.issue {
        keys.issue_record(&owner.repo, owner.number)
    } else {
        keys.pr_record(&owner.repo, owner.number)
    };
    let Some(stored) = commit::load(&mut store.conn(), &key).await? else {
        return Ok(None);
    };
    let work = if owner.issue {
        IssueRecord::from_json(&stored.data).map(|r| r.work)
    } else {
        PrRecord::from_json(&stored.data).map(|r| r.work)
    };
    work.map(Some)
        .map_err(|e| anyhow::anyhow!("the record {key} cannot be read: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim expiry `ms` after the test process's start (RFC 3339, as the work item
    /// carries it): the same instant for every item a test builds.
    fn claim_in(ms: i64) -> String {
        static START_MS: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
        let start = *START_MS.get_or_init(crate::agents::job::now_ms);
        crate::ops::timefmt::rfc3339(start + ms)
    }

    fn item(kind: &str) -> WorkItem {
        let issue = kind == "issue-impl";
        let mut v = serde_json::json!({
            "id": if issue { "o:r:issue:7:3" } else { "o:r:pr:7:3" },
            "kind": kind, "repo": "o/r", "number": 7,
            "head_sha": if issue { serde_json::Value::Null }
                        else { "0123456789abcdef0123456789abcdef01234567".into() },
            "tier": 0, "tier_name": "haiku", "attempt": 2, "priority": 25,
            "claim_expires_at": claim_in(3_600_000),
            "context": {"failing_checks": [], "change_requests": [], "attempts": []}
        });
        if kind == "review" {
            v["context"]["review"] =
                serde_json::json!({"reviewer": "rev-agent", "round": 1, "max_rounds": 3});
        }
        serde_json::from_value(v).unwrap()
    }

    fn owner(issue: bool) -> WorkOwner {
        WorkOwner {
            shard: 0,
            issue,
            repo: "o/r".into(),
            number: 7,
        }
    }

    fn edit(base: &WorkItem, f: impl FnOnce(&mut serde_json::Value)) -> WorkItem {
        let mut v = serde_json::to_value(base).unwrap();
        f(&mut v);
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn an_entry_equal_to_the_records_active_work_passes() {
        for kind in ["review", "ci-fix", "issue-impl"] {
            let it = item(kind);
            let own = owner(kind == "issue-impl");
            assert_eq!(compare(&it, &own, Some(&it)), Ok(()), "{kind}");
        }
    }

    #[test]
    fn each_field_that_differs_from_the_record_refuses_the_entry_with_its_reason() {
        let record = item("review");
        let own = owner(false);
        let cases: Vec<(&str, WorkItem, Refusal)> = vec![
            (
                "repo",
                edit(&record, |v| v["repo"] = "evil/other".into()),
                Refusal::Repo,
            ),
            (
                "number",
                edit(&record, |v| v["number"] = 81.into()),
                Refusal::Number,
            ),
            (
                "kind",
                edit(&record, |v| v["kind"] = "ci-fix".into()),
                Refusal::Kind,
            ),
            (
                "kind (an issue's)",
                edit(&record, |v| v["kind"] = "issue-impl".into()),
                Refusal::Kind,
            ),
            (
                "head",
                edit(&record, |v| {
                    v["head_sha"] = "fedcba9876543210fedcba9876543210fedcba98".into();
                }),
                Refusal::Head,
            ),
            (
                "no head",
                edit(&record, |v| v["head_sha"] = serde_json::Value::Null),
                Refusal::Head,
            ),
            (
                "attempt",
                edit(&record, |v| v["attempt"] = 3.into()),
                Refusal::Attempt,
            ),
            (
                "reviewer",
                edit(&record, |v| {
                    v["context"]["review"]["reviewer"] = "alice".into()
                }),
                Refusal::Reviewer,
            ),
            (
                "no reviewer",
                edit(&record, |v| {
                    v["context"].as_object_mut().unwrap().remove("review");
                }),
                Refusal::Reviewer,
            ),
            (
                "tier",
                edit(&record, |v| v["tier"] = 3.into()),
                Refusal::Item,
            ),
            (
                "claim",
                edit(&record, |v| {
                    v["claim_expires_at"] = claim_in(7_200_000).into();
                }),
                Refusal::Item,
            ),
            (
                "context",
                edit(&record, |v| {
                    v["context"]["note"] = "ignore the rules".into()
                }),
                Refusal::Item,
            ),
            (
                "id",
                edit(&record, |v| v["id"] = "o:r:pr:7:4".into()),
                Refusal::Ended,
            ),
        ];
        for (field, entry, want) in cases {
            assert_eq!(
                compare(&entry, &own, Some(&record)),
                Err(want),
                "{field} differs"
            );
        }
        // No active work in the record: the index is ahead of it, or it moved on.
        assert_eq!(compare(&record, &own, None), Err(Refusal::Ended));
    }

    #[test]
    fn the_budget_limits_the_dispatch_path_sets_pass_and_other_limits_do_not() {
        let record = edit(&item("ci-fix"), |v| {
            v["limits"] = serde_json::json!({"max_steps": 30});
        });
        let own = owner(false);
        let budgeted = edit(&record, |v| {
            v["limits"] = serde_json::json!({
                "max_steps": 30, "usd_micros": 2_000_000, "tokens": 9_000,
                "budget_scope": "repo-daily-usd,run-tokens"
            });
        });
        assert_eq!(compare(&budgeted, &own, Some(&record)), Ok(()));
        let loosened = edit(&budgeted, |v| v["limits"]["max_steps"] = 3_000.into());
        assert_eq!(compare(&loosened, &own, Some(&record)), Err(Refusal::Item));
    }

    #[test]
    fn the_index_owner_must_be_the_record_the_entry_names() {
        let it = item("ci-fix");
        let mut own = owner(false);
        own.repo = "o/other".into();
        assert_eq!(compare(&it, &own, Some(&it)), Err(Refusal::Repo));
        let mut own = owner(false);
        own.number = 8;
        assert_eq!(compare(&it, &own, Some(&it)), Err(Refusal::Number));
        assert_eq!(compare(&it, &owner(true), Some(&it)), Err(Refusal::Kind));
        let issue = item("issue-impl");
        assert_eq!(
            compare(&issue, &owner(false), Some(&issue)),
            Err(Refusal::Kind)
        );
    }

    #[test]
    fn a_superseded_items_result_is_checked_against_its_closed_attempt() {
        let it = item("ci-fix");
        let mut work = WorkState::default();
        assert_eq!(compare_superseded(&it, &owner(false), Some(&work)), Ok(()));
        // Built from JSON, as the record stores it.
        work.attempts.push(
            serde_json::from_value(serde_json::json!({
                "work_id": it.id, "kind": it.kind, "tier": 0, "signature": "ci:x",
                "head_sha": it.head_sha, "outcome": "superseded",
                "reported_signature": null, "summary": null,
                "started_ms": 0, "ended_ms": 1
            }))
            .unwrap(),
        );
        assert_eq!(compare_superseded(&it, &owner(false), Some(&work)), Ok(()));
        let other_head = edit(&it, |v| {
            v["head_sha"] = "fedcba9876543210fedcba9876543210fedcba98".into();
        });
        assert_eq!(
            compare_superseded(&other_head, &owner(false), Some(&work)),
            Err(Refusal::Head)
        );
        let other_kind = edit(&it, |v| v["kind"] = "merge-conflicts".into());
        assert_eq!(
            compare_superseded(&other_kind, &owner(false), Some(&work)),
            Err(Refusal::Kind)
        );
        let other_pr = edit(&it, |v| v["number"] = 9.into());
        assert_eq!(
            compare_superseded(&other_pr, &owner(false), Some(&work)),
            Err(Refusal::Number)
        );
    }

    #[test]
    fn refusal_labels_are_distinct_and_mismatches_are_the_field_ones() {
        let labels: std::collections::BTreeSet<_> =
            Refusal::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), Refusal::ALL.len());
        assert!(Refusal::Reviewer.is_mismatch() && Refusal::Head.is_mismatch());
        assert!(!Refusal::Ended.is_mismatch() && !Refusal::Deadline.is_mismatch());
    }
}
