"""``async def`` jobs (SPEC section 15), with real worker processes on a
real Redis: hundreds in flight on one event loop per process, through the
same reliable fetch and accounting as the threads' jobs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.http import HttpRequest, JsonResponse
from django.urls import path

from django_cogworker import api, testing
from django_cogworker.connection import get_keys
from django_cogworker.payload import decode
from testproject.testapp import async_jobs, jobs
from tests.conftest import MANAGE, ROOT, CogEnv, Worker, manage_env, unregister_async_jobs, wait_for

ASYNC_ENV = {"COGWORKER_TEST_ASYNC_JOBS": "1"}
TIMEOUT_CLASS = "django_cogworker.errors.JobTimeout"


@pytest.fixture(scope="module", autouse=True)
def _async_jobs_unregistered_after() -> Iterator[None]:
    """The async jobs are registered in this process while this module runs
    (an in-process worker would start its event loop for them); the tests
    after it get the registry as it was."""
    yield
    unregister_async_jobs()


def start(cog: CogEnv, *args: str, **overrides: Any) -> Worker:
    env = {**ASYNC_ENV, **overrides.pop("env", {})}
    return cog.start_worker(*args, env=env, **overrides)


def inprogress(cog: CogEnv, worker: Worker) -> str:
    return get_keys().inprogress(worker.identity())


def ran(cog: CogEnv, kind: str = "runs") -> Counter[str]:
    return Counter(str(n["jid"]) for n in cog.notes(kind))


def dead(cog: CogEnv) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in cog.redis.zrange(cog.key("dead"), 0, -1)]


# -- many at once, within the bound ----------------------------------------------------


def test_g19_200_coroutines_on_two_threads_end_together_each_once_within_the_bound(cog):
    """CONCURRENCY=2, ASYNC_CONCURRENCY=100: 200 jobs that await a 1 s sleep
    end in about two rounds of a second, each once, each seeing its own jid
    in ``current_job()``; the in-progress list, sampled all along, never
    holds more than CONCURRENCY + ASYNC_CONCURRENCY jobs."""
    worker = start(cog, CONCURRENCY=2, ASYNC_CONCURRENCY=100)
    key = inprogress(cog, worker)
    jids = async_jobs.asleep.delay_many([((1.0, i), {}) for i in range(200)])
    longest = 0
    samples = 0
    while len(ran(cog)) < len(jids):
        longest = max(longest, cog.redis.llen(key))
        samples += 1
        assert worker.alive()
        assert samples < 200_000, "the jobs did not end"
    notes = cog.notes()
    first_start = min(n["at"] for n in cog.notes("started"))
    took_s = max(n["at"] for n in notes) - first_start
    print(f"\nasync: 200 x sleep(1) in {took_s:.2f}s; list at most {longest} in {samples} samples")
    assert ran(cog) == Counter(dict.fromkeys(jids, 1))
    assert all(n["seen_jid"] == n["jid"] for n in notes)
    assert took_s <= 3.0
    assert 100 <= longest <= 102, longest
    # The process record says what the bound is made of.
    (record,) = [p for p in api.ProcessSet() if p.identity == worker.identity()]
    assert (record.concurrency, record.async_concurrency) == (2, 100)
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert cog.redis.llen(key) == 0


def test_mixed_sync_and_async_jobs_on_one_queue_neither_starves(cog):
    """Thread jobs and coroutine jobs interleaved on one queue: the threads
    keep running the plain jobs while the loop holds the coroutines."""
    worker = start(cog, CONCURRENCY=2, ASYNC_CONCURRENCY=50)
    worker.identity()
    coros, plain = [], []
    for i in range(100):
        coros.append(async_jobs.asleep.delay(0.5, f"async {i}"))
        plain.append(jobs.record.delay(f"sync {i}"))
    started = time.monotonic()
    wait_for(lambda: set(ran(cog)) >= {*coros, *plain}, 30, "every job to run")
    took_s = time.monotonic() - started
    runs = {n["jid"]: n["at"] for n in cog.notes()}
    last_plain = max(runs[j] for j in plain)
    last_coro = max(runs[j] for j in coros)
    print(f"\nmixed: 100 + 100 in {took_s:.2f}s (serial: 50s)")
    # 100 half-second coroutines 50 at a time: about a second, not 50.
    assert took_s < 8
    # The plain jobs did not wait for the coroutines to drain.
    assert last_plain <= last_coro
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


# -- kill and shutdown ------------------------------------------------------------------


def test_g1_g3_sigkill_with_100_coroutines_in_flight_recovers_them_all_counting_the_started(cog):
    worker = start(cog, CONCURRENCY=2, ASYNC_CONCURRENCY=100)
    key = inprogress(cog, worker)
    go = cog.key("test:go")
    jids = async_jobs.await_go.delay_many([((go, i), {}) for i in range(150)])
    wait_for(lambda: len(ran(cog, "started")) >= 100, 30, "100 coroutines to start")
    time.sleep(0.2)  # let the threads block holding what the loop has no room for
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    # What the dead process held, read before recovery (ORPHAN_THRESHOLD
    # 2 s) can take it: its threads may have fetched up to the kill.
    started_before = set(ran(cog, "started"))
    listed = {decode(raw)["jid"] for raw in cog.redis.lrange(key, 0, -1)}
    assert len(started_before) == 100
    assert started_before <= listed and len(listed) <= 102
    survivor = start(cog, CONCURRENCY=2, ASYNC_CONCURRENCY=200)
    survivor.identity()
    # Recovered (ORPHAN_THRESHOLD 2 s) and started again, each waiting for go.
    wait_for(lambda: set(ran(cog, "started")) == set(jids), 30, "every job to start in the survivor")
    counted = {jid for jid in jids if int(cog.redis.get(cog.key(f"orphanings:{jid}")) or 0)}
    print(f"\nSIGKILL: {len(listed)} listed, {len(started_before)} started, {len(counted)} counted")
    # Every coroutine that had started is counted; of the others, only those
    # a thread held while the loop was full (at most CONCURRENCY).
    assert started_before <= counted
    assert counted <= listed and len(counted - started_before) <= 2
    cog.redis.set(go, 1)
    wait_for(lambda: set(ran(cog)) == set(jids), 30, "every job to finish")
    assert ran(cog) == Counter(dict.fromkeys(jids, 1))
    # Each counter goes with its job's ack, which follows the job's note.
    wait_for(
        lambda: not any(cog.redis.get(cog.key(f"orphanings:{jid}")) for jid in jids),
        10,
        "the counters to be cleared by the finish",
    )
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(15) == 0


def test_g3_a_coroutine_job_recovered_again_runs_isolated_in_its_thread_not_on_the_loop(cog):
    """Recovered twice (its counter at 2): it runs alone, in the thread that
    fetched it, on a loop of its own; the others stay on the process's loop."""
    payload = async_jobs.asleep.payload([0.01, "isolated"], {})
    payload["orphaned"] = 2
    jid = str(payload["jid"])
    cog.redis.set(cog.key(f"orphanings:{jid}"), 2)
    cog.redis.lpush(cog.key("queue:default"), json.dumps(payload))
    plain = async_jobs.asleep.delay(0.01, "plain")
    worker = start(cog, CONCURRENCY=2)
    wait_for(lambda: set(ran(cog)) == {jid, plain}, 20, "both jobs to run")
    threads = {n["jid"]: n["thread"] for n in cog.notes()}
    assert threads[jid].startswith("cogworker-processor-")
    assert threads[plain] == "cogworker-loop"
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


def test_g8_sigterm_cancels_coroutines_past_the_shutdown_timeout_and_puts_them_back(cog):
    worker = start(cog, CONCURRENCY=2, ASYNC_CONCURRENCY=100, SHUTDOWN_TIMEOUT=1)
    worker.identity()
    jids = async_jobs.asleep.delay_many([((10.0, i), {}) for i in range(20)])
    wait_for(lambda: len(ran(cog, "started")) == 20, 20, "20 coroutines to start")
    asked = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    took_s = time.monotonic() - asked
    print(f"\nSIGTERM: exited {took_s:.2f}s after, SHUTDOWN_TIMEOUT 1")
    assert took_s < 4.5  # the timeout, the cancellation's grace, and the exit
    # Cancelled and ended: due at once, not INTERRUPT_DELAY_S ahead, so the
    # poller's last pass may already have moved some of them to the queue.
    retrying = cog.redis.zrange(cog.key("retry"), 0, -1, withscores=True)
    queued = cog.redis.lrange(cog.key("queue:default"), 0, -1)
    back = [decode(raw) for raw, _ in retrying] + [decode(raw) for raw in queued]
    assert sorted(p["jid"] for p in back) == sorted(jids)
    assert {p["interrupt_count"] for p in back} == {1}
    assert max((s for _, s in retrying), default=0.0) <= time.time()
    assert ran(cog) == Counter()
    successor = start(cog, CONCURRENCY=2, ASYNC_CONCURRENCY=100)
    wait_for(lambda: set(ran(cog)) == set(jids), 30, "the next worker to run them")
    assert ran(cog) == Counter(dict.fromkeys(jids, 1))
    successor.signal(signal.SIGTERM)
    assert successor.wait(15) == 0


# -- blocking, timeouts, crashes ----------------------------------------------------------


def test_a_coroutine_blocking_the_loop_is_named_in_a_warning_within_2s(cog):
    worker = start(cog, CONCURRENCY=1)
    worker.identity()
    jid = async_jobs.ablock.delay(3)
    wait_for(lambda: cog.notes("started"), 20, "the blocking job to start")
    [started] = cog.notes("started")

    def named() -> float | None:
        if f"jid={jid} testproject.testapp.async_jobs.ablock has blocked the event loop" in worker.log():
            return time.time()
        return None

    seen_at = wait_for(named, 10, "the WARNING naming the blocking job")
    print(f"\nblocked loop named {seen_at - started['at']:.2f}s after the job started")
    assert seen_at - started["at"] < 2.0
    wait_for(lambda: ran(cog)[jid] == 1, 10, "the job to end")
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


def test_a_stream_of_coroutines_that_never_await_leaves_the_loop_to_its_other_tasks(cog):
    """On Python 3.12+ a job's coroutine runs at once, up to its first
    wait, in the loop's call that takes the jobs handed over (eager tasks).
    The threads keep handing over more meanwhile: the loop takes the jobs
    it found, then runs its other tasks (a coroutine whose sleep is over,
    the lag watch's tick), not only once the stream has run dry; no job of
    the stream is named for blocking the loop, none blocked it for long.
    Python 3.11 makes no eager tasks: there the test passes either way, and
    it guards on 3.12 and later (``make tox-latest``)."""
    worker = start(cog, CONCURRENCY=2, ASYNC_CONCURRENCY=10)
    worker.identity()
    sleeper = async_jobs.asleep.delay(0.2, "awaiting")
    wait_for(lambda: cog.notes("started"), 20, "the awaiting coroutine to start")
    stream = async_jobs.ablock.delay_many([((0.004,), {})] * 600)
    wait_for(lambda: set(ran(cog)) >= {sleeper, *stream}, 90, "every job to run")
    runs = sorted(n["at"] for n in cog.notes() if n["jid"] != sleeper)
    [woke] = [n["at"] for n in cog.notes() if n["jid"] == sleeper]
    before = sum(at < woke for at in runs)
    print(f"\nthe awaiting coroutine ended after {before} of the stream's {len(runs)} jobs")
    assert woke < runs[len(runs) // 2]  # 0.2 s into a stream of about 3 s
    assert "has blocked the event loop" not in worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


def test_a_stopped_process_is_not_taken_for_a_blocked_loop_when_it_is_continued(cog):
    """SIGSTOP stops the loop's watch too: after SIGCONT, the silence is not
    the loop's, so nothing is named as blocking it (and a stop past
    BLOCKED_EXIT_S would not make the process exit)."""
    worker = start(cog, CONCURRENCY=1)
    worker.identity()
    before = async_jobs.asleep.delay(0.01, "before")
    wait_for(lambda: ran(cog)[before] == 1, 20, "a coroutine to run before the stop")
    worker.signal(signal.SIGSTOP)
    try:
        time.sleep(2.5)  # past BLOCKED_WARN_S (1 s), the time the test is about
    finally:
        worker.signal(signal.SIGCONT)
    after = async_jobs.asleep.delay(0.01, "after")
    wait_for(lambda: ran(cog)[after] == 1, 20, "a coroutine to run after the stop")
    # The watch looks every 0.1 s: a second of watching after the stop.
    time.sleep(1.0)
    assert "has blocked the event loop" not in worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


def test_timeout_cancels_an_awaiting_coroutine_with_jobtimeout_within_half_a_second(cog):
    worker = start(cog, CONCURRENCY=1)
    worker.identity()
    jid = async_jobs.asleep_past_timeout.delay(10)
    wait_for(lambda: dead(cog), 20, "the job to be filed in dead")
    [entry] = dead(cog)
    [started] = cog.notes("started")
    print(f"\ntimeout=1: filed {entry['failed_at'] - started['at']:.2f}s after its start")
    assert entry["jid"] == jid and entry["error_class"] == TIMEOUT_CLASS
    assert "timeout of 1s" in entry["error_message"]
    assert entry["failed_at"] - started["at"] <= 1.5
    assert cog.notes("overran") == []
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


def test_hard_timeout_of_a_coroutine_drains_the_process_which_exits_3_the_job_filed_once(cog):
    worker = start(cog, CONCURRENCY=1, SHUTDOWN_TIMEOUT=1)
    worker.identity()
    jid = async_jobs.asleep_past_hard_timeout.delay(30)
    assert worker.wait(20) == 3
    [entry] = dead(cog)
    assert entry["jid"] == jid and entry["error_class"] == TIMEOUT_CLASS
    assert "hard_timeout of 1s" in entry["error_message"]
    assert cog.notes("overran") == []
    assert cog.redis.zcard(cog.key("retry")) == 0 and cog.redis.llen(cog.key("queue:default")) == 0


def test_a_crash_of_the_event_loop_stops_the_process_with_a_non_zero_status(cog):
    worker = start(cog, CONCURRENCY=1, SHUTDOWN_TIMEOUT=1)
    worker.identity()
    async_jobs.stop_the_loop.delay()
    assert worker.wait(20) == 1
    assert "cogworker-loop died" in worker.log()


def test_the_lag_watch_makes_a_loop_blocked_past_its_limit_stop_the_process(cog):
    """In the test process, with a short limit: a loop blocked that long is
    reported (the manager then drains and exits with status 3)."""
    from django_cogworker.loop_watch import LoopWatch

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    blocked: list[tuple[str, float]] = []
    watch = LoopWatch(loop, lambda: None, lambda jid, s: blocked.append((jid, s)), warn_s=0.3, exit_s=0.8)
    watch.start()
    try:
        loop.call_soon_threadsafe(time.sleep, 1.5)
        wait_for(lambda: blocked, 5, "the blocked loop to be reported")
        assert blocked == [("", 0.8)]
    finally:
        watch.stop()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_the_lag_watch_takes_a_stretch_it_did_not_run_either_for_a_stop_not_a_blocked_loop(caplog):
    """The whole process stopped for longer than the exit limit (its clock
    jumps between two looks of the watch, the loop silent meanwhile): no
    WARNING, and no exit, where the loop alone being silent that long is
    both (the test above)."""
    from django_cogworker.loop_watch import CHECK_S, LoopWatch

    now = [1000.0]
    loop = asyncio.new_event_loop()  # never run: it notes nothing after the stop either
    blocked: list[tuple[str, float]] = []
    watch = LoopWatch(
        loop,
        lambda: None,
        lambda jid, s: blocked.append((jid, s)),
        warn_s=0.3,
        exit_s=0.8,
        clock=lambda: now[0],
    )
    caplog.set_level(logging.WARNING, logger="django_cogworker")
    watch.start()
    try:
        time.sleep(CHECK_S * 3)  # the watch looks a few times
        now[0] += 2.0  # SIGSTOP, then SIGCONT two seconds later
        time.sleep(CHECK_S * 5)
        assert blocked == []
        assert "has blocked the event loop" not in caplog.text
    finally:
        watch.stop()
        loop.close()


def test_server_middleware_with_an_async_form_is_awaited_around_a_coroutine_job(cog):
    middleware = {"client": [], "server": ["testproject.testapp.middleware.AsyncNotes"]}
    worker = start(cog, CONCURRENCY=1, MIDDLEWARE=middleware)
    worker.identity()
    coro = async_jobs.asleep.delay(0.01, "async")
    plain = jobs.record.delay("sync")
    failing = async_jobs.asleep_past_timeout.delay(2)
    wait_for(lambda: len(cog.notes("middleware")) == 6, 20, "the middleware to see the three runs")
    hooks = [(n["jid"], n["hook"], n.get("status")) for n in cog.notes("middleware")]
    assert [h for h in hooks if h[0] == coro] == [(coro, "abefore", None), (coro, "aafter", "success")]
    assert [h for h in hooks if h[0] == plain] == [(plain, "before", None), (plain, "after", "success")]
    assert [h for h in hooks if h[0] == failing] == [(failing, "abefore", None), (failing, "aafter", "dead")]
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


# -- Django: the ORM, async views ---------------------------------------------------------


def test_g14_concurrent_orm_jobs_each_on_a_thread_of_their_own_and_no_connection_leaked(cog, tmp_path):
    db = tmp_path / "db.sqlite3"
    env = {**manage_env(cog), "COGWORKER_DB_PATH": str(db)}
    subprocess.run([sys.executable, str(MANAGE), "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
    worker = start(cog, CONCURRENCY=2, env={"COGWORKER_DB_PATH": str(db)})
    worker.identity()
    jids = async_jobs.aorm.delay_many([((f"group {i}", 0.2), {}) for i in range(50)])
    started = time.monotonic()
    wait_for(lambda: set(ran(cog)) == set(jids), 30, "every ORM job to run")
    took_s = time.monotonic() - started
    print(f"\nORM: 50 x (0.2 s query + acreate) in {took_s:.2f}s (serial: over 10 s)")
    assert took_s < 5.0
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("
            "'select count(*) from auth_group').fetchone()[0])",
            str(db),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(out.stdout) == 50

    def open_db_files() -> int:
        fds = Path(f"/proc/{worker.pid}/fd")
        return sum(1 for fd in fds.iterdir() if _target(fd).startswith(str(db)))

    wait_for(lambda: open_db_files() == 0, 10, "the jobs' connections to be closed", progress=open_db_files)
    # Synchronous ORM on the loop: the job fails with Django's clear error.
    failing = async_jobs.async_sync_orm.delay()
    wait_for(lambda: dead(cog), 20, "the synchronous ORM job to be filed")
    [entry] = dead(cog)
    assert entry["jid"] == failing
    assert entry["error_class"] == "django.core.exceptions.SynchronousOnlyOperation"
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


def _target(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except OSError:
        return ""


async def enqueue_view(request: HttpRequest) -> JsonResponse:
    jid = await async_jobs.asleep.adelay(0.0, "from an async view")
    later = await async_jobs.asleep.adelay_in(60, 0.0, "later")
    many = await jobs.record.adelay_many([(("many",), {})] * 3)
    return JsonResponse({"jid": jid, "later": later, "many": many})


urlpatterns = [path("enqueue/", enqueue_view)]


@pytest.mark.urls(__name__)
def test_adelay_from_an_async_view_and_from_asyncio_run(cog, async_client_factory):
    response = asyncio.run(async_client_factory().get("/enqueue/"))
    assert response.status_code == 200
    body = response.json()
    [queued] = cog.redis.lrange(cog.key("queue:default"), 0, -1)[-1:]
    assert decode(queued)["jid"] == body["jid"]
    assert cog.redis.llen(cog.key("queue:default")) == 4
    [(scheduled, at)] = cog.redis.zrange(cog.key("schedule"), 0, -1, withscores=True)
    assert decode(scheduled)["jid"] == body["later"] and at > time.time() + 55
    # From asyncio.run, with the same checks as .delay().
    jid = asyncio.run(async_jobs.asleep.adelay(0.0, "from asyncio.run"))
    assert jid is not None and len(jid) > 10
    with pytest.raises(TypeError, match="cannot be called with these arguments"):
        asyncio.run(async_jobs.asleep.adelay(1, 2, 3))
    with pytest.raises(TypeError, match="JSON"):
        asyncio.run(async_jobs.asleep.adelay(object()))
    worker = start(cog, CONCURRENCY=1)
    wait_for(lambda: len(ran(cog)) == 5, 20, "the enqueued jobs to run")
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


@pytest.fixture
def async_client_factory() -> Any:
    from django.test import AsyncClient

    return AsyncClient


# -- the testing helpers --------------------------------------------------------------------


def test_inline_and_drain_run_coroutine_jobs(cog):
    with testing.inline() as result:
        async_jobs.asleep.delay(0.01, "inline")
    assert [o.kind for o in result.outcomes] == ["ack"]
    [note] = cog.notes()
    assert note["seen_jid"] == note["jid"]
    jids = async_jobs.asleep.delay_many([((0.01, i), {}) for i in range(3)])
    failing = async_jobs.asleep_past_timeout.delay(2)
    assert testing.drain() == 4
    assert set(ran(cog)) >= set(jids)
    [entry] = dead(cog)
    assert entry["jid"] == failing and entry["error_class"] == TIMEOUT_CLASS
    assert cog.notes("overran") == []


def test_drain_runs_coroutine_jobs_from_an_async_test(cog):
    async def main() -> int:
        await async_jobs.asleep.adelay(0.01, "from async code")
        return testing.drain()

    assert asyncio.run(main()) == 1
    assert len(ran(cog)) == 1
