#!/usr/bin/env bash
# One Redis server vs a three-primary Redis Cluster (issue 18), in the same run: the
# webhook path (`shepherd serve`, deliveries/s and latency) and the workers (2 `shepherd
# work`, events committed per second), both with SHEPHERD_SHARDS=6 and the deliveries
# spread over 6 repositories. Figures in docs/benchmarks.md.
#
#   bench/topology.sh
#   BENCH_SMOKE=1 bench/topology.sh  # every step, briefly (tests/it/bench_smoke.rs)
#
# Env: COUNT (20000 deliveries per run)  CONNS (32)  REPS (2)  WORKERS (2)
#      BASE_PORT (6500: single on it, cluster nodes on +1..+3)  WORK (target/bench-topology)
#      BIN (target/release/shepherd, built first unless given)
#      EXAMPLES (the folder of the cargo examples; built first unless given)
#
# Per rep and topology, in rotation: a fresh Redis (no persistence on either, so the
# two differ only in topology), `shepherd serve`; COUNT pull_request_sync deliveries
# (bench/topology_load.rs); the check that every 202 is in a shard's stream; then
# WORKERS workers started at once, timed until every shard's group has no lag and
# nothing pending (no Forgejo is reachable: the effects fail and are retried, the
# commits are what is measured). Every process it starts is stopped on exit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/bench/lib.sh"
if smoke; then COUNT=20; CONNS=4; REPS=1; fi
COUNT="${COUNT:-20000}"
CONNS="${CONNS:-32}"
REPS="${REPS:-2}"
WORKERS="${WORKERS:-2}"
BASE_PORT="${BASE_PORT:-6500}"
WORK="${WORK:-$ROOT/target/bench-topology}"
SECRET=bench-secret
PREFIX=bench
SHARDS=6
HTTP_PORT=$((BASE_PORT + 80))
mkdir -p "$WORK"
declare -a PIDS=() REDIS_PIDS=()

cleanup() {
  local pid
  for pid in "${PIDS[@]}" "${REDIS_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -z "${BIN:-}" ] || [ -z "${EXAMPLES:-}" ]; then echo "== cargo build$(smoke || echo ' --release')"; fi
need_examples topology_load
[ -x "$BIN" ] || { echo "no shepherd binary at $BIN" >&2; exit 1; }
LOAD="$EXAMPLES/topology_load"

start_redis() { # port [cluster]
  local dir="$WORK/redis-$1"
  rm -rf "$dir"; mkdir -p "$dir"
  local extra=()
  [ "${2:-}" = cluster ] && extra=(--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000)
  redis-server --port "$1" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    --daemonize no --loglevel warning "${extra[@]}" >>"$WORK/redis.log" 2>&1 &
  REDIS_PIDS+=("$!")
  until redis-cli -p "$1" PING >/dev/null 2>&1; do sleep 0.05; done
}

stop_all() {
  local pid
  for pid in "${PIDS[@]}" "${REDIS_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}" "${REDIS_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=(); REDIS_PIDS=()
}

# `redis-cli -c` (follows MOVED) against the topology's first node.
rcli() { redis-cli -c -p "$FIRST" "$@"; }

# Sum over the shards of: stream length, group lag, group pending.
totals() {
  local s len=0 lag=0 pend=0 l g p
  for s in $(seq 0 $((SHARDS - 1))); do
    l=$(rcli XLEN "{$PREFIX:$s}:events"); len=$((len + l))
    read -r g p < <(rcli XINFO GROUPS "{$PREFIX:$s}:events" 2>/dev/null | awk '
      prev == "lag" { g = $0 } prev == "pending" { p = $0 } { prev = $0 } END { print (g == "" ? -1 : g), (p == "" ? -1 : p) }')
    lag=$((lag + ${g:--1})); pend=$((pend + ${p:--1}))
  done
  echo "$len $lag $pend"
}

run_one() { # topology rep
  local topo="$1" rep="$2" url
  if [ "$topo" = single ]; then
    FIRST=$BASE_PORT; start_redis "$FIRST"; url="redis://127.0.0.1:$FIRST"
  else
    FIRST=$((BASE_PORT + 1))
    local p nodes=()
    for p in $FIRST $((FIRST + 1)) $((FIRST + 2)); do start_redis "$p" cluster; nodes+=("127.0.0.1:$p"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
    until [ "$(redis-cli -p "$FIRST" CLUSTER INFO | tr -d '\r' | grep -c '^cluster_state:ok')" = 1 ]; do sleep 0.1; done
    url="redis+cluster://$(IFS=,; echo "${nodes[*]}")"
  fi
  local env=(env -i PATH="$PATH" SHEPHERD_REDIS_URL="$url" SHEPHERD_KEY_PREFIX="$PREFIX"
    SHEPHERD_SHARDS="$SHARDS" SHEPHERD_WEBHOOK_SECRETS="$SECRET" SHEPHERD_LOG=error
    SHEPHERD_FORGEJO_URL=http://127.0.0.1:9 SHEPHERD_FORGEJO_TOKEN=bench SHEPHERD_BOT_LOGIN=bench-bot)
  "${env[@]}" SHEPHERD_LISTEN="127.0.0.1:$HTTP_PORT" "$BIN" serve 2>>"$WORK/serve.log" &
  PIDS+=("$!")
  until curl -sf "http://127.0.0.1:$HTTP_PORT/healthz" >/dev/null; do
    kill -0 "${PIDS[-1]}" 2>/dev/null || { echo "shepherd serve exited; see $WORK/serve.log" >&2; exit 1; }
    sleep 0.05
  done
  local ingest
  ingest=$("$LOAD" "http://127.0.0.1:$HTTP_PORT/webhooks/forgejo" "$SECRET" \
    "$ROOT/webhooks/pull_request_sync.json" "$COUNT" "$CONNS" 6 "$topo$rep")
  local accepted len
  accepted=$(echo "$ingest" | cut -f6)
  read -r len _ _ < <(totals)
  [ "$len" = "$accepted" ] || { echo "check failed: $accepted accepted, $len in the streams" >&2; exit 1; }
  local i t0 t1 lag pend
  t0=$(date +%s.%N)
  for i in $(seq "$WORKERS"); do
    "${env[@]}" SHEPHERD_LISTEN="127.0.0.1:$((HTTP_PORT + i))" "$BIN" work 2>>"$WORK/work.log" &
    PIDS+=("$!")
  done
  while true; do
    read -r _ lag pend < <(totals)
    [ "$lag" = 0 ] && [ "$pend" = 0 ] && break
    # smoke mode gives up after a minute (a benchmark waits as long as it takes)
    if smoke && [ "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{print (b - a > 60)}')" = 1 ]; then
      echo "the workers did not drain the streams in 60 s" >&2; exit 1
    fi
    sleep 0.1
  done
  t1=$(date +%s.%N)
  awk -v t="$topo" -v r="$rep" -v line="$ingest" -v t0="$t0" -v t1="$t1" -v n="$len" 'BEGIN {
    split(line, f, "\t");
    printf "| %s | %d | %s | %s | %s | %s | %s | %.2f | %.0f |\n", t, r, f[1], f[3], f[4], f[5], f[7], t1 - t0, n / (t1 - t0) }' \
    | tee -a "$WORK/results.md"
  stop_all
}

{
  echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'); load at start $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "redis-server $(redis-server --version | sed 's/Redis server v=//; s/ .*//'); shepherd $(git -C "$ROOT" rev-parse --short HEAD)"
  echo
  echo "| topology | rep | deliveries | ingest/s | p50 ms | p99 ms | non-202 | drain s ($WORKERS workers) | commits/s |"
  echo "|---|---|---|---|---|---|---|---|---|"
} | tee "$WORK/results.md"
for rep in $(seq "$REPS"); do
  for topo in single cluster; do run_one "$topo" "$rep"; done
done
