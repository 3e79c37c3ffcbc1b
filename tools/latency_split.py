#!/usr/bin/env python
"""Where the idle latency goes: from just before ``.delay()`` to the job's start, in stages.

The harness measures latency as the job's start minus the time just before
the enqueue call, on an idle worker, one job at a time with a pause of 20 to
60 ms between them. This does the same with timestamps in between, taken
with ``time.perf_counter()`` (one clock for every process of the machine):

- in the enqueuing process (a subprocess, as the harness's driver is): at
  the call to ``client.enqueue`` (after the job's payload was built and its
  arguments checked), at ``client._push``, at ``direct.call`` (the
  ``LPUSH`` goes on a connection of its own) and when the command is packed
  (``direct._pack``, just before its bytes are handed to the socket);
- in the worker (this process: a ``Launcher`` in a thread, with
  ``CPU_AFFINITY`` applied as ``manage.py cogworker`` applies it): when the
  reliable fetch returns the job (``ReliableFetch.fetch``, after the
  ``BLMOVE`` reply was read: on the thread's own connection,
  ``direct_blocking``, where the fast path is taken), when ``Processor.process`` and
  ``execution.execute`` are entered, and the job function's first line.

The wrappers cost a microsecond or two each, so the total is a little above
an unwrapped run's. Runs in the harness's virtualenv (made by its first run)
against a redis-server of its own; Django settings as the harness's. The
code measured is the checkout's (``--project``, default this one), ahead of
the one the harness's virtualenv installed.

    python3 tools/latency_split.py
    python3 tools/latency_split.py --jobs 500
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import benchenv

JOBS_PY = """
import time
from django_cogworker import job

STARTS = []

@job
def probe(before):
    STARTS.append(time.perf_counter())
"""

#: The stamps, in order along a job's way, shared by both sides.
STAMPS_PY = """
import time

STAMPS = {}

def stamp(name, cls, method):
    original = getattr(cls, method)
    STAMPS[name] = []

    def wrapper(*args, **kwargs):
        STAMPS[name].append(time.perf_counter())
        return original(*args, **kwargs)

    setattr(cls, method, wrapper)
"""

ENQUEUER = """
import json, os, random, sys, time
# Not the worker's CPU and policy, which a child inherits: the harness's
# driver is a process of its own, on any CPU.
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
os.sched_setaffinity(0, range(os.cpu_count()))
import django
django.setup()
import redis.connection
from django_cogworker import client, direct
from latapp.jobs import probe
from stamps import STAMPS, stamp

stamp("enqueue", client, "enqueue")
stamp("push", client, "_push")
stamp("call", direct, "call")
stamp("send", direct, "_pack")
count, out = int(sys.argv[1]), sys.argv[2]
rng = random.Random(1234)
probe.delay(time.perf_counter())  # warm-up: connections, queue registration
time.sleep(0.5)
befores = []
for _ in range(count):
    time.sleep(rng.uniform(0.020, 0.060))
    befores.append(time.perf_counter())
    probe.delay(befores[-1])
time.sleep(0.5)
with open(out, "w") as fh:
    json.dump({"before": befores, **{k: v[-count:] for k, v in STAMPS.items()}}, fh)
"""

WORKER = """
import json, sys, threading, time
import django
django.setup()
from django_cogworker import affinity, execution, processor
from django_cogworker.conf import get_config
from django_cogworker.fetch import ReliableFetch
from django_cogworker.launcher import Launcher
from latapp import jobs
from stamps import STAMPS, stamp

fetched = STAMPS["fetched"] = []
original = ReliableFetch.fetch

def fetch(self, *args, **kwargs):
    works = original(self, *args, **kwargs)
    if works:
        fetched.append(time.perf_counter())
    return works

ReliableFetch.fetch = fetch
stamp("process", processor.Processor, "process")
stamp("execute", processor.execution, "execute")
affinity.apply(get_config().cpu_affinity)
launcher = Launcher(get_config())
thread = threading.Thread(target=launcher.run, daemon=True)
thread.start()
count, enqueuer, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
time.sleep(2.0)  # the first beat, every thread blocked on BLMOVE
subprocess = __import__("subprocess")
subprocess.run([sys.executable, "-c", enqueuer, str(count), out + ".client"], check=True)
launcher.signals.put("stop")
thread.join(30)
with open(out, "w") as fh:
    json.dump({"start": jobs.STARTS[-count:], **{k: v[-count:] for k, v in STAMPS.items()}}, fh)
"""

#: (label, from stamp, to stamp)
STAGES = [
    ("building the payload, checking the arguments (`Job.delay`)", "before", "enqueue"),
    ("the client middleware, the transaction check (`client.enqueue`)", "enqueue", "push"),
    ("keys, settings, the registered-queue check (`client._push`)", "push", "call"),
    ("`direct.call` (a connection of its own) until the command is packed", "call", "send"),
    ("sending, Redis, waking the worker's thread blocked on `BLMOVE`, reading its reply", "send", "fetched"),
    ("the ledger, the processor's checks (G18, G3), decoding the payload", "fetched", "process"),
    ("the ledger's record of the start", "process", "execute"),
    ("`close_old_connections()`, the job's context, the server middleware", "execute", "start"),
    ("**from just before `.delay()` to the job's start** (the harness's latency)", "before", "start"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    benchenv.add_project_arguments(parser, str(Path(__file__).resolve().parent.parent))
    args = parser.parse_args()
    if benchenv.smoke(args):
        args.jobs = 10
    with benchenv.project("latency_split", args.redis_server, "latapp", JOBS_PY, args.project) as project:
        tmp = project.tmp
        Path(tmp, "stamps.py").write_text(STAMPS_PY)
        out = str(Path(tmp, "stamps.json"))
        command = [project.python, "-c", WORKER, str(args.jobs), ENQUEUER, out]
        subprocess.run(command, env=project.env, cwd=project.tmp, check=True)
        stamps = {**json.loads(Path(out).read_text()), **json.loads(Path(out + ".client").read_text())}
    counts = {len(v) for v in stamps.values()}
    if counts != {args.jobs}:
        sys.exit(f"latency_split: stamps missing ({ {k: len(v) for k, v in stamps.items()} })")
    print(f"| stage ({args.jobs} jobs, one at a time) | p50 ms | p90 ms |")
    print("|---|---|---|")
    for label, first, last in STAGES:
        spans = sorted((b - a) * 1000 for a, b in zip(stamps[first], stamps[last], strict=True))
        print(f"| {label} | {statistics.median(spans):.3f} | {spans[int(len(spans) * 0.9)]:.3f} |")


if __name__ == "__main__":
    main()
