"""G18 revival: a process stopped past ORPHAN_THRESHOLD, whose jobs were
recovered meanwhile, starts none of them when it resumes, and its late acks
and filings change nothing.

The process is stopped for real (SIGSTOP/SIGCONT) where the moment does not
matter, and in the test process (its heartbeat made to fail, one thread held
between fetching a job and starting it) where it does: a real stop cannot be
aimed at the microseconds between a fetch and a start.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections import Counter
from typing import Any

import redis

from django_cogworker.fetch import ReliableFetch
from django_cogworker.heartbeat import Heartbeat
from django_cogworker.payload import decode, encode
from testproject.testapp import jobs
from tests.conftest import CogEnv, Worker, wait_for
from tests.test_guarantees import keys, leftovers, raw_job, runs


def notes_of(cog: CogEnv, kind: str, jid: str) -> list[dict[str, Any]]:
    return [n for n in cog.notes(kind) if n["jid"] == jid]


def go(cog: CogEnv, worker: Worker) -> None:
    cog.redis.set(cog.key(f"test:go:{worker.pid}"), 1)


def enqueue_recovered(cog: CogEnv, payload_job: Any, *args: Any, times: int = 1) -> str:
    """A job as recovery leaves it after ``times`` orphanings: marked in its
    payload, its counter set, back on its queue."""
    k = keys()
    payload = decode(raw_job(payload_job, *args))
    payload["orphaned"] = times
    raw = encode(payload)
    cog.redis.set(k.orphanings(payload["jid"]), times)
    cog.redis.lpush(k.queue("default"), raw)
    return str(payload["jid"])


def test_g18_a_late_ack_of_a_revived_process_leaves_the_new_owners_orphan_counter(cog):
    """The job, once recovered already, runs in A; A is stopped past the
    threshold and B recovers and runs it (counter 2). A resumes and finishes
    first: its ack removes nothing of B's, and the counter stays until B's
    run ends."""
    r, k = cog.redis, keys()
    jid = enqueue_recovered(cog, jobs.wait_for_go, "revived")
    a = cog.start_worker("-c", "1")
    wait_for(lambda: notes_of(cog, "started", jid), 15, "A to start the job")
    a_list = k.inprogress(a.identity())
    a.signal(signal.SIGSTOP)
    try:
        b = cog.start_worker("-c", "1")
        wait_for(lambda: len(notes_of(cog, "started", jid)) == 2, 20, "B to recover and start it")
        assert int(r.get(k.orphanings(jid)) or 0) == 2
        b_list = k.inprogress(b.identity())
        assert r.llen(b_list) == 1
    finally:
        a.signal(signal.SIGCONT)
    go(cog, a)
    wait_for(lambda: [n for n in notes_of(cog, "runs", jid) if n["pid"] == a.pid], 10, "A's late run to end")
    wait_for(lambda: r.llen(a_list) == 0, 10, "A's ack")
    assert int(r.get(k.orphanings(jid)) or 0) == 2, "the late ack cleared the counter of B's run"
    assert r.llen(b_list) == 1, "the late ack touched B's list"
    go(cog, b)
    wait_for(lambda: r.llen(b_list) == 0, 10, "B's ack")
    assert not r.exists(k.orphanings(jid)), "B's ack clears it"
    assert runs(cog) == Counter({jid: 2})  # A's run, then B's: a dead-looking owner's run is not stopped
    assert leftovers(cog) == {}


def test_g18_a_late_failure_of_a_revived_process_is_not_filed(cog):
    """A fails its job after being revived: the job is B's now, so nothing
    goes to retry; B's run decides."""
    r, k = cog.redis, keys()
    jid = str(jobs.wait_for_go.delay("late failure"))
    a = cog.start_worker("-c", "1")
    wait_for(lambda: notes_of(cog, "started", jid), 15, "A to start the job")
    a_list = k.inprogress(a.identity())
    r.set(cog.key(f"test:fail:{a.pid}"), 1)
    a.signal(signal.SIGSTOP)
    try:
        b = cog.start_worker("-c", "1")
        wait_for(lambda: len(notes_of(cog, "started", jid)) == 2, 20, "B to recover and start it")
    finally:
        a.signal(signal.SIGCONT)
    go(cog, a)
    wait_for(lambda: "wait_for_go failed (ValueError" in a.log(), 10, "A's late run to fail")
    assert r.llen(a_list) == 0
    time.sleep(0.5)
    assert r.zcard(k.retry) == 0 and r.zcard(k.dead) == 0, "the late failure was filed"
    go(cog, b)
    wait_for(lambda: leftovers(cog) == {}, 10, "B's run to be acknowledged")
    assert runs(cog) == Counter({jid: 2})


class Said(logging.Handler):
    """What the in-process worker logs, read by the test itself."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        logging.getLogger("django_cogworker").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def close(self) -> None:
        logging.getLogger("django_cogworker").removeHandler(self)
        super().close()


class HeldThread:
    """Holds the first thread whose call of ``owner.name`` brings something,
    once the call has returned, and makes the heartbeat fail meanwhile: the
    process looks dead to the others, as when it is stopped. By default the
    call is a thread's retrieve: held between fetching a job and starting
    it; a fetch command instead holds its reply unread."""

    def __init__(self, monkeypatch: Any, owner: Any = ReliableFetch, name: str = "retrieve") -> None:
        self.fetched = threading.Event()
        self.release = threading.Event()
        original_call = getattr(owner, name)
        original_beat, original_group_beat = Heartbeat.beat, Heartbeat.beat_group
        held = self

        def call(*args: Any, **kwargs: Any) -> Any:
            got = original_call(*args, **kwargs)
            if got and not held.fetched.is_set():
                held.fetched.set()
                held.release.wait(30)
            return got

        def beat(heartbeat: Heartbeat, *args: Any, **kwargs: Any) -> Any:
            if held.fetched.is_set() and not held.release.is_set():
                raise redis.ConnectionError("this process is stopped")
            return original_beat(heartbeat, *args, **kwargs)

        def group_beat(heartbeat: Heartbeat, *args: Any) -> Any:
            # Under SHARDING, the beat its group's master judges it by.
            if held.fetched.is_set() and not held.release.is_set():
                raise redis.ConnectionError("this process is stopped")
            return original_group_beat(heartbeat, *args)

        monkeypatch.setattr(owner, name, call)
        monkeypatch.setattr(Heartbeat, "beat", beat)
        monkeypatch.setattr(Heartbeat, "beat_group", group_beat)


def test_g18_a_revived_process_does_not_start_a_job_fetched_before_it_stopped(cog, in_process, monkeypatch):
    r, k = cog.redis, keys()
    held = HeldThread(monkeypatch)
    said = Said()
    jid = str(jobs.record.delay("fetched, then the process stopped"))
    a = in_process(concurrency=1)
    assert held.fetched.wait(15), "A did not fetch the job"
    assert r.llen(k.inprogress(a.identity)) == 1
    b = cog.start_worker("-c", "1")
    wait_for(lambda: runs(cog)[jid], 20, "B to recover and run the job")
    b_pid = b.pid
    held.release.set()  # A resumes, the job in its hand
    wait_for(lambda: said.has("not starting a job fetched"), 10, "A to notice")
    time.sleep(0.5)
    a.stop()
    said.close()
    # B acknowledges its run with its thread's next fetch, after the note.
    b_list = k.inprogress(b.identity())
    wait_for(lambda: not r.exists(b_list), 10, "B's ack")
    assert runs(cog) == Counter({jid: 1})
    assert [n["pid"] for n in notes_of(cog, "runs", jid)] == [b_pid]
    assert leftovers(cog) == {}
    assert a.manager.running_counter() == Counter(), "A still holds the job it did not start"


def test_g18_a_job_fetched_long_ago_but_still_owned_runs(cog, in_process, monkeypatch):
    """The check costs one LPOS and runs the job when it is still ours (a
    pause shorter than the threshold, or no other process to recover it)."""
    held = HeldThread(monkeypatch)
    jid = str(jobs.record.delay("still mine"))
    a = in_process(concurrency=1)
    assert held.fetched.wait(15)
    time.sleep(a.manager.revival_check_s + 0.2)
    held.release.set()
    wait_for(lambda: runs(cog)[jid], 10, "the job to run")
    a.stop()
    assert runs(cog) == Counter({jid: 1})
    assert leftovers(cog) == {}


def test_g18_sigstop_past_the_threshold_under_load_second_runs_only_of_running_jobs(cog):
    """A worker stopped past the threshold while busy: after SIGCONT it
    finishes at most the CONCURRENCY jobs it was running (their second
    runs), starts nothing else it had, and everything runs to an end."""
    cog.configure(CONCURRENCY=4, MAX_ORPHANINGS=5)
    r = cog.redis
    jids = [str(j) for j in jobs.noted_pace.delay_many([((0.05, i), {}) for i in range(400)])]
    a, b = cog.start_worker(), cog.start_worker()
    a.identity(), b.identity()
    wait_for(lambda: len(cog.notes()) >= 40, 20, "the run to get going")
    a.signal(signal.SIGSTOP)
    stopped_at = time.time()
    time.sleep(float(cog.overrides["ORPHAN_THRESHOLD"]) + 2.0)
    wait_for(lambda: "left in progress by dead process" in b.log(), 15, "B to recover A's jobs")
    a.signal(signal.SIGCONT)
    wait_for(lambda: set(runs(cog)) >= set(jids) and leftovers(cog) == {}, 60, "every job to run")
    second = sum(n - 1 for n in runs(cog).values())
    recovered = sum(int(n) for n in re.findall(r"requeued (\d+) job\(s\) left in progress by dead", b.log()))
    print(
        f"\nrevival under load: A stopped {time.time() - stopped_at:.1f}s ago, {recovered} jobs recovered, "
        f"{second} second runs (bound 4)"
    )
    assert 1 <= recovered <= 4, "G19: A held at most CONCURRENCY jobs"
    assert second <= recovered, f"{second} jobs ran twice: more than A was running when stopped"
    a.signal(signal.SIGTERM)
    b.signal(signal.SIGTERM)
    assert a.wait(15) == 0 and b.wait(15) == 0
    assert leftovers(cog) == {}
    assert not r.smembers(keys().processes)
