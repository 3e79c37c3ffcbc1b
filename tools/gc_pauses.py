#!/usr/bin/env python
"""What the garbage collector costs a busy worker: its collections while one runs N no-op jobs.

Runs a worker (a ``Launcher`` in a thread, with ``CPU_AFFINITY`` applied
as ``manage.py cogworker`` applies it) in the harness's virtualenv with its settings and
this checkout's code, against a redis-server of its own; the N jobs are
queued first, from the same process, and their payloads freed before the
worker starts. Prints each generation's collections while the worker
drains the queue, and what one full collection of the started process
costs (``--freeze``: after ``gc.freeze()``, as a process could do once its
start-up is done).

    python3 tools/gc_pauses.py
    python3 tools/gc_pauses.py --jobs 100000 --freeze
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import benchenv

ROOT = Path(__file__).resolve().parent.parent

WORKER = """
import collections, gc, sys, threading, time
import django
django.setup()
import redis
from django_cogworker import affinity
from django_cogworker.conf import get_config
from django_cogworker.launcher import Launcher
from gcapp.jobs import noop

count, freeze = int(sys.argv[1]), sys.argv[2] == "1"
noop.delay_many([((), {})] * count)
gc.collect()
affinity.apply(get_config().cpu_affinity)
launcher = Launcher(get_config())
if freeze:
    gc.freeze()
began = time.perf_counter()
gc.collect()
print(f"a full collection of the started process: {(time.perf_counter() - began) * 1000:.2f} ms"
      f" ({len(gc.get_objects())} objects tracked{', the rest frozen' if freeze else ''})")
pauses = collections.defaultdict(list)
started = {}

def timed(phase, info):
    if phase == "start":
        started["at"] = time.perf_counter()
    else:
        pauses[info["generation"]].append((time.perf_counter() - started["at"]) * 1000)

gc.callbacks.append(timed)
thread = threading.Thread(target=launcher.run, daemon=True)
thread.start()
client = redis.Redis.from_url(get_config().redis_url)
deadline = time.monotonic() + 300
while client.llen("cogworker:queue:default") and time.monotonic() < deadline:
    time.sleep(0.1)
time.sleep(0.5)
gc.callbacks.remove(timed)
launcher.signals.put("stop")
thread.join(30)
left = client.llen("cogworker:queue:default")
print(f"{count} jobs run{f', {left} left' if left else ''}; collections meanwhile:")
for generation in range(3):
    found = pauses.get(generation, [])
    longest = f", the longest {max(found):.2f} ms, {sum(found):.1f} ms in all" if found else ""
    print(f"  generation {generation}: {len(found)}{longest}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--freeze", action="store_true", help="gc.freeze() before the worker starts")
    parser.add_argument("--redis-server", help="the redis-server binary (default: an installed one)")
    benchenv.add_smoke(parser)
    args = parser.parse_args()
    if benchenv.smoke(args):
        args.jobs = 200
    jobs_py = benchenv.NOOP_JOBS_PY
    with benchenv.project("gc_pauses", args.redis_server, "gcapp", jobs_py, str(ROOT)) as project:
        command = [project.python, "-c", WORKER, str(args.jobs), "1" if args.freeze else "0"]
        subprocess.run(command, env=project.env, cwd=project.tmp, check=True)


if __name__ == "__main__":
    main()
