//! The `exec` launcher: turns `SHEPHERD_AGENT_COMMAND` into one agent process per work
//! item, and stops it.
//!
//! - **Words, not a shell.** The command line is split once at start like a POSIX
//!   shell splits words (quotes, backslashes; `shlex`), and each placeholder is
//!   replaced *inside* a word afterwards, so a value (a model id, a path) can never
//!   become two arguments or run anything. The program (first word) must exist at
//!   start ([`resolve_program`]).
//! - **Environment from an allow-list.** The child's environment is cleared and then
//!   gets only the allowed variables of the runner's environment
//!   ([`crate::config::AGENT_ENV_ALLOWED`] plus `SHEPHERD_AGENT_ENV`), read once at
//!   start, and the work item's `SHEPHERD_*` variables: none of Shepherd's secrets
//!   (Forgejo token, webhook secrets, admin/agent tokens, a Redis URL with a password)
//!   can reach an agent.
//! - **Own process group.** The agent leads a new process group, so a stop reaches
//!   everything it started: SIGTERM to the group, SIGKILL after the grace period, and
//!   SIGKILL to whatever of the group is left once the leader has exited.
//! - **Dies with its runner.** The child asks the kernel for SIGKILL when its parent
//!   goes (`PR_SET_PDEATHSIG`), so a runner that crashes takes its agents with it and a
//!   reclaimed work item never runs twice at once. Linux sends that signal when the
//!   *thread* that forked the child exits, not the process, so children are forked by
//!   one dedicated thread ([`Spawner`]) that lives as long as the runner — never from
//!   tokio's blocking pool, whose idle threads exit after a few seconds, which would
//!   kill a healthy agent. The check of the parent pid right after the `prctl` closes
//!   the window in which the runner died between fork and `prctl`.
//!
//! Setting the parent-death signal needs code between `fork` and `exec`
//! (`CommandExt::pre_exec`), which Rust marks `unsafe`: it is the crate's one
//! audited `unsafe` block (docs/security.md §Unsafe code).

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getppid};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use super::usage::Live;

/// How long the output readers may take after the process group is gone (a process
/// that left the group may still hold the pipes).
const OUTPUT_DRAIN: Duration = Duration::from_secs(5);

/// The values of the placeholders of one work item.
#[derive(Debug, Clone, Default)]
pub struct Placeholders {
    /// `{agent}`: the agent of the work item's kind (policy `agents`).
    pub agent: String,
    /// `{model}`: the model of the tier (policy `models`, else the tier's name).
    pub model: String,
    /// `{tier}`: the tier number.
    pub tier: String,
    /// `{tier_name}`: the tier's name.
    pub tier_name: String,
    /// `{kind}`: the work kind (`ci-fix`, …).
    pub kind: String,
    /// `{prompt_file}`: path of the file holding the prompt.
    pub prompt_file: String,
    /// `{work_file}`: path of the file holding the work item JSON.
    pub work_file: String,
}

/// Fills the placeholders into each word (a word stays one argument, whatever the
/// values contain). Unknown `{…}` text is left as it is.
pub fn expand(words: &[String], p: &Placeholders) -> Vec<String> {
    let table = [
        ("{agent}", &p.agent),
        ("{model}", &p.model),
        ("{tier}", &p.tier),
        ("{tier_name}", &p.tier_name),
        ("{kind}", &p.kind),
        ("{prompt_file}", &p.prompt_file),
        ("{work_file}", &p.work_file),
    ];
    words
        .iter()
        .map(|w| {
            // One pass over the word, so a value that contains a placeholder's name is
            // never expanded again.
            let mut out = String::with_capacity(w.len());
            let mut rest = w.as_str();
            'scan: while !rest.is_empty() {
                if rest.starts_with('{') {
                    for (name, value) in &table {
                        if let Some(after) = rest.strip_prefix(name) {
                            out.push_str(value);
                            rest = after;
                            continue 'scan;
                        }
                    }
                }
                let c = rest.chars().next().expect("rest is not empty");
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
            out
        })
        .collect()
}

/// Finds the program of the command line: a path (containing `/`) must be an
/// executable file; a bare name is looked up in `path` (the runner's `PATH`, which the
/// agent inherits). The error says which, for a clear failure at start.
pub fn resolve_program(program: &str, path: Option<&std::ffi::OsStr>) -> Result<PathBuf, String> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return match executable(&p) {
            true => Ok(p),
            false => Err(format!(
                "{program} does not exist or is not an executable file"
            )),
        };
    }
    let path = path.unwrap_or_default();
    std::env::split_paths(path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
        .ok_or_else(|| format!("{program} was not found on PATH"))
}

/// One agent process to start.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// The program and its arguments, placeholders filled in.
    pub argv: Vec<String>,
    /// The complete environment of the child.
    pub env: Vec<(OsString, OsString)>,
    /// Working directory.
    pub dir: PathBuf,
    /// Written to the child's stdin, which is then closed.
    pub stdin: String,
    /// The uid and gid the process is started as (a root runner's sandbox:
    /// [`super::sandbox`]); `None`: the runner's.
    pub run_as: Option<(u32, u32)>,
}

/// Forks agent processes from one thread that lives as long as the runner (see the
/// module docs: the parent-death signal follows the forking thread).
#[derive(Clone)]
pub struct Spawner {
    /// Requests to the spawning thread.
    tx: std::sync::mpsc::Sender<SpawnRequest>,
}

/// A command to spawn and where the child goes.
type SpawnRequest = (Command, oneshot::Sender<io::Result<Child>>);

impl Spawner {
    /// Starts the spawning thread; it spawns inside `runtime` (tokio's process reaper
    /// and pipes belong to it) and ends when the last [`Spawner`] clone is dropped.
    pub fn start(runtime: tokio::runtime::Handle) -> io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("agent-spawner".into())
            .spawn(move || {
                let _entered = runtime.enter();
                while let Ok((mut cmd, reply)) = rx.recv() {
                    let _ = reply.send(cmd.spawn());
                }
            })?;
        Ok(Self { tx })
    }

    /// Starts `inv`: its own process group, the parent-death signal, the prompt on
    /// stdin, stdout and stderr captured into `capture` and told to `live` (stdout's
    /// events metered, both streams' bytes counting as activity for the idle guard).
    pub async fn launch(
        &self,
        inv: &Invocation,
        capture: Arc<Mutex<Capture>>,
        live: Arc<Live>,
    ) -> io::Result<Agent> {
        let (program, args) = inv
            .argv
            .split_first()
            .ok_or_else(|| io::Error::other("empty command line"))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(inv.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&inv.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some((uid, gid)) = inv.run_as {
            // std drops the supplementary groups too (setgroups) when root switches.
            cmd.uid(uid).gid(gid);
        }
        // After the switch of user (std runs pre_exec hooks last), so the kernel keeps
        // the parent-death signal.
        set_parent_death_signal(&mut cmd);
        let (reply, child) = oneshot::channel();
        self.tx
            .send((cmd, reply))
            .map_err(|_| io::Error::other("the spawning thread is gone"))?;
        let mut child = child
            .await
            .map_err(|_| io::Error::other("the spawning thread dropped the request"))??;
        let pid = child
            .id()
            .ok_or_else(|| io::Error::other("the agent exited at once"))?;
        if let Some(mut stdin) = child.stdin.take() {
            let prompt = inv.stdin.clone().into_bytes();
            // An agent that never reads stdin must not block anything: the write ends
            // with the pipe (EPIPE) when the agent exits.
            tokio::spawn(async move {
                let _ = stdin.write_all(&prompt).await;
                let _ = stdin.shutdown().await;
            });
        }
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(tokio::spawn(drain(
                out,
                capture.clone(),
                live.clone(),
                true,
            )));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(tokio::spawn(drain(err, capture, live, false)));
        }
        let pgid = Pid::from_raw(i32::try_from(pid).map_err(io::Error::other)?);
        Ok(Agent {
            child,
            pid,
            pgid,
            readers,
        })
    }
}

/// Asks the kernel to SIGKILL the child when the thread that forked it (the spawning
/// thread, alive as long as the runner) ends; fails the spawn when the runner is
/// already gone.
fn set_parent_death_signal(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before `exec`, where only
    // async-signal-safe calls are allowed. It makes two system calls, prctl(2) and
    // getppid(2) (both async-signal-safe), allocates nothing, takes no lock, and
    // touches no state shared with the parent; `parent` is a plain integer copied in.
    #[expect(
        unsafe_code,
        reason = "pre_exec is the only way to set PR_SET_PDEATHSIG in the child; audited above"
    )]
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if u32::try_from(getppid().as_raw()).ok() != Some(parent) {
                return Err(io::Error::other("the runner exited during the spawn"));
            }
            Ok(())
        });
    }
}

/// Reads one output pipe into the capture until it closes, telling `live` (its events
/// metered when `events`).
async fn drain(
    mut pipe: impl AsyncRead + Unpin,
    capture: Arc<Mutex<Capture>>,
    live: Arc<Live>,
    events: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                capture.lock().expect("capture lock").push(&buf[..n]);
                live.output(&buf[..n], events);
            }
        }
    }
}

/// An agent's output, the newest `cap` bytes of it.
#[derive(Debug)]
pub struct Capture {
    /// Bytes kept (up to twice `cap` between trims).
    buf: Vec<u8>,
    /// Bytes to keep.
    cap: usize,
    /// Bytes dropped from the front.
    dropped: u64,
}

impl Capture {
    /// An empty capture keeping `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self {
            buf: Vec::new(),
            cap,
            dropped: 0,
        }
    }

    /// Appends output, dropping the oldest bytes past the cap.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > 2 * self.cap {
            self.trim();
        }
    }

    fn trim(&mut self) {
        if self.buf.len() > self.cap {
            let cut = self.buf.len() - self.cap;
            self.buf.drain(..cut);
            self.dropped += cut as u64;
        }
    }

    /// Total bytes the agent wrote.
    pub fn total(&self) -> u64 {
        self.dropped + self.buf.len() as u64
    }

    /// The kept output as text (lossy UTF-8), with a first line saying how much was
    /// dropped, if anything.
    pub fn text(&mut self) -> String {
        self.trim();
        let kept = String::from_utf8_lossy(&self.buf).into_owned();
        match self.dropped {
            0 => kept,
            n => format!("[… {n} earlier bytes of output dropped]\n{kept}"),
        }
    }
}

/// A started agent.
pub struct Agent {
    /// The process (the group's leader).
    child: Child,
    /// Its pid.
    pub pid: u32,
    /// Its process group (= its pid).
    pgid: Pid,
    /// The output readers.
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Agent {
    /// Waits for the agent to exit on its own.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Stops the whole process group: SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) -> io::Result<ExitStatus> {
        let _ = killpg(self.pgid, Signal::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                let _ = killpg(self.pgid, Signal::SIGKILL);
                self.child.wait().await
            }
        }
    }

    /// Kills the whole process group at once (SIGKILL, no grace: a run stopped for a
    /// limit must not spend more) and waits for the leader. In the sandbox the leader
    /// is bwrap, whose death takes the agent's whole PID namespace with it.
    pub async fn kill(&mut self) -> io::Result<ExitStatus> {
        let _ = killpg(self.pgid, Signal::SIGKILL);
        self.child.wait().await
    }

    /// After the leader exited: kills what is left of its group (background
    /// processes it started) and waits for the output readers.
    pub async fn finish(self) {
        let _ = killpg(self.pgid, Signal::SIGKILL);
        for r in self.readers {
            let abort = r.abort_handle();
            if tokio::time::timeout(OUTPUT_DRAIN, r).await.is_err() {
                abort.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        shlex::split(s).unwrap()
    }

    #[test]
    fn placeholders_fill_words_and_never_split_them() {
        let p = Placeholders {
            agent: "implementation-worker".into(),
            model: "stub/m {agent} x".into(),
            tier: "2".into(),
            tier_name: "sonnet".into(),
            kind: "ci-fix".into(),
            prompt_file: "/tmp/w 1/prompt.md".into(),
            work_file: "/tmp/w 1/work.json".into(),
        };
        let argv = expand(
            &words(
                "opencode run --agent {agent} -m={model} 'tier {tier}/{tier_name}' {kind} {prompt_file} {work_file} {other}",
            ),
            &p,
        );
        assert_eq!(
            argv,
            [
                "opencode",
                "run",
                "--agent",
                "implementation-worker",
                "-m=stub/m {agent} x",
                "tier 2/sonnet",
                "ci-fix",
                "/tmp/w 1/prompt.md",
                "/tmp/w 1/work.json",
                "{other}"
            ]
        );
    }

    #[test]
    fn programs_resolve_on_path_or_by_path() {
        let path = std::env::var_os("PATH");
        assert!(resolve_program("sh", path.as_deref()).is_ok());
        let e = resolve_program("no-such-agent-xyz", path.as_deref()).unwrap_err();
        assert!(e.contains("not found on PATH"), "{e}");
        let e = resolve_program("/no/such/agent", path.as_deref()).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn capture_keeps_the_newest_bytes_and_says_what_it_dropped() {
        let mut c = Capture::new(8);
        for _ in 0..10 {
            c.push(b"0123456789");
        }
        assert_eq!(c.total(), 100);
        let t = c.text();
        assert!(
            t.starts_with("[… 92 earlier bytes of output dropped]\n"),
            "{t}"
        );
        assert!(t.ends_with("23456789"), "{t}");
    }
}
