//! Typed errors of the Forgejo client. Callers branch on them: the executor retries what
//! [`ForgejoError::is_retryable`] says is transient (honouring
//! [`ForgejoError::retry_after`]) and reports everything else to the state machine.

use std::time::Duration;

/// Everything that can go wrong talking to Forgejo. Messages never contain the token.
#[derive(Debug, thiserror::Error)]
pub enum ForgejoError {
    /// The request did not complete within the configured per-request timeout.
    #[error("Forgejo request {method} {path} timed out")]
    Timeout {
        /// HTTP method of the request.
        method: String,
        /// API path (below `/api/v1`) of the request.
        path: String,
    },
    /// No connection could be made (refused, DNS, TLS handshake).
    #[error("cannot connect to Forgejo for {method} {path}: {reason}")]
    Connect {
        /// HTTP method of the request.
        method: String,
        /// API path of the request.
        path: String,
        /// The transport's explanation.
        reason: String,
    },
    /// Any other transport failure (connection reset, body cut short).
    #[error("transport error on {method} {path}: {reason}")]
    Transport {
        /// HTTP method of the request.
        method: String,
        /// API path of the request.
        path: String,
        /// The transport's explanation.
        reason: String,
    },
    /// Forgejo answered with a non-success status.
    #[error("Forgejo answered {code} to {method} {path}: {message}")]
    Status {
        /// HTTP status code.
        code: u16,
        /// HTTP method of the request.
        method: String,
        /// API path of the request.
        path: String,
        /// The `message` of Forgejo's `{"message", "url"}` error body, or the raw body
        /// (truncated) when it is not that shape.
        message: String,
        /// The `Retry-After` delay when the answer carried one.
        retry_after: Option<Duration>,
    },
    /// The answer was 2xx but its body did not have the expected shape.
    #[error("cannot decode Forgejo's answer to {path} at {json_path}: {reason}")]
    Decode {
        /// API path of the request.
        path: String,
        /// JSON path of the mismatch (e.g. `[3].head.sha`).
        json_path: String,
        /// What did not match.
        reason: String,
    },
    /// The circuit breaker for this host is open: the call was not attempted.
    #[error("circuit breaker open for Forgejo host {host}")]
    CircuitOpen {
        /// Host whose breaker is open.
        host: String,
        /// Time left until the breaker lets a probe through.
        retry_after: Duration,
    },
    /// A caller passed something that cannot be a repository (`owner/name`) or URL.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl ForgejoError {
    /// True for failures that may go away by themselves: timeouts, connection and
    /// transport errors, 429, 5xx, and an open circuit. Everything else (4xx, decode
    /// errors) will fail the same way again.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Timeout { .. }
            | Self::Connect { .. }
            | Self::Transport { .. }
            | Self::CircuitOpen { .. } => true,
            Self::Status { code, .. } => *code == 429 || (500..600).contains(code),
            Self::Decode { .. } | Self::Invalid(_) => false,
        }
    }

    /// The delay the server (or the circuit breaker) asked for before the next attempt.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            Self::CircuitOpen { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The HTTP status when Forgejo answered, `None` for transport-level failures.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when Forgejo answered 404.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// True when the failure counts against the circuit breaker: the host looks
    /// unhealthy (timeouts, connection failures, 429, 5xx). An open circuit itself does
    /// not count.
    pub(crate) fn counts_against_host(&self) -> bool {
        self.is_retryable() && !matches!(self, Self::CircuitOpen { .. })
    }
}

/// Parses a `Retry-After` header value: delay seconds or an HTTP date (RFC 7231).
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let delta = when.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> ForgejoError {
        ForgejoError::Status {
            code,
            method: "GET".into(),
            path: "/x".into(),
            message: String::new(),
            retry_after: None,
        }
    }

    #[test]
    fn retryable_classification() {
        for code in [429, 500, 502, 503, 504] {
            assert!(status(code).is_retryable(), "{code}");
        }
        for code in [400, 401, 403, 404, 405, 409, 422] {
            assert!(!status(code).is_retryable(), "{code}");
        }
        assert!(
            ForgejoError::Timeout {
                method: "GET".into(),
                path: "/x".into()
            }
            .is_retryable()
        );
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        let past = "Wed, 21 Oct 2015 07:28:00 GMT";
        assert_eq!(parse_retry_after(past), Some(Duration::ZERO));
        let future = (chrono::Utc::now() + chrono::Duration::seconds(120)).to_rfc2822();
        let d = parse_retry_after(&future).expect("a date parses");
        assert!(d > Duration::from_secs(100) && d <= Duration::from_secs(120));
        assert_eq!(parse_retry_after("soon"), None);
    }
}
