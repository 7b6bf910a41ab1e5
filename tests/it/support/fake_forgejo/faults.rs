//! Failure injection and the call log. A [`Fault`] matches requests by method and path
//! pattern (`*` matches any run of characters) and, for its next `times` matches (or
//! until cleared), answers a status, delays, stalls, or lets the request take effect
//! and then answers an error (the merge that happened although the client saw 500).

use std::time::{Duration, Instant};

use serde_json::Value;

use super::model::glob;

/// What an injected fault does to a matching request.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// Answer this status without touching the model (`Retry-After` when given).
    Respond {
        /// HTTP status.
        status: u16,
        /// `Retry-After` header value, e.g. `"3"`.
        retry_after: Option<String>,
        /// `message` of the error body.
        message: String,
    },
    /// Answer this status with this JSON body, without touching the model (odd or
    /// malformed answers).
    RespondJson {
        /// HTTP status.
        status: u16,
        /// The body.
        body: Value,
    },
    /// Wait, then handle the request normally (a slow server: the effect happens even
    /// if the client has given up).
    Delay(Duration),
    /// Wait, then answer 504 without touching the model (a hung request).
    Stall(Duration),
    /// Handle the request normally (the model changes), then answer this status.
    ApplyThenRespond(u16),
}

/// One injection rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Method to match (`None`: any).
    pub method: Option<String>,
    /// Path pattern below `/api/v1`, e.g. `/repos/o/r/pulls/*/merge`.
    pub path: String,
    /// What to do.
    pub action: FaultAction,
    /// Matches left; `None` until cleared.
    pub times: Option<u32>,
    /// The rule stops matching at this instant (an outage of a given length).
    pub until: Option<Instant>,
}

impl Fault {
    /// A rule for `method` (`"*"` for any) and `path` answering 500 until cleared.
    pub fn on(method: &str, path: &str) -> Self {
        Self {
            method: (method != "*").then(|| method.to_ascii_uppercase()),
            path: path.to_owned(),
            action: FaultAction::Respond {
                status: 500,
                retry_after: None,
                message: String::new(),
            },
            times: None,
            until: None,
        }
    }

    /// Answer `status` (with a generic message).
    pub fn status(mut self, status: u16) -> Self {
        self.action = FaultAction::Respond {
            status,
            retry_after: None,
            message: format!("injected {status}"),
        };
        self
    }

    /// Answer `status` with `Retry-After: secs`.
    pub fn status_retry_after(mut self, status: u16, secs: u64) -> Self {
        self.action = FaultAction::Respond {
            status,
            retry_after: Some(secs.to_string()),
            message: format!("injected {status}"),
        };
        self
    }

    /// Answer `status` with this error `message`.
    pub fn status_message(mut self, status: u16, message: &str) -> Self {
        self.action = FaultAction::Respond {
            status,
            retry_after: None,
            message: message.to_owned(),
        };
        self
    }

    /// Answer `status` with `body` (e.g. a 200 whose JSON has the wrong shape).
    pub fn json(mut self, status: u16, body: Value) -> Self {
        self.action = FaultAction::RespondJson { status, body };
        self
    }

    /// Delay, then handle normally.
    pub fn delay(mut self, d: Duration) -> Self {
        self.action = FaultAction::Delay(d);
        self
    }

    /// Hang for `d`, then 504, with no effect.
    pub fn stall(mut self, d: Duration) -> Self {
        self.action = FaultAction::Stall(d);
        self
    }

    /// Take effect, then answer `status` (e.g. a merge that happened, answered 500).
    pub fn apply_then(mut self, status: u16) -> Self {
        self.action = FaultAction::ApplyThenRespond(status);
        self
    }

    /// Only for the next `n` matching requests.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    /// Only for the next `d` (e.g. 30 s of 5xx), counted from now.
    pub fn for_duration(mut self, d: Duration) -> Self {
        self.until = Some(Instant::now() + d);
        self
    }

    /// Whether the rule matches this request.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        self.method.as_deref().is_none_or(|m| m == method)
            && glob(&self.path, path)
            && self.times != Some(0)
            && self.until.is_none_or(|u| Instant::now() < u)
    }
}

/// Takes the first matching rule's action, counting the use down.
pub fn take_fault(faults: &mut Vec<Fault>, method: &str, path: &str) -> Option<FaultAction> {
    let now = Instant::now();
    faults.retain(|f| f.until.is_none_or(|u| now < u));
    let i = faults.iter().position(|f| f.matches(method, path))?;
    let action = faults[i].action.clone();
    if let Some(n) = &mut faults[i].times {
        *n -= 1;
        if *n == 0 {
            faults.remove(i);
        }
    }
    Some(action)
}

/// One request the fake received.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// Method, upper case.
    pub method: String,
    /// Path below `/api/v1`.
    pub path: String,
    /// Query parameters in order.
    pub query: Vec<(String, String)>,
    /// JSON body (`Null` when none or not JSON).
    pub body: Value,
    /// `User-Agent` header.
    pub user_agent: String,
    /// Status answered (0 while the request is in flight).
    pub status: u16,
    /// When the fake started handling it (its body read), for lag measurements.
    pub at: Instant,
}

impl Call {
    /// A query parameter's value.
    pub fn query_param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}
