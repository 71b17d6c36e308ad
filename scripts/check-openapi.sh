#!/usr/bin/env bash
# Validates the committed spec, openapi/openapi.json, with openapi-spec-validator (from PyPI,
# in a venv under target/). Its lint rules (operationIds, summaries, examples, problem+json on
# every error) are checked by `cargo test --test openapi`.
#   bash scripts/check-openapi.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/openapi-venv
if [ ! -x "$venv/bin/openapi-spec-validator" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "openapi-spec-validator==0.9.0"
fi
"$venv/bin/openapi-spec-validator" --schema 3.1 openapi/openapi.json
