#!/usr/bin/env bash
# The agent runner's benchmark (issue 14), recorded in docs/benchmarks.md.
#
#   bench/agents.sh
#   BENCH_SMOKE=1 bench/agents.sh    # every phase, briefly (tests/it/bench_smoke.rs)
#
# Env: BENCH_AGENTS_ITEMS (200)  BENCH_AGENTS_WEBHOOKS (100)  BENCH_AGENTS_RATE (20)
#      BENCH_IT_BIN (the integration-test binary to run instead of a release build)
#      BENCH_AGENTS_USAGE_SECS (20)  BENCH_AGENTS_USAGE_ROUNDS (6)
#      BENCH_AGENTS_ONLY (sandbox: part 4 alone; usage: part 5 alone)
#
# Runs the ignored test tests/it/agents/bench.rs with the release build: the real
# `shepherd agents` (and `shepherd run`) processes, a real redis-server per phase, the
# fake Forgejo of the test support and the instant agent `true`:
#   1. overhead per item: one runner, one slot, items one after another, against a
#      baseline measured in the same run (the same Forgejo reads + spawning `true`);
#   2. throughput: items per second with 1 and 2 runner processes (2 slots each);
#   3. webhook → agent start: a signed action_run_failure webhook per red PR through
#      `shepherd run` to the agent process writing its start time (p50/p90/p99).
#   4. the agent sandbox's cost (issue 26): per item with SHEPHERD_AGENT_SANDBOX=off
#      and =on in the same run (alternating, two rounds each); BENCH_AGENTS_ONLY=sandbox
#      runs this part alone.
#   5. live usage (issue 28): the opencode-json parser's cost per item, and the
#      runner's CPU at 1,000 events/s of agent output with SHEPHERD_AGENT_USAGE=off
#      (the baseline) and =opencode-json, alternating in the same run (its CPU both
#      from /proc/<pid>/stat's 10 ms ticks and, to the nanosecond, its threads'
#      /proc/<pid>/task/*/schedstat), and in place, in the same opencode-json rounds,
#      the meter's own CPU (shepherd_agent_usage_meter_cpu_seconds_total on the
#      runner's /metrics) over the runner's; and the ledger's cost per item (the Lua
#      `store::ledger::record` on a real redis-server, new and replayed runs) against
#      the runner's own per-item wall time measured in the same run;
#      BENCH_AGENTS_ONLY=usage runs this part alone.
# Prints the machine and the `BENCH …` lines. Every process it starts belongs to the
# test, which stops them when it ends.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. "$ROOT/bench/lib.sh"
if smoke; then
  export BENCH_AGENTS_ITEMS=2 BENCH_AGENTS_WEBHOOKS=2 BENCH_AGENTS_RATE=20 BENCH_AGENTS_USAGE_SECS=1 \
    BENCH_AGENTS_USAGE_ROUNDS=2
fi
machine_header
[ -n "${BENCH_IT_BIN:-}" ] || cargo build --release --quiet
run_ignored_test bench_agents --release | grep -E '^BENCH|PASS|FAIL|panicked'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
