#!/usr/bin/env python
"""What an idle worker asks of Redis: the commands it sends in a window, by name.

Starts ``python -m django cogworker`` with the harness's settings (its
virtualenv, made by its first run, and this checkout's code ahead of the
one installed there) against a redis-server of its own, waits for it to
settle, then counts what ``redis-cli monitor`` shows for ``--seconds`` and
the CPU time the worker used meanwhile.

    python3 tools/idle_commands.py
    python3 tools/idle_commands.py --concurrency 50 --seconds 30
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import benchenv

ROOT = Path(__file__).resolve().parent.parent


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=4.0, help="seconds after the start before counting")
    parser.add_argument("--redis-server", help="the redis-server binary (default: an installed one)")
    benchenv.add_smoke(parser)
    args = parser.parse_args()
    if benchenv.smoke(args):
        args.settle, args.seconds = 1.0, 1.0
    cli = shutil.which("redis-cli")
    if cli is None:
        sys.exit("idle_commands: needs redis-cli (apt-get install redis-server)")
    cogworker = {"CONCURRENCY": args.concurrency}
    with benchenv.project("idle_commands", args.redis_server, "idleapp", "", str(ROOT), cogworker) as project:
        port, tmp = project.port, project.tmp
        worker = subprocess.Popen([project.python, "-m", "django", "cogworker"], env=project.env, cwd=tmp)
        try:
            time.sleep(args.settle)
            out = Path(tmp, "monitor.txt")
            with out.open("w") as fh:
                monitor = subprocess.Popen([cli, "-p", str(port), "monitor"], stdout=fh)
                began = cpu_s(worker.pid)
                time.sleep(args.seconds)
                used = cpu_s(worker.pid) - began
                monitor.terminate()
                monitor.wait(10)
        finally:
            worker.terminate()
            worker.wait(30)
        lines = [line.split() for line in out.read_text().splitlines()[1:]]  # the first is "OK"
    names = collections.Counter(line[3].strip('"').upper() for line in lines if len(line) > 3)
    print(f"{sum(names.values())} commands in {args.seconds:g} s, worker CPU {used * 1000:.0f} ms")
    for name, count in names.most_common():
        print(f"{count:6d} {name}")


if __name__ == "__main__":
    main()
