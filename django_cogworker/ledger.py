"""The ledger: one worker process's memory of its jobs.

Duties: know which job each processor thread runs, which jobs were fetched
for a thread and wait for it (held), how many slots a fetch call in flight
may fill (reserved), and which finished jobs still owe Redis an ack or a
filing (pending). Strays are judged from this memory, never from Redis
(G7), and a pending job is never run again (G6). The jobs running, held and
reserved never add up to more than ``CONCURRENCY`` (G19). It also counts
the jobs processed and failed since the last beat, and tallies each job
name's runs and times for the metrics (``metrics.Tally``).

Everything is guarded by one lock; threads waiting for a slot wait on a
condition of that lock. Whether the jobs a call brings are run by its
caller or handed to the threads waiting is ``keeping.Keeping``'s to say.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from django_cogworker.keeping import Keeping, Start
from django_cogworker.metrics import Tally
from django_cogworker.work import UnitOfWork

#: How long after a plain job ended a full event loop still wakes a
#: thread for the plain jobs queued (``wake_for_plain``).
PLAIN_LATELY_S = 1.0

#: How long a thread whose job is being fetched by another thread's call
#: waits before it looks again (it is woken as soon as the call returns).
SLOT_WAIT_S = 0.25


@dataclass(frozen=True)
class Ack:
    """A finished job whose removal from the in-progress list is owed."""


@dataclass(frozen=True)
class Filing:
    """A failed job whose filing in retry or dead is owed."""

    zset: str
    score: float
    payload: bytes
    jid: str
    trim: bool


ACK = Ack()
Pending = Ack | Filing


@dataclass
class Running:
    work: UnitOfWork
    started_at: float  # epoch seconds, for people
    start: Start | None = None  # None: moved to the event loop


@dataclass
class Slots:
    """Slots reserved for one fetch call; ``calling`` while that call is the
    process's one call in flight (see ``Ledger.calling``)."""

    count: int
    calling: bool = False


class Ledger:
    def __init__(self, concurrency: int, quiet: threading.Event) -> None:
        self.concurrency = concurrency
        self.quiet = quiet
        self.lock = threading.Lock()
        # Woken whenever fetched jobs arrive or a slot frees up.
        self._slots = threading.Condition(self.lock)
        self.running: dict[int, Running] = {}
        self._running_raw: Counter[bytes] = Counter()
        # Fetched for a thread that has not started it yet: on our list, not
        # running, and not a stray either.
        self.held: Counter[bytes] = Counter()
        self.reserved = 0
        # A fetch call is in flight that does not block on the server: the
        # threads wanting a job meanwhile wait for it and then share the
        # next call (one call brings jobs for all of them, as a group commit
        # does), instead of each sending its own call for one job.
        self.calling = False
        self.waiting = 0  # threads waiting in reserve()
        self.keeping = Keeping()
        #: How many more jobs a call may fetch for the event loop of async
        #: jobs (``Coroutines.room``), given how many were fetched and not
        #: started yet or are being fetched; none in a process without one.
        self.loop_room: Callable[[int], int] | None = None
        self.pending: dict[bytes, Pending] = {}
        self.interrupted: set[bytes] = set()
        self._suspect = False
        self.processed = 0
        self.failed = 0
        self.tally = Tally()

    # -- slots (G19) -------------------------------------------------------------

    def reserve(self, buffer: deque[UnitOfWork], most: int | None = None) -> UnitOfWork | Slots | None:
        """For a thread that wants a job: one fetched for it by another
        thread's call, or the slots it may fetch for itself (its own and one
        for each thread left without), reserved until :meth:`fetched`; None
        once quiet."""
        keeping = self.keeping
        with self._slots:
            while True:
                now = time.monotonic()
                if buffer and keeping.may_take(now):
                    if len(buffer) > 1 and keeping.stuck():
                        self._slots.notify()  # the others take them too
                    return buffer.popleft()
                if self.quiet.is_set():
                    return None
                if buffer:  # kept by the thread that fetched them
                    self._wait(keeping.patience(now))
                    continue
                free = self.concurrency - len(self.running) - sum(self.held.values()) - self.reserved
                if free > 0 and not self.calling:
                    # This thread and those waiting, whose acks wait in
                    # ``acks.Acks`` already: the call carries them (G19). Not
                    # a thread still running its job: its slot is not free.
                    # And the event loop's share (``Coroutines.room``: none
                    # while it takes no jobs, so plain jobs are fetched as
                    # before).
                    loop = 0 if self.loop_room is None else self.loop_room(self._in_transit())
                    free = min(free, 1 + self.waiting + loop, most or free)
                    self.reserved += free
                    self.calling = True
                    return Slots(free, calling=True)
                self._wait(SLOT_WAIT_S)

    def _wait(self, timeout: float) -> None:
        """Waits for a slot or a job, counted among the threads waiting (the lock is held)."""
        self.waiting += 1
        try:
            self._slots.wait(timeout)
        finally:
            self.waiting -= 1

    def _in_transit(self) -> int:
        """Jobs fetched and not started yet, or being fetched (the lock is held)."""
        return sum(self.held.values()) + self.reserved

    def shrink(self, slots: Slots, count: int) -> None:
        """Gives back all but ``count`` of a reservation, and lets the other
        threads call: a thread about to block for one job, or to pause with
        none, must not keep the others waiting."""
        with self._slots:
            self._end_call(slots)
            if slots.count > count:
                self.reserved -= slots.count - count
                slots.count = count
            self._slots.notify_all()

    def fetched(self, works: list[UnitOfWork], slots: Slots, buffer: deque[UnitOfWork]) -> None:
        """Ends a reservation: the jobs a call brought are held (the first
        for the caller, the rest in ``buffer`` for the threads waiting)."""
        # The condition's lock itself: its ``with`` is two calls more, on
        # the way of every job an idle thread's BLMOVE brings.
        with self.lock:
            self.reserved -= slots.count
            slots.count = 0
            self._end_call(slots)
            held = self.held
            for work in works:
                held[work.raw] = held.get(work.raw, 0) + 1  # no Counter.__missing__ call
            buffer.extend(works[1:])
            # Kept: one waiter, to make the next call if none came, or to
            # look again when the keeper may be stuck. Else one waiter for
            # each job left in the buffer, and one to make the next call (a
            # waiter also looks again every SLOT_WAIT_S).
            kept = self.keeping.keep(time.monotonic())
            if self.waiting:  # else no thread to wake (an idle one waits in its BLMOVE)
                self._slots.notify(1 if kept else max(1, len(works)))

    def _end_call(self, slots: Slots) -> None:
        """The call of ``slots`` is no longer the one in flight (the lock is held)."""
        if slots.calling:
            slots.calling = False
            self.calling = False

    def unhold(self, work: UnitOfWork) -> None:
        """A held job that will not run here (given back, or not ours)."""
        with self._slots:
            _decrement(self.held, work.raw)
            self._slots.notify_all()

    def wake_for_plain(self) -> None:
        """Wakes a thread waiting for a slot, for the plain jobs queued with
        the coroutine jobs of a full event loop: unless a call in flight
        will, or no plain job ended lately (a stream of coroutine jobs alone
        would be fetched only to wait for the loop in the threads' hands)."""
        with self._slots:
            if not self.calling and time.monotonic() - self.keeping.plain_at < PLAIN_LATELY_S:
                self._slots.notify()

    def wake(self) -> None:
        """Wakes the threads waiting for a slot (quiet, stop)."""
        with self._slots:
            self._slots.notify_all()

    # -- running -------------------------------------------------------------------

    def started(self, index: int, work: UnitOfWork) -> None:
        with self.lock:
            _decrement(self.held, work.raw)
            self.running[index] = Running(work, time.time(), self.keeping.started())
            self._running_raw[work.raw] = self._running_raw.get(work.raw, 0) + 1

    def moved(self, index: int, to: int) -> None:
        """A running job handed from thread ``index`` to the event loop's
        index ``to`` (``coroutines.py``): the thread's slot is free."""
        with self._slots:
            self.running[to] = self.running.pop(index)
            self.running[to].start = None
            self.keeping.moved()
            if not self.calling and not self.keeping.short:
                # As for a job that ended (finished()): a keeper of short
                # jobs comes for the next itself.
                self._slots.notify()

    def finished(
        self, index: int, work: UnitOfWork, failed: bool | None, ran: tuple[str, float] | None = None
    ) -> None:
        """``failed`` is None when the job did not run to an outcome; ``ran``
        is the job's name and execution time when its function was called."""
        with self._slots:
            run = self.running.pop(index, None)
            start = None if run is None else run.start  # None: a job of the event loop
            if start is not None:
                self.keeping.finished(start, measure=failed is not None)
            _decrement(self._running_raw, work.raw)
            if failed is not None:
                self.processed += 1
                self.failed += failed
                if ran is not None:
                    self.tally.add(ran[0], ran[1], failed)
            if self.waiting and not self.calling and (start is None or not self.keeping.short):
                # A slot is free for a waiter; while a call is in flight,
                # its end wakes them (waking them now only costs the GIL).
                # A thread back from a short job comes for the next itself.
                self._slots.notify()

    def running_now(self) -> list[tuple[int, Running]]:
        with self.lock:
            return sorted(self.running.items(), key=lambda item: item[0])

    def busy(self) -> int:
        with self.lock:
            return len(self.running)

    def running_counter(self) -> Counter[bytes]:
        """Jobs this process runs or holds for a thread, by payload."""
        with self.lock:
            return self._running_raw + self.held

    def begin_suspect(self) -> bool:
        """Claims the one slot for an isolated job: one recovered again from
        a dead process (G3)."""
        with self.lock:
            if self._suspect:
                return False
            self._suspect = True
            return True

    def end_suspect(self) -> None:
        with self.lock:
            self._suspect = False

    # -- pending settlements (G6) ------------------------------------------------------

    def owe(self, raw: bytes, how: Pending) -> None:
        with self.lock:
            if raw not in self.interrupted:
                self.pending[raw] = how

    def settled(self, raw: bytes) -> None:
        with self.lock:
            self.pending.pop(raw, None)

    def acked(self, raws: list[bytes]) -> None:
        with self.lock:
            for raw in raws:
                if isinstance(self.pending.get(raw), Ack):
                    del self.pending[raw]

    def owed(self) -> dict[bytes, Pending]:
        with self.lock:
            return dict(self.pending)

    def interrupt(self, raw: bytes) -> None:
        """Filed in retry by the shutdown: whatever its thread reports later is void."""
        with self.lock:
            self.interrupted.add(raw)
            self.pending.pop(raw, None)

    def was_interrupted(self, raw: bytes) -> bool:
        with self.lock:
            return raw in self.interrupted

    # -- counts for the heartbeat -----------------------------------------------------------

    def take_counts(self) -> tuple[int, int, Tally]:
        with self.lock:
            counts = (self.processed, self.failed, self.tally)
            self.processed = self.failed = 0
            self.tally = Tally()
            return counts

    def give_counts_back(self, processed: int, failed: int, tally: Tally) -> None:
        with self.lock:
            self.processed += processed
            self.failed += failed
            self.tally.merge(tally)


def _decrement(counter: Counter[bytes], raw: bytes) -> None:
    if counter[raw] > 1:
        counter[raw] -= 1
    else:
        counter.pop(raw, None)
