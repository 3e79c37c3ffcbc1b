"""``django_cogworker.testing``: ``inline()`` and ``drain()``, and
``current_job()`` as a job sees it."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from django_cogworker import current_job, execution, job, testing
from django_cogworker.context import JobContext
from testproject.testapp import jobs
from tests.conftest import wait_for

seen: list[tuple[list[Any], dict[str, Any], JobContext | None]] = []


@job(queue="mail")
def capture(*args: Any, **kwargs: Any) -> None:
    seen.append((list(args), kwargs, current_job()))


@pytest.fixture(autouse=True)
def _clear_seen():
    seen.clear()
    yield
    seen.clear()


def zset(cog: Any, name: str) -> list[tuple[dict[str, Any], float]]:
    return [(json.loads(r), s) for r, s in cog.redis.zrange(cog.key(name), 0, -1, withscores=True)]


def test_current_job_is_none_outside_a_job():
    assert current_job() is None
    capture(1)
    assert seen == [([1], {}, None)]


# -- inline() ---------------------------------------------------------------------


def test_inline_runs_delay_at_once_and_records_each_outcome(cog):
    with testing.inline() as result:
        ok = jobs.record.delay("a")
        retried = jobs.fail.delay("will retry")
        dead = jobs.fail.set(retry=0).delay("will die")
        dropped = jobs.fail_and_drop.delay("dropped")

    assert [(o.kind, o.jid, o.failed) for o in result.outcomes] == [
        (execution.ACK, ok, False),
        (execution.RETRY, retried, True),
        (execution.DEAD, dead, True),
        (execution.ACK, dropped, True),
    ]
    retry_payload = result.outcomes[1].payload
    assert retry_payload is not None
    assert (retry_payload["retry_count"], retry_payload["error_class"]) == (0, "ValueError")
    assert retry_payload["error_message"] == "will retry"
    dead_payload = result.outcomes[2].payload
    assert dead_payload is not None and dead_payload["error_message"] == "will die"
    assert [(n["jid"], n["tag"]) for n in cog.notes()] == [
        (ok, "a"),
        (retried, "will retry"),
        (dead, "will die"),
        (dropped, "dropped"),
    ]
    # Nothing went through Redis: no queue, no retry or dead entry.
    assert (
        cog.redis.exists(cog.key("queue:default"), cog.key("queues"), cog.key("retry"), cog.key("dead")) == 0
    )
    # The job's error handlers ran as in a worker.
    assert [e["jid"] for e in cog.notes("errors")] == [retried, dead, dropped]


def test_inline_passes_arguments_through_json_and_sets_the_context(cog):
    with testing.inline() as result:
        jid = capture.delay([1, 2], {"k": [3.5]}, flag=True)
        many = capture.delay_many([((1,), {}), ((), {"x": 2})])
    assert [o.kind for o in result.outcomes] == [execution.ACK] * 3
    assert [s[:2] for s in seen] == [([[1, 2], {"k": [3.5]}], {"flag": True}), ([1], {}), ([], {"x": 2})]
    assert [s[2] for s in seen] == [
        JobContext(jid=j, queue="mail", retry_count=0, name="tests.test_testing_helpers.capture")
        for j in [jid, *many]
    ]


def test_inline_refuses_what_json_would_change_as_delay_does(cog):
    with testing.inline() as result, pytest.raises(TypeError, match="contains a tuple"):
        capture.delay((1, 2))
    assert result.outcomes == [] and seen == []


def test_inline_still_refuses_non_json_arguments(cog):
    with testing.inline() as result, pytest.raises(TypeError, match="argument 'x' of job"):
        capture.delay(x=object())
    assert result.outcomes == [] and seen == []


def test_inline_ends_with_its_block(cog):
    with testing.inline():
        pass
    jid = jobs.record.delay("queued")
    assert [json.loads(r)["jid"] for r in cog.redis.lrange(cog.key("queue:default"), 0, -1)] == [jid]
    assert cog.notes() == []


# -- drain() ----------------------------------------------------------------------


def test_drain_runs_everything_queued_and_files_failures_like_a_worker(cog):
    ok = [jobs.record.delay(i) for i in range(3)]
    retried = jobs.fail.delay("again")
    dead = jobs.fail.set(retry=0).delay("dies")
    dropped = jobs.fail_and_drop.delay()
    cog.redis.lpush(cog.key("queue:default"), b"{not json")
    cog.redis.lpush(
        cog.key("queue:default"), json.dumps({"jid": "j-unknown", "job": "no.such.job", "args": []})
    )
    before = time.time()

    assert testing.drain() == 8
    after = time.time()

    assert cog.redis.llen(cog.key("queue:default")) == 0
    assert [n["jid"] for n in cog.notes()] == [*ok, retried, dead, dropped]
    [(retry_entry, retry_score)] = zset(cog, "retry")
    assert retry_entry["jid"] == retried
    assert (retry_entry["retry_count"], retry_entry["error_class"], retry_entry["error_message"]) == (
        0,
        "ValueError",
        "again",
    )
    assert "ValueError: again" in retry_entry["error_backtrace"]
    assert before <= retry_entry["failed_at"] <= after
    assert "retried_at" not in retry_entry
    assert before + 0.1 <= retry_score <= after + 0.1  # the job's retry_in

    dead_entries = {e["jid"]: (e, s) for e, s in zset(cog, "dead")}
    assert len(dead_entries) == 3  # the retry=0 failure, the unreadable and the unknown payloads
    assert dead_entries[dead][0]["error_message"] == "dies"
    assert dead_entries[dead][0]["retry_count"] == 0
    assert dropped not in dead_entries
    unknown = dead_entries["j-unknown"][0]
    assert unknown["error_class"] == "django_cogworker.errors.JobNotRegistered"
    assert "'no.such.job' is not registered" in unknown["error_message"]
    assert "jobs.py" in unknown["error_message"] and "restart the worker" in unknown["error_message"]
    assert "run it with --reload" in unknown["error_message"]
    assert "retry this job from the Dead page" in unknown["error_message"]
    [garbage] = [e for e, _ in dead_entries.values() if "raw" in e]
    assert garbage["raw"] == "{not json"
    assert garbage["error_class"] == "django_cogworker.errors.BadPayload"


def test_drain_with_scheduled_runs_retries_to_exhaustion(cog):
    jid = jobs.fail.delay("tries")
    assert testing.drain() == 1
    for expected_count in (0, 1):
        [(entry, score)] = zset(cog, "retry")
        assert entry["retry_count"] == expected_count
        wait_for(lambda score=score: time.time() > score, 5, "the retry to be due")
        assert testing.drain(include_scheduled=True) == 1
    assert cog.redis.zcard(cog.key("retry")) == 0
    [(entry, _)] = zset(cog, "dead")
    assert entry["jid"] == jid
    assert entry["retry_count"] == 2  # retry=2: three runs, then dead
    assert entry["retried_at"] > entry["failed_at"]
    notes = cog.notes()
    assert [(n["jid"], n["retry_count"], n["queue"], n["name"]) for n in notes] == [
        (jid, 0, "default", "testproject.testapp.jobs.fail"),
        (jid, 1, "default", "testproject.testapp.jobs.fail"),
        (jid, 2, "default", "testproject.testapp.jobs.fail"),
    ]
    assert len(cog.notes("errors")) == 3


def test_drain_with_scheduled_leaves_jobs_not_yet_due(cog):
    due = jobs.record.delay_at(time.time() - 1, "due")
    later = jobs.record.delay_in(60, "later")
    assert testing.drain() == 0
    assert testing.drain(include_scheduled=True) == 1
    assert [n["jid"] for n in cog.notes()] == [due]
    [(entry, _)] = zset(cog, "schedule")
    assert entry["jid"] == later


def test_drain_calls_on_exhausted(cog):
    jid = jobs.fail_with_hook.set(retry=0).delay("hook")
    assert testing.drain() == 1
    [exhausted] = cog.notes("exhausted")
    assert (exhausted["jid"], exhausted["error_class"], exhausted["retry_count"]) == (jid, "RuntimeError", 0)
    assert cog.redis.zcard(cog.key("dead")) == 1


def test_drain_trims_the_dead_set_as_a_worker_does(cog):
    cog.configure(DEAD_MAX_JOBS=2, DEAD_TIMEOUT=100)
    cog.redis.zadd(cog.key("dead"), {b'{"jid":"old","job":"x"}': time.time() - 1000})
    jids = [jobs.fail.set(retry=0).delay(str(i)) for i in range(3)]
    assert testing.drain() == 3
    assert sorted(e["jid"] for e, _ in zset(cog, "dead")) == sorted(jids[1:])


def test_drain_follows_the_configured_queue_order(cog):
    cog.configure(QUEUES=["high", "low"])
    low = [jobs.record.set(queue="low").delay(i) for i in range(2)]
    high = [jobs.record.set(queue="high").delay(i) for i in range(2)]
    other = jobs.record.set(queue="elsewhere").delay("not listened to")
    assert testing.drain() == 4
    assert [n["jid"] for n in cog.notes()] == [*high, *low]
    assert [(n["queue"]) for n in cog.notes()] == ["high", "high", "low", "low"]
    assert testing.drain(["elsewhere"]) == 1
    assert cog.notes()[-1]["jid"] == other


def test_drain_stops_at_max_jobs(cog):
    jobs.record.delay_many([((i,), {}) for i in range(5)])
    assert testing.drain(max_jobs=3) == 3
    assert cog.redis.llen(cog.key("queue:default")) == 2
    assert [n["tag"] for n in cog.notes()] == [0, 1, 2]


def test_drain_sets_current_job(cog):
    jid = capture.delay("x")
    assert testing.drain(["mail"]) == 1
    assert seen == [
        (
            ["x"],
            {},
            JobContext(jid=jid, queue="mail", retry_count=0, name="tests.test_testing_helpers.capture"),
        )
    ]
    assert current_job() is None


def test_helpers_leave_the_tests_database_connection_alone(
    cog, db, monkeypatch, django_capture_on_commit_callbacks
):
    """A test runs inside a transaction: closing its connection (as a worker
    does around each job) would break it, so the helpers never do."""
    from django.db import connection

    from testproject.demo import jobs as demo_jobs
    from testproject.demo.models import JobResult

    JobResult.objects.create(jid="before", job="x", status="succeeded", detail="")
    closed: list[bool] = []
    real_close = connection.close
    monkeypatch.setattr(connection, "close", lambda: (closed.append(True), real_close())[1])
    with testing.inline() as result:
        demo_jobs.add.delay(1, 2)
    # The test's transaction never commits: run the on-commit push by hand.
    with django_capture_on_commit_callbacks(execute=True):
        demo_jobs.add.delay(3, 4)
    assert testing.drain() == 1
    assert [o.kind for o in result.outcomes] == [execution.ACK]
    assert closed == []
    assert sorted(JobResult.objects.values_list("detail", flat=True)) == ["", "1 + 2 = 3", "3 + 4 = 7"]


# -- expires (SPEC section 14) ----------------------------------------------------------


def redis_now(cog: Any) -> float:
    seconds, micros = cog.redis.time()
    return seconds + micros / 1_000_000


def test_drain_drops_a_queued_job_past_its_deadline_as_a_worker_does(cog, caplog):
    late = jobs.expiring_unique.delay("late")
    [raw] = cog.redis.lrange(cog.key("queue:default"), 0, -1)
    payload = json.loads(raw)
    lock = cog.key(f"unique:{payload['unique_digest']}")
    assert cog.redis.get(lock) == late.encode()
    wait_for(lambda: redis_now(cog) > payload["expires_at"] + 0.05, 30, "Redis's clock past the deadline")
    fresh = jobs.expiring.set(expires_in=60).delay("fresh")
    with caplog.at_level("INFO", logger="django_cogworker"):
        assert testing.drain() == 1, "the expired job is not counted as run"
    assert [(n["tag"], n["jid"]) for n in cog.notes()] == [("fresh", fresh)]
    assert cog.redis.llen(cog.key("queue:default")) == 0
    assert int(cog.redis.get(cog.key("stat:expired"))) == 1
    by_job = cog.redis.hgetall(cog.key("stat:expired:jobs"))
    assert by_job == {b"testproject.testapp.jobs.expiring_unique": b"1"}
    assert cog.redis.get(lock) is None, "its unique lock released"
    assert cog.redis.zcard(cog.key("dead")) == cog.redis.zcard(cog.key("retry")) == 0
    assert f"jid={late} testproject.testapp.jobs.expiring_unique expired" in caplog.text


def test_inline_drops_a_job_whose_deadline_passed_before_it_was_due(cog):
    with testing.inline() as result:
        # Due 10 s ago, with 1 s to start: past its deadline when enqueued.
        late = jobs.expiring.delay_at(time.time() - 10, "late")
        on_time = jobs.expiring.delay("on time")
    assert [(o.kind, o.jid, o.failed) for o in result.outcomes] == [
        (execution.ACK, late, None),
        (execution.ACK, on_time, False),
    ]
    assert [n["tag"] for n in cog.notes()] == ["on time"]
    assert int(cog.redis.get(cog.key("stat:expired"))) == 1
