//! The sandbox every agent process runs in (issue 26; docs/security.md §Agents).
//!
//! An agent runs model-written shell commands on text anyone can put into a PR, so the
//! runner treats it as hostile. With `SHEPHERD_AGENT_SANDBOX=on` (the default) each
//! agent is started through bubblewrap (`bwrap`, Debian package `bubblewrap`):
//!
//! - **Its own PID namespace** (`--unshare-pid`), the agent its init (`--as-pid-1`):
//!   when the agent exits, is stopped, or its runner dies (`--die-with-parent`, and
//!   the runner's parent-death signal on bwrap itself), the kernel kills every
//!   process left in the namespace — background, `setsid` and double-forked ones
//!   too — and reports the agent's exit only once they are all gone, so nothing of
//!   the agent runs while the runner reads its files. (With bwrap's own reaper as
//!   init, bwrap would report the agent's exit while the rest still ran.) A stop's
//!   SIGTERM to the process group ends bwrap, whose death signal kills the
//!   namespace. The agent sees only its own processes in `/proc`.
//! - **Another user.** bwrap always runs unprivileged, in a new user namespace
//!   (`--unshare-user`). A runner running as root starts bwrap as `SHEPHERD_AGENT_UID`
//!   (default [`AGENT_UID`]:[`AGENT_GID`], `nobody`:`nogroup`), so the agent cannot read the runner's memory, `/proc`
//!   entries or root's files; a runner that is not root keeps its own uid outside
//!   the namespace, and then the PID namespace, the runner being not dumpable
//!   (`PR_SET_DUMPABLE` 0, [`make_runner_undumpable`]) and the secret files hidden
//!   inside the sandbox are what keep the agent from the runner's secrets.
//! - **Its own folder.** `/` is bound read-only (readable only where the agent's uid
//!   could read it anyway), `/dev` and `/proc` are fresh, `/tmp` and the work dir are
//!   empty tmpfs mounts — no other item's folder is visible — and the item's folder
//!   (0700, its files 0600, owned by the agent's uid) is the one writable place, plus
//!   the operator's `SHEPHERD_AGENT_SANDBOX_WRITABLE` paths (shared caches).
//! - **Only the contract's environment**: bwrap is started with a cleared environment
//!   holding exactly the agent's variables, which it hands on.
//!
//! At start, `shepherd agents` runs [`probe`] (a real sandboxed `true`) and refuses to
//! start when it fails. `SHEPHERD_AGENT_SANDBOX=off` runs agents as before (the
//! runner's user, its process group only), with a warning at every start and "agents
//! unsandboxed" on the status page.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::config::AgentsConfig;

/// The uid a root runner's agents run as by default (`nobody`; `SHEPHERD_AGENT_UID`).
pub const AGENT_UID: u32 = 65534;
/// The gid a root runner's agents run as (`nogroup`).
pub const AGENT_GID: u32 = 65534;

/// How agent processes are contained.
#[derive(Debug, Clone)]
pub enum Sandbox {
    /// `SHEPHERD_AGENT_SANDBOX=off`: the runner's user, its process group only.
    Off,
    /// Through bubblewrap.
    On(Bwrap),
}

/// The bubblewrap sandbox's settings.
#[derive(Debug, Clone)]
pub struct Bwrap {
    /// The `bwrap` binary.
    program: PathBuf,
    /// The uid and gid bwrap (and so the agent) runs as, when the runner is root.
    run_as: Option<(u32, u32)>,
    /// The parent of the per-item folders (hidden behind a tmpfs).
    work_dir: PathBuf,
    /// Extra writable paths (`SHEPHERD_AGENT_SANDBOX_WRITABLE`).
    writable: Vec<PathBuf>,
    /// Paths under the private `/tmp` bound back read-only
    /// (`SHEPHERD_AGENT_SANDBOX_READABLE`).
    readable: Vec<PathBuf>,
    /// Files hidden inside the sandbox (the runner's secret files).
    hidden: Vec<PathBuf>,
}

/// A command line to start, wrapped for the sandbox.
#[derive(Debug, Clone)]
pub struct Wrapped {
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// The user and group the process is started as (root runners only).
    pub run_as: Option<(u32, u32)>,
}

impl Sandbox {
    /// The sandbox `agents` asks for; `hidden` are files never visible to an agent
    /// (the runner's secret files). Fails, saying why, when bwrap is missing or a
    /// writable path would expose the work dir.
    pub fn from_config(agents: &AgentsConfig, hidden: Vec<PathBuf>) -> Result<Self, String> {
        if !agents.sandbox {
            return Ok(Sandbox::Off);
        }
        let program = super::launch::resolve_program("bwrap", std::env::var_os("PATH").as_deref())
            .or_else(|_| super::launch::resolve_program("/usr/bin/bwrap", None))
            .map_err(|e| {
                format!(
                    "the agent sandbox needs bubblewrap (Debian package `bubblewrap`): {e}; \
                     or set SHEPHERD_AGENT_SANDBOX=off"
                )
            })?;
        let work_dir = absolute(&agents.work_dir);
        check_writable(&work_dir, &agents.sandbox_writable)?;
        check_program_visible(agents, &work_dir)?;
        let run_as = (effective_uid() == 0).then_some(agents.agent_uid);
        Ok(Sandbox::On(Bwrap {
            program,
            run_as,
            work_dir,
            writable: agents.sandbox_writable.clone(),
            readable: agents.sandbox_readable.clone(),
            // Under another uid the agent reaches only what others may read (and bwrap,
            // running as that uid, could not even mount over the rest).
            hidden: hidden
                .into_iter()
                .filter(|p| p.exists() && (run_as.is_none() || readable_by_others(p)))
                .collect(),
        }))
    }

    /// Whether agents are sandboxed.
    pub fn is_on(&self) -> bool {
        matches!(self, Sandbox::On(_))
    }

    /// The owner an item's folder and files get (the agent's, for a root runner).
    fn owner(&self) -> Option<(u32, u32)> {
        match self {
            Sandbox::On(b) => b.run_as,
            Sandbox::Off => None,
        }
    }

    /// Makes `path` (a folder: 0700, a file: 0600) the agent's own. With a root
    /// runner the agent's uid owns it; otherwise the runner's uid, which is the
    /// agent's outside its namespace.
    pub fn make_private(&self, path: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let meta = std::fs::symlink_metadata(path)?;
        let mode = if meta.is_dir() { 0o700 } else { 0o600 };
        if !meta.file_type().is_symlink() {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        }
        if let Some((uid, gid)) = self.owner() {
            std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
        }
        Ok(())
    }

    /// Hands a whole tree (the checkout) to the agent's uid (root runners only;
    /// modes are git's).
    pub fn give_tree(&self, root: &Path) -> std::io::Result<()> {
        let Some((uid, gid)) = self.owner() else {
            return Ok(());
        };
        let mut stack = vec![root.to_path_buf()];
        while let Some(p) = stack.pop() {
            std::os::unix::fs::lchown(&p, Some(uid), Some(gid))?;
            let meta = std::fs::symlink_metadata(&p)?;
            if meta.is_dir() {
                for entry in std::fs::read_dir(&p)? {
                    stack.push(entry?.path());
                }
            }
        }
        Ok(())
    }

    /// The environment changes the sandbox makes: `HOME` in the item's folder
    /// (writable, private) and `TMPDIR` on the private `/tmp`.
    pub fn adjust_env(&self, env: &mut Vec<(OsString, OsString)>, home: &Path) {
        if !self.is_on() {
            return;
        }
        env.retain(|(k, _)| k != "HOME" && k != "TMPDIR");
        env.push(("HOME".into(), home.as_os_str().to_owned()));
        env.push(("TMPDIR".into(), "/tmp".into()));
    }

    /// `argv` as it is started: through bwrap, with `item` (the item's folder) the
    /// writable place and `cwd` the agent's working directory.
    pub fn wrap(&self, argv: &[String], item: &Path, cwd: &Path) -> Wrapped {
        match self {
            Sandbox::Off => Wrapped {
                argv: argv.to_vec(),
                run_as: None,
            },
            Sandbox::On(b) => Wrapped {
                argv: b.argv(argv, item, cwd),
                run_as: b.run_as,
            },
        }
    }
}

impl Bwrap {
    /// bwrap's command line around `argv`.
    fn argv(&self, argv: &[String], item: &Path, cwd: &Path) -> Vec<String> {
        let s = |p: &Path| p.display().to_string();
        let mut out: Vec<String> = [
            self.program.display().to_string().as_str(),
            "--unshare-user",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--as-pid-1",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
        ]
        .iter()
        .map(|w| (*w).to_owned())
        .collect();
        for r in &self.readable {
            out.extend(["--ro-bind-try".into(), s(r), s(r)]);
        }
        // The work dir is hidden: by the private /tmp when it is below it, else (or when
        // a readable path brought it back) by a tmpfs of its own.
        if !self.work_dir.starts_with("/tmp")
            || self.readable.iter().any(|r| self.work_dir.starts_with(r))
        {
            out.extend(["--tmpfs".into(), s(&self.work_dir)]);
        }
        for f in &self.hidden {
            out.extend(["--ro-bind".into(), "/dev/null".into(), s(f)]);
        }
        for w in &self.writable {
            out.extend(["--bind-try".into(), s(w), s(w)]);
        }
        out.extend(["--bind".into(), s(item), s(item)]);
        out.extend(["--chdir".into(), s(cwd), "--".into()]);
        out.extend(argv.iter().cloned());
        out
    }
}

/// Refuses an agent program the sandbox would hide: one under `/tmp` (a private tmpfs
/// inside) or under the work dir, unless a readable or writable path brings it back.
/// The failure is at start, naming the setting, rather than an `exit:127` per item.
fn check_program_visible(agents: &AgentsConfig, work_dir: &Path) -> Result<(), String> {
    let Some(program) = agents.command.first() else {
        return Ok(());
    };
    let Ok(found) = super::launch::resolve_program(program, std::env::var_os("PATH").as_deref())
    else {
        return Ok(()); // `agents::run` names a missing program itself.
    };
    let mut paths = vec![absolute(&found)];
    if let Ok(real) = std::fs::canonicalize(&found) {
        paths.push(real);
    }
    let shown = |p: &Path| {
        agents
            .sandbox_readable
            .iter()
            .chain(&agents.sandbox_writable)
            .any(|r| p.starts_with(r))
    };
    match paths
        .iter()
        .find(|p| (p.starts_with("/tmp") || p.starts_with(work_dir)) && !shown(p))
    {
        Some(p) => Err(format!(
            "SHEPHERD_AGENT_COMMAND's program {} is under /tmp or the work dir, which the \
             sandbox replaces with private, empty folders: install it elsewhere, or name its \
             folder in SHEPHERD_AGENT_SANDBOX_READABLE",
            p.display()
        )),
        None => Ok(()),
    }
}

/// Refuses a writable path that holds the work dir (every item's folder would be
/// visible and writable).
fn check_writable(work_dir: &Path, writable: &[PathBuf]) -> Result<(), String> {
    match writable.iter().find(|w| work_dir.starts_with(w)) {
        Some(w) => Err(format!(
            "SHEPHERD_AGENT_SANDBOX_WRITABLE: {} holds the work dir {}: every item's folder would be visible",
            w.display(),
            work_dir.display()
        )),
        None => Ok(()),
    }
}

/// Whether users other than the owner may read `path` (it and every folder above it
/// passable and readable by "others").
fn readable_by_others(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.permissions().mode());
    mode(path) & 0o004 != 0 && path.ancestors().skip(1).all(|dir| mode(dir) & 0o001 != 0)
}

/// The runner's effective uid (the owner of its `/proc/self`; no `unsafe` libc call).
fn effective_uid() -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// `path` made absolute against the current directory (bwrap binds need that).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The runner's secret files (hidden inside every sandbox).
pub fn secret_files(agents: &AgentsConfig) -> Vec<PathBuf> {
    agents
        .reviewer_tokens_file
        .iter()
        .map(|p| absolute(p))
        .collect()
}

/// Tries the sandbox for real: a sandboxed `true` in a folder made like an item's.
/// `Ok` says what the sandbox is; `Err` why it cannot start (for `shepherd agents`'
/// start and `shepherd doctor`).
pub fn probe(agents: &AgentsConfig) -> Result<String, String> {
    let sandbox = Sandbox::from_config(agents, secret_files(agents))?;
    let Sandbox::On(b) = &sandbox else {
        return Ok("off (SHEPHERD_AGENT_SANDBOX=off): agents run as the runner's user".into());
    };
    std::fs::create_dir_all(&agents.work_dir)
        .map_err(|e| format!("cannot create {}: {e}", agents.work_dir.display()))?;
    prepare_work_dir(&sandbox, &agents.work_dir)
        .map_err(|e| format!("{}: {e}", agents.work_dir.display()))?;
    let dir = tempfile::Builder::new()
        .prefix("shepherd-agent-probe-")
        .tempdir_in(&agents.work_dir)
        .map_err(|e| {
            format!(
                "cannot create a folder in {}: {e}",
                agents.work_dir.display()
            )
        })?;
    sandbox.make_private(dir.path()).map_err(|e| {
        format!(
            "cannot hand {} to the agent's user: {e}",
            dir.path().display()
        )
    })?;
    let touch = dir.path().join("probe");
    // Inside: its own PID namespace (it is pid 1) and its folder writable.
    let script = format!("[ \"$$\" = 1 ] && : > '{}'", touch.display());
    let wrapped = sandbox.wrap(
        &["/bin/sh".into(), "-c".into(), script],
        dir.path(),
        dir.path(),
    );
    let mut cmd = std::process::Command::new(&wrapped.argv[0]);
    cmd.args(&wrapped.argv[1..])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir("/")
        .stdin(std::process::Stdio::null());
    if let Some((uid, gid)) = wrapped.run_as {
        use std::os::unix::process::CommandExt as _;
        cmd.uid(uid).gid(gid);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", b.program.display()))?;
    if !out.status.success() || !touch.exists() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "bubblewrap cannot start a sandbox here ({}): {}; it needs user namespaces \
             (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0, and a \
             container runtime that allows them) — or set SHEPHERD_AGENT_SANDBOX=off",
            out.status,
            err.trim()
        ));
    }
    let who = match b.run_as {
        Some((u, g)) => format!("uid {u}, gid {g}"),
        None => format!(
            "the runner's uid {} (not root: no separate uid)",
            effective_uid()
        ),
    };
    Ok(format!(
        "bubblewrap ({}): agents run as {who} in their own user, PID, IPC and UTS namespaces; \
         writable: their own folder, a private /tmp{}",
        b.program.display(),
        b.writable
            .iter()
            .map(|w| format!(", {}", w.display()))
            .collect::<String>()
    ))
}

/// The work dir as the sandbox needs it: a root runner's agents (another uid) must be
/// able to pass through it to their own folder (0711: passing, not listing).
pub fn prepare_work_dir(sandbox: &Sandbox, work_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if sandbox.owner().is_none() {
        return Ok(());
    }
    let meta = std::fs::metadata(work_dir)?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o011 != 0o011 {
        std::fs::set_permissions(work_dir, std::fs::Permissions::from_mode(mode | 0o011))?;
    }
    Ok(())
}

/// Makes the runner process not dumpable: no other process of its uid (an agent
/// outside the sandbox, a debugger) can read its memory or `/proc/<pid>/environ`, and
/// it leaves no core dump with its secrets.
pub fn make_runner_undumpable() -> Result<(), String> {
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("prctl(PR_SET_DUMPABLE, 0): {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bwrap() -> Bwrap {
        Bwrap {
            program: "/usr/bin/bwrap".into(),
            run_as: Some((AGENT_UID, AGENT_GID)),
            work_dir: "/var/lib/shepherd/work".into(),
            writable: vec!["/cache/npm".into()],
            readable: Vec::new(),
            hidden: vec!["/etc/shepherd/reviewers".into()],
        }
    }

    #[test]
    fn readable_paths_come_back_read_only_and_a_work_dir_below_them_stays_hidden() {
        let b = Bwrap {
            work_dir: "/tmp/tools/work".into(),
            readable: vec!["/tmp/tools".into()],
            ..bwrap()
        };
        let line = b
            .argv(
                &["a".into()],
                Path::new("/tmp/tools/work/shepherd-agent-x"),
                Path::new("/tmp/tools/work/shepherd-agent-x"),
            )
            .join(" ");
        let pos = |p: &str| {
            line.find(p)
                .unwrap_or_else(|| panic!("{p:?} missing: {line}"))
        };
        assert!(
            pos("--tmpfs /tmp ") < pos("--ro-bind-try /tmp/tools /tmp/tools"),
            "{line}"
        );
        assert!(
            pos("--ro-bind-try /tmp/tools") < pos("--tmpfs /tmp/tools/work"),
            "{line}"
        );
        assert!(
            pos("--tmpfs /tmp/tools/work") < pos("--bind /tmp/tools/work/shepherd-agent-x"),
            "{line}"
        );
        // A work dir below /tmp and no readable path: the private /tmp hides it.
        let b = Bwrap {
            work_dir: "/tmp".into(),
            readable: vec!["/tmp/tools".into()],
            ..bwrap()
        };
        let line = b
            .argv(&["a".into()], Path::new("/tmp/x"), Path::new("/tmp/x"))
            .join(" ");
        assert!(!line.contains("--tmpfs /tmp/"), "{line}");
    }

    #[test]
    fn an_agent_program_the_sandbox_would_hide_is_refused_at_start() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap(); // under /tmp
        let program = dir.path().join("agent");
        std::fs::write(&program, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut agents = crate::config::AgentsConfig::for_tests(&program.display().to_string());
        agents.work_dir = "/var/lib/shepherd-work".into();
        if !program.starts_with("/tmp") {
            return; // TMPDIR elsewhere: nothing under /tmp to hide.
        }
        let e = check_program_visible(&agents, Path::new("/var/lib/shepherd-work")).unwrap_err();
        assert!(e.contains("SHEPHERD_AGENT_SANDBOX_READABLE"), "{e}");
        agents.sandbox_readable = vec![dir.path().to_owned()];
        assert!(check_program_visible(&agents, Path::new("/var/lib/shepherd-work")).is_ok());
        agents.sandbox_readable.clear();
        agents.sandbox_writable = vec![dir.path().to_owned()];
        assert!(check_program_visible(&agents, Path::new("/var/lib/shepherd-work")).is_ok());
        // A program on PATH outside /tmp is visible as it is.
        let agents = crate::config::AgentsConfig::for_tests("sh");
        assert!(check_program_visible(&agents, Path::new("/tmp")).is_ok());
    }

    #[test]
    fn the_command_line_hides_the_work_dir_and_binds_the_item_last() {
        let argv = bwrap().argv(
            &["opencode".into(), "run".into()],
            Path::new("/var/lib/shepherd/work/shepherd-agent-x"),
            Path::new("/var/lib/shepherd/work/shepherd-agent-x/checkout"),
        );
        let line = argv.join(" ");
        for part in [
            "--unshare-user --unshare-pid",
            "--as-pid-1 --die-with-parent",
            "--die-with-parent",
            "--ro-bind / /",
            "--proc /proc",
            "--tmpfs /tmp",
            "--tmpfs /var/lib/shepherd/work",
            "--ro-bind /dev/null /etc/shepherd/reviewers",
            "--bind-try /cache/npm /cache/npm",
            "--bind /var/lib/shepherd/work/shepherd-agent-x /var/lib/shepherd/work/shepherd-agent-x",
            "--chdir /var/lib/shepherd/work/shepherd-agent-x/checkout -- opencode run",
        ] {
            assert!(line.contains(part), "{part:?} missing: {line}");
        }
        let pos = |p: &str| line.find(p).unwrap();
        assert!(pos("--tmpfs /var/lib") < pos("--bind /var/lib"), "{line}");
        assert!(line.ends_with("-- opencode run"), "{line}");
    }

    #[test]
    fn a_writable_path_holding_the_work_dir_is_refused() {
        let work = Path::new("/var/lib/shepherd/work");
        let e = check_writable(work, &["/cache".into(), "/var/lib".into()]).unwrap_err();
        assert!(e.contains("/var/lib holds the work dir"), "{e}");
        assert!(check_writable(work, &["/cache".into(), "/var/lib/other".into()]).is_ok());
    }

    #[test]
    fn only_files_others_can_read_need_hiding_from_another_uid() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let open = dir.path().join("open");
        std::fs::write(&open, "x").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let closed = dir.path().join("closed");
        std::fs::write(&closed, "x").unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o600)).unwrap();
        let parents_open = Path::new("/tmp")
            .ancestors()
            .all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
        assert_eq!(readable_by_others(&open), parents_open);
        assert!(!readable_by_others(&closed));
    }

    #[test]
    fn off_wraps_nothing_and_keeps_the_environment() {
        let w = Sandbox::Off.wrap(&["a".into()], Path::new("/x"), Path::new("/x"));
        assert_eq!(w.argv, ["a"]);
        assert_eq!(w.run_as, None);
        let mut env = vec![("HOME".into(), "/root".into())];
        Sandbox::Off.adjust_env(&mut env, Path::new("/x/home"));
        assert_eq!(env, [(OsString::from("HOME"), OsString::from("/root"))]);
        let mut env = vec![("HOME".into(), "/root".into())];
        Sandbox::On(bwrap()).adjust_env(&mut env, Path::new("/x/home"));
        assert!(env.contains(&("HOME".into(), "/x/home".into())), "{env:?}");
    }
}
