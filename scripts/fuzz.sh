#!/usr/bin/env bash
# Fuzzes the JSON-RPC line decoder and the request validators with cargo-fuzz (libFuzzer).
#   bash scripts/fuzz.sh [SECONDS]     (default 60 seconds per target; 0 = until stopped)
#   bash scripts/fuzz.sh build         (builds the targets only; .ci/run does this early)
# Both targets are built in one `cargo fuzz build`, then both are fuzzed at once (a core each)
# for SECONDS, starting from the committed corpus in fuzz/seeds/<target>/ (inputs found on the way go to the
# untracked fuzz/corpus/<target>/, which later runs start from too). A crash leaves its input
# in fuzz/artifacts/<target>/ and fails the script.
# The build is coverage-guided as cargo-fuzz makes it (SanitizerCoverage with comparison
# tracing, debug assertions on), with the profile of fuzz/Cargo.toml's own workspace and 16
# codegen units (cargo-fuzz's default is 1, which compiles the gateway's crate on one core; its
# documentation names 16 for faster builds, inputs running a little slower). It is built
# without a sanitizer: the gateway's crate has no unsafe code (`unsafe_code = "deny"`), and what
# the targets look for is a panic or a broken rule, which libFuzzer catches without one. The
# build takes about two thirds of the time it takes with AddressSanitizer (548 against 797 s on
# 2 cores), and inputs run faster. FUZZ_SANITIZER=address builds with AddressSanitizer, which
# also watches the unsafe code of the dependencies the targets reach.
# cargo-fuzz, pinned below, is taken from PATH when it is that version, else installed
# (unoptimised: it only drives cargo and libFuzzer) under target/fuzz-tools. It needs nightly
# compiler features; RUSTC_BOOTSTRAP=1 lets the stable toolchain provide them, so no nightly
# download is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
cargo_fuzz_version=0.13.2
targets=(jsonrpc_line request_validators)
build_options=(--sanitizer "${FUZZ_SANITIZER:-none}" --codegen-units 16)

tools=$PWD/target/fuzz-tools
export PATH="$tools/bin:$PATH"
if [ "$(cargo fuzz --version 2>/dev/null || true)" != "cargo-fuzz $cargo_fuzz_version" ]; then
  echo "installing cargo-fuzz $cargo_fuzz_version into $tools"
  CARGO_TARGET_DIR=$tools/build \
    cargo install cargo-fuzz --locked --debug --version "$cargo_fuzz_version" --root "$tools"
fi
export RUSTC_BOOTSTRAP=1

start=$SECONDS
cargo fuzz build "${build_options[@]}"
echo "fuzz: built ${targets[*]} in $((SECONDS - start)) s"
[ "$seconds" != build ] || exit 0
# The targets fuzz side by side, one core each (libFuzzer runs one process per target); each
# one's output is printed when both have ended.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for target in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$target"
  echo "fuzzing $target (${seconds} s)"
  cargo fuzz run "${build_options[@]}" "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 >"$logs/$target" 2>&1 &
  pids+=($!)
done
failed=()
for i in "${!targets[@]}"; do
  wait "${pids[$i]}" || failed+=("${targets[$i]}")
  echo "--- ${targets[$i]} ---"
  cat "$logs/${targets[$i]}"
done
[ "${#failed[@]}" -eq 0 ] || { echo "FATAL: fuzzing failed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2; exit 1; }
