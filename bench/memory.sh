#!/usr/bin/env bash
# The gateway's memory per live idle session and per subscriber (benches/memory.rs): builds the
# release gateway and the bench agent, then prints the table and writes it to
# bench/results/memory.md. With DATABASE_URL set, PostgreSQL is measured too.
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test [MEMORY_SESSIONS=1000,10000] \
#     [MEMORY_SUBSCRIBERS=1000] bash bench/memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin acp-gateway --example bench_agent
cargo bench --bench memory
