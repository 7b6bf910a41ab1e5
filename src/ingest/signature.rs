//! Webhook signatures, both ways.
//!
//! Verifying: Forgejo signs the bare JSON payload with HMAC-SHA256 keyed by the webhook
//! secret and sends lowercase hex in `X-Forgejo-Signature` (also `X-Gitea-Signature`,
//! and `sha256=<hex>` in `X-Hub-Signature-256`); see forgejo-facts.md §1.2. With the
//! form content type the body is `payload=<url-encoded JSON>` but the signature still
//! covers the bare JSON, so the signed bytes are the URL-decoded `payload` field.
//! [`verify`] is the only way to obtain a [`Verified`] payload, and the queue only
//! accepts deliveries built from one: nothing unauthenticated can be enqueued.
//!
//! Signing ([`sign_sha256`], [`sign_sha1`]) exists for `shepherd send`, the tests and
//! the benchmark, which must produce exactly what Forgejo produces.

use bytes::Bytes;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Signature headers in the order they are consulted; the first one present decides.
/// The value of the last one carries a `sha256=` prefix.
pub const SIGNATURE_HEADERS: [&str; 3] = [
    "x-forgejo-signature",
    "x-gitea-signature",
    "x-hub-signature-256",
];

/// Length in bytes of an HMAC-SHA256 tag.
const TAG_LEN: usize = 32;

/// Why a delivery's signature was refused. Every variant answers 401; the distinction
/// is for logs and tests, never shown in detail to the sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// None of the signature headers is present.
    #[error("missing signature header")]
    Missing,
    /// The header is present but empty (Forgejo sends that for a webhook without secret).
    #[error("empty signature")]
    Empty,
    /// The header is not 64 hex digits (after the `sha256=` prefix where it applies).
    #[error("signature is not hex HMAC-SHA256")]
    Malformed,
    /// No configured secret produces this signature.
    #[error("signature does not match")]
    Mismatch,
}

/// A payload whose HMAC matched one of the configured secrets. Only [`verify`] makes
/// one, so holding a `Verified` proves the bytes came from someone knowing a secret.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The signed bytes: the JSON payload exactly as Forgejo signed it.
    payload: Bytes,
}

impl Verified {
    /// The verified JSON payload bytes (never re-serialised).
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }
}

/// Whether a `Content-Type` header value is the form encoding Forgejo can use.
pub fn is_form(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.split(';').next().is_some_and(|m| {
            m.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
    })
}

/// The bytes Forgejo signed: the body itself, or for a form body the URL-decoded
/// `payload` field (empty when the field is absent, which then fails verification).
pub fn signed_bytes(body: Bytes, form: bool) -> Bytes {
    if !form {
        return body;
    }
    form_urlencoded::parse(&body)
        .find(|(k, _)| k == "payload")
        .map(|(_, v)| Bytes::from(v.into_owned()))
        .unwrap_or_default()
}

/// Picks the signature from the first present header of [`SIGNATURE_HEADERS`] and
/// decodes it to the raw tag. `get` looks a header up by lower-case name.
pub fn signature_from_headers<'a>(
    get: impl Fn(&str) -> Option<&'a [u8]>,
) -> Result<[u8; TAG_LEN], SignatureError> {
    let (name, raw) = SIGNATURE_HEADERS
        .iter()
        .find_map(|name| get(name).map(|v| (*name, v)))
        .ok_or(SignatureError::Missing)?;
    let hex_part = if name == "x-hub-signature-256" {
        raw.strip_prefix(b"sha256=").unwrap_or(raw)
    } else {
        raw
    };
    let hex_part = hex_part.trim_ascii();
    if hex_part.is_empty() {
        return Err(SignatureError::Empty);
    }
    let mut tag = [0u8; TAG_LEN];
    hex::decode_to_slice(hex_part, &mut tag).map_err(|_| SignatureError::Malformed)?;
    Ok(tag)
}

/// Checks `tag` against the HMAC-SHA256 of `payload` under each secret, in constant
/// time per comparison (`Mac::verify_slice`). Tries every secret (rotation).
pub fn verify(
    payload: Bytes,
    tag: &[u8; TAG_LEN],
    secrets: &[SecretString],
) -> Result<Verified, SignatureError> {
    for secret in secrets {
        let mut mac = HmacSha256::new_from_slice(secret.expose_secret().as_bytes())
            .expect("HMAC accepts keys of any length");
        mac.update(&payload);
        if mac.verify_slice(tag).is_ok() {
            return Ok(Verified { payload });
        }
    }
    Err(SignatureError::Mismatch)
}

/// Lowercase hex HMAC-SHA256 of `payload` under `secret`, as in `X-Forgejo-Signature`.
pub fn sign_sha256(secret: &[u8], payload: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(payload);
    hex::encode(mac.finalize().into_bytes())
}

/// Lowercase hex HMAC-SHA1 of `payload` under `secret`, as in `X-Hub-Signature`
/// (after `sha1=`). HMAC per RFC 2104 over `sha1_smol`, which the crate already
/// depends on through `redis`.
pub fn sign_sha1(secret: &[u8], payload: &[u8]) -> String {
    const BLOCK: usize = 64;
    let mut key = [0u8; BLOCK];
    if secret.len() > BLOCK {
        key[..20].copy_from_slice(&sha1_smol::Sha1::from(secret).digest().bytes());
    } else {
        key[..secret.len()].copy_from_slice(secret);
    }
    let mut inner = sha1_smol::Sha1::new();
    inner.update(&key.map(|b| b ^ 0x36));
    inner.update(payload);
    let mut outer = sha1_smol::Sha1::new();
    outer.update(&key.map(|b| b ^ 0x5c));
    outer.update(&inner.digest().bytes());
    outer.digest().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(list: &[&str]) -> Vec<SecretString> {
        list.iter().map(|s| SecretString::from(*s)).collect()
    }

    #[test]
    fn known_vectors() {
        // RFC 4231 test case 2 and RFC 2202 test case 2.
        assert_eq!(
            sign_sha256(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            sign_sha1(b"Jefe", b"what do ya want for nothing?"),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
        // Keys longer than a block are hashed first (RFC 2202 test case 6).
        assert_eq!(
            sign_sha1(
                &[0xaa; 80],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            ),
            "aa4ae5e15272d00e95705637ce8a3b55ed402112"
        );
    }

    #[test]
    fn verifies_with_any_secret_and_each_header() {
        let body = Bytes::from_static(br#"{"a":1}"#);
        let sig = sign_sha256(b"new", &body);
        let prefixed = format!("sha256={sig}");
        for (header, value) in [
            ("x-forgejo-signature", sig.as_str()),
            ("x-gitea-signature", sig.as_str()),
            ("x-hub-signature-256", prefixed.as_str()),
        ] {
            let tag = signature_from_headers(|n| (n == header).then_some(value.as_bytes()))
                .expect("decodes");
            verify(body.clone(), &tag, &secrets(&["old", "new"])).expect("second secret");
            assert_eq!(
                verify(body.clone(), &tag, &secrets(&["old"])).unwrap_err(),
                SignatureError::Mismatch
            );
        }
    }

    #[test]
    fn refuses_missing_empty_and_malformed() {
        assert_eq!(
            signature_from_headers(|_| None).unwrap_err(),
            SignatureError::Missing
        );
        assert_eq!(
            signature_from_headers(|n| (n == "x-hub-signature-256").then_some(b"sha256=")),
            Err(SignatureError::Empty)
        );
        assert_eq!(
            signature_from_headers(|n| (n == "x-forgejo-signature").then_some(b"zz")),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn form_signs_the_decoded_payload() {
        let form = Bytes::from_static(b"payload=%7B%22a%22%3A+1%7D&x=y");
        assert!(is_form(Some(
            "application/x-www-form-urlencoded; charset=utf-8"
        )));
        assert!(!is_form(Some("application/json")));
        assert_eq!(&signed_bytes(form, true)[..], br#"{"a": 1}"#);
        assert!(signed_bytes(Bytes::from_static(b"x=1"), true).is_empty());
    }
}
