#!/usr/bin/env bash
# Creates, once, the Python environment the webhook receiver runs in: a venv under the repo's
# target dir (or $CARGO_TARGET_DIR) with the reference Standard Webhooks library, pinned.
# Idempotent: an environment that already has the pinned version is left alone. Prints the
# path of its python on stdout (and only that); anything else goes to stderr. Fails loudly.
set -euo pipefail

VERSION=1.1.0 # standardwebhooks, the newest on PyPI when pinned
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
venv="$target/webhook-venv"
python="$venv/bin/python"
# Written last: its presence means the environment is complete.
stamp="$venv/.standardwebhooks-$VERSION"

fail() { echo "tests/webhooks/setup.sh: $*" >&2; exit 1; }

mkdir -p "$target"
# Test binaries may run at once: one makes the environment, the others wait for it.
exec 9>"$target/webhook-venv.lock"
flock 9 2>/dev/null || true

if [[ -x "$python" && -f "$stamp" ]]; then
    echo "$python"
    exit 0
fi

host_python="${PYTHON:-python3}"
command -v "$host_python" >/dev/null || fail "no $host_python on PATH (set PYTHON to a Python 3 interpreter)"
rm -rf "$venv"
"$host_python" -m venv "$venv" >&2 || fail "$host_python -m venv $venv failed"
"$python" -m pip install -q --disable-pip-version-check "standardwebhooks==$VERSION" >&2 \
    || fail "pip install standardwebhooks==$VERSION into $venv failed (is PyPI reachable?)"
"$python" -c 'from standardwebhooks.webhooks import Webhook' >&2 \
    || fail "standardwebhooks==$VERSION installed but does not import"
touch "$stamp"
echo "$python"
