#!/usr/bin/env bash
# Merge-queue throughput by batch size and failure rate (issues 16 and 29), recorded in
# docs/benchmarks.md.
#
#   bench/merge_queue.sh
#   BENCH_QUEUE_KS=1,4 BENCH_QUEUE_MIXES=0.1:0 BENCH_QUEUE_PRS=16 bench/merge_queue.sh
#
# Env: BENCH_QUEUE_CI_MS (2000: the simulated CI's fixed duration D per run)
#      BENCH_QUEUE_KS (1,4,8: batch sizes, policy merge_queue_batch_size)
#      BENCH_QUEUE_MIXES (0.1:0,0.02:0.05: p:f pairs; p = chance a PR breaks, only on
#      top of one earlier PR; f = chance a CI run fails on its own, a flaky check)
#      BENCH_QUEUE_PRS (32: PRs approved at once per run)  BENCH_QUEUE_SEED (29)
#      RUNS (1)
#      BENCH_SMOKE=1 (k = 1 and 2, 3 PRs, a 200 ms CI: tests/it/bench_smoke.rs)
#      BENCH_IT_BIN (the integration-test binary to run instead of cargo nextest)
#
# Runs the ignored test `worker::merge_queue_bench::bench_merge_queue_batches`: the
# real `shepherd run` on a real redis-server and the fake Forgejo with a simulated CI
# (tests/it/support/fake_forgejo/sim_failures.rs draws the failures, seeded: every k
# of a mix meets the same breakages). For each mix and k, N green PRs are approved at
# once; printed: merged PRs per hour, time in queue p50/p90
# (approval to merge), batch first-pass success (k = 1: the share of green CI runs),
# CI runs the queue asked for per merged PR (its ci_runs, every k; all_ci_runs_per_merged: every
# run the CI started, the batch branch's intermediate merges included),
# PRs ejected for a flaky failure alone, each with the model's prediction
# (docs/benchmarks.md "Next step") in brackets, and the ratios against k = 1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RUNS="${RUNS:-1}"
. "$ROOT/bench/lib.sh"
if smoke; then
  export BENCH_QUEUE_CI_MS=200 BENCH_QUEUE_KS=1,2 BENCH_QUEUE_PRS=3 BENCH_QUEUE_MIXES=0.1:0
  RUNS=1
fi
machine_header
for i in $(seq 1 "$RUNS"); do
  echo "-- run $i"
  run_ignored_test bench_merge_queue_batches | grep -E '^BENCH|FAIL|panicked'
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
