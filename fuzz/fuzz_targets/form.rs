//! Form decoding: `is_form` on arbitrary content types and `signed_bytes` on arbitrary
//! form bodies never panic, and a payload form-encoded the way Forgejo sends it decodes
//! back to exactly the same bytes (when it is UTF-8, as JSON always is).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shepherd::ingest::signature::{is_form, signed_bytes};

fuzz_target!(|data: &[u8]| {
    // Arbitrary bytes as a form body.
    let _ = signed_bytes(Bytes::copy_from_slice(data), true);
    assert_eq!(&signed_bytes(Bytes::copy_from_slice(data), false)[..], data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = is_form(Some(text));
        // Arbitrary text as a payload, encoded like Forgejo's form delivery.
        let body: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", text)
            .finish();
        assert_eq!(&signed_bytes(Bytes::from(body), true)[..], text.as_bytes());
    }
});
