"""G22, batches under single faults (SPEC section 13): a worker stopped
past ORPHAN_THRESHOLD and continued (G18), members run a second time after
a recovery, members retried, killed or deleted from the admin (its own
pages: ``tests/test_batches_admin.py``), a poison pill (G3), an expired
member (section 14). Real Redis, real worker processes.

In each, every callback fires once (``fired:<event>``, jid
``<bid>-<event>``) when its condition is true and never otherwise, and a
second completion of a member changes none of its batch's figures.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from typing import Any

from django_cogworker import batch
from testproject.testapp import batch_jobs, jobs
from tests.conftest import CogEnv, wait_for
from tests.test_batches_chaos import CONCURRENCY, assert_callbacks_once, batch_chaos, callbacks, open_plain
from tests.test_chains_chaos import StopAndContinue
from tests.test_chaos import report, shut_down
from tests.test_expires import expired_count, redis_now, wait_past
from tests.test_guarantees import keys, leftovers, plant_dead_identity, where_jobs_are

#: How long a wait may go without any progress.
STALL_S = 30


def callback_runs(cog: CogEnv) -> Counter[str]:
    return Counter(n["jid"] for n in cog.notes("callbacks"))


def callback_figures(cog: CogEnv, bid: str, event: str) -> dict[str, Any]:
    [note] = [n for n in cog.notes("callbacks") if n["jid"] == f"{bid}-{event}"]
    assert (note["event"], note["bid"]) == (event, bid), note
    return dict(note["figures"])


def wait_fired(cog: CogEnv, bid: str, event: str) -> None:
    """Until ``event``'s callback has run."""
    wait_for(
        lambda: f"{bid}-{event}" in callback_runs(cog),
        STALL_S,
        f"the {event} callback of {bid}",
        progress=lambda: (len(cog.notes()), leftovers(cog)),
    )


def fired(bid: str) -> list[str]:
    return list(batch_jobs.figures(bid)["fired"])


def go(cog: CogEnv, tag: str) -> None:
    cog.redis.set(cog.key(f"test:go:{tag}"), 1)


def ran(cog: CogEnv, jid: str, kind: str = "runs") -> int:
    return sum(1 for n in cog.notes(kind) if n["jid"] == jid)


def at_rest(cog: CogEnv, jids: list[str]) -> bool:
    """None of ``jids`` is queued, running or waiting: each has ended (dead is an end)."""
    places = where_jobs_are(cog)[0]
    return all(set(places.get(jid, [])) <= {"dead"} for jid in jids)


def assert_settled_once(cog: CogEnv, bid: str, events: set[str]) -> None:
    """``events`` fired, and their callbacks ran, once each; the others never."""
    every = [f"{bid}-{event}" for event in ("success", "complete", "settled", "death")]
    wait_for(lambda: at_rest(cog, every), STALL_S, "every callback run")
    for event in ("success", "complete", "settled", "death"):
        runs = callback_runs(cog)[f"{bid}-{event}"]
        assert runs == (event in events), f"the {event} callback ran {runs} times"
    assert set(fired(bid)) == events


# -- G18: a stopped worker's late acks ---------------------------------------------------


def test_g22_g18_a_worker_stopped_past_the_threshold_its_late_acks_change_nothing(cog: CogEnv) -> None:
    cog.configure(CONCURRENCY=2, MAX_ORPHANINGS=10)
    stopped = cog.start_worker()
    stopped.identity()
    with batch(description="revival", **callbacks()) as b:
        slow = [str(batch_jobs.slow_first.delay(8, f"slow-{i}")) for i in range(2)]
        quick = batch_jobs.member.delay_many([((0.01, f"quick-{i}"), {}) for i in range(10)])
    wait_for(
        lambda: {n["jid"] for n in cog.notes("sleeping") if n["pid"] == stopped.pid} >= set(slow),
        STALL_S,
        "both slow members sleeping in the process to stop",
    )
    stopped.signal(signal.SIGSTOP)
    try:
        other = cog.start_worker(CONCURRENCY=4)
        # Its jobs recovered past ORPHAN_THRESHOLD, and run (quickly) by the other.
        wait_fired(cog, b.bid, "settled")
        before = batch_jobs.figures(b.bid)
        other.signal(signal.SIGTERM)
        assert other.wait(30) == 0
        stopped.signal(signal.SIGCONT)
        # Its two runs end, and their acks are sent before each thread fetches
        # again: once a probe ran on each of its two threads, both were sent.
        for i in range(4):
            batch_jobs.probe.delay(0.3, i)
        wait_for(
            lambda: len({n["thread"] for n in cog.notes("probes") if n["pid"] == stopped.pid}) == 2,
            STALL_S,
            "a probe run on both threads of the continued process",
        )
    finally:
        stopped.signal(signal.SIGCONT)
    late = [n for n in cog.notes() if n["pid"] == stopped.pid and n["jid"] in slow]
    assert len(late) == 2, "the continued process did not finish its runs: the test proved nothing"
    assert all(ran(cog, jid) == 2 for jid in slow), "recovered, each slow member ran on the other too"
    after = batch_jobs.figures(b.bid)
    assert after == before, f"a late ack changed the batch: {before} -> {after}"
    assert (after["total"], after["succeeded"]) == (len(slow) + len(quick), len(slow) + len(quick))
    assert_settled_once(cog, b.bid, {"success", "complete", "settled"})
    recovered = sum(w.log().count("left in progress by dead process") for w in cog.workers)
    print(f"\nSIGSTOP past the threshold: {recovered} recovery, {len(late)} late acks, figures {after}")


def test_g22_g18_a_late_ack_before_the_recovered_run_leaves_the_member_pending(cog: CogEnv) -> None:
    """The late ack comes while the recovered member waits on its (paused)
    queue: it must not count the member, nor fire anything; the member
    counts once its new run ends."""
    k = keys()
    stopped = cog.start_worker(CONCURRENCY=1, QUEUES=["default", "mail"])
    stopped.identity()
    with batch(description="late ack first", **callbacks()) as b:
        slow = str(batch_jobs.slow_first.delay(4, "slow"))
        batch_jobs.member.delay_many([((0, f"q{i}"), {}) for i in range(3)])
    wait_for(lambda: ran(cog, slow, "sleeping"), STALL_S, "the slow member sleeping in the process to stop")
    cog.redis.sadd(k.paused, "default")
    stopped.signal(signal.SIGSTOP)
    try:
        cog.start_worker(QUEUES=["default"]).identity()  # recovers it; fetches nothing while paused
        wait_for(
            lambda: where_jobs_are(cog)[0].get(slow) == [k.queue("default")], STALL_S, "the member recovered"
        )
        before = batch_jobs.figures(b.bid)
        stopped.signal(signal.SIGCONT)
        # Its one thread ends its run and acks it, then fetches the probe:
        # only it serves "mail".
        batch_jobs.probe.set(queue="mail").delay(0, "after")
        wait_for(lambda: cog.notes("probes"), STALL_S, "the continued process to run the probe")
    finally:
        stopped.signal(signal.SIGCONT)
    assert [n["pid"] for n in cog.notes() if n["jid"] == slow] == [stopped.pid], "its run did not end late"
    assert batch_jobs.figures(b.bid) == before, "the late ack moved the member or fired an event"
    assert before["pending"] >= 1 and before["fired"] == [], before
    assert where_jobs_are(cog)[0].get(slow) == [k.queue("default")]
    cog.redis.srem(k.paused, "default")
    wait_fired(cog, b.bid, "settled")
    assert_settled_once(cog, b.bid, {"success", "complete", "settled"})
    assert ran(cog, slow) == 2


def test_g22_g18_sigstop_chaos_the_late_acks_of_continued_workers_change_nothing(cog: CogEnv) -> None:
    """The SIGKILL chaos of ``tests/test_batches_chaos.py``, but the worker
    hit is stopped past ORPHAN_THRESHOLD (its jobs recovered and run by the
    others), then continued: it finishes its runs, and their acks move
    nothing in the batches."""
    stopper = StopAndContinue()
    try:
        chaos, opened, sampled = batch_chaos(cog, open_plain, stopper)
    finally:
        stopper.continue_all()
    stops = stopper.stops
    extra = assert_callbacks_once(chaos, opened, lambda jid: stops)
    recovered = sum(w.log().count("left in progress by dead process") for w in cog.workers)
    lost, second_runs = report(
        chaos, "batches, SIGSTOP past the threshold", f"{extra}, {stops} stops, {recovered} recoveries"
    )
    assert sampled.faults == [], sampled.faults[:5]
    assert not lost
    assert recovered > 0, "no stop lasted long enough for a recovery: the test proved nothing"
    assert second_runs <= stops * CONCURRENCY
    assert all(worker.alive() for worker in chaos.workers)
    shut_down(cog, chaos.workers)


# -- a member run twice --------------------------------------------------------------------


def test_g22_members_run_again_after_a_recovery_change_nothing_before_or_after_settling(cog: CogEnv) -> None:
    """A copy of finished members (one succeeded, one dead) on a dead
    process's list: recovered, they run again, and their second ends find
    them moved already."""
    cog.configure(MAX_ORPHANINGS=10)
    with batch(description="re-runs", **callbacks()) as b:
        batch_jobs.gated.delay("gate")
        again = batch_jobs.member.delay_many([((0, f"x{i}"), {}) for i in range(3)])
        dead = str(batch_jobs.doomed.delay("dead"))
    queued = cog.redis.lrange(keys().queue("default"), 0, -1)
    copies = [raw for raw in queued if json.loads(raw)["jid"] in {*again, dead}]
    assert len(copies) == 4
    cog.start_worker().identity()
    wait_fired(cog, b.bid, "death")
    wait_for(lambda: all(ran(cog, jid) for jid in again), STALL_S, "the members to run")
    before = batch_jobs.figures(b.bid)
    assert (before["pending"], before["succeeded"], before["dead"], before["fired"]) == (1, 3, 1, ["death"])

    for attempt, identity in ((2, "host:1:rerun-open"), (3, "host:2:rerun-settled")):
        plant_dead_identity(cog, identity, copies)
        wait_for(
            lambda attempt=attempt: (  # type: ignore[misc]
                all(ran(cog, jid) == attempt for jid in again)
                and ran(cog, dead, "doomed") == attempt
                and at_rest(cog, [*again, dead])
            ),
            STALL_S,
            "the copies to run and end",
        )
        assert batch_jobs.figures(b.bid) == before, "a second end changed the batch"
        if attempt == 2:
            # Open still: the gate lets it settle, then the copies run once more.
            assert callback_runs(cog)[f"{b.bid}-death"] == 1
            go(cog, "gate")
            wait_fired(cog, b.bid, "settled")
            before = batch_jobs.figures(b.bid)
    assert_settled_once(cog, b.bid, {"death", "complete", "settled"})
    print(f"\nmembers run 3 times each: figures {before}, callbacks {dict(callback_runs(cog))}")


# -- retries, a poison pill, an expired member --------------------------------------------------------


def test_g22_a_member_failing_twice_complete_after_its_first_failure_success_after_its_success(
    cog: CogEnv,
) -> None:
    cog.start_worker().identity()
    with batch(description="retried", **callbacks()) as b:
        twice = str(batch_jobs.fails_then_succeeds.delay(2, "twice"))
        batch_jobs.member.delay_many([((0, f"q{i}"), {}) for i in range(3)])
    wait_fired(cog, b.bid, "settled")
    assert_settled_once(cog, b.bid, {"success", "complete", "settled"})
    failures = sorted(n["at"] for n in cog.notes("failed") if n["jid"] == twice)
    [success] = [n["at"] for n in cog.notes() if n["jid"] == twice]
    assert len(failures) == 2
    starts = {
        e: min(n["at"] for n in cog.notes("callbacks") if n["jid"] == f"{b.bid}-{e}") for e in fired(b.bid)
    }
    assert failures[0] <= starts["complete"] < success, (failures, starts, success)
    assert callback_figures(cog, b.bid, "complete")["failed"] == 1
    assert min(starts["success"], starts["settled"]) >= success
    assert callback_figures(cog, b.bid, "success")["succeeded"] == 4
    print(f"\nfails twice: failures at {failures}, success at {success}, callbacks started {starts}")


def test_g22_a_poison_pill_member_counts_as_dead_and_death_fires_once(cog: CogEnv) -> None:
    cog.configure(MAX_ORPHANINGS=1, CONCURRENCY=2)
    with batch(description="poison", **callbacks()) as b:
        pill = jobs.kill_own_process.delay()
        batch_jobs.member.delay_many([((0, f"q{i}"), {}) for i in range(5)])
    workers = [cog.start_worker(), cog.start_worker()]
    restarts = 0

    def supervise() -> bool:
        """Restarts dead workers, as systemd would."""
        nonlocal restarts
        for index, worker in enumerate(workers):
            if not worker.alive():
                worker.wait(5)
                workers[index] = cog.start_worker()
                restarts += 1
        return "settled" in fired(b.bid)

    wait_for(supervise, 60, "the batch to settle with its poison pill parked")
    [entry] = [json.loads(raw) for raw in cog.redis.zrange(keys().dead, 0, -1)]
    assert (entry["jid"], entry["error_class"]) == (pill, "ProcessDied")
    # Each callback has run and is at rest (read in one atomic step: a
    # callback moved from the schedule to its queue between two reads of
    # separate keys would be seen nowhere).
    ends = [f"{b.bid}-{event}" for event in ("death", "complete", "settled")]
    ran_and_rested = lambda: all(callback_runs(cog)[jid] for jid in ends) and at_rest(cog, ends)  # noqa: E731
    wait_for(ran_and_rested, STALL_S, "every callback run")
    assert not leftovers(cog).keys() - {"dead"}
    # A callback killed with its process by the pill may run again: fired once all the same.
    runs = callback_runs(cog)
    for event in ("death", "complete", "settled"):
        assert 1 <= runs[f"{b.bid}-{event}"] <= 1 + restarts, (event, runs)
    assert runs[f"{b.bid}-success"] == 0
    assert set(fired(b.bid)) == {"death", "complete", "settled"}
    seen = batch_jobs.figures(b.bid)
    assert (seen["dead"], seen["succeeded"], seen["total"]) == (1, 5, 6), seen
    print(f"\npoison pill: {restarts} restarts, callback runs {dict(runs)}")


def test_g22_an_expired_member_counts_as_succeeded(cog: CogEnv) -> None:
    with batch(description="expiry", **callbacks()) as b:
        expiring = jobs.expiring.delay("expired")  # expires=1
        batch_jobs.member.delay(0, "fresh")
    wait_past(cog, redis_now(cog) + 1)
    cog.start_worker().identity()
    wait_fired(cog, b.bid, "settled")
    assert_settled_once(cog, b.bid, {"success", "complete", "settled"})
    assert expired_count(cog) == 1
    assert ran(cog, str(expiring)) == 0
    seen = batch_jobs.figures(b.bid)
    assert (seen["succeeded"], seen["total"], seen["dead"]) == (2, 2, 0), seen
    print(f"\nexpired member: figures {seen}, callback runs {dict(callback_runs(cog))}")
