//! The Epic of a work item, for the `cleveragents-v2` prompt: an open issue that the
//! work's issue blocks (Forgejo issue dependencies: an Epic depends on its parts),
//! one labelled as an epic first. The work's issue is the `issue-impl` issue, or the
//! issues a PR closes.

use futures_util::future::join_all;

use super::context::{AgentContext, MAX_LINKED_BODY_BYTES, issue_context};
use crate::forgejo::{ForgejoClient, Issue};

/// Reads the Epic of the issues `numbers` into `ctx.epic`; a failed read is noted in
/// `ctx.unavailable["epic"]`.
pub async fn gather(forgejo: &ForgejoClient, repo: &str, numbers: &[u64], ctx: &mut AgentContext) {
    let reads = join_all(numbers.iter().map(|n| forgejo.issue_blocks(repo, *n))).await;
    let mut found: Vec<Issue> = Vec::new();
    let mut failed = Vec::new();
    for (n, read) in numbers.iter().zip(reads) {
        match read {
            Ok(list) => found.extend(list),
            Err(e) => failed.push(format!("#{n}: {e}")),
        }
    }
    if !failed.is_empty() {
        ctx.unavailable.insert("epic".into(), failed.join("; "));
    }
    if let Some(epic) = pick(&found) {
        ctx.epic = Some(issue_context(
            epic,
            forgejo.base_url(),
            repo,
            MAX_LINKED_BODY_BYTES,
        ));
    }
}

/// The Epic among `blocked`: the first open issue labelled as an epic (a label whose
/// name holds "epic"), else the first open issue; never a PR.
pub fn pick(blocked: &[Issue]) -> Option<&Issue> {
    let open = || {
        blocked
            .iter()
            .filter(|i| i.state == "open" && i.pull_request.is_none())
    };
    open()
        .find(|i| {
            i.labels
                .iter()
                .any(|l| l.name.to_lowercase().contains("epic"))
        })
        .or_else(|| open().next())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forgejo::{IssuePullRef, Label};

    fn issue(n: u64, state: &str, label: Option<&str>) -> Issue {
        Issue {
            number: n,
            state: state.into(),
            labels: label
                .map(|l| Label {
                    name: l.into(),
                    ..Label::default()
                })
                .into_iter()
                .collect(),
            ..Issue::default()
        }
    }

    #[test]
    fn an_open_epic_labelled_issue_comes_first() {
        let mut pr = issue(1, "open", Some("Type/Epic"));
        pr.pull_request = Some(IssuePullRef::default());
        let list = [
            pr,
            issue(2, "closed", Some("epic")),
            issue(3, "open", None),
            issue(4, "open", Some("Kind/Epic")),
        ];
        assert_eq!(pick(&list).map(|i| i.number), Some(4));
        assert_eq!(pick(&list[..3]).map(|i| i.number), Some(3));
        assert_eq!(pick(&list[..2]).map(|i| i.number), None);
    }
}
