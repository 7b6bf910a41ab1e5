#!/usr/bin/env bash
# The merge-lease drill (issue 16), recorded in docs/benchmarks.md and
# docs/reliability.md.
#
#   bench/merge_lease.sh                              # this build only
#   BEFORE=/path/to/old/shepherd bench/merge_lease.sh # and a previous build, same run
#
# Env: BENCH_LEASE_KILLS (8)  RUNS (1: drills per build)
#      BEFORE (a `shepherd` binary built from the commit to compare with)
#      BENCH_SMOKE=1 (one kill: tests/it/bench_smoke.rs; the drill's 40 PRs and its
#      500 ms merge answers are fixed, so it still takes some 20 s)
#      BENCH_IT_BIN (the integration-test binary to run instead of cargo nextest)
#
# Runs the ignored test `drills::bench_merge_lease_drill`: 40 approved bot PRs with
# green CI on one branch, 3 real `shepherd work` processes on a real redis-server, the
# fake Forgejo answering each merge call after 500 ms; every 3 s the worker holding the
# branch's merge lock (any worker if none holds it within 1.5 s) is SIGKILLed and
# replaced. Prints, per run, the PRs merged 60 s after the kills stopped and the time
# from each lock holder's death to the next merge call.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RUNS="${RUNS:-1}"
. "$ROOT/bench/lib.sh"
if smoke; then export BENCH_LEASE_KILLS=1; RUNS=1; fi
machine_header
run() {
  run_ignored_test bench_merge_lease_drill | grep -E '^BENCH|merge lease drill|FAIL|panicked'
}
for i in $(seq 1 "$RUNS"); do
  if [ -n "${BEFORE:-}" ]; then
    [ -x "$BEFORE" ] || { echo "BEFORE=$BEFORE is not an executable" >&2; exit 1; }
    echo "-- run $i, before: $BEFORE"
    BENCH_SHEPHERD_BIN="$BEFORE" run
  fi
  echo "-- run $i, this build"
  run
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
