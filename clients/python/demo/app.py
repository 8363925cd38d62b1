"""The payment API of doc/clients.md ("The demo app"), on FastAPI with pg-idempotency.

    POST /payments          idempotent, operation create-payment
    GET  /payments/{id}     the payment of the caller's account, or 404
    GET  /healthz

Authentication: ``Authorization: Bearer <token>``, the tokens being the
``token=account`` pairs of ``DEMO_TOKENS`` (default
``token-a=acct-a,token-b=acct-b``); the account is the key's scope.
``X-Simulated-Latency-Ms: n`` (at most 5000) sleeps after the payment's
INSERT, before the commit.

With ``--bench``: ``POST /bench/middleware`` (the library around an INSERT
into bench_effects) and ``POST /bench/by-hand`` (the same three SQL calls
written by hand), for the overhead benchmark.

Run with libpq's environment (PGHOST, PGPORT, PGUSER, PGDATABASE):
``demo/start.sh --port 0 --port-file F --max-seconds 300``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from psycopg_pool import AsyncConnectionPool

from pg_idempotency import IdempotencySettings, parse_key
from pg_idempotency.fastapi import FastAPIIdempotency, IdempotencyConnection, idempotent

OPERATION = "create-payment"
DECLINE_ABOVE = 1_000_000
MAX_LATENCY_MS = 5000
PROBLEM = "application/problem+json"


def tokens() -> dict[str, str]:
    """The token -> account map of DEMO_TOKENS."""
    pairs = os.environ.get("DEMO_TOKENS", "token-a=acct-a,token-b=acct-b")
    out: dict[str, str] = {}
    for pair in pairs.split(","):
        token, sep, account = pair.strip().partition("=")
        if sep and token and account:
            out[token] = account
    return out


TOKENS = tokens()


def account_of(request: Request) -> str | None:
    """The scope function: the account of the request's bearer token, or None."""
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return TOKENS.get(token.strip())


class CardDeclined(Exception):
    """The processor declined the card: a final answer (the settings' final_errors), 402 by its handler."""


def problem(status: int, code: str, title: str, detail: str) -> Response:
    """An RFC 9457 problem response of the demo's own cases."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code}
    return Response(json.dumps(body), status_code=status, media_type=PROBLEM)


def parse_payment(raw: bytes) -> dict[str, Any] | str:
    """The payment of a request body, or the sentence saying what is wrong with it."""
    try:
        payment = json.loads(raw)
    except (ValueError, RecursionError):
        return "The body is not JSON."
    if not isinstance(payment, dict):
        return "The body must be a JSON object."
    if not isinstance(payment.get("order_id"), str) or not payment["order_id"]:
        return '"order_id" must be a non-empty string.'
    amount = payment.get("amount")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        return '"amount" must be a positive integer.'
    currency = payment.get("currency")
    if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
        return '"currency" must be three letters.'
    return payment


def latency_of(request: Request) -> float | None:
    """Seconds of X-Simulated-Latency-Ms (at most 5 s), or None when it is not an integer."""
    value = request.headers.get("x-simulated-latency-ms")
    if value is None:
        return 0.0
    try:
        ms = int(value)
    except ValueError:
        return None
    return min(max(ms, 0), MAX_LATENCY_MS) / 1000.0


def build_app(pool: AsyncConnectionPool[Any], bench: bool = False, on_ready: Any = None) -> FastAPI:
    """The demo application on ``pool`` (opened and closed by its lifespan)."""
    # a raised error is rolled back, but a declined card is an answer: completed and replayed
    idem = FastAPIIdempotency(pool, IdempotencySettings(scope=account_of, final_errors=CardDeclined))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.open(wait=True)
        await idem.check_version()  # refuses to start on a missing or old extension
        if on_ready is not None:
            on_ready(app)
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(title="pg-idempotency demo", lifespan=lifespan)

    @app.exception_handler(CardDeclined)
    async def card_declined(request: Request, exc: CardDeclined) -> Response:
        return problem(402, "card-declined", "Card declined", "The card was declined.")

    router = APIRouter(route_class=idem.route_class)

    @router.post("/payments")
    @idempotent(operation=OPERATION)
    async def create_payment(request: Request, conn: IdempotencyConnection) -> Response:
        payment = parse_payment(await request.body())
        if isinstance(payment, str):
            # completed too: the same body always gets the same 400
            return problem(400, "bad-request", "Bad request", payment)
        latency = latency_of(request)
        if latency is None:
            return problem(400, "bad-request", "Bad request", "X-Simulated-Latency-Ms must be an integer.")
        account = account_of(request)
        declined = payment["amount"] > DECLINE_ABOVE
        cur = await conn.execute(
            "INSERT INTO payments (account, order_id, amount, currency, status)"
            " VALUES (%s, %s, %s, %s, %s) RETURNING id",
            (account, payment["order_id"], payment["amount"], payment["currency"], "declined" if declined else "paid"),
        )
        row = await cur.fetchone()
        assert row is not None
        if latency:
            await asyncio.sleep(latency)
        if declined:
            raise CardDeclined()  # its payment row (status declined) is kept with the 402
        body = {
            "id": row[0],
            "order_id": payment["order_id"],
            "amount": payment["amount"],
            "currency": payment["currency"],
            "status": "paid",
        }
        return JSONResponse(body, status_code=201, headers={"Location": f"/payments/{row[0]}"})

    @router.get("/payments/{payment_id}")
    async def get_payment(payment_id: str, request: Request, conn: IdempotencyConnection) -> Response:
        account = account_of(request)
        if account is None:
            return problem(401, "unauthenticated", "Unauthenticated", "This request needs a valid bearer token.")
        if not payment_id.isdigit() or len(payment_id) > 18:
            return problem(404, "not-found", "Not found", "There is no such payment.")
        cur = await conn.execute(
            "SELECT id, order_id, amount, currency, status FROM payments WHERE id = %s AND account = %s",
            (int(payment_id), account),
        )
        row = await cur.fetchone()
        if row is None:
            return problem(404, "not-found", "Not found", "There is no such payment.")
        keys = ("id", "order_id", "amount", "currency", "status")
        return JSONResponse(dict(zip(keys, row)))

    if bench:

        @router.post("/bench/middleware")
        async def bench_middleware(request: Request, conn: IdempotencyConnection) -> Response:
            cur = await conn.execute(
                "INSERT INTO bench_effects (k) VALUES (%s) RETURNING id", (request.headers.get("idempotency-key"),)
            )
            row = await cur.fetchone()
            assert row is not None
            return JSONResponse({"id": row[0]}, status_code=201)

    app.include_router(router)
    plain = APIRouter()

    @plain.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    if bench:

        @plain.post("/bench/by-hand")
        async def bench_by_hand(request: Request) -> Response:
            # the same handler with the three SQL calls by hand, one transaction, no library
            account = account_of(request)
            if account is None:
                return problem(401, "unauthenticated", "Unauthenticated", "This request needs a valid bearer token.")
            try:
                key = parse_key(request.headers.getlist("idempotency-key"))
            except ValueError:
                key = None
            if key is None:
                return problem(400, "invalid-key", "Invalid Idempotency-Key", "A valid Idempotency-Key is needed.")
            body = await request.body()
            document = '{"method": "POST", "path": "/bench/by-hand"' + (', "body": ' + body.decode() if body else "") + "}"
            async with pool.connection() as conn, conn.transaction():
                cur = await conn.execute(
                    "SELECT outcome, response_status, response FROM idem_reserve(%s, %s, %s::jsonb, scope => %s)",
                    ("POST /bench/by-hand", key, document, account),
                )
                reserved = await cur.fetchone()
                assert reserved is not None
                outcome, status, stored = reserved
                if outcome == "replay":
                    return JSONResponse(stored.get("body") if isinstance(stored, dict) else stored,
                                        status_code=status, headers={"Idempotent-Replayed": "true"})
                if outcome != "new":
                    return problem(409 if outcome != "mismatch" else 422, str(outcome), "Conflict", "Retry later.")
                cur = await conn.execute("INSERT INTO bench_effects (k) VALUES (%s) RETURNING id", (key,))
                row = await cur.fetchone()
                assert row is not None
                answer = {"id": row[0]}
                envelope = {"v": 1, "headers": {"content-type": "application/json"}, "body": answer}
                await conn.execute(
                    "SELECT idem_complete(%s, %s, %s::jsonb, %s, scope => %s)",
                    ("POST /bench/by-hand", key, json.dumps(envelope), 201, account),
                )
            return JSONResponse(answer, status_code=201)

    app.include_router(plain)
    return app


class DemoServer(uvicorn.Server):
    """uvicorn's server, stopping gracefully on SIGTERM or SIGINT and then exiting 0.

    (uvicorn itself raises the signal again after its shutdown, so the
    process would end with the signal's status.)
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        def stop(signum: int, frame: object) -> None:
            self.should_exit = True

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="pg-idempotency demo: the payment API on FastAPI")
    ap.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any free port)")
    ap.add_argument("--port-file", help="write the port listened on here, once ready")
    ap.add_argument("--max-seconds", type=float, default=0, help="stop after this long (0: never)")
    ap.add_argument("--bench", action="store_true", help="also serve /bench/middleware and /bench/by-hand")
    ap.add_argument("--no-prepare", action="store_true",
                    help="never prepare statements on the server (PgBouncer in transaction mode)")
    ap.add_argument("--pool-size", type=int, default=20)
    args = ap.parse_args(argv)

    kwargs: dict[str, Any] = {"autocommit": True}
    if args.no_prepare:
        kwargs["prepare_threshold"] = None
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        "", min_size=2, max_size=args.pool_size, kwargs=kwargs, timeout=10, open=False
    )

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]

    server: uvicorn.Server | None = None

    def ready(app: FastAPI) -> None:
        if args.port_file:
            tmp = args.port_file + ".tmp"
            with open(tmp, "w") as f:
                f.write(f"{port}\n")
            os.replace(tmp, args.port_file)
        sys.stderr.write(f"demo: listening on 127.0.0.1:{port}\n")
        if args.max_seconds > 0:
            def stop() -> None:
                assert server is not None
                server.should_exit = True
            asyncio.get_running_loop().call_later(args.max_seconds, stop)

    app = build_app(pool, bench=args.bench, on_ready=ready)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=10)
    server = DemoServer(config)
    server.run(sockets=[sock])
    sys.stderr.write("demo: stopped\n")


if __name__ == "__main__":
    main()
