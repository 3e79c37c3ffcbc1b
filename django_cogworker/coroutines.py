"""The event loop of ``async def`` jobs: one thread per worker process.

Duties (SPEC section 15):

- run up to ``ASYNC_CONCURRENCY`` coroutine jobs at once on one event-loop
  thread, started only in a process where an ``async def`` job is
  registered (:func:`wanted`): a process without one starts nothing and
  its processors pay one test per job;
- take the jobs the processor threads fetched (:meth:`Coroutines.run`): the
  fetch and its accounting are the threads' (the same script, the same
  in-progress list, the same ledger); a thread hands a coroutine job over
  and fetches again once the loop has room. The job moves
  in the ledger from the thread's index to one of the loop's
  (``CONCURRENCY`` and up), so strays (G7), revival (G18) and the bound
  (G19: ``CONCURRENCY + ASYNC_CONCURRENCY``) are judged as for any job;
- record each job's end through ``Settler.finished``, once: on the loop
  when that is done in memory (its ack owed to the next fetch,
  ``Settler.in_memory``), else from a thread of its own, so that the loop
  never waits on Redis for it; failures are filed by the same scripts (G6);
- at shutdown (G8): hand over nothing more, let the jobs run until the
  deadline (:meth:`drain`), then cancel the rest (:meth:`cancel`) for the
  manager to put back with their interrupt count;
- a crash of the loop's thread, or of its settling thread, stops the process
  with a non-zero status rather than leaving half a worker.

The loop's lag is watched from another thread (``loop_watch.py``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

from django_cogworker import arun, threads
from django_cogworker.conf import Config
from django_cogworker.ledger import PLAIN_LATELY_S, Ledger
from django_cogworker.limits import running
from django_cogworker.loop_watch import LoopWatch
from django_cogworker.outcomes import Outcome, dead_letter
from django_cogworker.payload import Payload
from django_cogworker.settle import Settler
from django_cogworker.work import UnitOfWork

logger = logging.getLogger("django_cogworker")

#: How often a thread waiting for room on the full loop looks at quiet
#: (it is woken as soon as a job ends).
ROOM_WAIT_S = 0.25

#: A full loop wakes a thread waiting for room once this share of its slots
#: is free, not at each slot: one fetch a batch.
ROOM_BATCH_SHARE = 0.5

#: How long the shutdown waits for cancelled coroutines to end (the
#: cancellation lands at their next ``await``) before those still going are
#: put back as running ones are.
CANCEL_GRACE_S = 1.0

#: Jobs a fetch may bring ahead for the loop (each held in the ledger, G19),
#: while it took one within FETCH_AHEAD_FOR_S: a coroutine job is handed over
#: at once, so without it the threads would rarely wait, and each call would
#: bring one job. A stream of coroutine jobs alone fills the loop's free slots
#: in one call; while plain jobs ran lately (``Keeping.plain_at``), a call
#: brings at most FETCH_AHEAD_MIXED, so that the plain jobs fetched with them
#: wait little in this process's hands while another process is free.
FETCH_AHEAD_FOR_S = 1.0
FETCH_AHEAD_MIXED = 16

#: A finished job, for the settling thread; None stops it.
Done = tuple[int, UnitOfWork, Outcome] | None


class Coroutines:
    def __init__(
        self,
        config: Config,
        ledger: Ledger,
        settler: Settler,
        quiet: threading.Event,
        first_index: int,
        on_crash: Callable[[], None],
        on_blocked: Callable[[str, float], None],
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.settler = settler
        self.quiet = quiet
        self.size = config.async_concurrency
        self.room_batch = max(1, int(self.size * ROOM_BATCH_SHARE))
        self.on_crash = on_crash
        # The loop's ledger indices, after the threads'.
        self._free = list(range(first_index + self.size - 1, first_index - 1, -1))
        # Threads holding a job wait on _room for a slot each; threads back
        # from a hand-over wait on _later for a batch of slots (one of them
        # fetches for the loop, see _wait_for_room).
        lock = threading.Lock()
        self._room = threading.Condition(lock)
        self._later = threading.Condition(lock)
        #: Made by :meth:`start` (and closed by its thread when it stops): a
        #: process that never starts never has a loop to close.
        self.loop: asyncio.AbstractEventLoop
        self.watch: LoopWatch
        self.on_blocked = on_blocked
        #: The tasks on the loop (touched by the loop's thread only) -> the
        #: job each runs, for the lag watch to name.
        self.tasks: dict[asyncio.Task[None], UnitOfWork] = {}
        #: The job whose task is being created (its first step runs then, on
        #: Python 3.12+), for the lag watch to name.
        self.starting: UnitOfWork | None = None
        #: Jobs whose coroutine ended by the shutdown's cancellation.
        self.cancelled: list[UnitOfWork] = []
        self._done: queue.SimpleQueue[Done] = queue.SimpleQueue()
        #: Jobs handed over, for the loop to start (``_start``).
        self._inbox: collections.deque[tuple[int, UnitOfWork, Payload]] = collections.deque()
        self._woken = False
        #: Threads holding a job they wait to hand over (the loop is full):
        #: the first slots that free are theirs.
        self._holding = 0
        self.stopping = False
        self.handed_at = -FETCH_AHEAD_FOR_S  # monotonic time of the last hand-over

    # -- threads -----------------------------------------------------------------

    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        eager = getattr(asyncio, "eager_task_factory", None)  # Python 3.12+
        if eager is not None:
            # A job's coroutine runs at once, up to its first real wait: a
            # job that never waits (or before it does) costs no trip through
            # the loop's queue.
            self.loop.set_task_factory(eager)
        self.watch = LoopWatch(self.loop, self.blocking_job, self.on_blocked)
        threads.start("cogworker-loop", self._run_loop, self._crashed)
        threads.start("cogworker-loop-settler", self._settle, self._crashed)
        self.watch.start()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.watch.stop()
            self.loop.close()
        if not self.stopping:
            raise RuntimeError("the event loop of async jobs stopped")

    def _crashed(self, name: str) -> None:
        if not self.stopping:
            logger.critical("%s died: the async jobs cannot run; this process stops (exit status 1)", name)
            self.on_crash()

    # -- hand-over (processor threads) ---------------------------------------------

    def run(self, index: int, work: UnitOfWork, payload: Payload) -> None:
        """From processor thread ``index``, which started ``work`` in the
        ledger: hands it to the loop, waiting while the loop is full (the
        thread's slot holds the job meanwhile, G19), then waits a little
        for room before its next fetch (``_wait_for_room``). Once quiet,
        the job goes back to its queue instead."""
        with self._room:
            self._holding += 1
            try:
                while not self._free and not self.quiet.is_set():
                    self._room.wait(ROOM_WAIT_S)
            finally:
                self._holding -= 1
            slot = None if self.quiet.is_set() else self._free.pop()
        if slot is None:
            self.ledger.finished(index, work, None)
            self.settler.give_back(work)
            return
        self.ledger.moved(index, slot)
        self.handed_at = time.monotonic()
        self._inbox.append((slot, work, payload))
        if not self._woken:
            # One wake-up of the loop for the jobs handed over meanwhile, not
            # one each. (Two threads may both wake it: the second finds the
            # inbox empty.) A closed loop (it crashed, and the process stops)
            # refuses it: the job stays running in the ledger, and the
            # shutdown puts it back.
            self._woken = True
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._start)
        self._wait_for_room()

    def _wait_for_room(self) -> None:
        """After a hand-over, while the loop has no room: the thread does not
        fetch yet. A coroutine job it fetched now would wait in its hands
        and take the slots freed one by one, a fetch call each; it waits
        instead until ``ROOM_BATCH_SHARE`` of the slots are free (one thread
        woken, not all), and its next fetch brings jobs for them (``room``). At most
        ``ROOM_WAIT_S``: a loop full of long coroutines does not keep the
        thread from the plain jobs queued behind them."""
        with self._later:
            if len(self._free) > self._holding or self.quiet.is_set():
                return
        # Its slot is free meanwhile: a thread waiting for one may fetch the
        # plain jobs queued (a keeper of short jobs wakes none when it hands
        # one over: ``Ledger.moved``).
        self.ledger.wake_for_plain()
        with self._later:
            if len(self._free) <= self._holding and not self.quiet.is_set():
                self._later.wait(ROOM_WAIT_S)

    def _start(self) -> None:
        # Cleared first: a job handed over after the last pop below wakes
        # the loop again.
        self._woken = False
        # The jobs found, not those handed over meanwhile: an eager task runs
        # here, and the threads hand over more as slots free, so a stream of
        # jobs that never wait would keep the loop from its other tasks (a
        # sleep that is over, the lag watch's tick) until it ran dry.
        for _ in range(len(self._inbox)):
            slot, work, payload = self._inbox.popleft()
            # Each task runs in a copy of the loop thread's context:
            # current_job() and the ThreadSensitiveContext set in one are not
            # seen by another. An eager task runs its first step here, before
            # it is in ``tasks``: ``starting`` names its job meanwhile.
            self.starting = work
            task = self.loop.create_task(self._one(slot, work, payload))
            self.starting = None
            if not task.done():
                self.tasks[task] = work
        if self._inbox and not self._woken:
            self._woken = True  # the threads need not wake the loop: it comes back for them
            self.loop.call_soon(self._start)

    async def _one(self, slot: int, work: UnitOfWork, payload: Payload) -> None:
        try:
            outcome = await arun.aexecute(work.raw, self.config, queue=work.queue, payload=payload)
        except asyncio.CancelledError:
            # The shutdown's: no outcome; the manager puts it back (G8).
            self.cancelled.append(work)
            return
        except BaseException as exc:
            # Only a bug of ours gets here (aexecute catches the job's own
            # exceptions): filed in dead once, raw kept, as a thread does.
            logger.exception("processing an async job failed unexpectedly; filing it in dead")
            outcome = dead_letter(work.raw, exc, time.time())
        finally:
            task = asyncio.current_task()
            if task is not None:
                self.tasks.pop(task, None)
        if running.code_holds:
            # Slots its code took (acquire()) and could not release: freed
            # with its settlement, from a thread (SPEC section 14).
            work.holds += tuple(running.take_code_holds(work.jid))
        if self.settler.in_memory(work, outcome):
            self._finished(slot, work, outcome, True)  # no Redis call: here, without a thread hop
        else:
            self._done.put((slot, work, outcome))

    def _settle(self) -> None:
        """The settling thread: the ends that tell Redis at once (a failure
        filed, a recovered job acked), so the loop never waits on Redis."""
        while True:
            done = self._done.get()
            if done is None:
                return
            self._finished(*done, False)

    def _finished(self, slot: int, work: UnitOfWork, outcome: Outcome, owed: bool) -> None:
        """Each end recorded once (``Settler.finished``), then the loop has
        room for one more."""
        try:
            self.settler.finished(slot, work, outcome, owed)
        finally:
            with self._room:
                self._free.append(slot)
                if self._holding:
                    self._room.notify()  # a thread holding a job: this slot is its
                elif len(self._free) == self.room_batch:
                    self._later.notify()  # a thread whose next fetch brings jobs for the free slots

    def room(self, in_transit: int) -> int:
        """How many more jobs a fetch may bring for the loop, so that a
        stream of coroutine jobs costs one call per batch, not one per job:

        - none unless the loop took a job within ``FETCH_AHEAD_FOR_S`` (a
          process running plain jobs alone fetches as before);
        - else its free slots, less those the threads holding a job wait
          for and those ``in_transit`` (fetched, or being fetched, and not
          handed over yet);
        - at most ``FETCH_AHEAD_MIXED`` while plain jobs ran lately.
        """
        now = time.monotonic()
        if now - self.handed_at > FETCH_AHEAD_FOR_S:
            return 0
        room = len(self._free) - self._holding - in_transit
        if now - self.ledger.keeping.plain_at < PLAIN_LATELY_S:
            room = min(room, FETCH_AHEAD_MIXED)
        return max(0, room)

    def blocking_job(self) -> UnitOfWork | None:
        """The job whose coroutine runs on the loop now (from another thread)."""
        task = asyncio.current_task(self.loop)
        return None if task is None else self.tasks.get(task, self.starting)

    # -- shutdown (G8) ---------------------------------------------------------------

    def busy(self) -> int:
        with self._room:
            return self.size - len(self._free)

    def drain(self, deadline: float) -> None:
        """Waits until every job handed over has ended and been recorded, or
        the deadline."""
        with self._room:
            while len(self._free) < self.size - len(self.cancelled):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._room.wait(min(left, ROOM_WAIT_S))

    def cancel(self) -> set[bytes]:
        """Cancels every coroutine still running; returns the raw payloads of
        those that ended within ``CANCEL_GRACE_S`` (the others may still be
        running: a coroutine that swallows its cancellation, or a blocked
        loop)."""
        self.stopping = True
        if not hasattr(self, "loop"):
            return set()  # never started

        def cancel_all() -> None:
            for task in list(self.tasks):
                task.cancel()

        try:
            self.loop.call_soon_threadsafe(cancel_all)
        except RuntimeError:
            return set()  # the loop died (its crash stops the process): nothing ended by a cancel
        deadline = time.monotonic() + CANCEL_GRACE_S
        while self.tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        ended = {work.raw for work in self.cancelled}
        # Its thread closes the loop; a coroutine still going is put back by
        # the caller as a job running at the deadline.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._done.put(None)
        return ended
