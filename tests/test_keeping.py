"""Who runs the jobs one fetch call brings (``keeping.py``): short jobs stay
on the thread that made the call, a kept job waits at most HAND_OVER_S for
a keeper stuck on a long one, and jobs that wait on I/O are handed to the
threads waiting at once, so that they still run side by side."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import replace

import pytest

from django_cogworker import keeping
from django_cogworker.conf import get_config
from django_cogworker.coroutines import FETCH_AHEAD_FOR_S, FETCH_AHEAD_MIXED, Coroutines
from django_cogworker.keeping import Keeping
from django_cogworker.ledger import PLAIN_LATELY_S, Ledger, Slots
from django_cogworker.outcomes import Outcome
from django_cogworker.work import UnitOfWork
from testproject.testapp import jobs
from tests.conftest import CogEnv, wait_for


@pytest.fixture(autouse=True)
def several_cpus(monkeypatch):
    """The ledger tests below, whatever CPUs the test process may use."""
    monkeypatch.setattr(keeping, "one_cpu", lambda: False)


def work(raw: bytes) -> UnitOfWork:
    return UnitOfWork("default", raw)


class Waiter:
    """A thread that wants one job from the ledger, as a processor does."""

    def __init__(self, ledger: Ledger, buffer: deque) -> None:
        self.got: list[object] = []
        self.thread = threading.Thread(target=lambda: self.got.append(ledger.reserve(buffer)), daemon=True)
        self.thread.start()


def call_with_a_waiter(ledger: Ledger, buffer: deque, brought: list[bytes]) -> Waiter:
    """This thread makes a call while another thread waits for a job, and
    the call brings ``brought`` (the first for this thread; the slots it
    reserved are not what these tests look at)."""
    slots = ledger.reserve(buffer)
    assert isinstance(slots, Slots) and ledger.calling
    waiter = Waiter(ledger, buffer)
    wait_for(lambda: ledger.waiting == 1, 5, "the other thread to wait for the call")
    ledger.fetched([work(raw) for raw in brought], slots, buffer)
    return waiter


def test_short_jobs_a_call_brings_are_run_by_the_thread_that_made_it(monkeypatch):
    """No job measured yet counts as short: the caller takes the jobs its
    call brought for the thread waiting, one after another, and that thread
    waits; the caller's next call is for both of them."""
    monkeypatch.setattr(keeping, "HAND_OVER_S", 30.0)  # no keeper counts as stuck here
    ledger = Ledger(4, threading.Event())
    buffer: deque = deque()
    waiter = call_with_a_waiter(ledger, buffer, [b"a", b"b", b"c"])
    assert [ledger.reserve(buffer).raw for _ in range(2)] == [b"b", b"c"]
    assert waiter.got == [] and waiter.thread.is_alive()
    for raw in (b"a", b"b", b"c"):  # held until started: let the slots free
        ledger.started(0, work(raw))
        ledger.finished(0, work(raw), False)
    again = ledger.reserve(buffer)
    assert isinstance(again, Slots) and again.count == 2
    ledger.fetched([], again, buffer)
    waiter.thread.join(5)
    assert len(waiter.got) == 1 and isinstance(waiter.got[0], Slots)


def test_a_kept_job_is_taken_by_the_threads_waiting_when_its_keeper_is_stuck(monkeypatch):
    """The caller never comes back (its job runs long): past HAND_OVER_S,
    the threads waiting take the jobs it kept, one each, and jobs are handed
    over from then on."""
    monkeypatch.setattr(keeping, "HAND_OVER_S", 0.05)
    ledger = Ledger(4, threading.Event())
    buffer: deque = deque()
    slots = ledger.reserve(buffer)
    assert isinstance(slots, Slots)
    waiters = [Waiter(ledger, buffer) for _ in range(2)]
    wait_for(lambda: ledger.waiting == 2, 5, "two threads to wait for the call")
    kept_at = time.monotonic()
    ledger.fetched([work(raw) for raw in (b"long", b"x", b"y")], slots, buffer)
    for waiter in waiters:
        waiter.thread.join(10)
    taken = sorted(w.got[0].raw for w in waiters)
    assert taken == [b"x", b"y"]
    assert time.monotonic() - kept_at >= 0.05  # taken from a stuck keeper, not handed over
    assert not ledger.keeping.short


def test_jobs_that_wait_on_io_are_handed_to_the_threads_waiting_at_once(monkeypatch):
    """Once jobs are measured waiting on I/O, a call's jobs go to the threads
    waiting at once (but for the calls of PROBE_WINDOW_S every PROBE_S,
    kept to measure them: here the window holds one call)."""
    monkeypatch.setattr(keeping, "HAND_OVER_S", 30.0)
    monkeypatch.setattr(keeping, "PROBE_WINDOW_S", 0.0)
    ledger = Ledger(4, threading.Event())
    buffer: deque = deque()
    for i in range(10):  # each alone, each asleep 5 ms
        raw = f"s{i}".encode()
        ledger.started(0, work(raw))
        time.sleep(0.005)
        ledger.finished(0, work(raw), False)
    assert ledger.keeping.io_wait >= keeping.SHORT_WAIT_S
    probe = call_with_a_waiter(ledger, buffer, [b"p1", b"p2"])  # the probe: kept
    assert ledger.reserve(buffer).raw == b"p2"
    assert probe.got == []
    for raw in (b"p1", b"p2"):
        ledger.started(0, work(raw))
        time.sleep(0.02)
        ledger.finished(0, work(raw), False)
    ledger.wake()
    wait_for(lambda: probe.got, 5, "the waiting thread to make the next call")
    assert isinstance(probe.got[0], Slots)
    ledger.fetched([], probe.got[0], buffer)
    handed = call_with_a_waiter(ledger, buffer, [b"h1", b"h2"])
    handed.thread.join(5)
    assert [g.raw for g in handed.got] == [b"h2"]


def test_a_process_on_one_cpu_hands_every_job_over_at_once(monkeypatch):
    """On one CPU a hand-over is a cheap switch: nothing is kept, even
    before any job was measured."""
    monkeypatch.setattr(keeping, "HAND_OVER_S", 30.0)
    monkeypatch.setattr(keeping, "one_cpu", lambda: True)
    ledger = Ledger(4, threading.Event())
    buffer: deque = deque()
    assert not ledger.keeping.short
    handed = call_with_a_waiter(ledger, buffer, [b"a", b"b"])
    handed.thread.join(5)
    assert [g.raw for g in handed.got] == [b"b"]


def test_one_cpu_is_what_the_process_may_use():
    assert keeping.one_cpu() is (len(os.sched_getaffinity(0)) == 1)


def test_one_long_pause_does_not_make_short_jobs_look_long():
    """A thread taken off its CPU for 50 ms (another process, Redis on its
    core) counts as LONG_WAIT_S at most: the jobs stay short."""
    keeping_ = Keeping()
    start = keeping_.started()
    time.sleep(0.05)
    keeping_.finished(start, measure=True)
    assert keeping_.io_wait <= keeping.LONG_WAIT_S * keeping.WEIGHT + 1e-6
    assert keeping_.short


def test_a_jobs_io_wait_counts_only_when_it_ran_alone():
    """Beside another running job, a job's wall time counts the GIL it
    waited for: only a job that ended alone among the threads is measured."""
    keeping_ = Keeping()
    first, second = keeping_.started(), keeping_.started()
    time.sleep(0.02)
    keeping_.finished(first, measure=True)
    assert keeping_.io_wait == 0.0
    keeping_.finished(second, measure=True)
    assert keeping_.io_wait > 0.0
    alone = keeping_.started()
    before = keeping_.io_wait
    keeping_.finished(alone, measure=False)  # ended on another thread: not measured
    assert keeping_.io_wait == before


class Clocks:
    """The two clocks keeping.py reads, moved by the test: the wall clock
    and the thread's CPU clock (a real one would move with the machine's
    load)."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.cpu_reads = 0

    def monotonic(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        self.cpu_reads += 1
        return self.cpu

    def job(self, keeping_: Keeping, wall: float, cpu: float) -> None:
        start = keeping_.started()
        self.wall += wall
        self.cpu += cpu
        keeping_.finished(start, measure=True)


def test_jobs_are_timed_by_their_threads_cpu_clock_only_after_one_that_was_not_short(monkeypatch):
    """A thread's CPU time is a system call: a job shorter than
    SHORT_WAIT_S by the wall clock is short whatever its CPU time, and the
    jobs after it are not timed; after a longer one they are, and a job
    that spent its time on the CPU does not count as waiting on I/O."""
    clocks = Clocks()
    monkeypatch.setattr(keeping, "time", clocks)
    keeping_ = Keeping()
    for _ in range(3):
        clocks.job(keeping_, wall=0.00005, cpu=0.00004)
    assert clocks.cpu_reads == 0 and keeping_.short
    before = keeping_.io_wait
    clocks.job(keeping_, wall=0.005, cpu=0.0)  # not timed: its wall time counts, at most LONG_WAIT_S
    assert clocks.cpu_reads == 0 and keeping_.timed
    waited = keeping_.io_wait
    assert waited == pytest.approx(before + (keeping.LONG_WAIT_S - before) * keeping.WEIGHT)
    clocks.job(keeping_, wall=0.005, cpu=0.005)  # timed: all of it on the CPU
    assert clocks.cpu_reads == 2
    assert keeping_.io_wait == pytest.approx(waited * (1 - keeping.WEIGHT))  # counted as no wait
    clocks.job(keeping_, wall=0.00005, cpu=0.00004)
    assert clocks.cpu_reads == 4 and not keeping_.timed  # short again: the next is not timed
    clocks.job(keeping_, wall=0.00005, cpu=0.00004)
    assert clocks.cpu_reads == 4


def peak_overlap(cog: CogEnv) -> int:
    """The most jobs that ran at once, from their start and end notes."""
    starts = {n["tag"]: n["at"] for n in cog.notes("started")}
    ends = {n["tag"]: n["at"] for n in cog.notes("runs")}
    events = sorted([(at, 1) for at in starts.values()] + [(at, -1) for at in ends.values()])
    peak = running = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.parametrize("seconds", [0.3])
def test_jobs_that_wait_on_io_still_run_side_by_side(cog, seconds):
    """CONCURRENCY jobs that sleep (I/O) run at once, in a real worker,
    though the worker starts with every job counted as short."""
    concurrency = 6
    cog.configure(CONCURRENCY=concurrency)
    jobs.sleep_then_record.delay_many([((seconds, i), {}) for i in range(4 * concurrency)])
    cog.start_worker(CONCURRENCY=concurrency)
    wait_for(lambda: len(cog.notes("runs")) == 4 * concurrency, 60, "every job to run")
    assert peak_overlap(cog) == concurrency


def test_a_job_fetched_behind_a_long_one_does_not_wait_for_it(cog):
    """Short jobs queued behind a long one all run while it runs, whichever
    thread fetched them."""
    cog.configure(CONCURRENCY=4)
    jobs.sleep_then_record.delay(8.0, "long")
    jobs.record.delay_many([((i,), {}) for i in range(12)])
    cog.start_worker(CONCURRENCY=4)
    wait_for(lambda: len(cog.notes("runs")) >= 12, 30, "the short jobs to run")
    long_ended = [n for n in cog.notes("runs") if n["tag"] == "long"]
    assert long_ended == [], "a short job waited for the long one"
    wait_for(lambda: len(cog.notes("runs")) == 13, 30, "the long job to end")


def counting(condition: threading.Condition) -> list[int]:
    """The wake-ups ``condition.notify`` is asked for from now on."""
    wakes: list[int] = []
    notify = condition.notify

    def counted(n: int = 1) -> None:
        wakes.append(n)
        notify(n)

    condition.notify = counted  # type: ignore[method-assign]
    return wakes


def test_a_keeper_of_short_jobs_wakes_no_thread_when_it_hands_a_job_to_the_loop():
    """A job handed to the event loop frees its thread's slot: a keeper of
    short jobs comes for the next job itself, so no waiting thread is woken
    (each wake-up takes the GIL from the loop's thread); while jobs are
    handed over, one is. A full loop wakes one for the plain jobs queued
    only if a plain job ended lately."""
    ledger = Ledger(4, threading.Event())
    wakes = counting(ledger._slots)
    ledger.started(0, work(b"a"))
    ledger.moved(0, 4)
    assert wakes == []  # short: nothing measured yet
    ledger.wake_for_plain()
    assert wakes == []  # no plain job ended yet: a stream of coroutine jobs alone
    ledger.keeping.io_wait = 1.0  # jobs that wait on I/O: handed over
    ledger.started(1, work(b"b"))
    ledger.moved(1, 5)
    assert wakes == [1]
    ledger.started(0, work(b"c"))
    ledger.finished(0, work(b"c"), False)  # a plain job ended, and no thread waits for a slot
    assert wakes == [1]
    ledger.waiting = 1  # as Ledger._wait counts a thread waiting in reserve()
    ledger.started(0, work(b"c"))
    ledger.finished(0, work(b"c"), False)  # a plain job ended (and woke the waiter: not short)
    assert wakes == [1, 1]
    ledger.wake_for_plain()
    assert wakes == [1, 1, 1]


def test_a_loop_that_frees_room_wakes_a_holder_per_slot_else_one_thread_at_half_its_slots():
    """A slot the loop frees goes to a thread holding a job (one woken per
    slot); with none holding, the slot that makes half the loop free wakes
    one thread waiting to fetch again, whose one call brings jobs for all of
    them, not every thread waiting."""

    class Settler:
        def finished(self, *args: object) -> None:
            pass

    size = 12
    config = replace(get_config(), async_concurrency=size)
    loop = Coroutines(
        config, Ledger(2, threading.Event()), Settler(), threading.Event(), 2, lambda: None, print
    )  # type: ignore[arg-type]
    slots = [loop._free.pop() for _ in range(size)]  # a full loop
    holders, fetchers = counting(loop._room), counting(loop._later)
    outcome = Outcome("ack")
    loop._holding = 1
    loop._finished(slots.pop(), work(b"x"), outcome, True)
    assert (holders, fetchers) == ([1], [])
    loop._holding = 0
    loop._free.pop()  # the holder took it
    for _ in range(size // 2 - 1):
        loop._finished(slots.pop(), work(b"y"), outcome, True)
    assert (holders, fetchers) == ([1], [])
    loop._finished(slots.pop(), work(b"y"), outcome, True)  # the sixth of twelve free
    assert (holders, fetchers) == ([1], [1])
    for _ in range(size // 2 - 1):
        loop._finished(slots.pop(), work(b"y"), outcome, True)
    assert (holders, fetchers) == ([1], [1])


def test_a_fetch_for_a_loop_fills_its_free_slots_unless_plain_jobs_ran_lately():
    """A stream of coroutine jobs alone: one call brings jobs for every free
    slot of the loop (less those in transit); while plain jobs ran within
    PLAIN_LATELY_S, at most FETCH_AHEAD_MIXED, so that plain jobs fetched
    with them do not wait in this process's hands; none once the loop has
    taken no job for FETCH_AHEAD_FOR_S."""
    size = FETCH_AHEAD_MIXED * 4
    config = replace(get_config(), async_concurrency=size)
    ledger = Ledger(2, threading.Event())
    loop = Coroutines(config, ledger, None, threading.Event(), 2, lambda: None, print)  # type: ignore[arg-type]
    assert loop.room(0) == 0  # no job handed over yet: plain jobs fetch as before
    loop.handed_at = time.monotonic()
    loop._free.pop()  # one running
    assert loop.room(0) == size - 1
    assert loop.room(5) == size - 6
    ledger.keeping.plain_at = time.monotonic()  # a plain job just ended
    assert loop.room(0) == FETCH_AHEAD_MIXED
    ledger.keeping.plain_at = time.monotonic() - 2 * PLAIN_LATELY_S
    assert loop.room(0) == size - 1
    loop.handed_at = time.monotonic() - 2 * FETCH_AHEAD_FOR_S
    assert loop.room(0) == 0
