#!/usr/bin/env bash
# Load benchmark of Shepherd's webhook path (issue 2), side by side with the receivers a
# user would otherwise pick (the peers' harness, given as PEERS_SRC: Node +
# @octokit/webhooks + ioredis, FastAPI + redis-py), on the same Redis, payload, load
# generator and checks.
#
#   PEERS_SRC=/path/to/peers bench/ingest.sh
#   bench/ingest.sh                  # Shepherd alone ("peers: skipped")
#   BENCH_SMOKE=1 bench/ingest.sh    # every step, briefly (tests/it/bench_smoke.rs)
#
# Env: DURATION (15s)  CONNS ("32 128")  REPS (1)  WARMUP (3, seconds)  BADSIG_SECS (3)
#      PEERS ("node node-cluster2 fastapi-1w fastapi-2w"; PEERS= for Shepherd alone)
#      CEILING (1: redis-benchmark ceilings, 0: skip)  MECHANISMS (1: Lua vs MULTI, 0: skip)
#      PEERS_SRC (the peers' harness; without it: no peers, no peers' ceiling.sh and
#      summarise.py, a redis-server started here, webhooks/pull_request_opened.json and
#      the topology_load example instead of wrk; see bench/lib.sh)  WORK (target/bench)
#      PORT (8090, Shepherd's)  BENCH_REDIS_PORT (6390)
#      BIN (target/release/shepherd, built first; another path for an A/B run)
#      EXAMPLES (the folder of the cargo examples; built first unless given)
#
# What it does, in order:
#  1. copies the peers' harness into $WORK/peers (it must be writable; never committed
#     here) and runs its idempotent setup.sh (apt: redis-server redis-tools wrk; npm; venv);
#  2. builds the release binary; starts a fresh redis-server on 6390 (no persistence,
#     the peers' redis.sh), `shepherd serve` on $PORT, and the peer servers;
#  3. Redis ceilings: the peers' ceiling.sh (SET NX, XADD, EVAL) plus redis-benchmark of
#     Shepherd's own EVALSHA enqueue script with the same arguments Shepherd sends;
#     then the Lua vs MULTI/EXEC comparison through one multiplexed connection
#     (cargo example `enqueue_mechanisms`);
#  4. for each rep, each connection count, each receiver in rotation: FLUSHALL, warm-up,
#     FLUSHALL, `wrk -t1 -cN --latency` with the peers' post.lua (the ~15 KB
#     pull_request payload, a unique delivery id per request), then: req/s, p50/p99,
#     status counts, server CPU time (utime+stime of its process tree) per accepted
#     delivery, peak RSS (VmHWM), Redis CPU, and the stream check (every 202 is in the
#     stream, one dedup marker per entry); then a bad-signature run (all 401, nothing
#     written);
#  5. writes $WORK/results/<stamp>/{env.md,ceiling.md,mechanisms.md,runs.tsv,summary.md}.
# Every process it starts is stopped by pid on exit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DURATION="${DURATION:-15s}"
CONNS="${CONNS:-32 128}"
REPS="${REPS:-1}"
WARMUP="${WARMUP:-3}"
BADSIG_SECS="${BADSIG_SECS:-3}"
PEERS="${PEERS-node node-cluster2 fastapi-1w fastapi-2w}"
WORK="${WORK:-$ROOT/target/bench}"
PORT="${PORT:-8090}"
export BENCH_REDIS_PORT="${BENCH_REDIS_PORT:-6390}"
SECRET=bench-secret
PREFIX=bench
STREAM="{$PREFIX:0}:events"

log() { printf '== %s\n' "$*"; }

# ---- 1. the peers' harness, in a writable copy ---------------------------------------
. "$ROOT/bench/lib.sh"
CEIL_N=100000 MECH_ARGS=()
if smoke; then
  CONNS=4; REPS=1; WARMUP=1; BADSIG_SECS=1; LOAD_COUNT="${LOAD_COUNT:-20}"; CEIL_N=200; MECH_ARGS=(1 1)
fi
peers_harness
[ -n "$P" ] || PEERS=""
sign() { openssl dgst -sha256 -hmac "$SECRET" -r "$1" | cut -d' ' -f1; }

# ---- 2. build and start everything -----------------------------------------------------
# BIN=<path> measures another build of shepherd (an A/B against an older commit).
log "cargo build${EXAMPLES:+ (examples given)}$(smoke || echo ' --release')"
need_examples enqueue_mechanisms topology_load
STAMP="$(date +%Y%m%dT%H%M%S)"
OUT="$WORK/results/$STAMP"
mkdir -p "$OUT/raw" "$WORK/run"

declare -A PEER_PORT=([node]=8081 [node-cluster2]=8083 [fastapi-1w]=8082 [fastapi-2w]=8084)
declare -A PID=()
started_redis=0
cleanup() {
  local l
  for l in "${!PID[@]}"; do stop_pid "${PID[$l]}"; done
  [ "$started_redis" = 1 ] && stop_bench_redis
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_bench_redis

wait_http() { # label url
  for _ in $(seq 150); do
    curl -s -o /dev/null "$2" && return 0
    kill -0 "${PID[$1]}" 2>/dev/null || break
    sleep 0.2
  done
  echo "$1 did not come up; log:" >&2; cat "$WORK/run/$1.log" >&2; exit 1
}
start_bg() { # label command...
  local l="$1"; shift
  "$@" > "$WORK/run/$l.log" 2>&1 &
  PID[$l]=$!
}

start_bg shepherd env -i PATH="$PATH" SHEPHERD_LISTEN="127.0.0.1:$PORT" \
  SHEPHERD_REDIS_URL="redis://127.0.0.1:$BENCH_REDIS_PORT" SHEPHERD_KEY_PREFIX="$PREFIX" \
  SHEPHERD_WEBHOOK_SECRETS="$SECRET" SHEPHERD_LOG=warn "$BIN" serve
wait_http shepherd "http://127.0.0.1:$PORT/healthz"
for l in $PEERS; do
  p="${PEER_PORT[$l]}"
  case "$l" in
    node)          start_bg "$l" env -C "$P" PORT="$p" node node/server.js ;;
    node-cluster2) start_bg "$l" env -C "$P" PORT="$p" WORKERS=2 node node/server.js ;;
    fastapi-1w)    start_bg "$l" env -C "$P" .venv/bin/uvicorn app:app --app-dir py --host 127.0.0.1 --port "$p" --workers 1 --no-access-log --log-level warning ;;
    fastapi-2w)    start_bg "$l" env -C "$P" .venv/bin/uvicorn app:app --app-dir py --host 127.0.0.1 --port "$p" --workers 2 --no-access-log --log-level warning ;;
    *) echo "unknown peer $l" >&2; exit 1 ;;
  esac
  wait_http "$l" "http://127.0.0.1:$p/"
done
log "started: $(for l in "${!PID[@]}"; do printf '%s(pid %s) ' "$l" "${PID[$l]}"; done)"

# Contract smoke test of Shepherd through `shepherd send`: 202, 200 duplicate, 401.
d="bench-smoke-$$"
"$BIN" send "$PAYLOAD" --event-type pull_request --url "http://127.0.0.1:$PORT/webhooks/forgejo" --secret "$SECRET" --delivery "$d" | grep -q '202 Accepted'
"$BIN" send "$PAYLOAD" --event-type pull_request --url "http://127.0.0.1:$PORT/webhooks/forgejo" --secret "$SECRET" --delivery "$d" | grep -q '200 OK'
! "$BIN" send "$PAYLOAD" --event-type pull_request --url "http://127.0.0.1:$PORT/webhooks/forgejo" --secret wrong >/dev/null 2>&1
[ "$(rcli xlen "$STREAM")" = 1 ] || { echo "smoke test: expected 1 entry in $STREAM" >&2; exit 1; }
log "shepherd contract smoke test passed (202, 200 duplicate, 401, 1 entry)"

# ---- environment --------------------------------------------------------------------------
{
  echo "nproc: $(nproc)"
  echo "cpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(lscpu | sed -n 's/^Hypervisor vendor:[[:space:]]*//p') guest"
  echo "memory: $(free -g | awk '/^Mem:/{print $2}') GiB"
  echo "kernel: $(uname -r); $(. /etc/os-release; echo "$PRETTY_NAME")"
  echo "redis-server: $(redis-server --version | sed 's/Redis server //')"
  echo "load: $(if [ -n "$P" ] && command -v wrk >/dev/null; then wrk -v 2>&1 | head -1; else echo "topology_load (no wrk or no peers' harness)"; fi)"
  echo "rustc: $(rustc --version); shepherd $(git -C "$ROOT" rev-parse --short HEAD)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "payload: $(wc -c < "$PAYLOAD") bytes"
} | tee "$OUT/env.md"

# ---- 3. ceilings -----------------------------------------------------------------------------
if [ "${CEILING:-1}" != 0 ]; then
  if [ -n "$P" ]; then
    log "redis ceiling (peers' ceiling.sh)"
    REPS=3 "$P/ceiling.sh" "$OUT/ceiling.md" | tail -6
  else
    log "redis ceiling (peers' ceiling.sh): skipped, no peers' harness"
  fi
  log "redis ceiling of Shepherd's EVALSHA enqueue (redis-benchmark, 32 clients, -P 1, median of 3)"
  sha="$(rcli script load "$(cat "$ROOT/src/store/lua/enqueue.lua")")"
  body="$(cat "$PAYLOAD")"
  rows=()
  for _ in 1 2 3; do
    rcli flushall sync >/dev/null
    rows+=("$(redis-benchmark -h 127.0.0.1 -p "$BENCH_REDIS_PORT" -c 32 -n "$CEIL_N" -r 1000000000 -P 1 --csv \
      EVALSHA "$sha" 2 "{$PREFIX:0}:seen:__rand_int__" "$STREAM" 604800000 kind webhook delivery __rand_int__ \
      event pull_request repo forgejo-bot-test/widgets received 1796049229349 body "$body" \
      | tail -1 | cut -d, -f2 | tr -d '"' | cut -d. -f1)")
    # redis-benchmark counts error replies as answers: the stream tells whether it enqueued
    [ "$(rcli xlen "$STREAM")" -gt 0 ] || { echo "EVALSHA of enqueue.lua wrote no stream entry (wrong arguments?)" >&2; exit 1; }
  done
  rcli flushall sync >/dev/null
  evalsha="$(printf '%s\n' "${rows[@]}" | sort -n | sed -n 2p)"
  echo "| Shepherd's enqueue.lua via EVALSHA (GET, XADD, SET PX), -P 1 | $evalsha | (${rows[*]}) |" | tee -a "$OUT/ceiling.md"
fi
if [ "${MECHANISMS:-1}" != 0 ]; then
  log "Lua vs MULTI/EXEC through one multiplexed connection"
  "$EXAMPLES/enqueue_mechanisms" "redis://127.0.0.1:$BENCH_REDIS_PORT" "$PAYLOAD" "${MECH_ARGS[@]}" | tee "$OUT/mechanisms.md"
  rcli flushall sync >/dev/null
fi

# ---- 4. load ---------------------------------------------------------------------------------
SIG="$(sign "$PAYLOAD")"
BAD_SIG="$(printf '%s' "$SIG" | tr '0-9a-f' '1-9a-f0')"
export BENCH_PAYLOAD="$PAYLOAD" BENCH_PATH=/webhooks/forgejo
tree_pids() { local p; echo "$1"; for p in $(pgrep -P "$1" 2>/dev/null); do tree_pids "$p"; done; }
ticks() { local t=0 p v; for p in $(tree_pids "$1"); do v="$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}')" || continue; t=$((t + ${v:-0})); done; echo "$t"; }
hwm_kib() { local t=0 p v; for p in $(tree_pids "$1"); do v="$(awk '/^VmHWM:/{print $2}' "/proc/$p/status" 2>/dev/null)" || continue; t=$((t + ${v:-0})); done; echo "$t"; }
redis_cpu() { rcli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/{s+=$2} END{printf "%.3f", s}'; }
settle() { local a b; a="$(rcli xlen "$1")"; for _ in $(seq 20); do sleep 0.25; b="$(rcli xlen "$1")"; [ "$a" = "$b" ] && break; a="$b"; done; echo "$b"; }
run_wrk() { # conns duration sig run_id stats out
  if [ -n "$P" ] && command -v wrk >/dev/null 2>&1; then
    BENCH_SIG="$3" BENCH_RUN_ID="$4" BENCH_STATS="$5" wrk -t1 -c"$1" -d"$2" --latency -s "$P/post.lua" "$URL" > "$6"
  else
    # the topology_load example signs itself: the right secret, or a wrong one
    local secret="$SECRET"; [ "$3" = "$SIG" ] || secret="$SECRET-wrong"
    bench_load "$1" "$2" "$secret" "$4" "$5" "$6" "$URL"
  fi
}

TSV="$OUT/runs.tsv"
printf 'label\tconns\tduration\trps\tp50_ms\tp90_ms\tp99_ms\tp999_ms\trequests\ts202\ts200\tnon2xx\tsock_err\txlen\txlen_minus_202\txlen_check\tbadsig_req\tbadsig_401\tbadsig_check\tserver_cpu_pct\tredis_cpu_pct\tcpu_us_per_accepted\tpeak_rss_mib\traw\n' > "$TSV"
measure() { # label conns rep
  local l="$1" c="$2" rep="$3" port stream other pid
  if [ "$l" = shepherd ]; then port="$PORT"; stream="$STREAM"; other=2; else port="${PEER_PORT[$l]}"; stream=events; other=1; fi
  pid="${PID[$l]}"; URL="http://127.0.0.1:$port/webhooks/forgejo"
  local raw="$OUT/raw/${l}_c${c}_r${rep}" stats="$OUT/raw/${l}_c${c}_r${rep}.stats"
  local base=$(( $(date +%s) % 100000 * 100 + RANDOM % 100 ))
  rcli flushall sync >/dev/null
  [ "$WARMUP" != 0 ] && { run_wrk "$c" "${WARMUP}s" "$SIG" "$base" /dev/null /dev/null; sleep 0.5; rcli flushall sync >/dev/null; }
  local t0 t1 r0 r1 xlen keys
  t0="$(ticks "$pid")"; r0="$(redis_cpu)"
  run_wrk "$c" "$DURATION" "$SIG" $((base + 1)) "$stats" "$raw.wrk.txt"
  r1="$(redis_cpu)"; t1="$(ticks "$pid")"
  xlen="$(settle "$stream")"; keys="$(rcli dbsize)"
  # Shepherd also keeps <prefix>:repos, written once per repository per process (and
  # again after 10 minutes), so it may be absent after a FLUSHALL: count it only if there.
  if [ "$l" = shepherd ]; then other=$((1 + $(rcli exists "$PREFIX:repos"))); fi
  local secs s202 s200 n2xx=0 non2xx=0 sockerr
  secs="$(awk -v u="$(st "$stats" duration_us)" 'BEGIN{print u/1e6}')"
  s202="$(st "$stats" status_202)"; s200="$(st "$stats" status_200)"
  while IFS='=' read -r k v; do
    code="${k#status_}"; [[ "$code" =~ ^[0-9]+$ ]] || continue
    if [ "$code" -ge 200 ] && [ "$code" -lt 300 ]; then n2xx=$((n2xx + v)); else non2xx=$((non2xx + v)); fi
  done < "$stats"
  sockerr=$(( $(st "$stats" err_connect) + $(st "$stats" err_read) + $(st "$stats" err_write) + $(st "$stats" err_timeout) ))
  local hz; hz="$(getconf CLK_TCK)"
  local server_pct redis_pct us_per rss extra xlen_ok
  server_pct="$(awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s="$secs" 'BEGIN{printf "%.0f", (b-a)/hz/s*100}')"
  redis_pct="$(awk -v a="$r0" -v b="$r1" -v s="$secs" 'BEGIN{printf "%.0f", (b-a)/s*100}')"
  us_per="$(awk -v a="$t0" -v b="$t1" -v hz="$hz" -v n="$xlen" 'BEGIN{ if (n > 0) printf "%.1f", (b-a)/hz/n*1e6; else print "-" }')"
  rss="$(awk -v k="$(hwm_kib "$pid")" 'BEGIN{printf "%.1f", k/1024}')"
  # Every 202 must be in the stream; wrk stops with up to $c requests in flight whose
  # entries land but whose answers are not counted: 0 <= XLEN - 202s <= connections.
  extra=$((xlen - s202))
  if [ "$s202" -gt 0 ] && [ "$extra" -ge 0 ] && [ "$extra" -le "$c" ] && [ "$keys" -eq $((xlen + other)) ]; then xlen_ok=ok; else xlen_ok=FAIL; fi
  ms() { awk -v u="$(st "$stats" "$1")" 'BEGIN{printf "%.2f", u/1000}'; }
  # bad-signature run: all 401, nothing written
  local bad_req=0 bad401=0 bad_ok=skip bstats="$OUT/raw/${l}_c${c}_r${rep}.badsig.stats"
  if [ "$BADSIG_SECS" != 0 ]; then
    rcli flushall sync >/dev/null
    run_wrk "$c" "${BADSIG_SECS}s" "$BAD_SIG" $((base + 2)) "$bstats" /dev/null
    bad_req="$(st "$bstats" requests)"; bad401="$(st "$bstats" status_401)"
    if [ "$bad_req" -gt 0 ] && [ "$bad401" -eq "$bad_req" ] && [ "$(rcli dbsize)" -eq 0 ]; then bad_ok=ok; else bad_ok=FAIL; fi
  fi
  rcli flushall sync >/dev/null
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
    "$l" "$c" "$DURATION" "$(st "$stats" rps)" "$(ms lat_p50_us)" "$(ms lat_p90_us)" "$(ms lat_p99_us)" "$(ms lat_p99_9_us)" \
    "$(st "$stats" requests)" "$s202" "$s200" "$non2xx" "$sockerr" "$xlen" "$extra" "$xlen_ok" "$bad_req" "$bad401" "$bad_ok" \
    "$server_pct" "$redis_pct" "$us_per" "$rss" "${raw#"$OUT"/}" >> "$TSV"
  printf '   %-14s c%-4s %8s req/s  p50 %s ms  p99 %s ms  non-2xx %s  server %s%% (%s us/accepted)  redis %s%%  rss %s MiB  stream %s  badsig %s\n' \
    "$l" "$c" "$(st "$stats" rps)" "$(ms lat_p50_us)" "$(ms lat_p99_us)" "$non2xx" "$server_pct" "$us_per" "$redis_pct" "$rss" "$xlen_ok" "$bad_ok"
}

fails=0
for rep in $(seq "$REPS"); do
  for c in $CONNS; do
    log "rep $rep/$REPS, $c connections"
    for l in shepherd $PEERS; do
      measure "$l" "$c" "$rep"
      tail -1 "$TSV" | awk -F'\t' '$16 == "ok" && ($19 == "ok" || $19 == "skip") { good = 1 } END { exit !good }' || fails=$((fails + 1))
    done
  done
done

# ---- 5. summary --------------------------------------------------------------------------------
{
  if [ -n "$P" ]; then python3 "$P/summarise.py" "$TSV"; else echo "(peers' summarise.py: skipped, no peers' harness)"; fi
  echo
  echo "| receiver | conns | server CPU µs per accepted delivery (median) | peak RSS MiB (max) |"
  echo "|---|---:|---:|---:|"
  awk -F'\t' 'NR > 1 { k = $1 " | " $2; n[k]++; v[k, n[k]] = $22; if ($23 > r[k]) r[k] = $23; if (!(k in seen)) { seen[k] = 1; order[++m] = k } }
    END { for (i = 1; i <= m; i++) { k = order[i]; c = n[k]; for (a = 1; a <= c; a++) s[a] = v[k, a];
          for (a = 1; a <= c; a++) for (b = a + 1; b <= c; b++) if (s[b] + 0 < s[a] + 0) { t = s[a]; s[a] = s[b]; s[b] = t }
          printf "| %s | %s | %s |\n", k, s[int((c + 1) / 2)], r[k] } }' "$TSV"
} > "$OUT/summary.md"
echo
cat "$OUT/summary.md"
echo
echo "results in $OUT  (runs with failed checks: $fails)"
[ "$fails" = 0 ]
