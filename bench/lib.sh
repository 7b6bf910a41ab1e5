# Shared by the bench/*.sh scripts (sourced, not run; it only defines functions).
# peers_harness, rcli and start_bench_redis (bench/ingest.sh, bench/floor.sh) expect
# WORK, PEERS_SRC and BENCH_REDIS_PORT to be set.

# The peers' harness (../shared/peers, never committed here) in a writable copy under
# $WORK, with its idempotent setup.sh run (apt: redis-server redis-tools wrk; npm; venv).
# Sets P (the copy) and PAYLOAD (the ~15 KB pull_request body).
peers_harness() {
  P="$WORK/peers"
  if [ ! -x "$P/setup.sh" ]; then
    [ -d "$PEERS_SRC" ] || { echo "peers harness not found at $PEERS_SRC (set PEERS_SRC)" >&2; exit 1; }
    mkdir -p "$WORK"; cp -r "$PEERS_SRC" "$P"; chmod -R u+w "$P"
  fi
  (cd "$P" && ./setup.sh) > "$WORK/setup.log" 2>&1 || { cat "$WORK/setup.log"; exit 1; }
  PAYLOAD="$P/payload/pull_request_opened.json"
}

rcli() { redis-cli -h 127.0.0.1 -p "$BENCH_REDIS_PORT" "$@"; }

# A fresh redis-server on $BENCH_REDIS_PORT (the peers' redis.sh: no persistence);
# refuses to use one that is already there. Sets started_redis=1 for the caller's cleanup.
start_bench_redis() {
  if rcli ping >/dev/null 2>&1; then
    echo "something already answers on $BENCH_REDIS_PORT; the benchmark needs a fresh redis-server" >&2
    exit 1
  fi
  "$P/redis.sh" start >/dev/null; started_redis=1
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
