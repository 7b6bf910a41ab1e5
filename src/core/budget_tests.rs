//! Table and property tests of the budget decision (`core::budget`).

use super::*;
use crate::core::usage::MICROS_PER_USD;

/// A clock far from today: 2030-03-15 12:00 UTC.
const NOW: i64 = 1_899_806_400_000;

/// Dollars in micro-dollars.
fn usd(d: u64) -> u64 {
    d * MICROS_PER_USD
}

/// A ledger with these `(scope, window, usd, tokens)` figures.
fn ledger(rows: &[(Scope, Window, u64, u64)]) -> Ledger {
    Ledger {
        spent: rows
            .iter()
            .map(|(s, w, u, t)| {
                (
                    (*s, *w),
                    Spent {
                        usd_micros: *u,
                        tokens: *t,
                    },
                )
            })
            .collect(),
    }
}

#[test]
fn cap_names_follow_the_policy_keys() {
    let p = Policy {
        budget_run_usd: 1.0,
        budget_repo_daily_usd: 10.0,
        budget_org_monthly_tokens: 5,
        budget_pr_tokens: 3,
        ..Policy::default()
    };
    let names: Vec<String> = caps(&p).iter().map(Cap::name).collect();
    assert_eq!(
        names,
        [
            "run-usd",
            "pr-tokens",
            "repo-daily-usd",
            "org-monthly-tokens"
        ]
    );
    assert!(caps(&Policy::default()).is_empty(), "0 is no cap");
}

#[test]
fn resets_are_the_next_utc_day_and_month() {
    // 2030-03-16 00:00 and 2030-04-01 00:00 UTC.
    assert_eq!(next_utc_day(NOW), Some(1_899_849_600_000));
    assert_eq!(next_utc_month(NOW), Some(1_901_232_000_000));
    // December rolls into January of the next year: 2030-12-31 23:59:59.999 → 2031-01-01.
    let dec = 1_924_991_999_999;
    assert_eq!(next_utc_month(dec), Some(1_924_992_000_000));
    assert_eq!(next_utc_day(dec), Some(1_924_992_000_000));
}

/// One row of the decision table.
struct Case {
    /// What the row shows.
    name: &'static str,
    /// The policy.
    policy: Policy,
    /// The ledger.
    ledger: Ledger,
    /// The PR's grant.
    grant: Grant,
    /// The PR's past runs (for the median).
    runs: Vec<Spent>,
    /// The verdict.
    want: Verdict,
}

fn cases() -> Vec<Case> {
    use Scope::{Instance, Org, Pr, Repo};
    use Window::{Day, Lifetime, Month};
    let runs = |v: &[u64]| -> Vec<Spent> {
        v.iter()
            .map(|u| Spent {
                usd_micros: *u,
                tokens: 0,
            })
            .collect()
    };
    vec![
        Case {
            name: "no cap: run without budget limits",
            policy: Policy::default(),
            ledger: ledger(&[(Repo, Day, usd(1_000), 0)]),
            grant: Grant::default(),
            runs: vec![],
            want: Verdict::Go(BudgetLimits::default()),
        },
        Case {
            name: "the tightest remainder sets the limit (org monthly beats repo daily)",
            policy: Policy {
                budget_repo_daily_usd: 10.0,
                budget_org_monthly_usd: 100.0,
                ..Policy::default()
            },
            ledger: ledger(&[(Repo, Day, usd(2), 0), (Org, Month, usd(97), 0)]),
            grant: Grant::default(),
            runs: vec![],
            want: Verdict::Go(BudgetLimits {
                usd_micros: Some(usd(3)),
                tokens: None,
                scope: Some("org-monthly-usd".into()),
            }),
        },
        Case {
            name: "the run cap is a limit and the expected cost",
            policy: Policy {
                budget_run_usd: 2.0,
                budget_repo_daily_usd: 10.0,
                ..Policy::default()
            },
            ledger: ledger(&[(Repo, Day, usd(5), 0)]),
            grant: Grant::default(),
            runs: vec![],
            want: Verdict::Go(BudgetLimits {
                usd_micros: Some(usd(2)),
                tokens: None,
                scope: Some("run-usd".into()),
            }),
        },
        Case {
            name: "less left than the run cap: stop until tomorrow",
            policy: Policy {
                budget_run_usd: 2.0,
                budget_repo_daily_usd: 10.0,
                ..Policy::default()
            },
            ledger: ledger(&[(Repo, Day, usd(9), 0)]),
            grant: Grant::default(),
            runs: vec![],
            want: Verdict::Stop(Stop {
                cap: "repo-daily-usd".into(),
                left: usd(1),
                needed: usd(2),
                tokens: false,
                resets_at_ms: next_utc_day(NOW),
            }),
        },
        Case {
            name: "nothing left stops even a run expected to cost nothing",
            policy: Policy {
                budget_instance_daily_usd: 10.0,
                ..Policy::default()
            },
            ledger: ledger(&[(Instance, Day, usd(12), 0)]),
            grant: Grant::default(),
            runs: vec![],
            want: Verdict::Stop(Stop {
                cap: "instance-daily-usd".into(),
                left: 0,
                needed: 0,
                tokens: false,
                resets_at_ms: next_utc_day(NOW),
            }),
        },
        Case {
            name: "the PR's median run is the expected cost without a run cap",
            policy: Policy {
                budget_repo_daily_usd: 10.0,
                ..Policy::default()
            },
            ledger: ledger(&[(Repo, Day, usd(7), 0)]),
            grant: Grant::default(),
            runs: runs(&[usd(1), usd(4), usd(5)]),
            want: Verdict::Stop(Stop {
                cap: "repo-daily-usd".into(),
                left: usd(3),
                needed: usd(4),
                tokens: false,
                resets_at_ms: next_utc_day(NOW),
            }),
        },
        Case {
            name: "daily and monthly both out: resumes at the month's reset",
            policy: Policy {
                budget_repo_daily_usd: 10.0,
                budget_repo_monthly_usd: 20.0,
                ..Policy::default()
            },
            ledger: ledger(&[(Repo, Day, usd(10), 0), (Repo, Month, usd(20), 0)]),
            grant: Grant::default(),
            runs: vec![],
            want: Verdict::Stop(Stop {
                cap: "repo-daily-usd".into(),
                left: 0,
                needed: 0,
                tokens: false,
                resets_at_ms: next_utc_month(NOW),
            }),
        },
        Case {
            name: "a PR cap never resets by itself",
            policy: Policy {
                budget_pr_usd: 5.0,
                budget_repo_daily_usd: 1.0,
                ..Policy::default()
            },
            ledger: ledger(&[(Pr, Lifetime, usd(5), 0), (Repo, Day, usd(1), 0)]),
            grant: Grant::default(),
            runs: vec![],
            want: Verdict::Stop(Stop {
                cap: "pr-usd".into(),
                left: 0,
                needed: 0,
                tokens: false,
                resets_at_ms: None,
            }),
        },
        Case {
            name: "a grant lifts this PR above the spent caps",
            policy: Policy {
                budget_repo_daily_usd: 10.0,
                ..Policy::default()
            },
            ledger: ledger(&[(Repo, Day, usd(10), 0)]),
            grant: Grant {
                usd_micros: usd(5),
                tokens: 0,
            },
            runs: vec![],
            want: Verdict::Go(BudgetLimits {
                usd_micros: Some(usd(5)),
                tokens: None,
                scope: Some("repo-daily-usd".into()),
            }),
        },
        Case {
            name: "token caps count input + output tokens; both units limit the run",
            policy: Policy {
                budget_repo_daily_usd: 10.0,
                budget_repo_daily_tokens: 1_000,
                ..Policy::default()
            },
            ledger: ledger(&[(Repo, Day, usd(1), 400)]),
            grant: Grant::default(),
            runs: vec![],
            want: Verdict::Go(BudgetLimits {
                usd_micros: Some(usd(9)),
                tokens: Some(600),
                scope: Some("repo-daily-usd,repo-daily-tokens".into()),
            }),
        },
        Case {
            name: "a spent token cap stops though dollars are left",
            policy: Policy {
                budget_repo_daily_usd: 10.0,
                budget_org_daily_tokens: 1_000,
                ..Policy::default()
            },
            ledger: ledger(&[(Repo, Day, usd(1), 0), (Org, Day, 0, 1_000)]),
            grant: Grant {
                usd_micros: usd(3),
                tokens: 0,
            },
            runs: vec![],
            want: Verdict::Stop(Stop {
                cap: "org-daily-tokens".into(),
                left: 0,
                needed: 0,
                tokens: true,
                resets_at_ms: next_utc_day(NOW),
            }),
        },
    ]
}

#[test]
fn every_cap_is_checked_and_the_tightest_decides() {
    for c in cases() {
        let exp = expected(&c.policy, &c.runs);
        let got = decide(&c.policy, &c.ledger, c.grant, exp, NOW);
        assert_eq!(got, c.want, "{}", c.name);
    }
}

#[test]
fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
    let runs: Vec<Spent> = [1, 3, 10, 100]
        .iter()
        .map(|u| Spent {
            usd_micros: *u,
            tokens: u * 2,
        })
        .collect();
    let e = expected(&Policy::default(), &runs);
    assert_eq!(
        e,
        Expected {
            usd_micros: 6,
            tokens: 13
        }
    );
    assert_eq!(expected(&Policy::default(), &[]), Expected::default());
}

#[test]
fn a_stopped_runs_scope_resets_with_its_latest_cap() {
    assert_eq!(resets_of_scope("repo-daily-usd", NOW), next_utc_day(NOW));
    assert_eq!(
        resets_of_scope("repo-daily-usd,org-monthly-tokens", NOW),
        next_utc_month(NOW)
    );
    assert_eq!(resets_of_scope("run-usd", NOW), None);
    assert_eq!(resets_of_scope("repo-daily-usd,pr-tokens", NOW), None);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    /// Whatever the figures: a run starts only when every cap leaves at least the
    /// expected cost (and something), and then its limits never exceed any cap's
    /// remainder.
    #[test]
    fn never_dispatches_over_budget(
        daily in 0u64..50, monthly in 0u64..200, run_cap in 0u64..5,
        spent_day in 0u64..60, spent_month in 0u64..250, grant in 0u64..10,
        past in proptest::collection::vec(0u64..8, 0..5),
    ) {
        let policy = Policy {
            budget_repo_daily_usd: daily as f64,
            budget_repo_monthly_usd: monthly as f64,
            budget_run_usd: run_cap as f64,
            ..Policy::default()
        };
        let l = ledger(&[
            (Scope::Repo, Window::Day, usd(spent_day), 0),
            (Scope::Repo, Window::Month, usd(spent_month), 0),
        ]);
        let g = Grant { usd_micros: usd(grant), tokens: 0 };
        let runs: Vec<Spent> = past.iter().map(|u| Spent { usd_micros: usd(*u), tokens: 0 }).collect();
        let exp = expected(&policy, &runs);
        let rem = remaining(&policy, &l, g);
        match decide(&policy, &l, g, exp, NOW) {
            Verdict::Go(limits) => {
                for r in &rem {
                    proptest::prop_assert!(r.left > 0 && r.left >= exp.usd_micros);
                    proptest::prop_assert!(limits.usd_micros.is_some_and(|u| u <= r.left));
                }
                proptest::prop_assert_eq!(limits.usd_micros.is_none(), rem.is_empty());
            }
            Verdict::Stop(stop) => {
                proptest::prop_assert!(rem.iter().any(|r| r.left == 0 || r.left < exp.usd_micros));
                proptest::prop_assert!(stop.left == 0 || stop.left < stop.needed);
            }
        }
    }
}
