"""Unique jobs: at most one job per (name, args, kwargs, queue) at a time.

Duties:
- client side: a payload with ``unique_for`` takes the lock
  ``N:unique:<digest>``, owned by its jid, with ``SET NX`` and a TTL of
  ``unique_for`` seconds (counted from when a scheduled job is due); when the
  lock is taken the payload is refused and ``.delay()`` returns None. The
  payload carries ``unique_digest`` (and ``unique_until``) so that the worker
  and recovery can find the lock again;
- server side: release the lock when the job starts (``unique_until="start"``)
  or when it ends for good: on success, and on a terminal failure (dead or
  dropped); never on a retry, so a duplicate cannot slip in between two
  attempts. A poison pill filed in dead by recovery is released there
  (:func:`django_cogworker.locks.release_all`).

The lock is deleted only by its owner, in one script (``release_owned.lua``):
a late release by a job whose lock expired cannot delete the lock of the
next job with the same digest. The TTL is the safety net: a lock is never
held past ``unique_for`` (for example after a rolled-back transaction whose
``.delay()`` took it, or a Redis outage during the release).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time

from django_cogworker import locks
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import EnqueueRefused, redis_boundary
from django_cogworker.escaping import utf8
from django_cogworker.middleware import ClientMiddleware, Result, ServerMiddleware
from django_cogworker.payload import Payload

logger = logging.getLogger("django_cogworker")

_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest(payload: Payload) -> str:
    """sha256 of the canonical JSON of (name, args, kwargs, queue): the same
    call gives the same digest in any process, whatever the kwargs order."""
    identity = [
        payload.get("job"),
        list(payload.get("args", [])),
        payload.get("kwargs", {}),
        payload.get("queue"),
    ]
    return hashlib.sha256(utf8(_canonical.encode(identity))).hexdigest()


def lock_ttl_ms(unique_for_s: float, at: float | None, now: float) -> int:
    """The lock lives ``unique_for`` seconds from when the job is due."""
    wait_s = max(0.0, at - now) if at is not None else 0.0
    return max(1, math.ceil((wait_s + float(unique_for_s)) * 1000))


def release(payload: Payload) -> bool:
    """Deletes the payload's unique lock if its jid still owns it."""
    d, jid = payload.get("unique_digest"), payload.get("jid")
    if not (isinstance(d, str) and d and isinstance(jid, str) and jid):
        return False
    return locks.release_owned(get_redis(), get_keys().for_payload(payload).unique(d), jid)


class UniqueClientMiddleware(ClientMiddleware):
    acts_on = frozenset({"unique_for"})  # enqueue() passes a payload without one as it is

    def enqueue(self, payload: Payload, *, at: float | None = None) -> Payload | None:
        unique_for = payload.get("unique_for")
        if unique_for is None:
            return payload
        d = digest(payload)
        ttl_ms = lock_ttl_ms(unique_for, at, time.time())
        with redis_boundary("enqueue", refused=EnqueueRefused):
            lock = get_keys().for_payload(payload).unique(d)
            taken = get_redis().set(lock, str(payload["jid"]), nx=True, px=ttl_ms)
        if not taken:
            logger.info("%s not enqueued: an identical unique job is queued or running", payload.get("job"))
            return None
        return {**payload, "unique_digest": d}

    def cancel(self, payload: Payload) -> None:
        release(payload)


class UniqueServerMiddleware(ServerMiddleware):
    acts_on = frozenset({"unique_digest"})  # both methods act only on a payload with one

    def before(self, payload: Payload) -> None:
        if payload.get("unique_until") == "start" and payload.get("unique_digest"):
            self._release(payload)

    def after(self, payload: Payload, result: Result) -> None:
        # In "start" mode this is a no-op unless the release at the start
        # failed; the owner check makes a second try harmless.
        if payload.get("unique_digest") and result.final:  # a plain job: one dict lookup
            self._release(payload)

    @staticmethod
    def _release(payload: Payload) -> None:
        try:
            release(payload)
        except Exception as exc:
            # Never fail a job over its lock: the TTL frees it.
            logger.error("could not release the unique lock of jid=%s: %s", payload.get("jid"), exc)
