//! Budgets, enforced outside the agent (issue 28): which spend caps apply to a run,
//! how much of each is left, whether a run may start, and the limits it runs under.
//!
//! The rule (docs/costs.md): **every applicable cap is checked and the tightest
//! remaining one decides.** A cap is a policy key `budget_<scope>_usd` or
//! `budget_<scope>_tokens` (0 = no cap). Before dispatch a run may start only when, for
//! every cap, something is left and the remainder covers the run's expected cost: the
//! per-run cap when set, else the PR's median run so far. The run then carries the
//! smallest remainder (in dollars and in tokens) as its limits, named after the cap
//! that set it. A stopped run waits until every cap that stopped it has reset (the
//! next UTC day or month; the per-run and per-PR caps never reset by themselves), or
//! until a user with write access grants the PR more with `/shepherd budget +<amount>`.
//!
//! Pure: the dispatch path reads the ledger, the record supplies the grant and the
//! PR's past runs, and the clock is an argument.

use chrono::{Datelike, NaiveDate, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use super::policy::Policy;
use super::usage::usd_to_micros;

/// Whose spending a cap limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// One run.
    Run,
    /// One PR (or issue), all its runs.
    Pr,
    /// One repository.
    Repo,
    /// One organisation (the repository's owner).
    Org,
    /// The whole instance.
    Instance,
}

/// Over which period a cap counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Window {
    /// For ever (the run and PR caps).
    Lifetime,
    /// The UTC day.
    Day,
    /// The UTC month.
    Month,
}

/// What a cap counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unit {
    /// Micro-dollars.
    Usd,
    /// Input + output tokens.
    Tokens,
}

/// One cap of the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// Whose spending.
    pub scope: Scope,
    /// Over which period.
    pub window: Window,
    /// In what.
    pub unit: Unit,
    /// The cap (micro-dollars or tokens; never 0: a 0 key is no cap).
    pub limit: u64,
}

impl Cap {
    /// The cap's name, as shown and carried in `limits.budget_scope`: the policy key
    /// without `budget_`, kebab-case (`run-usd`, `repo-daily-usd`, `org-monthly-tokens`).
    pub fn name(&self) -> String {
        let scope = match self.scope {
            Scope::Run => "run",
            Scope::Pr => "pr",
            Scope::Repo => "repo",
            Scope::Org => "org",
            Scope::Instance => "instance",
        };
        let window = match self.window {
            Window::Lifetime => "",
            Window::Day => "-daily",
            Window::Month => "-monthly",
        };
        let unit = match self.unit {
            Unit::Usd => "usd",
            Unit::Tokens => "tokens",
        };
        format!("{scope}{window}-{unit}")
    }

    /// When the cap's window starts again after `now_ms` (unix ms); `None` for the
    /// run and PR caps, which only a grant lifts.
    pub fn resets_at(&self, now_ms: i64) -> Option<i64> {
        match self.window {
            Window::Lifetime => None,
            Window::Day => next_utc_day(now_ms),
            Window::Month => next_utc_month(now_ms),
        }
    }
}

/// The start of the next UTC day after `now_ms`.
pub fn next_utc_day(now_ms: i64) -> Option<i64> {
    let today = Utc.timestamp_millis_opt(now_ms).single()?.date_naive();
    midnight(today.succ_opt()?)
}

/// The start of the next UTC month after `now_ms`.
pub fn next_utc_month(now_ms: i64) -> Option<i64> {
    let today = Utc.timestamp_millis_opt(now_ms).single()?.date_naive();
    let (y, m) = match today.month() {
        12 => (today.year().checked_add(1)?, 1),
        m => (today.year(), m + 1),
    };
    midnight(NaiveDate::from_ymd_opt(y, m, 1)?)
}

/// Midnight UTC of `day`, in unix ms.
fn midnight(day: NaiveDate) -> Option<i64> {
    Some(day.and_hms_opt(0, 0, 0)?.and_utc().timestamp_millis())
}

/// Every cap the policy sets (keys at 0 are left out), run caps first.
pub fn caps(policy: &Policy) -> Vec<Cap> {
    use Scope::{Instance, Org, Pr, Repo, Run};
    use Window::{Day, Lifetime, Month};
    let usd = [
        (Run, Lifetime, policy.budget_run_usd),
        (Pr, Lifetime, policy.budget_pr_usd),
        (Repo, Day, policy.budget_repo_daily_usd),
        (Repo, Month, policy.budget_repo_monthly_usd),
        (Org, Day, policy.budget_org_daily_usd),
        (Org, Month, policy.budget_org_monthly_usd),
        (Instance, Day, policy.budget_instance_daily_usd),
        (Instance, Month, policy.budget_instance_monthly_usd),
    ];
    let tokens = [
        (Run, Lifetime, policy.budget_run_tokens),
        (Pr, Lifetime, policy.budget_pr_tokens),
        (Repo, Day, policy.budget_repo_daily_tokens),
        (Repo, Month, policy.budget_repo_monthly_tokens),
        (Org, Day, policy.budget_org_daily_tokens),
        (Org, Month, policy.budget_org_monthly_tokens),
        (Instance, Day, policy.budget_instance_daily_tokens),
        (Instance, Month, policy.budget_instance_monthly_tokens),
    ];
    let mut out: Vec<Cap> = usd
        .into_iter()
        .map(|(scope, window, v)| (scope, window, Unit::Usd, usd_to_micros(v)))
        .chain(
            tokens
                .into_iter()
                .map(|(scope, window, v)| (scope, window, Unit::Tokens, v)),
        )
        .filter(|(_, _, _, limit)| *limit > 0)
        .map(|(scope, window, unit, limit)| Cap {
            scope,
            window,
            unit,
            limit,
        })
        .collect();
    out.sort_by_key(|c| (c.scope, c.window, c.unit));
    out
}

/// What one scope has spent in one window (from the ledger).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    /// Micro-dollars.
    pub usd_micros: u64,
    /// Input + output tokens.
    pub tokens: u64,
}

impl Spent {
    /// The figure a cap in `unit` counts.
    fn of(&self, unit: Unit) -> u64 {
        match unit {
            Unit::Usd => self.usd_micros,
            Unit::Tokens => self.tokens,
        }
    }
}

/// Extra allowance a user with write access gave one PR (`/shepherd budget +<amount>`),
/// counted down as the PR spends it. It is added to what every cap leaves for this
/// PR only: no other PR may spend it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Grant {
    /// Micro-dollars left of the grants.
    pub usd_micros: u64,
    /// Tokens left of the grants.
    pub tokens: u64,
}

impl Grant {
    /// The grant's part in `unit`.
    fn of(&self, unit: Unit) -> u64 {
        match unit {
            Unit::Usd => self.usd_micros,
            Unit::Tokens => self.tokens,
        }
    }

    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.usd_micros == 0 && self.tokens == 0
    }
}

/// What a run is expected to cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expected {
    /// Micro-dollars.
    pub usd_micros: u64,
    /// Input + output tokens.
    pub tokens: u64,
}

/// The expected cost of the next run: the per-run cap where set, else the median of
/// the PR's past runs (`runs`: each run's micro-dollars and tokens; none yet: 0).
pub fn expected(policy: &Policy, runs: &[Spent]) -> Expected {
    let median = |mut v: Vec<u64>| -> u64 {
        v.sort_unstable();
        match v.len() {
            0 => 0,
            n if n % 2 == 1 => v[n / 2],
            n => v[n / 2 - 1] / 2 + v[n / 2] / 2 + (v[n / 2 - 1] % 2 + v[n / 2] % 2) / 2,
        }
    };
    let run_usd = usd_to_micros(policy.budget_run_usd);
    Expected {
        usd_micros: match run_usd {
            0 => median(runs.iter().map(|r| r.usd_micros).collect()),
            cap => cap,
        },
        tokens: match policy.budget_run_tokens {
            0 => median(runs.iter().map(|r| r.tokens).collect()),
            cap => cap,
        },
    }
}

/// What each scope has spent, for the caps of one run (a scope/window the ledger was
/// not asked about counts as nothing spent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    /// `(scope, window)` → spent. The run scope is never looked up (a new run has
    /// spent nothing).
    pub spent: Vec<((Scope, Window), Spent)>,
}

impl Ledger {
    /// What `scope` spent in `window`.
    pub fn get(&self, scope: Scope, window: Window) -> Spent {
        if scope == Scope::Run {
            return Spent::default();
        }
        self.spent
            .iter()
            .find(|(k, _)| *k == (scope, window))
            .map(|(_, s)| *s)
            .unwrap_or_default()
    }
}

/// What one cap leaves for this PR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remaining {
    /// The cap.
    pub cap: Cap,
    /// What is left of it for this PR (its remainder plus the PR's grant).
    pub left: u64,
}

/// Every cap's remainder for this PR.
pub fn remaining(policy: &Policy, ledger: &Ledger, grant: Grant) -> Vec<Remaining> {
    caps(policy)
        .into_iter()
        .map(|cap| {
            let spent = ledger.get(cap.scope, cap.window).of(cap.unit);
            let left = cap.limit.saturating_sub(spent);
            Remaining {
                cap,
                left: left.saturating_add(grant.of(cap.unit)),
            }
        })
        .collect()
}

/// The budget part of a run's limits: the tightest remainder in each unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetLimits {
    /// Most micro-dollars the run may spend (`None`: no dollar cap applies).
    pub usd_micros: Option<u64>,
    /// Most tokens (`None`: no token cap applies).
    pub tokens: Option<u64>,
    /// The caps that set them, comma-separated (dollars first), e.g.
    /// `repo-daily-usd,run-tokens`.
    pub scope: Option<String>,
}

/// Why a run may not start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stop {
    /// The tightest cap among those that stopped it (its name).
    pub cap: String,
    /// What that cap leaves (micro-dollars or tokens).
    pub left: u64,
    /// What the run was expected to need in that unit.
    pub needed: u64,
    /// Whether `left` and `needed` are tokens (else micro-dollars).
    pub tokens: bool,
    /// When every cap that stopped it has reset (unix ms); `None` when one of them
    /// never resets by itself (run, PR), so only a grant lifts it.
    pub resets_at_ms: Option<i64>,
}

/// The decision before a dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Run, under these limits.
    Go(BudgetLimits),
    /// Do not run.
    Stop(Stop),
}

/// The decision before a dispatch: every applicable cap is checked, and the tightest
/// remaining one decides. A cap stops the run when nothing is left of it or less
/// than the run's expected cost; otherwise the run carries the tightest remainder of
/// each unit as its limit.
pub fn decide(
    policy: &Policy,
    ledger: &Ledger,
    grant: Grant,
    expected: Expected,
    now_ms: i64,
) -> Verdict {
    let rem = remaining(policy, ledger, grant);
    let need = |unit: Unit| match unit {
        Unit::Usd => expected.usd_micros,
        Unit::Tokens => expected.tokens,
    };
    let failing: Vec<&Remaining> = rem
        .iter()
        .filter(|r| r.left == 0 || r.left < need(r.cap.unit))
        .collect();
    if let Some(tightest) = failing.iter().min_by_key(|r| tightness(r)) {
        // Resumes when every failing cap has reset: the latest reset, or never.
        let resets: Option<Vec<i64>> = failing.iter().map(|r| r.cap.resets_at(now_ms)).collect();
        return Verdict::Stop(Stop {
            cap: tightest.cap.name(),
            left: tightest.left,
            needed: need(tightest.cap.unit),
            tokens: tightest.cap.unit == Unit::Tokens,
            resets_at_ms: resets.and_then(|r| r.into_iter().max()),
        });
    }
    let tightest = |unit: Unit| {
        rem.iter()
            .filter(|r| r.cap.unit == unit)
            .min_by_key(|r| r.left)
    };
    let usd = tightest(Unit::Usd);
    let tokens = tightest(Unit::Tokens);
    let names: Vec<String> = usd
        .iter()
        .chain(tokens.iter())
        .map(|r| r.cap.name())
        .collect();
    Verdict::Go(BudgetLimits {
        usd_micros: usd.map(|r| r.left),
        tokens: tokens.map(|r| r.left),
        scope: (!names.is_empty()).then(|| names.join(",")),
    })
}

/// Orders remainders of different units: the share of the cap that is left (so a
/// dollar cap and a token cap compare), then the smaller remainder.
fn tightness(r: &Remaining) -> (u128, u64) {
    let share = u128::from(r.left).saturating_mul(1_000_000) / u128::from(r.cap.limit.max(1));
    (share, r.left)
}

/// The reset of the caps named in a run's `budget_scope` (after the runner stopped it
/// for its budget): the latest reset among them, `None` when one of them never
/// resets by itself (or a name is unknown).
pub fn resets_of_scope(budget_scope: &str, now_ms: i64) -> Option<i64> {
    let mut latest: Option<i64> = None;
    for name in budget_scope.split(',') {
        let window = match name {
            n if n.contains("-daily-") => Window::Day,
            n if n.contains("-monthly-") => Window::Month,
            _ => return None,
        };
        let cap = Cap {
            scope: Scope::Repo,
            window,
            unit: Unit::Usd,
            limit: 1,
        };
        latest = latest.max(cap.resets_at(now_ms));
    }
    latest
}

#[cfg(test)]
#[path = "budget_tests.rs"]
mod tests;
