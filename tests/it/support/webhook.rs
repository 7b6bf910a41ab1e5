//! Signed deliveries for tests, built by the library's own Forgejo request builder
//! (`shepherd::app::send::ForgejoRequest`), so tests send what Forgejo sends.

use shepherd::app::send::ContentType;
use shepherd::app::send::ForgejoRequest;

use super::TEST_SECRET;

/// A delivery signed with the default test secret, JSON content type.
pub fn signed(payload: &[u8], event_type: &str, delivery: &str) -> ForgejoRequest {
    ForgejoRequest::new(
        payload,
        event_type,
        delivery,
        TEST_SECRET.as_bytes(),
        ContentType::Json,
    )
}

/// POSTs a prepared request.
pub async fn post(
    client: &reqwest::Client,
    url: &str,
    request: &ForgejoRequest,
) -> reqwest::Response {
    let mut builder = client.post(url);
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    builder
        .body(request.body.clone())
        .send()
        .await
        .expect("the webhook POST gets an answer")
}

/// Removes a header (by case-insensitive name) from a prepared request.
pub fn without(mut request: ForgejoRequest, names: &[&str]) -> ForgejoRequest {
    request
        .headers
        .retain(|(n, _)| !names.iter().any(|x| n.eq_ignore_ascii_case(x)));
    request
}

/// Sets a header (replacing every header of that name).
pub fn with(request: ForgejoRequest, name: &str, value: &str) -> ForgejoRequest {
    let mut request = without(request, &[name]);
    request.headers.push((name.to_owned(), value.to_owned()));
    request
}

/// A fresh v4 UUID, as Forgejo uses for delivery ids.
pub fn new_delivery() -> String {
    uuid::Uuid::new_v4().to_string()
}
