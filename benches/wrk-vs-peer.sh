#!/usr/bin/env bash
# Kept for its old callers: vigia's `bench` scene against the peer of ../shared/bench, now
# two rows of benches/load.py (which also measures the floors, the hammering workload and
# CPU per request per process; see its header).
#
# Usage: benches/wrk-vs-peer.sh [DURATION_S] [CONNECTIONS]
#   VIGIA_BENCH_STORE=embedded runs vigia on its embedded store instead (the peer stays on Redis).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 benches/load.py -d "${1:-10}" -c "${2:-50}" --rows "${VIGIA_BENCH_STORE:-redis},peer"
