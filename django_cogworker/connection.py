"""The Redis connection: from ``REDIS_URL``, a django-redis cache alias, or
the embedded server.

One client per process (redis-py's pool is thread-safe and re-made after a
fork); a ``redis.asyncio`` client per call for async callers
(:func:`async_redis`). Both are made by :func:`build`, the one place that
reads ``REDIS_URL``, ``CACHE_ALIAS`` and ``REDIS_OPTIONS``. Payloads are
bytes end to end (``decode_responses`` off): a payload that is not valid
UTF-8 must still be moved and filed byte for byte (G13).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio

from django_cogworker.conf import Config, get_config
from django_cogworker.errors import ConfigurationError
from django_cogworker.keys import Keys, keys

#: redis-py's annotations describe a client that decodes responses to str;
#: ours returns bytes, so the client is typed loosely rather than wrongly.
Client = Any

_lock = threading.Lock()
_client: Client | None = None


def get_redis() -> Client:
    """The process's Redis client for the current settings."""
    global _client
    client = _client
    if client is not None:
        return client
    with _lock:
        if _client is None:
            _client = build(get_config())
        return _client


def get_keys() -> Keys:
    return keys(get_config().namespace)


def reset() -> None:
    """Forget the client (settings changed); the next call builds a new one."""
    global _client
    with _lock:
        old, _client = _client, None
    if old is not None:
        with contextlib.suppress(Exception):
            old.close()


#: redis-py pings a connection idle this long before using it, so that one
#: cut while idle (a firewall, a Redis restart) fails the ping, not a command.
HEALTH_CHECK_INTERVAL_S = 30


def build(config: Config, *, async_client: bool = False) -> Client:
    """A new client for ``config``; ``async_client``: a ``redis.asyncio`` one.

    May start the embedded server (a blocking call: async callers use
    :func:`async_redis`). An async client cannot come from ``CACHE_ALIAS``:
    django-redis is synchronous, so its callers take the synchronous path."""
    if config.cache_alias:
        if async_client:
            raise ConfigurationError(
                f"COGWORKER['CACHE_ALIAS'] = {config.cache_alias!r}: django-redis has no asyncio client; "
                "call the synchronous API (in a thread: asgiref's sync_to_async)."
            )
        return _from_cache(config.cache_alias)
    options: dict[str, Any] = {"health_check_interval": HEALTH_CHECK_INTERVAL_S, **config.redis_options}
    options["decode_responses"] = False
    cls = redis.asyncio.Redis if async_client else redis.Redis
    if config.redis_url == "embedded":
        from django_cogworker import embedded

        return cls(unix_socket_path=embedded.ensure_running(config.embedded_dir), **options)
    return cls.from_url(config.redis_url, **options)


@contextlib.asynccontextmanager
async def async_redis() -> AsyncIterator[redis.asyncio.Redis]:
    """A ``redis.asyncio`` client for this call, closed after it (a client
    belongs to one event loop; callers' loops come and go)."""
    config = get_config()
    if config.redis_url == "embedded":
        # Starting or probing the embedded server blocks: not on the event
        # loop. The client binds to a loop only when first used.
        conn = await asyncio.to_thread(build, config, async_client=True)
    else:
        conn = build(config, async_client=True)
    try:
        yield conn
    finally:
        await conn.aclose()


def _from_cache(alias: str) -> Client:
    from django_redis import get_redis_connection

    client = get_redis_connection(alias)
    # django-redis clients normally keep bytes already; a decoding client
    # would corrupt payloads that are not UTF-8.
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("decode_responses"):
        raise ConfigurationError(
            f"COGWORKER['CACHE_ALIAS'] = {alias!r}: that cache decodes responses; "
            "cogworker needs a client with decode_responses off."
        )
    return client
