//! `shepherd send`: sign a payload file and POST it the way Forgejo delivers webhooks
//! (forgejo-facts.md §1): the same headers under all four brand names, both
//! `X-Hub-Signature` variants, JSON or form encoding. [`ForgejoRequest`] builds the
//! request without sending it, so tests and the benchmark produce byte-identical
//! deliveries.

use std::time::Duration;

use std::io::Write as _;

use anyhow::Context;
use secrecy::ExposeSecret;

pub use crate::cli::ContentType;
use crate::cli::SendArgs;
use crate::ingest::signature::{sign_sha1, sign_sha256};

/// A webhook request exactly as Forgejo would send it.
#[derive(Debug, Clone)]
pub struct ForgejoRequest {
    /// Header name/value pairs, in the order Forgejo adds them.
    pub headers: Vec<(String, String)>,
    /// The request body: the JSON itself, or `payload=<url-encoded JSON>`.
    pub body: Vec<u8>,
}

impl ForgejoRequest {
    /// Signs `payload` with `secret` (an empty secret gives Forgejo's empty signature
    /// headers) for event type `event_type` and delivery id `delivery`.
    pub fn new(
        payload: &[u8],
        event_type: &str,
        delivery: &str,
        secret: &[u8],
        content_type: ContentType,
    ) -> Self {
        let (sha256, sha1) = if secret.is_empty() {
            (String::new(), String::new())
        } else {
            (sign_sha256(secret, payload), sign_sha1(secret, payload))
        };
        let event = coarse_event(event_type);
        let mut headers = Vec::with_capacity(20);
        for brand in ["Forgejo", "Gitea", "Gogs"] {
            headers.push((format!("X-{brand}-Delivery"), delivery.to_owned()));
            headers.push((format!("X-{brand}-Event"), event.to_owned()));
            headers.push((format!("X-{brand}-Event-Type"), event_type.to_owned()));
            headers.push((format!("X-{brand}-Signature"), sha256.clone()));
        }
        headers.push(("X-GitHub-Delivery".into(), delivery.to_owned()));
        headers.push(("X-GitHub-Event".into(), event.to_owned()));
        headers.push(("X-GitHub-Event-Type".into(), event_type.to_owned()));
        headers.push(("X-Hub-Signature".into(), format!("sha1={sha1}")));
        headers.push(("X-Hub-Signature-256".into(), format!("sha256={sha256}")));
        let (content_type, body) = match content_type {
            ContentType::Json => ("application/json", payload.to_vec()),
            ContentType::Form => {
                let text = String::from_utf8_lossy(payload);
                let body = form_urlencoded::Serializer::new(String::new())
                    .append_pair("payload", &text)
                    .finish();
                ("application/x-www-form-urlencoded", body.into_bytes())
            }
        };
        headers.push(("Content-Type".into(), content_type.into()));
        Self { headers, body }
    }
}

/// `X-Forgejo-Event` for a fine-grained event type: `HookEventType.Event()` in
/// Forgejo's `modules/webhook/type.go` (forgejo-facts.md §2). Unknown types map to
/// themselves.
pub fn coarse_event(event_type: &str) -> &str {
    match event_type {
        "issues" | "issue_assign" | "issue_label" | "issue_milestone" => "issues",
        "issue_comment" | "pull_request_comment" => "issue_comment",
        "pull_request"
        | "pull_request_assign"
        | "pull_request_label"
        | "pull_request_milestone"
        | "pull_request_sync"
        | "pull_request_review_request" => "pull_request",
        "pull_request_review_approved" => "pull_request_approved",
        "pull_request_review_rejected" => "pull_request_rejected",
        "pull_request_review_comment" => "pull_request_comment",
        "package" | "schedule" | "workflow_dispatch" => "",
        other => other,
    }
}

/// Runs `shepherd send`: prints the response status and body; fails on a non-2xx.
pub async fn run(args: &SendArgs) -> anyhow::Result<()> {
    let payload = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let delivery = args
        .delivery
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let request = ForgejoRequest::new(
        &payload,
        &args.event_type,
        &delivery,
        args.secret.expose_secret().as_bytes(),
        args.content_type,
    );
    let client = reqwest::Client::builder()
        // Forgejo's DELIVER_TIMEOUT default.
        .timeout(Duration::from_secs(5))
        .user_agent("Go-http-client/1.1")
        .build()
        .context("cannot build the HTTP client")?;
    let mut builder = client.post(&args.url);
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    let response = builder
        .body(request.body)
        .send()
        .await
        .with_context(|| format!("POST {} failed", args.url))?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    // A reader that stops early (`| grep -q`, `| head`) closes the pipe: that is not a
    // failure of the delivery, so a broken pipe ends the output quietly.
    let mut out = std::io::stdout().lock();
    let printed =
        writeln!(out, "delivery {delivery}: {status}").and_then(|()| writeln!(out, "{body}"));
    match printed {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(e).context("writing the answer to stdout");
        }
        _ => {}
    }
    anyhow::ensure!(status.is_success(), "the receiver answered {status}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(r: &'a ForgejoRequest, name: &str) -> &'a str {
        r.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {name}"))
    }

    #[test]
    fn signs_like_forgejo() {
        let r = ForgejoRequest::new(
            b"{}",
            "pull_request_review_comment",
            "d-1",
            b"s",
            ContentType::Json,
        );
        let sig = sign_sha256(b"s", b"{}");
        assert_eq!(header(&r, "X-Forgejo-Signature"), sig);
        assert_eq!(header(&r, "X-Gogs-Signature"), sig);
        assert_eq!(header(&r, "X-Hub-Signature-256"), format!("sha256={sig}"));
        assert_eq!(
            header(&r, "X-Hub-Signature"),
            format!("sha1={}", sign_sha1(b"s", b"{}"))
        );
        assert_eq!(header(&r, "X-Forgejo-Event"), "pull_request_comment");
        assert_eq!(
            header(&r, "X-GitHub-Event-Type"),
            "pull_request_review_comment"
        );
        assert_eq!(r.headers.len(), 18);
    }

    #[test]
    fn form_and_empty_secret() {
        let r = ForgejoRequest::new(br#"{"a": "b&c"}"#, "push", "d", b"", ContentType::Form);
        assert_eq!(header(&r, "X-Forgejo-Signature"), "");
        assert_eq!(header(&r, "X-Hub-Signature"), "sha1=");
        assert_eq!(
            header(&r, "Content-Type"),
            "application/x-www-form-urlencoded"
        );
        assert_eq!(r.body, b"payload=%7B%22a%22%3A+%22b%26c%22%7D");
    }
}
