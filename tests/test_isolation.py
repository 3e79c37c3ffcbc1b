"""G3 without a queue: the jobs of a dead process come back in parallel.

A job recovered once runs beside the others as any job does; only a job
recovered again (its counter at 2, or at MAX_ORPHANINGS when that is lower)
runs alone among such jobs in its process. A poison pill reaches that state
after its second kill, and from then on kills no job that has been orphaned
as often, so no innocent follows it to dead.
"""

from __future__ import annotations

import time

from django_cogworker.payload import decode
from testproject.testapp import jobs
from tests.conftest import kill, wait_for
from tests.test_guarantees import jid_of, keys, leftovers, plant_dead_identity, raw_job, run_requeue

JOBS = 40
#: Long enough that A starts all of them before the first ends, and B all
#: of them within one job length, on a loaded machine too (3 s was tight).
JOB_S = 6.0


def test_g3_the_jobs_of_a_killed_busy_worker_run_in_parallel_in_the_next_one(cog):
    """A -c 40 worker SIGKILLed with 40 six-second jobs running: the next
    worker runs them side by side, not one after another (240 s)."""
    cog.configure(CONCURRENCY=JOBS)
    r, k = cog.redis, keys()
    jids = set(jobs.noted_pace.delay_many([((JOB_S, i), {}) for i in range(JOBS)]))
    a = cog.start_worker()
    a_list = k.inprogress(a.identity())
    wait_for(lambda: {n["jid"] for n in cog.notes("started")} == jids, 30, "A to start every job")
    kill(a)
    assert r.llen(a_list) == JOBS, "some job finished before the kill"
    b = cog.start_worker()

    def in_b(kind: str) -> list[float]:
        return [n["at"] for n in cog.notes(kind) if n["pid"] == b.pid]

    wait_for(lambda: in_b("started"), 30, "B to recover A's jobs and start one")
    first_start = min(in_b("started"))
    # Ends when every job ran, or once three job lengths have passed since
    # the first start: one after another, they would need forty.
    wait_for(
        lambda: len(in_b("runs")) == JOBS or time.time() - first_start > 3 * JOB_S,
        30 + 3 * JOB_S,
        "B to run the jobs or to take three job lengths",
    )
    done = in_b("runs")
    span = (max(done) if len(done) == JOBS else time.time()) - first_start
    said = f"{len(done)} of {JOBS} recovered {JOB_S:.0f}s jobs done {span:.1f}s after the first started"
    print(f"\nG3: {said}")
    assert len(done) == JOBS and span <= 2 * JOB_S, said
    assert {n["jid"] for n in cog.notes() if n["pid"] == b.pid} == jids
    wait_for(lambda: leftovers(cog) == {}, 15, "nothing left")
    assert not any(r.exists(k.orphanings(jid)) for jid in jids), "each run cleared its counter"


def test_g3_a_job_recovered_once_that_a_dead_process_ran_beside_others_is_counted_again(cog):
    """Run in parallel, a job recovered once is counted again when its process
    dies, as a fresh job is: else a poison pill recovered once would come
    back forever. Recovered twice, only the one the process recorded before
    starting it is counted (the others are spared)."""
    k = keys()
    once = raw_job(jobs.record, "once")[:-1] + b',"orphaned":1}'
    twice = raw_job(jobs.record, "twice")[:-1] + b',"orphaned":1}'
    cog.redis.set(k.orphanings(jid_of(once)), 1)
    cog.redis.set(k.orphanings(jid_of(twice)), 2)
    ident = "host:5:g3"
    plant_dead_identity(cog, ident, [once, twice])
    assert run_requeue(cog, ident, threshold_s=2)[0] == 2
    assert cog.redis.get(k.orphanings(jid_of(once))) == b"2"
    assert cog.redis.get(k.orphanings(jid_of(twice))) == b"2", "isolated and not the one started: spared"


def test_g3_innocents_killed_beside_a_pill_are_not_parked_with_it(cog):
    """Seven jobs run beside a poison pill, recovered with it after each
    kill: beside it in parallel while recovered once, then each alone. The
    pill is parked after MAX_ORPHANINGS + 1 runs; every innocent finishes,
    none is counted more than twice."""
    cog.configure(CONCURRENCY=8, MAX_ORPHANINGS=3)
    r, k = cog.redis, keys()
    innocents = jobs.noted_pace.delay_many([((0.5, f"innocent-{i}"), {}) for i in range(7)])
    pill = str(jobs.kill_own_process.delay())
    worker = [cog.start_worker()]
    kills, most_counted = 0, 0

    def supervise() -> bool:
        """Starts a worker in place of a dead one, as systemd would."""
        nonlocal kills, most_counted
        counts = [int(r.get(k.orphanings(jid)) or 0) for jid in innocents]
        most_counted = max(most_counted, *counts)
        if not worker[0].alive():
            worker[0].wait(5)
            worker[0] = cog.start_worker()
            kills += 1
        return bool(r.zcard(k.dead)) and set(innocents) <= {n["jid"] for n in cog.notes()}

    wait_for(supervise, 90, "the pill to be parked and every innocent to finish")
    print(f"\nG3: the pill killed {kills} workers; innocents counted at most {most_counted} times")
    [entry] = [decode(raw) for raw in r.zrange(k.dead, 0, -1)]
    assert entry["jid"] == pill and entry["error_class"] == "ProcessDied"
    assert [n["tag"] for n in cog.notes()].count("kill") == 3 + 1
    assert most_counted <= 2
    wait_for(lambda: leftovers(cog) == {"dead": 1}, 15, "nothing else left")
