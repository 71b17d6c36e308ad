#!/usr/bin/env bash
# What watchers cost (benches/watchers.rs): one session with 10, 100 and 1,000 SSE watchers and
# 1,000 sessions with one each, over HTTP/1.1 and HTTP/2: memory per watcher, CPU per frame
# delivered, delivery p50/p99. Builds the release gateway and the bench agent, then prints the
# table and writes it to bench/results/watchers.md. With DATABASE_URL set, PostgreSQL too.
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test [WATCHERS_TURNS=5] \
#     [WATCHERS_ROWS=1x10,1x100,1x1000,1000x1] [WATCHERS_PROTOCOLS=h1,h2] \
#     [WATCHERS_GATEWAY=/path/to/an/earlier/acp-gateway] bash bench/watchers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin acp-gateway --example echo_agent --example bench_agent
cargo bench --bench watchers
