//! Live usage of an agent run and the runaway guards (issue 28): with
//! `SHEPHERD_AGENT_USAGE=opencode-json` the runner reads the JSON events
//! `opencode run --format json` prints on stdout, one per line, as the agent runs —
//! tokens by kind, cost, model steps, tool calls — and stops the agent (its whole
//! sandbox) when its usage reaches the work item's `limits`: the run's budget
//! (`over-budget`), `max_steps` (`over-steps`), `max_tool_calls` (`over-tool-calls`), the
//! same tool call with the same arguments `max_repeats` times in a row (`loop`); and,
//! with or without live usage, no output for `idle_secs` (`idle`).
//!
//! The events, as opencode-ai 1.18.33 prints them (`packages/opencode/src/cli/cmd/run.ts`
//! of sst/opencode, read in the pinned binary): each line is
//! `JSON.stringify({type, timestamp, sessionID, ...data})`, `type` first:
//! - `{"type":"step_start","part":{…}}` when a model step begins;
//! - `{"type":"step_finish","part":{"type":"step-finish","reason":…,"cost":USD,
//!   "tokens":{"total":…,"input":…,"output":…,"reasoning":…,"cache":{"read":…,"write":…}}}}`
//!   when it ends (`session/processor.ts` writes the step's `cost` and `tokens`;
//!   `session/index.ts` `getUsage` computes them: `input` excludes cache reads and writes,
//!   `output` excludes reasoning, and `cost` is each kind times the model's price per
//!   million tokens of `opencode.json`'s `cost`, reasoning at the output price);
//! - `{"type":"tool_use","part":{"type":"tool","tool":NAME,"state":{"status":"completed"
//!   or "error","input":{…},…}}}` when a tool call ends;
//! - `text`, `reasoning`, `error` (not counted here).
//!
//! **Trust boundary.** These lines are self-reported by a process the model steers: a
//! tool the agent runs can write to opencode's stdout, so a line can be forged, garbled or
//! cut. The rules: every event that parses *adds* (counts only grow — no event sets,
//! lowers or replaces a figure, and negative or non-finite numbers count as 0), so a
//! forged line can only bring a stop nearer; a real event is found even behind garbage on
//! its line (every `{"type":"…` on a line is tried, so bytes written without a newline
//! before it cannot hide it; a `step_start` counts by its type alone, a `step_finish` in the plain shape opencode
//! writes is read by a strict scan (`usage_step.rs`: whenever it answers, it answers as
//! serde would; anything else is parsed by serde), a `tool_use` is read only up to its call (by a
//! strict scan in the plain shape, `usage_tool.rs`, else by serde, `tool_call.rs`), and the scan
//! goes on inside it, where a JSON string hides no event but the call's arguments —
//! the model's own JSON — may hold a forged one, which again only adds); a line longer
//! than [`MAX_LINE`] is not parsed, but a tool call it announces still counts. What this cannot see is usage opencode never prints (a
//! step killed before its `step_finish`, the session-title request, which opencode does
//! not count): the model server's own figures are the truth, and the tests compare with
//! the stub model server's sums.

use std::sync::Mutex;
use std::time::Instant;

use serde::Deserialize;

pub use crate::config::UsageSource;

#[path = "usage_scan.rs"]
mod scan;
#[path = "usage_step.rs"]
mod step_finish;
#[path = "tool_call.rs"]
mod tool_call;
#[path = "usage_tool.rs"]
mod tool_scan;
use crate::core::usage::{RunLimits, StopReason, Usage, usd_to_micros};
use step_finish::Figures;

/// Longest output line parsed for events; a longer one (a tool call with a huge output)
/// is skipped, but a `tool_use` at its start still counts as a tool call.
pub const MAX_LINE: usize = 4 * 1024 * 1024;

/// The event types counted, as their lines start (`JSON.stringify` puts `type` first
/// and writes no spaces).
const STEP_START: &[u8] = br#"{"type":"step_start""#;
const STEP_FINISH: &[u8] = br#"{"type":"step_finish""#;
const TOOL_USE: &[u8] = br#"{"type":"tool_use""#;
/// What every event starts with.
const EVENT: &[u8] = br#"{"type":""#;

/// A `step_finish` line.
#[derive(Deserialize)]
struct StepFinish {
    /// The step-finish part.
    part: StepPart,
}

/// A step-finish part: what the step cost.
#[derive(Deserialize, Default)]
#[serde(default)]
struct StepPart {
    /// Cost in USD.
    cost: f64,
    /// Tokens by kind.
    tokens: StepTokens,
}

/// Tokens of one step.
#[derive(Deserialize, Default)]
#[serde(default)]
struct StepTokens {
    /// Input, cache not included.
    input: f64,
    /// Output, reasoning not included.
    output: f64,
    /// Reasoning.
    reasoning: f64,
    /// Cache reads and writes.
    cache: CacheTokens,
}

impl StepPart {
    /// The step's figures.
    fn figures(&self) -> Figures {
        let t = &self.tokens;
        Figures {
            cost: self.cost,
            input: t.input,
            output: t.output,
            reasoning: t.reasoning,
            read: t.cache.read,
            write: t.cache.write,
        }
    }
}

/// Cache tokens of one step.
#[derive(Deserialize, Default)]
#[serde(default)]
struct CacheTokens {
    /// Read from the prompt cache.
    read: f64,
    /// Written to the prompt cache.
    write: f64,
}

/// A token count from a JSON number: non-negative and finite, else 0.
fn count(n: f64) -> u64 {
    if n.is_finite() && n > 0.0 {
        // `as` saturates at u64::MAX.
        n.round() as u64
    } else {
        0
    }
}

/// Where `needle` starts in `hay` at or after `from`.
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let first = *needle.first()?;
    let mut i = from;
    while i + needle.len() <= hay.len() {
        let j = i + memchr::memchr(first, &hay[i..])?;
        if hay.len() - j < needle.len() {
            return None;
        }
        if &hay[j..j + needle.len()] == needle {
            return Some(j);
        }
        i = j + 1;
    }
    None
}

/// Counts one run's usage from its output and decides when a limit stops it. Pure:
/// bytes in, figures and a verdict out ([`Live`] shares it with the runner).
#[derive(Debug, Default)]
pub struct Meter {
    /// The limits of the run.
    limits: RunLimits,
    /// Usage so far.
    usage: Usage,
    /// The last tool call (tool and arguments), for the loop guard.
    last_call: Option<(String, String)>,
    /// How many times in a row it came.
    repeats: u32,
    /// The first limit reached, once one is.
    verdict: Option<StopReason>,
    /// The current line, not yet ended.
    line: Vec<u8>,
    /// The current line passed [`MAX_LINE`]: skip to its end.
    overflow: bool,
}

impl Meter {
    /// A meter for a run held to `limits`.
    pub fn new(limits: RunLimits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    /// Usage so far.
    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    /// The first limit reached, if any.
    pub fn verdict(&self) -> Option<StopReason> {
        self.verdict
    }

    /// Takes output bytes (any chunking); complete lines are parsed — in place when a
    /// line lies whole in `bytes`, copied only when it spans chunks.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while let Some(nl) = memchr::memchr(b'\n', bytes) {
            let part = &bytes[..nl];
            if self.line.is_empty() && !self.overflow && part.len() <= MAX_LINE {
                self.parse_line(part);
            } else {
                self.take_part(part);
                if !self.overflow {
                    let line = std::mem::take(&mut self.line);
                    self.parse_line(&line);
                    self.line = line;
                }
            }
            self.line.clear();
            self.overflow = false;
            bytes = &bytes[nl + 1..];
        }
        self.take_part(bytes);
    }

    /// Appends part of a line, switching to skipping when it grows past [`MAX_LINE`].
    fn take_part(&mut self, part: &[u8]) {
        if self.overflow {
            return;
        }
        if self.line.len() + part.len() > MAX_LINE {
            // Too long to parse; a tool call it announces still counts (with unknown
            // arguments, which also ends a run of repeats).
            let mut head = std::mem::take(&mut self.line);
            head.extend_from_slice(&part[..part.len().min(TOOL_USE.len())]);
            if head.starts_with(TOOL_USE) {
                self.tool_call(None);
            }
            self.overflow = true;
            return;
        }
        self.line.extend_from_slice(part);
    }

    /// Every event on one line (garbage before an event does not hide it).
    fn parse_line(&mut self, line: &[u8]) {
        let mut at = 0;
        while let Some(start) = find(line, EVENT, at) {
            let rest = &line[start..];
            let used = if rest.starts_with(STEP_FINISH) {
                // The plain shape opencode writes is scanned ([`step_finish`]); anything
                // else is parsed by serde, which decides.
                match step_finish::read(rest) {
                    Some((figures, used)) => {
                        self.step_finished(&figures);
                        Some(used)
                    }
                    None => self.parse_one::<StepFinish>(rest, |m, e| {
                        m.step_finished(&e.part.figures());
                    }),
                }
            } else if rest.starts_with(TOOL_USE) {
                // Read up to the call only, by a strict scan of the plain shape
                // ([`tool_scan`]: whenever it answers, it answers as serde would) or else
                // by serde ([`tool_call`]); the scan goes on after the event's start,
                // through its output, which holds no event.
                if let Some(call) = tool_scan::read(rest) {
                    self.tool_call(Some(call));
                    Some(1)
                } else {
                    tool_call::read(rest).map(|call| {
                        let tool = call.tool.as_deref().unwrap_or_default();
                        let args = call.input.map_or("null", |raw| raw.get());
                        self.tool_call(Some((tool, args)));
                        1
                    })
                }
            } else if rest.starts_with(STEP_START) {
                // Its type is all a step's start says: no need to read the rest (the
                // scan goes on after the type, and a step's parts hold no event).
                self.step_started();
                Some(STEP_START.len())
            } else {
                None
            };
            at = start + used.unwrap_or(1);
        }
    }

    /// Parses one JSON value of type `T` at the start of `text` and hands it to `then`;
    /// the bytes it took, or `None` when it is not one.
    fn parse_one<'a, T: Deserialize<'a>>(
        &mut self,
        text: &'a [u8],
        then: impl FnOnce(&mut Self, T),
    ) -> Option<usize> {
        let mut stream = serde_json::Deserializer::from_slice(text).into_iter::<T>();
        let value = stream.next()?.ok()?;
        let used = stream.byte_offset();
        then(self, value);
        Some(used.max(1))
    }

    /// A model step began: a step past `max_steps` is stopped as it starts.
    fn step_started(&mut self) {
        if let Some(max) = self.limits.max_steps
            && self.usage.steps >= max
        {
            self.stop(StopReason::OverSteps);
        }
    }

    /// A model step ended: its tokens and cost are added.
    fn step_finished(&mut self, f: &Figures) {
        let u = &mut self.usage;
        u.input_tokens = u.input_tokens.saturating_add(count(f.input));
        u.output_tokens = u.output_tokens.saturating_add(count(f.output));
        u.reasoning_tokens = u.reasoning_tokens.saturating_add(count(f.reasoning));
        u.cache_read_tokens = u.cache_read_tokens.saturating_add(count(f.read));
        u.cache_write_tokens = u.cache_write_tokens.saturating_add(count(f.write));
        u.cost_micros = u.cost_micros.saturating_add(usd_to_micros(f.cost));
        u.steps = u.steps.saturating_add(1);
        self.check();
    }

    /// A tool call ended (`None`: its arguments are unknown). The last call is kept
    /// (copied into the last one's buffers) only when it differs from the one before.
    fn tool_call(&mut self, call: Option<(&str, &str)>) {
        self.usage.tool_calls = self.usage.tool_calls.saturating_add(1);
        let same = matches!((call, &self.last_call),
            (Some((tool, args)), Some((last_tool, last_args))) if tool == last_tool && args == last_args);
        if same {
            self.repeats = self.repeats.saturating_add(1);
        } else {
            self.repeats = u32::from(call.is_some());
            match (call, &mut self.last_call) {
                // The buffers of the last call are reused.
                (Some((tool, args)), Some((last_tool, last_args))) => {
                    last_tool.clear();
                    last_tool.push_str(tool);
                    last_args.clear();
                    last_args.push_str(args);
                }
                (call, last) => *last = call.map(|(t, a)| (t.to_owned(), a.to_owned())),
            }
        }
        self.check();
    }

    /// Stops the run for the first limit its usage reached: the budget (its cost or its
    /// input + output tokens reached the cap: nothing is left for another step), more
    /// steps or tool calls than allowed, `max_repeats` same calls in a row.
    fn check(&mut self) {
        let l = &self.limits;
        let u = &self.usage;
        let reason = if l.usd_micros.is_some_and(|cap| u.cost_micros >= cap)
            || l.tokens.is_some_and(|cap| u.budget_tokens() >= cap)
        {
            Some(StopReason::OverBudget)
        } else if l.max_steps.is_some_and(|max| u.steps > max) {
            Some(StopReason::OverSteps)
        } else if l.max_tool_calls.is_some_and(|max| u.tool_calls > max) {
            Some(StopReason::OverToolCalls)
        } else if l
            .max_repeats
            .is_some_and(|max| max > 0 && self.repeats >= max)
        {
            Some(StopReason::Loop)
        } else {
            None
        };
        if let Some(r) = reason {
            self.stop(r);
        }
    }

    /// Records the first stop reason (later ones do not replace it).
    fn stop(&mut self, reason: StopReason) {
        self.verdict.get_or_insert(reason);
    }
}

/// A run's meter shared between the output readers and the runner's job: the readers
/// feed it, the job waits for a verdict (or idleness) and reads the usage at the end.
#[derive(Debug)]
pub struct Live {
    /// The meter and the time of the last output.
    state: Mutex<LiveState>,
    /// Woken when a verdict is reached.
    notify: tokio::sync::Notify,
    /// Where the meter's CPU time is counted, in seconds
    /// (`shepherd_agent_usage_meter_cpu_seconds_total`), when it is.
    meter_cpu: Option<prometheus::Counter>,
}

/// What [`Live`] guards.
#[derive(Debug)]
struct LiveState {
    /// The meter (`None`: no live usage; output only counts for idleness).
    meter: Option<Meter>,
    /// When the agent last wrote anything.
    last_output: Instant,
}

impl Live {
    /// A run's live state: metered with `source`, held to `limits`.
    pub fn new(source: UsageSource, limits: &RunLimits) -> Self {
        let meter = match source {
            UsageSource::Off => None,
            UsageSource::OpencodeJson => Some(Meter::new(limits.clone())),
        };
        Self {
            state: Mutex::new(LiveState {
                meter,
                last_output: Instant::now(),
            }),
            notify: tokio::sync::Notify::new(),
            meter_cpu: None,
        }
    }

    /// Counts the CPU time the meter spends in `counter` (seconds): each feed of an
    /// output chunk is timed with the calling thread's CPU clock.
    #[must_use]
    pub fn counting_cpu_in(mut self, counter: prometheus::Counter) -> Self {
        self.meter_cpu = Some(counter);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LiveState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The agent wrote `bytes` (on stdout when `events`: they are metered).
    pub fn output(&self, bytes: &[u8], events: bool) {
        let verdict = {
            let mut s = self.lock();
            s.last_output = Instant::now();
            let Some(meter) = s.meter.as_mut().filter(|_| events) else {
                return;
            };
            let before = meter.verdict();
            // The feed is synchronous and runs on the reader's thread (a runtime worker),
            // so that thread's CPU clock around it is the meter's own CPU time.
            let started = self.meter_cpu.as_ref().and_then(|_| thread_cpu());
            meter.feed(bytes);
            if let (Some(counter), Some(started), Some(ended)) =
                (&self.meter_cpu, started, thread_cpu())
            {
                counter.inc_by(ended.saturating_sub(started).as_secs_f64());
            }
            meter.verdict().filter(|_| before.is_none())
        };
        if verdict.is_some() {
            self.notify.notify_one();
        }
    }

    /// When the agent last wrote anything (its start, before that).
    pub fn last_output(&self) -> Instant {
        self.lock().last_output
    }

    /// Waits until a limit is reached; its reason.
    pub async fn verdict(&self) -> StopReason {
        loop {
            let notified = self.notify.notified();
            if let Some(v) = self.lock().meter.as_ref().and_then(Meter::verdict) {
                return v;
            }
            notified.await;
        }
    }

    /// The usage counted so far (`None` without live usage).
    pub fn usage(&self) -> Option<Usage> {
        self.lock().meter.as_ref().map(|m| m.usage().clone())
    }
}

/// The calling thread's CPU time so far (`CLOCK_THREAD_CPUTIME_ID`), when the clock
/// can be read.
fn thread_cpu() -> Option<std::time::Duration> {
    use nix::time::{ClockId, clock_gettime};
    let t = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).ok()?;
    Some(std::time::Duration::from(t))
}

/// The usage to report for a run: the live usage (when metered), raised to what the
/// result file claims when that is higher (its `tokens` count as input tokens, since it
/// does not say which kind) — the higher claim counts, so neither source can lower the
/// other — with the run's model (the one Shepherd asked for, when none was seen) and
/// wall time.
pub fn final_usage(
    live: Option<Usage>,
    file_tokens: Option<u64>,
    file_cost: Option<f64>,
    model: &str,
    wall_ms: u64,
) -> Usage {
    let mut u = live.unwrap_or_default();
    if let Some(t) = file_tokens
        && t > u.budget_tokens()
    {
        u.input_tokens = u.input_tokens.saturating_add(t - u.budget_tokens());
    }
    if let Some(c) = file_cost {
        u.cost_micros = u.cost_micros.max(usd_to_micros(c));
    }
    if u.model.is_none() && !model.is_empty() {
        u.model = Some(model.to_owned());
    }
    u.wall_ms = wall_ms;
    u
}

/// Returns once the agent has written nothing for `idle_secs` (never without the
/// guard).
pub async fn idle(live: &Live, idle_secs: Option<u64>) {
    let Some(secs) = idle_secs.filter(|s| *s > 0) else {
        return std::future::pending().await;
    };
    let idle = std::time::Duration::from_secs(secs);
    loop {
        let due = live.last_output() + idle;
        if Instant::now() >= due {
            return;
        }
        tokio::time::sleep_until(due.into()).await;
    }
}

/// Counts what a run used: tokens by type and cost, by repository, kind and model.
pub fn count_metrics(
    m: &crate::telemetry::AgentMetrics,
    run: &crate::store::agent_runs::AgentRun,
    u: &Usage,
) {
    let model = u.model.as_deref().unwrap_or(run.model.as_str());
    let labels = [run.repo.as_str(), run.kind.as_str(), model];
    for (kind, n) in [
        ("input", u.input_tokens),
        ("output", u.output_tokens),
        ("reasoning", u.reasoning_tokens),
        ("cache_read", u.cache_read_tokens),
        ("cache_write", u.cache_write_tokens),
    ] {
        if n > 0 {
            m.tokens
                .with_label_values(&[labels[0], labels[1], labels[2], kind])
                .inc_by(n);
        }
    }
    if u.cost_micros > 0 {
        m.cost.with_label_values(&labels).inc_by(u.cost_usd());
    }
}

/// One line saying why the runner stopped a run and what it had used, for the
/// attempt's summary.
pub fn describe(reason: StopReason, usage: &Usage, limits: &RunLimits) -> String {
    let opt = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
    let why = match reason {
        StopReason::OverBudget => {
            let mut caps = Vec::new();
            if let Some(cap) = limits.usd_micros {
                let cap = crate::core::usage::micros_to_usd(cap);
                caps.push(format!("${:.6} of ${cap:.6}", usage.cost_usd()));
            }
            if let Some(cap) = limits.tokens {
                let used = usage.budget_tokens();
                caps.push(format!("{used} of {cap} input + output tokens"));
            }
            format!(
                "its usage reached the run's budget ({}): {}",
                limits.budget_scope.as_deref().unwrap_or("run"),
                caps.join(", ")
            )
        }
        StopReason::OverSteps => format!(
            "more than {} model steps (max_steps_per_run)",
            opt(limits.max_steps.map(u64::from))
        ),
        StopReason::OverToolCalls => format!(
            "more than {} tool calls (max_tool_calls_per_run)",
            opt(limits.max_tool_calls.map(u64::from))
        ),
        StopReason::Idle => format!(
            "no output for {} s (agent_idle_timeout_secs)",
            opt(limits.idle_secs)
        ),
        StopReason::Loop => format!(
            "the same tool call with the same arguments {} times in a row (max_repeats_per_run)",
            opt(limits.max_repeats.map(u64::from))
        ),
    };
    format!(
        "stopped by the runner ({}): {why}; used ${:.6}, {} input + {} output tokens, {} steps, {} tool calls",
        reason.as_str(),
        usage.cost_usd(),
        usage.input_tokens,
        usage.output_tokens,
        usage.steps,
        usage.tool_calls,
    )
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
