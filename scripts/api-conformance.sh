#!/usr/bin/env bash
# API conformance: starts vigia (embedded store, a temp data folder, the shipped rules/
# plus one scene that challenges, both tokens set) on a free port, validates its /openapi.json with openapi-spec-validator,
# then runs schemathesis with every check against it. Exits non-zero on any finding.
#
#   scripts/api-conformance.sh [VIGIA_BINARY]
#
# VIGIA_BINARY defaults to $CARGO_TARGET_DIR/debug/vigia (target/debug/vigia). The Python
# tools (scripts/requirements-ci.txt) go into the venv at $VIGIA_CI_VENV (default
# .venv-ci), created on first use. SCHEMATHESIS_MAX_EXAMPLES bounds the cases per
# operation and phase (default 300).
set -euo pipefail

die() {
  echo "api-conformance: $*" >&2
  exit 1
}

repo=$(cd "$(dirname "$0")/.." && pwd)
# Paths given by the caller are relative to where they called from; the defaults are in the
# repository (as cargo puts target/ there).
binary=${1:-${CARGO_TARGET_DIR:-$repo/target}/debug/vigia}
[[ -x $binary ]] || die "no vigia binary at $binary (build it with: cargo build --locked)"
binary=$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")
venv=${VIGIA_CI_VENV:-$repo/.venv-ci}
[[ $venv == /* ]] || venv=$(pwd)/$venv
cd "$repo"
command -v python3 >/dev/null 2>&1 || die "python3 is missing (Debian: apt-get install python3)"
command -v curl >/dev/null 2>&1 || die "curl is missing (Debian: apt-get install curl)"

# A venv left without pip (python3-venv was missing when it was made) is made again.
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  python3 -m venv --clear "$venv" >/dev/null ||
    die "python3 -m venv failed; install the venv module (Debian: apt-get install python3-venv)"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r scripts/requirements-ci.txt ||
  die "could not install scripts/requirements-ci.txt into $venv"

work=$(mktemp -d)
vigia_pid=""
cleanup() {
  if [[ -n $vigia_pid ]]; then
    kill "$vigia_pid" 2>/dev/null || true
    wait "$vigia_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# A port nobody listens on now (the kernel's pick, released at once).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export VIGIA_CI_CHECK_TOKEN="ci-check-$RANDOM$RANDOM"
export VIGIA_CI_ADMIN_TOKEN="ci-admin-$RANDOM$RANDOM"
# The shipped rules have no scene that answers challenge, so the 403 and a
# `challenge_passed` naming a scene could not be reached: scene `c` of the ops tests'
# fixture (every fresh check challenged) joins a copy of them.
mkdir "$work/rules"
cp -R "$repo/rules/." "$work/rules/"
cp "$repo/tests/fixtures/ops/challenge.toml" "$work/rules/zz_challenge.toml"
cat >"$work/config.toml" <<TOML
listen = "127.0.0.1:$port"
rules_dir = "$work/rules"
data_dir = "$work/data"

[store]
backend = "embedded"

[auth]
admin_token = "$VIGIA_CI_ADMIN_TOKEN"
check_token = "$VIGIA_CI_CHECK_TOKEN"

# The signals' 5 ms deadline can pass on a debug build sharing two cores with schemathesis
# (seen once in CI): the scene's on_store_error then answers 503, as it should, and
# schemathesis reports a server error. This run checks the API's shape, not latency under
# load (tests/it/signals_shared.rs checks the deadline), so the deadline is generous here.
[behaviour]
deadline_ms = 2000
TOML

# The environment overrides the file: keep the caller's VIGIA_* out of this run.
env -u VIGIA_LISTEN -u VIGIA_RULES_DIR -u VIGIA_DATA_DIR -u VIGIA_STORE -u VIGIA_REDIS_URL \
  -u VIGIA_KEY_PREFIX -u VIGIA_ADMIN_TOKEN -u VIGIA_CHECK_TOKEN \
  "$binary" serve --config "$work/config.toml" >"$work/vigia.log" 2>&1 &
vigia_pid=$!
base="http://127.0.0.1:$port"
for _ in $(seq 1 100); do
  if curl -fsS "$base/readyz" >/dev/null 2>&1; then
    break
  fi
  if ! kill -0 "$vigia_pid" 2>/dev/null; then
    cat "$work/vigia.log" >&2
    die "vigia exited before it was ready"
  fi
  sleep 0.1
done
curl -fsS "$base/readyz" >/dev/null || {
  cat "$work/vigia.log" >&2
  die "vigia not ready on $base after 10 s"
}

echo "api-conformance: validating $base/openapi.json"
curl -fsS "$base/openapi.json" -o "$work/openapi.json"
"$venv/bin/openapi-spec-validator" "$work/openapi.json"

# Every check: scripts/schemathesis.toml enables them all (see there why not `--checks all`).
echo "api-conformance: schemathesis, every check, against $base"
status=0
# From the temp folder: schemathesis keeps a cache folder in its working directory.
# One worker: with two, hypothesis's threads call ast.parse at once, and CPython before
# 3.11.8 / 3.12.1 keeps the AST validator's recursion depth in shared state (gh-106905),
# so a busy machine now and then failed the run with "SystemError: AST constructor
# recursion depth mismatch" inside hypothesis, with every case that ran passing.
(cd "$work" && "$venv/bin/schemathesis" --config-file "$repo/scripts/schemathesis.toml" run openapi.json \
  --url "$base" \
  --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-300}" \
  --seed "${SCHEMATHESIS_SEED:-20261203}" \
  --workers 1 \
  --generation-database none \
  --no-color) || status=$?
if [[ $status -ne 0 ]]; then
  echo "--- vigia log (last 40 lines) ---" >&2
  tail -n 40 "$work/vigia.log" >&2
  die "schemathesis found problems (exit $status)"
fi
echo "api-conformance: ok"
