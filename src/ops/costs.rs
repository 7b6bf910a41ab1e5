//! `shepherd costs` and `GET /api/v1/admin/costs` (issue 28): what the agents cost,
//! read from the ledger (`store::ledger`) — per repository per UTC day, the PRs (and
//! issues) with runs in the range by lifetime cost, and per repository by work kind
//! and tier. A request names a day range (default: the last 7 days, today included)
//! and optionally one repository; the report renders as text, CSV or JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{Days, NaiveDate};
use serde::{Deserialize, Serialize};

use super::{Ops, OpsError, parse_repo};
use crate::core::ids::RepoName;
use crate::core::usage::micros_to_usd;
use crate::store::ledger::{self, Bucket, Figures};

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

/// Summed usage as reported: dollars for reading, micro-dollars exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// Cost in US dollars.
    pub usd: f64,
    /// Cost in micro-dollars (exact).
    pub usd_micros: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Reasoning tokens.
    pub reasoning_tokens: u64,
    /// Cache-read tokens.
    pub cache_read_tokens: u64,
    /// Cache-write tokens.
    pub cache_write_tokens: u64,
    /// Runs.
    pub runs: u64,
}

impl From<Figures> for Cost {
    fn from(f: Figures) -> Self {
        Self {
            usd: micros_to_usd(f.usd_micros),
            usd_micros: f.usd_micros,
            input_tokens: f.input_tokens,
            output_tokens: f.output_tokens,
            reasoning_tokens: f.reasoning_tokens,
            cache_read_tokens: f.cache_read_tokens,
            cache_write_tokens: f.cache_write_tokens,
            runs: f.runs,
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
    row("total", r.repo.as_deref().unwrap_or(""), "", "", "", &r.total);
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
