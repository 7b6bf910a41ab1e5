//! Labels: repository labels (list, create), issue labels added by name and removed by
//! id, and a [`LabelCache`] per repository that maps names to ids and creates a missing
//! label exactly once, even when many tasks ask at the same time. Forgejo does not
//! check label-name uniqueness on creation, so looking the name up first matters.

use std::collections::HashMap;
use std::sync::Arc;

use reqwest::Method;
use serde_json::json;
use tracing::instrument;

use super::client::repo_path;
use super::types::Label;
use super::{ForgejoClient, ForgejoError};

/// Name → label of one repository, loaded lazily from the API.
#[derive(Debug, Default)]
pub struct LabelCache {
    /// `None` until the first load; the async lock serializes load-and-create so a
    /// label is created once.
    labels: tokio::sync::Mutex<Option<HashMap<String, Label>>>,
}

impl LabelCache {
    /// The label named `name`, created (with [`default_color`]) when the repository has
    /// none by that name.
    pub async fn get_or_create(
        &self,
        client: &ForgejoClient,
        repo: &str,
        name: &str,
    ) -> Result<Label, ForgejoError> {
        let mut all = self.get_or_create_all(client, repo, &[name]).await?;
        Ok(all.remove(0))
    }

    /// The labels named `names`, in order, each created when the repository has none
    /// by that name; one listing of the repository's labels serves every name that
    /// was not cached (issue 17: two new labels cost one listing, not two).
    pub async fn get_or_create_all(
        &self,
        client: &ForgejoClient,
        repo: &str,
        names: &[&str],
    ) -> Result<Vec<Label>, ForgejoError> {
        let mut guard = self.labels.lock().await;
        if names
            .iter()
            .any(|n| guard.as_ref().is_none_or(|m| !m.contains_key(*n)))
        {
            *guard = Some(load(client, repo).await?);
        }
        let map = guard.get_or_insert_with(HashMap::new);
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            if let Some(l) = map.get(*name) {
                out.push(l.clone());
                continue;
            }
            let created = client
                .create_label(repo, name, default_color(name), "Managed by Shepherd")
                .await?;
            map.insert((*name).to_owned(), created.clone());
            out.push(created);
        }
        Ok(out)
    }

    /// The label named `name` if the repository has one (reloading once on a miss).
    pub async fn get(
        &self,
        client: &ForgejoClient,
        repo: &str,
        name: &str,
    ) -> Result<Option<Label>, ForgejoError> {
        let mut guard = self.labels.lock().await;
        if guard.as_ref().is_none_or(|m| !m.contains_key(name)) {
            *guard = Some(load(client, repo).await?);
        }
        Ok(guard.as_ref().and_then(|m| m.get(name).cloned()))
    }

    /// Forgets everything; the next lookup reloads from the API.
    pub async fn invalidate(&self) {
        *self.labels.lock().await = None;
    }
}

async fn load(client: &ForgejoClient, repo: &str) -> Result<HashMap<String, Label>, ForgejoError> {
    let labels = client.list_repo_labels(repo).await?;
    let mut map = HashMap::with_capacity(labels.len());
    for l in labels {
        // With duplicate names, keep the oldest (lowest id) so the choice is stable.
        map.entry(l.name.clone())
            .and_modify(|old: &mut Label| {
                if l.id < old.id {
                    *old = l.clone();
                }
            })
            .or_insert(l);
    }
    Ok(map)
}

/// A colour for a label Shepherd creates: fixed for the labels people look at, a stable
/// pick from a palette otherwise.
pub fn default_color(name: &str) -> &'static str {
    const PALETTE: [&str; 6] = ["1d76db", "0e8a16", "5319e7", "fbca04", "006b75", "b60205"];
    match name {
        "needs feedback" => "d93f0b",
        n if n.starts_with("auto/claimed") => "c5def5",
        n if n.starts_with("auto/last-attempt-tier") => "bfd4f2",
        n => {
            let h = n
                .bytes()
                .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
            PALETTE[h % PALETTE.len()]
        }
    }
}

impl ForgejoClient {
    /// The label cache of `repo`, shared by every clone of this client.
    pub fn label_cache(&self, repo: &str) -> Arc<LabelCache> {
        let mut caches = self.inner.labels.lock().unwrap_or_else(|p| p.into_inner());
        caches.entry(repo.to_owned()).or_default().clone()
    }

    /// Every label of a repository, all pages.
    #[instrument(skip_all, fields(repo = %repo))]
    pub async fn list_repo_labels(&self, repo: &str) -> Result<Vec<Label>, ForgejoError> {
        let path = format!("{}/labels", repo_path(repo)?);
        self.get_all(&path, &[]).await
    }

    /// `POST /repos/{o}/{r}/labels`. Does not check for an existing label of that name
    /// (Forgejo does not either): use [`ForgejoClient::ensure_label`].
    #[instrument(skip_all, fields(repo = %repo, label = %name))]
    pub async fn create_label(
        &self,
        repo: &str,
        name: &str,
        color: &str,
        description: &str,
    ) -> Result<Label, ForgejoError> {
        let path = format!("{}/labels", repo_path(repo)?);
        let body = json!({ "name": name, "color": format!("#{}", color.trim_start_matches('#')), "description": description });
        self.send_json(Method::POST, &path, &body).await
    }

    /// The repository label named `name`, created once if missing.
    pub async fn ensure_label(&self, repo: &str, name: &str) -> Result<Label, ForgejoError> {
        self.label_cache(repo).get_or_create(self, repo, name).await
    }

    /// Adds labels to an issue or PR by name (creating missing repository labels
    /// first) and returns the labels afterwards. When a label was deleted
    /// behind the cache's back, Forgejo silently ignores its name: the cache is then
    /// reloaded and the labels added once more.
    #[instrument(skip_all, fields(repo = %repo, number = number))]
    pub async fn add_labels(
        &self,
        repo: &str,
        number: u64,
        names: &[&str],
    ) -> Result<Vec<Label>, ForgejoError> {
        let path = format!("{}/issues/{number}/labels", repo_path(repo)?);
        let mut attempt = 0;
        loop {
            self.label_cache(repo)
                .get_or_create_all(self, repo, names)
                .await?;
            let after: Vec<Label> = self
                .send_json(Method::POST, &path, &json!({ "labels": names }))
                .await?;
            let missing = names.iter().any(|n| !after.iter().any(|l| l.name == *n));
            if !missing || attempt > 0 {
                return Ok(after);
            }
            attempt += 1;
            self.label_cache(repo).invalidate().await;
        }
    }

    /// Removes one label from an issue or PR, by the id resolved from the cache (the
    /// only form v11/v12 accept). Returns false when the repository has no such label.
    #[instrument(skip_all, fields(repo = %repo, number = number, label = %name))]
    pub async fn remove_label(
        &self,
        repo: &str,
        number: u64,
        name: &str,
    ) -> Result<bool, ForgejoError> {
        let Some(label) = self.label_cache(repo).get(self, repo, name).await? else {
            return Ok(false);
        };
        let path = format!("{}/issues/{number}/labels/{}", repo_path(repo)?, label.id);
        match self.send(Method::DELETE, &path, &[], None).await {
            Ok(_) => Ok(true),
            // 422: the label vanished since it was cached.
            Err(ForgejoError::Status { code: 422, .. }) => {
                self.label_cache(repo).invalidate().await;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}
