#!/usr/bin/env bash
# Delivery at a fixed rate beside the peers, in the same run (benches/open_loop.rs): builds the
# release gateway and agents, installs acp-http-adapter and sandbox-agent pinned
# (bench/peers.sh; fails if it cannot), then prints the table and writes it to
# bench/results/open-loop.md. With DATABASE_URL set, PostgreSQL is measured too, twice: as the
# server is set, and with synchronous_commit off (OPEN_LOOP_UNSYNCED=0 leaves that out).
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test [OPEN_LOOP_PERIOD_MS=100] \
#     [OPEN_LOOP_SESSIONS=8,64] [OPEN_LOOP_SECS=5] [OPEN_LOOP_ROUNDS=2] bash bench/open-loop.sh
set -euo pipefail
cd "$(dirname "$0")/.."
peers=$(bash bench/peers.sh) # not in `eval "$(…)"`, which would hide its failure
eval "$peers"
cargo build --release --bin acp-gateway --example echo_agent --example bench_agent
OPEN_LOOP_UNSYNCED=${OPEN_LOOP_UNSYNCED:-1} cargo bench --bench open_loop
