#!/usr/bin/env bash
# Builds the release gateway and echo agent, then runs the workspace benchmark
# (benches/workspace.rs): a worktree's diff against `git diff`, and a file's download against
# reading it from disk, in the same run; writes bench/results/workspace.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin acp-gateway --example echo_agent
cargo bench --bench workspace
