//! The HTTP core of [`ForgejoClient`]: construction, authentication, one request with
//! typed errors and the circuit breaker, JSON decoding that names the failing path,
//! and pagination. The endpoint methods live in the sibling modules.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderValue, RETRY_AFTER};
use reqwest::{Method, Url};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use tracing::instrument;

use super::ForgejoError;
use super::breaker::{BreakerConfig, CircuitBreaker};
use super::calls::Cause;
use super::error::parse_retry_after;
use super::labels::LabelCache;
use crate::config::Config;
use crate::telemetry::Metrics;

/// Page size for every paginated list: Forgejo's default `MAX_RESPONSE_ITEMS`.
pub const PAGE_LIMIT: usize = 50;

/// Safety stop for pagination, so a server that keeps answering full pages cannot keep
/// a worker busy forever (50 × 200 = 10,000 items).
const MAX_PAGES: usize = 200;

/// Longest error body kept in a [`ForgejoError::Status`] message.
const MAX_ERROR_BODY: usize = 512;

/// Options for [`ForgejoClient::new`].
#[derive(Clone, Default)]
pub struct ClientOptions {
    /// Per-request timeout (connect + send + read). Defaults to 10 s.
    pub timeout: Option<Duration>,
    /// Circuit-breaker tuning.
    pub breaker: BreakerConfig,
    /// Metrics handle for the `circuit_open{host}` gauge and the API call counter.
    pub metrics: Option<Metrics>,
}

/// A Forgejo REST client for one instance. Cheap to clone: clones share the HTTP
/// connection pool, the circuit breaker and the label caches.
#[derive(Clone)]
pub struct ForgejoClient {
    /// Shared state.
    pub(super) inner: Arc<Inner>,
    /// What this clone's calls are for (`shepherd_forgejo_api_calls_total{cause}`).
    cause: Cause,
}

/// State shared by the clones of a client.
pub(super) struct Inner {
    /// The reqwest client (rustls, timeout, user agent).
    http: reqwest::Client,
    /// `<base>/api/v1` without a trailing slash.
    api: String,
    /// API token, sent as `Authorization: token …`.
    token: SecretString,
    /// Breaker of this host.
    pub(super) breaker: CircuitBreaker,
    /// Label caches by repository (`owner/name`).
    pub(super) labels: Mutex<HashMap<String, Arc<LabelCache>>>,
    /// `shepherd_forgejo_api_calls_total{endpoint, cause}`, when metrics are on.
    calls: Option<prometheus::IntCounterVec>,
    /// The instance's version (`GET /version`), read once on first need
    /// ([`super::actions`]): which Actions routes exist depends on it.
    pub(super) version: tokio::sync::OnceCell<String>,
}

/// A successful answer: status, `X-Total-Count`, and the body.
pub(super) struct Answer {
    /// HTTP status (2xx).
    pub status: u16,
    /// `X-Total-Count`, when present.
    pub total: Option<usize>,
    /// Raw body.
    pub body: Bytes,
}

impl std::fmt::Debug for ForgejoClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForgejoClient")
            .field("api", &self.inner.api)
            .finish_non_exhaustive()
    }
}

impl ForgejoClient {
    /// A client for the instance at `base_url` (without `/api/v1`).
    pub fn new(
        base_url: &str,
        token: SecretString,
        options: ClientOptions,
    ) -> Result<Self, ForgejoError> {
        let base = base_url.trim_end_matches('/');
        let parsed = Url::parse(base)
            .map_err(|e| ForgejoError::Invalid(format!("Forgejo URL {base:?}: {e}")))?;
        let host = match (parsed.host_str(), parsed.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_owned(),
            (None, _) => return Err(ForgejoError::Invalid(format!("no host in {base:?}"))),
        };
        let timeout = options.timeout.unwrap_or(Duration::from_secs(10));
        let http = reqwest::Client::builder()
            .user_agent(concat!("shepherd/", env!("CARGO_PKG_VERSION")))
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .build()
            .map_err(|e| ForgejoError::Invalid(format!("HTTP client: {e}")))?;
        let gauge = options
            .metrics
            .as_ref()
            .map(|m| m.circuit_open.with_label_values(&[host.as_str()]));
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                api: format!("{base}/api/v1"),
                token,
                breaker: CircuitBreaker::new(host, options.breaker, gauge),
                labels: Mutex::new(HashMap::new()),
                calls: options.metrics.as_ref().map(|m| m.forgejo_calls.clone()),
                version: tokio::sync::OnceCell::new(),
            }),
            cause: Cause::Other,
        })
    }

    /// A client from the process configuration (`SHEPHERD_FORGEJO_URL`, `…_TOKEN`,
    /// `…_TIMEOUT_MS`).
    pub fn from_config(config: &Config, metrics: Option<Metrics>) -> anyhow::Result<Self> {
        let (url, token) = config.require_forgejo()?;
        let options = ClientOptions {
            timeout: Some(config.forgejo_timeout),
            metrics,
            ..ClientOptions::default()
        };
        Ok(Self::new(url, token.clone(), options)?)
    }

    /// The instance's base URL (without `/api/v1` and without a trailing slash), to
    /// make the relative links Forgejo hands out (Actions run links) absolute.
    pub fn base_url(&self) -> &str {
        self.inner
            .api
            .strip_suffix("/api/v1")
            .unwrap_or(&self.inner.api)
    }

    /// A clone whose calls are counted under `cause` (same pool, breaker and caches).
    pub fn with_cause(&self, cause: Cause) -> Self {
        Self {
            inner: self.inner.clone(),
            cause,
        }
    }

    /// What this clone's calls are counted under.
    pub fn cause(&self) -> Cause {
        self.cause
    }

    /// Counts one request that is about to be sent.
    fn count(&self, method: &Method, path: &str) {
        if let Some(calls) = &self.inner.calls {
            let endpoint = super::calls::endpoint(method.as_str(), path);
            calls
                .with_label_values(&[endpoint.as_str(), self.cause.as_str()])
                .inc();
        }
    }

    /// The circuit breaker of this client's host.
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.inner.breaker
    }

    /// Sends one request to `path` (below `/api/v1`) through the circuit breaker.
    /// Non-2xx answers become [`ForgejoError::Status`].
    #[instrument(skip_all, fields(method = %method, path = %path))]
    pub(super) async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, ForgejoError> {
        self.inner.breaker.acquire()?;
        self.count(&method, path);
        let result = self.send_once(&method, path, query, body).await;
        self.inner.breaker.record(&result);
        if let Err(e) = &result {
            tracing::debug!(error = %e, "Forgejo request failed");
        }
        result
    }

    /// The request for `path` (below `/api/v1`) with the query and the token header.
    fn request(
        &self,
        method: &Method,
        path: &str,
        query: &[(&str, String)],
        accept: &'static str,
    ) -> Result<reqwest::RequestBuilder, ForgejoError> {
        let mut url = Url::parse(&format!("{}{path}", self.inner.api))
            .map_err(|e| ForgejoError::Invalid(format!("path {path:?}: {e}")))?;
        if !query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in query {
                pairs.append_pair(k, v);
            }
        }
        let mut auth =
            HeaderValue::from_str(&format!("token {}", self.inner.token.expose_secret())).map_err(
                |_| ForgejoError::Invalid("the token is not a valid header value".into()),
            )?;
        auth.set_sensitive(true);
        Ok(self
            .inner
            .http
            .request(method.clone(), url)
            .header(AUTHORIZATION, auth)
            .header(ACCEPT, accept))
    }

    async fn send_once(
        &self,
        method: &Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, ForgejoError> {
        let mut req = self.request(method, path, query, "application/json")?;
        if let Some(b) = body {
            req = req.json(b);
        }
        let transport = |e: reqwest::Error| transport_error(method, path, e);
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status().as_u16();
        let retry_after = retry_after_of(&resp);
        let total = resp
            .headers()
            .get("x-total-count")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let bytes = resp.bytes().await.map_err(transport)?;
        if !(200..300).contains(&status) {
            return Err(status_error(status, method, path, &bytes, retry_after));
        }
        Ok(Answer {
            status,
            total,
            body: bytes,
        })
    }

    /// `GET path` as text (a raw diff), through the circuit breaker, reading at most
    /// `cap` bytes of the body however long it is: the text (lossy UTF-8, cut at a
    /// character boundary) and whether the body went on past `cap`.
    #[instrument(skip_all, fields(path = %path))]
    pub(super) async fn get_text_capped(
        &self,
        path: &str,
        cap: usize,
    ) -> Result<(String, bool), ForgejoError> {
        self.inner.breaker.acquire()?;
        self.count(&Method::GET, path);
        let result = self.get_text_once(path, cap).await;
        self.inner.breaker.record(&result);
        if let Err(e) = &result {
            tracing::debug!(error = %e, "Forgejo request failed");
        }
        result
    }

    async fn get_text_once(&self, path: &str, cap: usize) -> Result<(String, bool), ForgejoError> {
        let method = Method::GET;
        let transport = |e: reqwest::Error| transport_error(&method, path, e);
        let mut resp = self
            .request(&method, path, &[], "text/plain")?
            .send()
            .await
            .map_err(transport)?;
        let status = resp.status().as_u16();
        let retry_after = retry_after_of(&resp);
        let mut bytes: Vec<u8> = Vec::new();
        let mut longer = false;
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            let room = cap.saturating_sub(bytes.len());
            if chunk.len() > room {
                bytes.extend_from_slice(&chunk[..room]);
                longer = true;
                break;
            }
            bytes.extend_from_slice(&chunk);
        }
        if !(200..300).contains(&status) {
            return Err(status_error(status, &method, path, &bytes, retry_after));
        }
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if longer {
            // The cut may have split a character: drop its replacement character.
            let trimmed = text.trim_end_matches('\u{FFFD}').len();
            text.truncate(trimmed);
        }
        Ok((text, longer))
    }

    /// `GET path` (text/plain) asking for its last `tail` bytes (`Range: bytes=-N`,
    /// which Go's `http.ServeContent` answers with 206 and `Content-Range`), through
    /// the circuit breaker: at most `tail` bytes (the end of the body when a server
    /// ignores the range and answers 200, reading on without keeping more), and the
    /// body's whole length when the answer says it. 416 (an empty log) is empty text.
    #[instrument(skip_all, fields(path = %path))]
    pub(super) async fn get_text_tail(
        &self,
        path: &str,
        tail: usize,
    ) -> Result<(Vec<u8>, Option<u64>), ForgejoError> {
        self.inner.breaker.acquire()?;
        self.count(&Method::GET, path);
        let result = self.get_text_tail_once(path, tail).await;
        self.inner.breaker.record(&result);
        result
    }

    async fn get_text_tail_once(
        &self,
        path: &str,
        tail: usize,
    ) -> Result<(Vec<u8>, Option<u64>), ForgejoError> {
        let method = Method::GET;
        let transport = |e: reqwest::Error| transport_error(&method, path, e);
        let mut resp = self
            .request(&method, path, &[], "text/plain")?
            .header(reqwest::header::RANGE, format!("bytes=-{tail}"))
            .send()
            .await
            .map_err(transport)?;
        let status = resp.status().as_u16();
        if status == 416 {
            return Ok((Vec::new(), Some(0)));
        }
        let retry_after = retry_after_of(&resp);
        // `Content-Range: bytes a-b/total` (206), else `Content-Length` (200).
        let total = resp
            .headers()
            .get(reqwest::header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit_once('/'))
            .and_then(|(_, t)| t.trim().parse().ok())
            .or_else(|| (status == 200).then(|| resp.content_length()).flatten());
        let mut bytes: Vec<u8> = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            bytes.extend_from_slice(&chunk);
            if bytes.len() > tail {
                bytes.drain(..bytes.len() - tail);
            }
        }
        if !(200..300).contains(&status) {
            return Err(status_error(status, &method, path, &bytes, retry_after));
        }
        Ok((bytes, total))
    }

    /// `GET path` decoded as `T`.
    pub(super) async fn get_json<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T, ForgejoError> {
        let answer = self.send(Method::GET, path, query, None).await?;
        decode(path, &answer.body)
    }

    /// `method path` with a JSON body, the answer decoded as `T`.
    pub(super) async fn send_json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<T, ForgejoError> {
        let answer = self.send(method, path, &[], Some(body)).await?;
        decode(path, &answer.body)
    }

    /// Every item of a paginated list: pages of [`PAGE_LIMIT`] until a short or empty
    /// page, or until `X-Total-Count` items have been read.
    pub(super) async fn get_all<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<Vec<T>, ForgejoError> {
        let mut out = Vec::new();
        for page in 1..=MAX_PAGES {
            let mut q = query.to_vec();
            q.push(("page", page.to_string()));
            q.push(("limit", PAGE_LIMIT.to_string()));
            let answer = self.send(Method::GET, path, &q, None).await?;
            let items: Vec<T> = decode(path, &answer.body)?;
            let n = items.len();
            out.extend(items);
            if page_is_last(n, out.len(), answer.total) {
                break;
            }
        }
        Ok(out)
    }
}

/// The `Retry-After` of an answer, when it has one.
fn retry_after_of(resp: &reqwest::Response) -> Option<Duration> {
    resp.headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_retry_after)
}

/// A non-2xx answer as [`ForgejoError::Status`].
fn status_error(
    code: u16,
    method: &Method,
    path: &str,
    body: &[u8],
    retry_after: Option<Duration>,
) -> ForgejoError {
    ForgejoError::Status {
        code,
        method: method.to_string(),
        path: path.to_owned(),
        message: error_message(body),
        retry_after,
    }
}

/// Whether a page of `n` items (with `seen` items read so far) is the last one.
pub(super) fn page_is_last(n: usize, seen: usize, total: Option<usize>) -> bool {
    match total {
        Some(total) => n == 0 || seen >= total,
        None => n < PAGE_LIMIT,
    }
}

/// Decodes a JSON body, naming the JSON path of a mismatch.
pub(super) fn decode<T: DeserializeOwned>(path: &str, body: &[u8]) -> Result<T, ForgejoError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| ForgejoError::Decode {
        path: path.to_owned(),
        json_path: e.path().to_string(),
        reason: e.inner().to_string(),
    })
}

/// The `message` of Forgejo's `{"message","url"}` error body (possibly empty, as for
/// "already merged"), or the raw body cut to
/// [`MAX_ERROR_BODY`] bytes when it has another shape (e.g. `ErrMergeConflicts`).
fn error_message(body: &[u8]) -> String {
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(body)
        && let Some(serde_json::Value::String(m)) = map.get("message")
    {
        return m.clone();
    }
    let text = String::from_utf8_lossy(body);
    let mut end = text.len().min(MAX_ERROR_BODY);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].trim().to_owned()
}

fn transport_error(method: &Method, path: &str, e: reqwest::Error) -> ForgejoError {
    let (method, path) = (method.to_string(), path.to_owned());
    // The reqwest error's Display may include the URL, which never holds the token
    // (it travels in a header), so it is safe to keep.
    let reason = std::error::Error::source(&e)
        .map(|s| format!("{e}: {s}"))
        .unwrap_or_else(|| e.to_string());
    if e.is_timeout() {
        ForgejoError::Timeout { method, path }
    } else if e.is_connect() {
        ForgejoError::Connect {
            method,
            path,
            reason,
        }
    } else {
        ForgejoError::Transport {
            method,
            path,
            reason,
        }
    }
}

/// Checks `owner/name` and returns the API path prefix `/repos/owner/name`.
pub(super) fn repo_path(repo: &str) -> Result<String, ForgejoError> {
    let ok_part = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    match repo.split_once('/') {
        Some((owner, name)) if ok_part(owner) && ok_part(name) => {
            Ok(format!("/repos/{owner}/{name}"))
        }
        _ => Err(ForgejoError::Invalid(format!(
            "{repo:?} is not a repository (owner/name)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_paths() {
        assert_eq!(repo_path("o/r.rs").unwrap(), "/repos/o/r.rs");
        for bad in ["o", "o/", "/r", "o/r/x", "o/r?x", "o r/x"] {
            assert!(repo_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            error_message(br#"{"message":"head out of date","url":"u"}"#),
            "head out of date"
        );
        assert!(error_message(br#"{"Style":"squash","StdErr":"CONFLICT"}"#).contains("CONFLICT"));
        assert_eq!(error_message(&[b'x'; 2000]).len(), MAX_ERROR_BODY);
    }

    #[test]
    fn last_page() {
        assert!(page_is_last(10, 60, None));
        assert!(!page_is_last(50, 50, None));
        assert!(
            !page_is_last(30, 30, Some(120)),
            "a server cap below 50 still pages on"
        );
        assert!(page_is_last(20, 120, Some(120)));
        assert!(page_is_last(0, 3, Some(120)));
    }
}
