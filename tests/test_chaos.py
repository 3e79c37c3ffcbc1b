"""Chaos: real worker processes SIGKILLed at random while jobs stream in.

Three ``manage.py cogworker`` processes work through a few thousand short
jobs, enqueued in batches while, every second, one worker chosen at random
is SIGKILLed and a replacement started (as a supervisor would). Intervals
are the FAST ones of conftest, so a dead worker's jobs come back within
about three seconds.

At the end every job has run at least once, nothing is left anywhere
(queues, in-progress lists, retry, dead, unsettled, repeat_orphans), and the
jobs run twice are no more than the jobs the killed workers can have held
(kills x concurrency). Run with ``-s`` to see the figures.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from collections import Counter

from testproject.testapp import jobs
from tests.conftest import CogEnv, Worker, wait_for
from tests.test_guarantees import assert_each_in_one_place, keys, leftovers

WORKERS = 3
CONCURRENCY = 4
TICKS = 14  # one kill per tick, at a random moment of it
TICK_S = 1.0
BATCH = 200  # jobs enqueued per tick: more than the workers get through, so they are busy when killed
JOB_S = 0.05  # how long each job takes


def identity_of(cog: CogEnv, worker: Worker) -> str | None:
    """The worker's identity if it has beaten yet (no waiting)."""
    k = keys()
    for ident in cog.redis.smembers(k.processes):
        pid = cog.redis.hget(k.process(ident.decode()), "pid")
        if pid is not None and int(pid) == worker.pid:
            return str(ident.decode())
    return None


def test_chaos_sigkill_a_random_worker_every_second(cog):
    seed = int(os.environ.get("COGWORKER_CHAOS_SEED", random.randrange(1_000_000)))
    rng = random.Random(seed)
    cog.configure(CONCURRENCY=CONCURRENCY)
    began = time.monotonic()
    workers = [cog.start_worker() for _ in range(WORKERS)]
    for worker in workers:
        worker.identity()

    jids: list[str] = []
    kills = 0
    held_at_kills = 0
    samples = 0
    for tick in range(TICKS):
        tick_ends = time.monotonic() + TICK_S
        kill_at = time.monotonic() + rng.uniform(0.2, 0.9) * TICK_S
        jids += jobs.pace.delay_many([((JOB_S, f"{tick}-{i}"), {}) for i in range(BATCH)])
        if tick % 4 == 1:
            assert_each_in_one_place(cog, jids)
            samples += 1
        time.sleep(max(0.0, kill_at - time.monotonic()))
        index = rng.randrange(WORKERS)
        victim = workers[index]
        identity = identity_of(cog, victim)
        if identity is not None:
            held_at_kills += int(cog.redis.llen(keys().inprogress(identity)))
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        kills += 1
        workers[index] = cog.start_worker()
        time.sleep(max(0.0, tick_ends - time.monotonic()))
    last_kill = time.monotonic()

    def finished() -> bool:
        return set(Counter(n["jid"] for n in cog.notes())) >= set(jids) and leftovers(cog) == {}

    try:
        wait_for(finished, 40, "every job to run and nothing to be left after the last kill")
    except AssertionError as exc:
        never_ran = [jid for jid in jids if jid not in {n["jid"] for n in cog.notes()}]
        raise AssertionError(f"{exc}; left: {leftovers(cog)}; never ran: {never_ran[:10]}") from None
    recovered_s = time.monotonic() - last_kill
    # Every killed worker is forgotten: only the survivors are registered.
    survivors = {worker.identity() for worker in workers}
    k = keys()
    wait_for(lambda: {i.decode() for i in cog.redis.smembers(k.processes)} == survivors, 10, "forgetting")
    assert {i.decode() for i in cog.redis.smembers(k.inprogress_identities)} == survivors
    assert {i.decode() for i in cog.redis.hkeys(k.last_beat)} == survivors
    assert_each_in_one_place(cog, jids)
    samples += 1

    ran = Counter(n["jid"] for n in cog.notes())
    lost = [jid for jid in jids if not ran[jid]]
    second_runs = sum(count - 1 for jid, count in ran.items() if jid in set(jids))
    recovered = sum(
        int(n)
        for worker in cog.workers
        for n in re.findall(r"requeued (\d+) job\(s\) left in progress by dead process", worker.log())
    )
    print(
        f"\nchaos (seed {seed}): {len(jids)} jobs, {WORKERS} workers x {CONCURRENCY} threads, "
        f"{kills} SIGKILLs (holding {held_at_kills} jobs when killed, {recovered} put back by "
        f"recovery), {len(lost)} lost, "
        f"{second_runs} second runs (bound {kills * CONCURRENCY}), "
        f"recovered {recovered_s:.1f}s after the last kill, {samples} invariant samples, "
        f"{time.monotonic() - began:.1f}s in all"
    )
    assert not lost, f"{len(lost)} jobs never ran"
    assert leftovers(cog) == {}
    assert second_runs <= kills * CONCURRENCY
    assert kills == TICKS
    assert recovered > 0, "no kill caught a worker holding jobs: the test proved nothing"

    # The survivors still shut down cleanly.
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(15) == 0
    assert leftovers(cog) == {}
    assert not cog.redis.smembers(k.processes) and not cog.redis.smembers(k.inprogress_identities)
