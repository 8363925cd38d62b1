#!/usr/bin/python3
"""A small payment API that honours the Idempotency-Key header.

    POST /payments
    Idempotency-Key: 8b6f1db8-04dc-4f75-a58b-f11c9fcd2f80   (required)
    X-Account-Id: acct-1                                    (the key's scope)
    Content-Type: application/json

    {"order_id": "order-842", "amount": 10000, "currency": "BRL"}

Answers, as in the IETF draft "The Idempotency-Key HTTP Header Field":

    201 Created               the payment was made by this request
    402 Payment Required      the card was declined (a final answer)
    400 Bad Request           Idempotency-Key missing or invalid, or a bad body
    409 Conflict              a request with this key is in progress (with
                              Retry-After), or its outcome is unknown (stuck)
    422 Unprocessable Content the key was already used with another request

A retry with the same key and body gets the first answer again -- its status
and body, stored in idem_keys -- with the header "Idempotent-Replayed: true".
The key is reserved, the payment written and the answer stored in one
transaction, which commits before the answer is sent: a client that times
out or loses the connection retries and gets that answer.

For demonstrations, "X-Simulated-Latency-Ms: n" (at most 5000) makes the
request sleep after writing the payment and before committing, as a slow
payment processor would.

Run: PGHOST=... PGDATABASE=... /usr/bin/python3 server.py --port 0 --port-file F
It listens on 127.0.0.1 only, on the port given (0: any free port, written to
--port-file), and stops on SIGTERM or after --max-seconds.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg2
import psycopg2.errors
import psycopg2.pool
from psycopg2.extras import Json

OPERATION = "create-payment"
DECLINE_ABOVE = 1_000_000  # cents; larger payments are declined
MAX_BODY = 64 * 1024
MAX_LATENCY_MS = 5000


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
        conn = self.pool.getconn()
        try:
            return self._create(conn, scope, key, request, latency)
        finally:
            self.pool.putconn(conn)

    def _create(self, conn, scope, key, request, latency):
        with conn:  # one transaction: committed on return, rolled back on error
            with conn.cursor() as cur:
                try:
                    cur.execute(
                        "SELECT outcome, response_status, response"
                        " FROM idem_reserve(%s, %s, %s, scope => %s)",
                        (OPERATION, key, Json(request), scope))
                except psycopg2.errors.InvalidParameterValue as e:  # 22023
                    conn.rollback()
                    return 400, {"error": "invalid Idempotency-Key",
                                 "detail": e.diag.message_primary}, False
                outcome, response_status, response = cur.fetchone()

                if outcome == "replay":
                    return response_status, response, True
                if outcome == "mismatch":
                    return 422, {"error": "this Idempotency-Key was already "
                                          "used with another request"}, False
                if outcome == "in_progress":
                    return 409, {"error": "a request with this Idempotency-Key "
                                          "is in progress; retry later"}, False
                if outcome == "stuck":
                    return 409, {"error": "the outcome of the request with this "
                                          "Idempotency-Key is being checked"}, False

                # new: this request owns the key
                if request["amount"] > DECLINE_ABOVE:
                    status, body, resource_id = 402, {"error": "card_declined"}, None
                else:
                    # The body is built as jsonb, the form idem_complete
                    # stores, so that replays are byte for byte the same
                    cur.execute(
                        "INSERT INTO payments (account, order_id, amount, currency)"
                        " VALUES (%s, %s, %s, %s)"
                        " RETURNING id, jsonb_build_object('id', id,"
                        " 'order_id', order_id, 'amount', amount,"
                        " 'currency', currency, 'status', 'paid')",
                        (scope, request["order_id"], request["amount"],
                         request["currency"]))
                    payment_id, body = cur.fetchone()
                    status = 201
                    resource_id = str(payment_id)
                if latency:
                    time.sleep(latency)
                cur.execute("SELECT idem_complete(%s, %s, %s, %s, %s, %s)",
                            (OPERATION, key, Json(body), status, resource_id,
                             scope))
        return status, body, False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "idempotency-example/1"

    def do_GET(self):
        if self.path == "/healthz":
            self.reply(200, {"status": "ok"})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self):
        if self.path != "/payments":
            self.drain()
            return self.reply(404, {"error": "not found"})
        raw = self.drain()
        key = self.headers.get("Idempotency-Key")
        if key is None:
            return self.reply(400, {"error": "the Idempotency-Key header is required"})
        scope = self.headers.get("X-Account-Id", "public")
        try:
            request = parse_payment(raw)
            latency = int(self.headers.get("X-Simulated-Latency-Ms", "0"))
        except BadRequest as e:
            return self.reply(400, {"error": str(e)})
        except ValueError:
            return self.reply(400, {"error": "bad X-Simulated-Latency-Ms"})
        latency = min(max(latency, 0), MAX_LATENCY_MS) / 1000.0

        try:
            status, body, replayed = self.server.payments.create(scope, key, request, latency)
        except psycopg2.pool.PoolError:
            return self.reply(503, {"error": "busy"}, {"Retry-After": "1"})
        except psycopg2.Error as e:
            self.log_message("database error %s: %s", e.pgcode, e.pgerror)
            return self.reply(500, {"error": "internal error"})

        headers = {}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        if status == 409:
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
    args = ap.parse_args()

    pool = psycopg2.pool.ThreadedConnectionPool(1, 16, args.dsn)
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
        pool.closeall()
        sys.stderr.write("server: stopped\n")


if __name__ == "__main__":
    main()
