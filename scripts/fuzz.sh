#!/usr/bin/env bash
# Fuzzes the JSON-RPC line decoder and the request validators with cargo-fuzz (libFuzzer).
#   bash scripts/fuzz.sh [RUNS]        (default 200000 inputs per target; 0 = until stopped)
# cargo-fuzz is installed from crates.io when missing. It needs nightly compiler features;
# RUSTC_BOOTSTRAP=1 lets the stable toolchain provide them, so no nightly download is needed.
# A crash leaves its input in fuzz/artifacts/<target>/ and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-200000}"
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
for target in jsonrpc_line request_validators; do
  mkdir -p "fuzz/corpus/$target"
  cp -n fuzz/seeds/"$target"/* "fuzz/corpus/$target/"
  echo "fuzzing $target ($runs runs)"
  cargo fuzz run "$target" -- -runs="$runs" -max_len=4096 -print_final_stats=1
done
