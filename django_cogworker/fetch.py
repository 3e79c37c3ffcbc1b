"""Fetching jobs: reliable (the default) and basic.

Reliable fetch (G1, G9) moves each job atomically from its queue to this
process's own ``N:inprogress:<identity>`` list, where it stays until it is
acknowledged or filed; a process that dies leaves its jobs there for orphan
recovery to put back. ``fetch.lua`` tries the queues in (weighted) order in
one call; when they are empty, an idle thread blocks on one of them with
``BLMOVE``, the idle threads spread over the queues (``waiting.Waiters``),
so that a push to any of them wakes one. A thread polls (from 0.25 s
doubling up to ``FETCH_IDLE_MAX_INTERVAL``) only a full Redis, which refuses
``BLMOVE``, or a broken queue.

Basic fetch is ``BRPOP``: a process killed mid-job loses the jobs it held.
It is what servers older than Redis 6.2 get (G10).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from django_cogworker.acks import Acks, Owed
from django_cogworker.conf import Config, QueueSpec
from django_cogworker.connection import is_sentinel
from django_cogworker.direct_blocking import BlockingConnections
from django_cogworker.errors import UnsupportedServer, is_full, is_unavailable, is_unknown_command
from django_cogworker.filing import file_job
from django_cogworker.keys import Keys
from django_cogworker.ledger import Ledger, Slots
from django_cogworker.process import Registration
from django_cogworker.requeue import ORPHANINGS_TTL_S, orphan_count, requeue_one
from django_cogworker.scripts import script
from django_cogworker.waiting import Backoff, Idle, Paused, Waiters
from django_cogworker.work import UnitOfWork

if TYPE_CHECKING:
    from django_cogworker.connection import Client

#: How long one blocking fetch waits on the server. Bounds how long a
#: blocked thread takes to notice quiet or shutdown (a job it receives then
#: is given back).
BLOCKING_TIMEOUT_S = 1.0

#: A full Redis refuses BLMOVE (it may grow memory): an idle thread then
#: polls with fetch.lua, which it takes, this long before it blocks again.
FULL_POLL_S = 5.0

#: How often a broken queue is logged.
BROKEN_QUEUE_LOG_INTERVAL_S = 60.0

logger = logging.getLogger("django_cogworker")

__all__ = ["STRATEGIES", "BasicFetch", "FetchContext", "Fetcher", "ReliableFetch", "UnitOfWork"]


@dataclass(frozen=True)
class FetchContext:
    """What a fetcher needs of its process, and no more."""

    client: Client
    keys: Keys
    config: Config
    identity: str
    queues: tuple[QueueSpec, ...]
    quiet: threading.Event
    ledger: Ledger
    #: Fresh while the last beat is recent: a reliable fetch waits for it (G18).
    registration: Registration = field(default_factory=Registration)
    #: Each processor thread's connection for its BLMOVE.
    blocking: BlockingConnections = field(default_factory=BlockingConnections)


class Fetcher:
    """Shared by all processor threads of one process."""

    reliable = False
    name = ""

    def __init__(self, ctx: FetchContext, acks: Acks) -> None:
        self.ctx = ctx
        self.acks = acks
        self.client, self.keys = ctx.client, ctx.keys
        self.paused = Paused(ctx.client, ctx.keys.paused)
        self._idle = Idle()
        self.backoff = Backoff(ctx.config.fetch_idle_max_interval_s, ctx.quiet)
        self._broken_logged_at = -BROKEN_QUEUE_LOG_INTERVAL_S

    def active_queues(self) -> list[str]:
        """Queue names to try now, in order (weighted: shuffled by weight)."""
        paused = self.paused.now()
        specs = [q for q in self.ctx.queues if q.name not in paused]
        if not any(q.weight for q in specs):
            return [q.name for q in specs]
        pool = [q.name for q in specs for _ in range(q.weight)]
        random.shuffle(pool)
        return list(dict.fromkeys(pool))

    def report_broken_queue(self, detail: bytes) -> None:
        """Logs a queue key that cannot be read, once a minute at most."""
        now = time.monotonic()
        if now - self._broken_logged_at > BROKEN_QUEUE_LOG_INTERVAL_S:
            self._broken_logged_at = now
            logger.error(
                "skipping a queue that cannot be read (%s); the others go on", detail.decode(errors="replace")
            )

    # -- the interface every fetch implements -------------------------------

    def retrieve(self) -> UnitOfWork | None:
        """The next job or None."""
        raise NotImplementedError

    def ack(self, work: UnitOfWork, jid: str) -> None:
        raise NotImplementedError

    def file(self, work: UnitOfWork, zset: str, score: float, payload: bytes, jid: str, trim: bool) -> bool:
        raise NotImplementedError

    def give_back(self, work: UnitOfWork) -> None:
        raise NotImplementedError

    def still_owned(self, work: UnitOfWork) -> bool:
        """Whether the job is still this process's to run (see ReliableFetch)."""
        return True

    def orphanings(self, work: UnitOfWork) -> int | None:
        """A recovered job's orphan count (G3; None: unreadable); 0 without a list."""
        return 0

    def mark_suspect(self, work: UnitOfWork) -> None:
        """Records, before it starts, the one isolated job this process
        runs (G3; see ReliableFetch). Nothing to record without a list."""

    def take_buffered(self) -> list[UnitOfWork]:
        """The jobs fetched for threads that will not run them (quiet), for
        the caller to give back (none by default)."""
        return []


class BasicFetch(Fetcher):
    name = "basic"

    def retrieve(self) -> UnitOfWork | None:
        queues = self.active_queues()
        if not queues:
            self.ctx.quiet.wait(BLOCKING_TIMEOUT_S)
            return None
        sent = time.monotonic()
        got = self.client.brpop([self.keys.queue(q) for q in queues], timeout=BLOCKING_TIMEOUT_S)
        if got is None:
            return None
        key, raw = got
        return UnitOfWork(self.keys.queue_of(key.decode()), raw, sent)

    def ack(self, work: UnitOfWork, jid: str) -> None:
        pass

    def file(self, work: UnitOfWork, zset: str, score: float, payload: bytes, jid: str, trim: bool) -> bool:
        ctx = self.ctx
        return file_job(ctx.client, ctx.keys, ctx.config, None, work.raw, zset, score, payload, jid, trim)

    def give_back(self, work: UnitOfWork) -> None:
        self.client.rpush(self.keys.queue(work.queue), work.raw)


class ReliableFetch(Fetcher):
    """Jobs are taken in batches while the worker is busy: one call
    acknowledges what the threads finished and moves a job for the calling
    thread and one for each other thread waiting for one. Slots are
    reserved in the ledger before the call (G19), so threads finishing
    together never fetch for the same free threads, and a job fetched for
    another thread waits in memory (on the in-progress list, known to the
    ledger as held, so never a stray) only until that thread picks it up.
    One such call is in flight at a time (BLMOVE aside): threads finishing
    meanwhile wait for it and share the next one, one call for several jobs.
    An ack waits in memory (``acks.Acks``: owed, never to be run again) for
    the next call. When the queues run dry, a thread acknowledges at once,
    then blocks on BLMOVE on one of them."""

    reliable = True
    name = "reliable"

    def __init__(self, ctx: FetchContext, acks: Acks) -> None:
        super().__init__(ctx, acks)
        self.inprogress = self.keys.inprogress(ctx.identity)
        self.buffer: collections.deque[UnitOfWork] = collections.deque()
        self.waiters = Waiters(ctx.queues)
        self._full_at = -FULL_POLL_S  # monotonic time of the last BLMOVE refused for want of memory
        self._renewing = not is_sentinel(ctx.client)  # else its master is followed between waits

    def retrieve(self) -> UnitOfWork | None:
        """The next job. The ack of the thread's previous job, waiting in
        ``acks`` since it finished, rides the next call (this thread's or
        one it waits for), or is sent at once when its next job was fetched
        before that call."""
        if not self.ctx.registration.awaited(self.ctx.quiet):
            return None  # silent past HEARTBEAT_TTL, then quiet: see Registration
        mine = self.acks.mine()
        queues = self.active_queues()
        if not queues:
            self.acks.flush(self.ack)
            self.ctx.quiet.wait(BLOCKING_TIMEOUT_S)
            return None
        # A thread about to block on BLMOVE (idle) reserves only its own
        # slot, so that every idle thread can wait at once.
        blocking = mine is None and not self.acks and self._idle.blocking
        slot = self.ctx.ledger.reserve(self.buffer, 1 if blocking else None)
        if slot is None or isinstance(slot, UnitOfWork):
            # No thread waits to make the next call: it would wait too long.
            if mine is not None and not self.ctx.ledger.waiting and self.acks.waits(mine):
                self.acks.flush(self.ack)
            return slot
        works: list[UnitOfWork] = []
        try:
            works = self.fetch(queues, slot)
        finally:
            self.ctx.ledger.fetched(works, slot, self.buffer)
        return works[0] if works else None

    def fetch(self, queues: list[str], slots: Slots) -> list[UnitOfWork]:
        """One call for up to ``slots.count`` jobs (the first for the
        caller), acknowledging the acks waiting; when the queues are empty,
        a wait on one. Its jobs are stamped with when it was *sent* (G18,
        ``Processor.still_ours``), or its last beat (``Registration.stamp``)."""
        waiting = self._idle.blocking
        queue = queues[0]
        try:
            acks = self.acks.take()
            polling = time.monotonic() - self._full_at < FULL_POLL_S
            # A thread whose wait ended looks at every queue (in order) before
            # it waits again, unless the others all have a thread waiting.
            if acks or polling or not waiting or self.waiters.uncovered(queues) > 1:
                sent = self.ctx.registration.stamp()
                found = self.fetch_script(queues, acks, slots.count)
                if found and int(found[0]) > 0:
                    self.backoff.reset()
                    self._idle.blocking = False
                    queue = queues[int(found[0]) - 1]
                    return [UnitOfWork(queue, raw, sent) for raw in found[1:]]
                if found or polling:
                    if found:
                        self.report_broken_queue(found[1])
                    self.ctx.ledger.shrink(slots, 0)
                    self.backoff.pause()
                    return []
            self.ctx.ledger.shrink(slots, 1)
            queue = self.waiters.enter(queues)
            try:
                key = self.keys.queue(queue)
                while True:
                    sent = self.ctx.registration.stamp()
                    raw = self.ctx.blocking.blmove(self.client, key, self.inprogress, BLOCKING_TIMEOUT_S)
                    if raw is not None or not self.renews(queue):
                        break
            finally:
                self.waiters.leave(queue)
        except redis.ResponseError as exc:
            if is_unavailable(exc):  # READONLY, MASTERDOWN...: an outage, not a broken queue
                raise
            if is_unknown_command(exc):
                raise UnsupportedServer(str(exc)) from exc
            if is_full(exc):  # BLMOVE refused: poll for a while (the heartbeat says "full")
                self._full_at = time.monotonic()
                self._idle.blocking = False
            elif "WRONGTYPE" in str(exc):
                self.report_broken_queue(f"{self.keys.queue(queue)}: {exc}".encode())
                self._idle.blocking = False
            else:
                raise
            self.ctx.ledger.shrink(slots, 0)
            self.backoff.pause()
            return []
        # Idle: the next call blocks at once, without a script call first
        # (no polling), until a job comes.
        self._idle.blocking = raw is None
        return [] if raw is None else [UnitOfWork(queue, raw, sent)]

    def renews(self, queue: str) -> bool:
        """Whether a thread whose wait on ``queue`` ended empty waits again at
        once, in a few calls: nothing that retrieve() would do first is due."""
        ctx = self.ctx
        return (
            self._renewing
            and not ctx.quiet.is_set()
            and not self.acks
            and not self.buffer
            and ctx.registration.awaited(ctx.quiet)
            and not self.paused.now()
            and self.waiters.stays(queue)
        )

    def fetch_script(self, queues: list[str], acks: list[Owed], want: int) -> Any:
        k = self.keys
        # Recovered jobs are acknowledged at once (their orphan counter goes
        # with the ack, see ack()): only jobs never orphaned ride here.
        found = script("fetch").run(
            self.client,
            [*(k.queue(q) for q in queues), self.inprogress],
            [len(queues), max(1, want), *(work.raw for work, _ in acks)],
        )
        # Sent: they are acknowledged (a call that failed leaves them owed in
        # the ledger, where reconcile settles them).
        self.acks.carried(acks)
        return found

    def still_owned(self, work: UnitOfWork) -> bool:
        """Whether the job is still on this process's list (G18): after a
        long pause it may have been recovered and run elsewhere."""
        return self.client.lpos(self.inprogress, work.raw) is not None

    def take_buffered(self) -> list[UnitOfWork]:
        taken: list[UnitOfWork] = []
        with contextlib.suppress(IndexError):
            while True:
                taken.append(self.buffer.popleft())
        return taken

    def ack(self, work: UnitOfWork, jid: str) -> None:
        script("ack")(self.client, [self.inprogress, self.keys.orphanings(jid)], [work.raw])

    def file(self, work: UnitOfWork, zset: str, score: float, payload: bytes, jid: str, trim: bool) -> bool:
        ctx, raw = self.ctx, work.raw
        return file_job(
            ctx.client, ctx.keys, ctx.config, self.inprogress, raw, zset, score, payload, jid, trim
        )

    def give_back(self, work: UnitOfWork) -> None:
        requeue_one(self.client, self.keys, self.inprogress, work.raw)

    def orphanings(self, work: UnitOfWork) -> int | None:
        return orphan_count(self.client.get(self.keys.orphanings(work.jid))) if work.jid else 0

    def mark_suspect(self, work: UnitOfWork) -> None:
        # If this process dies, recovery counts an orphaning only for this
        # isolated job, not for one merely held beside it (G3). A script:
        # a full Redis takes it (suspect.lua), not a SET.
        keys = [self.keys.suspect(self.ctx.identity), self.inprogress]
        script("suspect")(self.client, keys, [work.raw, ORPHANINGS_TTL_S])


#: The fetch strategies by name: what ``FETCH`` and ``--fetch`` accept.
STRATEGIES: dict[str, type[Fetcher]] = {"reliable": ReliableFetch, "basic": BasicFetch}
