#!/usr/bin/env bash
# The floor of a webhook receiver on this machine, beside Shepherd, under the same load
# as bench/ingest.sh: how much CPU per delivery is the fixed cost of receiving 15 KB
# over HTTP, checking its HMAC and writing it to Redis, whatever the receiver.
#
#   bench/floor.sh
#
# Env: DURATION (10s)  CONNS (32)  REPS (3)  WARMUP (3, seconds)
#      MODES ("answer hmac xadd evalsha full shepherd")  WORK (target/bench)
#      PEERS_SRC (../shared/peers)  PORT (8091)  BENCH_REDIS_PORT (6390)
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
PEERS_SRC="${PEERS_SRC:-$ROOT/../shared/peers}"
WORK="${WORK:-$ROOT/target/bench}"
PORT="${PORT:-8091}"
export BENCH_REDIS_PORT="${BENCH_REDIS_PORT:-6390}"
SECRET=bench-secret

. "$ROOT/bench/lib.sh"
peers_harness

(cd "$ROOT" && cargo build --release --bin shepherd --example floor 2>&1 | tail -1)
OUT="$WORK/results/floor-$(date +%Y%m%dT%H%M%S)"
mkdir -p "$OUT"

SPID=""
started_redis=0
stop_server() { [ -n "$SPID" ] && stop_pid "$SPID"; SPID=""; }
cleanup() { stop_server; [ "$started_redis" = 1 ] && "$P/redis.sh" stop >/dev/null; return 0; }
trap cleanup EXIT
trap 'exit 130' INT TERM
start_bench_redis

start_server() { # mode
  if [ "$1" = shepherd ]; then
    env -i PATH="$PATH" SHEPHERD_LISTEN="127.0.0.1:$PORT" \
      SHEPHERD_REDIS_URL="redis://127.0.0.1:$BENCH_REDIS_PORT" SHEPHERD_KEY_PREFIX=bench \
      SHEPHERD_WEBHOOK_SECRETS="$SECRET" SHEPHERD_LOG=warn "$ROOT/target/release/shepherd" serve \
      > "$OUT/$1.log" 2>&1 &
  else
    "$ROOT/target/release/examples/floor" "$1" "127.0.0.1:$PORT" "127.0.0.1:$BENCH_REDIS_PORT" > "$OUT/$1.log" 2>&1 &
  fi
  SPID=$!
  for _ in $(seq 100); do
    # any HTTP answer will do: the floor answers every request with 202 or 401
    curl -s -o /dev/null -X POST --data '{}' "http://127.0.0.1:$PORT/healthz" && return 0
    kill -0 "$SPID" 2>/dev/null || break; sleep 0.1
  done
  echo "$1 did not come up:" >&2; cat "$OUT/$1.log" >&2; exit 1
}

SIG="$(openssl dgst -sha256 -hmac "$SECRET" -r "$PAYLOAD" | cut -d' ' -f1)"
export BENCH_PAYLOAD="$PAYLOAD" BENCH_PATH=/webhooks/forgejo BENCH_SIG="$SIG"
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
      BENCH_RUN_ID="$base" wrk -t1 -c"$c" -d"${WARMUP}s" -s "$P/post.lua" "http://127.0.0.1:$PORT/webhooks/forgejo" > /dev/null
      rcli flushall sync >/dev/null
      t0="$(ticks "$SPID")"
      BENCH_RUN_ID=$((base + 1)) BENCH_STATS="$OUT/$m.c$c.r$rep.stats" \
        wrk -t1 -c"$c" -d"$DURATION" --latency -s "$P/post.lua" "http://127.0.0.1:$PORT/webhooks/forgejo" > "$OUT/$m.c$c.r$rep.wrk.txt"
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
python3 - "$TSV" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
seen = []
for r in rows:
    k = (r["mode"], r["conns"])
    if k not in seen:
        seen.append(k)
for k in seen:
    g = [r for r in rows if (r["mode"], r["conns"]) == k]
    med = lambda f: statistics.median(float(r[f]) for r in g)
    print(f"| {k[0]} | {k[1]} | {med('rps'):,.0f} | {med('p50_ms'):.2f} | {med('p99_ms'):.2f} | {med('cpu_us_per_request'):.1f} |")
EOF
echo
echo "results in $OUT"
