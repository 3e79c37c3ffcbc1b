"""One process's view of a Redis outage: one line when it starts, one when it ends.

Every role of a worker process (processors, heartbeat, poller, periodic
ticker, housekeeper) meets the same outage at about the same moment. Each
reports its failures and successes here instead of logging them itself, so
an outage costs the log two lines per process, however long it lasts and
however many passes fail meanwhile (SPEC section 8), and none of them
carries a traceback: an unreachable server is a state, not a bug.

A full Redis (``maxmemory`` reached, with ``noeviction``) is a state too,
and no outage: the workers go on taking and finishing jobs, each of which
frees memory. It is said once when it starts ("Redis is full", with the
figures) and once when it ends; the heartbeat decides both, as every beat
finds out whether Redis refused its writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from django_cogworker.connection import forget_demoted_master
from django_cogworker.errors import full_message, is_full, is_pool_exhausted, is_unavailable, refusal

logger = logging.getLogger("django_cogworker")

#: An outage ends at the first success this long after the last failure:
#: while one role still fails (its connection broken, the others' not),
#: another's success must not end it and start it again at every pass.
SETTLE_S = 1.0

UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis unable to take commands (unreachable, or no
    master during a failover: :func:`django_cogworker.errors.is_unavailable`)
    rather than a failing command."""
    return is_unavailable(exc)


class Outage:
    def __init__(self, figures: Callable[[], tuple[int, int] | None] | None = None) -> None:
        """``figures()``: Redis's used memory and maxmemory, for the line
        that says it is full (:func:`django_cogworker.connection.memory`)."""
        self._figures = figures
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic clock; None while Redis answers
        self._last_failure = 0.0
        self._full_since: float | None = None  # monotonic clock; None while Redis has room
        self._pool_exhausted_said = False

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    @property
    def full(self) -> bool:
        return self._full_since is not None

    def failed(self, exc: BaseException) -> bool:
        """Reports a failed call. Returns whether it was an outage or a full
        Redis (then it is logged here, once per outage or fill); any other
        error is the caller's to log."""
        if is_full(exc):
            self.filled()
            return True
        if is_pool_exhausted(exc):
            if not self._pool_exhausted_said:
                self._pool_exhausted_said = True
                logger.error(
                    "every connection of this process's Redis pool is in use (%s): Redis itself answers; "
                    "raise max_connections in REDIS_OPTIONS (see docs/settings.md)",
                    exc,
                )
            return True
        if not is_outage(exc):
            return False
        forget_demoted_master(exc)
        with self._lock:
            self._last_failure = time.monotonic()
            first = self._since is None
            if first:
                self._since = self._last_failure
        if first:
            # A refusal here is a password changed under a running worker.
            what = refusal(exc) or (
                "Redis unreachable" if isinstance(exc, UNREACHABLE) else "Redis has no master"
            )
            logger.error(
                "%s (%s: %s); retrying with backoff, this process logs again when it is back",
                what,
                type(exc).__name__,
                exc,
            )
        return True

    def succeeded(self) -> None:
        """Reports a call that reached Redis (cheap when there is no outage)."""
        if self._since is None:
            return
        with self._lock:
            since = self._since
            if since is None or time.monotonic() - self._last_failure < SETTLE_S:
                return
            self._since = None
            logger.warning("Redis reachable again after %.1fs; processing resumed", time.monotonic() - since)

    def filled(self) -> None:
        """Reports that Redis refused a write for want of memory (logged once)."""
        with self._lock:
            if self._full_since is not None:
                return
            self._full_since = time.monotonic()
        found = self._figures() if self._figures is not None else None
        logger.error(
            "%s; this worker goes on taking and finishing jobs, which frees memory "
            "(raise maxmemory, or clear the dead set, to make room sooner)",
            full_message(*(found or (None, None))),
        )

    def has_room(self) -> None:
        """Reports a write Redis took that it refuses when full (the heartbeat's)."""
        if self._full_since is None:
            return
        with self._lock:
            since, self._full_since = self._full_since, None
        if since is not None:
            logger.warning(
                "Redis has room again after %.1fs full; new jobs are accepted", time.monotonic() - since
            )
