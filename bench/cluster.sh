#!/usr/bin/env bash
# Builds the release gateway and echo agent, then measures `GET /sessions/{id}/status` across
# three replicas sharing one PostgreSQL database (benches/cluster.rs). PostgreSQL is required:
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test bash bench/cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DATABASE_URL:?set DATABASE_URL to a PostgreSQL server (the replicas share one database)}"
cargo build --release --bin acp-gateway --example echo_agent
cargo bench --bench cluster
