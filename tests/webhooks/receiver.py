"""A webhook receiver for the integration tests: it verifies every delivery with the reference
Standard Webhooks library (https://www.standardwebhooks.com, `standardwebhooks` on PyPI), records
it, and answers as told, so that a test can check what the gateway sent and make it retry.

    python receiver.py --port 0 --secret whsec_... [--secret whsec_...] [--fail-first N]
                       [--fail-status 500] [--ok-status 204] [--delay-ms D] [--down]

The first line on stdout is `listening on http://127.0.0.1:PORT` (and nothing else is written
there). The receiver exits when its stdin closes, so it does not outlive the test that started it.

Any POST outside `/_control/` is a delivery. It is verified with
`standardwebhooks.webhooks.Webhook(secret).verify(body, headers)` against each configured secret
(it passes if one does: a rotated secret can be tested with both), then answered:
  503 "down"          while down (--down, or {"down": true} at runtime), whatever the signature;
  401 "bad signature" when no secret verifies it;
  the fail status     (--fail-status, 500 by default) with "try again" while fewer than
                      --fail-first verified attempts of this webhook-id were made before it;
  the ok status       204 (no body) by default, or 200 with "ok" (--ok-status 200).
With --delay-ms the answer waits that long (to overlap duplicates, or outlast a sender's timeout).

Each delivery is recorded as an attempt, a JSON object:
  msgId        the webhook-id header (null if missing)
  timestamp    the webhook-timestamp header, as an integer when it is one
  signature    the webhook-signature header
  verified     whether a configured secret verified it; error: why not (null if it did)
  status       the status answered; aborted: true if writing the answer failed (best effort: a
               sender that timed out is usually noticed only if it closed before the write)
  attempt      1 for the first request with this webhook-id since the last reset, 2 for the next...
  body         the body as JSON (null if it is not JSON); rawBody: the body as text
  path, method, headers (lowercased names)
  receivedAt, answeredAt   unix seconds (float)
  concurrent   true if another request with the same webhook-id was in flight at the same time
               (both are flagged)

Control endpoints:
  GET  /_control/attempts            the answered attempts, in arrival order (?inflight=1 adds
                                     those still waiting for their answer, with status null)
  GET  /_control/config              the settings
  POST /_control/config              {secret?: str | [str], secrets?: [str], failFirst?,
                                     failStatus?, okStatus?, down?, delayMs?} updates them
                                     (a new secret replaces all) and answers the settings
  POST /_control/reset               forgets the attempts (and so the fail-first counts)
  GET  /_control/health              200 "ok"
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from standardwebhooks.webhooks import Webhook


class State:
    def __init__(self, args):
        self.lock = threading.Lock()
        self.secrets = []
        self.verifiers = []
        self.set_secrets(args.secret)
        self.fail_first = args.fail_first
        self.fail_status = args.fail_status
        self.ok_status = args.ok_status
        self.down = args.down
        self.delay_ms = args.delay_ms
        self.attempts = []  # every request, in arrival order
        self.seen = {}  # msgId -> requests so far
        self.verified_seen = {}  # msgId -> verified requests that reached the fail-first check
        self.in_flight = {}  # msgId -> records of requests not answered yet

    def set_secrets(self, secrets):
        if isinstance(secrets, str):
            secrets = [secrets]
        if not isinstance(secrets, list) or not all(isinstance(s, str) for s in secrets):
            raise ValueError("secret must be a string or a list of strings")
        verifiers = [Webhook(s) for s in secrets]  # raises on an empty or malformed secret
        self.secrets, self.verifiers = list(secrets), verifiers

    def config(self):
        return {
            "secrets": self.secrets,
            "failFirst": self.fail_first,
            "failStatus": self.fail_status,
            "okStatus": self.ok_status,
            "down": self.down,
            "delayMs": self.delay_ms,
        }

    def update(self, changes):
        if not isinstance(changes, dict):
            raise ValueError("the config must be a JSON object")
        known = {"secret", "secrets", "failFirst", "failStatus", "okStatus", "down", "delayMs"}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown settings: {sorted(unknown)}")
        for key in ("failFirst", "failStatus", "okStatus", "delayMs"):
            if key in changes and (type(changes[key]) is not int or changes[key] < 0):
                raise ValueError(f"{key} must be a non-negative integer")
        if "down" in changes and type(changes["down"]) is not bool:
            raise ValueError("down must be a boolean")
        with self.lock:
            for key in ("secret", "secrets"):
                if key in changes:
                    self.set_secrets(changes[key])
            self.fail_first = changes.get("failFirst", self.fail_first)
            self.fail_status = changes.get("failStatus", self.fail_status)
            self.ok_status = changes.get("okStatus", self.ok_status)
            self.down = changes.get("down", self.down)
            self.delay_ms = changes.get("delayMs", self.delay_ms)
            return self.config()


def verify(verifiers, body, headers):
    """(verified, error): whether one of the secrets verifies the delivery, and the errors if none."""
    errors = []
    for verifier in verifiers:
        try:
            verifier.verify(body, headers)
            return True, None
        except Exception as e:  # WebhookVerificationError, but also a malformed header's ValueError
            errors.append(f"{type(e).__name__}: {e}")
    return False, "; ".join(errors) or "no secret configured"


def make_handler(state, quiet):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a sender's connection pool expects

        def log_message(self, format, *args):
            if not quiet:
                super().log_message(format, *args)

        def read_body(self):
            if "chunked" in self.headers.get("transfer-encoding", "").lower():
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("content-length") or 0))

        def answer(self, status, body=b"", content_type="text/plain; charset=utf-8"):
            self.send_response(status)
            if status != 204:
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
            self.end_headers()
            if status != 204:
                self.wfile.write(body)
            self.wfile.flush()

        def answer_json(self, status, value):
            self.answer(status, json.dumps(value).encode(), "application/json")

        def do_GET(self):
            url = urlsplit(self.path)
            if url.path == "/_control/attempts":
                inflight = parse_qs(url.query).get("inflight", ["0"])[0] not in ("0", "false", "")
                with state.lock:
                    attempts = [dict(a) for a in state.attempts if inflight or a["status"] is not None]
                self.answer_json(200, attempts)
            elif url.path == "/_control/config":
                with state.lock:
                    self.answer_json(200, state.config())
            elif url.path == "/_control/health":
                self.answer(200, b"ok")
            else:
                self.answer(404, b"not found")

        def do_POST(self):
            body = self.read_body()
            path = urlsplit(self.path).path
            if path.startswith("/_control/"):
                self.control(path, body)
            else:
                self.delivery(body)

        def do_PUT(self):
            self.read_body()
            self.answer(405, b"deliveries are POSTs")

        do_DELETE = do_PATCH = do_PUT

        def control(self, path, body):
            if path == "/_control/config":
                try:
                    self.answer_json(200, state.update(json.loads(body or b"{}")))
                except Exception as e:
                    self.answer_json(400, {"error": f"{type(e).__name__}: {e}"})
            elif path == "/_control/reset":
                with state.lock:
                    state.attempts.clear()
                    state.seen.clear()
                    state.verified_seen.clear()
                self.answer_json(200, {"reset": True})
            else:
                self.answer(404, b"not found")

        def delivery(self, body):
            headers = {k.lower(): v for k, v in self.headers.items()}
            msg_id = headers.get("webhook-id")
            timestamp = headers.get("webhook-timestamp")
            try:
                timestamp = int(timestamp)
            except (TypeError, ValueError):
                pass
            text = body.decode("utf-8", errors="replace")
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
            record = {
                "msgId": msg_id,
                "timestamp": timestamp,
                "signature": headers.get("webhook-signature"),
                "verified": False,
                "error": None,
                "status": None,
                "aborted": False,
                "attempt": 0,
                "body": parsed,
                "rawBody": text,
                "path": self.path,
                "method": self.command,
                "headers": headers,
                "receivedAt": time.time(),
                "answeredAt": None,
                "concurrent": False,
            }
            with state.lock:
                verifiers = state.verifiers
                state.seen[msg_id] = record["attempt"] = state.seen.get(msg_id, 0) + 1
                others = state.in_flight.setdefault(msg_id, [])
                if others:
                    record["concurrent"] = True
                    for other in others:
                        other["concurrent"] = True
                others.append(record)
                state.attempts.append(record)

            verified, error = verify(verifiers, body, headers)
            try:
                with state.lock:
                    record["verified"], record["error"] = verified, error
                    delay_ms = state.delay_ms
                    if state.down:
                        status, reply = 503, b"down"
                    elif not verified:
                        status, reply = 401, b"bad signature"
                    else:
                        before = state.verified_seen.get(msg_id, 0)
                        state.verified_seen[msg_id] = before + 1
                        if before < state.fail_first:
                            status, reply = state.fail_status, b"try again"
                        else:
                            status = state.ok_status
                            reply = b"" if status == 204 else b"ok"
                if delay_ms:
                    time.sleep(delay_ms / 1000)
                with state.lock:
                    record["status"] = status
                    record["answeredAt"] = time.time()
                try:
                    self.answer(status, reply)
                except OSError:  # the sender gave up (its timeout) before the answer
                    with state.lock:
                        record["aborted"] = True
                    self.close_connection = True
            finally:
                with state.lock:
                    flying = state.in_flight.get(msg_id, [])
                    if record in flying:
                        flying.remove(record)
                    if not flying:
                        state.in_flight.pop(msg_id, None)

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--secret", action="append", required=True, help="whsec_<base64>; repeatable")
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--fail-status", type=int, default=500)
    parser.add_argument("--ok-status", type=int, default=204)
    parser.add_argument("--delay-ms", type=int, default=0)
    parser.add_argument("--down", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="log each request on stderr")
    parser.add_argument("--no-stdin-watch", action="store_true", help="do not exit when stdin closes")
    args = parser.parse_args()

    state = State(args)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state, not args.verbose))
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}", flush=True)

    if not args.no_stdin_watch:
        def watch_stdin():
            while sys.stdin.buffer.read(4096):
                pass
            os._exit(0)  # the test that started us is gone

        threading.Thread(target=watch_stdin, daemon=True).start()

    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
