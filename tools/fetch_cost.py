#!/usr/bin/env python
"""What ``fetch.lua`` costs Redis per job: its CPU, read from ``INFO cpu``.

Starts a redis-server of its own, fills a queue, puts ``--in-flight`` jobs
on an in-progress list, then calls the script ``--calls`` times as a busy
worker does: each call acknowledges ``want`` jobs of those it holds (the
oldest) and takes ``want`` more. Redis's CPU (user + system) over the calls,
divided by the jobs taken, is the script's cost per job, the client's
commands included (one call's worth). No worker and no Django: the same
calls give the same count of commands whatever the machine does, though
Redis's CPU still moves by a tenth from run to run.

The rows: 10 jobs a call with 10 in flight (``CONCURRENCY`` 10, the
harness's workload), 40 with 110 (``ASYNC_CONCURRENCY`` 100 beside it),
100 with 100. ``--against REV`` measures the ``fetch.lua`` of a commit
too, one after the other.

    .venv/bin/python tools/fetch_cost.py
    .venv/bin/python tools/fetch_cost.py --against HEAD~1 --repeat 3
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import benchenv
import localredis
import redis

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "django_cogworker/lua/fetch.lua"

#: (jobs a call, jobs in flight).
ROWS = ((10, 10), (40, 110), (100, 100))

#: A payload as ``.delay()`` writes one for a job with no arguments.
PAYLOAD = (
    '{"jid":"%024d","job":"app.jobs.noop","args":[],"kwargs":{},"queue":"default",'
    '"retry":true,"created_at":1796519544.123456,"enqueued_at":1796519544.123456}'
)


def source(rev: str | None) -> str:
    if rev is None:
        return (ROOT / SCRIPT).read_text()
    return subprocess.run(
        ["git", "show", f"{rev}:{SCRIPT}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def cost(binary: str, lua: str, want: int, in_flight: int, calls: int) -> float:
    """Redis's CPU per job taken, in µs."""
    with localredis.running(binary) as port:
        client = redis.Redis(port=port)
        sha = client.script_load(lua)
        total = calls * want + in_flight
        pipe = client.pipeline(transaction=False)
        for n in range(total):
            pipe.lpush("q", PAYLOAD % n)
            if n % 1000 == 999:
                pipe.execute()
        pipe.execute()
        held = list(client.evalsha(sha, 2, "q", "ip", 1, in_flight)[1:])

        def cpu() -> float:
            info = client.info("cpu")
            return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

        before = cpu()
        for _ in range(calls):
            acks, held = held[:want], held[want:]
            held += client.evalsha(sha, 2, "q", "ip", 1, want, *acks)[1:]
        spent = cpu() - before
        if client.llen("ip") != in_flight or client.exists("q"):
            raise SystemExit("fetch_cost: the script did not move the jobs as expected")
        client.close()
        return spent / (calls * want) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", metavar="REV", help="a commit whose fetch.lua is measured too")
    parser.add_argument("--redis-server", help="the redis-server binary (default: an installed one)")
    benchenv.add_smoke(parser)
    args = parser.parse_args()
    calls, repeat = (20, 1) if benchenv.smoke(args) else (args.calls, args.repeat)
    binary = localredis.server_binary(args.redis_server)
    scripts = {"this checkout": source(None)}
    if args.against:
        scripts[args.against] = source(args.against)
    print("| jobs a call, in flight | fetch.lua of | Redis CPU per job, µs (each run) |\n|---|---|---|")
    for want, in_flight in ROWS:
        for name, lua in scripts.items():
            runs = [cost(binary, lua, want, in_flight, calls) for _ in range(repeat)]
            shown = ", ".join(f"{r:.2f}" for r in runs)
            print(f"| {want}, {in_flight} | {name} | {shown} |", flush=True)


if __name__ == "__main__":
    main()
