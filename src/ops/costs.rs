//! `shepherd costs` and `GET /api/v1/admin/costs` (issue 28): what the agents cost,
//! read from the ledger (`store::ledger`) — per repository per UTC day, the PRs (and
//! issues) with runs in the range by lifetime cost, and per repository by work kind
//! and tier. A request names a day range (default: the last 7 days, today included)
//! and optionally one repository; the report renders as text, CSV or JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{Days, NaiveDate};
use serde::{Deserialize, Serialize};

use super::status::PrSummary;
use super::{Ops, OpsError, parse_repo};
use crate::core::ids::RepoName;
use crate::core::policy::Policy;
use crate::core::usage::{micros_to_usd, usd_to_micros};
use crate::store::ledger::{self, Bucket, Figures, Scope, Window};

/// Days read when the request names no start.
pub const DEFAULT_DAYS: u32 = 7;
/// The longest range: the ledger keeps 13 months.
pub const MAX_DAYS: u32 = 403;
/// PRs (and issues) listed when the request does not say.
pub const DEFAULT_TOP: usize = 20;

/// What to report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostsRequest {
    /// First day, `YYYY-MM-DD` (UTC); default: `days` days up to `to`.
    pub from: Option<String>,
    /// Last day, `YYYY-MM-DD` (UTC); default: today.
    pub to: Option<String>,
    /// Days up to `to` when `from` is not given (default [`DEFAULT_DAYS`]).
    pub days: Option<u32>,
    /// Only this repository (`owner/name`).
    pub repo: Option<String>,
    /// Most PRs and issues listed, most expensive first (default [`DEFAULT_TOP`]; 0:
    /// all).
    pub top: Option<usize>,
}

/// Summed usage as reported: the ledger's figures (micro-dollars exact, tokens, runs)
/// with the cost in dollars beside them for reading. The JSON is flat: `usd` and the
/// figures' own keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// Cost in US dollars.
    pub usd: f64,
    /// The ledger's figures.
    #[serde(flatten)]
    pub figures: Figures,
}

impl std::ops::Deref for Cost {
    type Target = Figures;

    fn deref(&self) -> &Figures {
        &self.figures
    }
}

impl From<Figures> for Cost {
    fn from(figures: Figures) -> Self {
        Self {
            usd: micros_to_usd(figures.usd_micros),
            figures,
        }
    }
}

/// One repository's figures of one day.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepoDay {
    /// Repository.
    pub repo: String,
    /// UTC day, `YYYY-MM-DD`.
    pub day: String,
    /// Its figures.
    #[serde(flatten)]
    pub cost: Cost,
}

/// One PR's (or issue's) lifetime figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubjectCost {
    /// Repository.
    pub repo: String,
    /// PR or issue number.
    pub number: u64,
    /// Its lifetime figures.
    #[serde(flatten)]
    pub cost: Cost,
}

/// One repository's figures for one work kind or tier over the range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupCost {
    /// Repository.
    pub repo: String,
    /// The work kind (`ci-fix`, …) or the tier number.
    pub group: String,
    /// Its figures.
    #[serde(flatten)]
    pub cost: Cost,
}

/// What `costs` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostsReport {
    /// First day of the range.
    pub from: String,
    /// Last day of the range.
    pub to: String,
    /// The repository asked for, if any.
    pub repo: Option<String>,
    /// Per repository per day (days in order, then repositories).
    pub repos: Vec<RepoDay>,
    /// The PRs with runs in the range, most expensive (lifetime) first.
    pub prs: Vec<SubjectCost>,
    /// The issues with runs in the range (`issue-impl`), most expensive first.
    pub issues: Vec<SubjectCost>,
    /// Per repository per work kind, over the range.
    pub kinds: Vec<GroupCost>,
    /// Per repository per tier, over the range.
    pub tiers: Vec<GroupCost>,
    /// Everything in the range (the repositories' sum).
    pub total: Cost,
}

/// The days a request covers, first to last.
pub fn day_range(req: &CostsRequest, today: NaiveDate) -> Result<(NaiveDate, NaiveDate), OpsError> {
    let parse = |t: &str| {
        NaiveDate::parse_from_str(t.trim(), "%Y-%m-%d")
            .map_err(|_| OpsError::BadRequest(format!("{t:?} is not a day (YYYY-MM-DD)")))
    };
    let to = req.to.as_deref().map(parse).transpose()?.unwrap_or(today);
    let from = match (&req.from, req.days) {
        (Some(f), _) => parse(f)?,
        (None, days) => {
            let days = days.unwrap_or(DEFAULT_DAYS);
            if days == 0 {
                return Err(OpsError::BadRequest("days must be at least 1".into()));
            }
            to.checked_sub_days(Days::new(u64::from(days) - 1))
                .ok_or_else(|| OpsError::BadRequest("the range starts before time".into()))?
        }
    };
    if from > to {
        return Err(OpsError::BadRequest(format!("{from} is after {to}")));
    }
    if (to - from).num_days() >= i64::from(MAX_DAYS) {
        return Err(OpsError::BadRequest(format!(
            "at most {MAX_DAYS} days (the ledger keeps 13 months)"
        )));
    }
    Ok((from, to))
}

/// Reads the ledger for `req`.
pub async fn costs(ops: &Ops, req: &CostsRequest, now_ms: i64) -> Result<CostsReport, OpsError> {
    let (from, to) = day_range(req, ledger::day_of(now_ms))?;
    let only: Option<RepoName> = req.repo.as_deref().map(parse_repo).transpose()?;
    let keep = |repo: &str| only.as_ref().is_none_or(|o| o.as_str() == repo);
    let mut conn = ops.conn();
    let mut repos = Vec::new();
    let mut prs: BTreeMap<(String, u64), ()> = BTreeMap::new();
    let mut issues: BTreeMap<(String, u64), ()> = BTreeMap::new();
    let mut kinds: BTreeMap<(String, String), Figures> = BTreeMap::new();
    let mut tiers: BTreeMap<(String, u8), Figures> = BTreeMap::new();
    let mut total = Figures::default();
    for day in from.iter_days().take_while(|d| *d <= to) {
        let buckets = ledger::buckets(&mut conn, &ledger::day_key(&ops.keys, day)).await?;
        for (bucket, f) in buckets {
            match bucket {
                Bucket::Repo(r) if keep(&r) => {
                    total.add(&f);
                    repos.push(RepoDay {
                        repo: r,
                        day: day.to_string(),
                        cost: f.into(),
                    });
                }
                Bucket::Pr(r, n) if keep(&r) => {
                    prs.insert((r, n), ());
                }
                Bucket::Issue(r, n) if keep(&r) => {
                    issues.insert((r, n), ());
                }
                Bucket::Kind(r, k) if keep(&r) => kinds.entry((r, k)).or_default().add(&f),
                Bucket::Tier(r, t) if keep(&r) => tiers.entry((r, t)).or_default().add(&f),
                _ => {}
            }
        }
    }
    let top = req.top.unwrap_or(DEFAULT_TOP);
    Ok(CostsReport {
        from: from.to_string(),
        to: to.to_string(),
        repo: only.map(|r| r.to_string()),
        repos,
        prs: lifetime(ops, &mut conn, false, prs.into_keys(), top).await?,
        issues: lifetime(ops, &mut conn, true, issues.into_keys(), top).await?,
        kinds: kinds
            .into_iter()
            .map(|((repo, group), f)| GroupCost {
                repo,
                group,
                cost: f.into(),
            })
            .collect(),
        tiers: tiers
            .into_iter()
            .map(|((repo, t), f)| GroupCost {
                repo,
                group: t.to_string(),
                cost: f.into(),
            })
            .collect(),
        total: total.into(),
    })
}

/// The lifetime figures of PRs (or issues), most expensive first, the first `top`
/// (0: all).
async fn lifetime(
    ops: &Ops,
    conn: &mut crate::store::Conn,
    issue: bool,
    subjects: impl Iterator<Item = (String, u64)>,
    top: usize,
) -> Result<Vec<SubjectCost>, OpsError> {
    let mut named = Vec::new();
    for (repo, number) in subjects {
        if let Ok(r) = repo.parse::<RepoName>() {
            named.push((r, number));
        }
    }
    let figures = ledger::subject_figures(conn, &ops.keys, issue, &named).await?;
    let mut out: Vec<SubjectCost> = named
        .into_iter()
        .zip(figures)
        .map(|((repo, number), f)| SubjectCost {
            repo: repo.to_string(),
            number,
            cost: f.into(),
        })
        .collect();
    out.sort_by(|a, b| {
        (b.cost.usd_micros, &a.repo, a.number).cmp(&(a.cost.usd_micros, &b.repo, b.number))
    });
    if top > 0 {
        out.truncate(top);
    }
    Ok(out)
}

/// The CSV header of [`render_csv`].
pub const CSV_HEADER: &str = "section,repo,day,number,group,usd,input_tokens,output_tokens,\
reasoning_tokens,cache_read_tokens,cache_write_tokens,runs";

/// The report as CSV: one header, one row per figure, its `section` saying which
/// table (`repo-day`, `pr`, `issue`, `kind`, `tier`, `total`). Dollars with six
/// decimals (exact micro-dollars).
pub fn render_csv(r: &CostsReport) -> String {
    let mut out = format!("{CSV_HEADER}\n");
    let mut row = |section: &str, repo: &str, day: &str, number: &str, group: &str, c: &Cost| {
        let _ = writeln!(
            out,
            "{section},{repo},{day},{number},{group},{},{},{},{},{},{},{}",
            dollars(c.usd_micros),
            c.input_tokens,
            c.output_tokens,
            c.reasoning_tokens,
            c.cache_read_tokens,
            c.cache_write_tokens,
            c.runs
        );
    };
    for d in &r.repos {
        row("repo-day", &d.repo, &d.day, "", "", &d.cost);
    }
    for p in &r.prs {
        row("pr", &p.repo, "", &p.number.to_string(), "", &p.cost);
    }
    for p in &r.issues {
        row("issue", &p.repo, "", &p.number.to_string(), "", &p.cost);
    }
    for g in &r.kinds {
        row("kind", &g.repo, "", "", &g.group, &g.cost);
    }
    for g in &r.tiers {
        row("tier", &g.repo, "", "", &g.group, &g.cost);
    }
    row(
        "total",
        r.repo.as_deref().unwrap_or(""),
        "",
        "",
        "",
        &r.total,
    );
    out
}

/// Micro-dollars as dollars with six decimals, exactly (no float rounding).
pub fn dollars(micros: u64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// The report as text: one table per section.
pub fn render_text(r: &CostsReport) -> String {
    let mut out = format!("costs from {} to {} (UTC)", r.from, r.to);
    if let Some(repo) = &r.repo {
        let _ = write!(out, ", {repo}");
    }
    out.push('\n');
    let line = |out: &mut String, label: String, c: &Cost| {
        let _ = writeln!(
            out,
            "  {label:<44} ${:>12}  {:>10} in  {:>9} out  {:>4} runs",
            dollars(c.usd_micros),
            c.input_tokens,
            c.output_tokens,
            c.runs
        );
    };
    out.push_str("per repository and day:\n");
    for d in &r.repos {
        line(&mut out, format!("{}  {}", d.day, d.repo), &d.cost);
    }
    out.push_str("top PRs by cost (lifetime):\n");
    for p in &r.prs {
        line(&mut out, format!("{}#{}", p.repo, p.number), &p.cost);
    }
    if !r.issues.is_empty() {
        out.push_str("issues (issue-impl) by cost (lifetime):\n");
        for p in &r.issues {
            line(&mut out, format!("{}#{}", p.repo, p.number), &p.cost);
        }
    }
    out.push_str("by work kind:\n");
    for g in &r.kinds {
        line(&mut out, format!("{}  {}", g.repo, g.group), &g.cost);
    }
    out.push_str("by tier:\n");
    for g in &r.tiers {
        line(&mut out, format!("{}  tier {}", g.repo, g.group), &g.cost);
    }
    line(&mut out, "total".into(), &r.total);
    out
}

/// What a repository's own caps (`budget_repo_daily_*`, `budget_repo_monthly_*`) leave
/// of its budget: the tightest of them. Negative when spending went past a cap (a run
/// can overshoot by its last step).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetLeft {
    /// Micro-dollars left under the tightest dollar cap, when one is set.
    pub usd_micros: Option<i64>,
    /// That cap: `repo-daily` or `repo-monthly`.
    pub usd_scope: Option<String>,
    /// Input + output tokens left under the tightest token cap, when one is set.
    pub tokens: Option<i64>,
    /// That cap: `repo-daily` or `repo-monthly`.
    pub tokens_scope: Option<String>,
}

/// The tightest of `caps` (`(scope, cap, spent)`, a cap of 0 is none): what is left
/// and which cap.
fn tightest(caps: [(&str, u64, u64); 2]) -> (Option<i64>, Option<String>) {
    caps.iter()
        .filter(|(_, cap, _)| *cap > 0)
        .map(|(scope, cap, spent)| {
            let left = i128::from(*cap) - i128::from(*spent);
            (
                i64::try_from(left).unwrap_or(if left < 0 { i64::MIN } else { i64::MAX }),
                (*scope).to_owned(),
            )
        })
        .min_by_key(|(left, _)| *left)
        .map_or((None, None), |(left, scope)| (Some(left), Some(scope)))
}

/// What the repository caps of `policy` leave after `today` and `month`; `None` when
/// no repository cap is set. Only the repository's own caps: the organisation's and
/// the instance's, and the rule that the tightest cap of all decides before a
/// dispatch, are `core::budget`'s (issue 28, item 3).
pub fn repo_budget_left(policy: &Policy, today: &Figures, month: &Figures) -> Option<BudgetLeft> {
    let (usd_micros, usd_scope) = tightest([
        (
            "repo-daily",
            usd_to_micros(policy.budget_repo_daily_usd),
            today.usd_micros,
        ),
        (
            "repo-monthly",
            usd_to_micros(policy.budget_repo_monthly_usd),
            month.usd_micros,
        ),
    ]);
    let (tokens, tokens_scope) = tightest([
        (
            "repo-daily",
            policy.budget_repo_daily_tokens,
            today.budget_tokens(),
        ),
        (
            "repo-monthly",
            policy.budget_repo_monthly_tokens,
            month.budget_tokens(),
        ),
    ]);
    (usd_scope.is_some() || tokens_scope.is_some()).then_some(BudgetLeft {
        usd_micros,
        usd_scope,
        tokens,
        tokens_scope,
    })
}

/// One repository's agent spending, for the status page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepoSpend {
    /// Repository.
    pub repo: String,
    /// Today (UTC).
    pub today: Cost,
    /// This month (UTC).
    pub month: Cost,
    /// What its own caps leave, when it has any.
    pub budget_left: Option<BudgetLeft>,
}

/// One open PR's cost so far, for the status page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrSpend {
    /// Repository.
    pub repo: String,
    /// PR number.
    pub number: u64,
    /// Title.
    pub title: String,
    /// Phase.
    pub phase: String,
    /// Lifetime figures.
    pub cost: Cost,
}

/// The open PRs the status page lists by cost.
pub const EXPENSIVE_PRS_SHOWN: usize = 10;

/// The status page's spending figures: per known repository (with spending this month
/// or a cap) today, this month and the budget left; and the most expensive of the
/// open PRs `open`.
pub async fn spend_overview(
    ops: &Ops,
    repos: &[RepoName],
    open: &[PrSummary],
    now_ms: i64,
) -> Result<(Vec<RepoSpend>, Vec<PrSpend>), OpsError> {
    let mut conn = ops.conn();
    let mut out = Vec::new();
    for repo in repos {
        let scope = Scope::Repo(repo.clone());
        let today = ledger::figures(&mut conn, &ops.keys, &scope, Window::Day, now_ms).await?;
        let month = ledger::figures(&mut conn, &ops.keys, &scope, Window::Month, now_ms).await?;
        let budget_left = repo_budget_left(&ops.policy.for_repo(repo), &today, &month);
        if month.runs > 0 || budget_left.is_some() {
            out.push(RepoSpend {
                repo: repo.to_string(),
                today: today.into(),
                month: month.into(),
                budget_left,
            });
        }
    }
    let named: Vec<(RepoName, u64)> = open
        .iter()
        .filter_map(|p| Some((p.repo.parse().ok()?, p.number)))
        .collect();
    let figures = ledger::subject_figures(&mut conn, &ops.keys, false, &named).await?;
    let mut prs: Vec<PrSpend> = open
        .iter()
        .zip(figures)
        .filter(|(_, f)| f.runs > 0)
        .map(|(p, f)| PrSpend {
            repo: p.repo.clone(),
            number: p.number,
            title: p.title.clone(),
            phase: p.phase.clone(),
            cost: f.into(),
        })
        .collect();
    prs.sort_by_key(|p| std::cmp::Reverse(p.cost.usd_micros));
    prs.truncate(EXPENSIVE_PRS_SHOWN);
    Ok((out, prs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    #[test]
    fn ranges_default_to_a_week_and_are_bounded() {
        let today = day("2001-03-02");
        let r = day_range(&CostsRequest::default(), today).unwrap();
        assert_eq!(r, (day("2001-02-24"), today));
        let one = CostsRequest {
            days: Some(1),
            ..CostsRequest::default()
        };
        assert_eq!(day_range(&one, today).unwrap(), (today, today));
        let explicit = CostsRequest {
            from: Some("2001-01-01".into()),
            to: Some("2001-01-31".into()),
            ..CostsRequest::default()
        };
        assert_eq!(
            day_range(&explicit, today).unwrap(),
            (day("2001-01-01"), day("2001-01-31"))
        );
        for bad in [
            CostsRequest {
                days: Some(0),
                ..CostsRequest::default()
            },
            CostsRequest {
                days: Some(MAX_DAYS + 1),
                ..CostsRequest::default()
            },
            CostsRequest {
                from: Some("2001-02-01".into()),
                to: Some("2001-01-01".into()),
                ..CostsRequest::default()
            },
            CostsRequest {
                from: Some("yesterday".into()),
                ..CostsRequest::default()
            },
        ] {
            assert!(
                matches!(day_range(&bad, today), Err(OpsError::BadRequest(_))),
                "{bad:?}"
            );
        }
        let longest = CostsRequest {
            days: Some(MAX_DAYS),
            ..CostsRequest::default()
        };
        assert!(day_range(&longest, today).is_ok());
    }

    #[test]
    fn budget_left_is_the_tightest_repository_cap() {
        let mut policy = Policy::default();
        let spent = |usd_micros, tokens| Figures {
            usd_micros,
            input_tokens: tokens,
            ..Figures::default()
        };
        assert_eq!(
            repo_budget_left(&policy, &spent(5, 5), &spent(9, 9)),
            None,
            "no cap, no budget line"
        );
        policy.budget_repo_daily_usd = 2.0;
        policy.budget_repo_monthly_usd = 10.0;
        policy.budget_repo_monthly_tokens = 1_000;
        // Today 1.5 of 2 spent; this month 9.8 of 10: the monthly cap is tighter.
        let left =
            repo_budget_left(&policy, &spent(1_500_000, 100), &spent(9_800_000, 400)).unwrap();
        assert_eq!(left.usd_micros, Some(200_000));
        assert_eq!(left.usd_scope.as_deref(), Some("repo-monthly"));
        assert_eq!(left.tokens, Some(600));
        assert_eq!(left.tokens_scope.as_deref(), Some("repo-monthly"));
        // Past the daily cap: negative, the daily cap named.
        let over = repo_budget_left(&policy, &spent(2_100_000, 0), &spent(3_000_000, 0)).unwrap();
        assert_eq!(over.usd_micros, Some(-100_000));
        assert_eq!(over.usd_scope.as_deref(), Some("repo-daily"));
    }

    #[test]
    fn dollars_are_exact_and_csv_has_one_row_per_figure() {
        assert_eq!(dollars(1_234_567), "1.234567");
        assert_eq!(dollars(7), "0.000007");
        let c = Cost::from(Figures {
            usd_micros: 1_500,
            input_tokens: 10,
            output_tokens: 2,
            runs: 1,
            ..Figures::default()
        });
        let r = CostsReport {
            from: "2001-01-01".into(),
            to: "2001-01-01".into(),
            repo: None,
            repos: vec![RepoDay {
                repo: "a/b".into(),
                day: "2001-01-01".into(),
                cost: c,
            }],
            prs: vec![SubjectCost {
                repo: "a/b".into(),
                number: 3,
                cost: c,
            }],
            issues: Vec::new(),
            kinds: Vec::new(),
            tiers: Vec::new(),
            total: c,
        };
        let csv = render_csv(&r);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(lines[1], "repo-day,a/b,2001-01-01,,,0.001500,10,2,0,0,0,1");
        assert_eq!(lines[2], "pr,a/b,,3,,0.001500,10,2,0,0,0,1");
        assert_eq!(lines.len(), 4);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["prs"][0]["usd"], 0.0015);
        assert_eq!(json["repos"][0]["input_tokens"], 10);
        assert!(render_text(&r).contains("a/b#3"));
    }
}
