# Shared by the bench/*.sh scripts (sourced, not run; it only defines functions).
# peers_harness, rcli and start_bench_redis (bench/ingest.sh, bench/floor.sh) expect
# WORK and BENCH_REDIS_PORT to be set, and PEERS_SRC when the peers are wanted.
#
# Smoke mode (BENCH_SMOKE=1; tests/it/bench_smoke.rs runs every script so): each script
# runs every step it has, briefly (a second or two, a handful of requests), with the
# binaries it is given instead of a release build: BIN (the shepherd binary), EXAMPLES
# (the folder of the cargo examples `floor`, `enqueue_mechanisms`, `topology_load`) and
# BENCH_IT_BIN (the integration-test binary, for the scripts that run an ignored test).
# Without them a smoke run builds the debug ones. The figures of a smoke run mean nothing.

smoke() { [ "${BENCH_SMOKE:-0}" = 1 ]; }

# The folder of the cargo examples, built first unless EXAMPLES is given: release
# normally, debug in smoke mode. `need_examples NAME...` (also builds the shepherd bin
# when BIN is not given).
need_examples() {
  local profile=(--release) dir=release what=()
  smoke && { profile=(); dir=debug; }
  [ -n "${BIN:-}" ] || what+=(--bin shepherd)
  if [ -z "${EXAMPLES:-}" ]; then
    local e; for e in "$@"; do what+=(--example "$e"); done
    EXAMPLES="$ROOT/target/$dir/examples"
  fi
  if [ ${#what[@]} -gt 0 ]; then
    (cd "$ROOT" && cargo build "${profile[@]}" "${what[@]}" 2>&1 | tail -1)
  fi
  BIN="${BIN:-$ROOT/target/$dir/shepherd}"
}

# Runs the ignored integration test NAME (a benchmark) with its output, through
# BENCH_IT_BIN when given (the test binary itself), else `cargo nextest run` with the
# extra cargo arguments given after NAME (e.g. --release).
run_ignored_test() {
  local name="$1"; shift
  if [ -n "${BENCH_IT_BIN:-}" ]; then
    "$BENCH_IT_BIN" "$name" --ignored --nocapture --test-threads 1 -q 2>&1
  else
    (cd "$ROOT" && cargo nextest run "$@" --test it --run-ignored only -E "test($name)" --no-capture 2>&1)
  fi
}

# The peers' harness (given as PEERS_SRC, never committed here) in a writable copy under
# $WORK, with its idempotent setup.sh run (apt: redis-server redis-tools wrk; npm; venv).
# Sets P (the copy) and PAYLOAD (the ~15 KB pull_request body). Without PEERS_SRC: P is
# empty, the payload is webhooks/pull_request_opened.json, the peers are skipped and the
# load comes from the `topology_load` example instead of wrk (see bench_load).
peers_harness() {
  if [ -z "${PEERS_SRC:-}" ]; then
    P=""
    PAYLOAD="$ROOT/webhooks/pull_request_opened.json"
    echo "peers: skipped (PEERS_SRC not set; give the path of the peers' harness to compare with them)"
    return 0
  fi
  P="$WORK/peers"
  if [ ! -x "$P/setup.sh" ]; then
    [ -d "$PEERS_SRC" ] || { echo "peers harness not found at $PEERS_SRC (set PEERS_SRC)" >&2; exit 1; }
    mkdir -p "$WORK"; cp -r "$PEERS_SRC" "$P"; chmod -R u+w "$P"
  fi
  (cd "$P" && ./setup.sh) > "$WORK/setup.log" 2>&1 || { cat "$WORK/setup.log"; exit 1; }
  PAYLOAD="$P/payload/pull_request_opened.json"
}

rcli() { redis-cli -h 127.0.0.1 -p "$BENCH_REDIS_PORT" "$@"; }

# A fresh redis-server on $BENCH_REDIS_PORT (the peers' redis.sh, or the same settings
# here without the peers: no persistence); refuses to use one that is already there.
# Sets started_redis=1 for the caller's cleanup (stop_bench_redis).
start_bench_redis() {
  if rcli ping >/dev/null 2>&1; then
    echo "something already answers on $BENCH_REDIS_PORT; the benchmark needs a fresh redis-server" >&2
    exit 1
  fi
  if [ -n "$P" ]; then
    "$P/redis.sh" start >/dev/null; started_redis=1
    return 0
  fi
  mkdir -p "$WORK/redis"
  redis-server --port "$BENCH_REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --pidfile "$WORK/redis/redis.pid" --logfile "$WORK/redis/redis.log" \
    --dir "$WORK/redis" --maxclients 10000
  started_redis=1
  for _ in $(seq 50); do rcli ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "redis-server did not start on $BENCH_REDIS_PORT; see $WORK/redis/redis.log" >&2
  exit 1
}

stop_bench_redis() {
  if [ -n "$P" ]; then "$P/redis.sh" stop >/dev/null; return 0; fi
  [ -s "$WORK/redis/redis.pid" ] && stop_pid "$(cat "$WORK/redis/redis.pid")"
  return 0
}

# One load run: `bench_load CONNS DURATION SECRET RUN_ID STATS OUT URL`. With the peers'
# harness and wrk: `wrk -t1 -cCONNS -dDURATION --latency` with the peers' post.lua (the
# signature of $PAYLOAD under SECRET). Without them: the `topology_load` example posts
# LOAD_COUNT (default 2000; duration ignored) deliveries of $PAYLOAD, CONNS in flight.
# Either way STATS gets post.lua's key=value lines (requests, duration_us, rps,
# lat_*_us, status_<code>, err_*) and OUT the generator's own output.
bench_load() {
  local conns="$1" duration="$2" secret="$3" run="$4" stats="$5" out="$6" url="$7"
  if [ -n "$P" ] && command -v wrk >/dev/null 2>&1; then
    BENCH_SIG="$(openssl dgst -sha256 -hmac "$secret" -r "$PAYLOAD" | cut -d' ' -f1)" \
      BENCH_RUN_ID="$run" BENCH_STATS="$stats" \
      wrk -t1 -c"$conns" -d"$duration" --latency -s "$P/post.lua" "$url" > "$out"
    return 0
  fi
  local line
  line="$("$EXAMPLES/topology_load" "$url" "$secret" "$PAYLOAD" "${LOAD_COUNT:-2000}" "$conns" 1 "load$run")"
  echo "$line" > "$out"
  [ "$stats" = /dev/null ] && return 0
  echo "$line" | awk -F'\t' '{
    printf "requests=%d\nduration_us=%d\nrps=%.1f\n", $1, $2 * 1e6, $3
    printf "lat_p50_us=%d\nlat_p90_us=%d\nlat_p99_us=%d\nlat_p99_9_us=%d\n", $4 * 1000, $5 * 1000, $5 * 1000, $5 * 1000
    n = split($8, s, ","); e = 0
    for (i = 1; i <= n; i++) { split(s[i], kv, ":"); if (kv[1] == 0) e += kv[2]; else printf "status_%s=%d\n", kv[1], kv[2] }
    printf "err_connect=%d\nerr_read=0\nerr_write=0\nerr_status=0\nerr_timeout=0\n", e }' > "$stats"
}

# Stops a process started by the script: TERM, up to 5 s, then KILL.
stop_pid() {
  local pid="$1"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  return 0
}

# One value from a stats file written by the peers' post.lua (0 if absent).
st() { local v; v="$(sed -n "s/^$2=//p" "$1" | head -1)"; echo "${v:-0}"; }

# The lines every benchmark's output starts with: the machine, its load and the commit
# (docs/benchmarks.md records them beside the figures).
machine_header() {
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"
  echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
}
