#!/usr/bin/env bash
# Worker throughput (issue 4): events committed per second by 1, 2 and 4 `shepherd work`
# processes on CI-status-style events (internal ObservedStatus observations, as the
# executor queues them), recorded in docs/benchmarks.md.
#
#   bench/worker.sh
#   BENCH_SMOKE=1 bench/worker.sh    # every step, briefly (tests/it/bench_smoke.rs)
#
# Env: PRS (1000)  EVENTS (60000)  WORKERS ("1 2 4")  REPS (1)  AOF (no | always)
#      BENCH_REDIS_PORT (6392)  WORK (target/bench-worker)
#      BIN (target/release/shepherd, built first; another path for an A/B run, not built)
#      EXAMPLES (the folder of the cargo example worker_load; built first unless given)
#
# For each worker count and rep: FLUSHALL; queue one pull_request_sync webhook per PR
# and let one worker commit them (the records exist, with the head sha the observations
# are about); stop it; queue EVENTS observations (spread over the PRs, CI states
# changing); start N workers at once and time until the group has no lag and nothing
# pending. Rate = entries the group read in that time / time (timer events the run
# produces count too: they are commits as well). Also: commit conflicts and CPU time of
# the workers (utime+stime) per event, from /metrics and /proc, and Redis CPU per event
# (INFO cpu).
# Every process it starts is stopped by pid on exit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/bench/lib.sh"
if smoke; then PRS=5; EVENTS=50; WORKERS="1 2"; REPS=1; fi
PRS="${PRS:-1000}"
EVENTS="${EVENTS:-60000}"
WORKERS="${WORKERS:-1 2 4}"
REPS="${REPS:-1}"
AOF="${AOF:-no}"
PORT="${BENCH_REDIS_PORT:-6392}"
WORK="${WORK:-$ROOT/target/bench-worker}"
PREFIX=bench
STREAM="{$PREFIX:0}:events"
mkdir -p "$WORK"
declare -a PIDS=()
REDIS_PID=""

cleanup() {
  local pid
  for pid in "${PIDS[@]}" $REDIS_PID; do
    kill "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT

rcli() { redis-cli -h 127.0.0.1 -p "$PORT" "$@"; }

# "<lag> <pending> <entries-read>" of the workers group.
group_state() {
  rcli XINFO GROUPS "$STREAM" | awk '
    prev == "lag" { lag = $0 } prev == "pending" { pend = $0 } prev == "entries-read" { read = $0 }
    { prev = $0 } END { print lag, pend, read }'
}

wait_drained() {
  local lag pend read t0=$SECONDS
  while true; do
    read -r lag pend read < <(group_state)
    if [ "${lag:-1}" = "0" ] && [ "${pend:-1}" = "0" ]; then echo "$read"; return; fi
    # smoke mode gives up after a minute (a benchmark waits as long as it takes)
    if smoke && [ $((SECONDS - t0)) -gt 60 ]; then echo "the workers did not drain the stream in 60 s" >&2; exit 1; fi
    sleep 0.05
  done
}

start_workers() {
  local n="$1" i
  PIDS=()
  for i in $(seq "$n"); do
    SHEPHERD_REDIS_URL="redis://127.0.0.1:$PORT" SHEPHERD_KEY_PREFIX="$PREFIX" \
      SHEPHERD_LISTEN="127.0.0.1:$((PORT + 10 + i))" SHEPHERD_LOG=warn \
      "$BIN" work 2>>"$WORK/workers.log" &
    PIDS+=("$!")
  done
}

stop_workers() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}

redis_cpu() { # used_cpu_sys + used_cpu_user of the bench Redis, seconds
  rcli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ { t += $2 } END { printf "%.3f", t }'
}

cpu_ticks() { # utime+stime of the running workers, in clock ticks
  local total=0 pid
  for pid in "${PIDS[@]}"; do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
  done
  echo "$total"
}

conflicts() {
  local total=0 i v
  for i in $(seq "${#PIDS[@]}"); do
    v=$(curl -s "http://127.0.0.1:$((PORT + 10 + i))/metrics" | awk '/^shepherd_commit_conflicts_total/ {print $2}')
    total=$((total + ${v:-0}))
  done
  echo "$total"
}

# BIN=<path> measures another build of shepherd (an A/B against an older commit).
if [ -z "${BIN:-}" ] || [ -z "${EXAMPLES:-}" ]; then echo "== cargo build$(smoke || echo ' --release')"; fi
need_examples worker_load
echo "== redis-server on $PORT (appendonly $AOF)"
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly "$AOF" --appendfsync always \
  --dir "$WORK" --daemonize no --loglevel warning &
REDIS_PID=$!
until rcli PING >/dev/null 2>&1; do sleep 0.05; done

"$EXAMPLES/worker_load" warmup "$PREFIX" "$PRS" "$ROOT/webhooks/pull_request_sync.json" > "$WORK/warmup.resp"
"$EXAMPLES/worker_load" status "$PREFIX" "$PRS" "$EVENTS" > "$WORK/status.resp"
TICKS=$(getconf CLK_TCK)

printf '| workers | events read | seconds | events/s | conflicts | worker CPU µs/event | Redis CPU µs/event |\n|---|---|---|---|---|---|---|\n' | tee "$WORK/results.md"
for rep in $(seq "$REPS"); do
  for n in $WORKERS; do
    rcli FLUSHALL >/dev/null
    rcli --pipe < "$WORK/warmup.resp" >/dev/null
    start_workers 1
    wait_drained >/dev/null
    stop_workers
    rcli --pipe < "$WORK/status.resp" >/dev/null
    read -r _ _ before < <(group_state)
    r0=$(redis_cpu)
    t0=$(date +%s.%N)
    start_workers "$n"
    after=$(wait_drained)
    t1=$(date +%s.%N)
    r1=$(redis_cpu)
    ticks=$(cpu_ticks)
    c=$(conflicts)
    stop_workers
    awk -v n="$n" -v a="$after" -v b="$before" -v t0="$t0" -v t1="$t1" -v c="$c" -v k="$ticks" -v hz="$TICKS" \
        -v r0="$r0" -v r1="$r1" 'BEGIN {
      e = a - b; s = t1 - t0;
      printf "| %d | %d | %.2f | %.0f | %d | %.0f | %.0f |\n", n, e, s, e / s, c, k / hz * 1e6 / e, (r1 - r0) * 1e6 / e }' | tee -a "$WORK/results.md"
  done
done
