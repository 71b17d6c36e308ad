#!/usr/bin/env bash
# Two builds of the gateway side by side in one run (benches/compare.rs): prompt round trips
# through A (this checkout) and B (GATEWAY_B, another build; this one when unset), and directly
# on the echo agent, in interleaved blocks. Prints B − A at p50 / p90 / p99; nothing is written.
#   GATEWAY_B=/path/to/acp-gateway [GATEWAY_B_ARGS="--flag value"] [SAMPLES=3000] bash bench/compare.sh
# With COMPARE_POSTGRES=1 and DATABASE_URL set, each gateway logs to a fresh PostgreSQL database.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin acp-gateway --example echo_agent
cargo bench --bench compare
