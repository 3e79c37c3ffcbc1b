"""A processor thread that dies of an error of ours (never of a job's own
exception, G14) is replaced and counted, and the job it held comes back."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from typing import Any

import redis

from django_cogworker.ledger import Ledger
from testproject.testapp import jobs
from tests.conftest import wait_for
from tests.test_guarantees import keys, leftovers, runs


def test_a_processor_that_dies_is_replaced_counted_and_its_job_runs(cog, in_process, monkeypatch):
    original = Ledger.started
    crashed: list[bytes] = []

    def started(ledger: Ledger, index: int, work: Any) -> None:
        if not crashed:
            crashed.append(work.raw)
            raise RuntimeError("a bug of ours, between fetching a job and starting it")
        original(ledger, index, work)

    monkeypatch.setattr(Ledger, "started", started)
    first, second = str(jobs.record.delay("first")), str(jobs.record.delay("second"))
    worker = in_process(concurrency=1)
    # The replacement runs the second job; the first, held by the dead
    # thread, is a stray on the list, requeued on the second look.
    wait_for(lambda: runs(cog)[second], 10, "the replacement thread to run a job")
    wait_for(lambda: runs(cog)[first], 15, "the held job to come back as a stray and run")
    assert worker.manager.crashes == 1
    identity = worker.identity
    wait_for(
        lambda: cog.redis.hget(keys().process(identity), "processor_crashes") == b"1", 5, "the beat to say so"
    )
    worker.stop()
    assert runs(cog) == Counter({first: 1, second: 1})
    assert leftovers(cog) == {}


def test_idle_threads_whose_waits_end_together_read_the_paused_queues_once_a_second(cog, own_redis):
    """Every idle thread's BLMOVE times out each second, all at once (on
    the one CPU of the process); the set of paused queues is read by one of
    them, not by each. On a server of its own: the count of blocked
    clients would else take in other tests' workers."""
    own_redis()
    threads = 8
    worker = cog.start_worker(CONCURRENCY=threads)
    wait_for(lambda: waiting(cog) == threads, what="every thread waiting on BLMOVE")
    reads: list[float] = []
    monitor = cog.redis.monitor()
    paused = cog.key("paused")

    def watch() -> None:
        with contextlib.suppress(redis.ConnectionError, OSError, ValueError):
            for seen in monitor.listen():
                if seen["command"] == f"SMEMBERS {paused}":
                    reads.append(time.monotonic())

    watcher = threading.Thread(target=watch, daemon=True)
    with monitor:
        watcher.start()
        began = time.monotonic()
        wait_for(lambda: time.monotonic() - began > 3.5 and worker.alive(), what="three and a half seconds")
        monitor.connection.disconnect()
        # Before the block's end drops the connection: a watcher not yet woken
        # by the disconnect (a loaded machine) would else read from None.
        watcher.join(5)
    # About one a second: four at most (about twenty when each thread read it).
    assert 2 <= len(reads) <= 5, reads


def waiting(cog) -> int:
    return sum(1 for c in cog.redis.client_list() if c["cmd"] == "blmove" and "b" in c["flags"])
