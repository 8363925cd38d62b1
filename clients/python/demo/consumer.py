"""A Celery worker whose task inserts one effect row, under the task id (test/scripts/consumer_python.sh).

    celery -A consumer worker --pool=solo --prefetch-multiplier=4

Environment: ``CELERY_BROKER_URL`` (amqp://...), ``DEMO_DATABASE`` (a libpq
connection string), ``DEMO_QUEUE`` (default ``tasks``, a quorum queue with
``x-delivery-limit`` ``DEMO_DELIVERY_LIMIT`` dead-lettered to
``DEMO_QUEUE.dlx``, as test/scripts/lib/rabbitmq.sh declares it).

For the crash test only: ``DEMO_CRASH`` is ``point:n,...`` where point is
``mid`` (in the body, after the insert), ``before_commit`` (after
``idem_complete``, before COMMIT) or ``after_commit`` (after COMMIT, before
the ACK); the worker kills itself (SIGKILL) the first time it reaches that
point for task argument ``n``, marking it done in ``DEMO_CRASH_DIR``.
``DEMO_ACKS_LATE=0`` ACKs on receipt and ``DEMO_WITHOUT_KEY=1`` runs
the tasks in plain transactions (to show the test fails without either);
``DEMO_POISON_LOG`` is a file the poison task appends a line to
on each try.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psycopg
from celery import Celery
from celery.signals import task_postrun
from kombu import Exchange, Queue
from psycopg_pool import ConnectionPool

from pg_idempotency import Idempotency, IdempotencySettings
from pg_idempotency.celery import idempotent_task

QUEUE = os.environ.get("DEMO_QUEUE", "tasks")
CRASHES = {tuple(p.split(":")) for p in os.environ.get("DEMO_CRASH", "").split(",") if p}

app = Celery("consumer", broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_acks_late=os.environ.get("DEMO_ACKS_LATE", "1") == "1",
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=4,
    worker_detect_quorum_queues=True,
    task_default_queue=QUEUE,
    task_queues=[
        Queue(
            QUEUE,
            Exchange(QUEUE, type="direct"),
            routing_key=QUEUE,
            queue_arguments={
                "x-queue-type": "quorum",
                "x-delivery-limit": int(os.environ.get("DEMO_DELIVERY_LIMIT", "3")),
                "x-dead-letter-exchange": QUEUE + ".dlx",
            },
        )
    ],
    broker_connection_retry_on_startup=True,
)


def crash(point: str, n: Any) -> None:
    """Kill this worker the first time it reaches ``point`` for task argument ``n``."""
    if (point, str(n)) not in CRASHES:
        return
    try:
        fd = os.open(os.path.join(os.environ["DEMO_CRASH_DIR"], f"{point}-{n}"), os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    os.close(fd)
    # a moment's more work first, so that what the worker sent before this
    # point (an early ACK) has surely reached the broker: a kill -9 right
    # after a send can lose it, which would hide a lost message
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


class CrashingConnection(psycopg.Connection[Any]):
    """Crashes after ``idem_complete``, in the transaction, before COMMIT (``before_commit``)."""

    crash_for: Any = None

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        cur = super().execute(query, params, **kwargs)
        if isinstance(query, str) and "idem_complete" in query:
            crash("before_commit", CrashingConnection.crash_for)
        return cur


def make_runner() -> Idempotency:
    pool: ConnectionPool[Any] = ConnectionPool(
        os.environ["DEMO_DATABASE"], min_size=1, max_size=2, connection_class=CrashingConnection,
        kwargs={"autocommit": True}, open=True,
    )
    return Idempotency(pool, IdempotencySettings(scope=lambda request: "celery"))


def keyed(fn: Any) -> Any:
    """``idempotent_task``, or (``DEMO_WITHOUT_KEY=1``, to show the test fails without it) a plain transaction."""
    if os.environ.get("DEMO_WITHOUT_KEY") != "1":
        return idempotent_task(make_runner)(fn)

    def plain(n: int) -> Any:
        with psycopg.connect(os.environ["DEMO_DATABASE"]) as conn:
            return fn(conn, n)

    return plain


@app.task(name="demo.apply")
@keyed
def apply(conn: psycopg.Connection[Any], n: int) -> dict[str, Any]:
    """The effect: one row per task; the stored result names it."""
    CrashingConnection.crash_for = n
    row = conn.execute("INSERT INTO effects (n) VALUES (%s) RETURNING id", (n,)).fetchone()
    assert row is not None
    crash("mid", n)
    return {"n": n, "effect": row[0]}


@app.task(name="demo.poison")
@keyed
def poison(conn: psycopg.Connection[Any], n: int) -> None:
    """Always fails, after its insert (rolled back): ends in the dead-letter queue."""
    conn.execute("INSERT INTO effects (n) VALUES (%s)", (n,))
    log = os.environ.get("DEMO_POISON_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{n}\n")
    raise RuntimeError("poison")


@task_postrun.connect
def after_commit(task_id: str | None = None, args: Any = None, **kwargs: Any) -> None:
    """After the body returned (COMMIT done) and before the late ACK."""
    if args:
        crash("after_commit", args[0])
