#!/usr/bin/env python
"""Throughput of the sharded layout (SPEC section 16) with 1, 2 and 3 masters.

A Redis Cluster of three masters (no replicas, persistence off) on
127.0.0.1; six queues whose group tags land on the first M masters (as
evenly as six allows); one worker per queue (``manage.py cogworker
--skip-checks -q <queue>``: a worker process serves one group; the checks
are skipped for a faster start), ``CONCURRENCY`` 10 as the harness's
cogworker row. The workers start first and register; then every no-op job
is enqueued (``delay_many``, in chunks) and the clock runs until each queue
and each in-progress list is empty. The worker count, the jobs and the code
are the same for each M; only where the six groups live changes. Printed
per M: jobs/s, and per master its share of the commands (``INFO
commandstats``: the jobs' data, the beats, the polls) and the CPU it used
(``INFO cpu``), beside the CPU the workers used, to show where the ceiling
of this machine is.

    python3 tools/bench_shards.py
    python3 tools/bench_shards.py --jobs 30000 --masters 1,3

``--smoke`` runs M = 1, one queue and its worker, on a few jobs: a check
that the tool runs, not a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import localredis

ROOT = Path(__file__).resolve().parent.parent
QUEUES = 6
CHUNK = 1000

#: Commands a master serves for the cluster's own upkeep or for this tool's
#: looks, not for the jobs: left out of the shares.
UPKEEP = {"cluster", "info", "ping", "hello", "client", "command", "config", "scan", "llen"}


def call(port: int, *args: str) -> str:
    import redis

    with redis.Redis(host="127.0.0.1", port=port, decode_responses=True) as node:
        reply = node.execute_command(*args)
    return reply if isinstance(reply, str) else json.dumps(reply)


def wait_answering(port: int) -> None:
    import redis

    deadline = time.monotonic() + localredis.START_TIMEOUT_S
    while True:
        try:
            with redis.Redis(host="127.0.0.1", port=port) as node:
                node.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def cluster_ports(count: int) -> list[int]:
    """Free ports whose cluster bus port (+10000) is free and valid too."""
    import random
    import socket

    found: list[int] = []
    while len(found) < count:
        port = random.randrange(20000, 50000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        if port not in found:
            found.append(port)
    return found


@contextmanager
def cluster(count: int) -> Iterator[list[int]]:
    """``count`` masters sharing the 16384 slots evenly, each told of the others."""
    root = Path(tempfile.mkdtemp(prefix="cogworker-shards-"))
    ports = cluster_ports(count)
    procs = []
    try:
        for port in ports:
            conf = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            conf += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"nodes-{port}.conf",
                "--dir",
                str(root),
            ]
            binary = localredis.server_binary()
            procs.append(subprocess.Popen([binary, *conf], stdout=subprocess.DEVNULL))
        for port in ports:
            wait_answering(port)
        step = 16384 // count
        for i, port in enumerate(ports):
            high = 16383 if i == count - 1 else (i + 1) * step - 1
            call(port, "CLUSTER", "ADDSLOTS", *map(str, range(i * step, high + 1)))
        for port in ports[1:]:
            call(port, "CLUSTER", "MEET", "127.0.0.1", str(ports[0]))
        deadline = time.monotonic() + 20
        while not all("cluster_state:ok" in call(p, "CLUSTER", "INFO") for p in ports):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not come up")
            time.sleep(0.1)
        yield ports
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def owner(ports: list[int], key: str) -> int:
    slot = int(call(ports[0], "CLUSTER", "KEYSLOT", key))
    return ports[min(slot // (16384 // len(ports)), len(ports) - 1)]


def place(ports: list[int], namespace: str, masters: int, count: int = QUEUES) -> list[str]:
    """``count`` queue names whose tags land on the first ``masters`` masters, in turn."""
    wanted = [ports[i % masters] for i in range(count)]
    names, i = [], 0
    for port in wanted:
        while owner(ports, f"{{{namespace}:q{i}}}") != port:
            i += 1
        names.append(f"q{i}")
        i += 1
    return names


def stats(port: int) -> tuple[dict[str, int], float]:
    import redis

    with redis.Redis(host="127.0.0.1", port=port) as node:
        info = node.info("all")
    commands = {k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items() if k.startswith("cmdstat_")}
    return commands, float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(ports: list[int], masters: int, jobs: int, python: str, count: int = QUEUES) -> dict[str, object]:
    from django_cogworker import conf, connection
    from django_cogworker.connection import get_keys, get_redis
    from testproject.testapp.jobs import noop

    namespace = f"bench{uuid.uuid4().hex[:8]}"
    queues = place(ports, namespace, masters, count)
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
    settings = {"NAMESPACE": namespace, "SHARDING": "queues", "CONCURRENCY": 10, "QUEUES": queues}
    os.environ["COGWORKER_OVERRIDES"] = json.dumps(settings)
    os.environ["COGWORKER_REDIS_URL"] = url
    from django.conf import settings as django_settings

    django_settings.COGWORKER = {**django_settings.COGWORKER, **settings, "REDIS_URL": url}
    conf.get_config.cache_clear()
    connection.reset()
    env = {**os.environ, "COGWORKER_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen(
            [python, str(ROOT / "testproject" / "manage.py"), "cogworker", "--skip-checks", "-q", q],
            env={**env, "COGWORKER_OVERRIDES": json.dumps({**settings, "QUEUES": [q]})},
            cwd=ROOT,
        )
        for q in queues
    ]
    client, k = get_redis(), get_keys()
    try:
        deadline = time.monotonic() + 60
        while client.scard(k.processes) < len(queues):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not register")
            time.sleep(0.1)
        before = {p: stats(p) for p in ports}
        cpu_before = sum(process_cpu(w.pid) for w in workers)
        started = time.monotonic()
        per_queue = jobs // len(queues)
        for q in queues:
            job = noop.set(queue=q)
            for start in range(0, per_queue, CHUNK):
                job.delay_many([((), {})] * min(CHUNK, per_queue - start))
        while any(client.llen(k.queue(q)) for q in queues) or any(
            client.llen(key) for q in queues for key in client.scan_iter(match=k.for_queue(q).inprogress("*"))
        ):
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        after = {p: stats(p) for p in ports}
        worker_cpu = sum(process_cpu(w.pid) for w in workers) - cpu_before
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(30)
    calls = {
        p: sum(n - before[p][0].get(c, 0) for c, n in after[p][0].items() if c not in UPKEEP) for p in ports
    }
    total = sum(calls.values()) or 1
    return {
        "masters": masters,
        "jobs": per_queue * len(queues),
        "seconds": round(elapsed, 2),
        "jobs_per_s": round(per_queue * len(queues) / elapsed),
        "share": [round(calls[p] / total, 3) for p in ports],
        "redis_cpu_s": [round(after[p][1] - before[p][1], 2) for p in ports],
        "workers_cpu_s": round(worker_cpu, 2),
        "queues_per_master": [sum(owner(ports, f"{{{namespace}:{q}}}") == p for q in queues) for p in ports],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30_000, help="no-op jobs per run, over the six queues")
    parser.add_argument("--masters", default="1,2,3", help="the values of M to run")
    parser.add_argument("--smoke", action="store_true", help="M = 1, a few jobs: a check that it runs")
    args = parser.parse_args()
    counts = [1] if args.smoke else [int(m) for m in args.masters.split(",")]
    jobs = 60 if args.smoke else args.jobs
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    rows = []
    with cluster(3) as ports:
        for m in counts:
            rows.append(run(ports, m, jobs, sys.executable, 1 if args.smoke else QUEUES))
            print(json.dumps(rows[-1]), flush=True)
    head = ["masters holding the 6 queues", "jobs/s", "share of commands per master", "Redis CPU s each"]
    print("\n| " + " | ".join([*head, "workers' CPU s"]) + " |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['masters']} ({r['queues_per_master']}) | {r['jobs_per_s']:,} | {r['share']} | "
            f"{r['redis_cpu_s']} | {r['workers_cpu_s']} |"
        )


if __name__ == "__main__":
    main()
