"""``expires`` (SPEC section 14): a job not started within ``expires``
seconds of when it was due is dropped unrun, counted in ``N:stat:expired``
and ``cogworker_expired_total{job}``, logged at INFO, its unique lock
released; on Redis's clock, whatever the producer's or the worker's. Real
Redis, real worker processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from django_cogworker import expiry
from django_cogworker.api.prometheus import scrape
from django_cogworker.views import exposition
from testproject.testapp import jobs
from tests.conftest import MANAGE, ROOT, manage_env, wait_for

EXPIRING = "testproject.testapp.jobs.expiring"
EXPIRING_UNIQUE = "testproject.testapp.jobs.expiring_unique"
EXPIRING_FAIL = "testproject.testapp.jobs.expiring_fail"

#: A sitecustomize that moves ``time.time`` of the process it is imported
#: into by ``COGWORKER_TEST_CLOCK_SKEW_S`` seconds: a machine whose clock is off.
SKEW = """\
import os
import time

_skew = float(os.environ.get("COGWORKER_TEST_CLOCK_SKEW_S", "0"))
if _skew:
    _real = time.time
    time.time = lambda: _real() + _skew
"""


def redis_now(cog: Any) -> float:
    seconds, micros = cog.redis.time()
    return seconds + micros / 1_000_000


def queued(cog: Any, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in cog.redis.lrange(cog.key(f"queue:{queue}"), 0, -1)]


def expired_count(cog: Any) -> int:
    return int(cog.redis.get(cog.key("stat:expired")) or 0)


def run_tags(cog: Any) -> list[Any]:
    return [note["tag"] for note in cog.notes()]


def wait_past(cog: Any, deadline: float) -> None:
    wait_for(lambda: redis_now(cog) > deadline + 0.05, timeout=30, what="Redis's clock past the deadline")


def skewed_env(tmp_path: Path, skew_s: float) -> dict[str, str]:
    (tmp_path / "skew").mkdir(exist_ok=True)
    (tmp_path / "skew" / "sitecustomize.py").write_text(SKEW)
    return {"PYTHONPATH": f"{tmp_path / 'skew'}:{ROOT}", "COGWORKER_TEST_CLOCK_SKEW_S": str(skew_s)}


def test_expires_queued_with_no_worker_is_dropped_counted_unlocked_logged(cog: Any) -> None:
    jid = jobs.expiring_unique.delay("late")
    assert jid is not None
    payload = queued(cog)[0]
    lock = cog.key(f"unique:{payload['unique_digest']}")
    assert cog.redis.get(lock) == jid.encode()
    wait_past(cog, payload["expires_at"])
    jobs.record.delay("marker")
    worker = cog.start_worker()
    wait_for(lambda: "marker" in run_tags(cog) and expired_count(cog) == 1, what="the marker, one expired")
    assert "late" not in run_tags(cog)
    assert cog.redis.hgetall(cog.key("stat:expired:jobs")) == {EXPIRING_UNIQUE.encode(): b"1"}
    assert cog.redis.get(lock) is None, "the unique lock was released"
    assert jobs.expiring_unique.delay("late") is not None, "an identical job is taken again"
    wait_for(lambda: f"jid={jid} {EXPIRING_UNIQUE} expired" in worker.log(), what="the INFO line")
    assert "INFO" in next(line for line in worker.log().splitlines() if f"jid={jid}" in line)
    text = "".join(exposition(scrape()))
    assert f'cogworker_expired_total{{job="{EXPIRING_UNIQUE}"}} 1\n' in text
    assert int(cog.redis.get(cog.key("stat:processed")) or 0) <= 1, "an expired job is not processed"


def test_expires_started_in_time_runs(cog: Any) -> None:
    cog.start_worker().identity()
    jobs.expiring.delay("on time")
    jobs.expiring.set(expires_in=30).delay("roomy")
    wait_for(lambda: sorted(run_tags(cog)) == ["on time", "roomy"], what="both run")
    assert expired_count(cog) == 0


def test_expires_set_validates_and_plain_payload_has_no_deadline(cog: Any) -> None:
    for bad in (0, -1, float("inf"), float("nan"), True, "5"):
        with pytest.raises(TypeError, match="expires"):
            jobs.record.set(expires_in=bad)
        with pytest.raises(TypeError, match="expires"):
            jobs.job(expires=bad)(lambda: None)
    jobs.record.delay("plain")
    assert "expires_at" not in queued(cog)[0]
    before = redis_now(cog)
    jobs.record.set(expires_in=7).delay("timed")
    # Within the offset's measuring error (half a round trip) of Redis's clock.
    assert before + 7 - 0.05 <= queued(cog)[0]["expires_at"] <= redis_now(cog) + 7 + 0.05


def test_expires_counts_from_the_delay_in_due_time(cog: Any) -> None:
    cog.start_worker().identity()
    # Delayed longer than it may wait: counted from enqueue it would expire
    # before it is due; counted from its due time, it runs when due.
    jobs.expiring.set(expires_in=2).delay_in(3, "delayed")
    wait_for(lambda: run_tags(cog) == ["delayed"], what="the delayed job run")
    assert expired_count(cog) == 0


def test_expires_dropped_by_the_poller_when_brought_after_due_plus_expires(cog: Any) -> None:
    jobs.expiring.delay_in(2, "too late")
    (entry,) = cog.redis.zrange(cog.key("schedule"), 0, -1)
    deadline = json.loads(entry)["expires_at"]
    assert 2.5 < deadline - redis_now(cog) <= 3.1, "due in 2 s, then 1 s to start"
    wait_past(cog, deadline)
    worker = cog.start_worker()
    wait_for(lambda: expired_count(cog) == 1, what="the scheduled job expired")
    assert cog.redis.zcard(cog.key("schedule")) == 0
    assert queued(cog) == [], "never pushed to its queue"
    assert run_tags(cog) == []
    wait_for(lambda: "expired (not moved from" in worker.log(), what="the poller's INFO line")


def test_expires_retry_due_after_deadline_is_dropped_not_filed(cog: Any) -> None:
    worker = cog.start_worker()
    jid = jobs.expiring_fail.delay("once")
    wait_for(lambda: expired_count(cog) == 1, what="the failed job expired")
    assert run_tags(cog) == ["once"]
    assert cog.redis.zcard(cog.key("retry")) == 0, "not filed in retry"
    assert cog.redis.zcard(cog.key("dead")) == 0
    assert f"jid={jid} {EXPIRING_FAIL} expired" in worker.log()
    # A retry due before the deadline is filed and runs.
    jobs.fail.set(expires_in=60).delay("retried")
    wait_for(lambda: run_tags(cog).count("retried") == 3, what="three runs of the failing job")
    assert expired_count(cog) == 1


def test_expires_worker_clock_an_hour_ahead_still_runs_a_fresh_job(cog: Any, tmp_path: Path) -> None:
    cog.start_worker(env=skewed_env(tmp_path, 3600)).identity()
    jobs.expiring.set(expires_in=30).delay("fresh")
    jobs.expiring.set(expires_in=30).delay_in(0.5, "fresh, scheduled")
    wait_for(lambda: sorted(run_tags(cog)) == ["fresh", "fresh, scheduled"], what="both run")
    assert expired_count(cog) == 0


def test_expires_worker_clock_an_hour_behind_still_drops_a_late_job(cog: Any, tmp_path: Path) -> None:
    jobs.expiring.delay("late")
    wait_past(cog, queued(cog)[0]["expires_at"])
    jobs.record.delay("marker")
    cog.start_worker(env=skewed_env(tmp_path, -3600))
    wait_for(lambda: "marker" in run_tags(cog) and expired_count(cog) == 1, what="the marker, one expired")
    assert "late" not in run_tags(cog)


def test_expires_producer_clock_an_hour_off_sets_deadline_on_redis_clock(cog: Any, tmp_path: Path) -> None:
    code = "from testproject.testapp import jobs; print(jobs.expiring.set(expires_in=30).delay('skewed'))"
    env = {**manage_env(cog), **skewed_env(tmp_path, -3600)}
    before = redis_now(cog)
    done = subprocess.run(
        [sys.executable, str(MANAGE), "shell", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stderr
    (payload,) = queued(cog)
    assert before + 30 - 0.05 <= payload["expires_at"] <= redis_now(cog) + 30 + 0.05
    assert payload["created_at"] < before - 3000, "the producer's own clock is an hour behind"
    cog.start_worker().identity()
    wait_for(lambda: run_tags(cog) == ["skewed"], what="the job run")
    assert expired_count(cog) == 0


def test_expires_clock_asks_time_only_when_stale(cog: Any) -> None:
    clock = expiry.RedisClock()
    calls = []

    class Counting:
        def time(self) -> Any:
            calls.append(1)
            return cog.redis.time()

    first = clock.offset_s(Counting())
    clock.offset_s(Counting())
    assert len(calls) == 1, "cached"
    assert abs(first) < 1
    clock.measured = (first, clock.measured[1] - expiry.CLOCK_REFRESH_S - 1)  # type: ignore[index]
    clock.offset_s(Counting())
    assert len(calls) == 2, "refreshed"
