#!/usr/bin/env bash
# Property-based API testing: runs schemathesis (from PyPI, in a venv under target/) against a
# live gateway in front of the echo agent, generating requests from the committed
# openapi/openapi.json, and fails on any 5xx answer (`not_a_server_error`) or a response that
# does not match the spec's status codes. The SSE routes are left out (their streams never end),
# and so is the import, whose JSON Lines body schemathesis cannot write (tests/transcripts.rs
# sends it malformed imports of every kind).
# The agent offers every session control and capability, so a generated `config`, `mode`,
# `model` or fork meets the gateway's validation (422) instead of the agent's lack of it (501).
# It runs on SQLite, and also on a fresh PostgreSQL database when DATABASE_URL is set (a NUL
# byte or a lone surrogate reaches PostgreSQL's text types otherwise than SQLite's).
#   bash scripts/schemathesis.sh [MAX_EXAMPLES]      (default 25 per operation)
#   bash scripts/schemathesis.sh install             (installs schemathesis only)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/gateway.sh
max_examples="${1:-25}"
venv=target/schemathesis-venv
if [ ! -x "$venv/bin/st" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "schemathesis==4.32.5"
fi
[ "$max_examples" != install ] || exit 0
cargo build -q --bin acp-gateway --example echo_agent
work=$(mktemp -d)
pid=
pg_db=
cleanup() {
  [ -n "$pid" ] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; }
  [ -n "$pg_db" ] && psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS \"$pg_db\" WITH (FORCE)" >/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# Runs schemathesis against a gateway on database URL $1, named $2 in the output.
run() {
  local db_url=$1 name=$2
  # Files of this run's own: the shell truncates a reused one only once the background child
  # runs, and the earlier gateway's "listening on" line could be read before that.
  local out="$work/$name.out" log="$work/$name.log"
  echo "schemathesis against a gateway on $name"
  rm -rf "$work/agent"
  ECHO_AGENT_DIR="$work/agent" ECHO_AGENT_CONTROLS=modes,models,options \
    ECHO_AGENT_CAPS=load,list,delete,resume,close,fork,logout target/debug/acp-gateway \
    --agent target/debug/examples/echo_agent --listen 127.0.0.1:0 \
    --database-url "$db_url" --control-timeout 5 --workspace-dir "$work/workspaces" \
    --registry "$work/registry.json" --agents-dir "$work/agents" \
    >"$out" 2>"$log" &
  pid=$!
  await_listening "$pid" "$out" "$log"
  "$venv/bin/st" run openapi/openapi.json --url "$url" \
    --checks not_a_server_error,status_code_conformance \
    --exclude-path-regex '/events$|^/sessions/import$' \
    --max-examples "$max_examples" --request-timeout 20 --no-color
  kill "$pid"; wait "$pid" 2>/dev/null || true
  pid=
}

# A registry of the run's own, whose one agent runs on no platform: an install it asks for is
# refused (422), and nothing is fetched from the official registry.
printf '%s' '{"version":"1.0.0","agents":[{"id":"claude-acp","name":"Nowhere","version":"1.0.0",
  "distribution":{"binary":{"plan9-x86_64":{"archive":"http://127.0.0.1:9/a.tgz","cmd":"./a"}}}}]}' \
  > "$work/registry.json"
run "sqlite:$work/gateway.db" SQLite
if [ -n "${DATABASE_URL:-}" ]; then
  pg_db="acpgw_schemathesis_$$"
  psql "$DATABASE_URL" -qc "CREATE DATABASE \"$pg_db\"" >/dev/null
  run "${DATABASE_URL%/*}/$pg_db" PostgreSQL
fi
