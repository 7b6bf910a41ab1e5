#!/usr/bin/env bash
# The agent runner's benchmark (issue 14), recorded in docs/benchmarks.md.
#
#   bench/agents.sh
#
# Env: BENCH_AGENTS_ITEMS (200)  BENCH_AGENTS_WEBHOOKS (100)  BENCH_AGENTS_RATE (20)
#      BENCH_AGENTS_ONLY (sandbox: part 4 alone)
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
# Prints the machine and the `BENCH …` lines. Every process it starts belongs to the
# test, which stops them when it ends.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"
echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
cargo build --release --quiet
cargo nextest run --release --test it --run-ignored only -E 'test(bench_agents)' --no-capture 2>&1 \
  | grep -E '^BENCH|PASS|FAIL|panicked' 
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
