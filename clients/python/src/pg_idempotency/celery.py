"""Celery tasks under a key: :func:`idempotent_task`, under ``@app.task(acks_late=True, ...)``.

The task body gets the connection of the transaction that records its key
as its first argument; the key is the task id (the same for a publisher's
duplicate and for every redelivery), the operation the task's name, the
scope ``"celery"``, the request document ``{"body": {"args": [...],
"kwargs": {...}}}``. With ``acks_late=True`` and
``task_reject_on_worker_lost=True`` the message is ACKed only after the
body returned, so after COMMIT; what each outcome does to the message:

- new: the body's return value (JSON) is completed with the key, committed,
  returned, and the message ACKed;
- replay: the stored value is returned without running the body; ACKed;
- the body raises: rolled back, the message rejected with requeue
  (``Reject(requeue=True)``), so the broker redelivers it and its delivery
  limit (a quorum queue's ``x-delivery-limit``) dead-letters it at last;
- in_progress (a redelivery racing the first run): the worker waits
  ``retry_in`` seconds and reserves again, up to ``retries`` times, never
  running the body while the first run holds the key; then, and for
  stuck, rejected with requeue as an error;
- mismatch (the task id again with other arguments): logged and rejected
  without requeue (dead-lettered where the queue has a dead-letter exchange).

Celery's own ``Retry``, ``Reject`` and ``Ignore`` raised by the body roll
back and pass through unchanged.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec

import psycopg
from celery import current_task
from celery.exceptions import Ignore, Reject, Retry

from ._core_runner import Completion
from .core import InProgressError, MismatchError, StuckError
from .functions import KeyFrom, _check_source, _completion, key_of, stored_value
from .runner import Idempotency

__all__ = ["idempotent_task"]

P = ParamSpec("P")

logger = logging.getLogger("pg_idempotency.celery")


class _Lazy:
    """The runner, or a factory of it called on the first task (after a prefork worker's fork)."""

    def __init__(self, runner: Idempotency | Callable[[], Idempotency]) -> None:
        self._runner = runner if isinstance(runner, Idempotency) else None
        self._factory = None if isinstance(runner, Idempotency) else runner
        self._lock = threading.Lock()

    def get(self) -> Idempotency:
        if self._runner is None:
            with self._lock:
                if self._runner is None:
                    assert self._factory is not None
                    self._runner = self._factory()
        return self._runner


def idempotent_task(
    runner: Idempotency | Callable[[], Idempotency],
    *,
    key: KeyFrom | None = None,
    scope: str = "celery",
    operation: str | None = None,
    ttl: timedelta | None = None,
    retry_in: float = 1.0,
    retries: int = 30,
) -> Callable[[Callable[Concatenate[psycopg.Connection[Any], P], Any]], Callable[P, Any]]:
    """Run a Celery task's body under a key, in the transaction that records it.

    ``runner``: an :class:`~pg_idempotency.Idempotency`, or a function that
    makes one (called once, on the first task: a pool opened after a
    prefork worker forked). ``key``: default the task id; or a JSON Pointer
    into ``{"args": [...], "kwargs": {...}}`` (``"/args/0/order_id"``), or a
    function of the task's arguments. ``operation``: default the task's
    name. Put it under ``@app.task(acks_late=True,
    reject_on_worker_lost=True)``; see the module's documentation for what
    each outcome does to the message.
    """
    if key is not None:
        _check_source(key, "key")
    if not scope:
        raise ValueError("the scope must not be empty")
    lazy = _Lazy(runner)

    def decorate(fn: Callable[Concatenate[psycopg.Connection[Any], P], Any]) -> Callable[P, Any]:
        @functools.wraps(fn)
        def body(*args: P.args, **kwargs: P.kwargs) -> Any:
            task = current_task
            if task is None or task.request.id is None:
                raise RuntimeError(f"{fn.__qualname__} runs as a Celery task, not called directly")
            arguments = {"args": list(args), "kwargs": dict(kwargs)}
            plan: dict[str, Any] = {
                "operation": operation or task.name,
                "key": task.request.id if key is None else key_of(key, arguments, args, kwargs),
                "scope": scope,
                "request": {"body": arguments},
                "ttl": ttl,
            }

            def run(conn: psycopg.Connection[Any]) -> Completion[None]:
                return _completion(fn(conn, *args, **kwargs))

            tries = 0
            while True:
                try:
                    result = lazy.get().run_under_key(fn=run, **plan)
                except InProgressError:
                    tries += 1
                    if tries <= retries:
                        time.sleep(retry_in)
                        continue
                    logger.warning("task %s key %s still in progress: requeued", plan["operation"], plan["key"])
                    raise Reject("in progress", requeue=True) from None
                except MismatchError as e:
                    logger.error(
                        "task %s key %s was recorded with other arguments: rejected without requeue",
                        plan["operation"], plan["key"],
                    )
                    raise Reject(str(e), requeue=False) from e
                except StuckError as e:
                    logger.warning("task %s key %s is stuck: requeued", plan["operation"], plan["key"])
                    raise Reject(str(e), requeue=True) from e
                except (Retry, Reject, Ignore):
                    raise
                except Exception as e:
                    logger.warning("task %s key %s failed, rolled back and requeued: %r", plan["operation"], plan["key"], e)
                    raise Reject(repr(e), requeue=True) from e
                if result.outcome == "replay":
                    logger.info("task %s key %s: replayed, not run again", plan["operation"], plan["key"])
                return stored_value(result)

        return body

    return decorate
