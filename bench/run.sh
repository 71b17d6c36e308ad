#!/usr/bin/env bash
# The gateway's overhead against baselines measured in the same run (benches/gateway.rs):
# builds the release gateway and echo agent, then prints the table and writes it to
# bench/results/gateway.md. With DATABASE_URL set, PostgreSQL is measured too.
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test bash bench/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin acp-gateway --example echo_agent
cargo bench --bench gateway
