#!/usr/bin/env bash
# Checks the committed spec, openapi/openapi.json:
# - openapi-spec-validator (from PyPI, in a venv under target/) validates it as OpenAPI 3.1;
# - Redocly CLI (from npm, pinned in openapi/lint/package-lock.json) lints it with its recommended
#   rules (openapi/redocly.yaml) and fails on any error or warning that
#   openapi/.redocly.lint-ignore.yaml does not list.
# Further lint rules (operationIds, summaries, examples valid against their schemas, problem+json
# on every error) are checked by `cargo test --test integration openapi::`.
#   bash scripts/check-openapi.sh [install]     (install: the two tools only, checking nothing)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/openapi-venv
if [ ! -x "$venv/bin/openapi-spec-validator" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "openapi-spec-validator==0.9.0"
fi
command -v node >/dev/null || { echo "FATAL: Node.js is required for the Redocly lint" >&2; exit 1; }
lint=openapi/lint
stamp="$lint/node_modules/.check-openapi-lock"
if ! cmp -s "$lint/package-lock.json" "$stamp" 2>/dev/null; then
  (cd "$lint" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$lint/package-lock.json" "$stamp"
fi
[ "${1:-}" != install ] || exit 0

"$venv/bin/openapi-spec-validator" --schema 3.1 openapi/openapi.json
report=$(mktemp)
stderr=$(mktemp)
trap 'rm -f "$report" "$stderr"' EXIT
# Redocly exits non-zero on errors only; the totals decide, warnings included.
(cd openapi && REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
  lint/node_modules/.bin/redocly lint --format=json openapi.json >"$report" 2>"$stderr") || true
totals=$(node -e '
  const t = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).totals;
  console.log(`${t.errors} ${t.warnings} ${t.ignored}`);
' "$report") || {
  echo "FATAL: Redocly produced no report"
  cat "$report" "$stderr"
  exit 1
}
read -r errors warnings ignored <<<"$totals"
if [ "$errors" != 0 ] || [ "$warnings" != 0 ]; then
  (cd openapi && REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
    lint/node_modules/.bin/redocly lint --format=stylish openapi.json) || true
  echo "FATAL: Redocly: $errors errors, $warnings warnings not in openapi/.redocly.lint-ignore.yaml" >&2
  exit 1
fi
echo "Redocly (recommended rules): 0 errors, 0 warnings, $ignored ignored"
