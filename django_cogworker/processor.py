"""One processor thread: fetch a job, run it, settle it, repeat.

Duties: keep the manager's in-memory record of what this thread runs (the
only record strays are judged by, G7); hand every outcome to Redis, and when
that fails leave it with the manager to settle later, never to re-run (G6);
survive any exception a job raises (G14) and any Redis outage (threads back
off, log once per outage, and resume: SPEC section 8).
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING

from django_cogworker import execution
from django_cogworker.errors import UnsupportedServer
from django_cogworker.fetch import UnitOfWork

if TYPE_CHECKING:
    from django_cogworker.manager import Manager

logger = logging.getLogger("django_cogworker")

OUTAGE_BACKOFF_MAX_S = 5.0

#: Pause of a thread that handed back a recovered job because another one
#: runs in this process.
SUSPECT_RETRY_S = 0.2


class Processor:
    def __init__(self, manager: Manager, index: int) -> None:
        self.manager = manager
        self.index = index
        self.backoff_s = 0.0

    def run(self) -> None:
        manager = self.manager
        # The previous job, finished, whose ack rides on the next fetch. It
        # is recorded as a pending ack in the manager's memory meanwhile, so
        # it is never taken for a stray and never run again (G6).
        done: tuple[UnitOfWork, str] | None = None
        while not manager.quiet.is_set():
            try:
                work = manager.fetcher().retrieve(done)
            except UnsupportedServer as exc:
                manager.fall_back_to_basic(str(exc))
                continue
            except Exception as exc:
                done = None  # stays a pending ack: reconcile retries it
                if not manager.outage.failed(exc):
                    logger.exception("fetch failed")
                self.back_off()
                continue
            done = None  # sent, or waiting with the fetcher for its next call
            self.recovered()
            if work is None:
                continue
            if manager.quiet.is_set():
                manager.give_back(work)
                break
            if time.monotonic() - work.fetched_at > manager.revival_check_s and not self.still_ours(work):
                continue
            suspect = work.recovered
            if suspect and not manager.begin_suspect():
                # G3: a job recovered from a dead process may be the poison
                # pill that killed it. One at a time per process, so that
                # when it kills this one too, no other suspect dies with it
                # and gets counted as a poison pill in turn.
                manager.give_back(work)
                manager.quiet.wait(SUSPECT_RETRY_S * (0.5 + random.random()))
                continue
            try:
                done = self.process(work)
            finally:
                if suspect:
                    manager.end_suspect()
        if done is not None:
            manager.settle_ack(*done)

    def process(self, work: UnitOfWork) -> tuple[UnitOfWork, str] | None:
        """Runs one job; returns it if its ack is left to the next fetch."""
        manager = self.manager
        manager.started(self.index, work)
        try:
            outcome = execution.execute(work.raw, manager.config, queue=work.queue)
        except BaseException:
            # Only a bug of ours gets here (execute() catches the job's own
            # exceptions). Leave the job on the list: a stray, requeued by
            # reconcile.
            logger.exception("processing a job failed unexpectedly; left in progress")
            manager.finished(self.index, work, None)
            return None
        # A recovered job is acknowledged at once, with its orphan counter:
        # left pending, a kill before the next fetch would count it as
        # orphaned again though it had finished (G19).
        if outcome.kind == execution.ACK and manager.reliable and not work.recovered:
            manager.defer_ack(work)
            manager.finished(self.index, work, outcome)
            return (work, outcome.jid)
        manager.settle(work, outcome)
        manager.finished(self.index, work, outcome)
        return None

    def still_ours(self, work: UnitOfWork) -> bool:
        """G18: a job fetched a long while ago (this process was stopped,
        paused or starved) runs only if it is still on this process's list.
        Meanwhile its owner may have been taken for dead and the job run
        elsewhere; starting it now would be a second run. When the list
        cannot be read, the job is not run either: if it is still there,
        the stray check requeues it."""
        manager = self.manager
        try:
            owned = manager.fetcher().still_owned(work)
        except Exception as exc:
            if not manager.outage.failed(exc):
                logger.error("could not check a job fetched long ago (%s); not starting it", exc)
            owned = False
        else:
            if not owned:
                logger.warning(
                    "not starting a job fetched %.1fs ago: it was taken back while this process was silent",
                    time.monotonic() - work.fetched_at,
                )
        if not owned:
            manager.unhold(work)
        return owned

    def back_off(self) -> None:
        self.backoff_s = min(max(self.backoff_s * 2, 0.1), OUTAGE_BACKOFF_MAX_S)
        self.manager.quiet.wait(self.backoff_s)

    def recovered(self) -> None:
        if self.backoff_s:
            self.backoff_s = 0.0
            self.manager.outage.succeeded()
