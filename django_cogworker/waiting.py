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
1 s, at most between two looks). And pause a thread that has to poll: a
full Redis refuses ``BLMOVE`` (it may grow memory), and a broken queue
cannot be waited on. And know, per thread, whether its next fetch blocks
(:class:`Idle`).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterable

from django_cogworker.conf import QueueSpec

#: First pause of a polling thread.
FIRST_PAUSE_S = 0.25


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
        self._count: Counter[str] = Counter()
        self._lock = threading.Lock()

    def enter(self, queues: list[str]) -> str:
        """The queue for the calling thread to wait on, among ``queues``
        (the unpaused ones), counted until :meth:`leave`."""
        with self._lock:
            queue = min(queues, key=self._load_after_one_more)
            self._count[queue] += 1
            return queue

    def leave(self, queue: str) -> None:
        with self._lock:
            self._count[queue] -= 1

    def uncovered(self, queues: list[str]) -> int:
        """How many of ``queues`` no thread waits on now (racy by design:
        a hint for whether to look at the queues with the fetch script)."""
        count = self._count
        return sum(1 for q in queues if count[q] <= 0)

    def _load_after_one_more(self, queue: str) -> tuple[bool, float, int]:
        count = self._count[queue]
        return (count > 0, (count + 1) / self._weight.get(queue, 1), self._order.get(queue, 0))


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
