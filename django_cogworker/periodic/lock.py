"""The running lock of an ``until_executed`` entry: ``N:periodic:running:<pjid>`` = jid.

Duties:
- the lock is taken with the push of a slot (``periodic_enqueue.lua``, see
  :mod:`django_cogworker.periodic.enqueue`) for ``PERIODIC_QUEUED_TTL_S``
  (defined in :mod:`django_cogworker.requeue`, which re-takes it),
  so the next slot is skipped while a run is queued or running;
- :class:`PeriodicLockMiddleware` holds it around the run: extended to
  :func:`active_ttl_s` when the job starts, kept over a retry, released when
  the run ends for good;
- :data:`HELD`, the locks of the runs in this process, which the ticker
  extends during long runs;
- recovery and give-backs re-take it for the requeued run
  (:mod:`django_cogworker.requeue`, ``lua/lib/requeue_job.lua``), and a poison
  pill filed in dead releases it (:mod:`django_cogworker.locks`).

A run only ever takes a free lock, or extends or releases its own
(``periodic_hold.lua``, :func:`django_cogworker.locks.release_owned`): it
never touches the lock of another run.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from django_cogworker import locks
from django_cogworker.conf import Config, get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.keys import Keys
from django_cogworker.middleware import Result, ServerMiddleware
from django_cogworker.payload import Payload

# The running lock's TTL while its job waits in a queue: taken with the push,
# re-taken by the requeue that puts the job back. Defined with the requeue,
# which imports nothing of this package.
from django_cogworker.requeue import PERIODIC_QUEUED_TTL_S
from django_cogworker.scripts import script

logger = logging.getLogger("django_cogworker")

#: Floor of the running lock's TTL while its job runs. The lock must outlive
#: a SIGKILLed worker until recovery re-takes it (ORPHAN_THRESHOLD plus a
#: check interval), or the ticker could start the next slot beside the
#: recovered run: see :func:`active_ttl_s`.
ACTIVE_TTL_MIN_S = 600


def active_ttl_s(config: Config) -> int:
    """The running lock's TTL while its job runs: outlives the time recovery
    takes to notice a dead worker (see ACTIVE_TTL_MIN_S)."""
    recovery_s = 2 * (config.orphan_threshold_s + config.orphan_check_interval_s) + config.heartbeat_ttl_s
    return int(max(ACTIVE_TTL_MIN_S, recovery_s))


def hold(client: redis.Redis, keys: Keys, pjid: str, jid: str, ttl_s: float) -> bool:
    """Takes the running lock for ``jid`` if it is free, or extends it if
    ``jid`` owns it; never takes it from another run. True if ``jid`` holds it."""
    return bool(script("periodic_hold")(client, [keys.periodic_running(pjid)], [jid, max(1, int(ttl_s))]))


class HeldLocks:
    """The running locks of the jobs this process runs now (jid -> pjid), for
    the ticker to extend during long runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[str, int]] = {}

    def add(self, jid: str, pjid: str) -> None:
        with self._lock:
            _, count = self._runs.get(jid, (pjid, 0))
            self._runs[jid] = (pjid, count + 1)

    def remove(self, jid: str) -> None:
        with self._lock:
            pjid, count = self._runs.get(jid, ("", 0))
            if count <= 1:
                self._runs.pop(jid, None)
            else:
                self._runs[jid] = (pjid, count - 1)

    def snapshot(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(jid, pjid) for jid, (pjid, _) in self._runs.items()]

    def extend(self, client: redis.Redis, keys: Keys, ttl_s: float) -> int:
        """Extends every lock still owned by its run; returns how many."""
        extended = 0
        for jid, pjid in self.snapshot():
            try:
                extended += hold(client, keys, pjid, jid, ttl_s)
            except Exception as exc:
                logger.error("could not extend the running lock of jid=%s: %s", jid, exc)
        return extended


#: The process's one registry. Module-level because its two users never
#: meet: the middleware chain builds :class:`PeriodicLockMiddleware` from its
#: dotted path, without arguments, in every job's thread, and the launcher
#: builds the :class:`~django_cogworker.periodic.ticker.Ticker` that extends
#: the locks it lists.
HELD = HeldLocks()


def _lock_owner(payload: Payload) -> tuple[str, str] | None:
    pjid, jid = payload.get("periodic_pjid"), payload.get("jid")
    if (
        payload.get("periodic_until_executed") is True
        and isinstance(pjid, str)
        and pjid
        and isinstance(jid, str)
    ):
        return pjid, jid
    return None


class PeriodicLockMiddleware(ServerMiddleware):
    """The running lock of an ``until_executed`` entry around its run."""

    acts_on = frozenset({"periodic_until_executed"})  # _lock_owner() needs it

    def before(self, payload: Payload) -> None:
        owner = _lock_owner(payload)
        if owner is None:
            return
        pjid, jid = owner
        HELD.add(jid, pjid)
        try:
            hold(get_redis(), get_keys().for_payload(payload), pjid, jid, active_ttl_s(get_config()))
        except Exception as exc:
            # The lock still has its queued TTL; the ticker tries again.
            logger.error("could not extend the running lock of jid=%s: %s", jid, exc)

    def after(self, payload: Payload, result: Result) -> None:
        owner = _lock_owner(payload)
        if owner is None:
            return
        pjid, jid = owner
        HELD.remove(jid)
        if result.final:
            locks.release_owned(get_redis(), get_keys().for_payload(payload).periodic_running(pjid), jid)
            return
        # A retry is the same run, waiting: keep the next slot off until the
        # retry is due and has had the queued TTL to start.
        wait_s = max(0.0, (result.retry_at or time.time()) - time.time())
        hold(get_redis(), get_keys().for_payload(payload), pjid, jid, PERIODIC_QUEUED_TTL_S + wait_s)
