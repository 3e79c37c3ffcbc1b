"""Who runs the jobs one fetch call brings: the thread that made the call,
or the threads waiting for a job.

Duties: while the jobs of this process wait on I/O for less than
``SHORT_WAIT_S`` each (a no-op, a cache write, a small INSERT), the jobs a
call brings for the threads waiting are *kept* by the thread that made it,
which runs them one after another and then makes the next call, its acks
riding along; the other threads wait. Handing each such job to another
thread would cost more than the job: a wake-up of another CPU, then the GIL
handed back and forth, about twice the worker's CPU per job (the bench's
cogworker row, unpinned). A kept job waits at most ``HAND_OVER_S`` for its
keeper: a keeper that has not come back for the next one by then is stuck
on a long job, and the waiting threads take the rest (and the jobs are
handed over from then on, until measured short again). Jobs that wait longer
on I/O (an HTTP call, a query) go to the waiting threads at once, so that
their waits overlap.

How long a job waits on I/O is its wall time less its thread's CPU time,
measured only on a job that ran alone among the threads: beside others, it
would count the time it waited for the GIL too, and a busy worker would
never see its jobs as short again; and each at most ``LONG_WAIT_S``, so
that a thread taken off its CPU for a while does not make short jobs look
long. While jobs are handed over, every ``PROBE_S`` the jobs of the calls
of ``PROBE_WINDOW_S`` are kept anyway, to measure them alone. A thread's CPU
time costs a system call (two per job, about 3 µs of a no-op job's 70 µs
of worker CPU here): while the jobs last less than ``TIMED_FROM_S`` of wall
time, they are not timed, and their wall time stands for their wait (it is
at least that, and already short).

A process that runs on one CPU (``CPU_AFFINITY``, ``taskset``, a cpuset of
one) hands every job over at once, as before: there a hand-over is a cheap
switch between threads, and the other threads fill the keeper's waits on
Redis (the bench's pinned row ran half as fast with jobs kept).

The ledger calls these methods with its lock held.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

#: A job that waits on I/O for less than this gains nothing from a thread
#: of its own: handing it over costs about as much.
SHORT_WAIT_S = 0.0002

#: How long a kept job may wait while its keeper runs the jobs before it.
HAND_OVER_S = 0.005

#: What a keeper stuck past HAND_OVER_S makes of the running average: a
#: few jobs measured short bring it under SHORT_WAIT_S again.
LONG_WAIT_S = 2 * SHORT_WAIT_S

#: How often jobs are kept anyway while they are handed over, to measure
#: them, and for how long (the threads running jobs handed over come back
#: meanwhile, and the kept ones then run alone).
PROBE_S = 1.0
PROBE_WINDOW_S = 0.05

#: The weight of the last job measured in the running average of the waits.
WEIGHT = 0.1

#: Jobs are timed by their thread's CPU clock after one measured at least
#: this long by the wall clock; shorter ones are short by their wall time.
TIMED_FROM_S = SHORT_WAIT_S


@dataclass
class Start:
    """When a thread's job started, by the monotonic clock and by its
    thread's CPU time (None: not timed)."""

    at: float
    cpu: float | None


def one_cpu() -> bool:
    """Whether this process may run on one CPU only (False where unknown)."""
    return hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) == 1


class Keeping:
    def __init__(self) -> None:
        #: False on one CPU: every job is handed over at once.
        self.enabled = not one_cpu()
        #: Running average of a job's I/O wait, in seconds (0 at first:
        #: short until measured otherwise).
        self.io_wait = 0.0
        #: The thread keeping the jobs in the buffer, and when it last took
        #: one; None while they are handed over.
        self.keeper: int | None = None
        self.kept_at = 0.0
        self._probe_at = self._probe_until = 0.0
        #: Threads running a job now (not the event loop's jobs).
        self._running = 0
        #: When a thread's job (not handed to the event loop) last ended (monotonic).
        self.plain_at = -1e9
        #: Whether jobs are timed by their thread's CPU clock: the last
        #: measured lasted TIMED_FROM_S or more.
        self.timed = False

    def may_take(self, now: float) -> bool:
        """Whether the calling thread may take a job from the buffer now:
        the keeper's, or one its keeper left waiting too long."""
        me = threading.get_ident()
        if self.keeper in (None, me):
            if self.keeper == me:
                self.kept_at = now
            return True
        if now - self.kept_at < HAND_OVER_S:
            return False
        # A job that long is no short job: hand them over until measured
        # short again (a probe), the jobs that ran alone bringing it down.
        self.io_wait = max(self.io_wait, LONG_WAIT_S)
        self._probe_until = 0.0
        return True

    def stuck(self) -> bool:
        """Whether a thread allowed to take a kept job takes it from a
        keeper stuck on a long one."""
        return self.keeper not in (None, threading.get_ident())

    def patience(self, now: float) -> float:
        """How long a thread that may not take a kept job waits before it looks again."""
        return max(HAND_OVER_S - (now - self.kept_at), 0.0001)

    def keep(self, now: float) -> bool:
        """Called by the thread whose call brought jobs: whether it keeps
        them (True), or hands them to the threads waiting."""
        if not self.enabled:
            return False
        if self.io_wait >= SHORT_WAIT_S and now >= self._probe_until:
            if now < self._probe_at:
                self.keeper = None
                return False
            self._probe_at, self._probe_until = now + PROBE_S, now + PROBE_WINDOW_S
        self.keeper, self.kept_at = threading.get_ident(), now
        return True

    @property
    def short(self) -> bool:
        """Whether a thread back from a job comes for the next one itself
        with no need to wake another."""
        return self.enabled and self.io_wait < SHORT_WAIT_S

    def started(self) -> Start:
        self._running += 1
        return Start(time.monotonic(), time.thread_time() if self.timed else None)

    def moved(self) -> None:
        """A thread's job handed to the event loop."""
        self._running -= 1

    def finished(self, start: Start, measure: bool) -> None:
        """A thread's job ended; ``measure``: it ran, and this is its thread."""
        self._running -= 1
        self.plain_at = now = time.monotonic()
        if measure and self._running == 0:
            waited = wall = now - start.at
            if start.cpu is not None:
                waited -= time.thread_time() - start.cpu
            self.timed = wall >= TIMED_FROM_S
            # At most LONG_WAIT_S: a thread taken off its CPU for a few
            # milliseconds (another process, Redis on the same core) must
            # not make short jobs look long.
            self.io_wait += (min(waited, LONG_WAIT_S) - self.io_wait) * WEIGHT
