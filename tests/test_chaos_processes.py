"""Chaos under ``--processes`` (G20 with G1): a supervisor of three children
works through a few thousand short jobs, enqueued in batches, while

- at a random moment of every second a random CHILD is SIGKILLed (the
  supervisor replaces it), or
- every few seconds the SUPERVISOR itself is SIGKILLed and a new one started
  at once, as a process manager would (the old children must stop by
  themselves, beside the new ones, and quickly).

A thread counts the live children of every supervisor every 20 ms, so that
a supervisor with too many children, or children that outlive their
supervisor, are seen. At the end every job has run at least once, nothing
is left anywhere, and the jobs run twice are no more than the killed
processes can have held (kills x CONCURRENCY). Waits fail only when no job
has finished for ``STALL_S``, never on a fixed total. Run with ``-s`` to see
the figures.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections import Counter

from testproject.testapp import jobs
from tests.conftest import FAST, CogEnv, Worker, wait_for
from tests.test_guarantees import assert_each_in_one_place, keys, leftovers
from tests.test_supervisor import (
    ORPHANED_STOP_S,
    STOP_MARGIN_S,
    alive,
    children_of,
    registered,
    wait_all_dead,
    wait_for_children,
)

WORKERS = 3  # children of each supervisor
CONCURRENCY = 4
TICKS = 12
TICK_S = 1.0
BATCH = 200  # jobs per tick: more than the children get through, so they are busy when killed
JOB_S = 0.05
#: Fail when no job has finished for this long (not on a fixed total).
STALL_S = 20.0
#: Above any count a job can reach here (each kill orphans a job at most
#: once): a job in dead would be a bug, not the poison-pill rule (G3).
MAX_ORPHANINGS = TICKS + 1
RECOVERED = re.compile(r"requeued (\d+) job\(s\) left in progress by dead process")


class Census:
    """Every 20 ms: the live children of each supervisor started so far,
    also after that supervisor died (its children are then re-parented)."""

    def __init__(self) -> None:
        self.supervisors: list[int] = []
        self.seen: dict[int, set[int]] = {}
        #: Supervisor pid -> monotonic time at which one of its children was last seen alive.
        self.last_alive: dict[int, float] = {}
        self.max_per_supervisor = 0
        self.max_total = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, name="test-census", daemon=True)

    def add(self, supervisor: Worker) -> None:
        self.seen[supervisor.pid] = set()
        self.supervisors.append(supervisor.pid)

    def run(self) -> None:
        while not self.done.is_set():
            total = 0
            for pid in list(self.supervisors):
                # Replaced, never changed in place: the test reads these sets meanwhile.
                self.seen[pid] = self.seen[pid] | children_of(pid)
                live = sum(1 for child in self.seen[pid] if alive(child))
                if live:
                    self.last_alive[pid] = time.monotonic()
                self.max_per_supervisor = max(self.max_per_supervisor, live)
                total += live
            self.max_total = max(self.max_total, total)
            self.done.wait(0.02)

    def __enter__(self) -> Census:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.done.set()
        self.thread.join(5)


def wait_for_progress(cog: CogEnv, jids: list[str], what: str) -> None:
    """Until every job ran and nothing is left; fails only after ``STALL_S``
    without a new finished run."""
    wanted = set(jids)
    last_count, last_progress = -1, time.monotonic()
    while True:
        notes = cog.notes()
        if {n["jid"] for n in notes} >= wanted and leftovers(cog) == {}:
            return
        if len(notes) != last_count:
            last_count, last_progress = len(notes), time.monotonic()
        elif time.monotonic() - last_progress > STALL_S:
            ran = {n["jid"] for n in notes}
            never = [jid for jid in jids if jid not in ran]
            raise AssertionError(
                f"no job finished for {STALL_S}s waiting for {what}; left: {leftovers(cog)}; "
                f"{len(never)} never ran: {never[:10]}"
            )
        time.sleep(0.1)


def wait_orphans_gone(census: Census, supervisor: int, orphans: set[int], killed_at: float) -> float:
    """Waits until the children of a SIGKILLed supervisor have all stopped by
    themselves; returns how long after the kill the last one was seen alive."""
    wait_all_dead(orphans, max(0.0, killed_at + ORPHANED_STOP_S - time.monotonic()), "orphaned children")
    return census.last_alive.get(supervisor, killed_at) - killed_at


def figures(cog: CogEnv, jids: list[str]) -> tuple[int, list[str], int]:
    ran = Counter(n["jid"] for n in cog.notes())
    wanted = set(jids)
    lost = [jid for jid in jids if not ran[jid]]
    second_runs = sum(count - 1 for jid, count in ran.items() if jid in wanted)
    return sum(ran.values()), lost, second_runs


def stop_cleanly(cog: CogEnv, supervisor: Worker, census: Census) -> None:
    # The killed children are forgotten once no late fetch of theirs can
    # fill their lists (a few seconds after their last beat).
    wait_for(
        lambda: (
            {m.decode() for m in cog.redis.smembers(keys().inprogress_identities)} <= set(registered(cog))
        ),
        15,
        "the killed children's registrations to be forgotten",
    )
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(float(FAST["SHUTDOWN_TIMEOUT"]) + STOP_MARGIN_S) == 0
    wait_all_dead(census.seen[supervisor.pid], 2, "the last children to be gone")
    assert registered(cog) == {}
    assert leftovers(cog) == {}
    assert not cog.redis.smembers(keys().inprogress_identities)


def test_chaos_sigkill_a_random_child_every_second(cog):
    seed = int(os.environ.get("COGWORKER_CHAOS_SEED", random.randrange(1_000_000)))
    rng = random.Random(seed)
    cog.configure(CONCURRENCY=CONCURRENCY, MAX_ORPHANINGS=MAX_ORPHANINGS)
    began = time.monotonic()
    with Census() as census:
        supervisor = cog.start_worker("--processes", str(WORKERS))
        census.add(supervisor)
        wait_for_children(cog, supervisor, WORKERS)

        jids: list[str] = []
        kills = held_at_kills = samples = 0
        for tick in range(TICKS):
            tick_ends = time.monotonic() + TICK_S
            kill_at = time.monotonic() + rng.uniform(0.2, 0.9) * TICK_S
            jids += jobs.pace.delay_many([((JOB_S, f"{tick}-{i}"), {}) for i in range(BATCH)])
            if tick % 4 == 1:
                assert_each_in_one_place(cog, jids)
                samples += 1
            time.sleep(max(0.0, kill_at - time.monotonic()))
            # A child that has beaten (a replacement still booting holds nothing).
            working = {i: p for i, p in registered(cog).items() if p in children_of(supervisor.pid)}
            if working:
                identity, victim = rng.choice(sorted(working.items()))
                held_at_kills += int(cog.redis.llen(keys().inprogress(identity)))
                os.kill(victim, signal.SIGKILL)
                kills += 1
            time.sleep(max(0.0, tick_ends - time.monotonic()))
        last_kill = time.monotonic()

        wait_for_progress(cog, jids, "every job to run after the last kill")
        recovered_s = time.monotonic() - last_kill
        # The killed children are forgotten: only the live ones stay registered.
        wait_for(
            lambda: (
                set(registered(cog).values()) == children_of(supervisor.pid)
                and len(children_of(supervisor.pid)) == WORKERS
            ),
            15,
            "the killed children to be forgotten and replaced",
        )
        assert_each_in_one_place(cog, jids)
        samples += 1
        runs, lost, second_runs = figures(cog, jids)
        recovered = sum(int(n) for n in RECOVERED.findall(supervisor.log()))
        stop_cleanly(cog, supervisor, census)
    print(
        f"\nchaos --processes, children SIGKILLed (seed {seed}): {len(jids)} jobs, {runs} runs, "
        f"1 supervisor x {WORKERS} children x {CONCURRENCY} threads, {kills} kills (holding "
        f"{held_at_kills} jobs, {recovered} put back by recovery), {len(census.seen[supervisor.pid])} "
        f"children in all, at most {census.max_per_supervisor} at once, {len(lost)} lost, "
        f"{second_runs} second runs (bound {kills * CONCURRENCY}), recovered {recovered_s:.1f}s after "
        f"the last kill, {samples} invariant samples, {time.monotonic() - began:.1f}s in all"
    )
    assert not lost, f"{len(lost)} jobs never ran"
    assert second_runs <= kills * CONCURRENCY
    assert census.max_per_supervisor <= WORKERS
    assert kills >= TICKS // 2, f"only {kills} kills: the test proved little"
    assert recovered > 0, "no kill caught a child holding jobs: the test proved nothing"


def test_chaos_sigkill_the_supervisor_and_start_another(cog):
    seed = int(os.environ.get("COGWORKER_CHAOS_SEED", random.randrange(1_000_000)))
    rng = random.Random(seed)
    cog.configure(CONCURRENCY=CONCURRENCY, MAX_ORPHANINGS=MAX_ORPHANINGS)
    began = time.monotonic()
    with Census() as census:
        supervisor = cog.start_worker("--processes", str(WORKERS))
        census.add(supervisor)
        wait_for_children(cog, supervisor, WORKERS)

        jids: list[str] = []
        kills = samples = 0
        orphaned_stop_s: list[float] = []
        previous: tuple[int, set[int], float] | None = None  # the generation left behind at the last kill
        for tick in range(TICKS):
            tick_ends = time.monotonic() + TICK_S
            jids += jobs.pace.delay_many([((JOB_S, f"{tick}-{i}"), {}) for i in range(BATCH)])
            if tick % 4 == 1:
                assert_each_in_one_place(cog, jids)
                samples += 1
            if tick % 3 == 1:
                if previous is not None:
                    orphaned_stop_s.append(wait_orphans_gone(census, *previous))
                # Every child of this generation works (none is still booting) when it is orphaned.
                wait_for_children(cog, supervisor, WORKERS)
                time.sleep(rng.uniform(0.1, 0.8) * TICK_S)
                orphans = census.seen[supervisor.pid] | children_of(supervisor.pid)
                supervisor.signal(signal.SIGKILL)
                supervisor.wait(5)
                kills += 1
                previous = (supervisor.pid, orphans, time.monotonic())
                supervisor = cog.start_worker("--processes", str(WORKERS))
                census.add(supervisor)
            time.sleep(max(0.0, tick_ends - time.monotonic()))
        assert previous is not None
        orphaned_stop_s.append(wait_orphans_gone(census, *previous))
        wait_for_progress(cog, jids, "every job to run after the last kill")
        # Only the last supervisor's children are left, and registered.
        wait_for(
            lambda: (
                set(registered(cog).values()) == children_of(supervisor.pid)
                and len(children_of(supervisor.pid)) == WORKERS
            ),
            15,
            "only the last supervisor's children to be registered",
        )
        assert_each_in_one_place(cog, jids)
        samples += 1
        runs, lost, second_runs = figures(cog, jids)
        log = "".join(cog.workers[i].log() for i in range(len(cog.workers)))
        noticed = log.count("is gone; stopping")
        stop_cleanly(cog, supervisor, census)
    print(
        f"\nchaos --processes, supervisor SIGKILLed (seed {seed}): {len(jids)} jobs, {runs} runs, "
        f"{kills} supervisor kills, {kills + 1} supervisors x {WORKERS} children x {CONCURRENCY} threads, "
        f"{noticed} children noticed their supervisor was gone, orphaned children stopped within "
        f"{max(orphaned_stop_s):.1f}s (bound {ORPHANED_STOP_S:.0f}s), at most {census.max_per_supervisor} "
        f"children per supervisor and {census.max_total} in all at once, {len(lost)} lost, "
        f"{second_runs} second runs (bound {kills * CONCURRENCY}), {samples} invariant samples, "
        f"{time.monotonic() - began:.1f}s in all"
    )
    assert not lost, f"{len(lost)} jobs never ran"
    assert second_runs <= kills * CONCURRENCY
    assert census.max_per_supervisor <= WORKERS
    # The new children run beside the old only while the old are stopping.
    assert census.max_total <= 2 * WORKERS
    assert max(orphaned_stop_s) <= ORPHANED_STOP_S
    assert noticed == kills * WORKERS, f"{noticed} children noticed, {kills * WORKERS} were orphaned"
