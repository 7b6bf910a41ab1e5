#!/usr/bin/env bash
# Merge-queue throughput (issue 16), recorded in docs/benchmarks.md.
#
#   bench/merge_queue.sh
#   BENCH_QUEUE_CI_MS=5000 BENCH_QUEUE_SIZES=1,10,20 bench/merge_queue.sh
#
# Env: BENCH_QUEUE_CI_MS (2000: the simulated CI's fixed duration per run)
#      BENCH_QUEUE_SIZES (1,10: PRs made ready at once)  RUNS (1)
#      BENCH_QUEUE_BASE_MOVED (0; 1: the branch moves after the PRs' own CI and before
#      they become ready, so every PR needs an update and a CI run)
#      BENCH_SMOKE=1 (sizes 1 and 2, a 200 ms CI: tests/it/bench_smoke.rs)
#      BENCH_IT_BIN (the integration-test binary to run instead of cargo nextest)
#
# Runs the ignored test `worker::merge_queue::bench_merge_queue_throughput`: the real
# `shepherd run` on a real redis-server and the fake Forgejo with a simulated CI of
# fixed duration. For each size, N bot PRs are opened and their own CI finishes green,
# then all N are approved at once; the queue off (the baseline: merge as soon as ready,
# no re-test on the new base) and on (each PR updated onto the tip and re-tested) are
# measured in the same run. Prints the time from ready to merged (min, median, max),
# the PRs merged per hour, the serial bound (one CI run per PR: 3600 / D) and the CI
# runs and updates the queue needed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RUNS="${RUNS:-1}"
. "$ROOT/bench/lib.sh"
if smoke; then export BENCH_QUEUE_CI_MS=200 BENCH_QUEUE_SIZES=1,2; RUNS=1; fi
machine_header
for i in $(seq 1 "$RUNS"); do
  echo "-- run $i"
  run_ignored_test bench_merge_queue_throughput | grep -E '^BENCH|FAIL|panicked'
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
