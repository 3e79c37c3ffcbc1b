#!/usr/bin/env python
"""What one enqueued job costs the enqueuing process, in instructions: ``delay_many()`` and ``.delay()``.

Counts with valgrind's callgrind, which counts instructions, not seconds:
the same code gives the same count however busy the machine is, so two
commits compare to within a fraction of a percent where timings on a
shared machine vary by a third. The enqueuing process runs under
callgrind twice, with Django set up and a first call made, once with
``--jobs`` more jobs enqueued and once with none; the difference, divided
by ``--jobs``, is one job's cost. The harness's virtualenv (made by its
first run) and settings, this checkout's code, a no-op job with no
arguments as the harness's, against a redis-server of its own (Redis's
own work is not counted: it is another process).

    python3 tools/enqueue_instructions.py
    python3 tools/enqueue_instructions.py --jobs 2000
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import benchenv

ROOT = Path(__file__).resolve().parent.parent

ENQUEUE = """
import sys
import django
django.setup()
from enqapp.jobs import noop
way, count = sys.argv[1], int(sys.argv[2])
if way == "delay_many":
    noop.delay_many([((), {})] * 100)
    if count:
        noop.delay_many([((), {})] * count)
else:
    for _ in range(100):
        noop.delay()
    for _ in range(count):
        noop.delay()
"""


def instructions(project: benchenv.Project, way: str, count: int, callgrind: bool = True) -> int:
    """The instructions of one enqueuing process that enqueues ``count``
    jobs ``way``; with ``callgrind`` False (--smoke) it runs, uncounted."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] if callgrind else []
    script = ["-c", ENQUEUE, way, str(count)] if way else ["-S", "-c", "pass"]
    command += [project.python, *script]
    env = {**project.env, "PYTHONHASHSEED": "0"}
    # In its temporary directory: `python -c` puts the working directory
    # first on sys.path, and a checkout there would be imported instead.
    done = subprocess.run(command, env=env, cwd=project.tmp, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or (callgrind and found is None):
        sys.exit(f"enqueue_instructions: {way or 'python'} failed:\n{done.stderr[-2000:]}")
    return int(found.group(1)) if found else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--redis-server", help="the redis-server binary (default: an installed one)")
    benchenv.add_smoke(parser)
    args = parser.parse_args()
    smoke = benchenv.smoke(args)
    if shutil.which("valgrind") is None:
        if smoke:
            print("enqueue_instructions: skipped, no valgrind (scripts/system-packages tools installs it)")
            return
        sys.exit("enqueue_instructions: needs valgrind (apt-get install valgrind)")
    jobs_py = benchenv.NOOP_JOBS_PY
    with benchenv.project("enqueue_instructions", args.redis_server, "enqapp", jobs_py, str(ROOT)) as project:
        if smoke:
            # Under callgrind a process with Django set up takes a minute:
            # the enqueuing script runs uncounted, callgrind on a bare python.
            for way in ("delay_many", "delay"):
                instructions(project, way, 20, callgrind=False)
            bare = instructions(project, "", 0)
            print(f"enqueue_instructions: both ways ran; callgrind counted {bare:,} for a bare python")
            return
        print(f"| way ({args.jobs:,} jobs) | instructions per job |\n|---|---|")
        for way in ("delay_many", "delay"):
            per_job = (instructions(project, way, args.jobs) - instructions(project, way, 0)) / args.jobs
            print(f"| `{way}()` | {per_job:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
