"""What the fast path (:mod:`django_cogworker.direct`) assumes of redis-py's
internals, checked before it relies on them (SPEC section 3, ``FAST_PATH``).

Duties: name the redis-py versions the fast path was tested with (the
bounds of ``redis[hiredis]`` in pyproject.toml, which tox's
``redis{oldest,newest}`` environments test); probe, at first use, that a
connection has what the lean round trip reads (``_sock``,
``_parser._reader``, ``_parser._buffer``, and an idle reader that answers
``redis._parsers.hiredis.NOT_ENOUGH_DATA``); say once, at INFO, why the
fast path is off; and send a command again after a failure only as
redis-py's own retry rule would (never a second ``LPUSH`` where redis-py
would have raised).
"""

from __future__ import annotations

import logging
import re
import select
import socket
from typing import Any

import redis

logger = logging.getLogger("django_cogworker")

Reader: Any
NOT_ENOUGH_DATA: Any
try:
    from hiredis import Reader
    from redis._parsers.hiredis import NOT_ENOUGH_DATA
except ImportError:  # no hiredis, or a redis-py without the marker (before 5.0.8): the probe says so
    Reader = NOT_ENOUGH_DATA = None

#: The oldest redis-py the fast path was tested with, and the first major
#: it was not: pyproject.toml's bounds of ``redis[hiredis]``.
OLDEST_TESTED = (5, 0, 8)
FIRST_UNTESTED_MAJOR = 9

#: redis-py 5 retries a command only for the errors of the connection's
#: ``retry_on_error`` too (``Redis._disconnect_raise``); from 6.0 on, its
#: ``Retry`` object alone decides (``Redis._close_connection`` only closes).
_RETRY_ON_ERROR_DECIDES = redis.__version__.startswith("5.")

_said: set[str] = set()


def install_problem(version: str | None = None) -> str | None:
    """Why the fast path may not rely on redis-py ``version`` (by default,
    the one imported) here; None when it is one it was tested with, with
    hiredis, on a platform with ``select.poll``."""
    version = redis.__version__ if version is None else version
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    numbers = tuple(int(n) for n in found.groups()) if found else ()
    if not numbers or numbers < OLDEST_TESTED or numbers[0] >= FIRST_UNTESTED_MAJOR:
        tested = f"{'.'.join(map(str, OLDEST_TESTED))} to {FIRST_UNTESTED_MAJOR - 1}.x"
        return f"redis-py {version} is not a version it was tested with ({tested})"
    if Reader is None:
        return "hiredis is not installed (pip install 'redis[hiredis]')"
    if not hasattr(select, "poll"):
        return "this platform has no select.poll"
    return None


def connection_problem(conn: Any) -> str | None:
    """Why the fast path may not drive ``conn``, an open connection with no
    reply pending; None when it has all the lean round trip reads."""
    parser = getattr(conn, "_parser", None)
    reader: Any = getattr(parser, "_reader", None)
    if not isinstance(getattr(conn, "_sock", None), socket.socket):
        return f"{type(conn).__name__} has no _sock socket"
    if type(reader) is not Reader:
        return f"{type(conn).__name__}'s parser ({type(parser).__name__}) has no hiredis _reader"
    if type(getattr(parser, "_buffer", None)) is not bytearray:
        return f"{type(conn).__name__}'s parser has no _buffer bytearray"
    if not all(hasattr(conn, name) for name in ("health_check_interval", "next_health_check", "retry")):
        return f"{type(conn).__name__} has no health_check_interval, next_health_check or retry"
    idle = reader.gets()  # nothing fed since its last reply: the marker, and nothing is consumed
    if idle is not NOT_ENOUGH_DATA:
        return f"an idle hiredis reader gives {idle!r:.40}, not redis-py's NOT_ENOUGH_DATA"
    return None


def say_once(problem: str) -> None:
    """Logs once per process why ``.delay()``'s push and the fetch call take
    redis-py's public API."""
    if problem not in _said:
        _said.add(problem)
        logger.info("cogworker's fast path is off, redis-py's public API is used: %s", problem)


def resend_as_redis_py_would(conn: Any, args: tuple[Any, ...], error: redis.RedisError) -> Any:
    """The reply to ``args`` sent again on ``conn`` as many times as
    redis-py's retry rule for this connection would after ``error`` (met
    once the command's bytes may have reached Redis); ``error``, or the
    last one, raised when it would not. ``conn`` is closed before each
    try and on the way out with an error, as redis-py closes its own."""
    pending = [error]

    def attempt() -> Any:
        if pending:
            raise pending.pop()  # the send already made, counted as redis-py counts its first
        conn.send_command(*args)
        return conn.read_response()

    def failed(exc: Exception, *_: Any) -> None:
        conn.disconnect()
        if _RETRY_ON_ERROR_DECIDES and not isinstance(exc, tuple(conn.retry_on_error or ())):
            raise exc

    try:
        return conn.retry.call_with_retry(attempt, failed)
    except BaseException:
        conn.disconnect()
        raise
