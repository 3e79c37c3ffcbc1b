#!/usr/bin/env python
"""How fast an idle worker with weighted queues drains a burst on one of them.

The idle threads of a worker with several queues wait on them with
``BLMOVE``, spread over the queues (G9). A burst of jobs on one queue starts
at once on the threads waiting there; the others join as their waits end
(within a second) or as they finish a job. How the threads are spread
therefore decides how fast a burst on an idle worker starts.

This starts a worker (``CONCURRENCY`` 8, ``QUEUES = ["a,3", "b,1"]``), sends
it one job at a time on ``b`` for a second (so that ``b`` is the queue of
the last jobs), then lets it go idle for 0.3 s and pushes ``--jobs`` jobs on
``a`` with ``delay_many()``, each sleeping ``--job-ms``. It prints when the
first eight of them started and when the last one ended, from the push.

Runs in the harness's virtualenv (made by its first run) against a
redis-server of its own; Django settings as the harness's. The code measured
is the checkout's (``--project``, default this one).

    python3 tools/idle_burst.py
    python3 tools/idle_burst.py --runs 3 --project <checkout>
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import benchenv

JOBS_PY = """
import os, time
from django_cogworker import job

@job
def sleepy(ms):
    started = time.time()
    time.sleep(ms / 1000)
    os.write(1, f"J {started} {time.time()}\\n".encode())  # one write: threads do not mix their lines
"""

WORKER = """
import sys, threading, time
import django
django.setup()
from django_cogworker.conf import get_config
from django_cogworker.launcher import Launcher
launcher = Launcher(get_config())
thread = threading.Thread(target=launcher.run, daemon=True)
thread.start()
time.sleep(float(sys.argv[1]))
launcher.signals.put("stop")
thread.join(30)
"""

CLIENT = """
import sys, time
import django
django.setup()
from burstapp.jobs import sleepy
jobs, ms = int(sys.argv[1]), float(sys.argv[2])
time.sleep(2.5)  # the worker's threads started and blocked
for _ in range(20):
    sleepy.set(queue="b").delay(0)
    time.sleep(0.03)
time.sleep(0.3)
print("PUSH", time.time(), flush=True)
sleepy.set(queue="a").delay_many([((ms,), {})] * jobs)
"""

#: How long the worker runs: the start, the jobs on b, the burst, a margin.
WORKER_S = 7.0


def run_once(args: argparse.Namespace) -> dict[str, object]:
    config: dict[str, object] = {"QUEUES": ["a,3", "b,1"], "CONCURRENCY": 8}
    with benchenv.project(
        "idle_burst", args.redis_server, "burstapp", JOBS_PY, args.project, config
    ) as project:
        worker = subprocess.Popen(
            [project.python, "-c", WORKER, str(WORKER_S)],
            env=project.env,
            cwd=project.tmp,
            stdout=subprocess.PIPE,
            text=True,
        )
        client = subprocess.run(
            [project.python, "-c", CLIENT, str(args.jobs), str(args.job_ms)],
            env=project.env,
            cwd=project.tmp,
            capture_output=True,
            text=True,
            check=True,
        )
        out, _ = worker.communicate(timeout=WORKER_S + 60)
    push = float(next(line for line in client.stdout.splitlines() if line.startswith("PUSH")).split()[1])
    ran = sorted(
        (float(start), float(end))
        for _, start, end in (line.split() for line in out.splitlines() if line.startswith("J "))
    )
    burst = [(start, end) for start, end in ran if start >= push]
    if len(burst) != args.jobs:
        raise SystemExit(f"idle_burst: {len(burst)} of the {args.jobs} jobs of the burst ran")
    return {
        "first_starts_ms": [round((start - push) * 1000) for start, _ in burst[:8]],
        "all_done_ms": round((max(end for _, end in burst) - push) * 1000),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=80)
    parser.add_argument(
        "--job-ms", type=float, default=10.0, help="each job's sleep (default: %(default)s ms)"
    )
    parser.add_argument("--runs", type=int, default=1)
    benchenv.add_project_arguments(parser, str(Path(__file__).resolve().parent.parent))
    args = parser.parse_args()
    if benchenv.smoke(args):
        args.jobs, args.runs = 8, 1
    for _ in range(args.runs):
        print(json.dumps(run_once(args)))


if __name__ == "__main__":
    main()
