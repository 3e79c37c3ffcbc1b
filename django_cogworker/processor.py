"""One processor thread: fetch a job, run it, settle it, repeat.

Duties: keep the ledger's record of what this thread runs (the only record
strays are judged by, G7); start no job fetched so long ago that it may no
longer be ours (G18); run the jobs recovered again from dead processes one
at a time, those recovered once beside the others (G3); drop a job whose
deadline (``expires``) passed before its start, by the beat's view of
Redis's clock (no round trip); hand every outcome to the settler, once
(``Settler.finished``), which keeps it owed when Redis cannot take it,
never to re-run (G6); survive any exception a job raises (G14) and any
Redis outage (back off, the outage logged once per process, and resume:
SPEC section 8).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django_cogworker import execution, expiry, registry
from django_cogworker.backoff import Backoff
from django_cogworker.conf import Config
from django_cogworker.connection import follow_master, is_sentinel
from django_cogworker.errors import BadPayload, UnsupportedServer
from django_cogworker.fetch_mode import Fetching
from django_cogworker.ledger import Ledger
from django_cogworker.limits import admission, running, state
from django_cogworker.outage import Outage
from django_cogworker.payload import Payload
from django_cogworker.requeue import isolated
from django_cogworker.settle import Settler
from django_cogworker.work import UnitOfWork

if TYPE_CHECKING:
    from django_cogworker.coroutines import Coroutines

logger = logging.getLogger("django_cogworker")

OUTAGE_BACKOFF_MAX_S = 5.0

#: How many times a thread asks whether a job fetched long ago is still
#: ours when each answer itself comes back late (G18).
OWNERSHIP_ASKS = 3

#: Pause of a thread that handed back an isolated job because another one
#: runs in this process.
SUSPECT_RETRY_S = 0.2


@dataclass(frozen=True)
class Crew:
    """What a processor thread shares with the others of its process."""

    config: Config
    ledger: Ledger
    fetching: Fetching
    settler: Settler
    outage: Outage
    quiet: threading.Event
    #: The event loop of ``async def`` jobs: None in a process without one.
    loop: Coroutines | None = None

    @property
    def revival_check_s(self) -> float:
        """A job not started this long after its fetch is checked to be
        still ours first (G18): half the shortest time after which another
        process could have taken it (no beat for HEARTBEAT_TTL, and
        ORPHAN_THRESHOLD since the last one)."""
        return min(self.config.heartbeat_ttl_s, self.config.orphan_threshold_s) / 2


class Processor:
    def __init__(self, crew: Crew, index: int) -> None:
        self.crew = crew
        self.index = index
        self.pauses = Backoff(max_s=OUTAGE_BACKOFF_MAX_S)
        #: The job this thread holds or runs, for the manager to release if
        #: the thread dies of an error of ours.
        self.current: UnitOfWork | None = None

    def run(self) -> None:
        try:
            self.loop()
        finally:
            # Its own connection for BLMOVE, closed when the thread ends, by
            # a stop or a crash: none is left open behind it.
            self.crew.fetching.ctx.blocking.close_mine()

    def loop(self) -> None:
        crew = self.crew
        client, revival_check_s = crew.fetching.ctx.client, crew.revival_check_s
        sentinel = is_sentinel(client)
        while not crew.quiet.is_set():
            self.current = None
            try:
                if sentinel:
                    follow_master(client)  # a master that changed: one look a second
                work = crew.fetching.current().retrieve()
            except UnsupportedServer as exc:
                crew.fetching.fall_back(str(exc))
                continue
            except Exception as exc:
                if not crew.outage.failed(exc):
                    logger.exception("fetch failed")
                self.back_off()
                continue
            if work is None and crew.quiet.is_set():
                break  # also a fetch that waited for a beat: no sign that Redis answers
            self.recovered()
            if work is None:
                continue
            self.current = work
            if crew.quiet.is_set():
                crew.settler.give_back(work)
                break
            if time.monotonic() - work.fetched_at > revival_check_s and not self.still_ours(work):
                continue
            suspect = self.isolated(work) if work.recovered else False
            if suspect is None:
                continue
            if suspect and not crew.ledger.begin_suspect():
                # G3: a job recovered again may be the poison pill that
                # killed its processes. One such job at a time per process,
                # so that when it kills this one too, no other job recovered
                # as often dies with it and gets counted as a pill in turn.
                crew.settler.give_back(work)
                crew.quiet.wait(SUSPECT_RETRY_S * (0.5 + random.random()))
                continue
            try:
                if suspect and not self.marked(work):
                    continue
                work.isolated = suspect
                self.process(work)
            finally:
                if suspect:
                    crew.ledger.end_suspect()
        # No fetch of this thread will carry the acks waiting (G6).
        crew.settler.flush_acks()

    def process(self, work: UnitOfWork) -> None:
        """Runs one job, and tells the settler how it ended."""
        crew = self.crew
        crew.ledger.started(self.index, work)
        try:
            payload = work.payload()
        except BadPayload:
            payload = None  # execute() files it in dead, raw kept (G13)
        if payload is not None and expiry.FIELD in payload and self.expired(payload):
            # Dropped unrun: neither processed nor failed.
            unrun = execution.Outcome(execution.ACK, jid=work.jid, failed=None, expired=True)
            if "bid" in payload:
                unrun.workflow = payload  # a batch counts it as succeeded, with its ack
            crew.settler.finished(self.index, work, unrun)
            ctx = crew.fetching.ctx
            admission.dropped_unrun(ctx.client, ctx.keys, work.jid, payload, work.queue, crew.config)
            return
        if (
            payload is not None
            and (registry.limited or crew.config.queue_limits)
            and not self.admitted(work, payload)
        ):
            return
        # An isolated one runs here, on a loop of its own (execute()), so
        # that it stays alone in this process while it runs (G3).
        if (
            crew.loop is not None
            and payload is not None
            and registry.is_coroutine(payload["job"])
            and not work.isolated
        ):
            crew.loop.run(self.index, work, payload)  # waits only while the loop is full
            return
        try:
            outcome = execution.execute(work.raw, crew.config, queue=work.queue, payload=payload)
            if running.code_holds:
                work.holds += tuple(running.take_code_holds(work.jid))
        except BaseException as exc:
            # Only a bug of ours gets here (execute() catches the job's own
            # exceptions). Left in progress, the job would be requeued as a
            # stray and meet the same bug again, every few seconds, whatever
            # its retries (a lone surrogate in a failure message once did):
            # filed in dead once instead, raw kept (G13).
            logger.exception("processing a job failed unexpectedly; filing it in dead")
            outcome = execution.dead_letter(work.raw, exc, time.time())
        crew.settler.finished(self.index, work, outcome)

    def admitted(self, work: UnitOfWork, payload: Payload) -> bool:
        """SPEC section 14: whether the job may start under its limiters (a
        plain job has none: two lookups). Over a limit it was parked in the
        same call, off this process's list: its run ends here, unrun."""
        crew = self.crew
        try:
            limiters = admission.limiters_for(payload, work.queue, crew.config)
        except Exception as exc:
            # A limit computed from the arguments that failed: the job's failure.
            crew.settler.finished(self.index, work, execution.limit_failed(payload, exc, crew.config))
            return False
        if not limiters:
            return True
        ctx = crew.fetching.ctx
        try:
            answer = state.admit(
                ctx.client,
                ctx.keys,
                ctx.keys.inprogress(ctx.identity),
                ctx.identity,
                work.raw,
                work.jid,
                work.queue,
                limiters,
                listed=crew.fetching.reliable,
            )
        except Exception as exc:
            if not crew.outage.failed(exc):
                logger.error("could not admit jid=%s under its limits (%s); not starting it", work.jid, exc)
            crew.ledger.finished(self.index, work, None)
            crew.settler.give_back(work, held=False)
            self.back_off()
            return False
        if answer.admitted:
            work.holds = tuple(limiter for limiter in limiters if limiter.kind == "c")
            return True
        crew.ledger.finished(self.index, work, None)
        if answer.ours:
            logger.debug("jid=%s waits for limiter %s", work.jid, answer.name)
            if answer.wait_s > 0:
                crew.settler.waker.at(next(lim for lim in limiters if lim.name == answer.name), answer.wait_s)
        return False

    def expired(self, payload: Payload) -> bool:
        """Whether a job with a deadline starts too late: then it is
        recorded as expired (``expiry.drop``). When Redis's time cannot be
        told (no beat for ``CLOCK_REFRESH_S`` and ``TIME`` failing), it runs."""
        ctx = self.crew.fetching.ctx
        try:
            late = expiry.expired(payload, expiry.clock.now(ctx.client))
        except Exception as exc:
            logger.warning("could not read Redis's time (%s); running jid=%s", exc, payload.get("jid"))
            return False
        if late:
            expiry.drop(ctx.client, ctx.keys, [payload], "not started in time")
        return late

    def isolated(self, work: UnitOfWork) -> bool | None:
        """G3: whether a recovered job runs isolated (recovered again, see
        ``requeue.isolated``); None when its counter cannot be read: not
        started then (given back, tried again later)."""
        try:
            count = self.crew.fetching.current().orphanings(work)
        except Exception as exc:
            self.not_now(work, "read the orphan count of a recovered job", exc)
            return None
        return isolated(count, self.crew.config.max_orphanings)

    def marked(self, work: UnitOfWork) -> bool:
        """G3: the isolated job recorded before it starts; unrecorded, it
        does not start (given back, tried again later)."""
        try:
            self.crew.fetching.current().mark_suspect(work)
            return True
        except Exception as exc:
            self.not_now(work, "record a recovered job before its start", exc)
            return False

    def not_now(self, work: UnitOfWork, what: str, exc: Exception) -> None:
        if not self.crew.outage.failed(exc):
            logger.error("could not %s (%s); not starting it", what, exc)
        self.crew.settler.give_back(work)
        self.back_off()

    def still_ours(self, work: UnitOfWork) -> bool:
        """G18: a job fetched a long while ago (this process was stopped,
        paused or starved) runs only if it is still on this process's list.
        Meanwhile its owner may have been taken for dead and the job run
        elsewhere; starting it now would be a second run. When the list
        cannot be read, the job is not run either: if it is still there,
        the stray check requeues it. An answer that itself came back late is
        asked for again (it may predate a recovery made while we were
        silent); late every time, the job is not started either. Asked only
        once a beat has registered this process again: until then a
        recovery could still take the job after an answer "ours"."""
        crew = self.crew
        if not crew.fetching.ctx.registration.awaited(crew.quiet):
            crew.settler.give_back(work)  # stopping: it goes back with the rest
            return False
        try:
            for _ in range(OWNERSHIP_ASKS):
                asked = time.monotonic()
                owned = crew.fetching.current().still_owned(work)
                if not owned or time.monotonic() - asked <= crew.revival_check_s:
                    break
            else:
                raise TimeoutError(f"{OWNERSHIP_ASKS} answers came back late")
        except Exception as exc:
            if not crew.outage.failed(exc):
                logger.error("could not check a job fetched long ago (%s); not starting it", exc)
            owned = False
        else:
            if not owned:
                logger.warning(
                    "not starting a job fetched %.1fs ago: it was taken back while this process was silent",
                    time.monotonic() - work.fetched_at,
                )
        if not owned:
            crew.ledger.unhold(work)
        return owned

    def back_off(self) -> None:
        self.crew.quiet.wait(self.pauses.next_s())

    def recovered(self) -> None:
        if self.pauses.reset():
            self.crew.outage.succeeded()
