#!/usr/bin/env python
"""A worker's resident memory against the floor's, and what makes the difference.

Starts a redis-server of its own and, ``--runs`` times each, two processes
on the harness's settings (tools/benchenv.py writes them as the harness
writes its own: the admin and Django's other contrib apps, CONCURRENCY 10,
logging at WARNING):

- **worker**: ``python -m django cogworker``, as the harness's cogworker
  row runs it (system checks included); ``--jobs`` no-op jobs are enqueued
  with ``delay_many()`` and run, then its ``VmRSS`` is read from ``/proc``;
- **floor**: the same settings less ``django_cogworker``, as the harness's
  floor row (``workloads/floor_jobs.py``): ``django.setup()``, redis-py
  imported, ten threads each on a raw socket looping on ``BLMOVE`` ->
  ``json.loads`` -> ``LREM``; the same number of jobs, then its ``VmRSS``.
  Like the harness's floor, it runs no system checks.

It prints both medians and the difference (the harness's
``rss_mb_above_floor``), then the modules the worker holds that the floor
does not (grouped by top-level package), and, with ``--trace``, a worker
run under ``tracemalloc`` (which changes its RSS: a separate run) giving the
memory still allocated after the jobs, by module. Not a test: the figure of
docs/performance.md ("Memory").

    .venv/bin/python tools/worker_rss.py
    .venv/bin/python tools/worker_rss.py --runs 5 --trace
    .venv/bin/python tools/worker_rss.py --python ~/.cache/cogworker-bench/venvs/cogworker/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import benchenv
import localredis

ROOT = Path(__file__).resolve().parent.parent

APP = "rssapp"
DONE = "rss:done"
PROBE = "rss:probe"
#: Longest wait for a process to start or for its jobs to run.
DEADLINE_S = 120.0

JOBS_PY = f"""
import json, sys

from django_cogworker import job
from django_cogworker.connection import get_redis


@job
def noop():
    get_redis().incr({DONE!r})


@job
def probe():
    # Run after the RSS is read: what it allocates does not count.
    found = {{"modules": sorted(sys.modules)}}
    import tracemalloc

    if tracemalloc.is_tracing():
        stats = tracemalloc.take_snapshot().statistics("filename")
        found["traced"] = [[s.traceback[0].filename, s.size] for s in stats]
    get_redis().set({PROBE!r}, json.dumps(found))
"""

#: The floor row's worker, as ``workloads/floor_jobs.py`` (its record is an INCR).
FLOOR_PY = f"""
import json, os, socket, sys, threading
from urllib.parse import urlsplit

import django

django.setup()
import redis  # noqa: F401  (import only, as the floor row)


def bulk(data):
    return b"$%d\\r\\n%s\\r\\n" % (len(data), data)


def command(*words):
    return b"*%d\\r\\n" % len(words) + b"".join(bulk(w) for w in words)


def reply(reader):
    line = reader.readline()
    if line[:1] == b"$":
        size = int(line[1:-2])
        return None if size < 0 else reader.read(size + 2)[:-2]
    return None


def work(index):
    parts = urlsplit(os.environ["RSS_REDIS_URL"])
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = sock.makefile("rb")
    processing = b"floor:processing:%d" % index
    fetch = command(b"BLMOVE", b"floor:queue", processing, b"RIGHT", b"LEFT", b"1")
    while True:
        sock.sendall(fetch)
        raw = reply(reader)
        if raw is None:
            continue
        job = json.loads(raw)
        if job["job"] == "probe":
            found = json.dumps({{"modules": sorted(sys.modules)}}).encode()
            sock.sendall(command(b"SET", {PROBE!r}.encode(), found))
        else:
            sock.sendall(command(b"INCR", {DONE!r}.encode()))
        reader.readline()
        sock.sendall(command(b"LREM", processing, b"1", raw))
        reader.readline()


for i in range(10):
    threading.Thread(target=work, args=(i,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


def vm_rss_mb(pid: int) -> float:
    """The process's resident memory, in MiB (its threads printed too)."""
    with open(f"/proc/{pid}/status") as fh:
        fields = dict(line.split(":", 1) for line in fh)
    rss, threads = fields["VmRSS"].strip(), fields["Threads"].strip()
    print(f"  pid {pid}: VmRSS {rss}, {threads} threads", file=sys.stderr)
    return int(fields["VmRSS"].split()[0]) / 1024


def wait(check: Callable[[], bool], proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if proc.poll() is not None:
            err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            raise SystemExit(f"worker_rss: the process exited while waiting for {what}: {err}")
        if time.monotonic() > deadline:
            raise SystemExit(f"worker_rss: gave up waiting for {what}")
        time.sleep(0.01)


class Bench:
    """One redis-server, the settings, and the processes measured on them."""

    def __init__(self, python: str, url: str, tmp: Path, jobs: int, worker_args: list[str]) -> None:
        self.python, self.url, self.tmp, self.jobs = python, url, tmp, jobs
        self.worker_args = worker_args
        import redis

        self.client = redis.Redis.from_url(url)
        (tmp / APP).mkdir()
        (tmp / APP / "__init__.py").write_text("")
        (tmp / APP / "jobs.py").write_text(JOBS_PY)
        (tmp / "rss_worker.py").write_text(benchenv.settings_py(url, [APP]))
        floor = benchenv.settings_py(url, [])
        (tmp / "rss_floor.py").write_text(floor.replace('"django_cogworker", ', ""))
        assert "django_cogworker" not in (tmp / "rss_floor.py").read_text().split("COGWORKER")[0]
        sys.path[:0] = [str(tmp), str(ROOT)]
        os.environ["DJANGO_SETTINGS_MODULE"] = "rss_worker"
        import django

        django.setup()
        from rssapp import jobs as tool_jobs  # type: ignore[import-not-found]

        self.tool_jobs = tool_jobs

    def _env(self, settings: str, trace: bool = False) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": f"{self.tmp}{os.pathsep}{ROOT}", "RSS_REDIS_URL": self.url}
        env["DJANGO_SETTINGS_MODULE"] = settings
        env.pop("PYTHONTRACEMALLOC", None)
        if trace:
            env["PYTHONTRACEMALLOC"] = "1"
        return env

    def _done(self) -> int:
        return int(self.client.get(DONE) or 0)

    def worker(self, trace: bool = False) -> tuple[float, dict[str, object]]:
        """Runs the jobs through a fresh worker: its RSS (MB) and its probe."""
        self.client.flushall()
        argv = [self.python, "-m", "django", "cogworker", *self.worker_args]
        # cwd: ``-m`` puts it first on sys.path, where no module may shadow the settings.
        env = self._env("rss_worker", trace)
        proc = subprocess.Popen(
            argv, env=env, cwd=self.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            self.tool_jobs.noop.delay()
            wait(lambda: self._done() >= 1, proc, "the worker's first job")
            self.tool_jobs.noop.delay_many([((), {})] * (self.jobs - 1))
            wait(lambda: self._done() >= self.jobs, proc, f"{self.jobs} jobs")
            rss = vm_rss_mb(proc.pid)
            self.tool_jobs.probe.delay()
            wait(lambda: bool(self.client.exists(PROBE)), proc, "the probe job")
            return rss, json.loads(self.client.get(PROBE))
        finally:
            proc.terminate()
            proc.communicate(timeout=60)

    def floor(self) -> tuple[float, dict[str, object]]:
        """The same for the floor's process."""
        self.client.flushall()
        argv = [self.python, "-c", FLOOR_PY]
        env = self._env("rss_floor")
        proc = subprocess.Popen(argv, env=env, cwd=self.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdout is not None
            proc.stdout.readline()
            payload = json.dumps({"job": "noop", "args": [], "kwargs": {}})
            for start in range(0, self.jobs, 1000):
                self.client.lpush("floor:queue", *[payload] * min(1000, self.jobs - start))
            wait(lambda: self._done() >= self.jobs, proc, f"{self.jobs} floor jobs")
            rss = vm_rss_mb(proc.pid)
            self.client.lpush("floor:queue", json.dumps({"job": "probe"}))
            wait(lambda: bool(self.client.exists(PROBE)), proc, "the floor's probe")
            return rss, json.loads(self.client.get(PROBE))
        finally:
            proc.kill()
            proc.communicate(timeout=60)


def extra_modules(worker: list[str], floor: list[str]) -> dict[str, list[str]]:
    """The worker's modules that the floor has not loaded, by top-level package."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in sorted(set(worker) - set(floor)):
        groups[name.partition(".")[0]].append(name)
    return dict(groups)


def by_module(traced: list[list[object]], top: int) -> list[tuple[str, int]]:
    """tracemalloc's sizes by file, folded into top-level packages (the
    project's own modules kept apart), largest first."""
    sizes: dict[str, int] = defaultdict(int)
    for filename, size in traced:
        path = str(filename)
        if "/django_cogworker/" in path:
            key = "django_cogworker/" + path.split("/django_cogworker/", 1)[1]
        elif "site-packages/" in path:
            key = path.split("site-packages/", 1)[1].split("/", 1)[0]
        else:
            key = "/".join(path.split("/")[-2:])
        sizes[key] += int(size)  # type: ignore[call-overload]
    return sorted(sizes.items(), key=lambda kv: -kv[1])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="no-op jobs per process")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes of each kind (median)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of both processes")
    parser.add_argument("--redis-server", help="the redis-server binary")
    parser.add_argument("--trace", action="store_true", help="one more worker run under tracemalloc")
    parser.add_argument("--top", type=int, default=25, help="rows of the tracemalloc table")
    parser.add_argument("--all-modules", action="store_true", help="list every extra module")
    parser.add_argument(
        "--worker-arg", action="append", default=[], help="one more argument of the worker's command line"
    )
    benchenv.add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:
        args.jobs, args.runs, args.trace, args.top = 20, 1, True, 5
    binary = localredis.server_binary(args.redis_server)
    with localredis.running(binary) as port, tempfile.TemporaryDirectory() as tmp:
        bench = Bench(args.python, f"redis://127.0.0.1:{port}/0", Path(tmp), args.jobs, args.worker_arg)
        worker_rss, floor_rss = [], []
        for _ in range(args.runs):  # interleaved, so that a busy spell hits both
            rss, worker_probe = bench.worker()
            worker_rss.append(rss)
            rss, floor_probe = bench.floor()
            floor_rss.append(rss)
        w, f = statistics.median(worker_rss), statistics.median(floor_rss)
        print(f"jobs per process: {args.jobs}; runs: {args.runs}; python: {args.python}")
        print(f"worker RSS: {w:.1f} MB (runs: {', '.join(f'{x:.1f}' for x in worker_rss)})")
        print(f"floor  RSS: {f:.1f} MB (runs: {', '.join(f'{x:.1f}' for x in floor_rss)})")
        print(f"worker - floor: {w - f:+.1f} MB")
        groups = extra_modules(worker_probe["modules"], floor_probe["modules"])  # type: ignore[arg-type]
        total = sum(len(names) for names in groups.values())
        print(f"\nmodules in the worker, not in the floor: {total}")
        for top_name, names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            shown = names if args.all_modules or len(names) <= 8 else [*names[:8], "..."]
            print(f"  {top_name} ({len(names)}): {' '.join(shown)}")
        if args.trace:
            _, traced = bench.worker(trace=True)
            rows = by_module(traced.get("traced", []), args.top)  # type: ignore[arg-type]
            print("\ntracemalloc, the worker after its jobs (KB still allocated, by module):")
            for name, size in rows:
                print(f"  {size / 1024:9.1f}  {name}")


if __name__ == "__main__":
    main()
