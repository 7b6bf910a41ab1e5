//! The pure heart of Shepherd (DESIGN §2): identities, events, the per-PR record,
//! `step`/`decide`, effects, policy, the command parser and comment texts.
//! No IO and no async here: no tokio, redis, reqwest or actix.
#![warn(missing_docs)]

pub mod command;
pub mod effect;
pub mod event;
pub mod ids;
pub mod machine;
pub mod normalize;
pub mod observation;
pub mod payload;
pub mod policy;
pub mod record;
pub mod texts;

#[cfg(test)]
mod tests {
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
            // This test itself reads files; it is the one allowed use.
            if file.ends_with("core/mod.rs") {
                continue;
            }
            for word in forbidden {
                assert!(!code.contains(word), "{} uses {word}", file.display());
            }
        }
    }
}
