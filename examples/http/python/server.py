#!/usr/bin/python3
"""A small payment API that honours the Idempotency-Key header (psycopg 3).

The HTTP contract is doc/http.md's, the same for the Node.js, Go
and Java services:

    POST /payments
    Idempotency-Key: 8b6f1db8-04dc-4f75-a58b-f11c9fcd2f80   (required)
    X-Account-Id: acct-1                                    (the key's scope)
    Content-Type: application/json

    {"order_id": "order-842", "amount": 10000, "currency": "BRL"}

Answers, as in the IETF draft "The Idempotency-Key HTTP Header Field":

    201 Created               the payment was made by this request
    402 Payment Required      the card was declined (a final answer)
    400 Bad Request           Idempotency-Key missing or invalid (SQLSTATE
                              22023), or a bad body
    409 Conflict              a request with this key is in progress, or its
                              outcome is unknown (stuck); with Retry-After
    422 Unprocessable Content the key was already used with another request
    503 Service Unavailable   no connection free, or a read-only database;
                              with Retry-After

A retry with the same key and body gets the first answer again -- its status
and body, stored in idem_keys -- with the header "Idempotent-Replayed: true".
The key is reserved, the payment written and the answer stored in one
transaction, which commits before the answer is sent: a client that times
out or loses the connection retries and gets that answer.  Error bodies are
{"error": "<code>", "message": "<sentence>"}.

For demonstrations, "X-Simulated-Latency-Ms: n" (at most 5000) makes the
request sleep after writing the payment and before committing, as a slow
payment processor would.

Run: PGHOST=... PGDATABASE=... /usr/bin/python3 server.py --port 0 --port-file F
It listens on 127.0.0.1 only, on the port given (0: any free port, written to
--port-file), and stops on SIGTERM or after --max-seconds.  Behind a
transaction-pooling PgBouncer, add --no-prepare.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

OPERATION = "create-payment"
DECLINE_ABOVE = 1_000_000  # cents; larger payments are declined
MAX_BODY = 64 * 1024
MAX_LATENCY_MS = 5000

# The outcomes of idem_reserve that answer without running the effect
REFUSED = {
    "in_progress": (409, "in_progress",
                    "a request with this Idempotency-Key is in progress; retry later"),
    "stuck": (409, "stuck",
              "the outcome of the request with this Idempotency-Key is being checked"),
    "mismatch": (422, "mismatch",
                 "this Idempotency-Key was already used with another request"),
}

# SQLSTATEs of the extension (psycopg: e.sqlstate) and what the client is told
SQLSTATE_HTTP = {
    "22023": (400, "invalid_request", None),  # the message names the argument
    "ID003": REFUSED["in_progress"],          # idem_call's outcomes as errors
    "ID004": REFUSED["mismatch"],
    "ID005": REFUSED["stuck"],
    "ID001": (500, "internal_error", "internal error"),  # a bug in the caller
    "ID002": (500, "internal_error", "internal error"),
    "25006": (503, "read_only", "the database is read-only; retry later"),
}


def error_body(code, message):
    return {"error": code, "message": message}


class BadRequest(Exception):
    """The request is malformed: answered with 400 before anything is reserved."""


def parse_payment(raw):
    """The payment request as a dict, or BadRequest."""
    try:
        request = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not JSON: {e}")
    if not isinstance(request, dict):
        raise BadRequest("the body must be a JSON object")
    if not isinstance(request.get("order_id"), str) or not request["order_id"]:
        raise BadRequest('"order_id" must be a non-empty string')
    amount = request.get("amount")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise BadRequest('"amount" must be a positive integer (cents)')
    if not isinstance(request.get("currency"), str) or len(request["currency"]) != 3:
        raise BadRequest('"currency" must be a three-letter code')
    return request


class Payments:
    """The payment operation, idempotent through idem_reserve / idem_complete."""

    def __init__(self, pool):
        self.pool = pool

    def create(self, scope, key, request, latency):
        """Return (status, body, replayed) for one POST /payments."""
        try:
            with self.pool.connection() as conn:
                # one transaction: committed at the end of the block, rolled
                # back if anything in it raises
                with conn.transaction():
                    return self._create(conn, scope, key, request, latency)
        except psycopg.Error as e:
            if e.sqlstate not in SQLSTATE_HTTP:
                raise
            status, code, message = SQLSTATE_HTTP[e.sqlstate]
            return status, error_body(code, message or e.diag.message_primary), False

    def _create(self, conn, scope, key, request, latency):
        outcome, response_status, response = conn.execute(
            "SELECT outcome, response_status, response"
            " FROM idem_reserve(%s, %s, %s, scope => %s)",
            (OPERATION, key, Jsonb(request), scope)).fetchone()
        if outcome == "replay":
            return response_status, response, True
        if outcome in REFUSED:
            status, code, message = REFUSED[outcome]
            return status, error_body(code, message), False

        # new: this request owns the key
        if request["amount"] > DECLINE_ABOVE:
            status, resource_id = 402, None
            body = error_body("card_declined", "the card was declined")
        else:
            # The body is built as jsonb, the form idem_complete stores, so
            # that replays are the same document
            payment_id, body = conn.execute(
                "INSERT INTO payments (account, order_id, amount, currency)"
                " VALUES (%s, %s, %s, %s)"
                " RETURNING id, jsonb_build_object('id', id,"
                " 'order_id', order_id, 'amount', amount,"
                " 'currency', currency, 'status', 'paid')",
                (scope, request["order_id"], request["amount"],
                 request["currency"])).fetchone()
            status, resource_id = 201, str(payment_id)
        if latency:
            time.sleep(latency)
        conn.execute("SELECT idem_complete(%s, %s, %s, %s, %s, %s)",
                     (OPERATION, key, Jsonb(body), status, resource_id, scope))
        return status, body, False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "idempotency-example/1"

    def do_GET(self):
        if self.path == "/healthz":
            self.reply(200, {"status": "ok"})
        else:
            self.reply(404, error_body("not_found", "not found"))

    def do_POST(self):
        if self.path != "/payments":
            self.drain()
            return self.reply(404, error_body("not_found", "not found"))
        raw = self.drain()
        key = self.headers.get("Idempotency-Key")
        if key is None:
            return self.reply(400, error_body("missing_key", "the Idempotency-Key header is required"))
        scope = self.headers.get("X-Account-Id", "public")
        try:
            request = parse_payment(raw)
            latency = int(self.headers.get("X-Simulated-Latency-Ms", "0"))
        except BadRequest as e:
            return self.reply(400, error_body("bad_request", str(e)))
        except ValueError:
            return self.reply(400, error_body("bad_request", "bad X-Simulated-Latency-Ms"))
        latency = min(max(latency, 0), MAX_LATENCY_MS) / 1000.0

        try:
            status, body, replayed = self.server.payments.create(scope, key, request, latency)
        except PoolTimeout:
            return self.reply(503, error_body("busy", "no database connection is free; retry later"),
                              {"Retry-After": "1"})
        except psycopg.Error as e:
            self.log_message("database error %s: %s", e.sqlstate, e)
            return self.reply(500, error_body("internal_error", "internal error"))

        headers = {}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        if status in (409, 503):
            headers["Retry-After"] = "1"
        self.reply(status, body, headers)

    def drain(self):
        """Read the request body (bounded)."""
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.close_connection = True
            return b""
        return self.rfile.read(length)

    def reply(self, status, body, headers=None):
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up; what was committed stays for its retry
            self.log_message("client went away before the %d answer", status)

    def log_message(self, fmt, *args):
        sys.stderr.write("server: %s %s\n" % (self.address_string(), fmt % args))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", help="write the port listened on here")
    ap.add_argument("--max-seconds", type=float, default=300,
                    help="stop after this long (default 300)")
    ap.add_argument("--dsn", default="", help="libpq connection string (default: environment)")
    ap.add_argument("--no-prepare", action="store_true",
                    help="never prepare statements on the server (for PgBouncer's transaction pooling)")
    args = ap.parse_args()

    # autocommit: each conn.transaction() block is one BEGIN ... COMMIT.
    # psycopg prepares a statement on the server after it ran 5 times on a
    # connection; behind a transaction-pooling PgBouncer the next
    # transaction may get another server connection, which lacks it.
    kwargs = {"autocommit": True}
    if args.no_prepare:
        kwargs["prepare_threshold"] = None
    pool = ConnectionPool(args.dsn, min_size=1, max_size=16, kwargs=kwargs, timeout=10,
                          open=True)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.payments = Payments(pool)

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    timer = threading.Timer(args.max_seconds, stop)
    timer.daemon = True
    timer.start()

    port = server.server_address[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.rename(tmp, args.port_file)
    sys.stderr.write(f"server: listening on 127.0.0.1:{port}\n")
    try:
        server.serve_forever()
    finally:
        server.server_close()
        pool.close()
        sys.stderr.write("server: stopped\n")


if __name__ == "__main__":
    main()
