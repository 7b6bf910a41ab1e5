//! Fuzz harnesses: the checks each `fuzz/` target runs on one input, kept in the
//! library so that `cargo fuzz` (fuzz/fuzz_targets/*.rs are one-line wrappers) and the
//! regression test below (every file under `fuzz/regressions/<target>/`) run exactly the
//! same code. Each function panics when a property fails; none does IO.

use bytes::Bytes;
use secrecy::SecretString;

use crate::core::command;
use crate::core::normalize::normalize;
use crate::ingest::delivery::{DeliveryError, canonical_repo, repository_of};
use crate::ingest::signature::{
    SIGNATURE_HEADERS, is_form, sign_sha256, signature_from_headers, signed_bytes, verify,
};

/// Splits `bytes` at the first `\n`: (before, after); all of it before when none.
fn split_line(bytes: &[u8]) -> (&[u8], &[u8]) {
    match bytes.iter().position(|b| *b == b'\n') {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => (bytes, &[]),
    }
}

/// Target `signature`. Byte 0 picks the signature header (and, with its top bit, a
/// form body); the bytes up to the first `\n` are the header value; the rest is the
/// body. Parsing, verification and the unverified repository probe never panic; an
/// arbitrary tag verifies only when it really is the HMAC under a configured secret;
/// what we sign always verifies, and a foreign key's signature never does.
pub fn signature(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (value, body) = split_line(rest);
    let header = SIGNATURE_HEADERS[usize::from(selector) % SIGNATURE_HEADERS.len()];
    let form = selector & 0x80 != 0;
    let secrets = [SecretString::from("old"), SecretString::from("new")];

    let signed = signed_bytes(Bytes::copy_from_slice(body), form);
    let _ = repository_of(&signed);
    if let Ok(tag) = signature_from_headers(|n| (n == header).then_some(value))
        && verify(signed.clone(), &tag, &secrets).is_ok()
    {
        let good = [sign_sha256(b"old", &signed), sign_sha256(b"new", &signed)];
        let given = value.trim_ascii().to_ascii_lowercase();
        assert!(good.iter().any(|h| given.ends_with(h.as_bytes())));
    }

    let good = sign_sha256(b"new", &signed);
    let value = if header == "x-hub-signature-256" {
        format!("sha256={good}")
    } else {
        good
    };
    let tag = signature_from_headers(|n| (n == header).then_some(value.as_bytes()))
        .expect("our own signature parses");
    assert!(verify(signed.clone(), &tag, &secrets).is_ok());
    let foreign = sign_sha256(b"attacker", &signed);
    let tag =
        signature_from_headers(|n| (n == "x-forgejo-signature").then_some(foreign.as_bytes()))
            .expect("hex parses");
    assert!(verify(signed, &tag, &secrets).is_err());
}

/// Target `form`. `is_form` and `signed_bytes` never panic on arbitrary content types
/// and form bodies; a JSON body passes through untouched; any UTF-8 payload
/// form-encoded the way Forgejo sends it decodes back to exactly its bytes.
pub fn form(data: &[u8]) {
    let _ = signed_bytes(Bytes::copy_from_slice(data), true);
    assert_eq!(&signed_bytes(Bytes::copy_from_slice(data), false)[..], data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = is_form(Some(text));
        let body: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", text)
            .finish();
        assert_eq!(&signed_bytes(Bytes::from(body), true)[..], text.as_bytes());
    }
}

/// Target `json_probe`: the hand-written validating scanner
/// (`ingest::delivery::repository_of`) against serde_json. It never accepts what
/// serde_json refuses (or what is not UTF-8, or not an object); it refuses valid JSON
/// objects only as [`DeliveryError::Refused`] (a policy, not a syntax error); the
/// name it returns is the canonical form of the one serde_json finds at
/// `repository.full_name` or `run.repository.full_name`, and it refuses a name as not
/// canonical only when that name is indeed not.
pub fn json_probe(data: &[u8]) {
    let ours = repository_of(data);
    let object = data.trim_ascii_start().first() == Some(&b'{');
    let valid = std::str::from_utf8(data).is_ok()
        && serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok()
        && object;
    match ours {
        Ok(name) => {
            assert!(valid, "accepted a body serde_json refuses: {name:?}");
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
                let at = |path: &str| value.pointer(path).and_then(|v| v.as_str());
                let expected = at("/repository/full_name")
                    .or_else(|| at("/run/repository/full_name"))
                    .unwrap_or_default();
                assert_eq!(Ok(name), canonical_repo(expected));
            }
        }
        Err(DeliveryError::BadRepository(e, _)) => {
            assert!(valid, "called a body serde_json refuses a bad name: {e}");
            // serde_json skips a number too large for an f64 (`-1e400`) when it only
            // checks the syntax, but refuses it when it builds a `Value`: such a body is
            // valid JSON whose names cannot be read back here.
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
                let at = |path: &str| value.pointer(path).and_then(|v| v.as_str());
                let named = at("/repository/full_name")
                    .or_else(|| at("/run/repository/full_name"))
                    .unwrap_or_default();
                assert!(canonical_repo(named).is_err(), "refused {named:?} ({e})");
            }
        }
        Err(DeliveryError::Refused(_)) => {}
        Err(e) => assert!(!valid, "called a valid JSON object not JSON: {e}"),
    }
}

/// Event types the `normalize` target picks from: every type `normalize` routes, and
/// a few it ignores.
const EVENTS: [&str; 18] = [
    "pull_request",
    "pull_request_sync",
    "pull_request_label",
    "pull_request_review_approved",
    "pull_request_review_rejected",
    "pull_request_review_comment",
    "pull_request_comment",
    "issue_comment",
    "issues",
    "issue_label",
    "action_run_success",
    "action_run_failure",
    "action_run_recover",
    "status",
    "push",
    "create",
    "release",
    "",
];

/// Target `normalize`. Byte 0 picks an event type from [`EVENTS`] (or, for large
/// values, the bytes up to the first `\n` as a free-form name); the rest is the body.
/// `core::normalize::normalize` never panics, whatever the JSON.
pub fn normalize_payload(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let i = usize::from(selector);
    if i < EVENTS.len() * 8 {
        let _ = normalize(EVENTS[i % EVENTS.len()], rest);
    } else {
        let (name, body) = split_line(rest);
        let _ = normalize(&String::from_utf8_lossy(name), body);
    }
}

/// Target `command`. The comment-command parser never panics, and finds no more
/// commands than there are lines starting with `/shepherd`.
pub fn commands(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let found = command::parse(&text);
    let lines = text
        .lines()
        .filter(|l| l.trim_start().to_ascii_lowercase().starts_with("/shepherd"))
        .count();
    assert!(
        found.len() <= lines,
        "{} commands from {lines} lines",
        found.len()
    );
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// One target's checks.
    type Harness = fn(&[u8]);

    /// Every input kept under `fuzz/regressions/<target>/` (crashes the fuzzer found,
    /// and seeds worth keeping) still passes its target's checks.
    #[test]
    fn fuzz_regressions_still_pass() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
        let targets: [(&str, Harness); 5] = [
            ("signature", super::signature),
            ("form", super::form),
            ("normalize", super::normalize_payload),
            ("command", super::commands),
            ("json_probe", super::json_probe),
        ];
        let mut seen = 0;
        for (name, check) in targets {
            let dir = root.join(name);
            let entries =
                std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            for entry in entries {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "md") {
                    continue;
                }
                let data = std::fs::read(&path).unwrap();
                let outcome = std::panic::catch_unwind(|| check(&data));
                assert!(outcome.is_ok(), "{} fails again", path.display());
                seen += 1;
            }
        }
        assert!(seen > 0, "no regression inputs under {}", root.display());
    }
}
