//! Resync (DESIGN §5): Forgejo never retries a failed delivery (forgejo-facts §1.5), so
//! Shepherd reconciles by reading the truth from the API and feeding it in as
//! observations through the normal path. `shepherd resync` (`crate::ops::resync`)
//! runs it on demand; every `SHEPHERD_RESYNC_INTERVAL_SECS` one worker runs it for
//! every known repository ([`run_periodic_resync`]).
//!
//! Per repository: one listing of every open PR (`state=open`, all pages). The list
//! already carries each PR's head sha, `updated_at`, mergeability, labels, title and
//! draft state, so a *changed-only* pass reads more only for PRs where something may
//! have changed since the record last saw them ([`decide`]): a PR the record does not
//! know, a new head, a newer `updated_at` (reviews, comments, labels, edits and pushes
//! move it; docs/worker.md lists what does and does not), a listed field that differs
//! from the record's snapshot, CI not settled on the head, or a merge in flight. Those
//! PRs get their head's combined status and their reviews read and become one internal
//! `ResyncObserved` event; every other PR costs nothing but its share of the list page.
//! A *full* pass (`SHEPHERD_RESYNC_FULL_INTERVAL_SECS`, default daily, and every
//! `shepherd resync`) reads every open PR as before, which catches what the list cannot
//! show (a review dismissed in the same second as the last read, a commit status an
//! external CI wrote without any Forgejo event). Every PR that Shepherd still holds
//! open but the API no longer lists (closed or merged during an outage) is read alone
//! and becomes an `ObservedPr` event. The events go onto the
//! repository's events stream, so workers apply them with `core::step` like any
//! other event (older observations never overwrite newer facts). The time of the last
//! completed resync is kept at `Keys::last_resync`.
//!
//! Which periodic pass is full: the first one after each multiple of the full interval
//! since the Unix epoch (by `Keys::last_resync`, the time the previous pass ended), so
//! the fleet agrees without another key and a restart does not reset the clock.
//!
//! One worker at a time: a worker resyncs only after taking `Keys::resync_lock()` with
//! `SET NX PX <interval>`. The lock is not released after the run — it expires — so
//! however many workers run, the fleet resyncs once per interval; if the holder dies,
//! the lock expires and another worker takes the next turn.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::store::Conn;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::instrument;

use crate::config::Config;
use crate::core::event::{Event, PrSnapshot};
use crate::core::ids::RepoName;
use crate::core::machine::{CiView, ci_view};
use crate::core::normalize;
use crate::core::payload;
use crate::core::policy::{Policy, PolicyFile};
use crate::core::record::{MergeState, PrRecord};
use crate::forgejo::{Cause, ForgejoClient};
use crate::forgejo::{CombinedStatus, PullRequest};
use crate::store::event_entry::{self, EventEntry};
use crate::store::{Keys, StoreError, commit, markers, repos};
use crate::telemetry::Metrics;

/// What a resync works with: a Redis connection (its own, since the reads and
/// appends of a whole pass should not queue behind anything) and the key layout.
#[derive(Clone)]
pub struct Resync {
    /// Shared, self-reconnecting Redis connection.
    pub conn: Conn,
    /// Redis key layout.
    pub keys: Keys,
    /// The policy file: which CI contexts are required, for the change detection.
    pub policy: Arc<PolicyFile>,
}

/// Wall-clock unix ms (observation times).
fn now_ms() -> i64 {
    i64::try_from(crate::store::streams::now_ms()).unwrap_or(i64::MAX)
}

/// What a resync queued.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ResyncReport {
    /// Per repository.
    pub repos: Vec<RepoResync>,
    /// When it finished (unix ms).
    pub finished_ms: i64,
}

/// One repository's resync.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RepoResync {
    /// Repository.
    pub repo: String,
    /// Open PRs listed by the API.
    pub open_prs: Vec<u64>,
    /// Open PRs whose status and reviews were read (all of them in a full pass).
    #[serde(default)]
    pub read: Vec<u64>,
    /// Whether this was a full pass.
    #[serde(default)]
    pub full: bool,
    /// PRs open in Shepherd's records but not in the API's list (re-read one by one).
    pub no_longer_open: Vec<u64>,
    /// Events queued.
    pub queued: usize,
    /// Failures (the rest of the repository was still resynced).
    pub errors: Vec<String>,
}

/// How much a pass reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// Every open PR's combined status and reviews.
    Full,
    /// Only for PRs where something may have changed ([`decide`]).
    Changed,
}

/// Why a changed-only pass reads a PR (the `decision` label of
/// `shepherd_resync_prs_total`), or that it does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Nothing may have changed: no read.
    Skip,
    /// A full pass reads every PR.
    Full,
    /// No record of this PR yet.
    Unknown,
    /// The head sha differs from the record's.
    NewHead,
    /// `updated_at` is newer than the record's snapshot, or the last read of the
    /// reviews may predate a change within the same second (`updated_at` has
    /// one-second resolution).
    Updated,
    /// A listed field (mergeable, labels, title, body, draft, state) differs from
    /// the record's snapshot.
    Differs,
    /// The head's CI is pending, has no context yet, or lacks a required context.
    CiUnsettled,
    /// A merge is being verified or is in flight.
    Merging,
}

impl Decision {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Skip => "skipped",
            Decision::Full => "full",
            Decision::Unknown => "unknown",
            Decision::NewHead => "new-head",
            Decision::Updated => "updated",
            Decision::Differs => "differs",
            Decision::CiUnsettled => "ci-unsettled",
            Decision::Merging => "merging",
        }
    }
}

/// Whether a changed-only pass must read the PR listed as `listed`, given its stored
/// record (`None`: no record) and the repository's policy (its required contexts).
/// Pure, so the rule is tested on its own.
pub fn decide(record: Option<&PrRecord>, listed: &PrSnapshot, policy: &Policy) -> Decision {
    let Some(record) = record else {
        return Decision::Unknown;
    };
    let Some(seen) = record.pr.as_ref() else {
        return Decision::Unknown;
    };
    if seen.head_sha != listed.head_sha {
        return Decision::NewHead;
    }
    // The reviews are what `updated_at` stands for here (a review, a dismissal's
    // comment): re-read them unless the last read came after the end of the second
    // `updated_at` names.
    let reviews_read = record.reviews.as_ref().map_or(i64::MIN, |r| r.at_ms);
    if listed.updated_ms > seen.updated_ms || reviews_read < listed.updated_ms + 1000 {
        return Decision::Updated;
    }
    let differs = seen.mergeable != listed.mergeable
        || seen.labels != listed.labels
        || seen.title != listed.title
        || seen.body != listed.body
        || seen.draft != listed.draft
        || seen.state != listed.state;
    if differs {
        return Decision::Differs;
    }
    if !matches!(record.merge, MergeState::Idle | MergeState::Backoff { .. }) {
        return Decision::Merging;
    }
    // The machine's own view of the head's CI (the heads are equal here): pending
    // contexts, and required ones that have not reported yet, are not settled.
    match ci_view(record, policy) {
        CiView::Missing | CiView::Pending(_) => Decision::CiUnsettled,
        CiView::Success | CiView::Failing(_) => Decision::Skip,
    }
}

/// Whether the periodic pass ending the wait after `last_ms` (the previous pass's end,
/// `None` when there was none) is a full one: the first pass after each multiple of
/// `full` since the epoch. A zero interval makes every pass full.
pub fn full_due(last_ms: Option<i64>, now_ms: i64, full: Duration) -> bool {
    let period = i64::try_from(full.as_millis()).unwrap_or(i64::MAX);
    match last_ms {
        _ if period == 0 => true,
        None => true,
        Some(last) => now_ms.div_euclid(period) != last.div_euclid(period),
    }
}

/// Runs the periodic resync until `shutdown`; returns at once when the interval is
/// off or Forgejo is not configured. Failures are logged, never fatal to the worker.
pub async fn run_periodic_resync(
    config: Arc<Config>,
    resync: Resync,
    owner: String,
    metrics: Option<Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Some(interval) = config.resync_interval else {
        return Ok(());
    };
    if config.forgejo_url.is_none() || config.forgejo_token.is_none() {
        // Not a failure: the worker's start line (`app::worker_tasks`) says what is off.
        tracing::debug!("periodic resync off: no Forgejo API configured");
        return Ok(());
    }
    let client = match ForgejoClient::from_config(&config, metrics.clone()) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "periodic resync off: the Forgejo client cannot be made");
            return Ok(());
        }
    };
    // The first turn comes one interval after start: a restarted fleet does not
    // hammer the API, and `shepherd resync --all` is there for right after an outage.
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(interval) => {}
        }
        match take_turn(&resync, &owner, interval).await {
            Ok(false) => tracing::debug!("another worker holds the resync turn"),
            Ok(true) => {
                run_once(
                    &resync,
                    &client,
                    config.resync_full_interval,
                    metrics.as_ref(),
                )
                .await
            }
            Err(e) => tracing::warn!(error = %e, "resync lock: redis failed"),
        }
    }
}

/// One resync of every known repository: full when one is due, else changed-only.
async fn run_once(r: &Resync, client: &ForgejoClient, full: Duration, metrics: Option<&Metrics>) {
    let repos = match known_repos(r).await {
        Ok(r) => r,
        Err(e) => return tracing::warn!(error = %e, "periodic resync: listing repositories failed"),
    };
    let last = match markers::last_resync(&mut r.conn.clone(), &r.keys).await {
        Ok(last) => last,
        Err(e) => return tracing::warn!(error = %e, "periodic resync: redis failed"),
    };
    let sweep = match full_due(last, now_ms(), full) {
        true => Sweep::Full,
        false => Sweep::Changed,
    };
    match resync_repos(r, client, &repos, sweep, metrics).await {
        Ok(report) => {
            let queued: usize = report.repos.iter().map(|r| r.queued).sum();
            let read: usize = report.repos.iter().map(|r| r.read.len()).sum();
            let errors: usize = report.repos.iter().map(|r| r.errors.len()).sum();
            let full = sweep == Sweep::Full;
            tracing::info!(
                repos = repos.len(),
                full,
                read,
                queued,
                errors,
                "periodic resync done"
            );
        }
        Err(e) => tracing::warn!(error = %e, "periodic resync failed"),
    }
}

/// Takes this interval's resync turn (`SET NX PX`); true when it is ours.
async fn take_turn(r: &Resync, owner: &str, interval: Duration) -> Result<bool, StoreError> {
    markers::take_resync_turn(&mut r.conn.clone(), &r.keys, owner, interval).await
}

/// Every repository in `Keys::repos()`.
pub async fn known_repos(r: &Resync) -> Result<Vec<RepoName>, StoreError> {
    let names = repos::known(&mut r.conn.clone(), &r.keys).await?;
    let set: BTreeSet<RepoName> = names.iter().filter_map(|n| n.parse().ok()).collect();
    Ok(set.into_iter().collect())
}

/// Resyncs `repos` with `client` (`sweep` says how much it reads) and records the time.
pub async fn resync_repos(
    r: &Resync,
    client: &ForgejoClient,
    repos: &[RepoName],
    sweep: Sweep,
    metrics: Option<&Metrics>,
) -> Result<ResyncReport, StoreError> {
    let mut report = ResyncReport::default();
    let client = client.with_cause(Cause::Resync);
    for repo in repos {
        report
            .repos
            .push(resync_repo(r, &client, repo, sweep, metrics).await?);
    }
    report.finished_ms = now_ms();
    markers::set_last_resync(&mut r.conn.clone(), &r.keys, report.finished_ms).await?;
    Ok(report)
}

/// One repository. Forgejo failures are reported in the result; Redis failures fail.
#[instrument(skip_all, fields(repo = %repo))]
async fn resync_repo(
    r: &Resync,
    client: &ForgejoClient,
    repo: &RepoName,
    sweep: Sweep,
    metrics: Option<&Metrics>,
) -> Result<RepoResync, StoreError> {
    let mut out = RepoResync {
        repo: repo.to_string(),
        full: sweep == Sweep::Full,
        ..RepoResync::default()
    };
    let pulls = match client.list_open_pulls(repo.as_str()).await {
        Ok(p) => p,
        Err(e) => {
            out.errors.push(format!("listing open PRs: {e}"));
            return Ok(out);
        }
    };
    repos::remember(&mut r.conn.clone(), &r.keys, repo.as_str()).await?;
    // One load serves both the change detection and the search for PRs closed behind
    // Shepherd's back: the records the repository index holds (the open ones; a listed
    // PR without one is read as unknown).
    let records = held(r, repo).await?;
    let policy = r.policy.for_repo(repo);
    for pr in &pulls {
        out.open_prs.push(pr.number);
        let decision = match sweep {
            Sweep::Full => Decision::Full,
            Sweep::Changed => decide(records.get(&pr.number), &snapshot(repo, pr), &policy),
        };
        if let Some(m) = metrics {
            m.resync_prs.with_label_values(&[decision.as_str()]).inc();
        }
        if decision == Decision::Skip {
            continue;
        }
        tracing::debug!(pr = pr.number, decision = decision.as_str(), "resync reads");
        out.read.push(pr.number);
        match observe_open(client, repo, pr).await {
            Ok(event) => {
                queue(r, repo, &event).await?;
                out.queued += 1;
            }
            Err(e) => out.errors.push(format!("#{}: {e}", pr.number)),
        }
    }
    let vanished = records
        .values()
        .filter(|rec| rec.is_open() && !out.open_prs.contains(&rec.number))
        .map(|rec| rec.number)
        .collect::<Vec<u64>>();
    for n in vanished {
        out.no_longer_open.push(n);
        match client.get_pull(repo.as_str(), n).await {
            Ok(pr) => {
                queue(
                    r,
                    repo,
                    &Event::ObservedPr {
                        pr: snapshot(repo, &pr),
                    },
                )
                .await?;
                out.queued += 1;
            }
            Err(e) => out.errors.push(format!("#{n}: {e}")),
        }
    }
    tracing::info!(
        open = out.open_prs.len(),
        queued = out.queued,
        errors = out.errors.len(),
        "resynced"
    );
    Ok(out)
}

/// The observation of one open PR: snapshot, combined status of its head, reviews.
async fn observe_open(
    client: &ForgejoClient,
    repo: &RepoName,
    pr: &PullRequest,
) -> Result<Event, crate::forgejo::ForgejoError> {
    let contexts = if pr.head.sha.is_empty() {
        Vec::new()
    } else {
        contexts(client.combined_status(repo.as_str(), &pr.head.sha).await?)
    };
    let reviews = reviews(client.list_reviews(repo.as_str(), pr.number).await?);
    Ok(Event::ResyncObserved {
        pr: snapshot(repo, pr),
        contexts,
        reviews,
        at_ms: now_ms(),
    })
}

/// The PR records the index of `repo` holds (open, or not yet seen), by number
/// (undecodable ones are left out).
async fn held(r: &Resync, repo: &RepoName) -> Result<BTreeMap<u64, PrRecord>, StoreError> {
    let mut conn = r.conn.clone();
    let keys: Vec<String> = commit::index_members(&mut conn, &r.keys.repo_index(repo.as_str()))
        .await?
        .into_iter()
        .filter(|k| k.contains(":pr:"))
        .collect();
    let loaded = commit::load_many(&mut conn, &keys).await?;
    Ok(loaded
        .into_iter()
        .flatten()
        .filter_map(|s| PrRecord::from_json(&s.data).ok())
        .map(|rec| (rec.number, rec))
        .collect())
}

/// Appends an internal event to the repository's events stream.
async fn queue(r: &Resync, repo: &RepoName, event: &Event) -> Result<String, StoreError> {
    // An `Event` always serializes (plain data, string keys).
    let body = serde_json::to_string(event).unwrap_or_default();
    let (delivery, name) = (format!("resync:{}", uuid::Uuid::new_v4()), event.name());
    let received = u64::try_from(now_ms()).unwrap_or(0);
    let entry = EventEntry::internal(&delivery, &name, repo.as_str(), received, &body);
    let stream = r.keys.events(r.keys.shard_of(repo.as_str()));
    event_entry::append(&mut r.conn.clone(), &stream, &entry).await
}

/// A PR snapshot from the API.
fn snapshot(repo: &RepoName, pr: &PullRequest) -> PrSnapshot {
    normalize::pr_snapshot(repo, &payload::PullRequest::from(pr.clone()))
}

/// CI contexts from a combined status.
fn contexts(c: CombinedStatus) -> Vec<crate::core::event::CiContext> {
    normalize::ci_contexts(&payload::CombinedStatus::from(c))
}

/// Reviews from the API.
fn reviews(rs: Vec<payload::PullReview>) -> Vec<crate::core::event::ReviewFact> {
    rs.iter().filter_map(normalize::review).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::observation::{CiContext, CiState, PrState};
    use crate::core::record::{ReviewFacts, ShaCi};

    const T: i64 = 1_700_000_000_000;

    fn listed(head: &str, updated_ms: i64) -> PrSnapshot {
        PrSnapshot {
            repo: "o/r".parse().unwrap(),
            number: 7,
            state: PrState::Open,
            draft: false,
            title: "Add x".into(),
            body: String::new(),
            author: None,
            head_sha: Some(head.parse().unwrap()),
            head_ref: "feature-7".into(),
            base_ref: "main".into(),
            labels: BTreeSet::new(),
            mergeable: Some(true),
            updated_ms,
            comments: None,
        }
    }

    /// A record that saw `listed("aaaa", T)`, read its reviews at `T + 5 s` and holds CI
    /// `state` on the head.
    fn record(state: CiState) -> PrRecord {
        let mut r = PrRecord::new("o/r".parse().unwrap(), 7);
        r.pr = Some(listed("aaaa", T));
        r.reviews = Some(ReviewFacts {
            at_ms: T + 5_000,
            latest: BTreeMap::new(),
        });
        let ctx = CiContext {
            context: "ci/test".into(),
            state,
            description: String::new(),
            target_url: String::new(),
            updated_ms: T,
        };
        let ci = ShaCi {
            contexts: [("ci/test".to_owned(), ctx)].into(),
            observed_ms: T + 5_000,
        };
        r.ci.insert("aaaa".parse().unwrap(), ci);
        r
    }

    #[test]
    fn an_unchanged_settled_pr_is_skipped() {
        let r = record(CiState::Success);
        assert_eq!(
            decide(Some(&r), &listed("aaaa", T), &Policy::default()),
            Decision::Skip
        );
        let failed = record(CiState::Failure);
        assert_eq!(
            decide(Some(&failed), &listed("aaaa", T), &Policy::default()),
            Decision::Skip
        );
    }

    #[test]
    fn each_kind_of_change_is_read() {
        let r = record(CiState::Success);
        assert_eq!(
            decide(None, &listed("aaaa", T), &Policy::default()),
            Decision::Unknown
        );
        assert_eq!(
            decide(
                Some(&PrRecord::new("o/r".parse().unwrap(), 7)),
                &listed("aaaa", T),
                &Policy::default()
            ),
            Decision::Unknown
        );
        assert_eq!(
            decide(Some(&r), &listed("bbbb", T), &Policy::default()),
            Decision::NewHead
        );
        assert_eq!(
            decide(Some(&r), &listed("aaaa", T + 1_000), &Policy::default()),
            Decision::Updated
        );
        let mut labelled = listed("aaaa", T);
        labelled.labels.insert("auto/claimed-implementer".into());
        assert_eq!(
            decide(Some(&r), &labelled, &Policy::default()),
            Decision::Differs
        );
        let mut conflicted = listed("aaaa", T);
        conflicted.mergeable = Some(false);
        assert_eq!(
            decide(Some(&r), &conflicted, &Policy::default()),
            Decision::Differs
        );
        let mut wip = listed("aaaa", T);
        wip.draft = true;
        assert_eq!(
            decide(Some(&r), &wip, &Policy::default()),
            Decision::Differs
        );
        let pending = record(CiState::Pending);
        assert_eq!(
            decide(Some(&pending), &listed("aaaa", T), &Policy::default()),
            Decision::CiUnsettled
        );
        let mut none = record(CiState::Success);
        none.ci.clear();
        assert_eq!(
            decide(Some(&none), &listed("aaaa", T), &Policy::default()),
            Decision::CiUnsettled
        );
        let mut merging = record(CiState::Success);
        merging.merge = MergeState::InFlight {
            sha: "aaaa".parse().unwrap(),
            since_ms: T,
        };
        assert_eq!(
            decide(Some(&merging), &listed("aaaa", T), &Policy::default()),
            Decision::Merging
        );
    }

    #[test]
    fn a_required_context_not_reported_yet_is_unsettled() {
        // ci/test is green, but the policy also requires a `lint` context that has
        // not reported on the head: the PR waits for CI, so the pass reads it.
        let r = record(CiState::Success);
        let policy = Policy {
            required_contexts: vec!["ci/test".into(), "lint*".into()],
            ..Policy::default()
        };
        assert_eq!(
            decide(Some(&r), &listed("aaaa", T), &policy),
            Decision::CiUnsettled
        );
        let only_test = Policy {
            required_contexts: vec!["ci/*".into()],
            ..Policy::default()
        };
        assert_eq!(
            decide(Some(&r), &listed("aaaa", T), &only_test),
            Decision::Skip
        );
    }

    #[test]
    fn a_read_within_the_second_of_updated_at_is_not_trusted() {
        // `updated_at` has one-second resolution: a review submitted later in the
        // same second as the last read leaves it unchanged.
        let mut r = record(CiState::Success);
        r.reviews.as_mut().unwrap().at_ms = T + 400;
        assert_eq!(
            decide(Some(&r), &listed("aaaa", T), &Policy::default()),
            Decision::Updated
        );
        r.reviews.as_mut().unwrap().at_ms = T + 1_000;
        assert_eq!(
            decide(Some(&r), &listed("aaaa", T), &Policy::default()),
            Decision::Skip
        );
        r.reviews = None;
        assert_eq!(
            decide(Some(&r), &listed("aaaa", T), &Policy::default()),
            Decision::Updated
        );
    }

    #[test]
    fn the_full_sweep_comes_once_per_interval() {
        let day = Duration::from_secs(86_400);
        let d = 86_400_000;
        assert!(full_due(None, 5, day), "no pass before: full");
        assert!(!full_due(Some(3 * d + 10), 3 * d + 600_000, day));
        assert!(full_due(Some(3 * d - 10), 3 * d + 590_000, day));
        assert!(full_due(Some(3 * d), 5 * d, day));
        assert!(full_due(Some(3 * d + 10), 3 * d + 20, Duration::ZERO));
    }
}
