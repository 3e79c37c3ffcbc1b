"""Expiring jobs (``@job(expires=...)``, SPEC section 14): a job not started
within ``expires`` seconds of when it was due is dropped, never run.

Duties:

- the deadline a payload carries, ``expires_at``: epoch seconds on Redis's
  clock (the due time, ``delay_in``/``delay_at``'s or the enqueue's, plus
  ``expires``), so that no producer's or worker's clock decides;
- :data:`clock`, this process's view of Redis's clock: the offset of the
  local clock from Redis's ``TIME``. A worker learns it from every beat
  (``heartbeat.lua`` returns its ``TIME``), so its checks cost no round
  trip; a producer asks ``TIME`` once, when it first enqueues an expiring
  job, and again after ``CLOCK_REFRESH_S`` (plain jobs never ask);
- :func:`drop`, the one way an expired job leaves: counted in
  ``N:stat:expired`` and, per job name, ``N:stat:expired:jobs`` (the
  Prometheus ``cogworker_expired_total{job}``), logged at INFO, its unique
  lock released. The checks are the poller's (``Poller.prepare``), the
  start of a run (``Processor.process``) and a retry's
  (``execution.failure``: a retry due after the deadline is not filed).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from django_cogworker import locks
from django_cogworker.keys import Keys
from django_cogworker.payload import Payload

logger = logging.getLogger("django_cogworker")

#: How long a producer trusts the offset it measured before asking ``TIME``
#: again: clocks drift by well under a millisecond in that time, and NTP's
#: steps are what the refresh catches.
CLOCK_REFRESH_S = 300.0

FIELD = "expires_at"


def is_expires(value: object) -> bool:
    """Whether ``value`` is a valid ``expires``: a positive, finite number
    of seconds (None: the job does not expire)."""
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


class RedisClock:
    """The offset of this process's clock from Redis's (``TIME``)."""

    def __init__(self) -> None:
        #: (offset s, monotonic time it was measured); one attribute, so a
        #: thread reads the two together.
        self.measured: tuple[float, float] | None = None

    def observe(self, redis_now: float, sent_at: float, received_at: float) -> None:
        """``redis_now``, read by Redis between the local readings
        ``sent_at`` and ``received_at`` (the middle is the best guess)."""
        self.measured = (redis_now - (sent_at + received_at) / 2, time.monotonic())

    def offset_s(self, client: Any) -> float:
        """Redis's clock minus this one's; ``TIME`` asked when unknown or stale."""
        measured = self.measured
        if measured is None or time.monotonic() - measured[1] > CLOCK_REFRESH_S:
            sent = time.time()
            seconds, micros = client.time()
            self.observe(seconds + micros / 1_000_000, sent, time.time())
            measured = self.measured
            assert measured is not None
        return measured[0]

    def now(self, client: Any) -> float:
        """Redis's time now, as epoch seconds."""
        return time.time() + self.offset_s(client)


clock = RedisClock()


def deadline(client: Any, expires_s: float, due: float | None) -> float:
    """``expires_at`` for a job due at ``due`` (epoch seconds on this
    process's clock; None: now), on Redis's clock."""
    return (time.time() if due is None else due) + clock.offset_s(client) + expires_s


def expired(payload: Payload, redis_now: float) -> bool:
    """Whether the payload's deadline has passed at ``redis_now``."""
    at = payload.get(FIELD)
    return isinstance(at, int | float) and not isinstance(at, bool) and redis_now > at


def too_late(payload: Payload, client: Any, delay_s: float) -> bool:
    """Whether a retry ``delay_s`` from now would be due after the deadline."""
    return FIELD in payload and expired(payload, clock.now(client) + delay_s)


def drop(client: Any, keys: Keys, payloads: Iterable[Payload], where: str, *, unlock: bool = True) -> None:
    """Records expired jobs that will not run: the counters, an INFO line
    each, their unique locks released (``unlock=False``: the caller's
    server middleware releases it). Never raises: a counter lost to an
    outage is logged, the jobs are dropped all the same."""
    payloads = list(payloads)
    if not payloads:
        return
    for p in payloads:
        logger.info("jid=%s %s expired (%s): dropped", p.get("jid"), p.get("job"), where)
    try:
        # The locks first: whoever sees a job counted as expired can take
        # an identical one again.
        if unlock:
            for p in payloads:
                d, jid = p.get("unique_digest"), p.get("jid")
                if isinstance(d, str) and d and isinstance(jid, str) and jid:
                    locks.release_owned(client, keys.for_payload(p).unique(d), jid)
        pipe = client.pipeline(transaction=False)
        pipe.incrby(keys.stat_expired, len(payloads))
        for name, n in Counter(str(p.get("job")) for p in payloads).items():
            pipe.hincrby(keys.stat_expired_jobs, name, n)
        pipe.execute()
    except Exception as exc:
        logger.error("could not record %d expired job(s): %s: %s", len(payloads), type(exc).__name__, exc)
