#!/usr/bin/env bash
# Instructions per check of a whole vigia binary, counted by valgrind's callgrind: the
# service under `wrk` load on the bench scene, its counters zeroed after a warm-up, then
# the instructions of every thread over a measured run divided by the requests `wrk`
# completed. Instructions, unlike time, do not move with what else the machine runs, so
# two builds compare to a fraction of a percent where a timed A/B (benches/ab.sh) moves
# ±10 % between runs of one binary. What it does not see: cache misses, lock waits and
# the kernel (a change that only moves those needs benches/ab.sh or benches/load.py).
#
# Usage: benches/callgrind.sh BINARY [BINARY…]     e.g. target/release/vigia
#   STORE=embedded|redis (default embedded), DUR=seconds measured (20), CONNS (8),
#   SCRIPT (the wrk script, default benches/wrk/check.lua).
#   KEEP=DIR keeps each run's callgrind file there (callgrind_annotate reads it; build
#   without LTO for a readable profile: CARGO_PROFILE_RELEASE_LTO=false).
# Needs: valgrind (apt-get install valgrind), wrk, redis-server (STORE=redis), python3.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,15p "$0"; exit 2; }
for t in valgrind callgrind_control wrk python3; do
  command -v "$t" >/dev/null || { echo "$t is not on PATH (apt-get install valgrind wrk python3)" >&2; exit 1; }
done
store=${STORE:-embedded}; dur=${DUR:-20}; conns=${CONNS:-8}; script=${SCRIPT:-benches/wrk/check.lua}
case "$store" in embedded|redis) ;; *) echo "STORE must be embedded or redis, not $store" >&2; exit 1 ;; esac
if [ "$store" = redis ]; then
  command -v redis-server >/dev/null || { echo "redis-server is not on PATH (apt-get install redis-server)" >&2; exit 1; }
fi
tmp=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# valgrind starts the service ~50 times slower: up to a minute.
wait_port() { for _ in $(seq 600); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }
# The instructions in the callgrind files matching $1 (each file says its total once, as
# "summary:", and again at its end as "totals:").
irs() { cat $1 2>/dev/null | awk '/^summary:/ {s += $2} END {print s + 0}'; }
mkdir -p "$tmp/rules" && cp benches/rules/bench.toml "$tmp/rules/"
rport=$(free_port)
if [ "$store" = redis ]; then
  redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null &
  pids+=($!); wait_port "$rport"
fi
for bin in "$@"; do
  vport=$(free_port); out="$tmp/cg.$(basename "$bin")"
  rm -rf "$tmp/data"
  VIGIA_LISTEN=127.0.0.1:$vport VIGIA_RULES_DIR=$tmp/rules VIGIA_STORE=$store VIGIA_DATA_DIR=$tmp/data \
    VIGIA_REDIS_URL=redis://127.0.0.1:$rport RUST_LOG=warn \
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" --config config.toml 2>"$tmp/valgrind.log" &
  pid=$!; pids+=($pid); wait_port "$vport"
  wrk -t1 -c"$conns" -d5s -s "$script" "http://127.0.0.1:$vport" >/dev/null # warm up
  callgrind_control --zero "$pid" >/dev/null
  res=$(wrk -t1 -c"$conns" -d"${dur}s" -s "$script" "http://127.0.0.1:$vport")
  callgrind_control --dump "$pid" >/dev/null
  # The dump is written by the service's threads as they next run: wait for it.
  for _ in $(seq 100); do [ "$(irs "$out.*")" != 0 ] && break; sleep 0.2; done
  reqs=$(awk '/requests in/ {print $1}' <<<"$res")
  ir=$(irs "$out.*")
  printf '%-8s %-32s %8s requests  %8s instructions per check\n' "$store" "$bin" "$reqs" \
    "$(python3 -c "print(round($ir / $reqs))")"
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$out".* "$KEEP/"; fi
  kill "$pid"; wait "$pid" 2>/dev/null || true
  if [ "$store" = redis ]; then redis-cli -p "$rport" flushall >/dev/null; fi
done
