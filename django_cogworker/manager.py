"""The manager: the processor threads of one worker process, and its shutdown.

Duties: let the client's pool open a connection per thread and the spares
(:func:`fit_pool`); start ``CONCURRENCY`` processors, and replace (and
count) one that dies of an error of ours; on quiet, stop fetching and give
back the jobs fetched for threads that will not run them; on shutdown (G8)
quiet at once, wait up to ``SHUTDOWN_TIMEOUT``, interrupt what still runs
(filed in retry a little ahead, a bounded number of times), and have the
settler put the rest of this process's list back; a run past its
``hard_timeout`` (``timeouts.py``) asks for that shutdown (the launcher
exits with status 3), and is filed as failed with ``JobTimeout``, once,
before the process exits: it never starts again while its stuck thread
lives. The memory of the jobs is the ledger's, telling Redis how they
ended is the settler's, the fetch is the fetcher's.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

import redis

from django_cogworker import execution, registry, threads, timeouts
from django_cogworker.conf import Config, QueueSpec
from django_cogworker.connection import Client, is_cluster
from django_cogworker.errors import BadPayload
from django_cogworker.fetch import FetchContext, Fetcher
from django_cogworker.fetch_mode import Fetching
from django_cogworker.ledger import Ledger, Pending
from django_cogworker.limits import running
from django_cogworker.payload import encode_stored
from django_cogworker.process import ProcessContext
from django_cogworker.processor import Crew, Processor
from django_cogworker.settle import Settler
from django_cogworker.work import UnitOfWork

logger = logging.getLogger("django_cogworker")

#: A job still running at the shutdown deadline is filed in retry this far
#: ahead, so no second run starts while the first may still be alive.
INTERRUPT_DELAY_S = 10.0
#: After this many interrupts a job is requeued normally: a job that never
#: fits in a deploy window must not be pushed into the future forever.
MAX_INTERRUPTS = 3


#: Connections a worker process holds besides one per processor thread: its
#: other threads', its boot's and stop's, and room for the threads a job
#: may start (a job's own calls ride on its thread's share while it runs).
SPARE_CONNECTIONS = 10


def pool_size(concurrency: int, async_concurrency: int = 0) -> int:
    """The connections a worker process may hold at once (docs/settings.md,
    ``REDIS_OPTIONS``): one per processor thread (held while it blocks in a
    fetch), one per ``async def`` job in flight, and :data:`SPARE_CONNECTIONS`."""
    return concurrency + async_concurrency + SPARE_CONNECTIONS


def fit_pool(client: Client, config: Config, connections: int) -> None:
    """Lets ``client``'s pool (each node's, on a cluster) open
    ``connections`` at once, for a worker process: redis-py's own limit
    (100 connections since redis-py 6) is below what ``-c 100`` needs, and
    a pool that runs out fails the heartbeat. A ``max_connections`` the
    user set (``REDIS_OPTIONS``, or the cache's pool) is theirs: a warning
    when it is too low, no change."""
    if is_cluster(client):
        client.nodes_manager.connection_kwargs.setdefault("max_connections", connections)
        pools = [
            node.redis_connection.connection_pool for node in client.get_nodes() if node.redis_connection
        ]
    else:
        pools = [client.connection_pool]
    chosen = "max_connections" in config.redis_options or bool(config.cache_alias)
    for pool in pools:
        limit = getattr(pool, "max_connections", None)
        if not isinstance(limit, int) or limit >= connections:
            continue
        if chosen or isinstance(pool, redis.BlockingConnectionPool):  # its size is fixed when it is made
            logger.warning(
                "the Redis connection pool allows %d connections, and this worker may need %d at once "
                "(concurrency + %d): raise max_connections in REDIS_OPTIONS (or the cache's pool)",
                limit,
                connections,
                SPARE_CONNECTIONS,
            )
            return
        pool.max_connections = connections


class Manager:
    def __init__(
        self,
        process: ProcessContext,
        queues: tuple[QueueSpec, ...],
        concurrency: int,
        fetch: str,
        shutdown_timeout_s: float,
    ) -> None:
        self.process = process
        self.config = config = process.config
        self.identity = identity = process.identity
        self.client = process.client
        self.keys = process.keys
        self.outage = process.outage
        self.queues = queues
        self.concurrency = concurrency
        self.shutdown_timeout_s = shutdown_timeout_s
        # The loop of async jobs (SPEC section 15) holds one connection at a
        # time, as its settling thread does.
        self.async_concurrency = config.async_concurrency if registry.has_coroutine_jobs() else 0
        fit_pool(self.client, config, pool_size(concurrency, 2 if self.async_concurrency else 0))
        # Set by SIGTSTP and first thing on stop. Every sleep of a processor
        # (idle backoff, outage backoff, a wait for a slot) waits on it, so
        # none holds up a shutdown (G9).
        self.quiet = threading.Event()
        self.stopping = threading.Event()
        # G19: a coroutine job holds a ledger slot as a thread's job does.
        self.ledger = Ledger(concurrency + self.async_concurrency, self.quiet)
        self.context = FetchContext(
            self.client, self.keys, config, identity, queues, self.quiet, self.ledger, process.registration
        )
        self.fetching = Fetching(self.context, fetch)
        self.settler = Settler(self.context, self.fetching, self.outage)
        self.coroutines = None
        if self.async_concurrency:
            # Loaded here: a worker with no ``async def`` job never needs it.
            from django_cogworker.coroutines import Coroutines

            self.coroutines = Coroutines(
                config, self.ledger, self.settler, self.quiet, concurrency, self.loop_crashed, self.stuck_run
            )
        if self.coroutines is not None:
            self.ledger.loop_room = self.coroutines.room
        crew = Crew(
            config, self.ledger, self.fetching, self.settler, self.outage, self.quiet, self.coroutines
        )
        self.crew = crew
        self._threads: dict[int, threading.Thread] = {}
        self.crashes = 0
        #: jid -> hard timeout (s) of the runs stuck past it.
        self.stuck: dict[str, float] = {}
        #: Called once when a run is stuck: the launcher stops the process.
        self.on_stuck: Callable[[], None] = lambda: None
        #: Called when the event loop's thread dies: the launcher stops the
        #: process with a non-zero status.
        self.on_crash: Callable[[], None] = lambda: None

    # -- what the other roles read ---------------------------------------------------

    def fetcher(self) -> Fetcher:
        return self.fetching.current()

    @property
    def fetch_mode(self) -> str:
        return self.fetching.mode

    @property
    def reliable(self) -> bool:
        return self.fetching.reliable

    @property
    def revival_check_s(self) -> float:
        return self.crew.revival_check_s

    def status(self) -> dict[str, str]:
        """The fields of the process record that the processors decide."""
        return {
            "concurrency": str(self.concurrency),
            "async_concurrency": str(self.async_concurrency),
            "queues": json.dumps([q.name if not q.weight else f"{q.name},{q.weight}" for q in self.queues]),
            "busy": str(self.busy()),
            "quiet": "1" if self.quiet.is_set() else "0",
            "fetch": self.fetch_mode,
            "processor_crashes": str(self.crashes),
        }

    def busy(self) -> int:
        return self.ledger.busy()

    def running_counter(self) -> Counter[bytes]:
        return self.ledger.running_counter()

    def snapshot(self) -> tuple[list[tuple[UnitOfWork, float, str]], dict[bytes, Pending]]:
        """The jobs running now (with when they started and their jid) and
        the settlements owed."""
        running = [(r.work, r.started_at, r.work.jid) for _, r in self.ledger.running_now()]
        return running, self.ledger.owed()

    # -- the processors ------------------------------------------------------------------

    def start(self) -> None:
        timeouts.on_stuck(self.stuck_run)
        # What acquire() in job code needs of this process (SPEC section 14).
        running.bind(self.client, self.keys, self.identity, self.settler.waker)
        if self.coroutines is not None:
            self.coroutines.start()
        for index in range(self.concurrency):
            self.start_processor(index)

    def start_processor(self, index: int) -> None:
        processor = Processor(self.crew, index)
        self._threads[index] = threads.start(
            f"cogworker-processor-{index}", processor.run, lambda _name: self.processor_crashed(processor)
        )

    def loop_crashed(self) -> None:
        self.on_crash()

    def processor_crashed(self, processor: Processor) -> None:
        """A processor died of an error of ours (a job's own exceptions never
        get here, G14): the job it held or ran, if any, is released in the
        ledger, so the stray check requeues it (G7), and a new thread takes
        its place."""
        self.crashes += 1
        work, index = processor.current, processor.index
        if work is not None:
            running = dict(self.ledger.running_now()).get(index)
            if running is not None and running.work is work:
                self.ledger.finished(index, work, None)
            else:
                self.ledger.unhold(work)
        if not self.quiet.is_set():
            logger.error("replacing processor %d (%d crash(es) in this process)", index, self.crashes)
            self.start_processor(index)

    # -- quiet and shutdown (G8) -------------------------------------------------------------

    def stop_fetching(self) -> None:
        """Quiet: no new job; those fetched for threads go back to their queues."""
        self.quiet.set()
        self.ledger.wake()
        fetcher = self.fetching.peek()
        if fetcher is not None:
            for work in fetcher.take_buffered():
                self.settler.give_back(work)

    def wait_for_processors(self, deadline: float, skip: frozenset[int] = frozenset()) -> None:
        for index, thread in list(self._threads.items()):
            if index not in skip:
                thread.join(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """Quiet, wait up to the timeout, then settle what is left."""
        self.stop_fetching()
        deadline = time.monotonic() + self.shutdown_timeout_s
        # No wait for a stuck thread: it will not finish.
        self.wait_for_processors(deadline, frozenset(index for index, _ in self.stuck_runs()))
        # The threads that ended closed their own; those of threads still
        # running (a stuck job, the deadline) close here.
        self.context.blocking.close_all()
        if self.coroutines is not None:
            self.coroutines.drain(deadline)
        self.stopping.set()
        self.file_stuck()
        # Coroutines still running are cancelled; those that ended so go back
        # at once, the others as any job running at the deadline.
        ended = self.coroutines.cancel() if self.coroutines is not None else set()
        running = [r.work for _, r in self.ledger.running_now() if r.work.jid not in self.stuck]
        if running:
            logger.warning("%d job(s) still running at the shutdown deadline", len(running))
            self.interrupt(running, ended)
        self.settler.settle_unfinished()

    # -- hard timeouts -----------------------------------------------------------------

    def stuck_run(self, jid: str, hard_timeout_s: float) -> None:
        """From the watchdog thread: a run is past its ``hard_timeout``."""
        first = not self.stuck
        self.stuck[jid] = hard_timeout_s
        logger.error(
            "jid=%s exceeded its hard_timeout of %gs; this process stops fetching, lets its other jobs "
            "finish and exits with status 3",
            jid,
            hard_timeout_s,
        )
        if first:
            self.on_stuck()

    def stuck_runs(self) -> list[tuple[int, UnitOfWork]]:
        return [(i, r.work) for i, r in self.ledger.running_now() if r.work.jid in self.stuck]

    def file_stuck(self) -> None:
        """Each run still stuck is filed as failed with ``JobTimeout``, then
        marked interrupted: should its thread ever return, its outcome is
        not settled a second time (the process exits first, in any case)."""
        for index, work in self.stuck_runs():
            running = dict(self.ledger.running_now()).get(index)
            took_s = time.time() - running.started_at if running is not None else 0.0
            try:
                payload = work.payload()
            except BadPayload:
                continue  # it could not have run
            outcome = execution.hard_timed_out(payload, self.config, self.stuck[work.jid], took_s)
            self.settler.settle(work, outcome)
            self.ledger.interrupt(work.raw)

    def interrupt(
        self, running: list[UnitOfWork], ended: set[bytes] | frozenset[bytes] = frozenset()
    ) -> None:
        """Files each job in retry with its interrupt count: due at once when
        its run is known to have ended (a cancelled coroutine), else
        ``INTERRUPT_DELAY_S`` ahead."""
        for work in running:
            if not self.reliable:
                self.settler.give_back(work)
                continue
            try:
                payload = dict(work.payload())
            except BadPayload:
                continue  # requeued with the rest; filed in dead when run
            count = int(payload.get("interrupt_count", 0)) + 1
            if count > MAX_INTERRUPTS:
                continue  # requeued normally by the shutdown requeue
            payload["interrupt_count"] = count
            jid = work.jid
            delay_s = 0.0 if work.raw in ended else INTERRUPT_DELAY_S
            try:
                filed = self.fetcher().file(
                    work, self.keys.retry, time.time() + delay_s, encode_stored(payload), jid, False
                )
            except Exception as exc:
                logger.error("could not interrupt jid=%s (%s); it is requeued instead", jid, exc)
                continue
            if filed:
                self.ledger.interrupt(work.raw)
                logger.warning("interrupted jid=%s; filed in retry to run in %.0fs", jid, delay_s)
