#!/usr/bin/env bash
# Redis's own CPU per decision: the script the service runs for the bench scene (after
# limits.lua, as the service composes them) run by redis-benchmark on a private Redis with
# its four limits,
# every call a new request id (a reused id takes the duplicate shortcut and measures
# nothing), then Redis's `INFO commandstats` usec_per_call for EVALSHA: time inside Redis
# only, no client, no network. Two workloads: `allow` (users and devices from 100M, so
# nearly every check is recorded) and `deny` (one user already over user_10s, so every
# check is evaluated and refused).
#
# Usage: benches/lua-cpu.sh [GIT_REV]   scripts from GIT_REV (default: the working tree)
#   SCRIPT=shaped (default), check or decide: the bench scene has limits only, so the
#   service runs the script made for its shape of limits (src/store/limits_script.rs,
#   printed by `cargo run --release --example limits_lua`; needs cargo, and ignores
#   GIT_REV: it is the working tree's); check.lua is the general script it falls back to
#   (more than 16 limits); decide.lua is what a scene with trust, a score or signals runs
#   (and what the bench scene ran before 2026-12), here fed the same four limits.
#   N=calls per workload (200000), CONNS (8).  Needs: redis-server, redis-benchmark.
#   CALLGRIND=1 runs Redis under valgrind's callgrind and reports instructions per call
#   instead: slower (use N=2000), but the same on a busy machine as on a quiet one, so two
#   revisions compare exactly. Needs valgrind (apt-get install valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
for t in redis-server redis-benchmark redis-cli; do
  command -v "$t" >/dev/null || { echo "$t is not on PATH (apt-get install redis-server / redis-tools)" >&2; exit 1; }
done
rev=${1:-}; n=${N:-200000}; conns=${CONNS:-8}; cg=${CALLGRIND:-}; script=${SCRIPT:-shaped}
case "$script" in shaped|check|decide) ;; *) echo "SCRIPT must be shaped, check or decide, not $script" >&2; exit 1 ;; esac
if [ -n "$cg" ]; then
  command -v valgrind >/dev/null || { echo "valgrind is not on PATH (apt-get install valgrind)" >&2; exit 1; }
fi
tmp=$(mktemp -d); pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
if [ "$script" = shaped ]; then
  cargo run --quiet --release --example limits_lua -- \
    s:10000:10000 s:86400000:86400000 f:60000:60000 f:60000:60000 >"$tmp/script.lua"
elif [ -n "$rev" ]; then
  git show "$rev:lua/limits.lua" >"$tmp/script.lua"; git show "$rev:lua/$script.lua" >>"$tmp/script.lua"
else
  cat lua/limits.lua "lua/$script.lua" >"$tmp/script.lua"
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
if [ -n "$cg" ]; then
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.%p" \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null 2>&1 &
else
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" >/dev/null &
fi
pid=$!
for _ in $(seq 300); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
sha=$(redis-cli -p "$port" -x SCRIPT LOAD <"$tmp/script.lua")

# Each script's layout (see its header) for the bench scene: no trust, no score, no
# signals, no idempotency key. decide.lua before 2026-12 always sent 5 fixed keys (absent ones
# standing in as the record key) and 22 fixed args, 7 per limit; later ones send only the
# blocks a check uses: the record key, 9 fixed args, 5 per limit. Since the records moved
# into hashes per entity (lua/limits.lua, "records") the first key is the user's records
# key, check.lua's and the shaped scripts' second key (the idempotency key) gave way to
# ARGV[6] (its field, "" without one), and each limit also sends its tag (the shaped
# script: ARGV[7], the record's entries). The header tells which.
if grep -q 'HEXISTS' "$tmp/script.lua"; then
  rec=lt:bench:rq:uid:__rand_int__; head=("$rec"); idem=(""); tag=(AAAAAA); entries=(fBBBBBBfCCCCCC)
else
  rec=lt:bench:req:__rand_int__; head=("$rec" "$rec"); idem=(); tag=(); entries=()
fi
if [ "$script" = shaped ]; then
  # A shaped script: check.lua's keys and fixed args, then only each limit's max.
  head_keys=("${head[@]}")
  head_args=(__rand_int__ 0 "" 10000 "" "${idem[@]}" "${entries[@]}")
  per_limit=()
elif [ "$script" = check ]; then
  # check.lua: the record key (and, before, the idempotency key's place), the limit keys;
  # the fixed args ("" for ARGV[3]: a service-made id, no idempotency key), 4 per limit (5
  # with the tag).
  head_keys=("${head[@]}")
  head_args=(__rand_int__ 0 "" 10000 "" "${idem[@]}")
  per_limit=("${tag[@]}")
elif grep -q '^ARGV\[22\]' "$tmp/script.lua"; then
  head_keys=("$rec" "$rec" "$rec" "$rec" "$rec")
  head_args=(__rand_int__ 0 0 10000 "" 0 0 0 0 "" 0 0 0 0 "" "" "" 0 "" "" 0 4)
  per_limit=(0 0 "")
else
  head_keys=("$rec")
  head_args=(__rand_int__ 0 "" 10000 "" 0 0 0 4)
  per_limit=("" "${tag[@]}")
fi
if [ "$script" = shaped ]; then
  limit_args=(3 10 100 100000000)
else
  limit_args=(s 10000 3 10000 "${per_limit[@]}" s 86400000 10 86400000 "${per_limit[@]}"
              f 60000 100 60000 "${per_limit[@]}" f 60000 100000000 60000 "${per_limit[@]}")
fi
run() { # name user-key-segment
  local user=$2
  redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
  if [ -n "$cg" ]; then callgrind_control -z "$pid" >/dev/null 2>&1; fi
  redis-benchmark -p "$port" -c "$conns" -n "$n" -r 100000000 -q \
    EVALSHA "$sha" $((${#head_keys[@]} + 4)) \
    "${head_keys[@]}" \
    "lt:bench:uid:$user" lt:bench:did:__rand_int__ lt:bench:fw:ip_60s:ip:__rand_int__ lt:bench:fw:activity_60s:act:a1 \
    "${head_args[@]}" "${limit_args[@]}" >/dev/null
  if [ -n "$cg" ]; then
    rm -f "$tmp"/cg.*; callgrind_control -d "$pid" >/dev/null 2>&1
    local ir=
    for _ in $(seq 100); do
      ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$tmp"/cg.* 2>/dev/null || true)
      [ -n "$ir" ] && break; sleep 0.1
    done
    printf '%-6s %10s instructions inside Redis per decision   (%s.lua, %s calls)\n' "$1" "$((ir / n))" "$script" "$n"
    return
  fi
  local usec; usec=$(redis-cli -p "$port" INFO commandstats | tr -d '\r' | awk -F'[,=]' '/^cmdstat_evalsha:/ {for (i=1;i<=NF;i++) if ($i=="usec_per_call") print $(i+1)}')
  local errs; errs=$(redis-cli -p "$port" INFO errorstats | tr -d '\r' | grep -c '^errorstat_' || true)
  printf '%-6s %10s µs of Redis CPU per decision   (%s.lua, %s calls, %s error kinds)\n' "$1" "$usec" "$script" "$n" "$errs"
  [ "$errs" = 0 ] || { redis-cli -p "$port" INFO errorstats >&2; exit 1; }
}
run allow __rand_int__
# Fill the one user's window (max 3), then every check on it is denied.
run deny hot
