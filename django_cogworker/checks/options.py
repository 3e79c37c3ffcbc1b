"""Checks of ``REDIS_OPTIONS`` (E011) and ``SENTINEL_OPTIONS`` (E025): a
dict of keyword arguments of redis-py's client, each known to redis-py, and
the ones commonly set of the type they take. Passed through unchecked, a
mistyped name or a string timeout fails only when the first connection is
made, as a 500 of every page. A value is never shown, only its type: it may
be a password."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import redis
import redis.cluster
from django.core.checks import CheckMessage

from django_cogworker.checks.base import error, is_number, is_whole, unknown_names

HINT = "Each is a keyword argument of redis-py's client (redis.Redis), of the type it takes."


def _positive_s(v: Any) -> bool:
    return v is None or (is_number(v) and v > 0)


def _text(v: Any) -> bool:
    return v is None or isinstance(v, str)


#: What the options commonly set must be: (what the message says, the test).
_SECONDS = ("a positive number of seconds or None", _positive_s)
_FLAG = ("True or False", lambda v: isinstance(v, bool))
_TEXT = ("a string or None", _text)
TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "socket_timeout": _SECONDS,
    "socket_connect_timeout": _SECONDS,
    "health_check_interval": ("a number of seconds >= 0", lambda v: is_number(v) and v >= 0),
    "max_connections": ("a whole number of at least 1, or None", lambda v: v is None or is_whole(v, 1)),
    "db": ("a whole number of at least 0", lambda v: is_whole(v, 0)),
    "port": ("a whole number of at least 1", lambda v: is_whole(v, 1)),
    "protocol": ("2, 3 or None", lambda v: v in (None, 2, 3) and not isinstance(v, bool)),
    **dict.fromkeys(
        ("socket_keepalive", "retry_on_timeout", "ssl", "ssl_check_hostname", "decode_responses"), _FLAG
    ),
    **dict.fromkeys(
        (
            "host",
            "username",
            "password",
            "client_name",
            "unix_socket_path",
            "encoding",
            "encoding_errors",
            "ssl_keyfile",
            "ssl_certfile",
            "ssl_ca_certs",
            "ssl_ca_path",
            "ssl_ca_data",
            "ssl_password",
        ),
        _TEXT,
    ),
}


@functools.cache
def known() -> tuple[str, ...]:
    """The keyword arguments of the installed redis-py's client: those of
    ``Redis()``, of its connection pool (``connection_class``) and of
    ``RedisCluster()`` (a ``redis+cluster://`` URL passes them there)."""
    names = {"connection_class"}
    for function in (redis.Redis.__init__, redis.cluster.RedisCluster.__init__):
        for p in inspect.signature(function).parameters.values():
            if p.kind is p.POSITIONAL_OR_KEYWORD or p.kind is p.KEYWORD_ONLY:
                names.add(p.name)
    names.update(redis.cluster.REDIS_ALLOWED_KEYS)
    names.discard("self")
    return tuple(sorted(names))


def check_options(key: str, value: object, id_: str, what: str, example: str) -> list[CheckMessage]:
    """The errors of ``COGWORKER[key]``, a dict of keyword arguments ``what``
    ("of redis-py", "of redis-py for the connections to the sentinels")."""
    if not isinstance(value, dict):
        return [
            error(
                f"COGWORKER[{key!r}] must be a dict of redis-py keyword arguments{what}, "
                f"got a value of type {type(value).__name__}.",
                f"For example {example}.",
                id_,
            )
        ]
    errors: list[CheckMessage] = []
    names = known()
    for name, ending in unknown_names(value, names):
        errors.append(
            error(
                f"COGWORKER[{key!r}][{name!r}] is not a keyword argument of redis-py's client{ending}",
                HINT,
                id_,
            )
        )
    for name, option in value.items():
        rule = TYPES.get(name) if isinstance(name, str) else None
        if rule is not None and not rule[1](option):
            got = f"got a value of type {type(option).__name__}"
            errors.append(error(f"COGWORKER[{key!r}][{name!r}] must be {rule[0]}, {got}.", HINT, id_))
    return errors
