#!/usr/bin/env python3
"""The protocol matrix: every agent of an ACP registry that the package registries reach (its
npx or uvx distribution), installed and run behind the gateway with no credentials, and what
each answers: initialize (agentInfo, protocol version), its capabilities, its auth methods,
session/new (or auth_required), and for a session it made: list, status, close and delete.

    python3 scripts/protocol-matrix.py [--registry URL|FILE] [--only ID,ID] [--out FILE]

It builds nothing: run `cargo build --release --bin acp-gateway` first (or pass --gateway). The
gateway runs on 127.0.0.1 with a throwaway SQLite file, agents folder and HOME of its own (so
that no sign-in of this machine's user is found), and is stopped at the end. Binary archives
are skipped (a locked-down machine reaches only the package registries). The table is printed
as Markdown (and written to --out); docs/registry.md shows one run's.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ADMIN = "matrix-admin-key-0123456789"
INSTALL_LIMIT = 900  # seconds for every install together
CALL_LIMIT = 120  # seconds for one request


def request(base, method, path, body=None):
    """(status, JSON body or text) of one request with the admin key."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", "Bearer " + ADMIN)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=CALL_LIMIT) as answer:
            status, text = answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    except (urllib.error.URLError, TimeoutError) as e:
        return 0, str(e)
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


def start_gateway(binary, registry, work):
    """Starts the gateway; returns (process, base URL)."""
    home = os.path.join(work, "home")
    os.makedirs(home)
    env = dict(os.environ, HOME=home, IS_SANDBOX="1", RUST_LOG="warn")
    for name in list(env):
        if name.startswith("ACP_GATEWAY_") or name == "DATABASE_URL":
            del env[name]
    stub = os.path.join(work, "stub.sh")
    with open(stub, "w") as f:
        f.write("#!/bin/sh\nexec sleep 100000\n")
    os.chmod(stub, 0o755)
    args = [
        binary, "--listen", "127.0.0.1:0",
        # The gateway wants an agent of its own (one that never answers); the matrix's are
        # installed.
        "--agent", stub,
        "--database-url", "sqlite:" + os.path.join(work, "gateway.db"),
        "--registry", registry, "--agents-dir", os.path.join(work, "agents"),
        "--admin-api-key", ADMIN, "--control-timeout", "60", "--pool-size", "1",
        "--workspace-dir", os.path.join(work, "workspaces"),
    ]
    log = open(os.path.join(work, "gateway.log"), "w")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env=env, text=True,
                            start_new_session=True)
    for line in proc.stdout:
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return proc, found.group(1)
    raise SystemExit("the gateway ended before it listened; see " + log.name)


def install_all(base, ids, at_once=4):
    """Installs `ids`, `at_once` at a time; answers each one's view once none is under way."""
    deadline = time.time() + INSTALL_LIMIT
    waiting, views = list(ids), {}
    while time.time() < deadline:
        for agent in list(views):
            _, view = request(base, "GET", "/agents/" + agent)
            if isinstance(view, dict):
                views[agent] = view
        busy = [a for a, v in views.items()
                if (v.get("installed") or {}).get("phase") == "installing"]
        while waiting and len(busy) < at_once:
            agent = waiting.pop(0)
            request(base, "POST", "/agents", {"registry": agent})
            views[agent] = {"installed": {"phase": "installing"}}
            busy.append(agent)
        if not waiting and not busy:
            break
        time.sleep(2)
    return views


def probe(base, agent, view):
    """One row of the matrix."""
    row = {"agent": agent, "kind": (view.get("installed") or {}).get("kind", "?"),
           "version": (view.get("installed") or {}).get("version", "?")}
    installed = view.get("installed") or {}
    if installed.get("phase") != "installed":
        row["init"] = "install failed: " + tail(installed.get("error") or "?")
        return row
    deadline = time.time() + 60
    while not view.get("agentInfo") and time.time() < deadline:
        time.sleep(1)
        _, view = request(base, "GET", "/agents/" + agent)
    if not view.get("agentInfo"):
        row["init"] = "no initialize: " + tail(str(view.get("unreadyReason", "")))
        return row
    row["init"] = "ok"
    caps = view.get("capabilities") or {}
    row["caps"] = ", ".join(k for k, v in caps.items() if v) or "-"
    methods = view.get("authMethods") or []
    row["auth"] = ", ".join(sorted({m.get("type", "agent") for m in methods})) or "-"
    status, made = request(base, "POST", "/sessions", {"cwd": "/tmp", "agent": agent})
    if status == 201:
        row["new"] = "ok"
        session = made["sessionId"]
        status, _ = request(base, "GET", "/sessions?agent=" + agent + "&refresh=true")
        row["list"] = str(status)
        status, _ = request(base, "GET", "/sessions/" + session + "/status")
        row["status"] = str(status)
        status, _ = request(base, "POST", "/sessions/" + session + "/close")
        row["close"] = str(status)
        status, _ = request(base, "DELETE", "/sessions/" + session)
        row["delete"] = str(status)
    elif isinstance(made, dict) and str(made.get("type", "")).endswith("agent-auth-required"):
        row["new"] = "auth_required"
    else:
        detail = made.get("detail", made) if isinstance(made, dict) else made
        row["new"] = "%s: %s" % (status, tail(str(detail)))
    return row


def tail(text, width=90):
    """A long reason on one line: the tool's cause when the gateway found one (what precedes
    "(its output ends:"), else the end, where a tool's own message is."""
    text = " ".join(text.split())
    if " (its output ends:" in text:
        cause = text.split(" (its output ends:")[0].split("): ", 1)[-1]
        return cause if len(cause) <= width else cause[:width] + "…"
    return text if len(text) <= width else "…" + text[-width:]


COLUMNS = ["agent", "kind", "version", "init", "auth", "new", "list", "status", "close",
           "delete", "caps"]


def table(rows):
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [str(row.get(c, "")).replace("|", "/") for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry",
                        default="https://cdn.agentclientprotocol.com/registry/v1/latest/registry.json")
    parser.add_argument("--gateway", default=os.path.join(here, "target/release/acp-gateway"))
    parser.add_argument("--only", default="", help="comma-separated registry ids")
    parser.add_argument("--out", default="")
    opts = parser.parse_args()
    work = tempfile.mkdtemp(prefix="acp-matrix-")
    proc = None
    try:
        proc, base = start_gateway(opts.gateway, opts.registry, work)
        status, registry = request(base, "GET", "/registry")
        if status != 200:
            raise SystemExit("GET /registry: %s %s" % (status, registry))
        only = [i for i in opts.only.split(",") if i]
        ids = [a["id"] for a in registry["agents"]
               if (a["kinds"] and a["kinds"] != ["binary"]) and (not only or a["id"] in only)]
        skipped = [a["id"] for a in registry["agents"] if a["kinds"] in ([], ["binary"])]
        print("installing %d agents (skipping %d binary-only)" % (len(ids), len(skipped)),
              file=sys.stderr)
        views = install_all(base, ids)
        rows = [probe(base, agent, views.get(agent, {})) for agent in ids]
        out = table(rows)
        sys.stdout.write(out)
        if opts.out:
            with open(opts.out, "w") as f:
                f.write(out)
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
