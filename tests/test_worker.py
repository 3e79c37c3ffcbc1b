"""The worker end to end: real ``manage.py cogworker`` processes on a real Redis."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
from collections import Counter
from typing import Any

from django_cogworker.api import ProcessSet, Queue, Stats
from testproject.testapp import jobs
from tests.conftest import wait_for

FAIL = "testproject.testapp.jobs.fail"


def zset(cog: Any, name: str) -> list[tuple[dict[str, Any], float]]:
    return [(json.loads(r), s) for r, s in cog.redis.zrange(cog.key(name), 0, -1, withscores=True)]


def stop(worker: Any, timeout: float = 10) -> None:
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout) == 0


def notes_count(cog: Any, n: int, kind: str = "runs", timeout: float = 20) -> list[dict[str, Any]]:
    return wait_for(
        lambda: (lambda got: got if len(got) >= n else None)(cog.notes(kind)), timeout, f"{n} {kind}"
    )


def today() -> dt.date:
    return dt.datetime.now(dt.UTC).date()


def test_every_job_runs_exactly_once_and_is_counted(cog):
    ok = jobs.record.delay_many([((i,), {}) for i in range(60)])
    failed = [jobs.fail.set(retry=0).delay(str(i)) for i in range(2)]
    worker = cog.start_worker()
    runs = notes_count(cog, 62)
    # Counters reach Redis with the next beat.
    wait_for(lambda: Stats().processed == 62, 5, "processed to be counted")
    assert Stats().failed == 2
    assert Stats.history(1) == [(today(), 62, 2)]
    assert cog.redis.get(cog.key(f"stat:processed:{today().isoformat()}")) == b"62"
    assert cog.redis.get(cog.key(f"stat:failed:{today().isoformat()}")) == b"2"
    identity = worker.identity()
    stop(worker)

    assert len(cog.notes()) == 62  # nothing ran twice, even after more beats and the shutdown
    assert Counter(n["jid"] for n in runs) == Counter([*ok, *failed])
    assert {n["pid"] for n in runs} == {worker.pid}
    assert Queue("default").size == 0
    assert cog.redis.llen(cog.key(f"inprogress:{identity}")) == 0
    assert sorted(e["jid"] for e, _ in zset(cog, "dead")) == sorted(failed)
    assert Stats().processed == 62


def test_failures_retry_then_go_to_dead_with_their_history(cog):
    worker = cog.start_worker()
    worker.identity()
    started = time.time()
    jid = jobs.fail.delay("boom")
    hooked = jobs.fail_with_hook.delay("hooked")
    dropped = jobs.fail_and_drop.delay("dropped")
    wait_for(lambda: cog.redis.zcard(cog.key("dead")) == 2, 15, "two jobs in dead")
    wait_for(lambda: Stats().failed == 6, 5, "failures to be counted")

    runs = cog.notes()
    assert [(n["retry_count"], n["queue"], n["name"]) for n in runs if n["jid"] == jid] == [
        (0, "default", FAIL),
        (1, "default", FAIL),
        (2, "default", FAIL),
    ]  # retry=2: exactly three runs
    assert len([n for n in runs if n["jid"] == hooked]) == 2
    assert len([n for n in runs if n["jid"] == dropped]) == 1
    dead = {e["jid"]: (e, s) for e, s in zset(cog, "dead")}
    assert set(dead) == {jid, hooked}
    entry, score = dead[jid]
    assert entry["job"] == FAIL and entry["args"] == ["boom"]
    assert entry["retry_count"] == 2
    assert entry["error_class"] == "ValueError"
    assert entry["error_message"] == "boom"
    assert entry["error_backtrace"].rstrip().endswith("ValueError: boom")
    assert started <= entry["failed_at"] < entry["retried_at"] <= score <= time.time()
    assert cog.redis.zcard(cog.key("retry")) == 0

    [exhausted] = cog.notes("exhausted")
    assert (exhausted["jid"], exhausted["retry_count"], exhausted["error_class"]) == (
        hooked,
        1,
        "RuntimeError",
    )
    errors = cog.notes("errors")
    assert Counter((e["jid"], e["job"], e["error"]) for e in errors) == Counter(
        {
            (jid, FAIL, "ValueError"): 3,
            (hooked, "testproject.testapp.jobs.fail_with_hook", "RuntimeError"): 2,
            (dropped, "testproject.testapp.jobs.fail_and_drop", "ValueError"): 1,
        }
    )
    assert Stats().processed == 6
    stop(worker)


def test_scheduled_jobs_run_at_their_time_not_before(cog):
    worker = cog.start_worker()
    worker.identity()
    soon = jobs.record.delay_in(1.0, "soon")
    due_at = time.time() + 2.0
    later = jobs.record.delay_at(due_at, "later")
    [soon_due] = [s for e, s in zset(cog, "schedule") if e["jid"] == soon]
    runs = notes_count(cog, 2, timeout=10)
    by_jid = {n["jid"]: n for n in runs}
    assert soon_due <= by_jid[soon]["at"] <= soon_due + 2.0
    assert due_at <= by_jid[later]["at"] <= due_at + 2.0
    # Each once. Not their order: run late (as the bounds above allow), both
    # may be moved in one poller pass and run side by side on two threads.
    assert sorted(n["jid"] for n in runs) == sorted([soon, later])
    assert cog.redis.zcard(cog.key("schedule")) == 0
    stop(worker)


def test_a_paused_queue_is_skipped_until_unpaused(cog):
    Queue("default").pause()
    held = jobs.record.delay("held")
    passed = jobs.record_mail.delay("passes")
    worker = cog.start_worker("-q", "default", "-q", "mail")
    notes_count(cog, 1)
    # Strict order tries "default" first: the mail job ran, so "default" was skipped.
    assert [n["jid"] for n in cog.notes()] == [passed]
    assert Queue("default").size == 1
    Queue("default").unpause()
    runs = notes_count(cog, 2, timeout=10)
    assert [n["jid"] for n in runs] == [passed, held]
    stop(worker)


def test_strict_queue_order_empties_the_first_queue_first(cog):
    low = jobs.record.set(queue="low").delay_many([((i,), {}) for i in range(20)])
    high = jobs.record.set(queue="high").delay_many([((i,), {}) for i in range(20)])
    worker = cog.start_worker("-q", "high", "-q", "low", "-c", "1")
    runs = notes_count(cog, 40)
    assert [n["jid"] for n in runs] == [*high, *low]
    stop(worker)


def test_weighted_queues_both_progress_about_three_to_one(cog):
    a = jobs.record.set(queue="a").delay_many([(("a",), {}) for _ in range(300)])
    jobs.record.set(queue="b").delay_many([(("b",), {}) for _ in range(300)])
    worker = cog.start_worker("-q", "a,3", "-q", "b,1", "-c", "1")
    runs = notes_count(cog, 600, timeout=40)
    first = Counter(n["queue"] for n in runs[:200])
    # Expected 150 a / 50 b; the bounds are about five standard deviations wide.
    assert 115 <= first["a"] <= 185, first
    assert first["b"] >= 15, first
    assert [n["jid"] for n in runs if n["queue"] == "a"] == a  # FIFO within a queue
    assert ProcessSet().all()[0].queues == ["a,3", "b,1"]
    stop(worker)


def test_dead_set_is_trimmed_by_count_and_age(cog):
    cog.redis.zadd(cog.key("dead"), {b'{"jid":"ancient","job":"x"}': time.time() - 5000})
    jids = [jobs.fail.set(retry=0).delay(str(i)) for i in range(5)]
    worker = cog.start_worker("-c", "1", DEAD_MAX_JOBS=3, DEAD_TIMEOUT=1000)
    notes_count(cog, 5)
    wait_for(lambda: Stats().failed == 5, 5, "failures to be counted")
    assert [e["jid"] for e, _ in zset(cog, "dead")] == jids[2:]
    stop(worker)


def test_sigterm_waits_for_running_jobs_then_exits_zero(cog):
    worker = cog.start_worker(SHUTDOWN_TIMEOUT=1)
    identity = worker.identity()
    short = jobs.sleep_then_record.delay(0.6, "short")
    jobs.sleep_then_record.delay(30, "long")
    notes_count(cog, 2, "started", timeout=10)
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 0
    elapsed = time.monotonic() - signalled
    assert 0.9 <= elapsed <= 1 + 4  # SHUTDOWN_TIMEOUT, plus a margin for the settling and exit
    assert [n["jid"] for n in cog.notes()] == [short]  # the short job finished inside the timeout
    assert ProcessSet().all() == []
    assert not cog.redis.sismember(cog.key("processes"), identity)
    assert "stopped" in worker.log()


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_processes_starts_separate_identities_and_forwards_sigterm(cog):
    supervisor = cog.start_worker("--processes", "2", "--tag", "pair")
    records = wait_for(lambda: (lambda r: r if len(r) == 2 else None)(ProcessSet().all()), 20, "two workers")
    pids = {r.pid for r in records}
    assert len({r.identity for r in records}) == 2 and len(pids) == 2
    assert supervisor.pid not in pids
    assert {parent_pid(pid) for pid in pids} == {supervisor.pid}
    assert {r.tag for r in records} == {"pair"}
    jids = jobs.record.delay_many([((i,), {}) for i in range(20)])
    runs = notes_count(cog, 20)
    assert sorted(n["jid"] for n in runs) == sorted(jids)
    assert {n["pid"] for n in runs} <= pids

    stop(supervisor, 15)
    assert ProcessSet().all() == []
    assert not any(pid_alive(pid) for pid in pids)


def test_command_line_flags_override_settings(cog):
    worker = cog.start_worker("-q", "mail", "-c", "2", "--tag", "mailer")
    identity = worker.identity()
    [record] = ProcessSet().all()
    assert (record.identity, record.queues, record.concurrency, record.tag) == (
        identity,
        ["mail"],
        2,
        "mailer",
    )
    other = jobs.record.delay("default queue: not served")
    jids = [jobs.sleep_then_record.set(queue="mail").delay(1.0, i) for i in range(3)]
    runs = notes_count(cog, 3, timeout=15)
    starts = sorted(n["at"] for n in cog.notes("started"))
    ends = sorted(n["at"] for n in runs)
    assert starts[1] < ends[0]  # two ran side by side
    assert starts[2] >= ends[0]  # the third waited for a free thread: -c 2
    assert {n["jid"] for n in runs} == set(jids)
    assert {n["queue"] for n in runs} == {"mail"}
    assert [json.loads(r)["jid"] for r in cog.redis.lrange(cog.key("queue:default"), 0, -1)] == [other]
    stop(worker)


def test_basic_fetch_runs_jobs(cog):
    worker = cog.start_worker("--fetch", "basic")
    identity = worker.identity()
    assert ProcessSet().all()[0].fetch == "basic"
    ok = jobs.record.delay("basic")
    failed = jobs.fail.set(retry=0).delay("basic failure")
    runs = notes_count(cog, 2)
    assert {n["jid"] for n in runs} == {ok, failed}
    wait_for(lambda: cog.redis.zcard(cog.key("dead")) == 1, 5, "the failure to be filed")
    assert [e["jid"] for e, _ in zset(cog, "dead")] == [failed]
    # Basic fetch keeps no in-progress list and does not register one.
    assert not cog.redis.sismember(cog.key("inprogress_identities"), identity)
    assert cog.redis.exists(cog.key(f"inprogress:{identity}")) == 0
    stop(worker)
