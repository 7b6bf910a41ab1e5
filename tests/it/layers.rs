//! The module graph has no cycles and points one way (issue 13, STYLE "Layout"):
//!
//! ```text
//! core ← store, forgejo ← worker ← agents ← ops ← ingest ← app ← main.rs
//! ```
//!
//! A module may import the modules to its left, never those to its right; `config`,
//! `telemetry` and `shutdown` are utilities anyone may import (they import only `core`
//! and each other); `cli` is imported only by `main.rs` and `app/`. The check reads the
//! `crate::…` paths of every file under `src/` (comments skipped), so a new import that
//! breaks the order fails here with the file and the path it used. Unit tests (from a
//! file's `#[cfg(test)]` on) may use any module.

use std::path::{Path, PathBuf};

/// The layers, lowest first; a module may import any module of a lower rank.
const LAYERS: &[(&str, u8)] = &[
    ("core", 0),
    ("store", 1),
    ("forgejo", 1),
    ("worker", 2),
    ("agents", 3),
    ("ops", 4),
    ("ingest", 5),
    ("fuzzing", 6),
    ("app", 6),
];

/// Imported by anyone; they themselves import only `core` and each other.
const UTILITIES: &[&str] = &["config", "telemetry", "shutdown"];

fn rank(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

/// The top-level module a file under `src/` belongs to (`main` for `src/main.rs`,
/// `lib` for `src/lib.rs`).
fn owner(relative: &Path) -> String {
    let first = relative.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_owned()
}

/// The top-level modules a source text names as `crate::X` (also inside
/// `crate::{X, Y::…}` groups), skipping `//` comments and the unit tests (everything
/// from the first `#[cfg(test)]` on: tests may use any module).
fn imports(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: split on commas at brace depth 0.
            let mut depth = 0usize;
            let mut name = String::new();
            let mut at_start = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if !name.is_empty() {
                            out.push(std::mem::take(&mut name));
                        }
                        at_start = true;
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 && at_start {
                    if c.is_alphanumeric() || c == '_' {
                        name.push(c);
                    } else if !name.is_empty() {
                        out.push(std::mem::take(&mut name));
                        at_start = false;
                    }
                }
            }
            if !name.is_empty() {
                out.push(name);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

/// Why `from` may not import `to`, or `None` when it may.
fn forbidden(from: &str, to: &str) -> Option<String> {
    if from == to {
        return None;
    }
    if to == "cli" {
        return (from != "app" && from != "main")
            .then(|| "only main.rs and app/ may import cli".to_owned());
    }
    if UTILITIES.contains(&from) {
        return (!UTILITIES.contains(&to) && to != "core")
            .then(|| format!("the utility {from} may import only core and utilities"));
    }
    if UTILITIES.contains(&to) || from == "main" || from == "lib" {
        return None;
    }
    match (rank(from), rank(to)) {
        (Some(f), Some(t)) if t < f => None,
        (Some(_), Some(_)) => Some(format!("{from} sits below {to}")),
        _ => Some(format!(
            "{from} → {to}: a module missing from the layer table"
        )),
    }
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each import of `files` (relative path, text) that breaks the order.
fn violations(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut bad = Vec::new();
    for (path, text) in files {
        let from = owner(path);
        for to in imports(text) {
            if let Some(why) = forbidden(&from, &to) {
                bad.push(format!("{}: crate::{to}: {why}", path.display()));
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

#[test]
fn imports_point_one_way() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    sources(&root, &mut paths);
    let files: Vec<(PathBuf, String)> = paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            (p.strip_prefix(&root).unwrap().to_path_buf(), text)
        })
        .collect();
    assert!(files.len() > 50, "found the crate's files");
    let total: usize = files.iter().map(|(_, t)| imports(t).len()).sum();
    assert!(total > 200, "found the crate's imports ({total})");
    let bad = violations(&files);
    assert!(
        bad.is_empty(),
        "imports against the layer order:\n{}",
        bad.join("\n")
    );
}

/// The check itself bites: each kind of bad import is found, grouped or not, and
/// comments and allowed imports are not.
#[test]
fn the_layer_check_finds_each_kind_of_bad_import() {
    let case = |path: &str, text: &str| vec![(PathBuf::from(path), text.to_owned())];
    let found = |path: &str, text: &str| violations(&case(path, text));
    assert_eq!(found("store/x.rs", "use crate::ingest::Delivery;").len(), 1);
    assert_eq!(
        found("worker/x.rs", "let o = crate::ops::Ops::new();").len(),
        1
    );
    assert_eq!(
        found(
            "core/x.rs",
            "use crate::{core::ids::RepoName, store::Keys};"
        )
        .len(),
        1
    );
    assert_eq!(
        found("ops/x.rs", "use crate::{core, ingest::{a, b}};").len(),
        1
    );
    assert_eq!(found("ingest/x.rs", "use crate::cli::Command;").len(), 1);
    assert_eq!(found("config.rs", "use crate::store::Keys;").len(), 1);
    assert_eq!(found("core/x.rs", "// use crate::store::Keys;").len(), 0);
    assert_eq!(
        found("app/x.rs", "use crate::{cli, ingest, ops, worker};").len(),
        0
    );
    assert_eq!(
        found(
            "ingest/x.rs",
            "use crate::{ops::Ops, store::{Keys, Store}};"
        )
        .len(),
        0
    );
    assert_eq!(found("main.rs", "use crate::cli::Cli;").len(), 0);
    assert_eq!(
        found(
            "ingest/x.rs",
            "fn f() {}\n#[cfg(test)]\nmod tests { use crate::app; }"
        )
        .len(),
        0
    );
}
