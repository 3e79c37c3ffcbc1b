"""The worker's side of the limiters while jobs run (SPEC section 14).

Duties:

- :func:`bind`: the process a worker's jobs run in, for ``acquire()`` in
  job code (outside a worker, ``acquire()`` holds nothing);
- ``acquire()`` in job code (:class:`InWorker`), and
  :func:`take_code_holds`, the slots a job's code still held when it ended
  (released with its settlement);
- :class:`Waker`: one timer thread per process, started when first needed,
  that wakes a limiter's waiters when its window has room.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from django_cogworker.context import current_job
from django_cogworker.errors import OverLimit
from django_cogworker.keys import Keys
from django_cogworker.limits import limiter as limiters
from django_cogworker.limits import state
from django_cogworker.limits.limiter import Limiter

logger = logging.getLogger("django_cogworker")


@dataclass(frozen=True)
class Bound:
    """The worker process jobs run in: what ``acquire()`` needs."""

    client: Any
    keys: Keys
    identity: str
    waker: Waker


#: The slots each running job's code holds (jid -> limiters), until its
#: block ends; what is left when the job ends is released with its
#: settlement.
code_holds: dict[str, list[Limiter]] = {}
_holds_lock = threading.Lock()


def bind(client: Any, keys: Keys, identity: str, waker: Waker) -> None:
    limiters.bind_worker(InWorker(Bound(client, keys, identity, waker)))


class InWorker:
    """``acquire()`` in the code of a job run by this worker process."""

    def __init__(self, bound: Bound) -> None:
        self.bound = bound

    def acquire(self, limiter: Limiter) -> bool:
        return acquire_in_job(self.bound, limiter)

    def release(self, limiter: Limiter) -> None:
        release_in_job(self.bound, limiter)


def acquire_in_job(bound: Bound, limiter: Limiter) -> bool:
    """Takes ``limiter`` for the running job, or raises OverLimit. Returns
    whether a slot is held (a concurrency limiter, in a job)."""
    job = current_job()
    if job is None:
        logger.debug("limiter %s acquired outside a job: nothing is held", limiter.name)
        return False
    # The job is running, so it is ours: no list check (and no payload at hand).
    answer = state.admit(
        bound.client,
        bound.keys,
        bound.keys.inprogress(bound.identity),
        bound.identity,
        b"",
        job.jid,
        job.queue,
        (limiter,),
        park=False,
        listed=False,
    )
    if not answer.admitted:
        logger.debug("jid=%s: limiter %s is full; the job waits", job.jid, limiter.name)
        raise OverLimit(limiter)
    if limiter.kind != "c":
        return False
    with _holds_lock:
        code_holds.setdefault(job.jid, []).append(limiter)
    return True


def release_in_job(bound: Bound, limiter: Limiter) -> None:
    """Frees a slot taken in job code when its block ends. A release that
    fails leaves the slot held: the job's settlement frees it."""
    job = current_job()
    assert job is not None
    try:
        elsewhere = state.release(bound.client, bound.keys, bound.identity, job.jid, job.queue, (limiter,))
    except Exception as exc:
        logger.warning(
            "limiter %s: could not release jid=%s yet (%s); freed when the job ends",
            limiter.name,
            job.jid,
            exc,
        )
        return
    with _holds_lock:
        holds = code_holds.get(job.jid, [])
        if limiter in holds:
            holds.remove(limiter)
        if not holds:
            code_holds.pop(job.jid, None)
    if elsewhere:
        bound.waker.now(limiter)


def take_code_holds(jid: str) -> list[Limiter]:
    """The slots a job's code still held when the job ended (once)."""
    if not code_holds:
        return []
    with _holds_lock:
        return code_holds.pop(jid, [])


class Waker:
    """Wakes the waiters of limiters at given times, from one daemon thread
    per process, started when first needed: a rate's window that has room
    again, a limiter whose waiters sit on another queue."""

    def __init__(self, client: Any, keys: Keys, done: threading.Event) -> None:
        self.client = client
        self.keys = keys
        self.done = done
        #: (when, sequence, name, limiter): the sequence keeps ties off the limiters.
        self._due: list[tuple[float, int, str, Limiter]] = []
        self._sequence = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def at(self, limiter: Limiter, wait_s: float) -> None:
        """Wakes ``limiter``'s waiters in ``wait_s`` seconds."""
        at = time.monotonic() + wait_s
        with self._cond:
            if any(name == limiter.name and when <= at for when, _, name, _ in self._due):
                return  # an earlier wake of it is due: that one schedules the next
            self._sequence += 1
            heapq.heappush(self._due, (at, self._sequence, limiter.name, limiter))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cogworker-limits", daemon=True)
                self._thread.start()
            self._cond.notify()

    def now(self, limiter: Limiter) -> None:
        self.at(limiter, 0.0)

    def _run(self) -> None:
        while not self.done.is_set():
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    if self.done.is_set():
                        return
                    timeout = 1.0 if not self._due else min(1.0, self._due[0][0] - time.monotonic())
                    self._cond.wait(max(0.0, timeout))
                _, _, _, limiter = heapq.heappop(self._due)
            self._wake(limiter)

    def _wake(self, limiter: Limiter) -> None:
        try:
            _, wait_s = state.wake(self.client, self.keys, limiter.name, limiter)
        except Exception as exc:
            logger.debug("limiter %s: could not wake its waiters (%s); the sweep will", limiter.name, exc)
            return
        if wait_s > 0:
            self.at(limiter, wait_s)
