#!/usr/bin/env bash
# docker-compose.yml validates and its profiles start the right services, without a Docker
# daemon (`config` needs none). The docker client's compose plugin validates it when this
# machine has one; Debian's docker-compose (apt-installed when missing) always does, and its
# resolved `config` output is then checked here with Compose's profile rules (a service without
# `profiles` always runs; one with profiles runs when one of them is active; the active ones are
# the `--profile` flags, else COMPOSE_PROFILES from .env):
#   - the default run is exactly {postgres, gateway}, `--profile cluster` exactly {postgres,
#     gateway-a, gateway-b, balancer};
#   - each replica advertises http://SERVICE:8080, is an upstream of deploy/nginx-cluster.conf,
#     and shares the database and the agents' home volume.
# Failing to install docker-compose fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."

if docker compose version >/dev/null 2>&1; then
  docker compose config --quiet
  docker compose --profile cluster config --quiet
fi
if ! command -v docker-compose >/dev/null; then
  echo "installing Debian's docker-compose"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
fi
docker-compose --version
docker-compose config --quiet
docker-compose config | python3 -c '
import re, sys, yaml
config = yaml.safe_load(sys.stdin)
services = config["services"]
env = dict(l.strip().split("=", 1) for l in open(".env") if "=" in l and not l.lstrip().startswith("#"))
default = set(filter(None, env.get("COMPOSE_PROFILES", "").split(",")))
def started(active):
    return sorted(n for n, s in services.items() if not s.get("profiles") or active & set(s["profiles"]))
def expect(what, got, want):
    assert got == sorted(want), f"{what} starts {got}, expected {sorted(want)}"
    print(f"compose: {what} starts {got}")
expect("docker compose up", started(default), ["gateway", "postgres"])
expect("docker compose --profile cluster up", started({"cluster"}), ["postgres", "gateway-a", "gateway-b", "balancer"])
nginx = open("deploy/nginx-cluster.conf").read()
upstreams = set(re.findall(r"^\s*server\s+([\w-]+):8080;", nginx, re.M))
replicas = sorted(n for n in started({"cluster"}) if n.startswith("gateway"))
assert upstreams == set(replicas), f"nginx upstreams {upstreams} are not the replicas {replicas}"
db = set()
for name in replicas:
    s = services[name]
    e = s["environment"]
    assert e["ACP_GATEWAY_ADVERTISE_URL"] == f"http://{name}:8080", (name, e)
    db.add(e["ACP_GATEWAY_DATABASE_URL"])
    mounts = [v.split(":")[:2] for v in s.get("volumes", []) if isinstance(v, str)]
    assert ["agenthome", "/home/gateway"] in mounts, (name, mounts)
assert len(db) == 1, f"the replicas use different databases: {db}"
print("compose: replicas", ", ".join(replicas), "advertise themselves, share one database and the agents home, and are the nginx upstreams")
'
