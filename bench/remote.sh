#!/usr/bin/env bash
# What the hop to a remote agent adds to a prompt (benches/remote.rs): the same prompt through a
# gateway running the echo agent, and through front gateways reaching such a gateway's /acp by
# WebSocket and by HTTP/SSE, in interleaved blocks in the same run. Writes bench/results/remote.md.
#   [SAMPLES=2000] bash bench/remote.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin acp-gateway --example echo_agent
cargo bench --bench remote
