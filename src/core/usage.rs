//! What one agent run consumed and the limits it is held to (issue 28): the usage the
//! runner reads from the agent's output as it runs (or from its result file), the
//! limits a work item carries to the runner, and why a runner stopped an agent.
//!
//! Costs are kept in micro-dollars (millionths of a US dollar) as integers, so the
//! ledger's sums are exact and a work item stays `Eq`; they are shown in dollars.

use serde::{Deserialize, Serialize};

/// Micro-dollars in one US dollar.
pub const MICROS_PER_USD: u64 = 1_000_000;

/// Converts dollars (as the model provider prices them) to micro-dollars, rounded to
/// the nearest; negative or non-finite amounts are 0.
pub fn usd_to_micros(usd: f64) -> u64 {
    if !usd.is_finite() || usd <= 0.0 {
        return 0;
    }
    let micros = (usd * MICROS_PER_USD as f64).round();
    if micros >= u64::MAX as f64 {
        u64::MAX
    } else {
        micros as u64
    }
}

/// Converts micro-dollars to dollars (for display and JSON figures).
pub fn micros_to_usd(micros: u64) -> f64 {
    micros as f64 / MICROS_PER_USD as f64
}

/// What one agent run consumed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Usage {
    /// Input (prompt) tokens, cache reads and writes not included.
    pub input_tokens: u64,
    /// Output (completion) tokens, reasoning not included.
    pub output_tokens: u64,
    /// Reasoning tokens.
    pub reasoning_tokens: u64,
    /// Tokens read from the provider's prompt cache.
    pub cache_read_tokens: u64,
    /// Tokens written to the provider's prompt cache.
    pub cache_write_tokens: u64,
    /// Cost in micro-dollars.
    pub cost_micros: u64,
    /// The model the run used, when the agent said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Model steps (one request/response round each).
    pub steps: u32,
    /// Tool calls.
    pub tool_calls: u32,
    /// Wall time of the run, in milliseconds.
    pub wall_ms: u64,
}

impl Usage {
    /// The tokens a `_tokens` budget counts: input + output.
    pub fn budget_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// The cost in dollars.
    pub fn cost_usd(&self) -> f64 {
        micros_to_usd(self.cost_micros)
    }

    /// Whether nothing was consumed (no tokens, no cost, no step).
    pub fn is_empty(&self) -> bool {
        self.input_tokens == 0
            && self.output_tokens == 0
            && self.reasoning_tokens == 0
            && self.cache_read_tokens == 0
            && self.cache_write_tokens == 0
            && self.cost_micros == 0
            && self.steps == 0
            && self.tool_calls == 0
    }

    /// Adds `other` to this usage (saturating; the model of `other` wins when set).
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
        self.cost_micros = self.cost_micros.saturating_add(other.cost_micros);
        if other.model.is_some() {
            self.model.clone_from(&other.model);
        }
        self.steps = self.steps.saturating_add(other.steps);
        self.tool_calls = self.tool_calls.saturating_add(other.tool_calls);
        self.wall_ms = self.wall_ms.saturating_add(other.wall_ms);
    }
}

/// The limits one run is held to, enforced by the runner outside the agent. Each
/// `None` is no limit. The budget figures are the tightest remaining budget when the
/// work was dispatched (`budget_scope` names the cap that set them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunLimits {
    /// Most the run may cost, in micro-dollars.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usd_micros: Option<u64>,
    /// Most input + output tokens the run may use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// The cap that set `usd_micros` / `tokens` (e.g. `run`, `pr`, `repo-daily`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_scope: Option<String>,
    /// Most model steps (policy `max_steps_per_run`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// Most tool calls (policy `max_tool_calls_per_run`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
    /// Longest time with no output and no usage, in seconds (policy
    /// `agent_idle_timeout_secs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_secs: Option<u64>,
    /// The same tool call with the same arguments this many times in a row is a loop
    /// (policy `max_repeats_per_run`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_repeats: Option<u32>,
}

impl RunLimits {
    /// Whether no limit is set (the work item's JSON then omits `limits`).
    pub fn is_none(&self) -> bool {
        *self == RunLimits::default()
    }
}

/// Why the runner stopped an agent before it ended by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopReason {
    /// Its usage passed the run's cap or the remaining budget.
    OverBudget,
    /// More model steps than `max_steps_per_run`.
    OverSteps,
    /// More tool calls than `max_tool_calls_per_run`.
    OverToolCalls,
    /// No output and no usage for `agent_idle_timeout_secs`.
    Idle,
    /// The same tool call with the same arguments `max_repeats_per_run` times in a row.
    Loop,
}

impl StopReason {
    /// The name (outcome, metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::OverBudget => "over-budget",
            StopReason::OverSteps => "over-steps",
            StopReason::OverToolCalls => "over-tool-calls",
            StopReason::Idle => "idle",
            StopReason::Loop => "loop",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_round_trip_through_micros() {
        assert_eq!(usd_to_micros(0.000_123_4), 123);
        assert_eq!(usd_to_micros(1.5), 1_500_000);
        assert_eq!(usd_to_micros(-2.0), 0);
        assert_eq!(usd_to_micros(f64::NAN), 0);
        assert_eq!(usd_to_micros(f64::INFINITY), 0);
        assert!((micros_to_usd(2_500_000) - 2.5).abs() < 1e-12);
    }

    #[test]
    fn usage_adds_and_counts_budget_tokens() {
        let mut a = Usage {
            input_tokens: 10,
            output_tokens: 5,
            reasoning_tokens: 1,
            cost_micros: 7,
            steps: 1,
            ..Usage::default()
        };
        let b = Usage {
            input_tokens: 3,
            output_tokens: 2,
            cache_read_tokens: 100,
            cost_micros: 3,
            model: Some("m".into()),
            steps: 2,
            tool_calls: 4,
            ..Usage::default()
        };
        a.add(&b);
        assert_eq!(a.budget_tokens(), 20);
        assert_eq!(a.cost_micros, 10);
        assert_eq!(a.steps, 3);
        assert_eq!(a.tool_calls, 4);
        assert_eq!(a.model.as_deref(), Some("m"));
        assert!(!a.is_empty());
        assert!(Usage::default().is_empty());
    }

    #[test]
    fn empty_limits_are_omitted_and_names_are_kebab() {
        assert!(RunLimits::default().is_none());
        let l = RunLimits {
            max_steps: Some(3),
            ..RunLimits::default()
        };
        assert_eq!(serde_json::to_string(&l).unwrap(), r#"{"max_steps":3}"#);
        assert_eq!(
            serde_json::to_string(&StopReason::OverToolCalls).unwrap(),
            r#""over-tool-calls""#
        );
        assert_eq!(StopReason::Loop.as_str(), "loop");
    }
}
