"""The Redis connection: from ``REDIS_URL``, a django-redis cache alias, or
the embedded server.

One client per process (redis-py's pool is thread-safe and re-made after a
fork). Payloads are bytes end to end (``decode_responses`` off): a payload
that is not valid UTF-8 must still be moved and filed byte for byte (G13).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import redis

from django_cogworker.conf import get_config
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
            _client = _build()
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


def _build() -> Client:
    config = get_config()
    if config.cache_alias:
        return _from_cache(config.cache_alias)
    options: dict[str, Any] = {"health_check_interval": 30, **config.redis_options}
    options["decode_responses"] = False
    if config.redis_url == "embedded":
        from django_cogworker import embedded

        return redis.Redis(unix_socket_path=embedded.ensure_running(config.embedded_dir), **options)
    return redis.Redis.from_url(config.redis_url, **options)


def _from_cache(alias: str) -> Client:
    from django_redis import get_redis_connection

    client = get_redis_connection(alias)
    # django-redis clients normally keep bytes already; a decoding client
    # would corrupt payloads that are not UTF-8.
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("decode_responses"):
        from django_cogworker.errors import ConfigurationError

        raise ConfigurationError(
            f"COGWORKER['CACHE_ALIAS'] = {alias!r}: that cache decodes responses; "
            "cogworker needs a client with decode_responses off."
        )
    return client
