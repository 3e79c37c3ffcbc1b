"""The CPU a worker process keeps its threads on, when ``CPU_AFFINITY``
asks for one (G21).

Duties: by default (``None``) touch nothing: the process, its threads and
whatever a job starts (subprocesses, thread pools, BLAS threads) keep the
CPUs, the scheduling policy and the niceness the OS gave them. Only when
the user sets it: choose, for each worker process, the one CPU its threads
run on (``"auto"``: the least busy of the CPUs the process may use, a
different one for each process of ``--processes``, on different cores
first; a list: the i-th listed for the i-th process); pin every thread of
the process to it; never stop a worker because it could not be pinned.

Why one may ask for it: a worker process runs Python on one core at a time
(the GIL), and its threads hand the GIL and their jobs to one another
several times a job. On one CPU a hand-off is a switch between threads;
across CPUs it is a wake-up of another CPU, which can cost more than the
job's own Python on virtual machines. What it costs, and why it is not the
default: everything a job runs gets that one CPU, C code that runs without
the GIL (numpy, BLAS, torch, Pillow, hashing, compression) and every
subprocess it starts (ffmpeg, a compiler) included.

A pinned process's threads also run under ``SCHED_BATCH``: on one CPU, a
thread woken by another (its job handed over, the GIL released) would
otherwise take the CPU from the waker at once, only to wait for the GIL the
waker still holds, and the two would switch back; under ``SCHED_BATCH`` the
woken thread runs when the waker blocks or its time slice ends. A thread
woken from an idle CPU (a job arriving at an idle worker) runs at once, as
before. Subprocesses a job starts inherit the policy, as they inherit the
CPU.

Linux only (``os.sched_setaffinity``); elsewhere nothing is pinned.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Sequence

logger = logging.getLogger("django_cogworker")

AUTO = "auto"

#: Set by the supervisor of ``--processes`` for each child: the CPU it
#: chose for it, or "" for none. A child does not choose again.
CPU_ENV = "COGWORKER_CPU"

#: How long the CPUs' load is sampled to find the least busy one.
SAMPLE_S = 0.1

#: CPUs this close (a share of their time) to the least busy one count as
#: just as idle: one of them is drawn at random, so that workers started
#: together on an idle machine do not all take the same CPU.
IDLE_MARGIN = 0.1

Setting = str | Sequence[int] | None
#: The CPU of each worker process of a supervisor, in order (None: not pinned).
Plan = list[int | None]


def usable() -> list[int]:
    """The CPUs this process may run on; [] where that cannot be known."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    return sorted(os.sched_getaffinity(0))


def plan(setting: Setting, count: int) -> Plan:
    """The CPU of each of ``count`` worker processes (None: not pinned)."""
    if setting is None or not hasattr(os, "sched_setaffinity"):
        return [None] * count
    if not isinstance(setting, str):
        listed = list(setting)
        return [listed[i % len(listed)] for i in range(count)]
    cpus = spread(usable())
    if len(cpus) < 2:
        return [None] * count  # one CPU already, or none known
    first = cpus.index(least_busy(cpus))
    return [cpus[(first + i) % len(cpus)] for i in range(count)]


def spread(cpus: list[int]) -> list[int]:
    """``cpus`` with the first hardware thread of every core first, then
    their second threads, and so on (from /sys where the topology is known),
    so that processes given consecutive CPUs share a core only when every
    core has one already."""
    seen: Counter[tuple[str, str]] = Counter()
    rank: dict[int, tuple[int, int]] = {}
    for cpu in cpus:
        core = (_topology(cpu, "physical_package_id"), _topology(cpu, "core_id"))
        rank[cpu] = (seen[core], cpu)
        seen[core] += 1
    return sorted(cpus, key=rank.__getitem__)


def _topology(cpu: int, name: str) -> str:
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/{name}") as fh:
            return fh.read().strip()
    except OSError:
        return f"cpu{cpu}"  # not known: a core of its own


def least_busy(cpus: list[int]) -> int:
    """The CPU of ``cpus`` that was least busy over the last SAMPLE_S, one
    of those about as idle drawn at random; any of them when /proc/stat
    cannot be read."""
    before = _cpu_times()
    time.sleep(SAMPLE_S)
    after = _cpu_times()
    busy: dict[int, float] = {}
    for cpu in cpus:
        if cpu in before and cpu in after:
            total = after[cpu][0] - before[cpu][0]
            idle = after[cpu][1] - before[cpu][1]
            busy[cpu] = (total - idle) / total if total > 0 else 0.0
    if not busy:
        return random.choice(cpus)
    lowest = min(busy.values())
    return random.choice([cpu for cpu, share in busy.items() if share <= lowest + IDLE_MARGIN])


def _cpu_times() -> dict[int, tuple[int, int]]:
    """CPU number -> (all ticks, idle and iowait ticks), from /proc/stat."""
    found: dict[int, tuple[int, int]] = {}
    try:
        with open("/proc/stat") as fh:
            lines = fh.readlines()
    except OSError:
        return found
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and len(fields) >= 5:
            ticks = [int(f) for f in fields]
            found[int(name[3:])] = (sum(ticks[:8]), ticks[3] + ticks[4])
    return found


def pin(cpu: int) -> None:
    """Keeps every thread of this process on ``cpu``, under ``SCHED_BATCH``
    (threads started later inherit both). Raises OSError when the CPU cannot
    be used."""
    os.sched_setaffinity(0, {cpu})
    _batch(0)
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return  # no /proc: the calling thread is pinned, and all it starts
    for tid in threads:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, {cpu})
            _batch(tid)


def _batch(tid: int) -> None:
    """Runs the thread under ``SCHED_BATCH`` (threads it starts inherit it):
    a thread it wakes (the hand-over of a job, of the GIL) waits for it to
    block or for its time slice to end, instead of taking the CPU at once
    only to wait there for the GIL the waker still holds. Where the policy
    cannot be set, the thread keeps its own: nothing else changes."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux; a sandbox refusing it
        os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))


def apply(setting: Setting) -> int | None:
    """Pins this worker process to its CPU: the one its supervisor chose
    for it, else its own choice. Returns the CPU, or None when the threads
    may run on any (by the setting, or because pinning failed: logged)."""
    given = os.environ.pop(CPU_ENV, None)  # popped: a subprocess a job starts chooses for itself
    cpu = plan(setting, 1)[0] if given is None else (int(given) if given.isdigit() else None)
    if cpu is None:
        return None
    try:
        pin(cpu)
    except OSError as exc:
        logger.warning("cogworker could not keep its threads on CPU %d (%s); they run on any CPU", cpu, exc)
        return None
    logger.info(
        "cogworker keeps its threads on CPU %d under SCHED_BATCH, as CPU_AFFINITY asks: jobs and what they "
        "start share that one CPU (None, the default, leaves the CPUs to the OS)",
        cpu,
    )
    return cpu
