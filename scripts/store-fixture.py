#!/usr/bin/env python3
"""Writes the store fixtures of one release, which tests/upgrades.rs upgrades and serves.

    python3 scripts/store-fixture.py GATEWAY ECHO_AGENT OUT_DIR

GATEWAY and ECHO_AGENT are that release's binaries (`cargo build --bin acp-gateway --example
echo_agent` in a checkout of it). The same scenario runs on SQLite and on PostgreSQL (the
server of DATABASE_URL, default postgres://postgres@127.0.0.1:5432/test, where a database of its
own is made and dropped): two tenants' sessions with turns, a permission answered, a webhook
with its outbox, an idempotent create and usage. OUT_DIR gets:

- sqlite.db: the SQLite store, as the release left it;
- postgres.sql: the PostgreSQL store (pg_dump --inserts);
- postgres-queries.sql: every statement the release ran on PostgreSQL (from the server's log,
  `log_statement = all` for that database), one per line: what a replica of that release
  still runs during a rolling upgrade;
- expected.json: what each tenant's key read through the API before the gateway stopped.

Run it once per release, for the release before the one that changes the schema; commit the
folder as tests/fixtures/stores/<release>/.
"""

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ACME = "acme-key-0123456789a"
GLOBEX = "globex-key-012345678"
PG_LOG = "/var/log/postgresql/postgresql-15-main.log"


def call(base, method, path, key, body=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("authorization", f"Bearer {key}")
    if data is not None:
        req.add_header("content-type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read()
        return json.loads(text) if text else None


def start(gateway, agent, url, work):
    env = dict(os.environ, ECHO_AGENT_DIR=os.path.join(work, "agent"), ECHO_AGENT_COST="0.01 USD",
               ACP_GATEWAY_WORKSPACE_DIR=os.path.join(work, "workspaces"), RUST_LOG="warn")
    proc = subprocess.Popen(
        [gateway, "--agent", agent, "--listen", "127.0.0.1:0", "--database-url", url,
         "--api-key", f"acme/ann:{ACME}", "--api-key", f"globex/dee:{GLOBEX}",
         "--webhook-allow-private"],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, text=True)
    line = proc.stdout.readline()
    base = re.search(r"listening on (http://\S+)", line).group(1)
    for _ in range(200):
        try:
            urllib.request.urlopen(base + "/readyz", timeout=5)
            return proc, base
        except Exception:
            time.sleep(0.05)
    raise SystemExit("the gateway never became ready")


def scenario(base):
    def turn(key, sid, text):
        call(base, "POST", f"/sessions/{sid}/prompt", key, {"text": text})

    call(base, "POST", "/webhooks", ACME, {"url": "http://127.0.0.1:9/hook", "events": ["turn_ended"]})
    a = call(base, "POST", "/sessions", ACME, {"cwd": "/tmp"})["sessionId"]
    turn(ACME, a, "hello fixture")
    b = call(base, "POST", "/sessions", ACME, {"cwd": "/tmp"})["sessionId"]
    req = urllib.request.Request(base + f"/sessions/{b}/prompt", method="POST",
                                 data=json.dumps({"text": "/permission may I"}).encode())
    req.add_header("authorization", f"Bearer {ACME}")
    req.add_header("content-type", "application/json")
    req.add_header("prefer", "respond-async")
    urllib.request.urlopen(req, timeout=60).read()
    for _ in range(200):
        pending = call(base, "GET", f"/sessions/{b}/permissions", ACME)
        if pending:
            break
        time.sleep(0.05)
    call(base, "POST", f"/sessions/{b}/permissions/{pending[0]['requestId']}", ACME, {"optionId": "allow"})
    for _ in range(200):
        events = call(base, "GET", f"/sessions/{b}/history?limit=1000", ACME)["events"]
        if any(e["event"] == "turn_ended" for e in events):
            break
        time.sleep(0.05)
    c = call(base, "POST", "/sessions", GLOBEX, {"cwd": "/tmp"})["sessionId"]
    turn(GLOBEX, c, "globex words")
    call(base, "POST", "/sessions", GLOBEX, {"cwd": "/tmp"}, {"idempotency-key": "fixture-1"})


def seen(base, key):
    """What tests/upgrades.rs compares: each session (without what moves by itself), its whole
    history, the webhooks and what their outbox holds, and the usage by session."""
    sessions = []
    for s in call(base, "GET", "/sessions?limit=200", key)["sessions"]:
        for volatile in ("status", "activity", "updatedAt"):
            s.pop(volatile, None)
        events = call(base, "GET", f"/sessions/{s['sessionId']}/history?limit=1000", key)["events"]
        sessions.append({"session": s, "events": events})
    hooks = call(base, "GET", "/webhooks", key)
    deliveries = []
    for h in hooks:
        page = call(base, "GET", f"/webhooks/{h['id']}/deliveries?limit=200", key)
        deliveries.append([{k: d[k] for k in ("id", "messageId", "sessionId", "seq", "event", "createdAt")}
                           for d in page["deliveries"]])
    usage = call(base, "GET", "/usage?groupBy=session", key)
    return {"sessions": sessions, "webhooks": hooks, "deliveries": deliveries, "usage": usage}


def run(gateway, agent, url, work):
    proc, base = start(gateway, agent, url, work)
    try:
        scenario(base)
        return {"acme": seen(base, ACME), "globex": seen(base, GLOBEX)}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def main():
    gateway, agent, out = sys.argv[1:4]
    os.makedirs(out, exist_ok=True)
    admin = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
    work = tempfile.mkdtemp()
    expected = {}
    sqlite = os.path.join(work, "gateway.db")
    expected["sqlite"] = run(gateway, agent, f"sqlite:{sqlite}", os.path.join(work, "s"))
    # One file, the write-ahead log's pages in it.
    target = os.path.join(out, "sqlite.db")
    if os.path.exists(target):
        os.remove(target)
    con = sqlite3.connect(sqlite)
    con.execute(f"VACUUM INTO '{target}'")
    con.close()

    db = f"acpgw_fixture_{os.getpid()}"
    parts = urllib.parse.urlsplit(admin)
    url = urllib.parse.urlunsplit(parts._replace(path=f"/{db}"))
    psql = ["psql", admin, "-qAtc"]
    subprocess.run(psql + [f"CREATE DATABASE {db}"], check=True)
    subprocess.run(psql + [f"ALTER DATABASE {db} SET log_statement = 'all'"], check=True)
    logged = os.path.getsize(PG_LOG)
    try:
        expected["postgres"] = run(gateway, agent, url, os.path.join(work, "p"))
        dump = subprocess.run(["pg_dump", "--inserts", "--no-owner", "--no-privileges", "--no-comments", url],
                              check=True, capture_output=True, text=True).stdout
        # Without psql's meta-commands (`\restrict`): the test loads it as plain SQL.
        dump = "".join(line for line in dump.splitlines(True) if not line.startswith("\\"))
        with open(os.path.join(out, "postgres.sql"), "w") as f:
            f.write(dump)
        with open(PG_LOG) as f:
            f.seek(logged)
            log = f.read()
    finally:
        subprocess.run(psql + [f"DROP DATABASE {db} WITH (FORCE)"], check=True)
    statements = set()
    lines = log.split("\n")
    for i, line in enumerate(lines):
        m = re.search(rf"@{db} LOG:  (?:statement|execute [^:]+): (.*)", line)
        if not m:
            continue
        sql = [m.group(1)]
        for more in lines[i + 1:]:
            if not more.startswith("\t"):
                break
            sql.append(more.strip())
        sql = " ".join(sql).strip()
        if re.match(r"(?i)(select|insert|update|delete|with)\b", sql):
            statements.add(sql)
    with open(os.path.join(out, "postgres-queries.sql"), "w") as f:
        f.write("".join(s + "\n" for s in sorted(statements)))
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    shutil.rmtree(work, ignore_errors=True)
    print(f"{out}: {len(statements)} statements; sqlite.db, postgres.sql, expected.json")


if __name__ == "__main__":
    main()
