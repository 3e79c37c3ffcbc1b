"""G19 bounds: an in-progress list never holds more than CONCURRENCY jobs
that are running or fetched for a thread (finished jobs whose ack is still
on its way aside), and only a job that was running when its process died is
counted as orphaned."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter, deque

from django_cogworker.ledger import Ledger, Slots
from django_cogworker.payload import decode, encode
from django_cogworker.work import UnitOfWork
from testproject.testapp import jobs
from tests.conftest import CogEnv, wait_for
from tests.test_guarantees import keys, leftovers, raw_job, runs

CONCURRENCY = 4


def finished_jids(cog: CogEnv) -> set[str]:
    return {n["jid"] for n in cog.notes()}


def unfinished_on(cog: CogEnv, key: str) -> tuple[int, int]:
    """(entries on the list, entries whose job had not finished): the list
    is read first, the finished jobs after, so a job that finished in
    between counts as finished and the figure never overstates."""
    listed = [decode(raw)["jid"] for raw in cog.redis.lrange(key, 0, -1)]
    done = finished_jids(cog)
    return len(listed), sum(1 for jid in listed if jid not in done)


def test_g19_an_in_progress_list_never_holds_more_than_concurrency_unfinished_jobs(cog):
    """Threads finishing together must not each fetch for the same free
    threads: sampled under load, the list holds at most CONCURRENCY jobs
    that have not finished."""
    cog.configure(CONCURRENCY=CONCURRENCY)
    jids = jobs.pace.delay_many([((0.003, i), {}) for i in range(1500)])
    worker = cog.start_worker()
    key = keys().inprogress(worker.identity())
    samples: list[tuple[int, int]] = []
    while len(finished_jids(cog)) < len(jids) - 50:
        samples.append(unfinished_on(cog, key))
        assert worker.alive()
    wait_for(lambda: finished_jids(cog) >= set(jids), 30, "every job to run")
    busiest = max(unfinished for _, unfinished in samples)
    longest = max(listed for listed, _ in samples)
    print(f"\nG19: {len(samples)} samples: at most {busiest} unfinished, {longest} listed")
    assert len(samples) >= 20, "too few samples to say anything"
    assert busiest <= CONCURRENCY, f"{busiest} unfinished jobs listed by a process of {CONCURRENCY} threads"
    assert busiest >= 2, "the worker never ran jobs side by side: the test proved nothing"
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert leftovers(cog) == {}


def test_g19_a_finished_jobs_ack_goes_with_the_next_call_not_a_job_later(cog):
    """Jobs in step (all four threads finish together): one thread's call
    fetches for the others, which take their jobs from it. Their finished
    jobs' acks must go with that call or the next, not wait on the list for
    the next batch to end: a kill meanwhile would run them again."""
    cog.configure(CONCURRENCY=CONCURRENCY)
    jids = jobs.pace.delay_many([((0.2, i), {}) for i in range(60)])
    worker = cog.start_worker()
    key = keys().inprogress(worker.identity())
    lingering: list[int] = []
    while len(finished_jids(cog)) < len(jids) - 2 * CONCURRENCY:
        listed, unfinished = unfinished_on(cog, key)
        lingering.append(listed - unfinished)
        time.sleep(0.01)
    wait_for(lambda: finished_jids(cog) >= set(jids), 30, "every job to run")
    share = sum(1 for n in lingering if n) / len(lingering)
    print(f"\nG19: {len(lingering)} samples, finished jobs still listed in {share:.0%} of them")
    assert len(lingering) >= 50, "too few samples to say anything"
    assert share <= 0.1, (
        f"finished jobs left on the list in {share:.0%} of the samples (at most {max(lingering)})"
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


def test_g19_a_sigkill_orphans_at_most_concurrency_jobs(cog):
    """Killed under load, with one long job surely running (short jobs run
    in waves, and a kill between two would leave none unfinished): at least
    that one and at most CONCURRENCY jobs are left unfinished on the list."""
    cog.configure(CONCURRENCY=CONCURRENCY)
    jids = jobs.pace.delay_many([((0.01, i), {}) for i in range(300)])
    long_jid = str(jobs.sleep_then_record.delay(3, "running at the kill"))
    jids += [long_jid, *jobs.pace.delay_many([((0.01, i), {}) for i in range(300, 2000)])]
    worker = cog.start_worker()
    key = keys().inprogress(worker.identity())
    wait_for(lambda: [n for n in cog.notes("started") if n["jid"] == long_jid], 20, "the long job to start")
    wait_for(lambda: len(finished_jids(cog)) >= 300, 20, "the run to get going")
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    listed, unfinished = unfinished_on(cog, key)
    assert 1 <= unfinished <= CONCURRENCY, (listed, unfinished)
    survivor = cog.start_worker()
    wait_for(lambda: finished_jids(cog) >= set(jids) and leftovers(cog) == {}, 60, "every job to run")
    assert sum(n - 1 for n in runs(cog).values()) <= CONCURRENCY
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(15) == 0


def test_g19_a_recovered_job_that_finished_is_not_counted_again_when_its_process_dies(cog):
    """MAX_ORPHANINGS=1 and a job recovered once already (counter 1): it runs
    to completion in a busy process, which is then SIGKILLed. Its ack went at
    once, so recovery does not count it a second time (that would file a job
    that had finished in dead as ProcessDied)."""
    cog.configure(CONCURRENCY=CONCURRENCY, MAX_ORPHANINGS=1)
    r, k = cog.redis, keys()
    payload = decode(raw_job(jobs.record, "recovered once"))
    payload["orphaned"] = 1
    jid = str(payload["jid"])
    r.set(k.orphanings(jid), 1)
    # Busy around it: short jobs before and after, one long job that is still
    # running when the process is killed.
    before = jobs.pace.delay_many([((0.01, i), {}) for i in range(40)])
    r.lpush(k.queue("default"), encode(payload))
    long_jid = str(jobs.sleep_then_record.delay(3, "running at the kill"))
    after = jobs.pace.delay_many([((0.01, i), {}) for i in range(200)])
    worker = cog.start_worker()
    key = k.inprogress(worker.identity())
    wait_for(lambda: runs(cog)[jid], 20, "the recovered job to finish")
    wait_for(lambda: jid not in {decode(raw)["jid"] for raw in r.lrange(key, 0, -1)}, 2, "its ack")
    wait_for(lambda: [n for n in cog.notes("started") if n["jid"] == long_jid], 20, "the long job to start")
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    survivor = cog.start_worker()
    pending = {*before, *after, long_jid}
    wait_for(lambda: finished_jids(cog) >= pending and leftovers(cog) == {}, 60, "every job to run")
    assert r.zcard(k.dead) == 0, [decode(raw) for raw in r.zrange(k.dead, 0, -1)]
    assert runs(cog)[jid] == 1
    assert int(r.get(k.orphanings(long_jid)) or 0) == 0, "cleared by its run in the survivor"
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(15) == 0


def test_g19_threads_finishing_together_fetch_within_the_bound(cog, in_process):
    """In the test process: the manager's own count of running, held and
    reserved jobs, read while jobs flow, never exceeds CONCURRENCY."""
    cog.configure(CONCURRENCY=CONCURRENCY)
    jids = jobs.record.delay_many([((i,), {}) for i in range(1500)])
    worker = in_process(concurrency=CONCURRENCY)
    ledger = worker.manager.ledger
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            with ledger.lock:
                taken = len(ledger.running) + sum(ledger.held.values()) + ledger.reserved
            peak = max(peak, taken)
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        wait_for(lambda: set(runs(cog)) >= set(jids), 60, "every job to run")
    finally:
        stop.set()
        watcher.join(5)
    worker.stop()
    assert 1 <= peak <= CONCURRENCY, peak
    assert runs(cog) == Counter({jid: 1 for jid in jids})
    assert leftovers(cog) == {}


def test_g19_threads_finishing_during_a_fetch_call_wait_for_it_and_share_the_next():
    """The ledger alone: a call reserves slots for its caller and the threads
    waiting, whose acks already wait with the fetcher, not for threads still
    running (their acks could not go with it). While it is in flight, a
    thread that wants a job waits; when it ends, the next waiter reserves
    slots for itself and the others waiting, for one call, never more than
    the bound, and the job it brings for a waiter is that waiter's."""
    ledger = Ledger(4, threading.Event())
    buffer: deque[UnitOfWork] = deque()
    running = [UnitOfWork("default", raw) for raw in (b"r0", b"r1")]
    for index, work in enumerate(running):
        ledger.started(index, work)
    first = ledger.reserve(buffer)  # two threads not running, but none waits: a call for one
    assert isinstance(first, Slots) and first.count == 1
    for index, work in enumerate(running):  # both finish while it is in flight
        ledger.finished(index, work, False)
    got: list[object] = []

    def wants() -> None:
        got.append(ledger.reserve(buffer))

    waiters = [threading.Thread(target=wants) for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.3)  # long enough for both to reach the condition
    assert got == [] and ledger.waiting == 2  # slots are free, but a call is in flight: no second one
    ledger.fetched([UnitOfWork("default", b"a")], first, buffer)  # the caller's job
    reserved = wait_for(lambda: [g for g in got if isinstance(g, Slots)], 5, "a waiter to reserve")
    # One held (the caller's): the first waiter to look reserved for itself
    # and the other waiter, for one call.
    assert [s.count for s in reserved] == [2]
    assert ledger.calling
    brought = [UnitOfWork("default", raw) for raw in (b"b", b"c")]
    ledger.fetched(brought, reserved[0], buffer)
    for waiter in waiters:
        waiter.join(5)
    assert not any(waiter.is_alive() for waiter in waiters)
    assert [g for g in got if isinstance(g, UnitOfWork)] == [brought[1]]
    assert not ledger.calling and ledger.reserved == 0 and ledger.waiting == 0


def test_g19_a_thread_back_from_blmove_does_not_end_another_threads_call():
    """A thread about to block on BLMOVE lets the others call; when its
    BLMOVE returns, the call another thread has in flight meanwhile is still
    the one in flight (the next waiter does not send a second one)."""
    ledger = Ledger(4, threading.Event())
    buffer: deque[UnitOfWork] = deque()
    blocking = ledger.reserve(buffer, 1)
    assert isinstance(blocking, Slots)
    ledger.shrink(blocking, 1)  # about to block: others may call
    assert not ledger.calling
    other = ledger.reserve(buffer)
    assert isinstance(other, Slots) and other.count == 1 and ledger.calling
    ledger.fetched([UnitOfWork("default", b"x")], blocking, buffer)  # BLMOVE brought a job
    assert ledger.calling
    ledger.fetched([], other, buffer)
    assert not ledger.calling and ledger.reserved == 0
