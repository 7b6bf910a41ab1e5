//! The core stays pure (DESIGN §2, STYLE "src/core"): no adapter crate, no async and no
//! filesystem or network IO in any file under `src/core`. Lives outside `src/core` so the
//! check's own file reading is not counted against it.

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The core imports no adapter and has no async code (DESIGN §2).
#[test]
fn core_stays_pure() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/core");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 10, "found the core's files");
    let forbidden = [
        "tokio", "redis", "reqwest", "actix", "async fn", ".await", "std::fs", "std::net",
    ];
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for word in forbidden {
            assert!(!code.contains(word), "{} uses {word}", file.display());
        }
    }
}
