#!/usr/bin/env bash
# Installs the peers the concurrent bench (benches/concurrent.rs) measures the gateway against,
# pinned, from their registries, into target/peers/ (idempotent: an installed peer of the right
# version is kept). Fails, loudly, when one cannot be installed: the figure is worth nothing
# without them. Prints, for `eval`, the two binaries' paths as `export ACP_HTTP_ADAPTER=…` and
# `export SANDBOX_AGENT=…` (what benches/concurrent.rs reads); all else goes to stderr.
#   peers=$(bash bench/peers.sh) && eval "$peers"
set -euo pipefail
cd "$(dirname "$0")/.."

ADAPTER_VERSION=0.5.5 # crates.io: acp-http-adapter
SANDBOX_AGENT_VERSION=0.4.2 # npm: @sandbox-agent/cli-linux-x64
peers="$PWD/target/peers"

fail() {
  echo "!!!!!!!! bench/peers.sh: $* !!!!!!!!" >&2
  exit 1
}

adapter_root="$peers/acp-http-adapter-$ADAPTER_VERSION"
adapter="$adapter_root/bin/acp-http-adapter"
if [ ! -x "$adapter" ]; then
  echo "installing acp-http-adapter $ADAPTER_VERSION from crates.io into $adapter_root" >&2
  cargo install --locked --version "$ADAPTER_VERSION" acp-http-adapter --root "$adapter_root" >&2 ||
    fail "could not install acp-http-adapter $ADAPTER_VERSION from crates.io"
fi
"$adapter" --version | grep -qx "acp-http-adapter $ADAPTER_VERSION" ||
  fail "$adapter is not acp-http-adapter $ADAPTER_VERSION"

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) platform=linux-x64 ;;
  Linux-aarch64) platform=linux-arm64 ;;
  *) fail "sandbox-agent has no npm binary package for $(uname -s)-$(uname -m)" ;;
esac
package="@sandbox-agent/cli-$platform"
sandbox_prefix="$peers/sandbox-agent-$SANDBOX_AGENT_VERSION"
sandbox_agent="$sandbox_prefix/node_modules/$package/bin/sandbox-agent"
if [ ! -f "$sandbox_agent" ]; then
  command -v npm >/dev/null || fail "npm is needed to install $package (apt-get install npm)"
  echo "installing $package@$SANDBOX_AGENT_VERSION from npm into $sandbox_prefix" >&2
  npm install --prefix "$sandbox_prefix" --no-audit --no-fund --save-exact \
    "$package@$SANDBOX_AGENT_VERSION" >&2 ||
    fail "could not install $package@$SANDBOX_AGENT_VERSION from npm"
fi
# The package's postinstall only does this, and npm may be set not to run install scripts.
chmod +x "$sandbox_agent"
"$sandbox_agent" --version | grep -q "$SANDBOX_AGENT_VERSION" ||
  fail "$sandbox_agent is not sandbox-agent $SANDBOX_AGENT_VERSION"

printf 'export ACP_HTTP_ADAPTER=%q\n' "$adapter"
printf 'export SANDBOX_AGENT=%q\n' "$sandbox_agent"
