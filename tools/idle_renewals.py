#!/usr/bin/env python
"""Which slow samples of an idle worker met the renewal of other threads' waits.

An idle thread blocks on ``BLMOVE`` for ``BLOCKING_TIMEOUT_S`` (1 s), then
sends it again. Redis ends a blocked client's wait lazily: at its next turn
of the event loop after the timeout, which on an idle server is either its
own tick (``hz``, 10 a second by default) or the next command that comes in,
such as the push of a job. The waits of threads that went idle together end
together, so the threads renew them in one burst, and when that burst is
let out by a push, they wake with the thread that got the job and take the
GIL and the CPUs it needs.

This runs the harness's latency measurement (one job at a time on an idle
worker, 20 to 60 ms apart) with timestamps: just before ``.delay()`` (in an
enqueuing process of its own, as the harness's driver is), the job's first
line, and each ``BLMOVE`` that came back empty (the worker's
``BlockingConnections.blmove``, wrapped). It prints, for each queue count,
the latency, how many samples were slower than ``--slow-ms``, and how many
of those, and of the others, saw a wait end between their ``.delay()`` and
their start. Strict order, jobs in the last queue, as the harness's
five-queue row. ``--hz`` sets the server's ``hz`` (``CONFIG SET``): at 100,
waits end within 10 ms of their timeout, seldom with a push.

Runs in the harness's virtualenv (made by its first run) against a
redis-server of its own; Django settings as the harness's. The code measured
is the checkout's (``--project``, default this one).

    python3 tools/idle_renewals.py
    python3 tools/idle_renewals.py --queues 1,5 --jobs 1000 --hz 100
"""

from __future__ import annotations

import argparse
import bisect
import json
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import benchenv

JOBS_PY = """
import time
from django_cogworker import job

STARTS = []

@job  # its queue is "default", the last of the worker's
def probe():
    STARTS.append(time.perf_counter())
"""

ENQUEUER = """
import json, random, sys, time
import django
django.setup()
from renewapp.jobs import probe
count, out = int(sys.argv[1]), sys.argv[2]
rng = random.Random(1234)
probe.delay()  # warm-up: connections, queue registration
time.sleep(0.5)
befores = []
for _ in range(count):
    time.sleep(rng.uniform(0.020, 0.060))
    befores.append(time.perf_counter())
    probe.delay()
time.sleep(0.5)
with open(out, "w") as fh:
    json.dump(befores, fh)
"""

WORKER = """
import json, subprocess, sys, threading, time
import django
django.setup()
from django_cogworker.conf import get_config
from django_cogworker.direct_blocking import BlockingConnections
from django_cogworker.launcher import Launcher
from renewapp import jobs

empty = []
original = BlockingConnections.blmove

def blmove(self, *args, **kwargs):
    raw = original(self, *args, **kwargs)
    if raw is None:
        empty.append(time.perf_counter())
    return raw

BlockingConnections.blmove = blmove
launcher = Launcher(get_config())
thread = threading.Thread(target=launcher.run, daemon=True)
thread.start()
count, enqueuer, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
time.sleep(2.0)  # the first beat, every thread blocked on BLMOVE
subprocess.run([sys.executable, "-c", enqueuer, str(count), out + ".client"], check=True)
launcher.signals.put("stop")
thread.join(30)
with open(out, "w") as fh:
    json.dump({"start": jobs.STARTS[-count:], "empty": empty}, fh)
"""


def set_hz(port: int, hz: int) -> None:
    """``CONFIG SET hz`` on the tool's server (no client library needed)."""
    parts = [b"CONFIG", b"SET", b"hz", str(hz).encode()]
    command = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(command)
        reply = conn.recv(64)
    if not reply.startswith(b"+OK"):
        sys.exit(f"idle_renewals: CONFIG SET hz {hz}: {reply!r}")


def measure(args: argparse.Namespace, queues: int) -> dict[str, float | int]:
    names = [*(f"q{i}" for i in range(1, queues)), "default"]
    config: dict[str, object] = {"QUEUES": names}
    with benchenv.project(
        "idle_renewals", args.redis_server, "renewapp", JOBS_PY, args.project, config
    ) as project:
        if args.hz:
            set_hz(project.port, args.hz)
        out = str(Path(project.tmp, "stamps.json"))
        command = [project.python, "-c", WORKER, str(args.jobs), ENQUEUER, out]
        subprocess.run(command, env=project.env, cwd=project.tmp, check=True)
        seen = json.loads(Path(out).read_text())
        befores = json.loads(Path(out + ".client").read_text())
    starts, empty = seen["start"], sorted(seen["empty"])
    if len(starts) != args.jobs or len(befores) != args.jobs:
        sys.exit(f"idle_renewals: {len(starts)} starts and {len(befores)} enqueues for {args.jobs} jobs")
    latencies = sorted((start - before) * 1000 for before, start in zip(befores, starts, strict=True))
    slow = slow_met = fast_met = 0
    for before, start in zip(befores, starts, strict=True):
        met = bisect.bisect_right(empty, start) > bisect.bisect_left(empty, before)
        if (start - before) * 1000 > args.slow_ms:
            slow += 1
            slow_met += met
        else:
            fast_met += met
    return {
        "queues": queues,
        "p50": statistics.median(latencies),
        "p99": latencies[int(len(latencies) * 0.99)],
        "renewals": len(empty),
        "slow": slow,
        "slow_met": slow_met,
        "fast_met": fast_met,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--queues", default="1,5", help="queue counts to run, in turn (default: %(default)s)")
    parser.add_argument("--slow-ms", type=float, default=1.2, help="a slow sample (default: %(default)s ms)")
    parser.add_argument("--hz", type=int, help="the server's hz (default: the server's own, 10)")
    benchenv.add_project_arguments(parser, str(Path(__file__).resolve().parent.parent))
    args = parser.parse_args()
    if benchenv.smoke(args):
        args.jobs = 10
    rows = [measure(args, int(count)) for count in args.queues.split(",")]
    print(
        f"| queues | p50 ms | p99 ms | waits ended empty | samples over {args.slow_ms:g} ms "
        f"| of those, with a wait ended during them | faster samples with one |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['queues']} | {row['p50']:.3f} | {row['p99']:.3f} | {row['renewals']} | {row['slow']} "
            f"| {row['slow_met']} | {row['fast_met']} |"
        )


if __name__ == "__main__":
    main()
