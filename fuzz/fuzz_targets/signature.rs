//! Signature headers and verification on arbitrary bytes.
//!
//! Input layout: byte 0 picks the header the value goes in (and whether the body is a
//! form), the bytes up to the first `\n` are the header value, the rest is the body.
//! Checked: header parsing and verification never panic; the unverified repository
//! probe never panics; a body signed with a configured secret always verifies and a
//! body signed with another key never does.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use secrecy::SecretString;
use shepherd::ingest::delivery::repository_of;
use shepherd::ingest::signature::{
    SIGNATURE_HEADERS, sign_sha256, signature_from_headers, signed_bytes, verify,
};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (value, body) = match rest.iter().position(|b| *b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let header = SIGNATURE_HEADERS[usize::from(selector) % SIGNATURE_HEADERS.len()];
    let form = selector & 0x80 != 0;
    let secrets = [SecretString::from("old"), SecretString::from("new")];

    let signed = signed_bytes(Bytes::copy_from_slice(body), form);
    let _ = repository_of(&signed);
    if let Ok(tag) = signature_from_headers(|n| (n == header).then_some(value)) {
        // Arbitrary tags essentially never match; when they do, the HMAC really is right.
        if verify(signed.clone(), &tag, &secrets).is_ok() {
            let hex = [sign_sha256(b"old", &signed), sign_sha256(b"new", &signed)];
            assert!(hex.iter().any(|h| value.trim_ascii().ends_with(h.as_bytes())));
        }
    }

    // Round trip: what we sign, we accept, under every header spelling.
    let good = sign_sha256(b"new", &signed);
    let value = if header == "x-hub-signature-256" {
        format!("sha256={good}")
    } else {
        good
    };
    let tag = signature_from_headers(|n| (n == header).then_some(value.as_bytes()))
        .expect("our own signature parses");
    assert!(verify(signed.clone(), &tag, &secrets).is_ok());
    let wrong = sign_sha256(b"attacker", &signed);
    let tag = signature_from_headers(|n| (n == "x-forgejo-signature").then_some(wrong.as_bytes()))
        .expect("hex parses");
    assert!(verify(signed, &tag, &secrets).is_err());
});
