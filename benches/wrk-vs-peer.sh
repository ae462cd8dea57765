#!/usr/bin/env bash
# Load figure: vigia's `bench` scene against the peer in ../shared/bench (rate-limiter-flexible
# over Redis behind node's http), same four limits, same wrk script, same private Redis, one
# run. Prints throughput and latency for both and their ratio.
#
# Usage: benches/wrk-vs-peer.sh [DURATION_S] [CONNECTIONS]
#   VIGIA_BENCH_STORE=embedded runs vigia on its embedded store instead (the peer stays on Redis).
# Needs: wrk, node + npm (the peer installs its packages on first run), redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
dur=${1:-10}
conns=${2:-50}
shared=${SHARED:-../shared}
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

rport=$(free_port); vport=$(free_port); pport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null &
pids+=($!); wait_port "$rport"

cargo build --release --quiet
mkdir -p "$tmp/rules" && cp benches/rules/bench.toml "$tmp/rules/"
VIGIA_LISTEN=127.0.0.1:$vport VIGIA_RULES_DIR=$tmp/rules VIGIA_STORE=${VIGIA_BENCH_STORE:-redis} VIGIA_DATA_DIR=$tmp/data \
  VIGIA_REDIS_URL=redis://127.0.0.1:$rport RUST_LOG=warn ./target/release/vigia --config config.toml &
pids+=($!); wait_port "$vport"

"$shared/bench/peer.sh" "$pport" "$rport" >/dev/null 2>&1 &
pids+=($!); wait_port "$pport"

run() { # name port
  local out; out=$(wrk -t2 -c"$conns" -d"${dur}s" --latency -s "$shared/bench/wrk-check.lua" "http://127.0.0.1:$2")
  local rps p50 p99 non2xx
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  echo "$1 $rps $p50 $p99 ${non2xx:-0}"
}
# Warm both once, then measure each in turn; flush Redis between so neither inherits keys.
wrk -t1 -c4 -d2s -s "$shared/bench/wrk-check.lua" "http://127.0.0.1:$vport" >/dev/null
wrk -t1 -c4 -d2s -s "$shared/bench/wrk-check.lua" "http://127.0.0.1:$pport" >/dev/null
redis-cli -p "$rport" FLUSHALL >/dev/null
v=$(run vigia "$vport")
redis-cli -p "$rport" FLUSHALL >/dev/null
p=$(run peer "$pport")
printf '%-6s %12s %10s %10s %10s\n' who req/s p50 p99 non-2xx
printf '%-6s %12s %10s %10s %10s\n' $v
printf '%-6s %12s %10s %10s %10s\n' $p
awk -v a="$(cut -d' ' -f2 <<<"$v")" -v b="$(cut -d' ' -f2 <<<"$p")" 'BEGIN { printf "throughput ratio vigia/peer: %.2f\n", a/b }'
