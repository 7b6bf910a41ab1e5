//! The read behind `Observe(Legacy)` (`core::legacy`): the comments of a PR or issue
//! that hold an `ESCALATION-STATE` block, and the timeline events of a claim label.
//! The executor runs it when a record is first seen; `shepherd rebuild` runs it for a
//! folded record whose read never answered. The core decides what counts (authors,
//! format); this side only bounds what goes onto the events stream.

use crate::core::event::Event;
use crate::core::ids::{Login, RepoName, Scope};
use crate::core::legacy::{
    COMMENTS_KEPT, LABEL_EVENTS_KEPT, LabelEvent, LegacyComment, MAX_STATE_COMMENT_BYTES,
    STATE_START,
};
use crate::forgejo::{ForgejoClient, ForgejoError};

/// What to read.
#[derive(Debug, Clone)]
pub struct LegacyRead<'a> {
    /// Repository.
    pub repo: &'a RepoName,
    /// PR or issue.
    pub scope: Scope,
    /// Index.
    pub number: u64,
    /// Read the comments.
    pub comments: bool,
    /// Read the timeline for this label's events.
    pub claim_label: Option<&'a str>,
}

/// Reads what `what` names and returns the `ObservedLegacy` event, stamped `at_ms`.
pub async fn read(
    forgejo: &ForgejoClient,
    what: &LegacyRead<'_>,
    at_ms: impl Fn() -> i64,
) -> Result<Event, ForgejoError> {
    let repo = what.repo.as_str();
    let mut comments = Vec::new();
    if what.comments {
        let all = forgejo.list_comments(repo, what.number).await?;
        // Oversized bodies are dropped here (the core would ignore them anyway), so
        // a flood of huge comments never reaches the events stream.
        comments = all
            .into_iter()
            .filter(|c| c.body.len() <= MAX_STATE_COMMENT_BYTES && c.body.contains(STATE_START))
            .map(|c| LegacyComment {
                author: c.user.login.parse::<Login>().ok(),
                body: c.body,
                at_ms: c.created_at.map_or(0, |t| t.timestamp_millis()),
            })
            .collect();
        let skip = comments.len().saturating_sub(COMMENTS_KEPT);
        comments.drain(..skip);
    }
    let mut claim_events = Vec::new();
    if let Some(label) = what.claim_label {
        claim_events = forgejo
            .timeline(repo, what.number)
            .await?
            .into_iter()
            .filter_map(|t| {
                let added = t.label_change(label)?;
                Some(LabelEvent {
                    added,
                    by: t.user.login.parse::<Login>().ok(),
                    at_ms: t.created_at.map_or(0, |c| c.timestamp_millis()),
                })
            })
            .collect();
        let skip = claim_events.len().saturating_sub(LABEL_EVENTS_KEPT);
        claim_events.drain(..skip);
    }
    Ok(Event::ObservedLegacy {
        repo: what.repo.clone(),
        scope: what.scope,
        number: what.number,
        comments,
        claim_events,
        at_ms: at_ms(),
    })
}
