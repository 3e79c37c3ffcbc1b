"""The Redis connection: from ``REDIS_URL`` (one server, Sentinel, or a
Redis Cluster: :mod:`django_cogworker.redis_url`), a django-redis cache
alias, or the embedded server.

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
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from django.core.signals import setting_changed

from django_cogworker import direct, errors, redis_url
from django_cogworker.backoff import Backoff
from django_cogworker.conf import Config, get_config
from django_cogworker.errors import ConfigurationError, RedisUnavailable, is_unavailable
from django_cogworker.keys import Keys, keys_of

logger = logging.getLogger("django_cogworker")

#: redis-py's annotations describe a client that decodes responses to str;
#: ours returns bytes, so the client is typed loosely rather than wrongly.
Client = Any

_lock = threading.Lock()
_client: Client | None = None
#: Whether ``_client`` is a Sentinel client (:func:`get_master`).
_following = False


def get_redis() -> Client:
    """The process's Redis client for the current settings."""
    global _client, _following
    client = _client
    if client is not None:
        return client
    with _lock:
        if _client is None:
            client = build(get_config())
            _following = is_sentinel(client)  # first: get_master reads them without the lock
            _client = client
        return _client


def get_master() -> Client:
    """:func:`get_redis`'s client, ready to write: for a Sentinel client,
    once it has :func:`follow_master`. One call for ``.delay()``, which
    runs it cold after each pause."""
    client = _client
    if client is None:
        client = get_redis()
    if _following:
        follow_master(client)
    return client


def get_keys() -> Keys:
    config = get_config()
    if not config.sharding:
        return keys_of(config.namespace)
    from django_cogworker.layouts import keys  # loaded under SHARDING only

    return keys(config.namespace, config.queue_groups)


def is_sentinel(client: Any) -> bool:
    """Whether ``client`` is a Sentinel client (its master may change)."""
    return isinstance(getattr(client, "connection_pool", None), redis.sentinel.SentinelConnectionPool)


def follow_master(client: Any) -> None:
    """:func:`.sentinel.follow_master` for a Sentinel client; nothing else."""
    if is_sentinel(client):
        from django_cogworker import sentinel  # loaded for Sentinel only

        sentinel.follow_master(client)


def reset() -> None:
    """Forget the client (settings changed); the next call builds a new one."""
    global _client
    with _lock:
        old, _client = _client, None
    if old is not None:
        close(old)
        direct.drop_idle()  # .delay()'s own connections, like the old pool's


def close(client: Client) -> None:
    """Closes ``client`` and its connections (Sentinel's: :func:`.sentinel.close`)."""
    with contextlib.suppress(Exception):
        client.close()
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        from django_cogworker import sentinel  # loaded for Sentinel only

        sentinel.close(pool)


async def aclose(client: Client) -> None:
    """:func:`close` for a ``redis.asyncio`` client."""
    with contextlib.suppress(Exception):
        await client.aclose()
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool):
        from django_cogworker import sentinel

        await sentinel.aclose(pool)


#: redis-py pings a connection idle this long before using it, so that one
#: cut while idle (a firewall, a Redis restart) fails the ping, not a command.
HEALTH_CHECK_INTERVAL_S = 30

#: The buffer each connection reads replies into, held for its life: the
#: size of Python's own buffered sockets (``io.DEFAULT_BUFFER_SIZE``), which
#: holds a fetch's jobs in one read, where redis-py's 32 KiB took 0.3 MB in
#: a worker's dozen connections (docs/performance.md, "Memory").
SOCKET_READ_SIZE_BYTES = 8192


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
    # Options, not a dict: the locals of a failure print it (its secrets redacted).
    options = redis_url.Options(
        {
            "health_check_interval": HEALTH_CHECK_INTERVAL_S,
            "socket_read_size": SOCKET_READ_SIZE_BYTES,
            **config.redis_options,
        }
    )
    options["decode_responses"] = False
    try:
        target = redis_url.parse(config.redis_url)
    except ValueError as exc:
        raise ConfigurationError(f"COGWORKER['REDIS_URL']: {exc}") from None
    if target.kind == redis_url.SENTINEL:
        from django_cogworker import sentinel

        return sentinel.master(target, options, config.sentinel_options, _credentials(target), async_client)
    if target.kind == redis_url.CLUSTER:
        return _cluster(target, options, async_client)
    cls = redis.asyncio.Redis if async_client else redis.Redis
    if target.kind == redis_url.EMBEDDED:
        from django_cogworker import embedded

        return cls(unix_socket_path=embedded.ensure_running(config.embedded_dir), **options)
    return cls.from_url(config.redis_url, **options)


def _credentials(target: redis_url.Target) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if target.username:
        found["username"] = target.username
    if target.password is not None:
        found["password"] = target.password
    if target.tls:
        found["ssl"] = True
    return found


def _cluster(target: redis_url.Target, options: dict[str, Any], async_client: bool) -> Client:
    # The URL's credentials win over REDIS_OPTIONS', as for a Sentinel URL
    # (given both, RedisCluster would raise a TypeError).
    kwargs = redis_url.Options({**options, **_credentials(target)})
    if async_client:
        nodes: list[Any] = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in target.hosts]
        return redis.asyncio.RedisCluster(startup_nodes=nodes, **kwargs)
    return redis.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in target.hosts], **kwargs
    )


#: The longest pause between two tries to make the client at a worker's boot.
BOOT_RETRY_MAX_S = 5.0


def wait_for_client(stop: threading.Event) -> bool:
    """At a worker's boot: makes the process client, trying again with
    backoff while Redis cannot be reached; False when ``stop`` was set
    meanwhile. Only a Redis Cluster client connects as it is made (it asks
    its startup nodes for the slots); the others connect at their first
    command, whose failures the worker's first beat waits out the same way.
    Without this, a worker started while no node answers (a cluster
    restarting) would exit, and its pod restart in a loop."""
    pauses = Backoff(max_s=BOOT_RETRY_MAX_S)
    told = False
    while True:
        try:
            get_redis()
            if told:
                logger.warning("Redis at %s answers; starting", describe(get_config()))
            return True
        except Exception as exc:
            if not (is_unavailable(exc) or isinstance(exc, RedisUnavailable)):
                raise
            if not told:
                told = True
                logger.error(
                    "cogworker waits for Redis at %s (%s: %s); retrying with backoff, "
                    "work starts when it answers",
                    describe(get_config()),
                    type(exc).__name__,
                    exc,
                )
        if stop.wait(pauses.next_s()):
            return False


def describe(config: Config) -> str:
    """Where ``config`` reaches Redis, for log lines: the URL with its
    password masked, or the cache alias."""
    if config.cache_alias:
        return f"cache alias {config.cache_alias!r}"
    return redis_url.masked(config.redis_url)


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster (sync or asyncio)."""
    return isinstance(client, redis.RedisCluster | redis.asyncio.RedisCluster)


def forget_demoted_master(exc: BaseException) -> None:
    """After a READONLY reply (the server behind a plain URL became a
    replica: a failover behind a DNS name or a managed endpoint), drops the
    process client's pooled connections and ``.delay()``'s own (``direct``),
    so the next ones resolve the address again and reach the new master.
    Sentinel and Cluster clients find the master themselves. Called at every
    ``errors.redis_boundary`` (registered below) and by the worker's outage."""
    client = _client
    if isinstance(exc, redis.ReadOnlyError) and client is not None and not is_cluster(client):
        with contextlib.suppress(Exception):
            client.connection_pool.disconnect()
        with contextlib.suppress(Exception):
            direct.drop_idle()


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "COGWORKER":
        reset()


# The connection reacts to what the settings and the errors say; neither
# of them imports it (conf.py clears its own cache on the same signal).
setting_changed.connect(_settings_changed, dispatch_uid="django_cogworker.connection")
errors.react_with(forget_demoted_master)


def memory(client: Client) -> tuple[int, int] | None:
    """Redis's ``used_memory`` and ``maxmemory`` (bytes; 0: no limit), or
    None when they cannot be read (INFO refused by an ACL, an outage): they
    only give figures to a message."""
    try:
        info = client.info("memory")
        return int(info["used_memory"]), int(info["maxmemory"])
    except Exception:
        return None


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
        await aclose(conn)


def _from_cache(alias: str) -> Client:
    from django_redis import get_redis_connection

    client = get_redis_connection(alias)
    if is_cluster(client):
        raise ConfigurationError(
            f"COGWORKER['CACHE_ALIAS'] = {alias!r} is a Redis Cluster client; cogworker does not take one "
            "from a cache. Set COGWORKER['REDIS_URL'] = 'redis+cluster://host:port,...' instead."
        )
    # django-redis clients normally keep bytes already; a decoding client
    # would corrupt payloads that are not UTF-8.
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("decode_responses"):
        raise ConfigurationError(
            f"COGWORKER['CACHE_ALIAS'] = {alias!r}: that cache decodes responses; "
            "cogworker needs a client with decode_responses off."
        )
    return client
