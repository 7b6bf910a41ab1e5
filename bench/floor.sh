#!/usr/bin/env bash
# The floor of a webhook receiver on this machine, beside Shepherd, under the same load
# as bench/ingest.sh: how much CPU per delivery is the fixed cost of receiving 15 KB
# over HTTP, checking its HMAC and writing it to Redis, whatever the receiver.
#
#   PEERS_SRC=/path/to/peers bench/floor.sh
#   BENCH_SMOKE=1 bench/floor.sh     # every step, briefly (tests/it/bench_smoke.rs)
#
# Env: DURATION (10s)  CONNS (32)  REPS (3)  WARMUP (3, seconds)
#      MODES ("answer hmac xadd evalsha full shepherd")  WORK (target/bench)
#      PEERS_SRC (the peers' harness: its redis.sh, post.lua and payload; without it,
#      a redis-server started here, webhooks/pull_request_opened.json and the
#      topology_load example instead of wrk: see bench/lib.sh)
#      PORT (8091)  BENCH_REDIS_PORT (6390)
#      BIN, EXAMPLES (binaries to use instead of the release build; bench/lib.sh)
#
# Receivers: the cargo example `floor` (bench/floor.rs) in each of its modes, each one
# step more than the one before (answer 202 / + HMAC / + XADD / EVALSHA of Shepherd's
# enqueue.lua instead of XADD / + Shepherd's JSON check of the body), and
# `shepherd serve`. For each rep, each receiver in
# rotation: FLUSHALL, warm-up, FLUSHALL, `wrk -t1 -cN` with the peers' post.lua, then
# req/s, p50/p99, and the receiver's CPU time (utime+stime) per answered request.
# Writes $WORK/results/floor-<stamp>/runs.tsv and prints the medians.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DURATION="${DURATION:-10s}"
CONNS="${CONNS:-32}"
REPS="${REPS:-3}"
WARMUP="${WARMUP:-3}"
MODES="${MODES:-answer hmac xadd evalsha full shepherd}"
WORK="${WORK:-$ROOT/target/bench}"
PORT="${PORT:-8091}"
export BENCH_REDIS_PORT="${BENCH_REDIS_PORT:-6390}"
SECRET=bench-secret

. "$ROOT/bench/lib.sh"
if smoke; then
  DURATION=1s; CONNS=4; REPS=1; WARMUP=1; LOAD_COUNT="${LOAD_COUNT:-20}"
fi
peers_harness

need_examples floor topology_load
OUT="$WORK/results/floor-$(date +%Y%m%dT%H%M%S)"
mkdir -p "$OUT"

SPID=""
started_redis=0
stop_server() { [ -n "$SPID" ] && stop_pid "$SPID"; SPID=""; }
cleanup() { stop_server; [ "$started_redis" = 1 ] && stop_bench_redis; return 0; }
trap cleanup EXIT
trap 'exit 130' INT TERM
start_bench_redis

start_server() { # mode
  if [ "$1" = shepherd ]; then
    env -i PATH="$PATH" SHEPHERD_LISTEN="127.0.0.1:$PORT" \
      SHEPHERD_REDIS_URL="redis://127.0.0.1:$BENCH_REDIS_PORT" SHEPHERD_KEY_PREFIX=bench \
      SHEPHERD_WEBHOOK_SECRETS="$SECRET" SHEPHERD_LOG=warn "$BIN" serve \
      > "$OUT/$1.log" 2>&1 &
  else
    "$EXAMPLES/floor" "$1" "127.0.0.1:$PORT" "127.0.0.1:$BENCH_REDIS_PORT" > "$OUT/$1.log" 2>&1 &
  fi
  SPID=$!
  for _ in $(seq 100); do
    # any HTTP answer will do: the floor answers every request with 202 or 401
    curl -s -o /dev/null -X POST --data '{}' "http://127.0.0.1:$PORT/healthz" && return 0
    kill -0 "$SPID" 2>/dev/null || break; sleep 0.1
  done
  echo "$1 did not come up:" >&2; cat "$OUT/$1.log" >&2; exit 1
}

export BENCH_PAYLOAD="$PAYLOAD" BENCH_PATH=/webhooks/forgejo
ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
TSV="$OUT/runs.tsv"
printf 'mode\tconns\trep\trps\tp50_ms\tp99_ms\trequests\ts202\tcpu_us_per_request\n' > "$TSV"
{
  echo "nproc: $(nproc); cpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p')"
  echo "kernel: $(uname -r); redis-server: $(redis-server --version | sed 's/Redis server //')"
  echo "shepherd $(git -C "$ROOT" rev-parse --short HEAD); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/env.md"

for rep in $(seq "$REPS"); do
  for c in $CONNS; do
    for m in $MODES; do
      start_server "$m"
      base=$(( $(date +%s) % 100000 * 100 + RANDOM % 100 ))
      rcli flushall sync >/dev/null
      bench_load "$c" "${WARMUP}s" "$SECRET" "$base" /dev/null /dev/null "http://127.0.0.1:$PORT/webhooks/forgejo"
      rcli flushall sync >/dev/null
      t0="$(ticks "$SPID")"
      bench_load "$c" "$DURATION" "$SECRET" $((base + 1)) "$OUT/$m.c$c.r$rep.stats" "$OUT/$m.c$c.r$rep.wrk.txt" \
        "http://127.0.0.1:$PORT/webhooks/forgejo"
      t1="$(ticks "$SPID")"
      s="$OUT/$m.c$c.r$rep.stats"
      n="$(st "$s" requests)"
      us="$(awk -v a="$t0" -v b="$t1" -v hz="$(getconf CLK_TCK)" -v n="$n" 'BEGIN{printf "%.1f", (b-a)/hz/n*1e6}')"
      ms() { awk -v u="$(st "$s" "$1")" 'BEGIN{printf "%.2f", u/1000}'; }
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$c" "$rep" "$(st "$s" rps)" "$(ms lat_p50_us)" "$(ms lat_p99_us)" \
        "$n" "$(st "$s" status_202)" "$us" >> "$TSV"
      printf '   %-9s c%-4s rep %s  %8s req/s  p50 %s ms  p99 %s ms  202s %s of %s  %s us/request\n' \
        "$m" "$c" "$rep" "$(st "$s" rps)" "$(ms lat_p50_us)" "$(ms lat_p99_us)" "$(st "$s" status_202)" "$n" "$us"
      stop_server
    done
  done
done

echo
echo "| receiver | conns | req/s (median) | p50 ms | p99 ms | CPU µs per request (median) |"
echo "|---|---:|---:|---:|---:|---:|"
# medians per (mode, conns), in the order first run
awk -F'\t' 'function med(k, f,   c, a, b, t, s) { c = n[k]; for (a = 1; a <= c; a++) s[a] = v[k, a, f] + 0
    for (a = 1; a <= c; a++) for (b = a + 1; b <= c; b++) if (s[b] < s[a]) { t = s[a]; s[a] = s[b]; s[b] = t }
    return (c % 2) ? s[(c + 1) / 2] : (s[c / 2] + s[c / 2 + 1]) / 2 }
  function commas(x,   s) { s = sprintf("%.0f", x); while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]($|,)/, ",&", s); return s }
  NR > 1 { k = $1 " | " $2; if (!(k in n)) order[++m] = k; c = ++n[k]; v[k, c, 4] = $4; v[k, c, 5] = $5; v[k, c, 6] = $6; v[k, c, 9] = $9 }
  END { for (i = 1; i <= m; i++) { k = order[i]
    printf "| %s | %s | %.2f | %.2f | %.1f |\n", k, commas(med(k, 4)), med(k, 5), med(k, 6), med(k, 9) } }' "$TSV"
echo
echo "results in $OUT"
