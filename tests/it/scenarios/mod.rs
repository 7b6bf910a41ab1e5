//! End-to-end scenarios (issue 4, (1)–(8)): signed webhooks through the real ingest,
//! the real `shepherd run` binary, a real redis-server and the fake Forgejo. Every
//! Forgejo write and every dispatch is asserted, including that nothing happened twice.

mod authors;
mod budget;
mod dispatch;
mod faults;
mod hostile;
mod legacy;
mod locks;
pub(crate) mod merge;
mod store;
mod work;

use crate::support::fake_forgejo::{Call, FakeForgejo};

/// The repository every scenario uses.
pub const REPO: &str = "acme/widgets";
/// Marker that makes a PR a bot PR (the policy default).
pub const BOT_MARKER: &str = "Automated by CleverAgents Bot";

/// The Forgejo writes (non-GET calls) so far, as `METHOD path` lines.
pub fn writes(fake: &FakeForgejo) -> Vec<String> {
    fake.writes()
        .iter()
        .map(|c: &Call| format!("{} {}", c.method, c.path))
        .collect()
}

/// Label names in the bodies of `POST …/issues/{n}/labels` calls.
pub fn labels_added(fake: &FakeForgejo, n: u64) -> Vec<String> {
    fake.calls("POST", &format!("/repos/{REPO}/issues/{n}/labels"))
        .iter()
        .flat_map(|c| {
            c.body["labels"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
        })
        .collect()
}
