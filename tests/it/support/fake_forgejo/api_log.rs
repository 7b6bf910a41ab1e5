//! The check that every call a test made to the fake Forgejo is an operation of
//! Forgejo's own OpenAPI definition with the parameters and body it declares
//! ([`crate::support::openapi`], against `tests/data/forgejo-openapi-v15.json`).

use super::FakeForgejo;
use super::routes::lock;
use crate::support::openapi::{ApiCall, spec};

impl FakeForgejo {
    /// Checks every call so far against Forgejo's OpenAPI definition (operation, path
    /// and query parameters, body); panics with the report, listing every violation,
    /// when a call does not conform, or when no call was made at all.
    pub fn assert_calls_match_openapi(&self) {
        let calls = lock(&self.shared.calls).clone();
        assert!(
            !calls.is_empty(),
            "Forgejo API check: the fake saw no call, so there is nothing to check"
        );
        let paths: Vec<String> = calls.iter().map(|c| format!("/api/v1{}", c.path)).collect();
        let api: Vec<ApiCall<'_>> = calls
            .iter()
            .zip(&paths)
            .map(|(c, path)| ApiCall {
                method: &c.method,
                path,
                query: &c.query,
                body: &c.body,
            })
            .collect();
        let (ok, report) = spec().report(&api);
        assert!(ok, "Forgejo API check failed:\n{report}");
    }
}
