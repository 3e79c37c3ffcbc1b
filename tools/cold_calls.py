#!/usr/bin/env python
"""What a call costs when it runs cold: after a pause, as each job of the harness's latency run does.

The harness's latency run enqueues one job after a pause of 20 to 60 ms,
in which the enqueuing process and the worker sleep and their CPUs idle.
Code that takes a microsecond in a loop then takes tens of them: what it
touches has to come back into the caches and the TLB first. This times a
few calls, each the first thing done after such a pause (``--calls``
times), in one process on the harness's virtualenv and settings with this
checkout's code, against a redis-server of its own:

- nothing (a call of a function that does nothing), and building a small
  dict: what any Python pays for waking up;
- one ``LPUSH`` on a raw socket, its reply read: a round trip through
  Redis with no client library;
- ``.delay()`` of the harness's no-op job, reply included: what the
  harness's latency counts on the enqueuing side;
- the same ``.delay()`` right after the raw ``LPUSH``: woken already, its
  code still cold;
- the on-commit rule's question, whether the thread is in an atomic
  block: through Django's lookup of the thread's database connection
  (asgiref's ``Local``), and with the connection kept per thread as
  ``.delay()`` asks it (``django_cogworker/atomic.py``).
- ``.delay()``'s way, one layer more at each row, each reply included:
  the payload's fields written inline, encoded (``payload.encode``) and
  pushed on a raw socket, as the floor's enqueue pushes its own;
  ``Job.checked_payload`` instead of the inline fields; the push through
  ``direct.call`` on the fast path's connection instead of the raw socket;
  through ``client._push`` (keys, settings, the queue's registration);
  through ``client.enqueue`` (the client chain, the on-commit rule). Each
  row's difference to the one before is what that layer costs cold.

Medians and 90th percentiles, in microseconds. To compare two commits, run
it from a checkout of each, one after the other.

    python3 tools/cold_calls.py
    python3 tools/cold_calls.py --calls 500
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import benchenv

ROOT = Path(__file__).resolve().parent.parent

COLD = """
import random, socket, sys, time
import django
django.setup()
from django.db import transaction
from coldapp.jobs import noop
from django_cogworker import atomic

calls, port = int(sys.argv[1]), int(sys.argv[2])
for _ in range(200):
    noop.delay()  # warm: connections made, the queue registered
raw = socket.create_connection(("127.0.0.1", port))
raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
command = b"*3\\r\\n$5\\r\\nLPUSH\\r\\n$10\\r\\ncold:probe\\r\\n$200\\r\\n" + b"x" * 200 + b"\\r\\n"


def lpush():
    raw.sendall(command)
    raw.recv(64)


def nothing():
    pass


def small_dict():
    return {"jid": "x", "args": [], "kwargs": {}, "at": time.time()}


def djangos_lookup():
    return transaction.get_connection().in_atomic_block


from django_cogworker import client, direct
from django_cogworker.connection import get_keys, get_master
from django_cogworker.payload import encode, new_jid

queue_key = get_keys().queue(noop.queue)


def inline_payload():
    now = time.time()
    return {"jid": new_jid(), "job": noop.name, "args": [], "kwargs": {}, "queue": noop.queue,
            "retry": noop.retry, "created_at": now, "enqueued_at": now}


def raw_push(body):
    raw.sendall(b"*3\\r\\n$5\\r\\nLPUSH\\r\\n$10\\r\\ncold:probe\\r\\n$%d\\r\\n%b\\r\\n" % (len(body), body))
    raw.recv(64)


def direct_push():
    # ORDINARY would mean nothing was sent: the row would time less than a push.
    if direct.call(get_master(), "LPUSH", queue_key, encode(inline_payload())) is direct.ORDINARY:
        raise SystemExit("cold_calls: the fast path is off (FAST_PATH, or redis-py untested)")


layers = {
    "inline payload, encoded, raw socket": lambda: raw_push(encode(inline_payload())),
    "`Job.checked_payload`, raw socket": lambda: raw_push(encode(noop.checked_payload((), {}))),
    "inline payload, `direct.call`": direct_push,
    "inline payload, `client._push`": lambda: client._push([inline_payload()], None),
    "inline payload, `client.enqueue`": lambda: client.enqueue(inline_payload()),
}

ways = {
    "nothing": nothing,
    "a small dict": small_dict,
    "raw `LPUSH`": lpush,
    "`.delay()`": noop.delay,
    "the transaction check, Django's lookup": djangos_lookup,
    "the transaction check, the connection kept per thread": atomic.inside,
    **layers,
}
samples = {name: [] for name in [*ways, "`.delay()` right after the raw `LPUSH`"]}
for _ in range(calls):
    for name, way in ways.items():
        time.sleep(random.uniform(0.02, 0.06))
        began = time.perf_counter()
        way()
        samples[name].append(time.perf_counter() - began)
        if way is lpush:
            began = time.perf_counter()
            noop.delay()
            samples["`.delay()` right after the raw `LPUSH`"].append(time.perf_counter() - began)
print("| call, after a pause of 20 to 60 ms | p50 µs | p90 µs |")
print("|---|---|---|")
for name, found in samples.items():
    found.sort()
    p50, p90 = found[len(found) // 2], found[int(len(found) * 0.9)]
    print(f"| {name} | {p50 * 1e6:.1f} | {p90 * 1e6:.1f} |")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="samples of each call")
    parser.add_argument("--redis-server", help="the redis-server binary (default: an installed one)")
    benchenv.add_smoke(parser)
    args = parser.parse_args()
    if benchenv.smoke(args):
        args.calls = 5
    with benchenv.project(
        "cold_calls", args.redis_server, "coldapp", benchenv.NOOP_JOBS_PY, str(ROOT)
    ) as project:
        command = [project.python, "-c", COLD, str(args.calls), str(project.port)]
        # In its temporary directory: `python -c` puts the working directory
        # first on sys.path, and a checkout there would be imported instead.
        subprocess.run(command, env=project.env, cwd=project.tmp, check=True)


if __name__ == "__main__":
    main()
