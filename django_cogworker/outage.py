"""One process's view of a Redis outage: one line when it starts, one when it ends.

Every role of a worker process (processors, heartbeat, poller, periodic
ticker, housekeeper) meets the same outage at about the same moment. Each
reports its failures and successes here instead of logging them itself, so
an outage costs the log two lines per process, however long it lasts and
however many passes fail meanwhile (SPEC section 8), and none of them
carries a traceback: an unreachable server is a state, not a bug.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from django_cogworker.connection import forget_demoted_master
from django_cogworker.errors import is_unavailable

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
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic clock; None while Redis answers
        self._last_failure = 0.0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> bool:
        """Reports a failed call. Returns whether it was an outage (then it
        is logged here, once per outage); any other error is the caller's
        to log."""
        if not is_outage(exc):
            return False
        forget_demoted_master(exc)
        with self._lock:
            self._last_failure = time.monotonic()
            first = self._since is None
            if first:
                self._since = self._last_failure
        if first:
            logger.error(
                "Redis %s (%s: %s); retrying with backoff, this process logs again when it is back",
                "unreachable" if isinstance(exc, UNREACHABLE) else "has no master",
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
