#!/usr/bin/env bash
# Throughput under concurrent load beside the peers, in the same run (benches/concurrent.rs):
# builds the release gateway and echo agent, installs acp-http-adapter and sandbox-agent pinned
# (bench/peers.sh; fails if it cannot), then prints the table and writes it to
# bench/results/concurrent.md. With DATABASE_URL set, PostgreSQL is measured too.
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test [CONCURRENT_SECS=5] [CONCURRENT_ROUNDS=2] \
#     [CONCURRENT_SESSIONS=8,64] bash bench/concurrent.sh
set -euo pipefail
cd "$(dirname "$0")/.."
peers=$(bash bench/peers.sh) # not in `eval "$(…)"`, which would hide its failure
eval "$peers"
cargo build --release --bin acp-gateway --example echo_agent --example bench_agent
cargo bench --bench concurrent
