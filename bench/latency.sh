#!/usr/bin/env bash
# Where a prompt's round trip through the gateway spends its time (benches/latency.rs): the
# same prompt direct and through the gateway, beside HTTP-only baselines, in the same run.
# Writes bench/results/latency.md. With DATABASE_URL set, PostgreSQL is measured too.
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test bash bench/latency.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin acp-gateway --example echo_agent
cargo bench --bench latency
