"""The client of a ``redis+sentinel://`` URL: the master of a service,
found through the sentinels (SPEC section 11, G15).

Duties: give the connections to the sentinels their options
(``SENTINEL_OPTIONS`` over the ``socket_*`` ones of ``REDIS_OPTIONS``), and
bound one discovery of the master, however many sentinels fail to answer,
by :data:`SENTINEL_DISCOVERY_TIMEOUT_S`, its failure said in one line that
names the sentinels asked; follow a master that changed
(:func:`follow_master`, G15). :mod:`django_cogworker.connection` makes the
client here.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.retry
import redis.sentinel
from redis.backoff import NoBackoff

from django_cogworker import redis_url

logger = logging.getLogger("django_cogworker")

#: Timeouts of the connections to the sentinels when SENTINEL_OPTIONS sets
#: none: a sentinel that does not answer must not hold up the discovery of
#: the master through the others.
SENTINEL_SOCKET_TIMEOUT_S = 2.0

#: The longest one discovery of the master may take, asking each sentinel
#: in turn, once: each sentinel's timeouts are cut to its share of it, and
#: redis-py's retries of a sentinel connection (seconds of backoff each) are
#: off unless SENTINEL_OPTIONS sets ``retry``. Within the probe timeout of
#: ``cogworker_status``, and what ``.delay()`` waits at most before
#: RedisUnavailable when no sentinel answers.
SENTINEL_DISCOVERY_TIMEOUT_S = 4.0


def master(
    target: redis_url.Target,
    options: dict[str, Any],
    sentinel_options: dict[str, Any],
    credentials: dict[str, Any],
    async_client: bool,
) -> Any:
    """The master of ``target.service``, found through the sentinels. redis-py's
    Sentinel pool asks the sentinels again after a connection error and
    turns a READONLY reply of a demoted master into one, so a failover is
    an outage of a few seconds for every caller, not a wrong answer."""
    sentinel_kwargs = redis_url.Options(
        {
            "socket_timeout": SENTINEL_SOCKET_TIMEOUT_S,
            "socket_connect_timeout": SENTINEL_SOCKET_TIMEOUT_S,
            **{k: v for k, v in options.items() if k.startswith("socket_")},
            "retry": (redis.asyncio.retry.Retry if async_client else redis.retry.Retry)(NoBackoff(), 0),
            **sentinel_options,
        }
    )
    share_s = SENTINEL_DISCOVERY_TIMEOUT_S / len(target.hosts)
    for name in ("socket_timeout", "socket_connect_timeout"):
        given = sentinel_kwargs.get(name)
        sentinel_kwargs[name] = share_s if given is None else min(given, share_s)
    cls = redis.asyncio.Redis if async_client else redis.Redis
    manager: Any = (_AsyncSentinel if async_client else _Sentinel)(
        list(target.hosts),
        sentinel_kwargs=sentinel_kwargs,
        **{**options, **credentials, "db": target.db},
    )
    return manager.master_for(target.service, redis_class=cls)


#: How often a Sentinel client asks the sentinels who the master is, at most
#: (from the heartbeat, and before an enqueue).
MASTER_CHECK_INTERVAL_S = 1.0

_masters: dict[int, tuple[Any, float]] = {}  # id(pool) -> (address, monotonic time asked)
_masters_lock = threading.Lock()


def follow_master(client: Any) -> None:
    """For a Sentinel client: asks the sentinels who the master is (once a
    second at most) and, when that changed, drops every pooled connection,
    in use or not, so that the next command goes to the new master.

    Without this the client would stay on a demoted master as long as it
    answers: after a planned failover (``SENTINEL FAILOVER``) the old master
    keeps taking writes for several seconds before the sentinels turn it
    into a replica, and the writes it took then are lost with its data."""
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, redis.sentinel.SentinelConnectionPool):
        return
    now = time.monotonic()
    with _masters_lock:
        known = _masters.get(id(pool))
        if known is not None and now - known[1] < MASTER_CHECK_INTERVAL_S:
            return
        _masters[id(pool)] = (known[0] if known else None, now)
    found = pool.get_master_address()  # raises MasterNotFoundError (an outage) when none is known
    with _masters_lock:
        _masters[id(pool)] = (found, now)
    if known is not None and known[0] is not None and found != known[0]:
        pool.disconnect()
        logger.warning(
            "Sentinel: the master of %r is now %s:%s (was %s:%s); reconnected",
            pool.service_name,
            *found,
            *known[0],
        )


def close(pool: Any) -> None:
    """Closes a Sentinel client's pool and its connections to the sentinels:
    the pool was handed to the client (``master_for``), so the client's
    ``close()`` alone leaves them open."""
    with contextlib.suppress(Exception):
        pool.disconnect()
    for sentinel in pool.sentinel_manager.sentinels:
        with contextlib.suppress(Exception):
            sentinel.close()


async def aclose(pool: Any) -> None:
    """:func:`close` for a ``redis.asyncio`` Sentinel pool."""
    with contextlib.suppress(Exception):
        await pool.disconnect()
    for sentinel in pool.sentinel_manager.sentinels:
        with contextlib.suppress(Exception):
            await sentinel.aclose()


def _no_master(sentinels: list[Any], service: str) -> str:
    """One line for redis-py's MasterNotFoundError, whose text holds the
    repr of every sentinel client (3 KB for three): the sentinels asked."""
    kwargs = [s.connection_pool.connection_kwargs for s in sentinels]
    asked = ", ".join(f"{k.get('host')}:{k.get('port')}" for k in kwargs)
    return (
        f"no sentinel named a master for {service!r} (asked {asked}, each once, "
        f"within {SENTINEL_DISCOVERY_TIMEOUT_S:g}s)"
    )


class _Sentinel(redis.sentinel.Sentinel):
    def discover_master(self, service_name: str) -> Any:
        try:
            return super().discover_master(service_name)
        except redis.sentinel.MasterNotFoundError:
            raise redis.sentinel.MasterNotFoundError(_no_master(self.sentinels, service_name)) from None


class _AsyncSentinel(redis.asyncio.sentinel.Sentinel):
    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)
        except redis.asyncio.sentinel.MasterNotFoundError:
            raise redis.asyncio.sentinel.MasterNotFoundError(
                _no_master(self.sentinels, service_name)
            ) from None
