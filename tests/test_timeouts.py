"""``timeout`` and ``hard_timeout`` (SPEC section 14), with real worker
processes on a real Redis.

``timeout``: a ``JobTimeout`` raised in the job's own thread at the
deadline, armed only while the job's code runs; the thread lives on.
``hard_timeout``: a job stuck where no exception reaches makes its process
drain and exit with status 3, the job filed once as failed.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from typing import Any

import pytest

from django_cogworker import job
from testproject.testapp import jobs
from tests.conftest import FAST, CogEnv, Worker, wait_for

TIMEOUT_CLASS = "django_cogworker.errors.JobTimeout"
#: Log lines that would mean an exception landed in the worker's own code.
WORKER_FAULTS = ("crashed", "replacing processor", "failed unexpectedly", "could not settle", "died;")


def filed(cog: CogEnv, zset: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in cog.redis.zrange(cog.key(zset), 0, -1)]


def thread_count(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(re.search(r"^Threads:\s+(\d+)", status.read(), re.M).group(1))  # type: ignore[union-attr]


def processed(cog: CogEnv) -> int:
    return int(cog.redis.get(cog.key("stat:processed")) or 0)


def assert_no_worker_fault(worker: Worker) -> None:
    log = worker.log()
    for fault in WORKER_FAULTS:
        assert fault not in log, f"{fault!r} in the worker's log"


# -- options checked when the job is declared ----------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout": 0}, "timeout must be a positive number of seconds or None"),
        ({"timeout": -1.5}, "timeout must be a positive number of seconds or None"),
        ({"timeout": "5"}, "timeout must be a positive number of seconds or None"),
        ({"timeout": True}, "timeout must be a positive number of seconds or None"),
        ({"hard_timeout": 0}, "hard_timeout must be a positive number of seconds or None"),
        ({"timeout": 10, "hard_timeout": 5}, "hard_timeout (5s) must not be shorter than timeout (10s)"),
    ],
)
def test_timeout_options_are_checked_when_declared(options: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError) as info:
        job(name="tests.bad_timeout", **options)(lambda: None)
    assert message in str(info.value)
    with pytest.raises(TypeError) as info:
        jobs.record.set(**options)
    assert message in str(info.value)


def test_timeout_travels_with_the_payload_of_set() -> None:
    payload = jobs.record.set(timeout=2.5, hard_timeout=7).payload([], {})
    assert (payload["timeout"], payload["hard_timeout"]) == (2.5, 7)
    plain = jobs.record.payload([], {})
    assert "timeout" not in plain and "hard_timeout" not in plain


# -- timeout -------------------------------------------------------------------------------


def test_timeout_interrupts_a_busy_loop_inside_except_exception_and_the_thread_runs_the_next_job(cog):
    worker = cog.start_worker(CONCURRENCY=1)
    worker.identity()
    jid = jobs.busy_past_timeout.delay("busy")
    after = jobs.record.delay("next")
    wait_for(lambda: any(n["jid"] == after for n in cog.notes()), 20, "the next job to run")
    [dead] = filed(cog, "dead")
    assert dead["jid"] == jid
    assert dead["error_class"] == TIMEOUT_CLASS
    assert "timeout of 1s" in dead["error_message"]
    # Never swallowed by ``except Exception``, never ran on.
    assert cog.notes("swallowed") == [] and cog.notes("overran") == []
    # remaining() counts down from the timeout.
    [left] = cog.notes("remaining")
    assert 0.5 < left["first"] <= 1.0
    assert 0 < left["later"] <= left["first"] - 0.15
    # One thread ran both: it survived, and no processor was replaced.
    assert [n["pid"] for n in cog.notes()] == [worker.pid]
    assert_no_worker_fault(worker)
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


def test_timeout_remaining_is_none_without_a_timeout(cog):
    from django_cogworker.context import JobContext

    assert JobContext(jid="j", queue="q", retry_count=0, name="n").remaining() is None


#: Timed-out tiny jobs run against the watchdog; 5,000 in about 10 s here (each
#: spins up to 4 ms: more would only load the machine the other tests share).
MANY = 5_000


def test_timeout_many_tiny_jobs_at_their_deadline_leave_threads_and_worker_code_untouched(cog):
    worker = cog.start_worker("-v", "0", CONCURRENCY=4)
    worker.identity()
    # The watchdog starts with the first timed job: count threads after it.
    warm_up = jobs.spin_about_timeout.delay(0.0)
    wait_for(lambda: processed(cog) >= 1, 20, "a first timed job")
    threads_before = thread_count(worker.pid)
    rng = random.Random(28)
    # Around the 2 ms deadline: some return just before it, some as it
    # fires, others spin well past it.
    calls = [((rng.uniform(0.0, 0.004),), {}) for _ in range(MANY)]
    started = time.monotonic()
    jids = jobs.spin_about_timeout.delay_many(calls)
    wait_for(lambda: processed(cog) >= MANY + 1, 30, "every job to be filed", progress=lambda: processed(cog))
    took_s = time.monotonic() - started
    dead = filed(cog, "dead")
    assert {d["error_class"] for d in dead} == {TIMEOUT_CLASS}
    dead_jids = [d["jid"] for d in dead]
    assert len(dead_jids) == len(set(dead_jids))  # each filed once
    assert set(dead_jids) <= {*jids, warm_up}
    assert int(cog.redis.get(cog.key("stat:failed")) or 0) == len(dead)
    assert 0 < len(dead) < MANY  # the deadline fell on both sides
    # The beat may carry the last job's count before its ack rides its thread's next fetch.
    listed = cog.key(f"inprogress:{worker.identity()}")
    wait_for(lambda: cog.redis.llen(listed) == 0, 10, "the last acks")
    assert thread_count(worker.pid) == threads_before
    assert_no_worker_fault(worker)
    print(f"\n{MANY} jobs in {took_s:.1f}s, {len(dead)} timed out, threads {threads_before}")
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


# -- hard_timeout -------------------------------------------------------------------------------


@pytest.mark.parametrize("stuck_job", [jobs.stuck_in_sleep, jobs.stuck_in_recv], ids=["sleep", "recv"])
def test_hard_timeout_a_stuck_job_drains_the_process_which_exits_3(cog, stuck_job):
    shutdown_s = float(FAST["SHUTDOWN_TIMEOUT"])
    worker = cog.start_worker(CONCURRENCY=2)
    worker.identity()
    stuck = stuck_job.delay("stuck")
    wait_for(lambda: cog.notes(), 15, "the stuck job to start")
    other = jobs.sleep_then_record.delay(2.0, "other")
    wait_for(lambda: cog.notes("started"), 15, "the other job to start")
    began = time.monotonic()
    assert worker.wait(30) == 3
    # Well before the sleep's 60 s: the hard timeout plus the drain.
    assert time.monotonic() - began < 1.0 + shutdown_s + 10
    runs = cog.notes()
    # The other job was let finish; the stuck one ran once.
    assert [n["jid"] for n in runs if n["tag"] == "other"] == [other]
    assert [n["jid"] for n in runs if n["tag"] == "stuck"] == [stuck]
    [dead] = filed(cog, "dead")
    assert dead["jid"] == stuck and dead["error_class"] == TIMEOUT_CLASS
    assert "hard_timeout of 1s" in dead["error_message"]
    assert cog.redis.llen(cog.key("queue:default")) == 0
    assert filed(cog, "retry") == []
    log = worker.log()
    assert "exceeded its hard_timeout" in log and "exiting with status 3" in log


def test_hard_timeout_under_processes_a_fresh_child_takes_over_and_the_job_runs_once(cog):
    supervisor = cog.start_worker("--processes", "2", CONCURRENCY=2)
    stuck = jobs.stuck_in_sleep_retried.delay("stuck")
    wait_for(lambda: cog.notes(), 30, "the stuck job to start")
    [first] = cog.notes()
    stuck_pid = first["pid"]
    wait_for(lambda: "exited with status 3" in supervisor.log(), 30, "the stuck child to exit 3")
    assert f"(pid {stuck_pid}) exited with status 3; restarting it" in supervisor.log()
    [retry] = filed(cog, "retry")
    assert retry["jid"] == stuck and retry["error_class"] == TIMEOUT_CLASS
    assert retry["retry_count"] == 0
    # A fresh child replaces it and works.
    jid = jobs.record.delay("after")

    def fresh_child_ran_it() -> bool:
        return any(n["jid"] == jid and n["pid"] != stuck_pid for n in cog.notes())

    wait_for(fresh_child_ran_it, 30, "a fresh child to run a job")
    assert not os.path.exists(f"/proc/{stuck_pid}") or _zombie(stuck_pid)
    # Started once: the retry is not due yet (its backoff is 15 s or more).
    assert [n["jid"] for n in cog.notes() if n["tag"] == "stuck"] == [stuck]
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
