//! The gauge `shepherd_budget_remaining_usd{scope}` (issue 28): for every dollar cap
//! the policy sets — the instance's (from `[defaults]`), each known repository's owner's
//! and each known repository's, daily and monthly — the dollars left today (this month)
//! after what the ledger counted; negative past the cap. Sampled by the workers' gauge
//! loop; a policy without caps costs no Redis call. The per-PR and per-run caps are
//! not sampled (one series per PR would not be bounded).

use std::collections::BTreeMap;

use super::Context;
use crate::core::ids::RepoName;
use crate::core::policy::{Policy, PolicyFile};
use crate::core::usage::{MICROS_PER_USD, usd_to_micros};
use crate::store::ledger::{self, Scope, Window};
use crate::store::repos;

/// One capped scope: the gauge's label, the ledger scope and window, the cap (µ$).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capped {
    /// The `scope` label.
    pub label: String,
    /// The ledger scope.
    pub scope: Scope,
    /// Day or month.
    pub window: Window,
    /// The cap in micro-dollars.
    pub cap_micros: u64,
}

/// The daily and monthly caps of one scope that are set, labelled `<name>-daily…`.
fn both(
    out: &mut BTreeMap<String, Capped>,
    name: &str,
    suffix: &str,
    scope: &Scope,
    caps: [f64; 2],
) {
    for (window, word, cap) in [
        (Window::Day, "daily", caps[0]),
        (Window::Month, "monthly", caps[1]),
    ] {
        let cap_micros = usd_to_micros(cap);
        if cap_micros > 0 {
            let label = format!("{name}-{word}{suffix}");
            out.entry(label.clone()).or_insert(Capped {
                label,
                scope: scope.clone(),
                window,
                cap_micros,
            });
        }
    }
}

/// Every dollar cap `file` sets for the instance and for `repos` and their owners
/// (an owner's cap as its first repository's policy resolves it), by label.
pub fn capped(file: &PolicyFile, repos: &[RepoName]) -> Vec<Capped> {
    let mut out = BTreeMap::new();
    let d: &Policy = &file.defaults;
    both(
        &mut out,
        "instance",
        "",
        &Scope::Instance,
        [d.budget_instance_daily_usd, d.budget_instance_monthly_usd],
    );
    for repo in repos {
        let p = file.for_repo(repo);
        let owner = repo.owner().to_owned();
        both(
            &mut out,
            "org",
            &format!(":{owner}"),
            &Scope::Org(owner.clone()),
            [p.budget_org_daily_usd, p.budget_org_monthly_usd],
        );
        both(
            &mut out,
            "repo",
            &format!(":{repo}"),
            &Scope::Repo(repo.clone()),
            [p.budget_repo_daily_usd, p.budget_repo_monthly_usd],
        );
    }
    out.into_values().collect()
}

/// Whether the policy file sets any instance, organisation or repository dollar cap
/// (in `[defaults]` or an override).
fn any_cap(file: &PolicyFile) -> bool {
    let d = &file.defaults;
    let set = |c: f64| c > 0.0;
    [
        d.budget_instance_daily_usd,
        d.budget_instance_monthly_usd,
        d.budget_org_daily_usd,
        d.budget_org_monthly_usd,
        d.budget_repo_daily_usd,
        d.budget_repo_monthly_usd,
    ]
    .into_iter()
    .any(set)
        || file.repos.values().any(|o| {
            [
                o.budget_instance_daily_usd,
                o.budget_instance_monthly_usd,
                o.budget_org_daily_usd,
                o.budget_org_monthly_usd,
                o.budget_repo_daily_usd,
                o.budget_repo_monthly_usd,
            ]
            .into_iter()
            .any(|c| c.is_some_and(set))
        })
}

/// Sets the gauge for every capped scope (a Redis failure leaves the last value).
pub async fn sample(ctx: &Context, now_ms: i64) {
    let policy = &ctx.policy;
    if !any_cap(policy) {
        return;
    }
    let mut conn = ctx.store.conn();
    let keys = ctx.store.keys();
    let Ok(known) = repos::known(&mut conn, keys).await else {
        return;
    };
    let known: Vec<RepoName> = known.iter().filter_map(|r| r.parse().ok()).collect();
    let gauge = &ctx.metrics.budget_remaining_usd;
    for c in capped(policy, &known) {
        if let Ok(spent) = ledger::spent(&mut conn, keys, &c.scope, c.window, now_ms).await {
            let left = c.cap_micros as f64 - spent.usd_micros as f64;
            gauge
                .with_label_values(&[c.label.as_str()])
                .set(left / MICROS_PER_USD as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_caps_that_are_set_are_sampled() {
        let mut file = PolicyFile::default();
        let repos: Vec<RepoName> = vec!["acme/a".parse().unwrap(), "acme/b".parse().unwrap()];
        assert!(capped(&file, &repos).is_empty(), "no cap, no series");
        assert!(!any_cap(&file));
        file.defaults.budget_instance_monthly_usd = 100.0;
        file.defaults.budget_repo_daily_usd = 2.5;
        file.defaults.budget_org_daily_usd = 10.0;
        assert!(any_cap(&file));
        let labels: Vec<(String, u64)> = capped(&file, &repos)
            .into_iter()
            .map(|c| (c.label, c.cap_micros))
            .collect();
        assert_eq!(
            labels,
            [
                ("instance-monthly".to_owned(), 100_000_000),
                ("org-daily:acme".to_owned(), 10_000_000),
                ("repo-daily:acme/a".to_owned(), 2_500_000),
                ("repo-daily:acme/b".to_owned(), 2_500_000),
            ]
        );
    }
}
