//! Which webhook secrets may sign a delivery: the global `SHEPHERD_WEBHOOK_SECRETS`, or,
//! for a repository or organisation with a `[webhooks."…"]` table in the policy file,
//! that table's secrets *instead* (so a secret leaked from one repository's webhook
//! cannot forge deliveries for another that has its own).
//!
//! The repository is read from the payload before the signature is checked; that
//! unverified name is used only to pick the candidate secrets. A delivery claiming
//! repository A verifies only under A's secrets, so lying about the name gains nothing.

use std::collections::HashMap;

use secrecy::{ExposeSecret, SecretString};

use crate::config::ConfigError;
use crate::core::policy::PolicyFile;

/// The webhook secrets of the process, resolved once at start.
#[derive(Debug, Clone, Default)]
pub struct WebhookSecrets {
    /// `SHEPHERD_WEBHOOK_SECRETS`: for every repository without its own table.
    global: Vec<SecretString>,
    /// Lower-cased `owner/name` or `owner` → that scope's secrets.
    scoped: HashMap<String, Vec<SecretString>>,
}

impl WebhookSecrets {
    /// Resolves the global secrets and the policy file's `[webhooks]` tables, reading
    /// each `secret_env` through `env`. Fails naming the table and the variable when a
    /// variable is unset or empty, or when no secret is configured at all (an
    /// unauthenticated endpoint would accept forged deliveries).
    pub fn resolve(
        global: &[SecretString],
        policy: &PolicyFile,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut scoped = HashMap::new();
        for (key, table) in &policy.webhooks {
            let mut secrets: Vec<SecretString> = table.secret.iter().map(|s| s.0.clone()).collect();
            for name in &table.secret_env {
                match env(name).filter(|v| !v.is_empty()) {
                    Some(value) => secrets.push(SecretString::from(value)),
                    None => {
                        return Err(ConfigError {
                            setting: "SHEPHERD_CONFIG",
                            reason: format!(
                                "webhooks.\"{key}\".secret_env: environment variable {name} is not set or empty"
                            ),
                        });
                    }
                }
            }
            scoped.insert(key.to_lowercase(), secrets);
        }
        if global.is_empty() && scoped.is_empty() {
            return Err(ConfigError {
                setting: "SHEPHERD_WEBHOOK_SECRETS",
                reason: "at least one secret is required to accept webhooks (or [webhooks] tables in the policy file)".into(),
            });
        }
        Ok(Self {
            global: global.to_vec(),
            scoped,
        })
    }

    /// The secrets a delivery naming `repo` (canonical `owner/name` from
    /// `delivery::repository_of`, any case; `""` when the payload names none) must be
    /// signed with: the repository's own, else its
    /// organisation's, else the global ones.
    pub fn candidates(&self, repo: &str) -> &[SecretString] {
        if self.scoped.is_empty() || repo.is_empty() {
            return &self.global;
        }
        let repo = repo.to_lowercase();
        let owner = repo.split('/').next().unwrap_or_default();
        self.scoped
            .get(&repo)
            .or_else(|| self.scoped.get(owner))
            .map_or(&self.global, Vec::as_slice)
    }

    /// Every configured secret value (for tests that check nothing leaks).
    pub fn all(&self) -> impl Iterator<Item = &str> {
        self.global
            .iter()
            .chain(self.scoped.values().flatten())
            .map(|s| s.expose_secret())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &[SecretString]) -> Vec<&str> {
        s.iter().map(|s| s.expose_secret()).collect()
    }

    #[test]
    fn repo_beats_org_beats_global() {
        let policy = PolicyFile::from_toml(
            r#"
            [webhooks."Acme"]
            secret_env = "ORG"
            [webhooks."acme/Web"]
            secret_env = ["WEB1", "WEB2"]
            secret = "inline"
            "#,
        )
        .unwrap();
        let env = |n: &str| Some(format!("value-of-{n}"));
        let s = WebhookSecrets::resolve(&[SecretString::from("g")], &policy, env).unwrap();
        assert_eq!(
            names(s.candidates("ACME/web")),
            ["inline", "value-of-WEB1", "value-of-WEB2"]
        );
        assert_eq!(names(s.candidates("acme/api")), ["value-of-ORG"]);
        assert_eq!(names(s.candidates("other/x")), ["g"]);
        assert_eq!(names(s.candidates("")), ["g"]);
        assert!(!format!("{s:?}").contains("value-of"));
    }

    #[test]
    fn unset_variables_and_no_secret_at_all_fail_by_name() {
        let policy = PolicyFile::from_toml("[webhooks.\"a/b\"]\nsecret_env = \"NOPE\"\n").unwrap();
        let e = WebhookSecrets::resolve(&[], &policy, |_| None).unwrap_err();
        assert!(e.to_string().contains("NOPE"), "{e}");
        assert!(e.to_string().contains("webhooks.\"a/b\""), "{e}");
        let e = WebhookSecrets::resolve(&[], &PolicyFile::default(), |_| None).unwrap_err();
        assert_eq!(e.setting, "SHEPHERD_WEBHOOK_SECRETS");
        // Scoped secrets alone are enough; repositories without a table then get none.
        let s = WebhookSecrets::resolve(&[], &policy, |_| Some("x".into())).unwrap();
        assert!(s.candidates("c/d").is_empty());
    }
}
