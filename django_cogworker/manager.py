"""The manager: owns the processor threads and the process's memory of its jobs.

Duties: start ``CONCURRENCY`` processors; know which job each thread runs and
which finished jobs still owe Redis an ack or a filing (G6, G7: judged from
this memory, never from Redis); choose the fetch (reliable, or basic on an
old server, G10); count processed and failed jobs for the heartbeat; and on
shutdown (G8) quiet at once, wait up to ``SHUTDOWN_TIMEOUT``, interrupt what
still runs, and put the rest of this process's list back in one call.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

import redis

from django_cogworker import execution, threads
from django_cogworker.conf import Config, QueueSpec
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.execution import Outcome
from django_cogworker.fetch import BasicFetch, Fetcher, ReliableFetch, UnitOfWork, reliable_supported
from django_cogworker.outage import Outage
from django_cogworker.payload import decode, encode
from django_cogworker.processor import Processor

logger = logging.getLogger("django_cogworker")

#: A job still running at the shutdown deadline is filed in retry this far
#: ahead, so no second run starts while the first may still be alive.
INTERRUPT_DELAY_S = 10.0
#: After this many interrupts a job is requeued normally: a job that never
#: fits in a deploy window must not be pushed into the future forever.
MAX_INTERRUPTS = 3
#: TTL of the periodic running lock while its job waits in a queue.
PERIODIC_QUEUED_TTL_S = 3600

Pending = str | tuple[str, float, bytes, str, bool]  # "ack", or (zset, score, payload, jid, trim)

#: How long a thread whose job is being fetched by another thread's call
#: waits before it looks again (it is woken as soon as the call returns).
SLOT_WAIT_S = 0.25


@dataclass
class Slots:
    """Slots reserved for one fetch call."""

    count: int


class Manager:
    def __init__(
        self,
        config: Config,
        identity: str,
        queues: tuple[QueueSpec, ...],
        concurrency: int,
        fetch: str,
        shutdown_timeout_s: float,
    ) -> None:
        self.config = config
        self.identity = identity
        self.queues = queues
        self.concurrency = concurrency
        self.fetch_mode = fetch
        self.shutdown_timeout_s = shutdown_timeout_s
        self.client = get_redis()
        self.keys = get_keys()
        # Set by SIGTSTP and first thing on stop. Every sleep of a processor
        # (idle backoff, outage backoff) waits on it, so none holds up a
        # shutdown by up to FETCH_IDLE_MAX_INTERVAL (G9).
        self.quiet = threading.Event()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        # Woken whenever fetched jobs arrive or a fetch's reservation ends.
        self._slots = threading.Condition(self._lock)
        self._fetcher: Fetcher | None = None
        self._threads: list[threading.Thread] = []
        self.running: dict[int, tuple[UnitOfWork, float, str]] = {}
        self.running_raw: Counter[bytes] = Counter()
        # Fetched ahead for the next free thread (see ReliableFetch): on our
        # list, not running yet, and not strays either.
        self.held: Counter[bytes] = Counter()
        # Jobs that fetch calls in flight may bring (G19): counted with the
        # running and held ones, so that threads finishing together do not
        # each fetch for the same free threads.
        self.reserved = 0
        # Jobs recovered from a dead process run one at a time (see Processor).
        self.suspects_running = 0
        self.pending: dict[bytes, Pending] = {}
        self.interrupted: set[bytes] = set()
        self.processed = 0
        self.failed = 0
        self.outage = Outage()

    # -- fetch ---------------------------------------------------------------

    def fetcher(self) -> Fetcher:
        fetcher = self._fetcher
        if fetcher is not None:
            return fetcher
        with self._lock:
            if self._fetcher is None:
                self._fetcher = self._choose_fetch()
            return self._fetcher

    def _choose_fetch(self) -> Fetcher:
        if self.fetch_mode == "basic":
            return BasicFetch(self)
        # A connection error propagates (the processor backs off and asks
        # again): a guess made while Redis is unreachable is not an answer.
        if reliable_supported(self.client):
            return ReliableFetch(self)
        logger.warning(
            "this Redis server cannot do reliable fetch (it needs Redis >= 6.2 with BLMOVE and LPOS); "
            "falling back to basic fetch: a worker killed mid-job loses the jobs it held"
        )
        self.fetch_mode = "basic"
        return BasicFetch(self)

    def fall_back_to_basic(self, reason: str) -> None:
        with self._lock:
            if isinstance(self._fetcher, BasicFetch):
                return
            logger.warning("reliable fetch refused by the server (%s); falling back to basic fetch", reason)
            self.fetch_mode = "basic"
            self._fetcher = BasicFetch(self)

    @property
    def reliable(self) -> bool:
        return self.fetch_mode != "basic"

    @property
    def revival_check_s(self) -> float:
        """A job not started this long after its fetch is checked to be
        still ours first (G18): half the shortest time after which another
        process could have taken it (no beat for HEARTBEAT_TTL, and
        ORPHAN_THRESHOLD since the last one)."""
        return min(self.config.heartbeat_ttl_s, self.config.orphan_threshold_s) / 2

    def requeue_args(self) -> list[str | int]:
        return [self.keys.queue_prefix, "default", self.keys.periodic_running_prefix, PERIODIC_QUEUED_TTL_S]

    # -- the processors' record ----------------------------------------------

    def start(self) -> None:
        for index in range(self.concurrency):
            processor = Processor(self, index)
            self._threads.append(threads.start(f"cogworker-processor-{index}", processor.run))

    def started(self, index: int, work: UnitOfWork) -> None:
        # The jid is read from the payload only when someone asks (a beat, a
        # shutdown): not on the hot path of every job.
        jid = ""
        with self._lock:
            if self.held[work.raw] > 0:
                self.held[work.raw] -= 1
                if self.held[work.raw] <= 0:
                    del self.held[work.raw]
            self.running[index] = (work, time.time(), jid)
            self.running_raw[work.raw] += 1

    def finished(self, index: int, work: UnitOfWork, outcome: Outcome | None) -> None:
        with self._slots:
            self._slots.notify_all()
            self.running.pop(index, None)
            self.running_raw[work.raw] -= 1
            if self.running_raw[work.raw] <= 0:
                del self.running_raw[work.raw]
            if outcome is not None:
                self.processed += 1
                self.failed += outcome.failed

    def settle(self, work: UnitOfWork, outcome: Outcome) -> None:
        """Tell Redis how the job ended; on failure keep it pending (G6)."""
        if work.raw in self.interrupted:
            return  # filed in retry by the shutdown already
        how: Pending
        if outcome.kind == execution.ACK:
            how = "ack"
        else:
            zset = self.keys.retry if outcome.kind == execution.RETRY else self.keys.dead
            how = (zset, outcome.score, outcome.encoded(), outcome.jid, outcome.kind == execution.DEAD)
        try:
            self.apply(work, how)
        except Exception as exc:
            if not self.outage.failed(exc):
                logger.error(
                    "could not settle jid=%s yet (%s: %s); will retry", outcome.jid, type(exc).__name__, exc
                )
            with self._lock:
                self.pending[work.raw] = how

    def defer_ack(self, work: UnitOfWork) -> None:
        """The job finished; its ack goes with the thread's next fetch."""
        if work.raw in self.interrupted:
            return
        with self._lock:
            self.pending[work.raw] = "ack"

    def settle_ack(self, work: UnitOfWork, jid: str) -> None:
        """Sends a deferred ack now (the thread is not fetching again)."""
        try:
            self.fetcher().ack(work, jid)
        except Exception as exc:
            if not self.outage.failed(exc):
                logger.error("could not acknowledge jid=%s yet (%s); will retry", jid, exc)
            return
        self.forget_pending(work.raw)

    def apply(self, work: UnitOfWork, how: Pending) -> None:
        fetcher = self.fetcher()
        if how == "ack":
            fetcher.ack(work, _jid_of(work.raw))
        else:
            assert isinstance(how, tuple)
            zset, score, payload, jid, trim = how
            fetcher.file(work, zset, score, payload, jid, trim)

    def give_back(self, work: UnitOfWork) -> None:
        self.unhold(work)
        try:
            self.fetcher().give_back(work)
        except Exception:
            # Still on our list: the shutdown requeue (or a stray check) puts it back.
            logger.exception("could not give back a fetched job; it stays in progress")

    def snapshot(self) -> tuple[list[tuple[UnitOfWork, float, str]], dict[bytes, Pending]]:
        with self._lock:
            running = list(self.running.values())
            pending = dict(self.pending)
        return [(work, at, jid or _jid_of(work.raw)) for work, at, jid in running], pending

    def running_counter(self) -> Counter[bytes]:
        """Jobs this process runs or holds for a thread, by payload."""
        with self._lock:
            return self.running_raw + self.held

    def unhold(self, work: UnitOfWork) -> None:
        with self._slots:
            self.held[work.raw] -= 1
            if self.held[work.raw] <= 0:
                del self.held[work.raw]
            self._slots.notify_all()

    def begin_suspect(self) -> bool:
        """Claims the one slot for a job recovered from a dead process."""
        with self._lock:
            if self.suspects_running:
                return False
            self.suspects_running = 1
            return True

    def end_suspect(self) -> None:
        with self._lock:
            self.suspects_running = 0

    def reserve(self, buffer: deque[UnitOfWork], most: int | None = None) -> UnitOfWork | Slots | None:
        """For a thread that wants a job: one fetched for it by another
        thread's call, or the slots it may fetch for itself (its own and one
        for each thread left without), reserved until :meth:`fetched`; None
        once quiet. G19: the jobs running, held and reserved never add up to
        more than ``CONCURRENCY``."""
        with self._slots:
            while True:
                if buffer:
                    return buffer.popleft()
                if self.quiet.is_set():
                    return None
                free = self.concurrency - len(self.running) - sum(self.held.values()) - self.reserved
                if free > 0:
                    if most is not None:
                        free = min(free, most)
                    self.reserved += free
                    return Slots(free)
                self._slots.wait(SLOT_WAIT_S)

    def shrink(self, slots: Slots, count: int) -> None:
        """Gives back all but ``count`` of a reservation (a thread about to
        block for one job must not keep the others waiting)."""
        with self._slots:
            if slots.count > count:
                self.reserved -= slots.count - count
                slots.count = count
                self._slots.notify_all()

    def fetched(self, works: list[UnitOfWork], slots: Slots, buffer: deque[UnitOfWork]) -> None:
        """Ends a reservation: the jobs a call brought are held (the first
        for the caller, the rest in ``buffer`` for the threads waiting)."""
        with self._slots:
            self.reserved -= slots.count
            slots.count = 0
            for work in works:
                self.held[work.raw] += 1
            buffer.extend(works[1:])
            self._slots.notify_all()

    def forget_pending_many(self, raws: list[bytes]) -> None:
        if not raws:
            return
        with self._lock:
            for raw in raws:
                if self.pending.get(raw) == "ack":
                    del self.pending[raw]

    def forget_pending(self, raw: bytes) -> None:
        with self._lock:
            self.pending.pop(raw, None)

    def take_counts(self) -> tuple[int, int]:
        with self._lock:
            counts = (self.processed, self.failed)
            self.processed = self.failed = 0
            return counts

    def give_counts_back(self, processed: int, failed: int) -> None:
        with self._lock:
            self.processed += processed
            self.failed += failed

    # -- shutdown (G8) -------------------------------------------------------

    def stop_fetching(self) -> None:
        """Quiet: no new job; those fetched ahead go back to their queues."""
        self.quiet.set()
        with self._slots:
            self._slots.notify_all()
        fetcher = self._fetcher
        if fetcher is not None:
            fetcher.return_buffered()

    def busy(self) -> int:
        with self._lock:
            return len(self.running)

    def wait_for_processors(self, deadline: float) -> None:
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def stop(self, settle_unfinished: Any) -> None:
        """Quiet, wait up to the timeout, then settle what is left.

        ``settle_unfinished`` is the recovery module's shutdown step (it owns
        the scripts that put a process's list back)."""
        self.quiet.set()
        with self._slots:
            self._slots.notify_all()
        deadline = time.monotonic() + self.shutdown_timeout_s
        self.wait_for_processors(deadline)
        self.stopping.set()
        fetcher = self._fetcher
        if fetcher is not None:
            # Acks still waiting for a fetch that will not come.
            fetcher.flush_acks()
        running, _ = self.snapshot()
        if running:
            logger.warning("%d job(s) still running at the shutdown deadline", len(running))
            self.interrupt(running)
        settle_unfinished(self)

    def interrupt(self, running: list[tuple[UnitOfWork, float, str]]) -> None:
        for work, _started, jid in running:
            if not self.reliable:
                self.give_back(work)
                continue
            try:
                payload = decode(work.raw)
            except Exception:
                continue  # requeued with the rest; filed in dead when run
            count = int(payload.get("interrupt_count", 0)) + 1
            if count > MAX_INTERRUPTS:
                continue  # requeued normally by the shutdown requeue
            payload["interrupt_count"] = count
            try:
                filed = self.fetcher().file(
                    work, self.keys.retry, time.time() + INTERRUPT_DELAY_S, encode(payload), jid, False
                )
            except Exception as exc:
                logger.error("could not interrupt jid=%s (%s); it is requeued instead", jid, exc)
                continue
            if filed:
                with self._lock:
                    self.interrupted.add(work.raw)
                logger.warning("interrupted jid=%s; filed in retry to run in %.0fs", jid, INTERRUPT_DELAY_S)


def _jid_of(raw: bytes) -> str:
    try:
        value = json.loads(raw)
    except Exception:
        return ""
    return str(value.get("jid", "")) if isinstance(value, dict) else ""


__all__ = ["Manager", "redis"]
