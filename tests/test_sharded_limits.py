"""Limiters on the sharded layout (SPEC sections 14 and 16), on a real
Redis Cluster of three masters, each with a replica.

Under ``SHARDING = "queues"`` a limiter's keys are shared (the ``{N}``
slot) while a job's lists are its queue group's: every limiter call is
split in two (``limits/sharded.py``). The tests of ``tests/test_limits.py``
and ``tests/test_limits_chaos.py`` collected here run with every test
queue in one group (``{N:all}``), its slot apart from the limiters'; the
tests written here put the jobs of one limiter in two groups, on two
masters, and kill the process holding its slots.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from django_cogworker.connection import get_keys
from testproject.testapp import limited_jobs
from tests.conftest import FAST, CogEnv, wait_for
from tests.test_limits import (  # noqa: F401
    LIMIT_FAULTS,
    gauge_max,
    sampling,
    tags,
    test_g23_acquire_in_job_code_waits_and_runs_again_from_its_start,
    test_g23_concurrency_holds_across_processes_and_waiting_uses_no_retry,
    test_g23_expires_drops_a_job_that_waited_past_its_deadline,
    test_g23_queue_limit_one_at_a_time_and_other_queues_run_meanwhile,
    test_g23_rate_no_window_holds_more_than_its_starts,
    wait_all_run,
)
from tests.test_limits_chaos import (  # noqa: F401
    test_g23_g8_sigterm_of_a_holder_frees_its_slots_and_requeues_its_jobs,
    test_g23_g18_sigstop_the_holder_past_the_threshold_its_late_release_frees_nothing,
    test_g23_sigkill_the_holder_of_both_slots_they_come_back_after_the_threshold,
)
from tests.test_sharded_cluster import queues_per_master
from tests.test_sharded_guarantees import one_group
from tests.topology import ClusterGroup, healthy_cluster, redis_cluster  # noqa: F401

QUEUES = ["default", "mail", "low"]

#: The limiter's keys and the process's holds: in the shared ``{N}`` slot.
#: A limiter's waiting list for a queue is in the queue's group.
SHARED = ("limit", "stat:", "process", "processes", "queues", "paused")


def shared(suffix: str) -> bool:
    return suffix.startswith(SHARED) and ":waiting:" not in suffix


@pytest.fixture(autouse=True)
def sharded_layout(
    cog: CogEnv,
    monkeypatch: pytest.MonkeyPatch,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> Iterator[None]:
    with one_group(cog, monkeypatch, redis_cluster, QUEUES, shared):
        yield


def settled(cog: CogEnv, name: str, queues: list[str]) -> None:
    """Nothing held, waiting, reserved or left to free, in the limiter's
    slot and in each queue's group; no worker logged a failed step."""
    for worker in cog.workers:
        for fault in LIMIT_FAULTS:
            assert fault not in worker.log(), f"{fault!r} in {worker.log_path.name}"
    k = get_keys()
    wait_for(lambda: cog.redis.hlen(k.limit(name, "holders")) == 0, 15, f"{name}'s holders back to 0")
    assert cog.redis.zcard(k.limit(name, "promoted")) == 0
    assert list(cog.redis.scan_iter(match=k.limit_held("*"))) == []
    for queue in queues:
        group = k.for_queue(queue)
        assert cog.redis.llen(group.limit_waiting(name, queue)) == 0
        assert cog.redis.hlen(group.limit_waiters) == 0, f"{queue}'s group still notes waiters"
        assert cog.redis.scard(group.limits_freeing) == 0


def two_groups(cog: CogEnv, cluster: ClusterGroup) -> list[str]:
    """Two queues, each its own group, on two different masters."""
    placed = queues_per_master(cluster, cog.namespace, 1)
    queues = [names[0] for names in placed.values()][:2]
    cog.configure(QUEUES=queues, QUEUE_GROUPS={})
    namespace = cog.namespace
    cog.key_of = lambda suffix: f"{{{namespace}}}:{suffix}"  # the shared keys the helpers read
    return queues


def test_g23_sharded_a_concurrency_limit_holds_across_queue_groups_on_two_masters(
    cog: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    """One limiter, its jobs in two groups on two masters, a worker process
    for each group: never more than its two at once over both, each job
    once, none retried, and nothing left behind on either side."""
    queues = two_groups(cog, redis_cluster)
    workers = [cog.start_worker(QUEUES=[q], CONCURRENCY=4) for q in queues for _ in range(2)]
    for worker in workers:
        worker.identity()
    expected = {f"{q}-{i}" for q in queues for i in range(12)}
    with sampling(cog) as seen:
        for i in range(12):
            for q in queues:
                limited_jobs.erp_sync.set(queue=q).delay(0.2, f"{q}-{i}")
        wait_all_run(cog, expected, "the limited jobs of both groups")
    runs = cog.notes()
    assert Counter(n["tag"] for n in runs) == Counter(dict.fromkeys(expected, 1))
    assert {n["retry_count"] for n in runs} == {0}
    assert gauge_max(cog, "erp") == 2
    assert max(seen) <= 2, "the holders, sampled in the limiter's slot"
    assert {n["queue"] for n in runs} == set(queues)
    settled(cog, "erp", queues)
    print(f"\nConcurrency(2) over two groups on two masters, 4 processes: max {gauge_max(cog, 'erp')}")


def test_g23_sharded_the_slots_of_a_sigkilled_holder_come_back_to_the_waiters_of_another_group(
    cog: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    """The process holding both slots serves one group; the jobs waiting
    for them are in another group, on another master. SIGKILLed, its jobs
    are requeued by its own group's master's decision, its slots freed
    with them (G23, through the group's note), and the waiters of the other
    group let in: not before the orphan threshold, never more than two."""
    holding, waiting = two_groups(cog, redis_cluster)
    holder = cog.start_worker(QUEUES=[holding], CONCURRENCY=2)
    holder.identity()
    for i in range(2):
        limited_jobs.erp_sync.set(queue=holding).delay(8, f"long{i}")
    k = get_keys()
    wait_for(
        lambda: cog.redis.hlen(k.limit("erp", "holders")) == 2 and len(cog.notes("started")) == 2,
        15,
        "both slots held",
    )
    rescuer = cog.start_worker(QUEUES=[holding], CONCURRENCY=2)
    runner = cog.start_worker(QUEUES=[waiting], CONCURRENCY=4)
    rescuer.identity()
    runner.identity()
    shorts = {f"short{i}" for i in range(4)}
    for tag in sorted(shorts):
        limited_jobs.erp_sync.set(queue=waiting).delay(0.2, tag)
    line = k.for_queue(waiting).limit_waiting("erp", waiting)
    wait_for(lambda: cog.redis.llen(line) == 4, 15, "the short jobs to wait in their group")
    with sampling(cog) as seen:
        killed_at = time.time()
        holder.signal(signal.SIGKILL)
        holder.wait(10)
        wait_all_run(cog, shorts | {"long0", "long1"}, "the short jobs and the recovered long ones")
    # The first start after the kill, by a process of either group.
    first_start = min(n["at"] for n in cog.notes("started") if n["pid"] != holder.pid)
    reclaim_s = first_start - killed_at
    assert reclaim_s >= FAST["ORPHAN_THRESHOLD"] - FAST["HEARTBEAT_INTERVAL"] - 0.1
    assert max(seen) <= 2
    assert Counter(n["tag"] for n in cog.notes()) == Counter(dict.fromkeys(shorts | {"long0", "long1"}, 1))
    assert "requeued 2 job(s) left in progress by dead process" in rescuer.log()
    settled(cog, "erp", [holding, waiting])
    print(f"\nSIGKILL of the holder in another group: its slots reclaimed {reclaim_s:.2f}s after the kill")


def test_g23_sharded_a_note_dropped_between_two_calls_is_restored_by_the_sweep(
    cog: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    """A race (or a crash) between a group's call and the limiter's can
    leave waiters the limiter's side does not know of: their queue gone
    from the limiter's ``queues``, its spec forgotten. The group's note of
    its waiting lists brings both back at the next poller pass, and the
    waiters run once a slot is free."""
    queues = two_groups(cog, redis_cluster)
    worker = cog.start_worker(QUEUES=[queues[0]], CONCURRENCY=4)
    worker.identity()
    for i in range(2):
        limited_jobs.erp_sync.set(queue=queues[0]).delay(2, f"holder{i}")
    k = get_keys()
    wait_for(lambda: cog.redis.hlen(k.limit("erp", "holders")) == 2, 15, "both slots held")
    limited_jobs.erp_sync.set(queue=queues[0]).delay(0.1, "waiter")
    line = k.for_queue(queues[0]).limit_waiting("erp", queues[0])
    wait_for(lambda: cog.redis.llen(line) == 1, 15, "the waiter in its group's line")
    # What the race leaves: the limiter's side forgets the waiting queue.
    cog.redis.delete(k.limit("erp", "queues"))
    wait_all_run(cog, {"holder0", "holder1", "waiter"}, "the waiter, after the sweep restored its note")
    assert Counter(tags(cog)) == Counter(dict.fromkeys(["holder0", "holder1", "waiter"], 1))
    settled(cog, "erp", queues)
