#!/usr/bin/env bash
# The API-economy benchmark (issue 17), recorded in docs/benchmarks.md.
#
#   bench/api_calls.sh                       # this build only
#   BEFORE=/path/to/old/shepherd bench/api_calls.sh   # and the previous build, same run
#
# Env: BENCH_ECONOMY_PRS (40)  BENCH_ECONOMY_PASSES (20)  BENCH_ECONOMY_DRILL_SECS (5)
#      BEFORE (a `shepherd` binary built from the commit to compare with)
#      PROFILE (dev; `release` builds and runs the release profile)
#      BENCH_SMOKE=1 (every part, briefly: tests/it/bench_smoke.rs)
#      BENCH_IT_BIN (the integration-test binary to run instead of cargo nextest)
#
# Runs the ignored test tests/it/worker/economy_bench.rs: the real `shepherd run`, a
# real redis-server and the fake Forgejo of the test support, which logs every call:
#   1. N idle bot PRs (green CI, no reviews), the resync every second, calls per PR and
#      pass over a window of passes, scaled to calls per idle PR-hour at the default
#      interval (600 s) with one full sweep a day, beside the polling model (36);
#   2. one PR's whole life (opened -> CI fails -> fix pushed -> green -> approved ->
#      merged) plus a human PR merged after two approvals: calls by endpoint and cause;
#   3. a lost-webhook drill (an approval added without its webhook): the time until
#      Shepherd merges the PR, in resync intervals.
# The call counts do not depend on the build profile; the drill's time barely does.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PROFILE="${PROFILE:-dev}"
. "$ROOT/bench/lib.sh"
if smoke; then
  export BENCH_ECONOMY_PRS=2 BENCH_ECONOMY_PASSES=2 BENCH_ECONOMY_DRILL_SECS=1
fi
machine_header
if [ -n "${BEFORE:-}" ]; then
  [ -x "$BEFORE" ] || { echo "BEFORE=$BEFORE is not an executable" >&2; exit 1; }
  export BENCH_SHEPHERD_BIN_BEFORE="$BEFORE"
  echo "before: $BEFORE ($("$BEFORE" --version 2>/dev/null || echo '?'))"
fi
args=()
[ "$PROFILE" = release ] && args=(--release)
run_ignored_test bench_api_calls "${args[@]}" | grep -E '^BENCH|PASS|FAIL|panicked'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
