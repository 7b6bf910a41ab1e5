//! Freeze windows, manual freezes, the gate and the policy's validation.

use super::*;
use crate::core::policy::PolicyFile;
use crate::core::queue::{QueueAction, QueueOp};

/// A Monday far from today, 00:00 UTC (2001-01-01 was a Monday).
const MONDAY: i64 = 978_307_200_000;
const HOUR: i64 = 3_600_000;

fn window(branch: &str, days: &[&str], from: &str, to: &str) -> FreezeWindow {
    FreezeWindow {
        branch: branch.into(),
        days: days.iter().map(|d| (*d).to_owned()).collect(),
        from: from.into(),
        to: to.into(),
        reason: "release".into(),
    }
}

#[test]
fn the_test_monday_is_a_monday() {
    assert_eq!(day_index(MONDAY), Some(0));
    assert_eq!(minute_of_day(MONDAY + 90 * 60_000), Some(90));
}

#[test]
fn a_window_holds_on_its_days_and_hours_and_ends_at_its_end() {
    let q = BranchQueue::new("main");
    let w = [window("main", &["mon"], "09:00", "17:00")];
    assert_eq!(frozen(&q, &w, MONDAY + 8 * HOUR), None);
    let f = frozen(&q, &w, MONDAY + 9 * HOUR).expect("frozen at 09:00");
    assert_eq!(f.until_ms, Some(MONDAY + 17 * HOUR));
    assert_eq!(f.by, None);
    assert!(
        f.describe("main").contains("until 2001-01-01 17:00 UTC"),
        "{}",
        f.describe("main")
    );
    assert_eq!(frozen(&q, &w, MONDAY + 17 * HOUR), None, "the end is open");
    // Tuesday is not listed; another branch is not frozen.
    assert_eq!(frozen(&q, &w, MONDAY + 24 * HOUR + 10 * HOUR), None);
    assert_eq!(
        frozen(&BranchQueue::new("dev"), &w, MONDAY + 10 * HOUR),
        None
    );
    let every = [window("*", &[], "09:00", "17:00")];
    assert!(
        frozen(
            &BranchQueue::new("dev"),
            &every,
            MONDAY + 3 * 24 * HOUR + 10 * HOUR
        )
        .is_some()
    );
}

/// `HH:MM:SS`: a window starts and ends on its second; its end shows the seconds.
#[test]
fn a_window_in_seconds_starts_and_ends_on_its_second() {
    let q = BranchQueue::new("main");
    let w = [window("main", &[], "09:00:30", "09:01:05")];
    let at = |secs: i64| MONDAY + 9 * HOUR + secs * 1_000;
    assert_eq!(frozen(&q, &w, at(29)), None);
    let f = frozen(&q, &w, at(30)).expect("frozen at 09:00:30");
    assert_eq!(f.until_ms, Some(at(65)));
    assert!(
        f.describe("main").contains("until 2001-01-01 09:01:05 UTC"),
        "{}",
        f.describe("main")
    );
    assert_eq!(frozen(&q, &w, at(65)), None, "the end is open");
    assert!(validate(&w).is_ok());
}

#[test]
fn a_window_across_midnight_and_windows_that_touch_make_one_freeze() {
    let q = BranchQueue::new("main");
    // Friday 20:00 → Saturday 06:00, then Saturday 06:00 → 24:00.
    let w = [
        window("main", &["fri"], "20:00", "06:00"),
        window("main", &["Sat"], "06:00", "24:00"),
    ];
    let friday = MONDAY + 4 * 24 * HOUR;
    let f = frozen(&q, &w, friday + 23 * HOUR).expect("frozen friday night");
    assert_eq!(
        f.until_ms,
        Some(friday + 48 * HOUR),
        "until saturday midnight"
    );
    let f = frozen(&q, &w, friday + 24 * HOUR + 2 * HOUR).expect("saturday 02:00");
    assert_eq!(f.until_ms, Some(friday + 48 * HOUR));
    assert_eq!(frozen(&q, &w, friday + 19 * HOUR), None);
    assert_eq!(frozen(&q, &w, friday + 48 * HOUR), None);
}

#[test]
fn a_manual_freeze_lasts_until_unfrozen_and_names_who_and_why() {
    let mut q = BranchQueue::new("main");
    let freeze = |action| FreezeOp {
        branch: "main".into(),
        by: "alice".into(),
        action,
    };
    let op = freeze(FreezeAction::Freeze {
        reason: "x".repeat(500),
    });
    assert!(q.apply_freeze(&op, 5));
    assert!(
        !q.apply_freeze(&op, 9),
        "the same freeze again changes nothing"
    );
    let f = frozen(&q, &[], MONDAY).expect("frozen");
    assert_eq!(f.reason.chars().count(), MAX_REASON_CHARS);
    assert_eq!((f.by.as_deref(), f.until_ms), (Some("alice"), None));
    assert!(
        f.describe("main")
            .contains("until `/shepherd unfreeze main`")
    );
    let other = FreezeOp {
        branch: "dev".into(),
        ..freeze(FreezeAction::Unfreeze)
    };
    assert!(!q.apply_freeze(&other, 10), "another branch's op");
    assert!(q.apply_freeze(&freeze(FreezeAction::Unfreeze), 10));
    assert_eq!(frozen(&q, &[], MONDAY), None);
}

#[test]
fn the_gate_holds_merges_lets_testing_on_and_lets_a_hotfix_through() {
    let mut q = BranchQueue::new("main");
    let join = |number, priority| QueueOp {
        branch: "main".into(),
        number,
        version: 1,
        action: QueueAction::Join { priority },
    };
    q.apply(&join(1, Priority::Normal), 1);
    q.apply(&join(2, Priority::Hotfix), 2);
    assert_eq!(q.head, Some(2), "a hotfix takes the head from a normal PR");
    let mut policy = PolicyFile::default().defaults;
    policy.merge_queue_freeze = vec![window("main", &[], "00:00", "24:00")];
    let now = MONDAY + HOUR;
    assert!(gate(&q, &[1], &policy, now, true).is_some(), "no merge");
    assert_eq!(gate(&q, &[1], &policy, now, false), None, "testing goes on");
    assert_eq!(
        gate(&q, &[2], &policy, now, true),
        None,
        "the hotfix merges"
    );
    assert!(
        gate(&q, &[2, 1], &policy, now, true).is_some(),
        "not with a normal PR"
    );
    policy.merge_queue_freeze_test = false;
    assert!(
        gate(&q, &[1], &policy, now, false).is_some(),
        "no testing either"
    );
    policy.merge_queue_freeze.clear();
    assert_eq!(gate(&q, &[1], &policy, now, true), None, "not frozen");
}

#[test]
fn a_held_head_asks_again_at_the_end_or_every_five_minutes() {
    let f = |until_ms| Frozen {
        reason: String::new(),
        by: None,
        until_ms,
    };
    assert_eq!(retry_ms(&f(Some(MONDAY + 60_000)), MONDAY), 60_000);
    assert_eq!(retry_ms(&f(Some(MONDAY + 5 * HOUR)), MONDAY), 300_000);
    assert_eq!(retry_ms(&f(None), MONDAY), 300_000);
    assert_eq!(retry_ms(&f(Some(MONDAY)), MONDAY), 1_000);
}

#[test]
fn the_policy_reads_and_checks_windows() {
    let ok = PolicyFile::from_toml(
        "[defaults]\nmerge_queue_freeze = [{ branch = \"main\", days = [\"fri\"], from = \"16:00\", to = \"24:00\", reason = \"weekend\" }]\nmerge_queue_hotfix_label = \"urgent\"\n",
    )
    .expect("valid");
    assert_eq!(ok.defaults.merge_queue_freeze.len(), 1);
    assert_eq!(ok.defaults.merge_queue_hotfix_label, "urgent");
    assert!(ok.defaults.merge_queue_freeze_test);
    for (window, problem) in [
        (
            "branch = \"\", from = \"1:00\", to = \"2:00\"",
            "needs a branch",
        ),
        (
            "branch = \"m\", days = [\"friday\"], from = \"1:00\", to = \"2:00\"",
            "is not a day",
        ),
        ("branch = \"m\", from = \"25:00\", to = \"2:00\"", "HH:MM"),
        ("branch = \"m\", from = \"1:60\", to = \"2:00\"", "HH:MM"),
        ("branch = \"m\", from = \"1:0\", to = \"2:00\"", "HH:MM"),
        (
            "branch = \"m\", from = \"1:00:60\", to = \"2:00\"",
            "HH:MM:SS",
        ),
        (
            "branch = \"m\", from = \"1:00:5\", to = \"2:00\"",
            "HH:MM:SS",
        ),
        (
            "branch = \"m\", from = \"1:00:00:00\", to = \"2:00\"",
            "HH:MM:SS",
        ),
        (
            "branch = \"m\", from = \"23:00\", to = \"24:00:01\"",
            "HH:MM:SS",
        ),
        (
            "branch = \"m\", from = \"+1:00\", to = \"2:00\"",
            "HH:MM:SS",
        ),
        (
            "branch = \"m\", from = \"03:00:00\", to = \"3:00\"",
            "empty window",
        ),
        (
            "branch = \"m\", from = \"03:00\", to = \"3:00\"",
            "empty window",
        ),
        ("branch = \"m\", from = \"03:00\"", "missing field"),
        (
            "branch = \"m\", from = \"03:00\", to = \"04:00\", until = \"x\"",
            "unknown field",
        ),
    ] {
        let text = format!("[defaults]\nmerge_queue_freeze = [{{ {window} }}]\n");
        let err = PolicyFile::from_toml(&text).expect_err(window).to_string();
        assert!(
            err.contains("merge_queue_freeze") || err.contains(problem),
            "{err}"
        );
        assert!(err.contains(problem), "{window}: {err}");
    }
}
