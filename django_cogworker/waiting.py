"""Which queue an idle thread waits on (G9).

Duties: spread a process's idle threads over its queues, so that a job
pushed to any of them wakes a thread at once. An idle thread blocks on one
queue with ``BLMOVE`` (Redis has no blocking move from several lists); the
thread takes a queue no thread waits on, else the one with the fewest
threads waiting on it for its weight; the earlier one in strict order on
a tie. With at least as many
idle threads as queues, every queue has a thread blocked on it and nothing
polls; with fewer, the queues left without one are looked at by the fetch
script that a thread runs, in order, each time its wait ends (one wait,
1 s, at most between two looks). A thread whose wait ended empty waits
again on the same queue at once where that is where it would go anyway
(:meth:`Waiters.stays`). And pause a thread that has to poll: a full Redis
refuses ``BLMOVE`` (it may grow memory), and a broken queue cannot be
waited on. And know, per thread, whether its next fetch blocks
(:class:`Idle`), and which queues are paused (:class:`Paused`).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable
from typing import Any

from django_cogworker.conf import QueueSpec

#: First pause of a polling thread.
FIRST_PAUSE_S = 0.25

#: How often the paused-queue set is read again.
PAUSED_REFRESH_S = 1.0


class Idle(threading.local):
    """Per thread of a fetcher: whether its last fetch came back empty, so
    that its next one blocks. False until then, from the class: read on
    every fetch, a missing attribute read with a default would raise and
    catch an AttributeError each time."""

    blocking = False


class Waiters:
    """The idle threads of one process, counted by the queue they block on."""

    def __init__(self, specs: Iterable[QueueSpec]) -> None:
        # Strict order (no weights): every queue counts 1, so that the
        # counts alone spread the threads and the order breaks ties.
        self._weight = {q.name: max(q.weight, 1) for q in specs}
        self._order = {name: i for i, name in enumerate(self._weight)}
        self._count = dict.fromkeys(self._weight, 0)
        self._lock = threading.Lock()

    def enter(self, queues: list[str]) -> str:
        """The queue for the calling thread to wait on, among ``queues``
        (the unpaused ones), counted until :meth:`leave`."""
        with self._lock:
            count = self._count
            queue = min(queues, key=lambda q: self._rank(q, count[q]))
            count[queue] += 1
            return queue

    def leave(self, queue: str) -> None:
        with self._lock:
            self._count[queue] -= 1

    def stays(self, queue: str) -> bool:
        """Whether a thread whose wait on ``queue`` ended empty may wait on
        it again without leaving: every other queue has a thread waiting on
        it, and :meth:`enter` would send the thread back to ``queue``. The
        waits of threads that went idle together end together; a thread that
        stays renews its wait in a few calls (racy, as :meth:`uncovered`)."""
        count = self._count
        mine = self._rank(queue, count[queue] - 1)  # as if it had left
        for other, waiting in count.items():
            if other != queue and (waiting <= 0 or self._rank(other, waiting) < mine):
                return False
        return True

    def uncovered(self, queues: list[str]) -> int:
        """How many of ``queues`` no thread waits on now (racy by design:
        a hint for whether to look at the queues with the fetch script)."""
        count = self._count
        return sum(1 for q in queues if count[q] <= 0)

    def _rank(self, queue: str, waiting: int) -> tuple[bool, float, int]:
        """How :meth:`enter` ranks ``queue`` with ``waiting`` threads on it
        (the lowest is taken): one no thread waits on first, then the fewest
        for its weight, then the earlier in order."""
        return (waiting > 0, (waiting + 1) / self._weight[queue], self._order[queue])


class Paused:
    """The names of the paused queues, read again once a second at most, by
    one of the threads that ask meanwhile."""

    def __init__(self, client: Any, key: str) -> None:
        self._client, self._key = client, key
        self._paused: frozenset[str] | None = None  # not read yet
        self._at = 0.0
        self._lock = threading.Lock()

    def now(self) -> frozenset[str]:
        paused, now = self._paused, time.monotonic()
        if paused is None or now - self._at > PAUSED_REFRESH_S:
            # Of the threads whose waits end together, the one that takes the
            # lock reads it; the others keep the set read a second ago (only
            # the very first read makes them wait for it).
            if self._lock.acquire(blocking=paused is None):
                try:
                    if self._paused is None or now - self._at > PAUSED_REFRESH_S:
                        self._paused = frozenset(m.decode() for m in self._client.smembers(self._key))
                        self._at = now
                finally:
                    self._lock.release()
            paused = self._paused
            assert paused is not None
        return paused


class Backoff:
    """The pauses of the threads that poll: from 0.25 s doubling up to
    ``FETCH_IDLE_MAX_INTERVAL``, with jitter, each thread its own; every
    pause ends at once on quiet (G9)."""

    def __init__(self, cap: float, quiet: threading.Event) -> None:
        self._cap = cap
        self._quiet = quiet
        self._last = threading.local()

    def pause(self) -> None:
        cap, last = self._cap, getattr(self._last, "interval", None)
        interval = min(last * 2, cap) if last else min(FIRST_PAUSE_S, cap)
        self._last.interval = interval
        self._quiet.wait(interval * (0.75 + random.random() * 0.25))

    def reset(self) -> None:
        self._last.interval = None
