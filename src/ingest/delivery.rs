//! A verified delivery, classified: its id, event type and repository, read from the
//! headers and the payload only after the signature matched (unsigned requests never
//! reach this module). [`Delivery`] is what the store accepts; it can only be built
//! around a [`Verified`] payload.

use std::borrow::Cow;

use crate::ingest::probe;
use crate::ingest::signature::Verified;

/// Headers naming the fine-grained event type, in the order they are consulted
/// (DESIGN §2.2: route on `X-Forgejo-Event-Type`, fall back to Gitea's, then to the
/// coarse event names).
pub const EVENT_HEADERS: [&str; 4] = [
    "x-forgejo-event-type",
    "x-gitea-event-type",
    "x-forgejo-event",
    "x-gitea-event",
];

/// Headers carrying the delivery id, in the order they are consulted.
pub const DELIVERY_HEADERS: [&str; 2] = ["x-forgejo-delivery", "x-gitea-delivery"];

/// Longest accepted delivery id (Forgejo sends 36-character UUIDs).
const MAX_DELIVERY_LEN: usize = 128;
/// Longest accepted event type name.
const MAX_EVENT_LEN: usize = 64;
/// Longest owner (user or organisation) name Forgejo accepts (`MaxSize(40)` on
/// user names); a longer one cannot come from Forgejo.
const MAX_OWNER_LEN: usize = 40;
/// Longest repository name Forgejo accepts (`MaxSize(100)` on repository names).
const MAX_REPO_LEN: usize = 100;

/// Why a signed request cannot be queued (all answer 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// A required header is absent; names the preferred header.
    #[error("missing {0} header")]
    MissingHeader(&'static str),
    /// A header is present but unusable; names it.
    #[error("invalid {0} header")]
    InvalidHeader(&'static str),
    /// The payload is not a JSON object; says where parsing failed.
    #[error("payload is not a JSON object: {0}")]
    NotJson(String),
    /// The payload may be JSON, but not one Shepherd queues: nested too deeply, or its
    /// repository fields repeated, mistyped or naming two repositories; says which.
    #[error("payload refused: {0}")]
    Refused(String),
    /// The payload names a repository Forgejo could never produce as `owner/name`
    /// (whitespace, control characters, `*`, `{`, …): it would pick one scope's secrets
    /// and be routed as another, so it is refused whoever signed it. The name is
    /// quoted with escapes, so a CR/LF in it cannot forge a log line.
    /// The second field is the nearest canonical name (the characters Forgejo allows,
    /// lower-cased): it only picks the secrets the refusal is verified with, so a
    /// refused name costs the same HMACs as any delivery.
    #[error("repository.full_name {0} is not a Forgejo owner/name")]
    BadRepository(String, String),
}

/// A verified, classified webhook delivery, ready to be queued.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The verified payload (the bytes stored in the stream).
    verified: Verified,
    /// Delivery id (`X-Forgejo-Delivery`), the dedup key.
    id: String,
    /// Fine-grained event type (`X-Forgejo-Event-Type` or a fallback).
    event: String,
    /// Repository full name from the payload in its canonical form
    /// ([`canonical_repo`]: checked, lower-cased), `""` when it has none.
    repo: String,
    /// Receive time, unix milliseconds.
    received_ms: i64,
}

impl Delivery {
    /// Classifies a verified payload. `get` looks a header up by lower-case name.
    pub fn classify<'a>(
        verified: Verified,
        get: impl Fn(&str) -> Option<&'a [u8]>,
        received_ms: i64,
    ) -> Result<Self, DeliveryError> {
        let repo = repository_of(verified.payload());
        Self::classify_probed(verified, get, received_ms, repo)
    }

    /// Like [`Delivery::classify`], with the result of [`repository_of`] already
    /// computed over these same bytes (the ingest probes before verifying, to pick
    /// the secrets).
    pub fn classify_probed<'a>(
        verified: Verified,
        get: impl Fn(&str) -> Option<&'a [u8]>,
        received_ms: i64,
        repo: Result<String, DeliveryError>,
    ) -> Result<Self, DeliveryError> {
        let event = first_header(&get, &EVENT_HEADERS, MAX_EVENT_LEN)?;
        let id = first_header(&get, &DELIVERY_HEADERS, MAX_DELIVERY_LEN)?;
        let repo = repo?;
        Ok(Self {
            verified,
            id,
            event,
            repo,
            received_ms,
        })
    }

    /// Dedups the delivery on its id and appends it to its shard's events stream
    /// (`store::enqueue`). Only a `Delivery` — made from a verified body — can be
    /// queued this way, and the entry's layout is the store's (`EventEntry::webhook`).
    pub async fn enqueue(
        &self,
        enqueuer: &crate::store::enqueue::Enqueuer,
        conn: &mut crate::store::Conn,
    ) -> Result<crate::store::enqueue::Enqueued, crate::store::StoreError> {
        let entry = crate::store::event_entry::EventEntry::webhook(
            self.id(),
            self.event(),
            self.repo(),
            u64::try_from(self.received_ms()).unwrap_or(0),
            &self.verified().payload()[..],
        );
        enqueuer.enqueue(conn, &entry).await
    }

    /// The verified payload.
    pub fn verified(&self) -> &Verified {
        &self.verified
    }

    /// Delivery id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Fine-grained event type.
    pub fn event(&self) -> &str {
        &self.event
    }

    /// Canonical repository full name (`owner/name`, lower-case), `""` when the
    /// payload names none.
    pub fn repo(&self) -> &str {
        &self.repo
    }

    /// Receive time, unix milliseconds.
    pub fn received_ms(&self) -> i64 {
        self.received_ms
    }
}

/// The value of the first present header of `names`: printable ASCII without spaces
/// (it becomes part of a Redis key), at most `max` bytes.
fn first_header<'a>(
    get: &impl Fn(&str) -> Option<&'a [u8]>,
    names: &[&'static str],
    max: usize,
) -> Result<String, DeliveryError> {
    let (name, value) = names
        .iter()
        .find_map(|n| get(n).map(|v| (*n, v.trim_ascii())))
        .ok_or(DeliveryError::MissingHeader(canonical(names[0])))?;
    if value.is_empty() {
        return Err(DeliveryError::MissingHeader(canonical(name)));
    }
    if value.len() > max || !value.iter().all(u8::is_ascii_graphic) {
        return Err(DeliveryError::InvalidHeader(canonical(name)));
    }
    // All bytes are ASCII, so this cannot fail.
    Ok(String::from_utf8_lossy(value).into_owned())
}

/// The header name as Forgejo spells it, for messages.
fn canonical(lower: &'static str) -> &'static str {
    match lower {
        "x-forgejo-event-type" => "X-Forgejo-Event-Type",
        "x-gitea-event-type" => "X-Gitea-Event-Type",
        "x-forgejo-event" => "X-Forgejo-Event",
        "x-gitea-event" => "X-Gitea-Event",
        "x-forgejo-delivery" => "X-Forgejo-Delivery",
        "x-gitea-delivery" => "X-Gitea-Delivery",
        other => other,
    }
}

/// Checks that the payload is one JSON object and returns its repository full name in
/// canonical form ([`canonical_repo`]; `""` when it has none). One pass over the
/// bytes, no tree built.
///
/// Also run on the *unverified* payload, only to pick the candidate webhook secrets of
/// a repository or organisation (`[webhooks]` in the policy file); the name is trusted
/// only once the signature under one of those secrets matched. A payload naming two
/// different repositories (top-level `repository` and `run.repository`) is refused:
/// the secret must be chosen by the same name the event is later routed by. For the
/// same reason a name that is not canonical is refused ([`DeliveryError::BadRepository`]).
pub fn repository_of(payload: &[u8]) -> Result<String, DeliveryError> {
    // JSON is UTF-8 (RFC 8259) and the core parses every field later; checked once
    // here over the whole body, so the scanner below only looks at structure.
    if let Err(e) = std::str::from_utf8(payload) {
        return Err(DeliveryError::NotJson(format!(
            "not UTF-8 (byte {})",
            e.valid_up_to()
        )));
    }
    let names = probe::probe(payload).map_err(|e| {
        if e.refused {
            DeliveryError::Refused(e.to_string())
        } else {
            DeliveryError::NotJson(e.to_string())
        }
    })?;
    let repo = match (names.top, names.run) {
        (Some(a), Some(b)) if !a.eq_ignore_ascii_case(&b) => {
            return Err(DeliveryError::Refused(
                "repository and run.repository disagree".into(),
            ));
        }
        (Some(a), _) => a,
        (None, Some(b)) => b,
        (None, None) => Cow::Borrowed(""),
    };
    canonical_repo(&repo)
}

/// The one name a delivery's repository is known by: the secrets are picked by it
/// and it is the `repo` field of the events stream. `""` stays `""` (events without a
/// repository); anything else must be `owner/name` as Forgejo produces it — each part
/// made of ASCII letters, digits, `-`, `_` and `.` (Forgejo's rules for user and
/// repository names), the owner at most [`MAX_OWNER_LEN`] bytes, the name at most
/// [`MAX_REPO_LEN`], neither `.` nor `..` — and it is lower-cased (Forgejo names are
/// case-insensitive; the worker's `RepoName` lower-cases too). Because nothing is
/// trimmed or dropped, the worker, which parses the same bytes later, reaches the
/// same name: no delivery can pick one scope's secrets and land in another's records.
pub fn canonical_repo(name: &str) -> Result<String, DeliveryError> {
    if name.is_empty() {
        return Ok(String::new());
    }
    let part_ok = |p: &str, max: usize| {
        (1..=max).contains(&p.len())
            && p != "."
            && p != ".."
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    match name.split_once('/') {
        Some((owner, repo)) if part_ok(owner, MAX_OWNER_LEN) && part_ok(repo, MAX_REPO_LEN) => {
            Ok(name.to_ascii_lowercase())
        }
        _ => {
            // Quoted with escapes and cut short: the message reaches the sender and the log.
            let shown: String = name
                .chars()
                .take(MAX_OWNER_LEN + MAX_REPO_LEN + 1)
                .collect();
            let nearest: String = name
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
                .map(|c| c.to_ascii_lowercase())
                .collect();
            Err(DeliveryError::BadRepository(format!("{shown:?}"), nearest))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::probe::MAX_NESTING;

    #[test]
    fn finds_the_repository() {
        assert_eq!(
            repository_of(br#"{"action":"opened","repository":{"id":1,"full_name":"o/r"}}"#),
            Ok("o/r".into())
        );
        assert_eq!(
            repository_of(br#"{"run":{"repository":{"full_name":"o\/r2"}}}"#),
            Ok("o/r2".into())
        );
        assert_eq!(repository_of(br#"{"zen":"x"}"#), Ok(String::new()));
        assert!(matches!(
            repository_of(b"[1]"),
            Err(DeliveryError::NotJson(_))
        ));
        assert!(matches!(
            repository_of(br#"{"a":"#),
            Err(DeliveryError::NotJson(_))
        ));
        // The secret is picked by the same name the event is routed by.
        assert!(matches!(
            repository_of(
                br#"{"repository":{"full_name":"o/b"},"run":{"repository":{"full_name":"o/a"}}}"#
            ),
            Err(DeliveryError::Refused(_))
        ));
        assert_eq!(
            repository_of(
                br#"{"repository":{"full_name":"O/A"},"run":{"repository":{"full_name":"o/a"}}}"#
            ),
            Ok("o/a".into())
        );
        // Two `repository` keys cannot smuggle a second name past the probe.
        assert!(matches!(
            repository_of(
                br#"{"repository":{"full_name":"o/b"},"repository":{"full_name":"o/a"}}"#
            ),
            Err(DeliveryError::Refused(_))
        ));
    }

    #[test]
    fn only_canonical_repository_names_pass() {
        for good in ["o/r", "Acme/Web.site", "a-b_c.d/x-y_z.0", ""] {
            assert_eq!(
                canonical_repo(good),
                Ok(good.to_ascii_lowercase()),
                "{good}"
            );
        }
        let long_owner = format!("{}/r", "o".repeat(MAX_OWNER_LEN + 1));
        let long_repo = format!("o/{}", "r".repeat(MAX_REPO_LEN + 1));
        for bad in [
            " acme/web",
            "acme/web ",
            "acme /web",
            "acme/\tweb",
            "acme/web\r\n",
            "acme/w\u{0}b",
            "acme/*",
            "acme/{web}",
            "acme/web#1",
            "acme",
            "/web",
            "acme/",
            "acme/web/x",
            "acme/..",
            "./web",
            "acme/wéb",
            long_owner.as_str(),
            long_repo.as_str(),
        ] {
            assert!(
                matches!(canonical_repo(bad), Err(DeliveryError::BadRepository(..))),
                "{bad:?}"
            );
        }
        let e = canonical_repo("acme/web\r\nforged")
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\n') && !e.contains('\r'), "{e}");
        assert!(matches!(
            repository_of(br#"{"repository":{"full_name":" acme/web"}}"#),
            Err(DeliveryError::BadRepository(..))
        ));
    }

    #[test]
    fn deep_nesting_is_refused_even_in_ignored_fields() {
        let deep = |n: usize| format!("{{\"x\":{}{}}}", "[".repeat(n), "]".repeat(n));
        assert!(repository_of(deep(MAX_NESTING - 1).as_bytes()).is_ok());
        assert!(matches!(
            repository_of(deep(MAX_NESTING).as_bytes()),
            Err(DeliveryError::Refused(_))
        ));
        assert!(matches!(
            repository_of(deep(100_000).as_bytes()),
            Err(DeliveryError::Refused(_))
        ));
        // Brackets inside strings, escaped quotes included, are text.
        let text = format!("{{\"x\":\"\\\"{}\"}}", "[".repeat(1000));
        assert_eq!(repository_of(text.as_bytes()), Ok(String::new()));
        assert!(matches!(
            repository_of(b"{\"x\":\"\xff\"}"),
            Err(DeliveryError::NotJson(_))
        ));
    }

    #[test]
    fn headers_fall_back_and_are_named() {
        let only_coarse = |n: &str| (n == "x-gitea-event").then_some(&b"push"[..]);
        assert_eq!(
            first_header(&only_coarse, &EVENT_HEADERS, 64),
            Ok("push".into())
        );
        let none = |_: &str| None;
        assert_eq!(
            first_header(&none, &DELIVERY_HEADERS, 128),
            Err(DeliveryError::MissingHeader("X-Forgejo-Delivery"))
        );
        let spaced = |n: &str| (n == "x-forgejo-delivery").then_some(&b"a b"[..]);
        assert_eq!(
            first_header(&spaced, &DELIVERY_HEADERS, 128),
            Err(DeliveryError::InvalidHeader("X-Forgejo-Delivery"))
        );
    }
}
