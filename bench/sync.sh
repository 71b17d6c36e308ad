#!/usr/bin/env bash
# Builds the release gateway and echo agent, then runs the list-sync benchmark (benches/sync.rs)
# and writes bench/results/sync.md. With DATABASE_URL set, PostgreSQL is measured too; with
# SYNC_BASELINE=/path/to/acp-gateway another build is measured beside this one.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin acp-gateway --example echo_agent
cargo bench --bench sync
