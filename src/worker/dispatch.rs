//! Dispatch sinks: where work items (and cancel notices) for the agents go (DESIGN §4).
//!
//! - The Redis stream `<prefix>:dispatch` (contract): a work item is an entry with the
//!   field `work` = the [`WorkItem`] JSON; a cancel notice is an entry with the field
//!   `cancel` = [`CancelNotice`] JSON (consumers that only know `work` skip it).
//!   Each effect appends at most once ([`store::effects::append_dispatch`]).
//! - When `SHEPHERD_DISPATCH_URL` is set, the same JSON is also POSTed there, signed
//!   with `X-Shepherd-Signature: sha256=<hex HMAC-SHA256 of the body>` keyed with
//!   `SHEPHERD_DISPATCH_SECRET`, and labelled `X-Shepherd-Event: work` or `cancel`.
//!   The POST is at least once (a retry after a crash may repeat it): receivers
//!   deduplicate on the work item's `id`. Transient failures (connection, timeout,
//!   429, 5xx) are retried by the executor with backoff, honouring `Retry-After`.
//! - Before either, [`budget_gate`] checks the spend caps (issue 28): it reads what
//!   every applicable scope spent from the ledger, and the record's grant and past
//!   runs, and asks [`crate::core::budget::decide`]. A stop is reported back to the
//!   record (`over-budget`) and nothing is sent; a go sends the item with the tightest
//!   remaining budget in `limits` (`usd_micros`, `tokens`, `budget_scope`).

use std::time::Duration;

use crate::store::Conn;
use hmac::{Hmac, Mac};
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tracing::instrument;

use crate::config::Config;
use crate::core::budget;
use crate::core::effect::{WorkItem, WorkKind};
use crate::core::ids::{RepoName, WorkId};
use crate::core::policy::Policy;
use crate::core::record::{IssueRecord, PrRecord};
use crate::store::{Keys, StoreError, commit, effects, ledger};

/// Header carrying the HMAC of an HTTP dispatch.
pub const SIGNATURE_HEADER: &str = "X-Shepherd-Signature";
/// Header naming what an HTTP dispatch carries (`work` or `cancel`).
pub const EVENT_HEADER: &str = "X-Shepherd-Event";
/// Stream field of a work item (contract).
pub const WORK_FIELD: &str = "work";
/// Stream field of a cancel notice.
pub const CANCEL_FIELD: &str = "cancel";
/// Timeout of one HTTP dispatch.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// "This work item is no longer wanted" (the PR closed, a new head arrived, …).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelNotice {
    /// The work item's id.
    pub id: WorkId,
    /// Always `cancel`, so one decoder can tell notices from work items.
    pub kind: String,
    /// Its repository.
    pub repo: RepoName,
    /// Its PR or issue.
    pub number: u64,
}

/// Why a dispatch did not reach a sink.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Redis failed: the effect stays pending and is retried.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The HTTP sink failed in a way worth retrying.
    #[error("dispatch POST failed: {message}")]
    Transient {
        /// What happened.
        message: String,
        /// The sink's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
    /// The HTTP sink refused the message (4xx other than 429).
    #[error("dispatch POST refused: {0}")]
    Refused(String),
}

/// The optional HTTP sink.
struct HttpSink {
    /// Client with a timeout.
    client: reqwest::Client,
    /// `SHEPHERD_DISPATCH_URL`.
    url: String,
    /// `SHEPHERD_DISPATCH_SECRET`.
    secret: SecretString,
}

/// Both sinks.
pub struct Sinks {
    /// Key layout (the dispatch stream and its markers).
    keys: Keys,
    /// The HTTP sink, when configured.
    http: Option<HttpSink>,
    /// How long a per-effect "already appended" marker lives.
    marker_ttl: Duration,
}

impl Sinks {
    /// The sinks of this configuration.
    pub fn new(config: &Config, keys: Keys) -> anyhow::Result<Self> {
        let http = match (&config.dispatch_url, &config.dispatch_secret) {
            (Some(url), Some(secret)) => Some(HttpSink {
                client: reqwest::Client::builder()
                    .timeout(HTTP_TIMEOUT)
                    .user_agent(concat!("shepherd/", env!("CARGO_PKG_VERSION")))
                    .build()?,
                url: url.clone(),
                secret: secret.clone(),
            }),
            _ => None,
        };
        Ok(Self {
            keys,
            http,
            marker_ttl: config.retention,
        })
    }

    /// Hands a work item to the agents (effect `effect_id`).
    #[instrument(skip_all, fields(effect = effect_id, work = %item.id))]
    pub async fn send_work(
        &self,
        conn: &mut Conn,
        effect_id: &str,
        item: &WorkItem,
    ) -> Result<(), SinkError> {
        let json = serde_json::to_string(item).unwrap_or_default();
        self.send(conn, effect_id, WORK_FIELD, &json).await
    }

    /// Tells the agents a work item is no longer wanted (effect `effect_id`).
    #[instrument(skip_all, fields(effect = effect_id, work = %notice.id))]
    pub async fn send_cancel(
        &self,
        conn: &mut Conn,
        effect_id: &str,
        notice: &CancelNotice,
    ) -> Result<(), SinkError> {
        let json = serde_json::to_string(notice).unwrap_or_default();
        self.send(conn, effect_id, CANCEL_FIELD, &json).await
    }

    async fn send(
        &self,
        conn: &mut Conn,
        effect_id: &str,
        field: &str,
        json: &str,
    ) -> Result<(), SinkError> {
        effects::append_dispatch(conn, &self.keys, effect_id, field, json, self.marker_ttl).await?;
        match &self.http {
            Some(sink) => sink.post(field, json).await,
            None => Ok(()),
        }
    }
}

impl HttpSink {
    /// POSTs one signed message.
    async fn post(&self, event: &str, json: &str) -> Result<(), SinkError> {
        let signature = sign(self.secret.expose_secret().as_bytes(), json.as_bytes());
        let resp = self
            .client
            .post(&self.url)
            .header(CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .header(EVENT_HEADER, event)
            .body(json.to_owned())
            .send()
            .await
            .map_err(|e| SinkError::Transient {
                message: e.without_url().to_string(),
                retry_after: None,
            })?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        match status {
            200..=299 => Ok(()),
            429 | 500..=599 => Err(SinkError::Transient {
                message: format!("HTTP {status}"),
                retry_after,
            }),
            _ => Err(SinkError::Refused(format!("HTTP {status}"))),
        }
    }
}

/// What the budget check decided for a work item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Send this item (the dispatched one with its budget limits filled in).
    Go(Box<WorkItem>),
    /// Do not send it: a cap is reached.
    Stop(budget::Stop),
}

/// The budget check of `item` before it is sent (see the module docs). With no cap
/// in the repository's policy it reads nothing.
pub async fn budget_gate(
    conn: &mut Conn,
    keys: &Keys,
    policy: &Policy,
    item: &WorkItem,
    now_ms: i64,
) -> Result<Gate, StoreError> {
    let caps = budget::caps(policy);
    if caps.is_empty() {
        return Ok(Gate::Go(Box::new(item.clone())));
    }
    let mut spent = budget::Ledger::default();
    for cap in &caps {
        let key = (cap.scope, cap.window);
        if cap.scope == budget::Scope::Run || spent.spent.iter().any(|(k, _)| *k == key) {
            continue;
        }
        let s = ledger::spent(
            conn,
            keys,
            &ledger_scope(item, cap.scope),
            window(cap.window),
            now_ms,
        )
        .await?;
        let s = budget::Spent {
            usd_micros: s.usd_micros,
            tokens: s.tokens,
        };
        spent.spent.push((key, s));
    }
    let (grant, runs) = record_budget(conn, keys, item).await?;
    let expected = budget::expected(policy, &runs);
    Ok(
        match budget::decide(policy, &spent, grant, expected, now_ms) {
            budget::Verdict::Stop(stop) => Gate::Stop(stop),
            budget::Verdict::Go(limits) => {
                let mut item = item.clone();
                item.limits.usd_micros = limits.usd_micros;
                item.limits.tokens = limits.tokens;
                item.limits.budget_scope = limits.scope;
                Gate::Go(Box::new(item))
            }
        },
    )
}

/// The ledger's scope of a cap's scope for `item`.
fn ledger_scope(item: &WorkItem, scope: budget::Scope) -> ledger::Scope {
    let (repo, number) = (item.repo.clone(), item.number);
    match scope {
        budget::Scope::Pr | budget::Scope::Run if item.kind == WorkKind::IssueImpl => {
            ledger::Scope::Issue { repo, number }
        }
        budget::Scope::Pr | budget::Scope::Run => ledger::Scope::Pr { repo, number },
        budget::Scope::Repo => ledger::Scope::Repo(repo),
        budget::Scope::Org => ledger::Scope::Org(item.repo.owner().to_ascii_lowercase()),
        budget::Scope::Instance => ledger::Scope::Instance,
    }
}

/// The ledger's window of a cap's window.
fn window(w: budget::Window) -> ledger::Window {
    match w {
        budget::Window::Lifetime => ledger::Window::Lifetime,
        budget::Window::Day => ledger::Window::Day,
        budget::Window::Month => ledger::Window::Month,
    }
}

/// The grant left and the past runs' costs of `item`'s record (none when it has no
/// record, or one this build cannot read: the caps alone decide then).
async fn record_budget(
    conn: &mut Conn,
    keys: &Keys,
    item: &WorkItem,
) -> Result<(budget::Grant, Vec<budget::Spent>), StoreError> {
    let repo = item.repo.as_str();
    let issue = item.kind == WorkKind::IssueImpl;
    let key = match issue {
        true => keys.issue_record(repo, item.number),
        false => keys.pr_record(repo, item.number),
    };
    let Some(stored) = commit::load(conn, &key).await? else {
        return Ok((budget::Grant::default(), Vec::new()));
    };
    let work = match issue {
        true => IssueRecord::from_json(&stored.data).map(|r| r.work).ok(),
        false => PrRecord::from_json(&stored.data).map(|r| r.work).ok(),
    };
    Ok(work.map_or_else(Default::default, |w| {
        (w.budget.grant, crate::core::machine::past_runs(&w))
    }))
}

/// `sha256=<lowercase hex HMAC-SHA256 of body keyed with secret>`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_prefixed_lowercase_hex() {
        // RFC 4231 test case 2.
        let sig = sign(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
