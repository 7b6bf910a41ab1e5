//! Deployment files checked without a Docker engine: every YAML file under `docker/`
//! parses; every `SHEPHERD_*` variable they (and docs/operations.md) mention exists in
//! the real binary's `--help`; `docker/.env.example` lists every variable the binary
//! knows; every command the Dockerfile, compose file and Kubernetes manifests run is a
//! real subcommand (`shepherd <args…> --help` succeeds); KEDA watches the streams and
//! groups of src/store/keys.rs; the image's health probe works against a real socket;
//! and `docker/redis.conf` loads in a real `redis-server` with AOF and fsync always.
//! The agent runner's deployment: the Dockerfile's `agents` target (bwrap, git, Node.js,
//! the pinned opencode, two non-root users), the opt-in compose service and the
//! Kubernetes pods (none gets a webhook secret or the admin token; the sandbox's
//! security context), KEDA on the dispatch stream's `agents` group; the token scopes
//! the guide names are Forgejo's; and scripts/test, run against fake installers.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_yaml_ng::Value;
use shepherd::store::keys::{AGENTS_GROUP, EXECUTORS_GROUP, Keys, WORKERS_GROUP};

use crate::support::poll_until_named;
use crate::support::redis::{RedisServer, free_port};
use crate::support::shepherd::Shepherd;

/// The repository root (where Cargo.toml is).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every file under `dir` (relative to the root), recursively, sorted.
fn files_under(rel: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("list {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join(rel), &mut out);
    out.sort();
    out
}

fn is_yaml(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

/// Every YAML document of a file (`---`-separated), with merge keys (`<<:`) applied.
fn yaml_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read YAML file");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| {
            let mut value = <Value as serde::Deserialize>::deserialize(doc)
                .unwrap_or_else(|e| panic!("{} does not parse as YAML: {e}", path.display()));
            value
                .apply_merge()
                .unwrap_or_else(|e| panic!("{}: bad merge key: {e}", path.display()));
            value
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// Runs the real `shepherd` binary with no `SHEPHERD_*` variables inherited (so help
/// output shows no values from the test's environment).
fn shepherd(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shepherd"));
    cmd.args(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SHEPHERD_") {
            cmd.env_remove(name);
        }
    }
    cmd.output().expect("run the shepherd binary")
}

/// `shepherd <args…> --help` must succeed: the subcommand and its flags exist.
fn assert_runs_with_help(args: &[String], origin: &str) {
    let mut full: Vec<&str> = args.iter().map(String::as_str).collect();
    full.push("--help");
    let out = shepherd(&full);
    assert!(
        out.status.success(),
        "{origin}: `shepherd {}` is not a valid command line:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The subcommands listed under "Commands:" in `shepherd --help` (without `help`).
fn subcommands() -> Vec<String> {
    let out = shepherd(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).expect("UTF-8 help");
    let section = help
        .split("Commands:")
        .nth(1)
        .expect("help has a Commands section");
    let mut subs = Vec::new();
    for line in section.lines().skip(1) {
        if line.trim().is_empty() {
            break;
        }
        // Command lines are indented by two spaces; wrapped descriptions by more.
        if let Some(rest) = line.strip_prefix("  ")
            && !rest.starts_with(' ')
        {
            let name = rest.split_whitespace().next().expect("a command name");
            if name != "help" {
                subs.push(name.to_owned());
            }
        }
    }
    assert!(
        subs.len() >= 9,
        "expected serve, work, run and the tools: {subs:?}"
    );
    subs
}

/// Every `SHEPHERD_*` name mentioned in `text`.
fn env_names(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while let Some(pos) = text[i..].find("SHEPHERD_") {
        let start = i + pos;
        let preceded_by_word =
            start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start + "SHEPHERD_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_uppercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        let name = &text[start..end];
        if !preceded_by_word && name.len() > "SHEPHERD_".len() && !name.ends_with('_') {
            names.insert(name.to_owned());
        }
        i = end;
    }
    names
}

/// Every `SHEPHERD_*` variable the binary knows: those in the help of the root command
/// and of every subcommand (clap prints `[env: NAME=…]` for each).
fn known_env_vars() -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    let mut helps = vec![shepherd(&["--help"])];
    for sub in subcommands() {
        helps.push(shepherd(&[&sub, "--help"]));
    }
    for out in helps {
        assert!(out.status.success());
        let help = String::from_utf8(out.stdout).expect("UTF-8 help");
        for line in help.lines() {
            if let Some(at) = line.find("[env: ") {
                all.extend(env_names(&line[at..]));
            }
        }
    }
    assert!(all.contains("SHEPHERD_REDIS_URL") && all.contains("SHEPHERD_CONSUMER"));
    all
}

/// [`known_env_vars`] plus the variables `shepherd agents` sets for its agents (the
/// operations guide documents both).
fn documented_env_vars() -> BTreeSet<String> {
    let mut all = known_env_vars();
    all.extend(
        shepherd::agents::workdir::AGENT_VARS
            .iter()
            .map(|v| (*v).to_owned()),
    );
    all.insert(shepherd::agents::checkout::TOKEN_VAR.to_owned());
    all.insert(shepherd::agents::workdir::REVIEW_FILE_VAR.to_owned());
    all
}

#[test]
fn every_yaml_file_in_docker_parses() {
    let yaml: Vec<PathBuf> = files_under("docker")
        .into_iter()
        .filter(|p| is_yaml(p))
        .collect();
    assert!(yaml.len() >= 8, "compose + k8s manifests: {yaml:?}");
    for path in &yaml {
        let docs = yaml_documents(path);
        assert!(!docs.is_empty(), "{} has no YAML document", path.display());
        if path.parent().is_some_and(|d| d.ends_with("k8s")) {
            for doc in &docs {
                for field in ["apiVersion", "kind"] {
                    assert!(
                        doc.get(field).and_then(Value::as_str).is_some(),
                        "{}: a document lacks {field}",
                        path.display()
                    );
                }
                if doc["kind"] != "Kustomization" {
                    assert!(
                        doc["metadata"]["name"].as_str().is_some(),
                        "{}: a {:?} has no metadata.name",
                        path.display(),
                        doc["kind"]
                    );
                }
            }
        }
    }
}

#[test]
fn kustomization_lists_every_manifest() {
    let kustomization = &yaml_documents(&root().join("docker/k8s/kustomization.yaml"))[0];
    let listed: BTreeSet<String> = kustomization["resources"]
        .as_sequence()
        .expect("resources list")
        .iter()
        .map(|r| r.as_str().expect("resource path").to_owned())
        .collect();
    let present: BTreeSet<String> = files_under("docker/k8s")
        .iter()
        .filter(|p| is_yaml(p))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|name| name != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present, "kustomization.yaml resources vs files");
}

#[test]
fn every_env_var_used_in_docker_and_docs_exists_in_the_binary() {
    let known = documented_env_vars();
    let mut sources: Vec<PathBuf> = files_under("docker");
    sources.push(root().join(".dockerignore"));
    sources.push(root().join("docs/operations.md"));
    let mut used = 0;
    for path in sources {
        let text = std::fs::read_to_string(&path).expect("read deployment file");
        for name in env_names(&text) {
            used += 1;
            assert!(
                known.contains(&name),
                "{} uses {name}, which `shepherd --help` does not know (known: {known:?})",
                path.display()
            );
        }
    }
    assert!(
        used > 20,
        "the deployment files configure Shepherd through SHEPHERD_* variables"
    );
}

#[test]
fn env_example_lists_every_variable_of_the_binary() {
    let text = read("docker/.env.example");
    let mut listed = BTreeMap::new();
    for line in text.lines() {
        let (commented, rest) = match line.strip_prefix('#') {
            Some(rest) => (true, rest.trim_start()),
            None => (false, line),
        };
        let Some((name, value)) = rest.split_once('=') else {
            continue;
        };
        if name.starts_with("SHEPHERD_") && !name.contains(' ') {
            if !commented {
                // An empty value counts as set and fails validation: comment it out.
                assert!(
                    !value.trim().is_empty(),
                    ".env.example sets {name} to empty"
                );
            }
            listed.insert(name.to_owned(), commented);
        }
    }
    let listed_names: BTreeSet<String> = listed.keys().cloned().collect();
    let known = known_env_vars();
    let missing: Vec<_> = known.difference(&listed_names).collect();
    let unknown: Vec<_> = listed_names.difference(&known).collect();
    assert!(missing.is_empty(), "docker/.env.example lacks {missing:?}");
    assert!(
        unknown.is_empty(),
        "docker/.env.example lists unknown {unknown:?}"
    );
    // compose.yaml needs these to run serve and work at all.
    for required in [
        "SHEPHERD_WEBHOOK_SECRETS",
        "SHEPHERD_FORGEJO_URL",
        "SHEPHERD_FORGEJO_TOKEN",
        "SHEPHERD_BOT_LOGIN",
    ] {
        assert_eq!(listed.get(required), Some(&false), "{required} must be set");
    }
    // Several workers share the env file: a fixed consumer name would collide.
    assert_eq!(listed.get("SHEPHERD_CONSUMER"), Some(&true));
}

/// The JSON-array instruction `name` of the Dockerfile (the last one counts).
fn dockerfile_exec_form(dockerfile: &str, name: &str) -> Vec<String> {
    let line = dockerfile
        .lines()
        .rfind(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("Dockerfile has no {name}"));
    let json = line[name.len()..].trim();
    serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("Dockerfile {name} is not exec form ({json}): {e}"))
}

#[test]
fn dockerfile_runs_a_real_subcommand_as_a_non_root_user() {
    let dockerfile = read("docker/Dockerfile");
    assert_eq!(
        dockerfile_exec_form(&dockerfile, "ENTRYPOINT"),
        ["shepherd"]
    );
    let cmd = dockerfile_exec_form(&dockerfile, "CMD");
    assert_eq!(cmd, ["run"], "the default is the single-process mode");
    assert_runs_with_help(&cmd, "Dockerfile CMD");
    let user = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("Dockerfile sets USER");
    assert!(
        !user.starts_with("0") && !user.starts_with("root"),
        "USER {user}"
    );
    assert!(dockerfile.contains("FROM rust:1.95-slim-bookworm AS build"));
    assert!(dockerfile.contains("HEALTHCHECK"));
    assert!(dockerfile.contains("/healthz"));
}

/// Sources the image build COPYs from the context, and the files they install.
fn dockerfile_copies(dockerfile: &str) -> Vec<(String, String)> {
    dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .filter(|l| !l.starts_with("--from"))
        .map(|l| {
            // Flags such as --chmod are not paths.
            let parts: Vec<&str> = l
                .split_whitespace()
                .filter(|p| !p.starts_with("--"))
                .collect();
            let (dest, sources) = parts.split_last().expect("COPY has a destination");
            (sources.join(" "), (*dest).to_owned())
        })
        .collect()
}

#[test]
fn build_context_holds_everything_the_build_reads() {
    let dockerfile = read("docker/Dockerfile");
    let ignore = read(".dockerignore");
    let admitted: Vec<&str> = ignore
        .lines()
        .filter_map(|l| l.strip_prefix('!'))
        .map(|l| l.trim_end_matches('/'))
        .collect();
    assert!(
        ignore.lines().any(|l| l.trim() == "*"),
        ".dockerignore starts from nothing"
    );
    for (sources, _) in dockerfile_copies(&dockerfile) {
        for source in sources.split_whitespace() {
            let source = source.trim_end_matches('/');
            assert!(root().join(source).exists(), "COPY {source}: no such file");
            assert!(
                admitted
                    .iter()
                    .any(|a| source == *a || source.starts_with(&format!("{a}/"))),
                "COPY {source}, but .dockerignore keeps it out of the context"
            );
        }
    }
    // The manifest must not need anything else the build stage lacks: a build script,
    // workspace members or path dependencies would each need their own COPY.
    let manifest: toml::Table = toml::from_str(&read("Cargo.toml")).expect("Cargo.toml");
    assert!(
        !root().join("build.rs").exists() && manifest["package"].get("build").is_none(),
        "a build script exists: COPY it in docker/Dockerfile and admit it in .dockerignore"
    );
    assert!(
        manifest.get("workspace").is_none(),
        "Cargo.toml became a workspace: docker/Dockerfile must COPY every member"
    );
    for section in ["dependencies", "build-dependencies"] {
        for (name, spec) in manifest
            .get(section)
            .and_then(|d| d.as_table())
            .into_iter()
            .flatten()
        {
            assert!(
                spec.get("path").is_none(),
                "{name} is a path dependency: docker/Dockerfile must COPY it"
            );
        }
    }
    // Only src/ is copied: code the release build compiles must not include files from
    // elsewhere in the repository. Test code (after `#[cfg(test)]` in a file, or a whole
    // file declared as a `#[cfg(test)]` module) is not compiled into the image and may.
    let test_only = test_only_files();
    for path in files_under("src") {
        if test_only.contains(&path) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        for macro_name in ["include_str!(\"", "include_bytes!(\""] {
            for (at, _) in text.match_indices(macro_name) {
                let rest = &text[at + macro_name.len()..];
                let included = &rest[..rest.find('"').expect("closing quote")];
                let target = path.parent().unwrap().join(included);
                let target = target.canonicalize().unwrap_or(target);
                assert!(
                    target.starts_with(root().join("src").canonicalize().unwrap()),
                    "{} includes {included}, outside src/ (not in the image build context)",
                    path.display()
                );
            }
        }
    }
}

/// Files under src/ that are whole `#[cfg(test)]` modules: `#[cfg(test)] mod name;`
/// (name.rs or name/mod.rs beside the declaring file, or in its own directory) and
/// `#[cfg(test)] #[path = "file.rs"] mod …;`.
fn test_only_files() -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for path in files_under("src") {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let dir = path.parent().unwrap();
        let own_dir = dir.join(path.file_stem().unwrap());
        for (at, _) in text.match_indices("#[cfg(test)]") {
            // The item the attribute applies to, up to `;` (a module in its own file)
            // or `{` (an inline module or a function: no file to skip).
            let rest = &text[at..];
            let end = rest.find([';', '{']).unwrap_or(rest.len());
            if rest[end..].starts_with('{') {
                continue;
            }
            let item = &rest[..end];
            if let Some(p) = item.split("#[path = \"").nth(1) {
                out.insert(dir.join(&p[..p.find('"').expect("closing quote")]));
            } else if let Some(name) = item.split("mod ").nth(1).map(str::trim) {
                for base in [dir, own_dir.as_path()] {
                    out.insert(base.join(format!("{name}.rs")));
                    out.insert(base.join(name).join("mod.rs"));
                }
            }
        }
    }
    out
}

/// The command line of a compose service or container as strings.
fn string_list(value: &Value) -> Option<Vec<String>> {
    match value {
        Value::Sequence(items) => Some(
            items
                .iter()
                .map(|v| v.as_str().expect("a string argument").to_owned())
                .collect(),
        ),
        Value::String(s) => Some(s.split_whitespace().map(str::to_owned).collect()),
        _ => None,
    }
}

#[test]
fn compose_services_run_real_subcommands_with_redis_durable() {
    let compose = &yaml_documents(&root().join("docker/compose.yaml"))[0];
    let services = compose["services"].as_mapping().expect("services");
    let dockerfile = read("docker/Dockerfile");
    let installed: Vec<String> = dockerfile_copies(&dockerfile)
        .into_iter()
        .map(|(_, dest)| dest)
        .collect();
    let mut roles = BTreeSet::new();
    for (name, service) in services {
        let name = name.as_str().expect("service name");
        if !service["profiles"].is_null() {
            // Opt-in services (the agent runner) have their own image, env file and
            // test: compose_agents_service_is_opt_in_with_only_the_runners_settings.
            continue;
        }
        if name == "redis" {
            let command = string_list(&service["command"]).expect("redis command");
            assert_eq!(command[0], "redis-server");
            let volumes = format!("{:?}", service["volumes"]);
            assert!(
                volumes.contains("./redis.conf:"),
                "redis uses docker/redis.conf"
            );
            assert!(
                volumes.contains(":/data"),
                "redis keeps its AOF on a volume"
            );
            assert!(service["healthcheck"]["test"].is_sequence());
            continue;
        }
        assert_eq!(
            service["build"]["dockerfile"], "docker/Dockerfile",
            "{name}"
        );
        let command = string_list(&service["command"])
            .unwrap_or_else(|| dockerfile_exec_form(&dockerfile, "CMD"));
        assert_runs_with_help(&command, &format!("compose service {name}"));
        roles.insert(command[0].clone());
        assert_eq!(
            service["depends_on"]["redis"]["condition"], "service_healthy",
            "{name} waits for a healthy Redis"
        );
        let env_files = string_list(&service["env_file"]).expect("env_file");
        assert_eq!(env_files, [".env"], "{name} reads docker/.env");
        assert_eq!(
            service["environment"]["SHEPHERD_REDIS_URL"],
            "redis://redis:6379"
        );
        let test = string_list(&service["healthcheck"]["test"])
            .unwrap_or_else(|| panic!("{name} has a health check"));
        let probe = &test[1];
        assert!(
            installed.contains(probe),
            "{name}'s health check runs {probe}, which the image does not install"
        );
    }
    assert!(
        roles.contains("serve") && roles.contains("work"),
        "{roles:?}"
    );
    assert_eq!(services["work"]["deploy"]["replicas"], 2);
    assert!(
        services["serve"]["ports"]
            .as_sequence()
            .is_some_and(|p| !p.is_empty())
    );
}

/// Every Kubernetes document of `docker/k8s`, by kind.
fn k8s_documents() -> Vec<Value> {
    files_under("docker/k8s")
        .iter()
        .filter(|p| is_yaml(p))
        .flat_map(|p| yaml_documents(p))
        .collect()
}

#[test]
fn k8s_workloads_run_real_subcommands_with_probes_and_budgets() {
    let docs = k8s_documents();
    let of_kind =
        |kind: &str| -> Vec<&Value> { docs.iter().filter(|d| d["kind"] == kind).collect() };
    let mut roles = BTreeMap::new();
    for deployment in of_kind("Deployment") {
        let name = deployment["metadata"]["name"].as_str().unwrap();
        let containers = deployment["spec"]["template"]["spec"]["containers"]
            .as_sequence()
            .expect("containers");
        for container in containers {
            if let Some(command) = string_list(&container["command"]) {
                assert_eq!(command, ["shepherd"], "{name}: command must be the binary");
            }
            let args = string_list(&container["args"]).expect("args name the subcommand");
            assert_runs_with_help(&args, &format!("Deployment {name}"));
            let resources = &container["resources"];
            for (kind, what) in [
                ("requests", "cpu"),
                ("requests", "memory"),
                ("limits", "memory"),
            ] {
                assert!(
                    !resources[kind][what].is_null(),
                    "{name}: resources.{kind}.{what}"
                );
            }
            roles.insert(args[0].clone(), (name.to_owned(), container.clone()));
        }
        let selector = &deployment["spec"]["selector"]["matchLabels"];
        assert!(
            of_kind("PodDisruptionBudget")
                .iter()
                .any(|pdb| &pdb["spec"]["selector"]["matchLabels"] == selector),
            "{name} has no PodDisruptionBudget"
        );
    }
    let (_, serve) = roles.get("serve").expect("an ingest Deployment runs serve");
    assert_eq!(serve["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(serve["livenessProbe"]["httpGet"]["path"], "/healthz");
    let (worker, work) = roles.get("work").expect("a worker Deployment runs work");
    assert_eq!(work["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert!(
        work["readinessProbe"].is_null(),
        "no Service sends a worker traffic: readiness would mean nothing"
    );
    for (role, container) in [("serve", serve), ("work", work)] {
        let listen = container["env"]
            .as_sequence()
            .and_then(|env| env.iter().find(|e| e["name"] == "SHEPHERD_LISTEN"))
            .unwrap_or_else(|| panic!("{role}: SHEPHERD_LISTEN must be set for probes"));
        assert_eq!(
            listen["value"], "0.0.0.0:8080",
            "{role}: reachable by the kubelet"
        );
        assert_eq!(container["ports"][0]["containerPort"], 8080, "{role}");
    }
    // The Service targets the ingest pods, and the Ingress routes to the Service.
    let service = of_kind("Service")[0];
    let (ingest, _) = roles.get("serve").unwrap();
    let ingest_labels = &of_kind("Deployment")
        .into_iter()
        .find(|d| d["metadata"]["name"] == ingest.as_str())
        .unwrap()["spec"]["template"]["metadata"]["labels"];
    for (k, v) in service["spec"]["selector"].as_mapping().expect("selector") {
        assert_eq!(
            &ingest_labels[k.as_str().unwrap()],
            v,
            "Service selects the ingest pods"
        );
    }
    let ingress = format!("{:?}", of_kind("Ingress")[0]["spec"]);
    assert!(ingress.contains(service["metadata"]["name"].as_str().unwrap()));
    // KEDA scales the worker Deployment and the agent runners, one ScaledObject each.
    let (runners, _) = roles
        .get("agents")
        .expect("a Deployment runs shepherd agents");
    let targets: BTreeSet<&str> = of_kind("ScaledObject")
        .iter()
        .map(|s| s["spec"]["scaleTargetRef"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        targets,
        BTreeSet::from([worker.as_str(), runners.as_str()]),
        "ScaledObjects"
    );
}

/// The ScaledObject whose target is the Deployment running `shepherd <role>`.
fn scaled_object_of<'a>(docs: &'a [Value], role: &str) -> &'a Value {
    let deployment = docs
        .iter()
        .find(|d| {
            d["kind"] == "Deployment"
                && d["spec"]["template"]["spec"]["containers"][0]["args"][0] == role
        })
        .unwrap_or_else(|| panic!("no Deployment runs `shepherd {role}`"));
    let name = deployment["metadata"]["name"].as_str().unwrap();
    docs.iter()
        .find(|d| d["kind"] == "ScaledObject" && d["spec"]["scaleTargetRef"]["name"] == name)
        .unwrap_or_else(|| panic!("no ScaledObject scales {name}"))
}

/// The ConfigMap that sets `SHEPHERD_KEY_PREFIX` (and the shards) for the workers.
fn key_prefix_config_map(docs: &[Value]) -> &Value {
    docs.iter()
        .find(|d| d["kind"] == "ConfigMap" && d["data"]["SHEPHERD_KEY_PREFIX"].is_string())
        .expect("a ConfigMap sets SHEPHERD_KEY_PREFIX")
}

/// host:port of the Redis URL in the Secret `secret` (what KEDA's scalers take).
fn redis_address_of(docs: &[Value], secret: &str) -> String {
    let url = docs
        .iter()
        .find(|d| d["kind"] == "Secret" && d["metadata"]["name"] == secret)
        .and_then(|d| d["stringData"]["SHEPHERD_REDIS_URL"].as_str())
        .unwrap_or_else(|| panic!("the Secret {secret} sets SHEPHERD_REDIS_URL"));
    url.trim_start_matches("redis://")
        .rsplit('@')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_owned()
}

#[test]
fn keda_watches_the_streams_and_groups_the_workers_consume() {
    let docs = k8s_documents();
    let env = key_prefix_config_map(&docs);
    let prefix = env["data"]["SHEPHERD_KEY_PREFIX"].as_str().unwrap();
    let shards: u16 = env["data"]["SHEPHERD_SHARDS"]
        .as_str()
        .unwrap_or("1")
        .parse()
        .expect("SHEPHERD_SHARDS is a number");
    let keys = Keys::new(prefix, shards);
    let scaled = scaled_object_of(&docs, "work");
    let spec = &scaled["spec"];
    let min = spec["minReplicaCount"].as_u64().expect("minReplicaCount");
    let max = spec["maxReplicaCount"].as_u64().expect("maxReplicaCount");
    assert!(min >= 1, "workers fire timers: never scale to zero");
    assert!(max > min && max <= 50, "min {min}, max {max}");
    // The scaler reads the same Redis as the pods (host:port of SHEPHERD_REDIS_URL).
    let redis_url = docs
        .iter()
        .find_map(|d| d["stringData"]["SHEPHERD_REDIS_URL"].as_str())
        .expect("the Secret template sets SHEPHERD_REDIS_URL");
    let redis_address = redis_url
        .trim_start_matches("redis://")
        .rsplit('@')
        .next()
        .unwrap()
        .trim_end_matches('/');
    let mut watched = BTreeSet::new();
    for trigger in spec["triggers"].as_sequence().expect("triggers") {
        assert_eq!(trigger["type"], "redis-streams");
        let meta = &trigger["metadata"];
        assert_eq!(
            meta["address"], redis_address,
            "KEDA and the pods use one Redis"
        );
        assert!(
            meta["lagCount"]
                .as_str()
                .is_some_and(|n| n.parse::<u64>().is_ok())
        );
        assert!(
            meta["activationLagCount"].is_string(),
            "KEDA needs it with lagCount"
        );
        watched.insert((
            meta["stream"].as_str().unwrap().to_owned(),
            meta["consumerGroup"].as_str().unwrap().to_owned(),
        ));
    }
    for shard in 0..keys.shards() {
        for (stream, group) in [
            (keys.events(shard), WORKERS_GROUP),
            (keys.effects(shard), EXECUTORS_GROUP),
        ] {
            assert!(
                watched.contains(&(stream.clone(), group.to_owned())),
                "KEDA does not watch {stream} / {group}: {watched:?}"
            );
        }
    }
}

#[test]
fn policy_configmap_is_valid_toml() {
    let docs = k8s_documents();
    let policy = docs
        .iter()
        .find_map(|d| d["data"]["policy.toml"].as_str())
        .expect("a ConfigMap holds policy.toml");
    shepherd::core::policy::PolicyFile::from_toml(policy)
        .unwrap_or_else(|e| panic!("the policy.toml of configmap.yaml is refused: {e}"));
    let env = docs
        .iter()
        .find_map(|d| d["data"]["SHEPHERD_CONFIG"].as_str())
        .expect("SHEPHERD_CONFIG is set");
    assert_eq!(env, "/etc/shepherd/policy.toml");
}

/// A one-shot HTTP server on a free loopback port answering 200 on `/healthz` and 503
/// elsewhere, for as many requests as given.
fn tiny_http_server(requests: usize) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        for _ in 0..requests {
            let (mut stream, _) = listener.accept().expect("accept");
            // Read the whole request head: closing with unread bytes would reset the
            // connection before the client reads the answer.
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).expect("request line");
            let mut header = String::new();
            while reader.read_line(&mut header).expect("header") > 2 {
                header.clear();
            }
            let status = if line.starts_with("GET /healthz ") {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            let _ = write!(stream, "HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
        }
    });
    (port, handle)
}

fn healthcheck(port: u16, path: Option<&str>) -> bool {
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("docker/healthcheck.sh"));
    cmd.args(path);
    cmd.env("SHEPHERD_LISTEN", format!("0.0.0.0:{port}"));
    cmd.stderr(Stdio::null());
    cmd.status().expect("run bash").success()
}

#[test]
fn image_health_probe_accepts_200_only() {
    let (port, server) = tiny_http_server(2);
    assert!(healthcheck(port, None), "200 on /healthz is healthy");
    assert!(!healthcheck(port, Some("/readyz")), "503 is unhealthy");
    server.join().unwrap();
    // Nothing listens any more.
    assert!(
        !healthcheck(port, None),
        "a refused connection is unhealthy"
    );
}

fn config_get(con: &mut redis::Connection, name: &str) -> String {
    let pair: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query(con)
        .unwrap();
    pair.get(1).cloned().unwrap_or_default()
}

/// A redis-server child, killed when dropped.
struct RedisChild(Child);

impl Drop for RedisChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `redis-server docker/redis.conf` with the port, bind address, data directory
/// and foreground mode overridden on the command line, as an operator would, and
/// connects to it. Errors carry redis-server's own output.
fn start_redis_with_conf(dir: &Path) -> Result<(RedisChild, redis::Connection), String> {
    let port = free_port();
    let child = Command::new("redis-server")
        .arg(root().join("docker/redis.conf"))
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start redis-server (is it installed? apt-get install redis-server): {e}")
        });
    let mut child = RedisChild(child);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut con = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            let mut out = String::new();
            let _ = child.0.stdout.take().unwrap().read_to_string(&mut out);
            return Err(format!(
                "redis-server refused docker/redis.conf ({status}):\n{out}"
            ));
        }
        match client.get_connection_with_timeout(Duration::from_millis(200)) {
            Ok(con) => break con,
            Err(e) if Instant::now() > deadline => {
                return Err(format!("redis-server never answered: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    // The server that answered is ours (not another test's on a recycled port).
    let served_dir = PathBuf::from(config_get(&mut con, "dir"));
    if served_dir.canonicalize().ok() != dir.canonicalize().ok() {
        return Err(format!(
            "Address already in use: port {port} answered from {}",
            served_dir.display()
        ));
    }
    Ok((child, con))
}

#[test]
fn redis_conf_loads_with_aof_and_fsync_always() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A free port can be taken between the probe and redis-server's bind: try a few.
    let mut attempt = 0;
    let (child, mut con) = loop {
        attempt += 1;
        match start_redis_with_conf(dir.path()) {
            Ok(started) => break started,
            Err(e) if attempt < 5 && e.contains("Address already in use") => continue,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(config_get(&mut con, "appendonly"), "yes");
    assert_eq!(config_get(&mut con, "appendfsync"), "always");
    assert_eq!(config_get(&mut con, "no-appendfsync-on-rewrite"), "no");
    assert_eq!(config_get(&mut con, "maxmemory-policy"), "noeviction");
    let _: String = redis::cmd("XADD")
        .arg("deploy-probe")
        .arg("*")
        .arg("f")
        .arg("v")
        .query(&mut con)
        .unwrap();
    // The write is in the incremental AOF of the data directory given on the command
    // line as soon as Redis has answered (fsync always).
    let aof_dir = dir.path().join("appendonlydir");
    let logged = std::fs::read_dir(&aof_dir)
        .unwrap_or_else(|e| panic!("no AOF directory {}: {e}", aof_dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .any(|p| String::from_utf8_lossy(&std::fs::read(p).unwrap()).contains("deploy-probe"));
    assert!(logged, "the XADD is not in the AOF");
    drop(child);
}

/// Metric family names registered in src/telemetry.rs (the string literal right after
/// each `Opts::new(`, `HistogramOpts::new(`, `IntCounter::new(`, … ), without the
/// `shepherd_` namespace.
fn metric_families() -> BTreeSet<String> {
    let source = read("src/telemetry.rs");
    let mut names = BTreeSet::new();
    for (at, _) in source.match_indices("::new(") {
        let before = &source[..at];
        let type_name = &before[before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1)..];
        let is_metric = type_name.ends_with("Opts")
            || ["Counter", "Gauge", "Histogram"]
                .iter()
                .any(|kind| type_name.contains(kind));
        if !is_metric {
            continue;
        }
        let rest = source[at + "::new(".len()..].trim_start();
        let Some(literal) = rest.strip_prefix('"') else {
            continue;
        };
        let name = &literal[..literal.find('"').expect("closing quote")];
        if !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            names.insert(name.to_owned());
        }
    }
    names
}

#[test]
fn operations_guide_describes_every_metric() {
    let families = metric_families();
    assert!(families.contains("deliveries_total"), "{families:?}");
    let guide = read("docs/operations.md");
    for name in families {
        assert!(
            guide.contains(&format!("`shepherd_{name}`"))
                || guide.contains(&format!("`shepherd_{name}{{")),
            "docs/operations.md (§ What to watch) does not describe shepherd_{name}, \
             registered in src/telemetry.rs"
        );
    }
}

/// The port of a running test instance (from its base URL).
fn port_of(instance: &Shepherd) -> u16 {
    let base = instance.url("");
    base.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("no port in {base}"))
}

#[tokio::test]
async fn image_health_probe_speaks_to_the_real_server() {
    let mut redis = RedisServer::start();
    let serve = Shepherd::serve(&redis).await;
    let port = port_of(&serve);
    // The probe blocks (bash), so it runs off the async runtime.
    let probe = move |path: &'static str| {
        tokio::task::spawn_blocking(move || healthcheck(port, Some(path)))
    };
    assert!(
        probe("/healthz").await.unwrap(),
        "liveness of a running serve"
    );
    assert!(probe("/readyz").await.unwrap(), "readiness with Redis up");
    // Redis gone: not ready (compose's and Kubernetes' readiness), but alive (so the
    // liveness probe does not restart every pod during a Redis outage).
    redis.stop();
    poll_until_named(
        Duration::from_secs(10),
        "/readyz fails without Redis",
        || {
            let answer = probe("/readyz");
            async move { !answer.await.unwrap() }
        },
    )
    .await;
    assert!(probe("/healthz").await.unwrap(), "alive without Redis");
}

#[tokio::test]
async fn image_health_probe_speaks_to_a_real_worker() {
    let redis = RedisServer::start();
    // The builder waits until /healthz answers; the probe script must agree.
    let work = Shepherd::builder(&redis).args(["work"]).start().await;
    let port = port_of(&work);
    let alive = tokio::task::spawn_blocking(move || healthcheck(port, Some("/healthz")));
    assert!(
        alive.await.unwrap(),
        "compose's and the image's check of `shepherd work`"
    );
}

/// The fixed part of every key name built in src/store/keys.rs, after its prefix or
/// hash tag: `:events`, `:seen:`, `:lock:merge:`, …
fn key_name_parts() -> BTreeSet<String> {
    let source = read("src/store/keys.rs");
    let code = source.split("#[cfg(test)]").next().unwrap_or_default();
    let mut parts = BTreeSet::new();
    for (at, _) in code.match_indices("format!(") {
        let rest = code[at + "format!(".len()..].trim_start();
        let Some(literal) = rest.strip_prefix('"') else {
            continue;
        };
        let literal = &literal[..literal.find('"').expect("closing quote")];
        // `{}:events` → `:events`; `{}:seen:{}` → `:seen:`; the tag itself has none.
        let after_prefix = literal.strip_prefix("{}").unwrap_or(literal);
        let part = &after_prefix[..after_prefix.find('{').unwrap_or(after_prefix.len())];
        if part.len() > 1 && part.starts_with(':') {
            parts.insert(part.to_owned());
        }
    }
    parts
}

#[test]
fn architecture_lists_every_redis_key() {
    let parts = key_name_parts();
    assert!(
        parts.contains(":events") && parts.contains(":seen:"),
        "{parts:?}"
    );
    let doc = read("docs/architecture.md");
    for part in parts {
        let mentioned = doc.match_indices(&part).any(|(at, _)| {
            // `:work` must not count as mentioned by `:work-ended:`.
            part.ends_with(':')
                || doc[at + part.len()..]
                    .chars()
                    .next()
                    .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == ':'))
        });
        assert!(
            mentioned,
            "docs/architecture.md (§ Redis keys) does not describe the key `…{part}` of \
             src/store/keys.rs"
        );
    }
}

/// Every `shepherd <subcommand> …` command line written in `text`: in backticks or on
/// a shell line, up to the closing backtick, the end of the line or a ` #` comment.
/// Placeholders such as `<id>` become `x`.
fn command_lines(text: &str, subcommands: &[String]) -> Vec<Vec<String>> {
    let mut lines = Vec::new();
    for line in text.lines() {
        for (at, _) in line.match_indices("shepherd ") {
            // `/shepherd …` is a comment command on a PR, not a command line.
            if at > 0
                && line[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '/')
            {
                continue;
            }
            let rest = &line[at + "shepherd ".len()..];
            let rest = &rest[..rest.find(['`', '…']).unwrap_or(rest.len())];
            let rest = rest.split(" #").next().unwrap_or_default();
            let args: Vec<String> = rest
                .split_whitespace()
                .map(|a| {
                    if a.starts_with('<') {
                        "x".to_owned()
                    } else {
                        a.to_owned()
                    }
                })
                .collect();
            if args.first().is_some_and(|sub| subcommands.contains(sub)) {
                lines.push(args);
            }
        }
    }
    lines
}

#[test]
fn commands_in_the_operations_guide_are_real() {
    let subs = subcommands();
    let lines = command_lines(&read("docs/operations.md"), &subs);
    let used: BTreeSet<&str> = lines.iter().map(|l| l[0].as_str()).collect();
    for sub in ["resync", "inspect", "rebuild", "replay", "dlq", "run"] {
        assert!(
            used.contains(sub),
            "the runbook shows `shepherd {sub}`: {used:?}"
        );
    }
    for args in &lines {
        // Prose may name a flag without its value (`resync --repo`): give it one.
        let mut with_help: Vec<&str> = args.iter().map(String::as_str).collect();
        with_help.push("--help");
        let needs_value = !shepherd(&with_help).status.success()
            && args.last().is_some_and(|a| a.starts_with("--"));
        let mut args = args.clone();
        if needs_value {
            args.push("x".to_owned());
        }
        assert_runs_with_help(&args, "docs/operations.md");
    }
}

/// The Sentinel variant (`compose.sentinel.yaml` over `compose.yaml`): two replicas
/// follow `redis`, three sentinels monitor it under the name the Shepherd URL asks
/// for, every sentinel named in the URL is a service, and the URL is one Shepherd
/// parses as a Sentinel target; the WAIT setting asks no more replicas than exist.
#[test]
fn compose_sentinel_variant_matches_its_sentinels_and_replicas() {
    use shepherd::config::{RedisTarget, Topology};
    let base = &yaml_documents(&root().join("docker/compose.yaml"))[0];
    let variant = &yaml_documents(&root().join("docker/compose.sentinel.yaml"))[0];
    let services = variant["services"].as_mapping().expect("services");
    let conf = read("docker/sentinel.conf");
    let monitor: Vec<&str> = conf
        .lines()
        .find(|l| l.starts_with("sentinel monitor "))
        .expect("sentinel.conf monitors a primary")
        .split_whitespace()
        .collect();
    let (name, host, port) = (monitor[2], monitor[3], monitor[4]);
    assert!(
        base["services"].get(host).is_some(),
        "the monitored primary {host} is a service of compose.yaml"
    );
    let mut replicas = 0;
    let mut sentinels = BTreeSet::new();
    for (service, spec) in services {
        let service = service.as_str().expect("service name");
        let command = string_list(&spec["command"]).unwrap_or_default();
        let text = format!("{:?}", spec);
        if service.starts_with("redis-replica") {
            let at = command
                .iter()
                .position(|a| a == "--replicaof")
                .expect("a replica has --replicaof");
            assert_eq!((&*command[at + 1], &*command[at + 2]), (host, port));
            replicas += 1;
        } else if service.starts_with("sentinel-") {
            assert!(text.contains("--sentinel"), "{service} runs a sentinel");
            assert!(
                text.contains("./sentinel.conf:"),
                "{service} mounts sentinel.conf"
            );
            sentinels.insert(service.to_owned());
        }
    }
    assert_eq!((replicas, sentinels.len()), (2, 3));
    for role in ["serve", "work"] {
        let url = services[role]["environment"]["SHEPHERD_REDIS_URL"]
            .as_str()
            .unwrap_or_else(|| panic!("{role} gets a Sentinel URL"));
        let target = RedisTarget::parse(url).expect("a URL Shepherd accepts");
        let Topology::Sentinel {
            sentinels: named,
            service,
        } = &target.topology
        else {
            panic!("{role}: {url} is not a Sentinel URL");
        };
        assert_eq!(service, name, "{role} asks for the monitored name");
        for (h, p) in named {
            assert!(
                sentinels.contains(h),
                "{role} names {h}, not a sentinel service"
            );
            assert_eq!(*p, 26379);
        }
    }
    let wait: u32 = services["serve"]["environment"]["SHEPHERD_REDIS_WAIT_REPLICAS"]
        .as_str()
        .expect("serve waits for replicas")
        .parse()
        .expect("a number");
    assert!(
        wait >= 1 && wait <= replicas,
        "WAIT {wait} of {replicas} replicas"
    );
}

// ---- the agent runner: image, compose service, Kubernetes Deployment, KEDA ----------

/// Settings the agent runner must never hold: the ingest's webhook secrets, the admin
/// token, and the secret that signs HTTP dispatches.
const NEVER_FOR_AGENTS: &[&str] = &[
    "SHEPHERD_WEBHOOK_SECRETS",
    "SHEPHERD_ADMIN_TOKEN",
    "SHEPHERD_DISPATCH_SECRET",
];

/// One stage of a Dockerfile: its name, its base, and its instructions (continuation
/// lines joined, comments dropped) as (KEYWORD, arguments).
struct Stage {
    name: String,
    from: String,
    instructions: Vec<(String, String)>,
}

impl Stage {
    /// The arguments of every instruction `keyword` of the stage.
    fn all(&self, keyword: &str) -> Vec<&str> {
        self.instructions
            .iter()
            .filter(|(k, _)| k == keyword)
            .map(|(_, a)| a.as_str())
            .collect()
    }

    /// The JSON-array instruction `keyword` (the stage's last one counts).
    fn exec_form(&self, keyword: &str) -> Vec<String> {
        let json = *self
            .all(keyword)
            .last()
            .unwrap_or_else(|| panic!("stage {} has no {keyword}", self.name));
        serde_json::from_str(json).unwrap_or_else(|e| {
            panic!(
                "stage {}: {keyword} is not exec form ({json}): {e}",
                self.name
            )
        })
    }
}

fn dockerfile_stages(dockerfile: &str) -> Vec<Stage> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                instructions.push(std::mem::take(&mut current));
            }
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for instruction in instructions {
        let (keyword, args) = instruction
            .split_once(char::is_whitespace)
            .map(|(k, a)| (k.to_ascii_uppercase(), a.trim().to_owned()))
            .unwrap_or_else(|| (instruction.to_ascii_uppercase(), String::new()));
        if keyword == "FROM" {
            let words: Vec<&str> = args.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => (*name).to_owned(),
                _ => format!("stage{}", stages.len()),
            };
            stages.push(Stage {
                name,
                from: words[0].to_owned(),
                instructions: Vec::new(),
            });
        } else {
            stages
                .last_mut()
                .expect("an instruction before the first FROM")
                .instructions
                .push((keyword, args));
        }
    }
    stages
}

/// The opencode version scripts/test pins (`opencode_version=…`).
fn pinned_opencode_version() -> String {
    let script = read("scripts/test");
    let version = script
        .lines()
        .find_map(|l| l.strip_prefix("opencode_version="))
        .expect("scripts/test pins opencode_version");
    assert!(
        version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "a pinned version, not a range: {version}"
    );
    version.to_owned()
}

/// The numeric value of `--flag N` in a command line.
fn flag_value(command: &str, flag: &str) -> Option<u32> {
    let words: Vec<&str> = command.split_whitespace().collect();
    words
        .windows(2)
        .find(|w| w[0] == flag)
        .and_then(|w| w[1].parse().ok())
}

#[test]
fn dockerfile_agents_target_has_the_runner_its_tools_and_two_users() {
    let stages = dockerfile_stages(&read("docker/Dockerfile"));
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"build") && names.contains(&"agents"),
        "{names:?}"
    );
    // A build without --target still makes the serve/work/run image.
    let last = stages.last().unwrap();
    assert_eq!(last.name, "runtime", "the last stage is the default image");
    assert_eq!(last.exec_form("CMD"), ["run"]);
    let agents = stages.iter().find(|s| s.name == "agents").unwrap();
    let run = agents.all("RUN").join(" && ");
    // Debian packages, without their recommendations.
    let installs: Vec<&str> = run
        .split("&&")
        .map(str::trim)
        .filter(|c| c.starts_with("apt-get install"))
        .collect();
    assert!(!installs.is_empty(), "the agents stage installs packages");
    for install in &installs {
        assert!(
            install.contains("--no-install-recommends"),
            "{install}: without recommended packages"
        );
    }
    let packages: BTreeSet<&str> = installs
        .iter()
        .flat_map(|i| i.split_whitespace())
        .filter(|w| !w.starts_with('-'))
        .collect();
    for package in ["git", "bubblewrap", "ca-certificates"] {
        assert!(
            packages.contains(package),
            "the agents image installs {package}"
        );
    }
    // Node.js: the base image is Node's own, or the package is installed.
    assert!(
        agents.from.starts_with("node:") || packages.contains("nodejs"),
        "Node.js in the agents image (FROM {})",
        agents.from
    );
    // The opencode CLI, the version the tests run.
    let pinned = format!("opencode-ai@{}", pinned_opencode_version());
    assert!(
        run.split_whitespace().any(|w| w == pinned),
        "the agents image installs {pinned}, as scripts/test does"
    );
    // The binary from the build stage, and the health probe.
    let copies = agents.all("COPY");
    assert!(
        copies
            .iter()
            .any(|c| c.starts_with("--from=build ") && c.ends_with("/usr/local/bin/shepherd")),
        "{copies:?}"
    );
    assert!(
        copies
            .iter()
            .any(|c| c.ends_with("/usr/local/bin/shepherd-healthcheck"))
    );
    assert_eq!(agents.exec_form("ENTRYPOINT"), ["shepherd"]);
    let cmd = agents.exec_form("CMD");
    assert_eq!(cmd, ["agents"]);
    assert_runs_with_help(&cmd, "Dockerfile agents CMD");
    let healthcheck = agents.all("HEALTHCHECK").join(" ");
    assert!(healthcheck.contains("shepherd-healthcheck") && healthcheck.contains("/healthz"));
    // Two distinct non-root users: the runner's (the stage's USER) and the agents'.
    let uids: Vec<u32> = run
        .split("&&")
        .filter(|c| c.trim().starts_with("useradd"))
        .map(|c| flag_value(c, "--uid").unwrap_or_else(|| panic!("useradd without --uid: {c}")))
        .collect();
    assert_eq!(uids.len(), 2, "a runner user and an agent user: {uids:?}");
    assert_ne!(uids[0], uids[1], "two distinct users");
    assert!(uids.iter().all(|u| *u != 0));
    let user = *agents
        .all("USER")
        .last()
        .expect("the agents stage sets USER");
    let runner_uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("a numeric USER (runAsNonRoot checks it)");
    assert!(uids.contains(&runner_uid), "USER {user} is one of {uids:?}");
    let agent_uid = uids.iter().find(|u| **u != runner_uid).unwrap();
    assert_ne!(runner_uid, *agent_uid);
    // The work folder of SHEPHERD_AGENT_WORK_DIR exists, the runner's and private.
    let env = agents.all("ENV").join(" ");
    let work_dir = env
        .split_whitespace()
        .find_map(|w| w.strip_prefix("SHEPHERD_AGENT_WORK_DIR="))
        .expect("the image sets SHEPHERD_AGENT_WORK_DIR");
    assert!(
        run.split("&&").any(|c| {
            let c = c.trim();
            c.starts_with("install -d")
                && c.contains("-m 0700")
                && c.contains(&format!("-o {runner_uid}"))
                && c.ends_with(work_dir)
        }),
        "{work_dir} is created 0700 for uid {runner_uid}"
    );
}

/// `KEY=value` and `# KEY=value` lines of an env file: name → (commented, value).
fn env_file_entries(text: &str) -> BTreeMap<String, (bool, String)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let (commented, rest) = match line.strip_prefix('#') {
            Some(rest) => (true, rest.trim_start()),
            None => (false, line),
        };
        if let Some((name, value)) = rest.split_once('=')
            && !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        {
            out.insert(name.to_owned(), (commented, value.to_owned()));
        }
    }
    out
}

#[test]
fn compose_agents_service_is_opt_in_with_only_the_runners_settings() {
    let compose = &yaml_documents(&root().join("docker/compose.yaml"))[0];
    let services = compose["services"].as_mapping().expect("services");
    let agents = &compose["services"]["agents"];
    assert_eq!(
        string_list(&agents["profiles"]).as_deref(),
        Some(&["agents".to_owned()][..]),
        "the agents service runs only with --profile agents"
    );
    // The default `up` is what it was: no other service has a profile.
    for (name, service) in services {
        if name != "agents" {
            assert!(service["profiles"].is_null(), "{name:?} has a profile");
        }
    }
    assert_eq!(agents["build"]["dockerfile"], "docker/Dockerfile");
    assert_eq!(agents["build"]["target"], "agents");
    let command = string_list(&agents["command"]).expect("a command");
    assert_eq!(command, ["agents"]);
    assert_runs_with_help(&command, "compose service agents");
    assert_eq!(
        agents["depends_on"]["redis"]["condition"],
        "service_healthy"
    );
    assert_eq!(
        agents["environment"]["SHEPHERD_REDIS_URL"],
        "redis://redis:6379"
    );
    let probe = string_list(&agents["healthcheck"]["test"]).expect("a health check");
    assert_eq!(
        probe[1..],
        ["/usr/local/bin/shepherd-healthcheck", "/healthz"]
    );
    // Its own env file, never docker/.env (which holds the webhook secrets).
    let env_files = string_list(&agents["env_file"]).expect("env_file");
    assert_eq!(env_files, ["agents.env"]);
    let example = env_file_entries(&read("docker/agents.env.example"));
    let environment: Vec<String> = agents["environment"]
        .as_mapping()
        .expect("environment")
        .keys()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect();
    for forbidden in NEVER_FOR_AGENTS {
        assert!(
            !example.contains_key(*forbidden),
            "docker/agents.env.example names {forbidden}"
        );
        assert!(!environment.iter().any(|n| n == forbidden), "{forbidden}");
    }
    // What the runner needs to start is set (uncommented, not empty).
    for required in [
        "SHEPHERD_FORGEJO_URL",
        "SHEPHERD_FORGEJO_TOKEN",
        "SHEPHERD_BOT_LOGIN",
        "SHEPHERD_AGENT_COMMAND",
        "SHEPHERD_AGENT_FORGEJO_TOKEN",
    ] {
        let entry = example.get(required);
        assert!(
            entry.is_some_and(|(commented, value)| !commented && !value.trim().is_empty()),
            "docker/agents.env.example sets {required}: {entry:?}"
        );
    }
    // The sandbox's exceptions, and nothing more: no capability, not privileged.
    let security: Vec<String> = string_list(&agents["security_opt"]).expect("security_opt");
    for opt in ["seccomp=unconfined", "systempaths=unconfined"] {
        assert!(security.iter().any(|s| s == opt), "{opt}: {security:?}");
    }
    assert!(agents["privileged"].is_null() && agents["cap_add"].is_null());
    assert_eq!(string_list(&agents["cap_drop"]).unwrap(), ["ALL"]);
    assert!(agents["user"].is_null(), "runs as the image's runner user");
}

/// The Kubernetes Deployment that runs `shepherd <role>`.
fn deployment_running<'a>(docs: &'a [Value], role: &str) -> &'a Value {
    docs.iter()
        .find(|d| {
            d["kind"] == "Deployment"
                && d["spec"]["template"]["spec"]["containers"][0]["args"][0] == role
        })
        .unwrap_or_else(|| panic!("no Deployment runs `shepherd {role}`"))
}

/// Every variable a Deployment's first container gets, with the kind of object it
/// comes from (`ConfigMap`, `Secret`, or `env` for an inline value).
fn pod_environment(docs: &[Value], deployment: &Value) -> BTreeMap<String, String> {
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let object = |kind: &str, name: &Value| -> &Value {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == *name)
            .unwrap_or_else(|| panic!("the pod loads {kind} {name:?}, which is not a manifest"))
    };
    let mut env = BTreeMap::new();
    for source in container["envFrom"].as_sequence().into_iter().flatten() {
        let (kind, name, field) = if !source["configMapRef"].is_null() {
            ("ConfigMap", &source["configMapRef"]["name"], "data")
        } else {
            ("Secret", &source["secretRef"]["name"], "stringData")
        };
        for key in object(kind, name)[field]
            .as_mapping()
            .expect("values")
            .keys()
        {
            env.insert(key.as_str().unwrap().to_owned(), kind.to_owned());
        }
    }
    for entry in container["env"].as_sequence().into_iter().flatten() {
        let kind = if entry["valueFrom"]["secretKeyRef"].is_null() {
            "env"
        } else {
            "Secret"
        };
        env.insert(entry["name"].as_str().unwrap().to_owned(), kind.to_owned());
    }
    env
}

#[test]
fn k8s_agents_pods_get_their_own_secrets_and_the_sandboxs_security_context() {
    let docs = k8s_documents();
    let agents = deployment_running(&docs, "agents");
    assert_eq!(agents["metadata"]["name"], "shepherd-agents");
    let env = pod_environment(&docs, agents);
    for forbidden in NEVER_FOR_AGENTS {
        assert!(
            !env.contains_key(*forbidden),
            "the agents pod gets {forbidden}"
        );
    }
    for (name, from) in [
        ("SHEPHERD_REDIS_URL", "Secret"),
        ("SHEPHERD_FORGEJO_TOKEN", "Secret"),
        ("SHEPHERD_AGENT_FORGEJO_TOKEN", "Secret"),
        ("SHEPHERD_REVIEWER_TOKENS", "Secret"),
        ("SHEPHERD_FORGEJO_URL", "ConfigMap"),
        ("SHEPHERD_AGENT_COMMAND", "ConfigMap"),
    ] {
        assert_eq!(env.get(name).map(String::as_str), Some(from), "{name}");
    }
    // The provider's key the agents see by name is in the runner's Secret.
    let configured = |name: &str| {
        docs.iter().find_map(|d| {
            d["data"][name]
                .as_str()
                .filter(|_| d["kind"] == "ConfigMap")
        })
    };
    for passed in configured("SHEPHERD_AGENT_ENV")
        .unwrap_or_default()
        .split(',')
    {
        assert_eq!(env.get(passed.trim()).map(String::as_str), Some("Secret"));
    }
    // The other pods never get the agents' tokens.
    for role in ["serve", "work"] {
        let other = pod_environment(&docs, deployment_running(&docs, role));
        for token in ["SHEPHERD_AGENT_FORGEJO_TOKEN", "SHEPHERD_REVIEWER_TOKENS"] {
            assert!(!other.contains_key(token), "the {role} pods get {token}");
        }
    }
    // The sandbox's security context: a user namespace for the pod, an unmasked /proc,
    // and otherwise unprivileged.
    let pod = &agents["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(pod["hostUsers"], false, "the pod runs in a user namespace");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let image_uid = dockerfile_stages(&read("docker/Dockerfile"))
        .into_iter()
        .find(|s| s.name == "agents")
        .and_then(|s| {
            s.all("USER")
                .last()
                .map(|u| u.split(':').next().unwrap().to_owned())
        })
        .expect("the agents image's USER");
    assert_eq!(
        pod["securityContext"]["runAsUser"]
            .as_u64()
            .map(|u| u.to_string()),
        Some(image_uid),
        "the pod runs as the image's runner user"
    );
    assert!(pod["securityContext"]["seccompProfile"]["type"].is_string());
    let security = &container["securityContext"];
    assert_eq!(security["procMount"], "Unmasked");
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert!(security["privileged"].is_null() || security["privileged"] == false);
    assert_eq!(
        string_list(&security["capabilities"]["drop"]).unwrap(),
        ["ALL"]
    );
    assert!(
        security["capabilities"]["add"].is_null(),
        "no capability added"
    );
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    // The work folder is an emptyDir mounted where SHEPHERD_AGENT_WORK_DIR points.
    let work_dir = configured("SHEPHERD_AGENT_WORK_DIR").expect("SHEPHERD_AGENT_WORK_DIR");
    let mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == work_dir)
        .unwrap_or_else(|| panic!("nothing is mounted at {work_dir}"));
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    assert!(volume["emptyDir"].is_mapping(), "{work_dir} is an emptyDir");
    assert_eq!(container["image"], "shepherd-agents:latest");
}

#[test]
fn keda_scales_the_agents_from_zero_on_the_dispatch_group() {
    let docs = k8s_documents();
    let env = key_prefix_config_map(&docs);
    let prefix = env["data"]["SHEPHERD_KEY_PREFIX"].as_str().unwrap();
    let dispatch = Keys::new(prefix, 1).dispatch();
    let spec = &scaled_object_of(&docs, "agents")["spec"];
    assert_eq!(
        spec["minReplicaCount"], 0,
        "no runner while nothing is dispatched"
    );
    let max = spec["maxReplicaCount"].as_u64().expect("maxReplicaCount");
    assert!((1..=50).contains(&max), "max {max}");
    // The scaler reads the Redis of the runners' Secret (and of every other pod).
    let address = redis_address_of(&docs, "shepherd-agents-secrets");
    assert_eq!(address, redis_address_of(&docs, "shepherd-secrets"));
    let (mut lag, mut pending) = (false, false);
    for trigger in spec["triggers"].as_sequence().expect("triggers") {
        assert_eq!(trigger["type"], "redis-streams");
        let meta = &trigger["metadata"];
        assert_eq!(meta["address"], address.as_str());
        assert_eq!(meta["stream"], dispatch.as_str(), "the dispatch stream");
        assert_eq!(meta["consumerGroup"], AGENTS_GROUP);
        let auth = trigger["authenticationRef"]["name"]
            .as_str()
            .expect("authenticationRef");
        assert!(
            docs.iter()
                .any(|d| d["kind"] == "TriggerAuthentication" && d["metadata"]["name"] == auth),
            "TriggerAuthentication {auth}"
        );
        let count = |key: &str| meta[key].as_str().and_then(|n| n.parse::<u64>().ok());
        if count("lagCount").is_some() {
            // Lag (entries no runner took) is the only metric that wakes it from 0.
            assert!(count("activationLagCount").is_some(), "with lagCount");
            lag = true;
        } else if count("pendingEntriesCount").is_some() {
            // Pending (held, running) keeps the runners with agents at work alive.
            pending = true;
        } else {
            panic!("a trigger that counts neither lag nor pending entries: {meta:?}");
        }
    }
    assert!(
        lag && pending,
        "one lag trigger and one pending-entries trigger"
    );
}

// ---- scripts/test's installs, against fake installers -------------------------------

/// A copy of scripts/test in an empty repository, run with a PATH holding only fake
/// installers and tools (and bash, env, mkdir, chmod): what it prints, and what the
/// fakes were asked.
struct InstallRun {
    status: std::process::ExitStatus,
    stdout: String,
    calls: String,
    log: String,
}

/// The real executable `name` from the PATH.
fn real_tool(name: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not on the PATH"))
}

fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Runs scripts/test with the tools in `present` (and npm, the fake installer) already
/// there, and installers that succeed (creating the tool) or fail.
fn run_scripts_test(present: &[&str], installers_work: bool) -> InstallRun {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    let repo = dir.path().join("repo");
    let calls = dir.path().join("calls");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(repo.join("scripts")).unwrap();
    std::fs::copy(root().join("scripts/test"), repo.join("scripts/test")).unwrap();
    for tool in ["bash", "env", "mkdir", "chmod"] {
        std::os::unix::fs::symlink(real_tool(tool), bin.join(tool)).unwrap();
    }
    for tool in present {
        write_executable(&bin.join(tool), "#!/bin/sh\nexit 0\n");
    }
    let (bin_s, calls_s) = (bin.display(), calls.display());
    let outcome = if installers_work { "0" } else { "1" };
    // apt-get: `install … PACKAGE` creates PACKAGE's command (bubblewrap: bwrap).
    write_executable(
        &bin.join("apt-get"),
        &format!(
            "#!/bin/sh\necho \"apt-get $*\" >> {calls_s}\n\
             echo 'Reading package lists... (apt chatter)'\n\
             [ \"$1\" = update ] && exit 0\n\
             [ {outcome} = 0 ] || {{ echo 'E: Unable to locate package (apt error)' >&2; exit 100; }}\n\
             for last; do :; done\n\
             case \"$last\" in bubblewrap) cmd=bwrap;; *) cmd=$last;; esac\n\
             printf '#!/bin/sh\\nexit 0\\n' > {bin_s}/$cmd; chmod +x {bin_s}/$cmd\n"
        ),
    );
    write_executable(
        &bin.join("cargo"),
        &format!(
            "#!/bin/sh\necho \"cargo $*\" >> {calls_s}\n\
             [ \"$1\" = install ] || exit 0\n\
             echo '   Compiling cargo-nextest (cargo chatter)'\n\
             [ {outcome} = 0 ] || exit 101\n\
             printf '#!/bin/sh\\nexit 0\\n' > {bin_s}/cargo-nextest; chmod +x {bin_s}/cargo-nextest\n"
        ),
    );
    write_executable(
        &bin.join("npm"),
        &format!(
            "#!/bin/sh\necho \"npm $*\" >> {calls_s}\necho 'added 3 packages (npm chatter)'\n\
             [ {outcome} = 0 ] || exit 1\n\
             mkdir -p .tools/opencode/node_modules/.bin\n\
             printf '#!/bin/sh\\necho {version}\\n' > .tools/opencode/node_modules/.bin/opencode\n\
             chmod +x .tools/opencode/node_modules/.bin/opencode\n",
            version = pinned_opencode_version()
        ),
    );
    write_executable(&bin.join("sudo"), "#!/bin/sh\nexec \"$@\"\n");
    let out = Command::new(repo.join("scripts/test"))
        .arg("--no-run")
        .env_clear()
        .env("PATH", &bin)
        .current_dir(dir.path())
        .output()
        .expect("run scripts/test");
    InstallRun {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr),
        calls: std::fs::read_to_string(&calls).unwrap_or_default(),
        log: std::fs::read_to_string(repo.join("target/test-install.log")).unwrap_or_default(),
    }
}

/// The `test: TOOL  WHAT` lines, as (tool, what).
fn tool_lines(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("test: "))
        .filter_map(|l| l.split_once(' '))
        .map(|(tool, what)| (tool.to_owned(), what.trim().to_owned()))
        .collect()
}

const TOOLS: [&str; 7] = [
    "redis-server",
    "chromium",
    "npm",
    "bwrap",
    "curl",
    "cargo-nextest",
    "opencode",
];

#[test]
fn scripts_test_installs_quietly_without_recommends_and_says_so_per_tool() {
    // npm is there (the fake installer); bwrap, curl, cargo-nextest, opencode not.
    let run = run_scripts_test(&["redis-server", "chromium"], true);
    assert!(run.status.success(), "{}", run.stdout);
    let lines = tool_lines(&run.stdout);
    let tools: Vec<&str> = lines.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(tools, TOOLS[..], "one line per tool:\n{}", run.stdout);
    for (tool, what) in &lines {
        let expected = if ["redis-server", "chromium", "npm"].contains(&tool.as_str()) {
            "already there"
        } else {
            "installed"
        };
        assert!(what.starts_with(expected), "{tool}: {what}");
    }
    // Debian packages without recommendations; bwrap from the package bubblewrap.
    let apt_installs: Vec<&str> = run
        .calls
        .lines()
        .filter(|c| c.starts_with("apt-get install"))
        .collect();
    assert_eq!(
        apt_installs.len(),
        2,
        "bubblewrap and curl: {apt_installs:?}"
    );
    for call in &apt_installs {
        assert!(call.contains("--no-install-recommends"), "{call}");
    }
    assert!(apt_installs[0].ends_with(" bubblewrap") && apt_installs[1].ends_with(" curl"));
    assert!(
        run.calls
            .contains(&format!("opencode-ai@{}", pinned_opencode_version()))
    );
    // The installers' chatter is in the log, not on the terminal.
    for chatter in ["apt chatter", "cargo chatter", "npm chatter"] {
        assert!(
            run.log.contains(chatter),
            "{chatter} in the log:\n{}",
            run.log
        );
        assert!(
            !run.stdout.contains(chatter),
            "{chatter} printed:\n{}",
            run.stdout
        );
    }
    // Then the suite, with the arguments given.
    assert_eq!(
        run.calls.lines().last(),
        Some("cargo nextest run --all-targets --no-run")
    );
}

#[test]
fn scripts_test_names_each_failed_install_and_the_log_and_runs_nothing() {
    let run = run_scripts_test(&["redis-server", "chromium", "curl"], false);
    assert_eq!(run.status.code(), Some(1), "{}", run.stdout);
    let lines: BTreeMap<String, String> = tool_lines(&run.stdout).into_iter().collect();
    for tool in ["bwrap", "cargo-nextest", "opencode"] {
        let what = &lines[tool];
        assert!(
            what.starts_with("failed") && what.contains("target/test-install.log"),
            "{tool}: {what}"
        );
    }
    for tool in ["redis-server", "chromium", "npm", "curl"] {
        assert_eq!(lines[tool], "already there", "{tool}");
    }
    assert!(
        run.log.contains("(apt error)"),
        "apt's error is logged:\n{}",
        run.log
    );
    assert!(!run.stdout.contains("(apt error)"));
    assert!(
        !run.calls.contains("cargo nextest"),
        "no suite without its tools:\n{}",
        run.calls
    );
}

/// The token scope categories of Forgejo (`models/auth/access_token_scope.go`): a
/// scope is `read:` or `write:` one of them, or `all`.
const FORGEJO_SCOPE_CATEGORIES: &[&str] = &[
    "activitypub",
    "admin",
    "issue",
    "misc",
    "notification",
    "organization",
    "package",
    "repository",
    "user",
];

#[test]
fn token_scopes_named_in_the_guide_and_manifests_are_forgejos() {
    let mut sources = vec![root().join("docs/operations.md")];
    sources.extend(files_under("docker"));
    let mut named = BTreeSet::new();
    for path in sources {
        let text = std::fs::read_to_string(&path).expect("read");
        for (at, _) in text.match_indices(':') {
            let before = &text[..at];
            let access = before
                .rsplit(|c: char| !c.is_ascii_lowercase())
                .next()
                .unwrap_or_default();
            if access != "read" && access != "write" {
                continue;
            }
            let category: String = text[at + 1..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase())
                .collect();
            if category.is_empty() {
                continue;
            }
            assert!(
                FORGEJO_SCOPE_CATEGORIES.contains(&category.as_str()),
                "{} names the token scope {access}:{category}, which Forgejo does not have",
                path.display()
            );
            named.insert(format!("{access}:{category}"));
        }
    }
    // The three identities' scopes are spelled out (docs/operations.md §12.1).
    for scope in ["write:repository", "write:issue", "read:user"] {
        assert!(named.contains(scope), "{scope} is named: {named:?}");
    }
}
