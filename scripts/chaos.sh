#!/usr/bin/env bash
# The chaos test (tests/chaos.rs), longer and repeated: N runs (default 5), each with a new
# seed and CHAOS_FAULTS faults (default 30). Stops at the first failing run, whose seed it
# prints; `CHAOS_SEED=S CHAOS_FAULTS=F cargo test --test integration chaos:: -- --nocapture` runs it again
# (faults land at other moments each time, so a seed does not replay a run exactly).
#   bash scripts/chaos.sh 10
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-5}"
export CHAOS_FAULTS="${CHAOS_FAULTS:-30}"
cargo build --examples
cargo test --test integration --no-run
for run in $(seq 1 "$runs"); do
  seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
  echo "chaos run $run/$runs: CHAOS_SEED=$seed CHAOS_FAULTS=$CHAOS_FAULTS"
  CHAOS_SEED=$seed cargo test -q --test integration chaos:: -- --nocapture
done
