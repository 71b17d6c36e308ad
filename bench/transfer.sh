#!/usr/bin/env bash
# Builds the release gateway and echo agent, then measures export and migrate throughput
# against reading the store directly. With DATABASE_URL set, PostgreSQL is measured too.
# TRANSFER_EVENTS sets the store's size (default 1,000,000 events).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin acp-gateway --example echo_agent
cargo bench --bench transfer
