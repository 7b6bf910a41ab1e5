//! The cost ledger (issue 28): every agent run's usage added, once per work id, to
//! counters per PR or issue (lifetime), and per UTC day and month for the repository,
//! its owner (organisation), the instance, the PR, and the repository's work kinds and
//! tiers; plus the runs started in the last hour per repository (`max_runs_per_hour`).
//!
//! Keys (all under the one hash tag `{<prefix>:ledger}`, so the recording script touches
//! one Redis Cluster slot; docs/architecture.md's key table):
//!
//! - `…:pr:<repo>#<n>` / `…:issue:<repo>#<n>`: hash of the record's lifetime figures
//!   (fields [`METRICS`]) and one field `run:<work id>` per counted run (its
//!   [`RunEntry`] JSON) — the marker that makes recording idempotent, and `inspect`'s
//!   list of runs with their usage;
//! - `…:d:<YYYY-MM-DD>` / `…:m:<YYYY-MM>`: hash of the day's (month's) figures, field
//!   `<bucket>|<metric>` ([`Bucket`]): one `HGETALL` reads a whole day for `costs`;
//! - `…:starts:<repo>`: sorted set of the work ids started in the last hour (score: the
//!   start, unix ms).
//!
//! Every counter key expires [`LEDGER_TTL_SECS`] (13 months) after its last write.
//! Money is micro-dollars (integers: sums are exact).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use chrono::{DateTime, NaiveDate, Utc};
use redis::Script;
use serde::{Deserialize, Serialize};
use tracing::instrument;

use super::{Conn, Keys, StoreError};
use crate::core::ids::RepoName;
use crate::core::usage::Usage;

/// How long a counter outlives its last write: 13 months (of 31 days), so a month's
/// figures stay readable for a year after it ended.
pub const LEDGER_TTL_SECS: u64 = 13 * 31 * 86_400;
/// The window of `max_runs_per_hour`, in milliseconds.
const HOUR_MS: i64 = 3_600_000;

/// The metrics counted per bucket, as the hashes name them: cost in micro-dollars,
/// input, output, reasoning, cache-read and cache-write tokens, runs.
pub const METRICS: [&str; 7] = ["usd", "in", "out", "rsn", "crd", "cwr", "runs"];

/// The recording script.
static RECORD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/ledger_record.lua")));

/// Summed usage of one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    /// Cost in micro-dollars.
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
    /// Runs counted.
    pub runs: u64,
}

impl Figures {
    /// The figures of one run.
    pub fn of_usage(u: &Usage) -> Self {
        Self {
            usd_micros: u.cost_micros,
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            reasoning_tokens: u.reasoning_tokens,
            cache_read_tokens: u.cache_read_tokens,
            cache_write_tokens: u.cache_write_tokens,
            runs: 1,
        }
    }

    /// Adds `other` (saturating).
    pub fn add(&mut self, other: &Figures) {
        for (mine, theirs) in self.slots_mut().into_iter().zip(other.values()) {
            *mine = mine.saturating_add(theirs);
        }
    }

    /// The values in the order of [`METRICS`].
    fn values(&self) -> [u64; 7] {
        [
            self.usd_micros,
            self.input_tokens,
            self.output_tokens,
            self.reasoning_tokens,
            self.cache_read_tokens,
            self.cache_write_tokens,
            self.runs,
        ]
    }

    /// Mutable slots in the order of [`METRICS`].
    fn slots_mut(&mut self) -> [&mut u64; 7] {
        [
            &mut self.usd_micros,
            &mut self.input_tokens,
            &mut self.output_tokens,
            &mut self.reasoning_tokens,
            &mut self.cache_read_tokens,
            &mut self.cache_write_tokens,
            &mut self.runs,
        ]
    }

    /// Sets the metric named `name` (one of [`METRICS`]); unknown names are ignored.
    fn set(&mut self, name: &str, value: u64) {
        if let Some(i) = METRICS.iter().position(|m| *m == name) {
            *self.slots_mut()[i] = value;
        }
    }

    /// The tokens a `_tokens` budget counts: input + output.
    pub fn budget_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// What a budget check needs of a scope: cost, budget tokens (input + output), runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    /// Cost in micro-dollars.
    pub usd_micros: u64,
    /// Input + output tokens.
    pub tokens: u64,
    /// Runs counted.
    pub runs: u64,
}

impl From<Figures> for Spent {
    fn from(f: Figures) -> Self {
        Self {
            usd_micros: f.usd_micros,
            tokens: f.budget_tokens(),
            runs: f.runs,
        }
    }
}

/// What a budget is counted over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// One pull request.
    Pr {
        /// Repository.
        repo: RepoName,
        /// PR number.
        number: u64,
    },
    /// One issue (its `issue-impl` runs).
    Issue {
        /// Repository.
        repo: RepoName,
        /// Issue number.
        number: u64,
    },
    /// One repository.
    Repo(RepoName),
    /// Every repository of one owner (user or organisation), lower-case.
    Org(String),
    /// The whole instance.
    Instance,
}

/// The time a figure covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Since the first run (kept for PRs and issues only).
    Lifetime,
    /// The UTC day of `now`.
    Day,
    /// The UTC month of `now`.
    Month,
}

/// A bucket of the day and month hashes: what their field `<bucket>|<metric>` counts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bucket {
    /// The instance (`i`).
    Instance,
    /// An owner (`o:<owner>`).
    Org(String),
    /// A repository (`r:<repo>`).
    Repo(String),
    /// A repository's work kind (`k:<repo>:<kind>`).
    Kind(String, String),
    /// A repository's tier (`t:<repo>:<tier>`).
    Tier(String, u8),
    /// A PR (`p:<repo>#<n>`).
    Pr(String, u64),
    /// An issue (`q:<repo>#<n>`).
    Issue(String, u64),
}

impl Bucket {
    /// The bucket's name in a hash field.
    pub fn id(&self) -> String {
        match self {
            Bucket::Instance => "i".into(),
            Bucket::Org(o) => format!("o:{o}"),
            Bucket::Repo(r) => format!("r:{r}"),
            Bucket::Kind(r, k) => format!("k:{r}:{k}"),
            Bucket::Tier(r, t) => format!("t:{r}:{t}"),
            Bucket::Pr(r, n) => format!("p:{r}#{n}"),
            Bucket::Issue(r, n) => format!("q:{r}#{n}"),
        }
    }

    /// Reads a bucket name back (`None` for a name this version does not write).
    pub fn parse(id: &str) -> Option<Self> {
        if id == "i" {
            return Some(Bucket::Instance);
        }
        let (tag, rest) = id.split_once(':')?;
        let numbered = |rest: &str| -> Option<(String, u64)> {
            let (r, n) = rest.rsplit_once('#')?;
            Some((r.to_owned(), n.parse().ok()?))
        };
        Some(match tag {
            "o" => Bucket::Org(rest.to_owned()),
            "r" => Bucket::Repo(rest.to_owned()),
            "k" => {
                let (r, k) = rest.rsplit_once(':')?;
                Bucket::Kind(r.to_owned(), k.to_owned())
            }
            "t" => {
                let (r, t) = rest.rsplit_once(':')?;
                Bucket::Tier(r.to_owned(), t.parse().ok()?)
            }
            "p" => numbered(rest).map(|(r, n)| Bucket::Pr(r, n))?,
            "q" => numbered(rest).map(|(r, n)| Bucket::Issue(r, n))?,
            _ => return None,
        })
    }
}

/// One counted run, as kept in its PR's (issue's) ledger hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEntry {
    /// Work id.
    pub work_id: String,
    /// Repository.
    pub repo: RepoName,
    /// PR or issue number.
    pub number: u64,
    /// True for an issue's run (`issue-impl`).
    #[serde(default)]
    pub issue: bool,
    /// Work kind (`ci-fix`, …; `unknown` when the record no longer said).
    pub kind: String,
    /// Tier the run used (0 when the record no longer said).
    pub tier: u8,
    /// When it was counted (unix ms): its day and month.
    pub at_ms: i64,
    /// Its outcome as reported (`succeeded`, `failed`, …).
    #[serde(default)]
    pub outcome: String,
    /// What it consumed.
    pub usage: Usage,
}

/// The UTC day of `ms` as the ledger names it (`YYYY-MM-DD`).
pub fn day_of(ms: i64) -> NaiveDate {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .date_naive()
}

/// `{<prefix>:ledger}`: the one hash tag of every ledger key.
fn tag(keys: &Keys) -> String {
    format!("{{{}:ledger}}", keys.prefix())
}

/// The ledger hash of a PR or an issue.
fn subject_key(keys: &Keys, issue: bool, repo: &RepoName, number: u64) -> String {
    let scope = if issue { "issue" } else { "pr" };
    format!("{}:{scope}:{repo}#{number}", tag(keys))
}

/// The hash of one UTC day.
pub fn day_key(keys: &Keys, day: NaiveDate) -> String {
    format!("{}:d:{}", tag(keys), day.format("%Y-%m-%d"))
}

/// The hash of the UTC month of `day`.
pub fn month_key(keys: &Keys, day: NaiveDate) -> String {
    format!("{}:m:{}", tag(keys), day.format("%Y-%m"))
}

/// The sorted set of a repository's runs started in the last hour.
fn starts_key(keys: &Keys, repo: &RepoName) -> String {
    format!("{}:starts:{repo}", tag(keys))
}

/// The buckets a run counts under in the day and month hashes.
fn buckets_of(run: &RunEntry) -> Vec<Bucket> {
    let repo = run.repo.as_str().to_owned();
    vec![
        Bucket::Instance,
        Bucket::Org(run.repo.owner().to_owned()),
        Bucket::Repo(repo.clone()),
        Bucket::Kind(repo.clone(), run.kind.clone()),
        Bucket::Tier(repo.clone(), run.tier),
        if run.issue {
            Bucket::Issue(repo, run.number)
        } else {
            Bucket::Pr(repo, run.number)
        },
    ]
}

/// Counts `run` unless its work id was counted already (then nothing changes): true
/// when it was counted now. One script call, one slot.
#[instrument(skip_all, fields(work_id = %run.work_id))]
pub async fn record(conn: &mut Conn, keys: &Keys, run: &RunEntry) -> Result<bool, StoreError> {
    let day = day_of(run.at_ms);
    let json = serde_json::to_string(run).map_err(|e| StoreError::Protocol {
        script: "ledger_record",
        reply: format!("cannot encode the run: {e}"),
    })?;
    let buckets = buckets_of(run);
    let mut inv = RECORD.prepare_invoke();
    inv.key(subject_key(keys, run.issue, &run.repo, run.number))
        .key(day_key(keys, day))
        .key(month_key(keys, day))
        .arg(format!("run:{}", run.work_id))
        .arg(json)
        .arg(LEDGER_TTL_SECS)
        .arg(buckets.len());
    for b in &buckets {
        inv.arg(b.id());
    }
    for v in Figures::of_usage(&run.usage).values() {
        // HINCRBY takes a signed 64-bit integer.
        inv.arg(v.min(i64::MAX as u64));
    }
    let counted: i64 = inv.invoke_async(conn).await?;
    Ok(counted == 1)
}

/// The bucket of the day and month hashes a scope is counted in.
fn bucket_of(scope: &Scope) -> Bucket {
    match scope {
        Scope::Pr { repo, number } => Bucket::Pr(repo.as_str().to_owned(), *number),
        Scope::Issue { repo, number } => Bucket::Issue(repo.as_str().to_owned(), *number),
        Scope::Repo(r) => Bucket::Repo(r.as_str().to_owned()),
        Scope::Org(o) => Bucket::Org(o.to_lowercase()),
        Scope::Instance => Bucket::Instance,
    }
}

/// The figures of `scope` over `window` (the day or month of `now_ms`, UTC).
/// `Lifetime` is kept for PRs and issues only: asked of another scope it is a
/// `Protocol` error, never a silent zero.
pub async fn figures(
    conn: &mut Conn,
    keys: &Keys,
    scope: &Scope,
    window: Window,
    now_ms: i64,
) -> Result<Figures, StoreError> {
    let day = day_of(now_ms);
    let (key, prefix) = match (window, scope) {
        (Window::Lifetime, Scope::Pr { repo, number }) => {
            (subject_key(keys, false, repo, *number), String::new())
        }
        (Window::Lifetime, Scope::Issue { repo, number }) => {
            (subject_key(keys, true, repo, *number), String::new())
        }
        (Window::Lifetime, _) => {
            return Err(StoreError::Protocol {
                script: "ledger",
                reply: format!("no lifetime figures are kept for {scope:?}"),
            });
        }
        (Window::Day, s) => (day_key(keys, day), format!("{}|", bucket_of(s).id())),
        (Window::Month, s) => (month_key(keys, day), format!("{}|", bucket_of(s).id())),
    };
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(&key);
    for m in METRICS {
        cmd.arg(format!("{prefix}{m}"));
    }
    let values: Vec<Option<u64>> = cmd.query_async(conn).await?;
    let mut f = Figures::default();
    for (m, v) in METRICS.iter().zip(values) {
        f.set(m, v.unwrap_or(0));
    }
    Ok(f)
}

/// What `scope` spent over `window` (see [`figures`]): the budget helper's read.
pub async fn spent(
    conn: &mut Conn,
    keys: &Keys,
    scope: &Scope,
    window: Window,
    now_ms: i64,
) -> Result<Spent, StoreError> {
    Ok(figures(conn, keys, scope, window, now_ms).await?.into())
}

/// Every bucket's figures of one day hash (`day_key`) or month hash (`month_key`).
pub async fn buckets(conn: &mut Conn, key: &str) -> Result<BTreeMap<Bucket, Figures>, StoreError> {
    let all: Vec<(String, u64)> = redis::cmd("HGETALL").arg(key).query_async(conn).await?;
    let mut out: BTreeMap<Bucket, Figures> = BTreeMap::new();
    for (field, value) in all {
        let Some((id, metric)) = field.rsplit_once('|') else {
            continue;
        };
        let Some(bucket) = Bucket::parse(id) else {
            continue;
        };
        out.entry(bucket).or_default().set(metric, value);
    }
    Ok(out)
}

/// The lifetime figures and the counted runs (oldest first) of a PR or issue.
pub async fn subject(
    conn: &mut Conn,
    keys: &Keys,
    issue: bool,
    repo: &RepoName,
    number: u64,
) -> Result<(Figures, Vec<RunEntry>), StoreError> {
    let key = subject_key(keys, issue, repo, number);
    let all: Vec<(String, String)> = redis::cmd("HGETALL").arg(&key).query_async(conn).await?;
    let mut f = Figures::default();
    let mut runs = Vec::new();
    for (field, value) in all {
        if field.starts_with("run:") {
            let run: RunEntry = serde_json::from_str(&value).map_err(|e| StoreError::Corrupt {
                key: key.clone(),
                reason: format!("{field}: {e}"),
            })?;
            runs.push(run);
        } else if let Ok(v) = value.parse() {
            f.set(&field, v);
        }
    }
    runs.sort_by(|a, b| (a.at_ms, &a.work_id).cmp(&(b.at_ms, &b.work_id)));
    Ok((f, runs))
}

/// The lifetime figures of several PRs (or issues) (one pipeline on the ledger's
/// slot), in the order asked; absent ones read as zero.
pub async fn subject_figures(
    conn: &mut Conn,
    keys: &Keys,
    issue: bool,
    subjects: &[(RepoName, u64)],
) -> Result<Vec<Figures>, StoreError> {
    let mut pipe = redis::pipe();
    for (repo, number) in subjects {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(subject_key(keys, issue, repo, *number));
        for m in METRICS {
            cmd.arg(m);
        }
        pipe.add_command(cmd);
    }
    let replies: Vec<Vec<Option<u64>>> = super::client::query_pipeline(conn, &pipe).await?;
    Ok(replies
        .into_iter()
        .map(|values| {
            let mut f = Figures::default();
            for (m, v) in METRICS.iter().zip(values) {
                f.set(m, v.unwrap_or(0));
            }
            f
        })
        .collect())
}

/// Notes that `work_id` of `repo` started at `now_ms` (for `max_runs_per_hour`); a
/// second note of the same work id (a redelivered dispatch) keeps the first time.
pub async fn note_start(
    conn: &mut Conn,
    keys: &Keys,
    repo: &RepoName,
    work_id: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    let key = starts_key(keys, repo);
    let mut pipe = redis::pipe();
    pipe.cmd("ZADD")
        .arg(&key)
        .arg("NX")
        .arg(now_ms)
        .arg(work_id);
    // Older starts no longer count: trimmed here, so the set holds one hour's runs.
    pipe.cmd("ZREMRANGEBYSCORE")
        .arg(&key)
        .arg("-inf")
        .arg(format!("({}", now_ms - HOUR_MS));
    pipe.cmd("EXPIRE").arg(&key).arg(2 * HOUR_MS / 1000);
    let _: Vec<redis::Value> = super::client::query_pipeline(conn, &pipe).await?;
    Ok(())
}

/// Runs of `repo` started within the hour before `now_ms`.
pub async fn runs_last_hour(
    conn: &mut Conn,
    keys: &Keys,
    repo: &RepoName,
    now_ms: i64,
) -> Result<u64, StoreError> {
    Ok(redis::cmd("ZCOUNT")
        .arg(starts_key(keys, repo))
        .arg(format!("({}", now_ms - HOUR_MS))
        .arg("+inf")
        .query_async(conn)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names_round_trip() {
        for b in [
            Bucket::Instance,
            Bucket::Org("acme".into()),
            Bucket::Repo("acme/widgets".into()),
            Bucket::Kind("acme/widgets".into(), "ci-fix".into()),
            Bucket::Tier("acme/widgets".into(), 2),
            Bucket::Pr("acme/widgets".into(), 12),
            Bucket::Issue("acme/my.repo-x".into(), 7),
        ] {
            assert_eq!(Bucket::parse(&b.id()), Some(b.clone()), "{}", b.id());
        }
        assert_eq!(Bucket::parse("x:y"), None);
        assert_eq!(Bucket::parse("p:acme/widgets#x"), None);
        assert_eq!(Bucket::parse("t:acme/widgets:high"), None);
    }

    #[test]
    fn figures_add_and_read_metrics_by_name() {
        let u = Usage {
            input_tokens: 10,
            output_tokens: 4,
            cache_read_tokens: 3,
            cost_micros: 250,
            ..Usage::default()
        };
        let mut f = Figures::of_usage(&u);
        f.add(&Figures::of_usage(&u));
        assert_eq!(f.usd_micros, 500);
        assert_eq!(f.runs, 2);
        assert_eq!(f.budget_tokens(), 28);
        assert_eq!(Spent::from(f).tokens, 28);
        f.set("rsn", 9);
        f.set("nonsense", 1);
        assert_eq!(f.reasoning_tokens, 9);
        assert_eq!(f.cache_read_tokens, 6);
    }

    #[test]
    fn days_are_utc() {
        // 2001-02-03T23:59:59.999Z and one millisecond later.
        let ms = 981_244_799_999;
        assert_eq!(day_of(ms).to_string(), "2001-02-03");
        assert_eq!(day_of(ms + 1).to_string(), "2001-02-04");
        let keys = Keys::new("p", 4);
        assert_eq!(day_key(&keys, day_of(ms)), "{p:ledger}:d:2001-02-03");
        assert_eq!(month_key(&keys, day_of(ms)), "{p:ledger}:m:2001-02");
    }
}
