//! Tests of the live usage meter: opencode's event lines, hostile and garbled output,
//! and each guard.

use super::*;

/// A `step_finish` line as opencode-ai 1.18.33 prints it.
fn step(input: u64, output: u64, reasoning: u64, read: u64, write: u64, cost: f64) -> String {
    format!(
        r#"{{"type":"step_finish","timestamp":1,"sessionID":"ses_1","part":{{"id":"prt_1","sessionID":"ses_1","messageID":"msg_1","type":"step-finish","reason":"tool-calls","tokens":{{"total":{},"input":{input},"output":{output},"reasoning":{reasoning},"cache":{{"read":{read},"write":{write}}}}},"cost":{cost}}}}}"#,
        input + output + reasoning + read + write
    ) + "\n"
}

/// A `tool_use` line of `tool` with `command`.
fn tool(name: &str, command: &str) -> String {
    let part = serde_json::json!({
        "id": "prt_2", "type": "tool", "callID": "call_1", "tool": name,
        "state": {"status": "completed", "input": {"command": command}, "output": "ok",
                  "title": "t", "metadata": {}, "time": {"start": 1, "end": 2}},
    });
    // `type` first, as opencode's `JSON.stringify` writes it.
    format!(r#"{{"type":"tool_use","timestamp":2,"sessionID":"ses_1","part":{part}}}"#) + "\n"
}

const START: &str = "{\"type\":\"step_start\",\"timestamp\":1,\"sessionID\":\"s\",\"part\":{\"type\":\"step-start\"}}\n";

#[test]
fn step_finish_and_tool_use_lines_are_counted_in_any_chunking() {
    let text = [
        START.to_owned(),
        step(1000, 50, 10, 200, 0, 0.00375),
        tool("bash", "ls"),
        "{\"type\":\"text\",\"part\":{\"text\":\"hi\"}}\n".to_owned(),
        START.to_owned(),
        step(1100, 40, 0, 0, 30, 0.0012),
    ]
    .concat();
    for chunk in [1, 7, 64, text.len()] {
        let mut m = Meter::new(RunLimits::default());
        for piece in text.as_bytes().chunks(chunk) {
            m.feed(piece);
        }
        let u = m.usage();
        assert_eq!(
            (u.input_tokens, u.output_tokens, u.reasoning_tokens),
            (2100, 90, 10)
        );
        assert_eq!((u.cache_read_tokens, u.cache_write_tokens), (200, 30));
        assert_eq!(u.cost_micros, 3750 + 1200);
        assert_eq!((u.steps, u.tool_calls), (2, 1));
        assert_eq!(m.verdict(), None);
    }
}

#[test]
fn hostile_lines_never_lower_the_counts() {
    let mut m = Meter::new(RunLimits::default());
    m.feed(step(500, 10, 0, 0, 0, 0.5).as_bytes());
    // Negative, non-finite, absurd and wrongly typed figures add nothing.
    m.feed(
        step(0, 0, 0, 0, 0, -3.0)
            .replace("\"input\":0", "\"input\":-1e18")
            .as_bytes(),
    );
    m.feed(
        b"{\"type\":\"step_finish\",\"part\":{\"cost\":\"free\",\"tokens\":{\"input\":\"-5\"}}}\n",
    );
    m.feed(b"{\"type\":\"step_finish\",\"part\":{\"cost\":-1e308,\"tokens\":null}}\n");
    // Unknown types, garbage, invalid UTF-8, cut lines.
    m.feed(b"{\"type\":\"usage_reset\",\"part\":{}}\n\xff\xfe garbage {\"type\":\n");
    m.feed(b"{\"type\":\"step_finish\",\"part\":{\"cost\":0.1,\"tok\n");
    let u = m.usage();
    assert_eq!(u.input_tokens, 500, "{u:?}");
    assert_eq!(u.output_tokens, 10);
    assert_eq!(u.cost_micros, 500_000, "a forged line can only add");
    // The valid-but-empty forged step still counts as a step (it only adds).
    assert!(u.steps >= 1);
}

#[test]
fn a_real_event_behind_garbage_on_its_line_still_counts() {
    let mut m = Meter::new(RunLimits::default());
    // A tool wrote a quote and an open brace without a newline to opencode's stdout:
    // the real step_finish that follows lands on the same line.
    m.feed(b"\xff{\"x\":\"");
    m.feed(step(700, 7, 0, 0, 0, 0.0021).as_bytes());
    assert_eq!(m.usage().input_tokens, 700);
    assert_eq!(m.usage().cost_micros, 2100);
    // An event quoted inside a JSON string (as a tool's output is) is not an event.
    let quoted = tool("bash", &step(9999, 0, 0, 0, 0, 9.0));
    m.feed(quoted.as_bytes());
    assert_eq!(m.usage().input_tokens, 700);
    assert_eq!(m.usage().tool_calls, 1);
}

#[test]
fn an_oversized_line_is_skipped_but_its_tool_call_counts() {
    let mut m = Meter::new(RunLimits {
        max_tool_calls: Some(1),
        ..RunLimits::default()
    });
    let big = tool("bash", &"x".repeat(MAX_LINE + 10));
    for piece in big.as_bytes().chunks(64 * 1024) {
        m.feed(piece);
    }
    m.feed(step(10, 1, 0, 0, 0, 0.0).as_bytes());
    assert_eq!(m.usage().tool_calls, 1);
    assert_eq!(m.usage().input_tokens, 10, "the next line is parsed again");
    m.feed(tool("bash", "ls").as_bytes());
    assert_eq!(m.verdict(), Some(StopReason::OverToolCalls));
}

#[test]
fn the_budget_stops_when_cost_or_tokens_reach_the_cap() {
    let mut m = Meter::new(RunLimits {
        usd_micros: Some(5000),
        ..RunLimits::default()
    });
    m.feed(step(1000, 10, 0, 0, 0, 0.004).as_bytes());
    assert_eq!(m.verdict(), None);
    m.feed(step(1000, 10, 0, 0, 0, 0.001).as_bytes());
    assert_eq!(m.verdict(), Some(StopReason::OverBudget));
    let mut m = Meter::new(RunLimits {
        tokens: Some(2000),
        ..RunLimits::default()
    });
    // Cache and reasoning tokens are not budget tokens.
    m.feed(step(900, 50, 5000, 5000, 0, 0.0).as_bytes());
    assert_eq!(m.verdict(), None);
    m.feed(step(1000, 50, 0, 0, 0, 0.0).as_bytes());
    assert_eq!(m.verdict(), Some(StopReason::OverBudget));
}

#[test]
fn steps_tool_calls_and_repeats_are_guarded() {
    let mut m = Meter::new(RunLimits {
        max_steps: Some(2),
        ..RunLimits::default()
    });
    for _ in 0..2 {
        m.feed(START.as_bytes());
        m.feed(step(1, 1, 0, 0, 0, 0.0).as_bytes());
    }
    assert_eq!(m.verdict(), None, "two steps are allowed");
    m.feed(START.as_bytes());
    assert_eq!(
        m.verdict(),
        Some(StopReason::OverSteps),
        "the third is stopped as it starts"
    );

    let mut m = Meter::new(RunLimits {
        max_tool_calls: Some(2),
        ..RunLimits::default()
    });
    m.feed((tool("bash", "a") + &tool("read", "b")).as_bytes());
    assert_eq!(m.verdict(), None);
    m.feed(tool("bash", "c").as_bytes());
    assert_eq!(m.verdict(), Some(StopReason::OverToolCalls));

    let mut m = Meter::new(RunLimits {
        max_repeats: Some(3),
        ..RunLimits::default()
    });
    // Same tool, other arguments; other tool, same arguments: no loop.
    for call in [
        ("bash", "a"),
        ("bash", "a"),
        ("bash", "b"),
        ("read", "b"),
        ("read", "b"),
    ] {
        m.feed(tool(call.0, call.1).as_bytes());
    }
    assert_eq!(m.verdict(), None);
    m.feed(tool("read", "b").as_bytes());
    assert_eq!(m.verdict(), Some(StopReason::Loop));
}

#[test]
fn the_first_verdict_stays() {
    let mut m = Meter::new(RunLimits {
        max_tool_calls: Some(0),
        usd_micros: Some(1),
        ..RunLimits::default()
    });
    m.feed(tool("bash", "a").as_bytes());
    m.feed(step(1, 1, 0, 0, 0, 1.0).as_bytes());
    assert_eq!(m.verdict(), Some(StopReason::OverToolCalls));
}

#[test]
fn final_usage_takes_the_higher_claim() {
    let live = Usage {
        input_tokens: 100,
        output_tokens: 10,
        cost_micros: 2000,
        steps: 2,
        ..Usage::default()
    };
    let u = final_usage(Some(live.clone()), Some(50), Some(0.0001), "m1", 7);
    assert_eq!(
        (u.budget_tokens(), u.cost_micros),
        (110, 2000),
        "lower claims ignored"
    );
    assert_eq!((u.model.as_deref(), u.wall_ms, u.steps), (Some("m1"), 7, 2));
    let u = final_usage(Some(live), Some(1000), Some(0.5), "m1", 7);
    assert_eq!((u.budget_tokens(), u.cost_micros), (1000, 500_000));
    let u = final_usage(None, None, None, "", 3);
    assert!(u.is_empty() && u.model.is_none());
}

#[test]
fn the_setting_parses() {
    assert_eq!(
        UsageSource::parse("opencode-json"),
        Ok(UsageSource::OpencodeJson)
    );
    assert_eq!(UsageSource::parse(""), Ok(UsageSource::Off));
    assert_eq!(UsageSource::parse("off"), Ok(UsageSource::Off));
    assert!(UsageSource::parse("claude").is_err());
}

#[tokio::test]
async fn live_wakes_the_job_on_a_verdict_and_tracks_output() {
    let live = std::sync::Arc::new(Live::new(
        UsageSource::OpencodeJson,
        &RunLimits {
            max_steps: Some(0),
            ..RunLimits::default()
        },
    ));
    let before = live.last_output();
    let waiter = tokio::spawn({
        let live = live.clone();
        async move { live.verdict().await }
    });
    // stderr is not metered.
    live.output(START.as_bytes(), false);
    assert!(live.last_output() >= before);
    live.output(START.as_bytes(), true);
    assert_eq!(waiter.await.unwrap(), StopReason::OverSteps);
    assert!(
        Live::new(UsageSource::Off, &RunLimits::default())
            .usage()
            .is_none()
    );
}

#[test]
fn a_stop_is_described_with_its_limit_and_what_was_used() {
    let usage = Usage {
        input_tokens: 3000,
        output_tokens: 300,
        cost_micros: 11_586,
        steps: 3,
        tool_calls: 2,
        ..Usage::default()
    };
    let limits = RunLimits {
        usd_micros: Some(10_000),
        budget_scope: Some("repo-daily".into()),
        max_repeats: Some(4),
        ..RunLimits::default()
    };
    let text = describe(StopReason::OverBudget, &usage, &limits);
    assert!(
        text.starts_with(
            "stopped by the runner (over-budget): its usage reached the run's budget \
             (repo-daily): $0.011586 of $0.010000; used $0.011586"
        ),
        "{text}"
    );
    assert!(
        !text.contains("input + output tokens,"),
        "no token cap: {text}"
    );
    let text = describe(StopReason::Loop, &usage, &limits);
    assert!(
        text.contains("4 times in a row (max_repeats_per_run)"),
        "{text}"
    );
    assert!(text.ends_with("3 steps, 2 tool calls"), "{text}");
}

#[test]
fn the_meters_cpu_is_counted_only_when_it_runs() {
    let counter = prometheus::Counter::new("meter_cpu", "test").unwrap();
    let lines = step(10, 1, 0, 0, 0, 0.001).repeat(2000);
    let off = Live::new(UsageSource::Off, &RunLimits::default()).counting_cpu_in(counter.clone());
    off.output(lines.as_bytes(), true);
    assert_eq!(counter.get(), 0.0, "no meter, nothing counted");
    let on = Live::new(UsageSource::OpencodeJson, &RunLimits::default())
        .counting_cpu_in(counter.clone());
    // stderr is not metered.
    on.output(lines.as_bytes(), false);
    assert_eq!(counter.get(), 0.0);
    on.output(lines.as_bytes(), true);
    assert_eq!(on.usage().unwrap().steps, 2000);
    assert!(counter.get() > 0.0, "the feed's thread CPU time is counted");
}
