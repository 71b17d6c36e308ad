#!/usr/bin/env bash
# The gateway's overhead against baselines measured in the same run (benches/gateway.rs), then
# its throughput under concurrent load and its delivery at a fixed rate beside its peers
# (bench/concurrent.sh, bench/open-loop.sh), its memory per session and subscriber
# (benches/memory.rs), then its list sync with 100k and 1M listed sessions (benches/sync.rs):
# installs the peers pinned first (bench/peers.sh; fails if it cannot), builds the release
# gateway and agents, prints the tables and writes them to bench/results/ (gateway.md,
# concurrent.md, open-loop.md, memory.md, sync.md). With DATABASE_URL set, PostgreSQL is
# measured too.
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test bash bench/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash bench/peers.sh >/dev/null # before the long part: a peer that cannot be installed fails now
cargo build --release --bin acp-gateway --example echo_agent --example bench_agent
cargo bench --bench gateway
bash bench/concurrent.sh
bash bench/open-loop.sh
cargo bench --bench memory
cargo bench --bench sync
