"""Fetching jobs: reliable (the default) and basic.

Reliable fetch (G1, G9) moves each job atomically from its queue to this
process's own ``N:inprogress:<identity>`` list, where it stays until it is
acknowledged or filed; a process that dies leaves its jobs there for orphan
recovery to put back. One distinct unpaused queue: a blocking ``BLMOVE``.
Several: ``fetch.lua`` tries them in (weighted) order in one call, and an
idle thread backs off from 0.25 s doubling up to ``FETCH_IDLE_MAX_INTERVAL``.

Basic fetch is ``BRPOP``: a process killed mid-job loses the jobs it held.
It is what servers older than Redis 6.2 get (G10).
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from django_cogworker.connection import Client
from django_cogworker.errors import UnsupportedServer
from django_cogworker.scripts import Arg, script

if TYPE_CHECKING:
    from django_cogworker.manager import Manager, Slots

#: How long one blocking fetch waits on the server. Bounds how long a
#: blocked thread takes to notice quiet or shutdown (a job it receives then
#: is given back).
BLOCKING_TIMEOUT_S = 1.0

#: First pause of an idle thread polling several queues.
EMPTY_POLL_INTERVAL_S = 0.25

#: How often the paused-queue set is re-read.
PAUSED_REFRESH_S = 1.0

logger = logging.getLogger("django_cogworker")

MIN_REDIS_VERSION = (6, 2)

BROKEN_QUEUE_LOG_INTERVAL_S = 60.0

#: How requeue.lua marks the payload of a job it recovered from a dead process.
RECOVERED_MARK = b'"orphaned":'


@dataclass(frozen=True)
class UnitOfWork:
    queue: str
    raw: bytes
    #: When the fetch that brought it returned (monotonic clock): a job not
    #: started soon after is checked to be still ours first (G18).
    fetched_at: float = 0.0

    @property
    def recovered(self) -> bool:
        """Once recovered from a dead process (requeue.lua marks it)."""
        return RECOVERED_MARK in self.raw


def is_unknown_command(exc: redis.ResponseError) -> bool:
    text = str(exc).lower()
    return "unknown command" in text or "unknown redis command" in text


def reliable_supported(client: Client) -> bool:
    """Whether the server can do reliable fetch: >= 6.2, and BLMOVE and LPOS
    not renamed or disabled. A connection error propagates: not an answer,
    so the caller asks again later instead of remembering a guess."""
    try:
        version = client.info("server").get("redis_version", "")
        parts = tuple(int(p) for p in str(version).split(".")[:2])
    except (redis.ConnectionError, redis.TimeoutError):
        raise
    except (redis.RedisError, ValueError):
        parts = MIN_REDIS_VERSION  # INFO restricted: assume current; runtime errors still catch it
    if parts < MIN_REDIS_VERSION:
        return False
    try:
        # One argument "COMMAND INFO", not two: redis-py parses the reply of
        # "COMMAND" and fails (TypeError) on the nil entry a renamed or
        # disabled command gets, so the check would never get an answer.
        found = client.execute_command("COMMAND INFO", "BLMOVE", "LPOS")
    except (redis.ConnectionError, redis.TimeoutError):
        raise
    except redis.RedisError:
        return True
    return all(entry for entry in found)


class Fetcher:
    """Shared by all processor threads of one process."""

    reliable = False

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.client = manager.client
        self.keys = manager.keys
        self._paused: frozenset[str] = frozenset()
        self._paused_at = 0.0
        self._idle = threading.local()
        self._broken_logged_at = -BROKEN_QUEUE_LOG_INTERVAL_S

    def active_queues(self) -> list[str]:
        """Queue names to try now, in order (weighted: shuffled by weight)."""
        now = time.monotonic()
        if now - self._paused_at > PAUSED_REFRESH_S:
            self._paused = frozenset(m.decode() for m in self.client.smembers(self.keys.paused))
            self._paused_at = now
        specs = [q for q in self.manager.queues if q.name not in self._paused]
        if not any(q.weight for q in specs):
            return [q.name for q in specs]
        pool = [q.name for q in specs for _ in range(q.weight)]
        random.shuffle(pool)
        return list(dict.fromkeys(pool))

    def idle_sleep(self) -> None:
        cap = self.manager.config.fetch_idle_max_interval_s
        last = getattr(self._idle, "interval", None)
        interval = min(last * 2, cap) if last else min(EMPTY_POLL_INTERVAL_S, cap)
        self._idle.interval = interval
        self.manager.quiet.wait(interval * (0.75 + random.random() * 0.25))

    def not_idle(self) -> None:
        self._idle.interval = None

    def report_broken_queue(self, detail: bytes) -> None:
        """Logs a queue key that cannot be read, once a minute at most."""
        now = time.monotonic()
        if now - self._broken_logged_at > BROKEN_QUEUE_LOG_INTERVAL_S:
            self._broken_logged_at = now
            logger.error(
                "skipping a queue that cannot be read (%s); the others go on", detail.decode(errors="replace")
            )

    # -- the interface every fetch implements -------------------------------

    def retrieve(self, done: tuple[UnitOfWork, str] | None = None) -> UnitOfWork | None:
        """The next job or None; acknowledges ``done`` (previous job, jid) first."""
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

    def flush_acks(self) -> None:
        """Sends acknowledgements still waiting for a fetch (none by default)."""

    def return_buffered(self) -> None:
        """Gives back jobs fetched ahead for threads (none by default)."""

    def _trim_args(self, zset: str, trim: bool) -> list[Arg]:
        if not trim:
            return ["", ""]
        config = self.manager.config
        return [repr(time.time() - config.dead_timeout_s), str(config.dead_max_jobs)]


class BasicFetch(Fetcher):
    def retrieve(self, done: tuple[UnitOfWork, str] | None = None) -> UnitOfWork | None:
        queues = self.active_queues()
        if not queues:
            self.manager.quiet.wait(BLOCKING_TIMEOUT_S)
            return None
        got = self.client.brpop([self.keys.queue(q) for q in queues], timeout=BLOCKING_TIMEOUT_S)
        if got is None:
            return None
        key, raw = got
        return UnitOfWork(key.decode().removeprefix(self.keys.queue_prefix), raw, time.monotonic())

    def ack(self, work: UnitOfWork, jid: str) -> None:
        pass

    def file(self, work: UnitOfWork, zset: str, score: float, payload: bytes, jid: str, trim: bool) -> bool:
        args: list[Arg] = [work.raw, repr(score), payload, "0", *self._trim_args(zset, trim)]
        return bool(
            script("file")(
                self.client,
                [self.keys.inprogress(self.manager.identity), zset, self.keys.orphanings(jid)],
                args,
            )
        )

    def give_back(self, work: UnitOfWork) -> None:
        self.client.rpush(self.keys.queue(work.queue), work.raw)


class ReliableFetch(Fetcher):
    """Jobs are taken in batches while the worker is busy: one call
    acknowledges what the threads finished and moves a job for the calling
    thread and one for each other thread waiting for one. Slots are
    reserved with the manager before the call (G19), so threads finishing
    together never fetch for the same free threads, and a job fetched for
    another thread waits in memory (on the in-progress list, known to the
    manager as held, so never a stray) only until that thread picks it up.
    An ack waits in memory (as a pending ack, never to be run again) for the
    next call. When the queues run dry, a thread acknowledges at once, and
    with one queue it then blocks on BLMOVE."""

    reliable = True

    def __init__(self, manager: Manager) -> None:
        super().__init__(manager)
        self.inprogress = self.keys.inprogress(manager.identity)
        self.buffer: collections.deque[UnitOfWork] = collections.deque()
        self.acks: list[tuple[UnitOfWork, str]] = []
        self._acks_lock = threading.Lock()

    def retrieve(self, done: tuple[UnitOfWork, str] | None = None) -> UnitOfWork | None:
        """The next job; ``done`` (the thread's previous job and its jid) is
        acknowledged with this thread's call to Redis, or, when a job
        fetched by another thread is taken instead, with the next call."""
        queues = self.active_queues()
        if not queues:
            self.defer(done)
            self.flush_acks()
            self.manager.quiet.wait(BLOCKING_TIMEOUT_S)
            return None
        # A thread about to block on BLMOVE (idle, one queue) reserves only
        # its own slot, so that every idle thread can wait there at once.
        blocking = (
            len(queues) == 1 and done is None and not self.acks and getattr(self._idle, "blocking", False)
        )
        slot = self.manager.reserve(self.buffer, 1 if blocking else None)
        if slot is None or isinstance(slot, UnitOfWork):
            self.defer(done)
            return slot
        works: list[UnitOfWork] = []
        try:
            works = self.fetch(queues, slot, done)
        finally:
            self.manager.fetched(works, slot, self.buffer)
        return works[0] if works else None

    def defer(self, done: tuple[UnitOfWork, str] | None) -> None:
        if done is not None:
            with self._acks_lock:
                self.acks.append(done)

    def fetch(
        self, queues: list[str], slots: Slots, done: tuple[UnitOfWork, str] | None = None
    ) -> list[UnitOfWork]:
        """One call for up to ``slots.count`` jobs (the first for the
        caller), acknowledging ``done`` and the acks waiting."""
        k = self.keys
        try:
            with self._acks_lock:
                acks, self.acks = self.acks, []
            if done is not None:
                acks.append(done)
            if acks or len(queues) > 1 or not getattr(self._idle, "blocking", False):
                found = self.fetch_script(queues, acks, slots.count)
                if found and int(found[0]) > 0:
                    self.not_idle()
                    self._idle.blocking = False
                    queue = queues[int(found[0]) - 1]
                    now = time.monotonic()
                    return [UnitOfWork(queue, raw, now) for raw in found[1:]]
                if found or len(queues) > 1:
                    if found:
                        self.report_broken_queue(found[1])
                    self.idle_sleep()
                    return []
            self.manager.shrink(slots, 1)
            raw = self.client.blmove(k.queue(queues[0]), self.inprogress, BLOCKING_TIMEOUT_S, "RIGHT", "LEFT")
        except redis.ResponseError as exc:
            if is_unknown_command(exc):
                raise UnsupportedServer(str(exc)) from exc
            if "WRONGTYPE" in str(exc):
                self.report_broken_queue(f"{k.queue(queues[0])}: {exc}".encode())
                self.idle_sleep()
                return []
            raise
        # Idle with one queue: the next call blocks at once, without a script
        # call first (no polling), until a job comes.
        self._idle.blocking = raw is None
        return [] if raw is None else [UnitOfWork(queues[0], raw, time.monotonic())]

    def fetch_script(self, queues: list[str], acks: list[tuple[UnitOfWork, str]], want: int) -> Any:
        k = self.keys
        # Recovered jobs are acknowledged at once (their orphan counter goes
        # with the ack, see ack()): only jobs never orphaned ride here.
        found = script("fetch")(
            self.client,
            [*(k.queue(q) for q in queues), self.inprogress],
            [len(queues), max(1, want), *(work.raw for work, _ in acks)],
        )
        # Sent: they are acknowledged (a call that failed leaves them pending
        # in the manager's memory, where reconcile settles them).
        self.manager.forget_pending_many([work.raw for work, _ in acks])
        return found

    def still_owned(self, work: UnitOfWork) -> bool:
        """Whether the job is still on this process's list (G18): after a
        long pause it may have been recovered and run elsewhere."""
        return self.client.lpos(self.inprogress, work.raw) is not None

    def flush_acks(self) -> None:
        """Acknowledges what waits, now (the thread will not fetch soon)."""
        with self._acks_lock:
            acks, self.acks = self.acks, []
        for work, jid in acks:
            self.manager.settle_ack(work, jid)

    def return_buffered(self) -> None:
        """Gives back the jobs taken for threads that will not run them (quiet)."""
        while True:
            try:
                work = self.buffer.popleft()
            except IndexError:
                return
            self.manager.give_back(work)

    def ack(self, work: UnitOfWork, jid: str) -> None:
        script("ack")(self.client, [self.inprogress, self.keys.orphanings(jid)], [work.raw])

    def file(self, work: UnitOfWork, zset: str, score: float, payload: bytes, jid: str, trim: bool) -> bool:
        args: list[Arg] = [work.raw, repr(score), payload, "1", *self._trim_args(zset, trim)]
        return bool(script("file")(self.client, [self.inprogress, zset, self.keys.orphanings(jid)], args))

    def give_back(self, work: UnitOfWork) -> None:
        script("requeue_one")(self.client, [self.inprogress], [work.raw, *self.manager.requeue_args()])
