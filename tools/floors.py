#!/usr/bin/env python
"""What no job system can go below on this machine: the harness's latency and a Django worker's RSS.

Both run without django-cogworker, with the harness's interpreter (its
virtualenv, made by its first run) against a redis-server of their own.

- **Latency**: the harness's measure (the job's start minus the time just
  before the enqueue, one job at a time after a pause of 20 to 60 ms) with
  nothing but raw sockets: the enqueuing process sends one ``LPUSH`` and
  ``BLPOP``s the record; the worker, another process pinned to one CPU as
  ``manage.py cogworker`` pins itself, waits on ``BLMOVE``, takes
  ``time.time()`` and ``RPUSH``es it. No payload, no Django, no parsing.
  The enqueuing process runs on any CPU, as the harness's driver does, and
  then on the worker's, which the harness does not arrange.
- **RSS**: a process with the harness's Django settings (the admin, auth,
  contenttypes, sessions and messages apps), read from ``/proc/self/status``
  step by step: ``django.setup()``, Django's system checks (which
  ``manage.py`` commands run first), ``CONCURRENCY`` threads and two more
  (a heartbeat, a poller) blocked on ``BLMOVE`` over raw sockets, and then
  ``import redis`` (redis-py, hiredis), which a worker built on it adds.

    python3 tools/floors.py
    python3 tools/floors.py --jobs 500 --threads 10
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import benchenv
import localredis

#: Both sides of the latency floor, run with ``ROLE`` and ``PORT`` set.
LATENCY = r"""
import os, random, socket, subprocess, sys, time

def command(*words):
    out = b"*%d\r\n" % len(words)
    for word in words:
        word = word.encode()
        out += b"$%d\r\n%s\r\n" % (len(word), word)
    return out

def connect():
    sock = socket.create_connection(("127.0.0.1", int(os.environ["PORT"])))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock

if os.environ["ROLE"] == "worker":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    sock = connect()
    sock.sendall(command("SET", "floor:ready", "1"))
    sock.recv(64)
    while True:
        sock.sendall(command("BLMOVE", "floor:queue", "floor:held", "RIGHT", "LEFT", "5"))
        if sock.recv(65536).startswith((b"$-1", b"*-1", b"_")):
            continue
        started = time.time()
        sock.sendall(command("RPUSH", "floor:done", repr(started)))
        sock.recv(64)

jobs = int(sys.argv[1])
if os.environ["SAME_CPU"] == "1":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
worker = subprocess.Popen([sys.executable, "-c", sys.argv[2]], env={**os.environ, "ROLE": "worker"})
sock = connect()
deadline = time.monotonic() + 30
while True:
    sock.sendall(command("GET", "floor:ready"))
    if sock.recv(64).startswith(b"$1") or time.monotonic() > deadline:
        break
    time.sleep(0.01)
latencies = []
for _ in range(jobs):
    time.sleep(random.uniform(0.02, 0.06))
    before = time.time()
    sock.sendall(command("LPUSH", "floor:queue", "x"))
    sock.recv(64)
    sock.sendall(command("BLPOP", "floor:done", "10"))
    reply = sock.recv(1024).split(b"\r\n")
    latencies.append((float(reply[-2]) - before) * 1000)
worker.kill()
latencies.sort()
def at(share):
    return latencies[min(len(latencies) - 1, int(share * len(latencies)))]
print(f"| {os.environ['LABEL']} | {at(0.5):.3f} | {at(0.9):.3f} | {at(0.99):.3f} |")
"""

#: The RSS floor, run with ``PORT`` and ``THREADS`` set.
MEMORY = r"""
import os, socket, threading, time

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

def row(step):
    print(f"| {step} | {rss():.1f} |")

row("`python -c`, nothing imported")
import django
from django.conf import settings
settings.configure(
    SECRET_KEY="floors",
    INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                    "django.contrib.sessions", "django.contrib.messages"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
)
django.setup()
row("`django.setup()` with the harness's five contrib apps")
from django.core import checks
checks.run_checks()
row("and Django's system checks")
blocked = threading.Semaphore(0)

def wait():
    sock = socket.create_connection(("127.0.0.1", int(os.environ["PORT"])))
    blocked.release()
    while True:
        sock.sendall(b"*6\r\n$6\r\nBLMOVE\r\n$10\r\nfloor:none\r\n$10\r\nfloor:held\r\n"
                     b"$5\r\nRIGHT\r\n$4\r\nLEFT\r\n$1\r\n5\r\n")
        sock.recv(65536)

threads = int(os.environ["THREADS"]) + 2
for _ in range(threads):
    threading.Thread(target=wait, daemon=True).start()
for _ in range(threads):
    blocked.acquire(timeout=10)
time.sleep(1)
row(f"and {threads} threads blocked on `BLMOVE`, raw sockets")
import redis
row(f"and `import redis` (redis-py {redis.__version__}, hiredis)")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--threads", type=int, default=10, help="a worker's CONCURRENCY (the harness's: 10)")
    parser.add_argument("--redis-server", help="the redis-server binary (default: an installed one)")
    benchenv.add_smoke(parser)
    args = parser.parse_args()
    if benchenv.smoke(args):
        args.jobs = 10
    python = benchenv.python()
    if not os.path.exists(python):
        sys.exit(f"floors: no {python}; run the harness once first (shared/bench/run.py)")
    with localredis.running(localredis.server_binary(args.redis_server)) as port:
        env = {"PATH": "/usr/bin:/bin", "PORT": str(port), "THREADS": str(args.threads)}
        print("| step | RSS MB |\n|---|---|", flush=True)
        subprocess.run([python, "-c", MEMORY], env=env, check=True)
        print(flush=True)
        print(f"| latency, raw sockets ({args.jobs} jobs) | p50 ms | p90 ms | p99 ms |\n|---|---|---|---|")
        driver = [python, "-c", LATENCY, str(args.jobs), LATENCY]
        for same, label in (("0", "the enqueuing process on any CPU"), ("1", "on the worker's CPU")):
            role = {"ROLE": "driver", "SAME_CPU": same, "LABEL": label}
            subprocess.run(driver, env={**env, **role}, check=True)


if __name__ == "__main__":
    main()
