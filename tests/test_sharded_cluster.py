"""The sharded layout (SPEC section 16) on a real Redis Cluster of three
masters, each with a replica.

This release refuses ``SHARDING = "queues"`` (E035): a worker serves the
queues of one group, and the admin and the API do not yet merge the
groups. What is there runs here, workers started with ``--skip-checks``:
queues spread over the masters, each script call in one slot (a cluster
refuses any other), the beat to each group's own master, and a dead
worker's jobs recovered by the decision of its group's master alone.
"""

from __future__ import annotations

import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_cogworker.connection import get_keys
from testproject.testapp import jobs
from tests.conftest import CogEnv, cpu_seconds, kill, wait_for
from tests.topology import SLOT_RANGES, ClusterGroup, call, redis_cluster  # noqa: F401

STALL_S = 30

#: Commands that carry jobs or their records; not those of the test's own
#: looks (INFO, SCAN, KEYS...) nor the cluster's (CLUSTER, PING...).
DATA_COMMANDS = {"lpush", "rpush", "evalsha", "eval", "blmove", "brpoplpush", "lrem", "zadd", "sadd", "set"}


@pytest.fixture(scope="module")
def redis_url(redis_cluster: ClusterGroup) -> str:  # noqa: F811
    return redis_cluster.url()


@pytest.fixture(autouse=True)
def healthy_cluster(redis_cluster: ClusterGroup) -> Any:  # noqa: F811
    redis_cluster.heal()
    yield


def masters(cluster: ClusterGroup) -> list[int]:
    port = next(n.port for n in cluster.nodes if n.alive)
    return sorted({owner for _, _, owner in cluster._owners(port)})


def queues_per_master(cluster: ClusterGroup, namespace: str, each: int) -> dict[int, list[str]]:
    """``each`` queue names whose group tag lands on each master."""
    found: dict[int, list[str]] = {port: [] for port in masters(cluster)}
    i = 0
    while any(len(names) < each for names in found.values()):
        name = f"q{i}"
        i += 1
        owner = cluster.owner_of(f"{{{namespace}:{name}}}")
        if len(found[owner]) < each:
            found[owner].append(name)
    return found


@pytest.fixture
def sharded(cog: CogEnv, redis_cluster: ClusterGroup) -> Iterator[CogEnv]:  # noqa: F811
    namespace = f"s{uuid.uuid4().hex[:12]}"
    cog.namespace = namespace
    cog.configure(NAMESPACE=namespace, SHARDING="queues")
    yield cog
    client = redis_cluster.client()
    try:
        for pattern in (f"{{{namespace}}}*", f"{{{namespace}:*", f"{namespace}:*"):
            for key in list(client.scan_iter(match=pattern, count=1000)):
                client.delete(key)
    finally:
        client.close()


def data_calls(port: int) -> int:
    with redis.Redis(port=port) as node:
        stats = node.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k.removeprefix("cmdstat_") in DATA_COMMANDS)


def test_g16_sharded_six_queues_spread_their_commands_over_three_masters(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    cog = sharded
    placed = queues_per_master(redis_cluster, cog.namespace, 2)
    queues = [q for names in placed.values() for q in names]
    before = {port: data_calls(port) for port in placed}
    workers = [
        cog.start_worker("--skip-checks", QUEUES=[q], HEARTBEAT_INTERVAL=1, HEARTBEAT_TTL=5) for q in queues
    ]
    per_queue = 500
    for q in queues:
        for _ in range(per_queue):
            jobs.noop.set(queue=q).delay()
    k = get_keys()

    def drained() -> bool:
        return all(cog.redis.llen(k.queue(q)) == 0 for q in queues)

    wait_for(
        drained, STALL_S, "every queue to drain", progress=lambda: sum(cpu_seconds(w.pid) for w in workers)
    )
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(STALL_S) == 0, w.log()
    assert int(cog.redis.get(k.stat_processed) or 0) == per_queue * len(queues)
    calls = {port: data_calls(port) - before[port] for port in placed}
    total = sum(calls.values())
    m = len(placed)
    shares = {port: n / total for port, n in calls.items()}
    print(f"data commands per master: {calls}; shares {[round(x, 3) for x in shares.values()]}")
    assert all(abs(share - 1 / m) <= 0.25 / m for share in shares.values()), (shares, calls)


def test_g1_sharded_a_sigkilled_workers_jobs_come_back_by_each_masters_own_decision(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    cog = sharded
    placed = queues_per_master(redis_cluster, cog.namespace, 1)
    queues = [names[0] for names in placed.values()]
    victims = [cog.start_worker("--skip-checks", QUEUES=[q]) for q in queues]
    for q in queues:
        for i in range(2):
            jobs.noted_pace.set(queue=q).delay(30, f"{q}-{i}")
    wait_for(
        lambda: len(cog.notes("started")) == 2 * len(queues),
        STALL_S,
        "each victim to start its two jobs",
        progress=lambda: sum(cpu_seconds(v.pid) for v in victims),
    )
    k = get_keys()
    for q in queues:
        lists = list(cog.redis.scan_iter(match=k.for_queue(q).inprogress("*")))
        assert len(lists) == 1 and cog.redis.llen(lists[0]) == 2, f"{q}'s jobs in its group's list"
    for v in victims:
        kill(v)
    # The reruns take a short pace: the recovery is what is waited for.
    rescuers = {q: cog.start_worker("--skip-checks", QUEUES=[q]) for q in queues}
    expected = {f"{q}-{i}" for q in queues for i in range(2)}
    wait_for(
        lambda: expected <= {str(n["tag"]) for n in cog.notes()},
        STALL_S + 40,
        "every held job to run again",
        progress=lambda: sum(cpu_seconds(r.pid) for r in rescuers.values()),
    )
    runs = Counter(str(n["tag"]) for n in cog.notes())
    assert runs == Counter(dict.fromkeys(expected, 1))
    # Each job came back on its own group's master, run by that group's worker.
    for note in cog.notes():
        assert note["pid"] == rescuers[note["queue"]].pid
    for q, rescuer in rescuers.items():
        assert "requeued 2 job(s) left in progress by dead process" in rescuer.log(), q
