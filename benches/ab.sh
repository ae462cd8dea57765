#!/usr/bin/env bash
# A/B of two vigia binaries under the same HTTP load: throughput, p99, the service's CPU
# per request (utime + stime from /proc/PID/stat over the run, divided by the requests) and
# its resident memory at the end. Each binary runs twice, alternating, on a fresh data
# folder (and a flushed private Redis), so drift shows as a spread, not as a difference.
#
# Usage: benches/ab.sh BINARY_A BINARY_B      e.g. a copy of target/release/vigia before a
#        change and the one after it
#   STORE=embedded|redis (default embedded), DUR=seconds per run (15), CONNS (32),
#   SCRIPT (the wrk script, default benches/wrk/check.lua; benches/wrk/hammer.lua: the
#   hammering workload, whose warm-up fills its hot accounts).
# Needs: wrk, redis-server (STORE=redis), python3.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,12p "$0"; exit 2; }
command -v wrk >/dev/null || { echo "wrk is not on PATH (apt-get install wrk)" >&2; exit 1; }
store=${STORE:-embedded}; dur=${DUR:-15}; conns=${CONNS:-32}; script=${SCRIPT:-benches/wrk/check.lua}
tmp=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }
mkdir -p "$tmp/rules" && cp benches/rules/bench.toml "$tmp/rules/"
rport=$(free_port); vport=$(free_port)
if [ "$store" = redis ]; then
  redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null &
  pids+=($!); wait_port "$rport"
fi
hz=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for round in 1 2; do
  for bin in "$1" "$2"; do
    [ "$store" = redis ] && redis-cli -p "$rport" flushall >/dev/null
    rm -rf "$tmp/data"
    VIGIA_LISTEN=127.0.0.1:$vport VIGIA_RULES_DIR=$tmp/rules VIGIA_STORE=$store VIGIA_DATA_DIR=$tmp/data \
      VIGIA_REDIS_URL=redis://127.0.0.1:$rport RUST_LOG=warn "$bin" --config config.toml &
    pid=$!; wait_port "$vport"
    wrk -t1 -c16 -d3s -s "$script" "http://127.0.0.1:$vport" >/dev/null # warm up
    t0=$(cpu "$pid")
    out=$(wrk -t1 -c"$conns" -d"${dur}s" --latency -s "$script" "http://127.0.0.1:$vport")
    t1=$(cpu "$pid")
    reqs=$(awk '/requests in/ {print $1}' <<<"$out")
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    p99=$(awk '$1=="99%" {print $2}' <<<"$out")
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
    printf '%-8s %-28s round %s  %9s req/s  p99 %8s  %6s µs CPU/req  RSS %6s MB\n' "$store" "$bin" "$round" \
      "$rps" "$p99" "$(python3 -c "print(round(($t1 - $t0) / $hz * 1e6 / $reqs, 1))")" "$((rss / 1024))"
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
