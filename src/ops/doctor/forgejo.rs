//! The Forgejo checks of `shepherd doctor`: the URL answers, the token is valid and
//! whose it is, that user is the bot, the token's scopes. Only `GET` requests.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use super::{Check, not_checked};
use crate::config::Config;

/// What Forgejo answered to one request.
#[derive(Debug)]
pub(super) enum Answer {
    /// 2xx with this JSON body.
    Json(Value),
    /// Another status, with the `message` of Forgejo's error body (or the start of
    /// the body).
    Status(u16, String),
    /// No answer: connection, TLS or timeout failure.
    Unreachable(String),
}

impl Answer {
    /// The scopes a 403 says the token lacks (`token does not have at least one of
    /// required scope(s): [read:issue]`, from Forgejo's `tokenRequiresScopes`).
    pub(super) fn missing_scopes(&self) -> Option<String> {
        match self {
            Answer::Status(403, message) if message.contains("required scope") => {
                let scopes = message
                    .split_once('[')
                    .and_then(|(_, rest)| rest.split_once(']'))
                    .map_or(message.as_str(), |(scopes, _)| scopes);
                Some(scopes.to_owned())
            }
            _ => None,
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Answer::Json(_) => "answered".to_owned(),
            Answer::Status(code, message) if message.is_empty() => format!("answered {code}"),
            Answer::Status(code, message) => format!("answered {code} ({message})"),
            Answer::Unreachable(why) => format!("did not answer: {why}"),
        }
    }
}

/// Forgejo's API at `SHEPHERD_FORGEJO_URL`, read only.
pub(super) struct Api {
    http: reqwest::Client,
    /// `<base>/api/v1`.
    base: String,
}

impl Api {
    pub(super) fn new(config: &Config) -> Option<Self> {
        let url = config.forgejo_url.as_deref()?;
        let timeout = config.forgejo_timeout.min(Duration::from_secs(10));
        let http = reqwest::Client::builder()
            .user_agent(concat!("shepherd-doctor/", env!("CARGO_PKG_VERSION")))
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .build()
            .ok()?;
        Some(Self {
            http,
            base: format!("{url}/api/v1"),
        })
    }

    /// `GET <base><path>`, with `token` when given.
    async fn get(&self, path: &str, token: Option<&SecretString>) -> Answer {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(token) = token {
            let mut value = match reqwest::header::HeaderValue::from_str(&format!(
                "token {}",
                token.expose_secret()
            )) {
                Ok(v) => v,
                Err(_) => {
                    return Answer::Unreachable("the token is not a valid header value".into());
                }
            };
            value.set_sensitive(true);
            request = request.header(reqwest::header::AUTHORIZATION, value);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => return Answer::Unreachable(error_chain(&e.without_url())),
        };
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        if (200..300).contains(&status) {
            return match serde_json::from_str(&text) {
                Ok(v) => Answer::Json(v),
                Err(_) => Answer::Status(status, "the body is not JSON".to_owned()),
            };
        }
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| text.chars().take(200).collect());
        Answer::Status(status, message.trim().to_owned())
    }

    /// The login of the token's user (`GET /user`).
    pub(super) async fn user(&self, token: &SecretString) -> Result<String, Answer> {
        match self.get("/user", Some(token)).await {
            Answer::Json(v) => match v.get("login").and_then(Value::as_str) {
                Some(login) => Ok(login.to_owned()),
                None => Err(Answer::Status(200, "no login in the answer".into())),
            },
            other => Err(other),
        }
    }
}

/// An error and its causes, on one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// `SHEPHERD_FORGEJO_URL` answers `GET /api/v1/version` (no token needed).
pub(super) async fn forgejo_url(config: &Config, api: Option<&Api>) -> Check {
    const NAME: &str = "forgejo url";
    let (Some(url), Some(api)) = (config.forgejo_url.as_deref(), api) else {
        return Check::fail(
            NAME,
            "SHEPHERD_FORGEJO_URL is not set: the executor (comments, labels, merges, work \
             dispatch) and the periodic resync are off",
            "set SHEPHERD_FORGEJO_URL to the instance's base URL (e.g. https://forge.example.org)",
        );
    };
    match api.get("/version", None).await {
        Answer::Json(v) => match v.get("version").and_then(Value::as_str) {
            Some(version) => Check::pass(NAME, format!("{url} answers: Forgejo {version}")),
            None => Check::fail(
                NAME,
                format!("{url}/api/v1/version answered without a version: not a Forgejo API"),
                "set SHEPHERD_FORGEJO_URL to the Forgejo instance's base URL, without /api/v1",
            ),
        },
        Answer::Unreachable(why) => Check::fail(
            NAME,
            format!("cannot reach {url}: {why}"),
            "check the URL, and that this machine reaches it (DNS, firewall, TLS certificate)",
        ),
        other => Check::fail(
            NAME,
            format!("{url}/api/v1/version {}", other.describe()),
            "set SHEPHERD_FORGEJO_URL to the Forgejo instance's base URL, without /api/v1",
        ),
    }
}

/// What the token check learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// Not checked (no URL or no token) or refused.
    Unusable,
    /// Forgejo accepted it; its user, when the token may read it.
    Accepted(Option<String>),
}

/// The token is valid and whose it is (`GET /api/v1/user`).
pub(super) async fn forgejo_token(config: &Config, api: Option<&Api>) -> (Check, Token) {
    const NAME: &str = "forgejo token";
    let Some(token) = &config.forgejo_token else {
        let check = Check::fail(
            NAME,
            "SHEPHERD_FORGEJO_TOKEN is not set",
            "as the bot user, create a token with write:repository and write:issue (User \
             settings → Applications; docs/operations.md §1.1) and set SHEPHERD_FORGEJO_TOKEN",
        );
        return (check, Token::Unusable);
    };
    let Some(api) = api else {
        return (
            not_checked(NAME, "SHEPHERD_FORGEJO_URL is not set", "forgejo url"),
            Token::Unusable,
        );
    };
    match api.user(token).await {
        Ok(login) => (
            Check::pass(NAME, format!("valid; it belongs to {login}")),
            Token::Accepted(Some(login)),
        ),
        Err(answer) => match answer.missing_scopes() {
            Some(scopes) => (
                Check::fail(
                    NAME,
                    format!(
                        "valid, but whose it is cannot be read: GET /user needs {scopes}, \
                         which the token lacks"
                    ),
                    "add read:user to the token (Shepherd's own calls do not need it; \
                     without it the token's user cannot be checked)",
                ),
                Token::Accepted(None),
            ),
            None if matches!(answer, Answer::Status(401, _)) => (
                Check::fail(
                    NAME,
                    format!("Forgejo refuses it: GET /user {}", answer.describe()),
                    "as the bot user, create a new token (User settings → Applications) and \
                     set SHEPHERD_FORGEJO_TOKEN",
                ),
                Token::Unusable,
            ),
            None => (
                Check::fail(
                    NAME,
                    format!("not verified: GET /user {}", answer.describe()),
                    "fix the forgejo url check, then run doctor again",
                ),
                Token::Unusable,
            ),
        },
    }
}

/// The token's user is `SHEPHERD_BOT_LOGIN`.
pub(super) fn bot_login(config: &Config, token: &Token) -> Check {
    const NAME: &str = "bot login";
    let user = match token {
        Token::Accepted(Some(user)) => Some(user.as_str()),
        _ => None,
    };
    match (config.bot_login.as_deref(), user) {
        (None, user) => Check::fail(
            NAME,
            "SHEPHERD_BOT_LOGIN is not set: `work` and `run` refuse to start with a Forgejo \
             URL and token, since Shepherd recognises its own comments by their author",
            match user {
                Some(u) => format!("set SHEPHERD_BOT_LOGIN={u} (the token's user)"),
                None => "set SHEPHERD_BOT_LOGIN to the bot user's login".to_owned(),
            },
        ),
        (Some(bot), Some(user)) if bot.eq_ignore_ascii_case(user) => {
            Check::pass(NAME, format!("{bot} is the token's user"))
        }
        (Some(bot), Some(user)) => Check::fail(
            NAME,
            format!(
                "the token belongs to {user}, not to SHEPHERD_BOT_LOGIN={bot}: Shepherd's \
                 comments and labels would come from {user}, and it would not recognise them \
                 as its own"
            ),
            format!("use a token of {bot}, or set SHEPHERD_BOT_LOGIN={user} if {user} is the bot"),
        ),
        (Some(bot), None) => not_checked(
            NAME,
            &format!("SHEPHERD_BOT_LOGIN={bot}, but the token's user is unknown"),
            "forgejo token",
        ),
    }
}

/// Read probes of the scope categories Shepherd's calls need. Forgejo checks a token's
/// scope per route group before the handler runs, and answers 403 `token does not have
/// at least one of required scope(s): [read:issue]` when the category is missing; a
/// `GET` needs `read:<category>`, which `write:<category>` includes.
pub const SCOPE_PROBES: [(&str, &str, &str); 2] = [
    (
        "repository",
        "/repos/search?limit=1",
        "pull requests, commit statuses, reviews, merges, branches",
    ),
    (
        "issue",
        "/repos/issues/search?limit=1",
        "comments and labels",
    ),
];

/// The token's scopes cover the categories Shepherd calls.
pub(super) async fn token_scopes(config: &Config, api: Option<&Api>, token: &Token) -> Check {
    const NAME: &str = "token scopes";
    const FIX: &str = "as the bot user, create a token with write:repository and write:issue \
                       (docs/operations.md §1.1) and set SHEPHERD_FORGEJO_TOKEN";
    let (Some(api), Some(secret), Token::Accepted(_)) = (api, &config.forgejo_token, token) else {
        return not_checked(NAME, "the token is not usable", "forgejo token");
    };
    let mut present = Vec::new();
    let mut missing = Vec::new();
    let mut unknown = Vec::new();
    for (category, path, what) in SCOPE_PROBES {
        let endpoint = path.split('?').next().unwrap_or(path);
        let answer = api.get(path, Some(secret)).await;
        match answer {
            Answer::Json(_) => present.push(category),
            ref a if a.missing_scopes().is_some() => missing.push(format!(
                "{category} (needed for {what}: GET {endpoint} answered 403, missing {})",
                a.missing_scopes().unwrap_or_default()
            )),
            other => unknown.push(format!("{category} (GET {endpoint} {})", other.describe())),
        }
    }
    if !missing.is_empty() {
        return Check::fail(NAME, format!("the token lacks {}", missing.join("; ")), FIX);
    }
    if !unknown.is_empty() {
        return Check::fail(
            NAME,
            format!("could not verify {}", unknown.join("; ")),
            "run doctor again once Forgejo answers",
        );
    }
    Check::pass(
        NAME,
        format!(
            "{} readable (GET /repos/search, GET /repos/issues/search); the write half \
             (write:repository, write:issue) cannot be verified without writing, which doctor \
             never does",
            present.join(" and ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_refusal_names_the_scopes() {
        let refusal = Answer::Status(
            403,
            "token does not have at least one of required scope(s): [read:issue]".into(),
        );
        assert_eq!(refusal.missing_scopes().as_deref(), Some("read:issue"));
        assert_eq!(
            Answer::Status(403, "forbidden".into()).missing_scopes(),
            None
        );
        assert_eq!(
            Answer::Status(401, "token is required".into()).missing_scopes(),
            None
        );
    }
}
