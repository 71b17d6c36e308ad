#!/usr/bin/env bash
# Generated clients against a live gateway: generates from the committed openapi/openapi.json,
# into target/clients/, a TypeScript client (openapi-typescript types + openapi-fetch,
# clients/ts), a Python client (openapi-python-client, clients/python) and a Rust client
# (openapi-generator's rust generator, clients/rust), then runs each one's smoke against a
# gateway in front of the echo agent. The TypeScript and Python smokes create a session, prompt
# it (end_turn; and twice with one Idempotency-Key: a replay), set its mode and its model, list
# it, read its status (live), delete it (204), and see it gone (status not_found, GET 404, not
# listed). The Rust smoke (a typed language) drives a session through every kind of event the
# echo agent can log in one turn and checks that the generated types decode each event of its
# history page and of GET /events into the variant its `event` names.
#   bash scripts/clients.sh [install | build]
#     install: the toolchains only; build: also generates the clients and builds the Rust one,
#     running nothing (CI does this in the background, before the stage that runs the smokes).
# Installs (npm ci in clients/ts, venvs under target/) only when missing or when their pins
# changed; the generated code is rebuilt on every run and never committed. The Rust generator
# needs Java (17 or newer): without it the Rust client is skipped, except in CI (CI set), where
# that fails. CLIENTS_NO_BUILD=1 skips the cargo build and uses the debug binaries already in
# target/.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/gateway.sh
start=$SECONDS
mode=${1:-run}

# The TypeScript toolchain, from clients/ts/package-lock.json.
ts=clients/ts
stamp="$ts/node_modules/.clients-sh-lock"
if ! cmp -s "$ts/package-lock.json" "$stamp" 2>/dev/null; then
  (cd "$ts" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$ts/package-lock.json" "$stamp"
fi

# openapi-python-client, pinned with all its dependencies in clients/python/requirements.txt.
venv=target/clients-venv
if ! cmp -s clients/python/requirements.txt "$venv/requirements.txt" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r clients/python/requirements.txt
  cp clients/python/requirements.txt "$venv/requirements.txt"
fi

# openapi-generator-cli (the OpenAPI Generator jar from PyPI, pinned in clients/rust). It needs
# Java: in CI its absence fails the run; elsewhere only the Rust client is skipped.
rust=1
if ! command -v java >/dev/null; then
  if [ -n "${CI:-}" ]; then
    echo "FATAL: Java is required for openapi-generator (the Rust client)" >&2
    exit 1
  fi
  echo "no Java here: the Rust client is skipped (install a JRE, 17 or newer, to run it)"
  rust=
fi
genvenv=target/clients-generator-venv
if [ -n "$rust" ] && ! cmp -s clients/rust/requirements.txt "$genvenv/requirements.txt" 2>/dev/null; then
  rm -rf "$genvenv"
  python3 -m venv "$genvenv"
  "$genvenv/bin/pip" install -q --disable-pip-version-check -r clients/rust/requirements.txt
  cp clients/rust/requirements.txt "$genvenv/requirements.txt"
fi

[ "$mode" != install ] || exit 0
[ "$mode" = build ] || [ "${CLIENTS_NO_BUILD:-}" = 1 ] || cargo build -q --bin acp-gateway --example echo_agent

# Generate both clients afresh.
out=target/clients
rm -rf "$out/ts" "$out/python"
mkdir -p "$out/ts"
"$ts/node_modules/.bin/openapi-typescript" openapi/openapi.json -o "$out/ts/schema.d.ts"
ln -s "$PWD/$ts/node_modules" "$out/ts/node_modules" # lets build/smoke.js import openapi-fetch
"$ts/node_modules/.bin/tsc" -p "$ts/tsconfig.schema.json" # the generated declarations are valid
"$ts/node_modules/.bin/tsc" -p "$ts" # type-checks smoke.ts against them and emits build/smoke.js
# ruff (a pinned dependency) formats the generated code; it has to be on PATH for that.
if ! PATH="$PWD/$venv/bin:$PATH" "$venv/bin/openapi-python-client" generate \
  --path openapi/openapi.json --output-path "$out/python" \
  --config clients/python/config.yaml --meta setup --fail-on-warning >"$out/python-generate.log" 2>&1; then
  cat "$out/python-generate.log"
  echo "openapi-python-client failed (or warned) on openapi/openapi.json"
  exit 1
fi
rm -rf "$out/rust"
if [ -n "$rust" ]; then
  # A fixed version, so that clients/rust/Cargo.lock holds whatever the gateway's version. A
  # binary body (a workspace file's) as its bytes: the generator's own PathBuf is handed to
  # reqwest as a body, which does not compile.
  if ! "$genvenv/bin/openapi-generator-cli" generate -g rust -i openapi/openapi.json -o "$out/rust" \
    --additional-properties=packageName=acp-gateway-client,packageVersion=0.0.0,supportAsync=false \
    '--type-mappings=file=Vec<u8>,binary=Vec<u8>' \
    >"$out/rust-generate.log" 2>&1; then
    cat "$out/rust-generate.log"
    echo "openapi-generator (rust) failed on openapi/openapi.json"
    exit 1
  fi
  # Its own target directory, kept between runs: only the generated crate is rebuilt.
  CARGO_TARGET_DIR=target/clients-rust-target cargo build -q --locked \
    --manifest-path clients/rust/Cargo.toml
fi
echo "generated the clients into $out from openapi/openapi.json"
[ "$mode" != build ] || exit 0

# A gateway in front of the echo agent on an ephemeral port, with a throwaway SQLite db.
work=$(mktemp -d)
pid=
cleanup() {
  local rc=$?
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  if [ "$rc" -ne 0 ] && [ -s "$work/log" ]; then
    echo "--- gateway log (last 40 lines) ---"
    tail -n 40 "$work/log"
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM # so that the EXIT trap stops the gateway on a signal too
# Webhooks to loopback that are disabled after a second of failing (the Rust smoke's
# webhook_disabled).
ECHO_AGENT_DIR="$work/agent" ECHO_AGENT_CONTROLS=modes,models target/debug/acp-gateway \
  --agent target/debug/examples/echo_agent --listen 127.0.0.1:0 --workspace-dir "$work/workspaces" \
  --webhook-allow-private --webhook-max-age 1 --webhook-retry-base-ms 100 --webhook-poll-ms 100 \
  --database-url "sqlite:$work/gateway.db" --control-timeout 5 >"$work/out" 2>"$work/log" &
pid=$!
await_listening "$pid" "$work/out" "$work/log"
echo "gateway at $url (pid $pid)"

# Each client's smoke; all run even if one fails. smoke NAME CMD…: runs CMD, prints its output,
# and keeps its last line (or the failure) for the summary.
failed=0
summaries=()
smoke() {
  local name=$1 log="$work/$1.out"
  shift
  echo "== $name client"
  if timeout 120 "$@" >"$log" 2>&1; then
    summaries+=("$(tail -n 1 "$log")")
  else
    summaries+=("$name client: FAILED (see above)")
    failed=1
  fi
  cat "$log"
}
smoke typescript node "$out/ts/build/smoke.js" "$url"
PYTHONPATH="$out/python" smoke python "$venv/bin/python" clients/python/smoke.py "$url"
if [ -n "$rust" ]; then
  smoke rust target/clients-rust-target/debug/acp-gateway-client-smoke "$url"
else
  summaries+=("rust client: skipped (no Java)")
fi

echo "== summary ($((SECONDS - start))s)"
printf '%s\n' "${summaries[@]}"
exit "$failed"
