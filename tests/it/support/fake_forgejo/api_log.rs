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
        self.assert_calls_match_openapi_but(|_| false);
    }

    /// [`Self::assert_calls_match_openapi`] for a fake playing Forgejo v16: the two
    /// job routes v15's definition lacks are left out of the check (a `GET` of
    /// `…/actions/runs/{run_id}/jobs` or `…/actions/jobs/{job_id}/logs`: Forgejo
    /// v16.0/forgejo 4695780d `routers/api/v1/api.go:891,897`, as `src/forgejo/actions.rs`
    /// cites them); every other call is checked.
    pub fn assert_calls_match_openapi_v16(&self) {
        self.assert_calls_match_openapi_but(|c| {
            let segs: Vec<&str> = c.path.split('/').filter(|s| !s.is_empty()).collect();
            c.method == "GET"
                && matches!(
                    segs.as_slice(),
                    ["repos", _, _, "actions", "runs", _, "jobs"]
                        | ["repos", _, _, "actions", "jobs", _, "logs"]
                )
        });
    }

    /// The check, leaving out the calls `skip` selects.
    fn assert_calls_match_openapi_but(&self, skip: impl Fn(&super::faults::Call) -> bool) {
        let calls: Vec<_> = lock(&self.shared.calls)
            .iter()
            .filter(|c| !skip(c))
            .cloned()
            .collect();
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
