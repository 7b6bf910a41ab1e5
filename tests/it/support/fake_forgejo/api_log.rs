//! The fake's call log in the format of `../shared/tools/forgejo_api_check.py` (one JSON
//! object a line: `seq`, `time`, `ts`, `method`, `path`, `query`, `body`, `status`,
//! `user`, `ms`), and the check that every call a test made is an operation of
//! Forgejo's own OpenAPI definition with the parameters and body it declares.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::FakeForgejo;
use super::routes::lock;

/// The checker, beside the repository (`../shared/tools/`).
fn checker() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/forgejo_api_check.py")
}

impl FakeForgejo {
    /// Writes every call so far to `path`, one JSON object a line.
    pub fn write_call_log(&self, path: &Path) {
        let calls = lock(&self.shared.calls).clone();
        let first = calls.first().map(|c| c.at);
        let mut out = String::new();
        for (seq, c) in calls.iter().enumerate() {
            let mut query = Map::new();
            for (k, v) in &c.query {
                query.insert(k.clone(), Value::String(v.clone()));
            }
            let ms = first.map_or(0, |f| c.at.duration_since(f).as_millis() as u64);
            let line = json!({
                "seq": seq + 1,
                "time": ms as f64 / 1000.0,
                "ts": ms,
                "method": c.method,
                "path": format!("/api/v1{}", c.path),
                "query": query,
                "body": c.body,
                "status": c.status,
                "user": self.shared.bot_login,
                "ms": 0,
            });
            out.push_str(&line.to_string());
            out.push('\n');
        }
        std::fs::write(path, out).expect("write the call log");
    }

    /// Runs the Forgejo API checker over every call so far; panics with its report
    /// when a call is not in Forgejo's OpenAPI definition (path, method, query
    /// parameters, body), or when the checker cannot run.
    pub fn assert_calls_match_openapi(&self) {
        let dir = tempfile::tempdir().expect("a temp dir");
        let log = dir.path().join("forgejo-calls.jsonl");
        self.write_call_log(&log);
        let script = checker();
        assert!(
            script.exists(),
            "the Forgejo API checker is missing: {}",
            script.display()
        );
        let out = std::process::Command::new("python3")
            .arg(&script)
            .arg("--calls")
            .arg(&log)
            .output()
            .expect("python3 runs (it is needed for the Forgejo API check)");
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "Forgejo API check failed:\n{report}");
    }
}
