#!/usr/bin/env bash
# Property-based API testing: runs schemathesis (from PyPI, in a venv under target/) against a
# live gateway in front of the echo agent, generating requests from the committed
# openapi/openapi.json, and fails on any 5xx answer (`not_a_server_error`) or a response that
# does not match the spec's status codes. The SSE routes are left out (their streams never end).
#   bash scripts/schemathesis.sh [MAX_EXAMPLES]      (default 25 per operation)
set -euo pipefail
cd "$(dirname "$0")/.."
max_examples="${1:-25}"
venv=target/schemathesis-venv
if [ ! -x "$venv/bin/st" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "schemathesis==4.32.5"
fi
cargo build -q --bin acp-gateway --example echo_agent
work=$(mktemp -d)
ECHO_AGENT_DIR="$work/agent" target/debug/acp-gateway \
  --agent target/debug/examples/echo_agent --listen 127.0.0.1:0 \
  --database-url "sqlite:$work/gateway.db" --control-timeout 5 >"$work/out" 2>"$work/log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do grep -q "listening on" "$work/out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/^listening on //p' "$work/out")
[ -n "$url" ] || { echo "the gateway did not start:"; cat "$work/log"; exit 1; }
"$venv/bin/st" run openapi/openapi.json --url "$url" \
  --checks not_a_server_error,status_code_conformance \
  --exclude-path-regex '/events$' \
  --max-examples "$max_examples" --request-timeout 20 --no-color
