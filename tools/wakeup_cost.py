#!/usr/bin/env python
"""What waking a thread costs on this machine: on its own CPU, and on another.

A worker's threads hand the GIL and their jobs to one another, and each job
waits for Redis's reply on another CPU: how much a pinned worker gains over
one left to the OS (G21) is set by what a wake-up costs across CPUs here
against on one CPU. This measures that with nothing of django-cogworker,
nothing of Redis:

- **processes**: two processes hand a byte back and forth over two pipes
  (each ``read`` blocks until the other's ``write`` wakes it), as a job's
  round trip to Redis does;
- **threads**: two threads of one Python process hand a token back and
  forth through two locks (each ``acquire`` blocks, its GIL released,
  until the other thread's ``release``), as a job handed to a waiting
  processor thread does.

Each pair runs on one CPU, on two CPUs (one each), and where the OS puts
them; a round trip is two wake-ups. Printed: the wall time of a round trip
and the CPU time the measuring side spent on it, the median of the runs.
A machine that allows this process one CPU only measures the first row.

A wake-up across CPUs costs most where the woken CPU was idle and halted:
under a hypervisor, a halted virtual CPU is woken through the host. First
printed, then, is what an idle CPU does here (Linux's ``cpuidle`` driver
and, for a KVM guest's ``haltpoll``, ``guest_halt_poll_ns``: how long an
idle virtual CPU polls for work before it halts; 0 means it halts at once).

    python3 tools/wakeup_cost.py
    python3 tools/wakeup_cost.py --rounds 50000 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

#: (label, the measuring side's CPUs, the other side's), None: any CPU.
Placement = tuple[str, set[int] | None, set[int] | None]


def placements() -> list[Placement]:
    cpus = sorted(os.sched_getaffinity(0))
    rows: list[Placement] = [("one CPU", {cpus[0]}, {cpus[0]})]
    if len(cpus) > 1:
        rows.append(("two CPUs, one each", {cpus[0]}, {cpus[1]}))
        rows.append(("left to the OS", None, None))
    return rows


def _place(cpus: set[int] | None, everywhere: set[int]) -> None:
    """Sets the calling thread's CPUs (a thread's own, on Linux)."""
    os.sched_setaffinity(0, everywhere if cpus is None else cpus)


def _timed(rounds: int, round_trip: Callable[[], None]) -> tuple[float, float]:
    """Wall and CPU seconds of one of ``rounds`` round trips, after a first
    one that places both sides (the other side makes ``rounds + 1``)."""
    round_trip()
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(rounds):
        round_trip()
    return (time.perf_counter() - wall) / rounds, (time.thread_time() - cpu) / rounds


def processes(rounds: int, mine: set[int] | None, theirs: set[int] | None) -> tuple[float, float]:
    """Wall and CPU seconds of one round trip between two processes over pipes."""
    everywhere = os.sched_getaffinity(0)
    to_child, from_parent = os.pipe()
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            _place(theirs, everywhere)
            for _ in range(rounds + 1):
                os.read(to_child, 1)
                os.write(to_parent, b"x")
        finally:
            os._exit(0)

    def round_trip() -> None:
        os.write(from_parent, b"x")
        os.read(from_child, 1)

    try:
        _place(mine, everywhere)
        return _timed(rounds, round_trip)
    finally:
        os.waitpid(pid, 0)
        for fd in (to_child, from_parent, from_child, to_parent):
            os.close(fd)
        _place(None, everywhere)


def threads(rounds: int, mine: set[int] | None, theirs: set[int] | None) -> tuple[float, float]:
    """Wall and CPU seconds of one round trip between two threads through locks."""
    everywhere = os.sched_getaffinity(0)
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()

    def other() -> None:
        _place(theirs, everywhere)
        for _ in range(rounds + 1):
            ping.acquire()
            pong.release()

    def round_trip() -> None:
        ping.release()
        pong.acquire()

    thread = threading.Thread(target=other, name="wakeup-cost")
    thread.start()
    try:
        _place(mine, everywhere)
        return _timed(rounds, round_trip)
    finally:
        thread.join()
        _place(None, everywhere)


def idle_policy() -> str:
    """What an idle CPU of this machine does, as Linux's sysfs tells it."""
    try:
        driver = Path("/sys/devices/system/cpu/cpuidle/current_driver").read_text().strip()
    except OSError:
        return "unknown (no cpuidle driver in /sys)"
    if driver != "haltpoll":
        return f"cpuidle driver {driver}"
    try:
        poll_ns = int(Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns").read_text())
    except (OSError, ValueError):
        return "cpuidle driver haltpoll (a KVM guest), guest_halt_poll_ns unreadable"
    how = "halts at once" if poll_ns == 0 else f"polls for up to {poll_ns / 1000:g} µs, then halts"
    return f"cpuidle driver haltpoll (a KVM guest): an idle virtual CPU {how} (guest_halt_poll_ns {poll_ns})"


def measure(
    how: Callable[[int, set[int] | None, set[int] | None], tuple[float, float]],
    rounds: int,
    repeat: int,
    placement: Placement,
) -> tuple[float, float]:
    """Median wall and CPU µs of a round trip over ``repeat`` runs."""
    _, mine, theirs = placement
    runs = [how(rounds, mine, theirs) for _ in range(repeat)]
    return statistics.median(r[0] for r in runs) * 1e6, statistics.median(r[1] for r in runs) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20_000, help="round trips per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each pair, the median printed")
    parser.add_argument("--smoke", action="store_true", help="a few round trips: checks that the tool runs")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.repeat = 200, 1
    runs = f"{args.rounds:,} round trips, median of {args.repeat}"
    print(f"Idle CPUs: {idle_policy()}\n")
    print(f"| pair ({runs}) | placement | round trip µs | CPU µs |")
    print("|---|---|---|---|")
    for label, how in (("two processes, pipes", processes), ("two threads, locks", threads)):
        for placement in placements():
            wall, cpu = measure(how, args.rounds, args.repeat, placement)
            print(f"| {label} | {placement[0]} | {wall:.1f} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
