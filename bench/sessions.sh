#!/usr/bin/env bash
# Builds the release gateway and echo agent, then runs the session-list benchmark.
# With DATABASE_URL set, PostgreSQL is measured too.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin acp-gateway --example echo_agent
cargo bench --bench sessions
