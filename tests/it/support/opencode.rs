//! The real opencode CLI for tests: where its binary is, and a project directory with
//! an `opencode.json` whose custom provider `stub` points at a [`ModelStub`], and an
//! agent file, so the agent runs offline against the stub. Reusable by any test that
//! runs agents: [`OpencodeProject::command_line`] is a `SHEPHERD_AGENT_COMMAND`.
//!
//! opencode keeps its state (sessions database, snapshots, logs) under `HOME` and the
//! `XDG_*` directories: every project gets its own, inside its temp dir, so tests
//! never share or leave state. `OPENCODE_DISABLE_MODELS_FETCH`, `…_AUTOUPDATE` and
//! `…_DEFAULT_PLUGINS` and `--pure` keep it from reaching the network (models.dev, the
//! npm registry for plugins); the OpenAI-compatible provider is built into the binary,
//! so nothing is fetched at first use.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::model_stub::{ModelStub, PRICE};

/// The opencode-ai version `scripts/test` installs and these tests are written for.
pub const OPENCODE_VERSION: &str = "1.18.33";

/// The provider id of the stub in `opencode.json` (models are `stub/<id>`).
pub const PROVIDER: &str = "stub";

/// The folder a sandboxed opencode must still read: the install's root (the folder
/// holding `node_modules`, which the `.bin` link and the platform binary live in), or
/// the binary's own folder. `SHEPHERD_AGENT_SANDBOX_READABLE` names it, for a checkout
/// under `/tmp` (the sandbox's `/tmp` is private and empty).
pub fn opencode_root() -> PathBuf {
    let bin = opencode_bin();
    let bin = std::fs::canonicalize(&bin).unwrap_or(bin);
    bin.ancestors()
        .find(|d| d.file_name().is_some_and(|n| n == "node_modules"))
        .and_then(Path::parent)
        .or_else(|| bin.parent())
        .expect("the opencode binary has a folder")
        .to_owned()
}

/// The agent file the tests use, named as Shepherd's default agent of every kind.
pub const AGENT: &str = "implementation-worker";

/// The opencode binary: `SHEPHERD_TEST_OPENCODE` when set, else the one
/// `scripts/test` installs into `.tools/opencode`, else `opencode` on `PATH`. Panics,
/// naming how to install it, when there is none (no silent skips).
pub fn opencode_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SHEPHERD_TEST_OPENCODE") {
        return PathBuf::from(p);
    }
    let local =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/opencode/node_modules/.bin/opencode");
    if local.exists() {
        return local;
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("opencode"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.exists());
    on_path.unwrap_or_else(|| {
        panic!(
            "the opencode CLI is missing: run scripts/test (it installs opencode-ai@{OPENCODE_VERSION} \
             into .tools/opencode), or `npm install --prefix .tools/opencode opencode-ai@{OPENCODE_VERSION}`, \
             or set SHEPHERD_TEST_OPENCODE"
        )
    })
}

/// A temp project for opencode: config, agent file and private state directories.
pub struct OpencodeProject {
    /// Holds everything; removed on drop.
    dir: tempfile::TempDir,
}

impl OpencodeProject {
    /// Writes `opencode.json` (the `stub` provider at `stub`'s URL offering
    /// `models`, each priced at [`PRICE`], bash allowed without asking) and
    /// `.opencode/agents/<AGENT>.md`.
    pub fn prepare(stub: &ModelStub, models: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let project = dir.path().join("project");
        std::fs::create_dir_all(project.join(".opencode/agents")).expect("agents dir");
        std::fs::create_dir_all(dir.path().join("home")).expect("home dir");
        let model_table: serde_json::Map<String, serde_json::Value> = models
            .iter()
            .map(|m| {
                let cost: serde_json::Map<String, serde_json::Value> = PRICE
                    .iter()
                    .map(|(k, p)| ((*k).to_owned(), json!(p)))
                    .collect();
                ((*m).to_owned(), json!({ "name": m, "cost": cost }))
            })
            .collect();
        let config = json!({
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Stub model server",
                    "options": { "baseURL": stub.base_url(), "apiKey": "not-a-secret" },
                    "models": model_table,
                }
            },
            "permission": { "bash": "allow", "edit": "allow", "external_directory": "allow" },
            "autoupdate": false,
            "share": "disabled",
        });
        std::fs::write(
            project.join("opencode.json"),
            serde_json::to_string_pretty(&config).expect("json"),
        )
        .expect("write opencode.json");
        std::fs::write(
            project.join(format!(".opencode/agents/{AGENT}.md")),
            AGENT_FILE,
        )
        .expect("write the agent file");
        Self { dir }
    }

    /// The folder holding the project and opencode's private state (`HOME`).
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The project directory (`opencode.json`, `.opencode/`).
    pub fn project(&self) -> PathBuf {
        self.dir.path().join("project")
    }

    /// `VAR=value` pairs that give opencode this project's config and private state
    /// and keep it offline, whatever its working directory; and the test's `PATH`, so
    /// the stub's shell command finds its tools (`curl`, `git`, …) even when the runner
    /// gives the agent a cleared environment.
    pub fn env(&self) -> Vec<(String, String)> {
        let home = self.dir.path().join("home");
        let h = home.display();
        let project = self.project();
        let p = project.display();
        [
            ("HOME", format!("{h}")),
            ("XDG_CONFIG_HOME", format!("{h}/.config")),
            ("XDG_DATA_HOME", format!("{h}/.local/share")),
            ("XDG_CACHE_HOME", format!("{h}/.cache")),
            ("XDG_STATE_HOME", format!("{h}/.local/state")),
            ("OPENCODE_CONFIG", format!("{p}/opencode.json")),
            ("OPENCODE_CONFIG_DIR", format!("{p}/.opencode")),
            ("OPENCODE_DISABLE_MODELS_FETCH", "1".into()),
            ("OPENCODE_DISABLE_AUTOUPDATE", "1".into()),
            ("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain(
            std::env::var("PATH")
                .ok()
                .filter(|p| !p.contains(char::is_whitespace))
                .map(|p| ("PATH".to_owned(), p)),
        )
        .collect()
    }

    /// The agent command line for `SHEPHERD_AGENT_COMMAND`: `env VAR=… opencode run
    /// --pure --agent {agent} -m stub/{model}`, the prompt on stdin (opencode reads the
    /// message from stdin when none is given as an argument). Paths are temp paths
    /// without spaces, so a shell-like split gives the same words.
    pub fn command_line(&self) -> String {
        let mut words = vec!["env".to_owned()];
        words.extend(self.env().into_iter().map(|(k, v)| format!("{k}={v}")));
        words.push(opencode_bin().display().to_string());
        words.extend(
            ["run", "--pure", "--agent", "{agent}", "-m"]
                .into_iter()
                .map(str::to_owned),
        );
        words.push(format!("{PROVIDER}/{{model}}"));
        assert!(
            words.iter().all(|w| !w.contains(char::is_whitespace)),
            "a word with whitespace cannot survive the split: {words:?}"
        );
        words.join(" ")
    }

    /// [`Self::command_line`] with `--format json`: opencode prints its events (steps
    /// with their tokens and cost, tool calls) as JSON lines, which the runner meters
    /// with `SHEPHERD_AGENT_USAGE=opencode-json`.
    pub fn json_command_line(&self) -> String {
        format!("{} --format json", self.command_line())
    }

    /// The command of [`Self::command_line`] with `agent` and `model` filled in, for a
    /// test that runs opencode itself.
    pub fn command(&self, agent: &str, model: &str) -> tokio::process::Command {
        let line = self
            .command_line()
            .replace("{agent}", agent)
            .replace("{model}", model);
        let mut words = line.split(' ');
        let mut cmd = tokio::process::Command::new(words.next().expect("a program"));
        cmd.args(words);
        cmd.kill_on_drop(true);
        cmd
    }
}

/// The implementation worker's agent file: one work item, one task, then exit.
const AGENT_FILE: &str = "\
---
description: Receives a single work item from Shepherd, performs one task and exits.
mode: primary
permission:
  bash: allow
  edit: allow
---
You are an implementation worker. You receive one work item in the prompt: its
parameter lines and its named sections. Perform exactly the task it describes, then
exit. Never loop, never sleep, never look for more work. Shepherd owns the claim.
";
