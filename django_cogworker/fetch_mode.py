"""Choosing the fetch strategy of a process (G10).

Duties: reliable fetch unless the setting says basic or the server cannot
do it (older than 6.2, or BLMOVE/LPOS renamed or disabled: a logged
warning, then basic); a connection error while checking is not an answer;
one way back to basic when the server refuses a command at run time. The
holder is the one source of truth of the fetch mode, and holds the process's
acks (``acks.Acks``) across a change of fetcher.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

from django_cogworker.acks import Acks
from django_cogworker.connection import is_cluster
from django_cogworker.errors import is_unavailable
from django_cogworker.fetch import STRATEGIES, BasicFetch, FetchContext, Fetcher

logger = logging.getLogger("django_cogworker")

MIN_REDIS_VERSION = (6, 2)


def reliable_supported(client: Any) -> bool:
    """Whether the server can do reliable fetch: >= 6.2, and BLMOVE and LPOS
    not renamed or disabled. A connection error propagates: not an answer,
    so the caller asks again later instead of remembering a guess."""
    try:
        version = client.info("server").get("redis_version", "")
        parts = tuple(int(p) for p in str(version).split(".")[:2])
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        if is_unavailable(exc):
            raise
        parts = MIN_REDIS_VERSION  # INFO restricted: assume current; runtime errors still catch it
    except ValueError:
        parts = MIN_REDIS_VERSION  # INFO restricted: assume current; runtime errors still catch it
    if parts < MIN_REDIS_VERSION:
        return False
    try:
        # One argument "COMMAND INFO", not two: redis-py parses the reply of
        # "COMMAND" and fails (TypeError) on the nil entry a renamed or
        # disabled command gets, so the check would never get an answer.
        # On a cluster: any node answers for all (a command without keys
        # has no slot to route by).
        route = {"target_nodes": client.get_default_node()} if is_cluster(client) else {}
        found = client.execute_command("COMMAND INFO", "BLMOVE", "LPOS", **route)
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        if is_unavailable(exc):
            raise
        return True
    return all(entry for entry in found)


class Fetching:
    """The process's fetch strategy, chosen once (G10): reliable unless the
    setting says basic or the server cannot do it; one way back to basic
    when the server refuses a command at run time. The one source of truth
    of the fetch mode."""

    def __init__(self, ctx: FetchContext, mode: str) -> None:
        self.ctx = ctx
        self.wanted = mode
        self.acks = Acks(ctx.ledger)
        self._lock = threading.Lock()
        self._fetcher: Fetcher | None = None

    def current(self) -> Fetcher:
        fetcher = self._fetcher
        if fetcher is not None:
            return fetcher
        with self._lock:
            if self._fetcher is None:
                self._fetcher = self._choose()
            return self._fetcher

    def peek(self) -> Fetcher | None:
        return self._fetcher

    @property
    def mode(self) -> str:
        fetcher = self._fetcher
        return fetcher.name if fetcher is not None else self.wanted

    @property
    def reliable(self) -> bool:
        return STRATEGIES[self.mode].reliable

    def _choose(self) -> Fetcher:
        if not STRATEGIES[self.wanted].reliable:
            return STRATEGIES[self.wanted](self.ctx, self.acks)
        # A connection error propagates (the processor backs off and asks
        # again): a guess made while Redis is unreachable is not an answer.
        if reliable_supported(self.ctx.client):
            return STRATEGIES[self.wanted](self.ctx, self.acks)
        logger.warning(
            "this Redis server cannot do reliable fetch (it needs Redis >= 6.2 with BLMOVE and LPOS); "
            "falling back to basic fetch: a worker killed mid-job loses the jobs it held"
        )
        return BasicFetch(self.ctx, self.acks)

    def fall_back(self, reason: str) -> None:
        with self._lock:
            if isinstance(self._fetcher, BasicFetch):
                return
            logger.warning("reliable fetch refused by the server (%s); falling back to basic fetch", reason)
            self._fetcher = BasicFetch(self.ctx, self.acks)
