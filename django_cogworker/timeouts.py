"""Job time limits: ``timeout`` and ``hard_timeout`` (SPEC section 14).

Duties:
- run a job's function under its limits (:func:`call`): at its
  ``timeout``, ``JobTimeout`` is raised in the job's own thread, armed only
  while the function runs and disarmed before any code of ours runs again:
  a ``JobTimeout`` still pending when the function returns is cleared in
  the disarm (or caught there, if it lands first), never raised in the
  worker's bookkeeping, where it would lose the thread or the job;
- watch every armed limit of the process from ONE watchdog thread, started
  with the first job that has a limit (a plain job starts nothing and pays
  one test in ``execution.execute``), never a timer per job;
- at a job's ``hard_timeout``, tell the process that a thread is stuck
  where no exception reaches (:func:`on_stuck`: the worker's manager drains
  the process and exits with status 3); without a handler (the testing
  helpers) it is only logged.

The exception is delivered with ``PyThreadState_SetAsyncExc``: CPython
raises it at the thread's next bytecode boundary, so a thread blocked in a C
call (``time.sleep``, a socket read) does not see it until the call returns:
that is what ``hard_timeout`` is for. The watchdog fires, and the disarm
clears, under one lock, so a limit fires at most once and never after its
job's disarm.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from django_cogworker import threads
from django_cogworker.errors import JobTimeout

logger = logging.getLogger("django_cogworker")

#: Disarmed limits left in the watchdog's heap are swept out once they
#: outnumber the armed ones this many times over (plus a floor), so jobs that
#: finish long before a long timeout do not pile up until it passes.
SWEEP_RATIO = 4
SWEEP_FLOOR = 64

#: Called as ``handler(jid, hard_timeout_s)`` when a run passes its hard timeout.
StuckHandler = Callable[[str, float], None]


class Limits:
    """The limits of one run, armed by its own thread."""

    __slots__ = ("done", "fired", "hard_timeout_s", "jid", "thread_id", "timeout_s")

    def __init__(self, jid: str, timeout_s: float | None, hard_timeout_s: float | None) -> None:
        self.jid = jid
        self.timeout_s = timeout_s
        self.hard_timeout_s = hard_timeout_s
        self.thread_id = threading.get_ident()
        self.fired = False  # the JobTimeout was sent (at most once)
        self.done = False  # disarmed: nothing fires any more


def _send(thread_id: int, exc: type[BaseException] | None) -> None:
    """Sets (or, with None, clears) the exception pending in a thread."""
    # Imported here, not with the module: a worker whose jobs never run past
    # a timeout never loads ctypes (about 0.5 MB). The first call is the
    # watchdog's, at the first limit that fires; the clearing one, in the
    # job's thread, only follows a send, so it finds ctypes loaded.
    import ctypes

    pending = None if exc is None else ctypes.py_object(exc)  # None: NULL, which clears
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), pending)


class Watchdog:
    def __init__(self) -> None:
        # A plain lock, never a Condition: its ``with`` runs no Python code
        # between acquiring and the block, where a JobTimeout landing would
        # leave it held.
        self.lock = threading.Lock()
        #: (deadline on the monotonic clock, order, limits, hard?)
        self.heap: list[tuple[float, int, Limits, bool]] = []
        self.order = itertools.count()
        self.armed = 0
        # A C-level queue: putting into it runs no Python code either.
        self.wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.on_stuck: StuckHandler | None = None

    def arm(self, limits: Limits, deadline: float | None, hard_deadline: float | None) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threads.start("cogworker-watchdog", self.watch)
            earliest = self.heap[0][0] if self.heap else None
            for when, hard in ((deadline, False), (hard_deadline, True)):
                if when is not None:
                    heapq.heappush(self.heap, (when, next(self.order), limits, hard))
            self.armed += 1
            sooner = earliest is None or self.heap[0][0] < earliest
        if sooner:
            self.wake.put(None)

    def disarm(self, limits: Limits) -> None:
        with self.lock:
            if limits.done:
                return
            limits.done = True
            self.armed -= 1
            if limits.fired:
                # Sent as the function returned, not raised yet: cleared
                # here, it never lands in the code that follows.
                _send(limits.thread_id, None)
            if len(self.heap) > SWEEP_FLOOR + SWEEP_RATIO * self.armed:
                self.heap = [entry for entry in self.heap if not entry[2].done]
                heapq.heapify(self.heap)

    def watch(self) -> None:
        while True:
            stuck: list[Limits] = []
            with self.lock:
                now = time.monotonic()
                while self.heap and (self.heap[0][2].done or self.heap[0][0] <= now):
                    _, _, limits, hard = heapq.heappop(self.heap)
                    if limits.done:
                        continue
                    if hard:
                        stuck.append(limits)
                    elif not limits.fired:
                        limits.fired = True
                        _send(limits.thread_id, JobTimeout)
                wait_s = self.heap[0][0] - now if self.heap else None
            for limits in stuck:
                self.stuck(limits)
            with contextlib.suppress(queue.Empty):
                self.wake.get(timeout=wait_s)

    def stuck(self, limits: Limits) -> None:
        assert limits.hard_timeout_s is not None
        handler = self.on_stuck
        if handler is None:
            logger.error("jid=%s exceeded its hard_timeout of %gs", limits.jid, limits.hard_timeout_s)
            return
        try:
            handler(limits.jid, limits.hard_timeout_s)
        except Exception:
            logger.exception("handling the hard timeout of jid=%s failed", limits.jid)


_watchdog = Watchdog()


def _forked() -> None:
    global _watchdog
    _watchdog = Watchdog()  # the parent's thread is not in the child


os.register_at_fork(after_in_child=_forked)


def on_stuck(handler: StuckHandler | None) -> None:
    """Who is told of a run past its ``hard_timeout`` in this process."""
    _watchdog.on_stuck = handler


def call(
    jid: str,
    timeout_s: float | None,
    deadline: float | None,
    hard_timeout_s: float | None,
    func: Callable[..., Any],
    args: Any,
    kwargs: Any,
) -> Any:
    """Runs ``func`` under its limits (returning what it returns): the ``timeout`` runs out at
    ``deadline`` (monotonic, the one the job's ``remaining()`` counts down
    to), the hard one counts from now. A ``JobTimeout`` leaves with its message; none is
    pending once this returns or raises."""
    watchdog = _watchdog
    limits = Limits(jid, timeout_s, hard_timeout_s)
    hard_deadline = None if hard_timeout_s is None else time.monotonic() + hard_timeout_s
    try:
        try:
            watchdog.arm(limits, deadline, hard_deadline)
            return func(*args, **kwargs)
        finally:
            watchdog.disarm(limits)
    except JobTimeout as exc:
        # Raised in the function, or landed after it returned and before
        # the disarm was done: either way it came once, and the second
        # disarm (a no-op after the first) cannot be cut short by another.
        watchdog.disarm(limits)
        if not exc.args:
            exc.args = (f"job exceeded its timeout of {timeout_s:g}s",)
        raise


def hard_limit(jid: str, hard_timeout_s: float) -> Limits:
    """Arms a ``hard_timeout`` alone, for a run no exception may be sent to:
    a coroutine on the event loop of ``async def`` jobs, whose ``timeout``
    is a cancellation (``arun.py``) and whose thread is the loop's. Ended by
    :func:`disarm`."""
    limits = Limits(jid, None, hard_timeout_s)
    _watchdog.arm(limits, None, time.monotonic() + hard_timeout_s)
    return limits


def disarm(limits: Limits) -> None:
    _watchdog.disarm(limits)
