"""The lag watch of the event loop of ``async def`` jobs (SPEC section 15).

Duties: tell, from a thread of its own, when a coroutine blocks the loop (a
``time.sleep``, a synchronous socket, a CPU-bound step): the loop is asked to
note the time every ``TICK_S``; a note older than ``BLOCKED_WARN_S`` means
the loop has not run for that long, and the coroutine running on it (its
job's name and jid) is named in one WARNING per blocked stretch, within
``BLOCKED_WARN_S + TICK_S + CHECK_S`` (under 2 s) of its start. A loop
blocked ``BLOCKED_EXIT_S`` makes the process drain and exit with status 3,
as a ``hard_timeout`` does: every other coroutine of the process is stalled
behind it, and a fresh process is the remedy. A stretch in which the watch
did not run either (the whole process stopped: SIGSTOP, a debugger, a
starved machine) is not the loop's: it gets a whole ``BLOCKED_WARN_S`` from
the watch's next run before it is taken for blocked.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from django_cogworker import threads

if TYPE_CHECKING:
    from django_cogworker.work import UnitOfWork

logger = logging.getLogger("django_cogworker")

#: How often the loop notes that it runs.
TICK_S = 0.25
#: How often the watch looks at the last note.
CHECK_S = 0.1
#: A loop that has not run this long is blocked: named in a WARNING.
BLOCKED_WARN_S = 1.0
#: A loop blocked this long makes the process drain and exit (status 3).
BLOCKED_EXIT_S = 60.0


class LoopWatch:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        blocking_job: Callable[[], UnitOfWork | None],
        on_blocked: Callable[[str, float], None],
        *,
        warn_s: float = BLOCKED_WARN_S,
        exit_s: float = BLOCKED_EXIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.loop = loop
        self.blocking_job = blocking_job
        self.on_blocked = on_blocked
        self.warn_s = warn_s
        self.exit_s = exit_s
        self.clock = clock
        self.noted = clock()
        #: When the watch last ran again after a stretch in which it did not run.
        self.resumed = self.noted
        self.done = threading.Event()

    def start(self) -> None:
        self.loop.call_soon_threadsafe(self._tick)
        threads.start("cogworker-loop-watch", self.watch)

    def stop(self) -> None:
        self.done.set()

    def _tick(self) -> None:
        self.noted = self.clock()
        if not self.done.is_set():
            self.loop.call_later(TICK_S, self._tick)

    def watch(self) -> None:
        warned = exited = False
        woke = self.clock()
        while not self.done.wait(CHECK_S):
            now = self.clock()
            if now - woke > self.warn_s:
                self.resumed = now  # this thread was stopped too: not the loop's doing
            woke = now
            lag_s = now - max(self.noted, self.resumed)
            if lag_s < self.warn_s:
                warned = False
                continue
            if not warned:
                warned = True
                work = self.blocking_job()
                name, jid = ("?", "?") if work is None else (_name(work), work.jid)
                logger.warning(
                    "jid=%s %s has blocked the event loop of async jobs for %.1fs: every other async job of "
                    "this process waits meanwhile. Await instead (asyncio.sleep, an async client), or run "
                    "the blocking call in a thread (asgiref's sync_to_async)",
                    jid,
                    name,
                    lag_s,
                )
            if lag_s >= self.exit_s and not exited:
                exited = True
                work = self.blocking_job()
                jid = "" if work is None else work.jid
                logger.error(
                    "jid=%s has blocked the event loop for %.0fs; this process stops fetching and exits",
                    jid,
                    lag_s,
                )
                self.on_blocked(jid, self.exit_s)


def _name(work: UnitOfWork) -> str:
    try:
        return str(work.payload().get("job"))
    except Exception:
        return "?"
