#!/usr/bin/env bash
# The soak (tests/soak.rs) in its three runs: replicas SIGKILLed every 30 s with the default
# list sync (every 60 s), no kills, and kills with a sync every 2 s; each SOAK_SECS long
# (default 150). Needs DATABASE_URL (a PostgreSQL server the soak makes a database on).
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test bash scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DATABASE_URL:?set DATABASE_URL to a PostgreSQL server}"
cargo build --examples
cargo test --test integration --no-run
run() {
  echo "soak: $*"
  env "$@" cargo test -q --test integration soak:: -- --ignored --nocapture 2>&1 | grep -E "^soak:|panicked|problem|test result"
}
run SOAK_KILL_EVERY=30 SOAK_SYNC_INTERVAL=60
run SOAK_KILL_EVERY=0 SOAK_SYNC_INTERVAL=60
run SOAK_KILL_EVERY=30 SOAK_SYNC_INTERVAL=2
