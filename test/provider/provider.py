#!/usr/bin/env python3
"""A payment provider simulator for the tests: a real HTTP server (Python 3's
standard library only) with a charges API as a payment gateway has one.

    python3 test/provider/provider.py --port 0 --port-file F --state-dir D

listens on 127.0.0.1 (a free port with --port 0, written to F once it
listens) and keeps its state in D/state.json, replaced atomically after
every change, so a restart keeps its charges, keys and counts.

  POST /charges        {"amount", "currency", "reference"}: 201 and a new
                       charge; with an Idempotency-Key (at most 255
                       characters, --max-key-length), the same key and body
                       again gives the first charge, 200, Idempotent-Replayed:
                       true; another body 422; while the key's first request
                       runs 409.  Without the header every request charges.
  GET  /charges?reference=R (or ?idempotency_key=K, or neither: all)
  GET  /charges/ID     one charge, or 404
  GET  /stats          counts: charges, requests (valid POST /charges),
                       replays, conflicts (409), mismatches (422), faults
  GET  /health         200 once it listens
  POST /faults         {"action", "delay_ms", "delay_after_ms", "times",
                       "reference", "key"}: a rule for the next matching
                       charge requests; GET /faults lists, DELETE clears
  POST /reset          forgets every charge, key, count and rule

Faults (a rule, or a request's own Simulate-Fault / Simulate-Delay-Ms /
Simulate-Delay-After-Ms headers): delay_ms sleeps before charging, holding
the key; fail-before answers 500 without charging (the key is free again);
fail-after charges, then answers 503 (a retry replays the charge);
lose-answer charges, then closes the connection without an answer;
delay_after_ms sleeps between the charge and the answer.  The README beside
this file says how tests drive it.
"""

import argparse
import hashlib
import json
import os
import secrets
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

ACTIONS = ("none", "fail-before", "fail-after", "lose-answer")
COUNTERS = ("charges", "requests", "replays", "conflicts", "mismatches", "faults")


class ClientError(Exception):
    def __init__(self, status, error, message):
        super().__init__(message)
        self.status, self.error, self.message = status, error, message


class Provider:
    """The state, behind one lock; every change is saved before it is answered."""

    def __init__(self, state_dir):
        self.path = os.path.join(state_dir, "state.json")
        self.lock = threading.Lock()
        self.charges = {}  # id -> charge
        self.keys = {}  # key -> {"fingerprint", "charge"}; saved once charged
        self.running = set()  # keys whose first request is still running
        self.stats = dict.fromkeys(COUNTERS, 0)
        self.rules = []  # fault rules, in the order they were added
        self.seq = 0
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                saved = json.load(f)
            self.charges = {c["id"]: c for c in saved["charges"]}
            self.keys = saved["keys"]
            self.stats.update(saved["stats"])
            self.seq = saved["seq"]

    def save(self):
        state = {"charges": list(self.charges.values()), "keys": self.keys,
                 "stats": self.stats, "seq": self.seq}
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def take_rule(self, body, key):
        """The first rule that matches this request, used up once more."""
        for rule in self.rules:
            if rule["reference"] not in (None, body["reference"]):
                continue
            if rule["key"] not in (None, key):
                continue
            rule["times"] -= 1
            if rule["times"] == 0:
                self.rules.remove(rule)
            return rule
        return None

    def begin(self, body, key, forced):
        """Before charging: the charge to replay, an error, or the fault to
        apply (the request's own, else the first rule that matches)."""
        fingerprint = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        with self.lock:
            self.stats["requests"] += 1
            if key is not None:
                if key in self.running:
                    self.stats["conflicts"] += 1
                    self.save()
                    raise ClientError(409, "idempotency_key_in_use",
                                      "A request with this Idempotency-Key is still being processed.")
                seen = self.keys.get(key)
                if seen is not None and seen["fingerprint"] != fingerprint:
                    self.stats["mismatches"] += 1
                    self.save()
                    raise ClientError(422, "idempotency_key_mismatch",
                                      "This Idempotency-Key was used with another request body.")
                if seen is not None:
                    self.stats["replays"] += 1
                    self.save()
                    return self.charges[seen["charge"]], None, fingerprint
                self.running.add(key)
            rule = forced or self.take_rule(body, key)
            if rule is not None and (rule["action"] != "none" or rule["delay_ms"]
                                     or rule["delay_after_ms"]):
                self.stats["faults"] += 1
            self.save()
            return None, rule, fingerprint

    def release(self, key):
        with self.lock:
            self.running.discard(key)

    def charge(self, body, key, fingerprint):
        with self.lock:
            self.seq += 1
            charge = {"id": "ch_%06d%s" % (self.seq, secrets.token_hex(4)), "object": "charge",
                      "amount": body["amount"], "currency": body["currency"],
                      "reference": body["reference"], "status": "succeeded",
                      "idempotency_key": key, "created": int(time.time())}
            self.charges[charge["id"]] = charge
            self.stats["charges"] += 1
            if key is not None:
                self.keys[key] = {"fingerprint": fingerprint, "charge": charge["id"]}
                self.running.discard(key)
            self.save()
            return charge

    def get(self, charge_id):
        with self.lock:
            return self.charges.get(charge_id)

    def find(self, query):
        with self.lock:
            found = list(self.charges.values())
        for field in ("reference", "idempotency_key"):
            if field in query:
                found = [c for c in found if c[field] == query[field][0]]
        return found

    def reset(self):
        with self.lock:
            self.charges, self.keys, self.rules, self.seq = {}, {}, [], 0
            self.stats = dict.fromkeys(COUNTERS, 0)
            self.save()


def parse_charge(raw):
    try:
        body = json.loads(raw)
    except ValueError:
        raise ClientError(400, "invalid_json", "The body is not JSON.")
    if not isinstance(body, dict) or set(body) != {"amount", "currency", "reference"}:
        raise ClientError(400, "invalid_request",
                          "The body must be an object with amount, currency and reference.")
    amount, currency, reference = body["amount"], body["currency"], body["reference"]
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise ClientError(400, "invalid_amount", "amount must be a positive integer (minor units).")
    if not isinstance(currency, str) or len(currency) != 3:
        raise ClientError(400, "invalid_currency", "currency must be a three-letter code.")
    if not isinstance(reference, str) or not reference:
        raise ClientError(400, "invalid_reference", "reference must be a non-empty string.")
    return body


def parse_rule(raw):
    try:
        spec = json.loads(raw or b"{}")
    except ValueError:
        raise ClientError(400, "invalid_json", "The body is not JSON.")
    if not isinstance(spec, dict):
        raise ClientError(400, "invalid_request", "The body must be a JSON object.")
    unknown = set(spec) - {"action", "delay_ms", "delay_after_ms", "times", "reference", "key"}
    if unknown:
        raise ClientError(400, "invalid_request", "Unknown fields: %s." % ", ".join(sorted(unknown)))
    rule = {"action": spec.get("action", "none"), "delay_ms": spec.get("delay_ms", 0),
            "delay_after_ms": spec.get("delay_after_ms", 0), "times": spec.get("times", 1),
            "reference": spec.get("reference"), "key": spec.get("key")}
    if rule["action"] not in ACTIONS:
        raise ClientError(400, "invalid_action", "action must be one of %s." % ", ".join(ACTIONS))
    for field in ("delay_ms", "delay_after_ms", "times"):
        if not isinstance(rule[field], int) or rule[field] < 0:
            raise ClientError(400, "invalid_request", "%s must be a non-negative integer." % field)
    if rule["times"] == 0:
        raise ClientError(400, "invalid_request", "times must be at least 1.")
    return rule


def header_rule(headers):
    """A request's own fault headers, as a rule (None without any)."""
    names = ("Simulate-Fault", "Simulate-Delay-Ms", "Simulate-Delay-After-Ms")
    if not any(headers.get(n) is not None for n in names):
        return None
    try:
        return parse_rule(json.dumps({
            "action": headers.get(names[0], "none"),
            "delay_ms": int(headers.get(names[1], 0)),
            "delay_after_ms": int(headers.get(names[2], 0))}))
    except ValueError:
        raise ClientError(400, "invalid_request", "Simulate-Delay-Ms must be an integer.")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "provider-sim/1"
    provider = None  # set by main()

    def log_message(self, fmt, *args):
        if self.server.verbose:
            sys.stderr.write("provider: %s %s\n" % (self.address_string(), fmt % args))

    def send_json(self, status, obj, headers=()):
        data = (json.dumps(obj) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def dispatch(self, method):
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        try:
            if method == "POST" and parts == ["charges"]:
                return self.post_charge()
            if method == "GET" and parts == ["charges"]:
                found = self.provider.find(parse_qs(url.query))
                return self.send_json(200, {"data": found, "count": len(found)})
            if method == "GET" and len(parts) == 2 and parts[0] == "charges":
                charge = self.provider.get(parts[1])
                if charge is None:
                    raise ClientError(404, "not_found", "No such charge.")
                return self.send_json(200, charge)
            if method == "GET" and parts == ["stats"]:
                with self.provider.lock:
                    return self.send_json(200, dict(self.provider.stats))
            if method == "GET" and parts == ["health"]:
                return self.send_json(200, {"ok": True})
            if parts == ["faults"] and method in ("GET", "POST", "DELETE"):
                return self.faults(method)
            if method == "POST" and parts == ["reset"]:
                self.read_body()
                self.provider.reset()
                return self.send_json(200, {"ok": True})
            raise ClientError(404, "not_found", "No such endpoint.")
        except ClientError as e:
            self.send_json(e.status, {"error": e.error, "message": e.message})

    def faults(self, method):
        p = self.provider
        if method == "POST":
            rule = parse_rule(self.read_body())
            with p.lock:
                p.rules.append(rule)
        elif method == "DELETE":
            with p.lock:
                p.rules = []
        with p.lock:
            self.send_json(200, {"data": [dict(r) for r in p.rules]})

    def post_charge(self):
        p = self.provider
        body = parse_charge(self.read_body())
        key = self.headers.get("Idempotency-Key")
        if key is not None and not 0 < len(key) <= self.server.max_key_length:
            raise ClientError(400, "invalid_idempotency_key",
                              "Idempotency-Key must be 1 to %d characters long."
                              % self.server.max_key_length)
        forced = header_rule(self.headers)
        replayed, rule, fingerprint = p.begin(body, key, forced)
        if replayed is not None:
            return self.send_json(200, replayed, [("Idempotent-Replayed", "true")])
        action = rule["action"] if rule else "none"
        try:
            if rule and rule["delay_ms"]:
                time.sleep(rule["delay_ms"] / 1000)
            if action == "fail-before":
                p.release(key)
                return self.send_json(500, {"error": "internal_error",
                                            "message": "Simulated failure; nothing was charged."})
            charge = p.charge(body, key, fingerprint)
        except BaseException:
            p.release(key)
            raise
        if rule and rule["delay_after_ms"]:
            time.sleep(rule["delay_after_ms"] / 1000)
        if action == "lose-answer":
            self.close_connection = True
            return None
        if action == "fail-after":
            return self.send_json(503, {"error": "service_unavailable",
                                        "message": "Simulated failure after the charge was made."})
        return self.send_json(201, charge, [("Location", "/charges/" + charge["id"])])

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_DELETE(self):
        self.dispatch("DELETE")


def main():
    ap = argparse.ArgumentParser(description="A payment provider simulator for the tests.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: a free port")
    ap.add_argument("--port-file", help="write the port here (atomically) once listening")
    ap.add_argument("--state-dir", required=True, help="where state.json is kept")
    ap.add_argument("--max-key-length", type=int, default=255,
                    help="the longest Idempotency-Key accepted (default 255, as Stripe)")
    ap.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = ap.parse_args()

    os.makedirs(args.state_dir, exist_ok=True)
    Handler.provider = Provider(args.state_dir)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.verbose = args.verbose
    server.max_key_length = args.max_key_length
    port = server.server_address[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("%d\n" % port)
        os.replace(tmp, args.port_file)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    sys.stderr.write("provider: listening on http://%s:%d, state in %s\n"
                     % (args.host, port, Handler.provider.path))
    server.serve_forever()
    server.server_close()


if __name__ == "__main__":
    main()
