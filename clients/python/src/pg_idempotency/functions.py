"""Any function under a key: :func:`idempotent_function`, a decorator for sync and async functions.

The decorated function gets the connection of the transaction that records
its key as its first argument, and its caller does not pass it: the
wrapper reserves the key (``idem_reserve``), calls the function, completes
the key with its return value as JSON (``idem_complete``, response_status
200, as ``idem_call`` stores a handler's result) and commits, all through
the core runner. A duplicate call returns the stored value without calling
the function; a raise rolls back and is raised again; ``in_progress``,
``stuck`` and ``mismatch`` are raised as their typed errors. The caller
gets the stored JSON back in both cases (parsed as the package parses JSON:
numbers with a fraction as :class:`decimal.Decimal`), so the first call and
its replays return the same value.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import psycopg

from ._core_runner import Completion, Result
from ._json import dump_json, parse_json
from .fingerprint import resolve_pointer, validate_pointer
from .runner import AsyncIdempotency, Idempotency

__all__ = ["KeyFrom", "idempotent_function", "key_of", "stored_value"]

P = ParamSpec("P")
T = TypeVar("T")

#: Where a key (or a scope) comes from: a JSON Pointer into the payload, or a function of the call's arguments.
KeyFrom = str | Callable[..., Any]

#: The status ``idem_call`` completes a handler's result with, and so does the wrapper.
STATUS = 200


def _scalar(value: Any, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"the {what} must be a string or an integer, not {type(value).__name__}")
    return str(value)


def key_of(source: KeyFrom, payload: Any, args: tuple[Any, ...], kwargs: dict[str, Any], what: str = "key") -> str:
    """The key (or scope) of a call: ``source`` resolved in ``payload`` (a JSON Pointer) or called with the arguments."""
    if callable(source):
        return _scalar(source(*args, **kwargs), what)
    found, value = resolve_pointer(payload, source)
    if not found:
        raise ValueError(f"the {what} JSON Pointer {source!r} finds nothing in the payload")
    return _scalar(value, what)


def stored_value(result: Result[Any]) -> Any:
    """The JSON value a run stored (``new``) or found (``replay``), parsed."""
    if result.response is None:
        return None
    ok, value = parse_json(result.response)
    if not ok:
        raise ValueError("the stored response is not JSON")
    return value


def _completion(value: Any) -> Completion[None]:
    return Completion(STATUS, dump_json(value), None)


def _check_source(source: KeyFrom, what: str) -> None:
    if not callable(source):
        if not source.startswith("/"):
            raise ValueError(f"the {what} must be a JSON Pointer (beginning with '/') or a function")
        validate_pointer(source)


def idempotent_function(
    runner: Idempotency | AsyncIdempotency,
    *,
    key: KeyFrom,
    scope: str | Callable[..., Any],
    operation: str | None = None,
    payload: str | None = None,
    request: Callable[..., Any] | None = None,
    ttl: timedelta | None = None,
) -> Callable[[Callable[Concatenate[Any, P], Any]], Callable[P, Any]]:
    """Run the decorated function under a key, in the transaction that records it.

    ``runner``: an :class:`Idempotency` for a sync function, an
    :class:`AsyncIdempotency` for an ``async def``. The function's first
    parameter is the connection (``psycopg.Connection`` or
    ``AsyncConnection``, in its transaction); the caller passes the others.

    ``payload`` names the argument that is the message or event (default:
    the first after the connection); the request document, whose hash is
    the fingerprint, is the payload, or ``request(*args, **kwargs)``.
    ``key`` is a JSON Pointer into the payload (``"/order_id"``) or a
    function of the arguments, as Powertools' ``@idempotent_function``
    takes a JMESPath; a string or an integer. ``scope``: a string, or a
    function of the arguments. ``operation``: default the function's
    ``__module__.__qualname__`` (at most 63 bytes).
    """
    _check_source(key, "key")
    if not callable(scope) and not scope:
        raise ValueError("the scope must not be empty")

    def decorate(fn: Callable[Concatenate[Any, P], Any]) -> Callable[P, Any]:
        op = operation if operation is not None else f"{fn.__module__}.{fn.__qualname__}"
        if not op or len(op.encode()) > 63:
            raise ValueError(f"the operation {op!r} must be 1 to 63 bytes: name it with operation=")
        signature = inspect.signature(fn)
        names = list(signature.parameters)
        if len(names) < 2 and request is None:
            raise TypeError(f"{fn.__qualname__} takes no argument after the connection to take the payload from")
        payload_name = payload if payload is not None else names[1]
        if payload_name not in names[1:]:
            raise TypeError(f"{fn.__qualname__} has no parameter {payload_name!r}")
        is_async = inspect.iscoroutinefunction(fn)
        if is_async != isinstance(runner, AsyncIdempotency):
            raise TypeError("an async function needs an AsyncIdempotency runner, a sync one an Idempotency runner")

        def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
            bound = signature.bind(None, *args, **kwargs)
            bound.apply_defaults()
            body = bound.arguments[payload_name]
            return {
                "operation": op,
                "key": key_of(key, body, args, kwargs),
                "scope": scope if isinstance(scope, str) else key_of(scope, body, args, kwargs, "scope"),
                "request": body if request is None else request(*args, **kwargs),
                "ttl": ttl,
            }

        if is_async:
            arunner = cast(AsyncIdempotency, runner)

            @functools.wraps(fn)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                async def run(conn: psycopg.AsyncConnection[Any]) -> Completion[None]:
                    return _completion(await fn(conn, *args, **kwargs))

                return stored_value(await arunner.run_under_key(fn=run, **plan(args, kwargs)))

            return cast(Callable[P, Any], async_wrapper)

        srunner = cast(Idempotency, runner)

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            def run(conn: psycopg.Connection[Any]) -> Completion[None]:
                return _completion(fn(conn, *args, **kwargs))

            return stored_value(srunner.run_under_key(fn=run, **plan(args, kwargs)))

        return wrapper

    return decorate
