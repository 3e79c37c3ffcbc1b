"""Unique jobs: the lock ``N:unique:<digest>``, owned by the jid, against a real
Redis; taken at ``.delay()``, released on start or success and on a terminal
failure, kept over a retry, released by its owner only."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from django_cogworker import client, job, locks, testing, unique
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import RedisUnavailable
from django_cogworker.execution import execute
from django_cogworker.payload import encode
from testproject.testapp import jobs
from tests.conftest import wait_for

UNIQUE = jobs.record.set(unique_for=30)


def locks_held(cog: Any) -> dict[str, str]:
    """Every unique lock of the test's namespace: digest -> owner jid."""
    prefix = cog.key("unique:")
    found = {}
    for key in cog.redis.scan_iter(match=prefix + "*", count=1000):
        owner = cog.redis.get(key)  # None: released between the scan and the read
        if owner is not None:
            found[key.decode().removeprefix(prefix)] = owner.decode()
    return found


def queued(cog: Any, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(r) for r in reversed(cog.redis.lrange(cog.key(f"queue:{queue}"), 0, -1))]


def test_the_digest_is_canonical_and_covers_name_args_kwargs_and_queue():
    kwargs = {"x": 1, "y": {"b": 2, "a": 1}}
    base = UNIQUE.payload(["a", 1], kwargs)
    same = UNIQUE.payload(("a", 1), {"y": {"a": 1, "b": 2}, "x": 1})
    assert unique.digest(base) == unique.digest(same)
    assert len(unique.digest(base)) == 64
    others = [
        UNIQUE.payload(["a", 2], kwargs),
        UNIQUE.payload(["a", 1], {"x": 1}),
        UNIQUE.set(queue="mail").payload(["a", 1], kwargs),
        jobs.record_mail.set(queue="default", unique_for=30).payload(
            ["a", 1], {"x": 1, "y": {"b": 2, "a": 1}}
        ),
    ]
    assert len({unique.digest(base), *(unique.digest(p) for p in others)}) == 5


def test_a_duplicate_is_refused_while_the_first_is_queued(cog):
    first = UNIQUE.delay("a")
    assert first is not None
    assert UNIQUE.delay("a") is None  # refused: nothing pushed
    assert UNIQUE.delay("b") is not None  # other arguments
    assert UNIQUE.set(queue="mail").delay("a") is not None  # another queue
    assert jobs.record.delay("a") is not None  # not unique: never refused

    (payload, *_rest) = queued(cog)
    assert [p["args"] for p in queued(cog)] == [["a"], ["b"], ["a"]]
    assert payload["jid"] == first and payload["unique_until"] == "success" and payload["unique_for"] == 30
    key = cog.key("unique:" + payload["unique_digest"])
    assert cog.redis.get(key).decode() == first  # owned by the jid
    assert 29_000 < cog.redis.pttl(key) <= 30_000
    assert len(locks_held(cog)) == 3


def test_a_scheduled_jobs_lock_lasts_from_when_it_is_due(cog):
    jid = UNIQUE.delay_in(100, "later")
    assert UNIQUE.delay_in(5, "later") is None
    (entry,) = cog.redis.zrange(cog.key("schedule"), 0, -1)
    key = cog.key("unique:" + json.loads(entry)["unique_digest"])
    assert cog.redis.get(key).decode() == jid
    assert 129_000 < cog.redis.pttl(key) <= 130_000


def test_delay_many_skips_the_refused_and_returns_only_the_pushed(cog):
    jids = UNIQUE.delay_many([(("a",), {}), (("a",), {}), (("b",), {})])
    assert len(jids) == 2
    assert [p["jid"] for p in queued(cog)] == jids
    assert sorted(locks_held(cog).values()) == sorted(jids)


# -- releases, in-process through the real execution and middleware ------------------------

seen: list[int] = []


@job(name="tests.unique.peek", unique_for=30)
def peek() -> None:
    """Notes how many unique locks exist while it runs."""
    seen.append(len(list(get_redis().scan_iter(match=get_keys().unique_prefix + "*"))))


@pytest.fixture
def peeking():
    seen.clear()
    yield seen
    seen.clear()


@pytest.mark.parametrize(("until", "during"), [("success", 1), ("start", 0)])
def test_released_on_success_or_at_the_start(cog, peeking, until, during):
    assert peek.set(unique_until=until).delay() is not None
    assert peek.set(unique_until=until).delay() is None
    assert testing.drain() == 1
    assert peeking == [during]  # held while running ("success") or not ("start")
    assert locks_held(cog) == {}
    assert peek.set(unique_until=until).delay() is not None  # free again


def test_a_retry_keeps_the_lock_and_the_terminal_failure_releases_it(cog):
    failing = jobs.fail.set(unique_for=30)  # retry=2, retried after 0.1 s
    jid = failing.delay("x")
    assert testing.drain() == 1
    assert cog.redis.zcard(cog.key("retry")) == 1
    assert list(locks_held(cog).values()) == [jid]  # kept over the retry
    assert failing.delay("x") is None  # so no duplicate slips in between attempts

    def run_due() -> bool:
        testing.drain(include_scheduled=True)
        return cog.redis.zcard(cog.key("dead")) == 1

    wait_for(run_due, 10, "the retries to run out")
    assert locks_held(cog) == {}  # dead: released
    assert failing.delay("x") is not None


@pytest.mark.parametrize("until", ["success", "start"])
def test_a_dropped_job_releases_its_lock(cog, until):
    jobs.fail_and_drop.set(unique_for=30, unique_until=until).delay("x")
    assert testing.drain() == 1
    assert cog.redis.zcard(cog.key("dead")) == 0
    assert locks_held(cog) == {}


def test_only_the_owner_deletes_the_lock(cog):
    key = cog.key("unique:abc")
    cog.redis.set(key, "owner-jid")
    assert locks.release_owned(get_redis(), key, "another-jid") is False
    assert cog.redis.get(key) == b"owner-jid"
    assert locks.release_owned(get_redis(), key, "owner-jid") is True
    assert not cog.redis.exists(key)
    assert locks.release_owned(get_redis(), key, "owner-jid") is False  # gone: nothing to do


def test_a_late_job_cannot_release_the_next_owners_lock(cog):
    # The first job's lock expired while it waited; a second identical job
    # took the lock. The first one finishing must not free the second's.
    first = UNIQUE.payload(["late"], {})
    first["unique_digest"] = unique.digest(first)
    key = cog.key("unique:" + first["unique_digest"])
    second = UNIQUE.delay("late")
    assert cog.redis.get(key).decode() == second
    execute(encode(first), get_config(), close_connections=False)
    assert cog.redis.get(key).decode() == second


def test_a_failed_push_releases_the_lock_it_took(cog, monkeypatch):
    def unreachable(payloads: Any, at: Any) -> None:
        raise RedisUnavailable("could not enqueue: Redis is unreachable (test)")

    monkeypatch.setattr(client, "_push", unreachable)
    with pytest.raises(RedisUnavailable):
        UNIQUE.delay("a")
    assert locks_held(cog) == {}
    monkeypatch.undo()
    assert UNIQUE.delay("a") is not None


def test_redis_down_at_delay_is_a_clear_error_and_takes_no_lock(cog):
    cog.settings.COGWORKER = {
        **cog.settings.COGWORKER,
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "REDIS_OPTIONS": {"socket_connect_timeout": 0.2},
    }
    with pytest.raises(RedisUnavailable, match="unreachable"):
        UNIQUE.delay("a")


# -- real workers --------------------------------------------------------------------


@pytest.mark.parametrize(("until", "duplicate_while_running"), [("success", False), ("start", True)])
def test_in_a_worker_the_lock_lives_until_success_or_start(cog, until, duplicate_while_running):
    slow = jobs.sleep_then_record.set(unique_for=30, unique_until=until)
    first = slow.delay(1.5, "first")
    worker = cog.start_worker()
    wait_for(lambda: cog.notes("started"), 20, "the job to start")
    during = slow.delay(1.5, "first")
    assert (during is not None) == duplicate_while_running
    wait_for(lambda: len(cog.notes("runs")) == (2 if during else 1), 20, "the runs to finish")
    # Both sleep as long: under load the duplicate may finish first.
    assert sorted(n["jid"] for n in cog.notes("runs")) == sorted(j for j in (first, during) if j)
    wait_for(lambda: locks_held(cog) == {}, 5, "the lock to go")
    assert slow.delay(1.5, "first") is not None  # free once finished
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


def test_a_poison_pill_filed_in_dead_releases_its_lock(cog):
    # Its process dies under it; past MAX_ORPHANINGS recovery files it in
    # dead as ProcessDied, and releases its unique lock on the way (G3).
    cog.configure(MAX_ORPHANINGS=0)
    jid = jobs.kill_own_process.set(unique_for=300).delay()
    victim = cog.start_worker()
    victim.wait(20)
    assert list(locks_held(cog).values()) == [jid]  # the dead process still owns it
    rescuer = cog.start_worker()
    dead = wait_for(lambda: cog.redis.zrange(cog.key("dead"), 0, -1), 20, "the job to be filed in dead")
    entry = json.loads(dead[0])
    assert entry["jid"] == jid and entry["error_class"] == "ProcessDied"
    wait_for(lambda: locks_held(cog) == {}, 5, "the lock to be released")
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(15) == 0
    assert jobs.kill_own_process.set(unique_for=300).delay() is not None  # free again
