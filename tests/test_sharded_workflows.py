"""Workflows across queue groups (SPEC sections 13 and 16, G22), on a real
Redis Cluster of three masters: a batch, a chain and a chord whose jobs
are in three groups, each on its own master, so that every member's end
reaches its batch through its group's outbox and every job a batch
starts reaches its group through ``{N}:forward`` (``workflows/forward.py``).

The tests of the workflow modules run again on the sharded layout in
``tests/test_sharded_workflow_modules.py``, their SIGKILL chaos included.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from django_cogworker import batch, chain, chord, group
from django_cogworker.connection import get_keys
from testproject.testapp import workflow_jobs as wf
from tests.conftest import CogEnv, delete_sharded, wait_for
from tests.test_sharded_cluster import queues_per_master
from tests.topology import ClusterGroup, cluster_redis_url, healthy_cluster, redis_cluster  # noqa: F401

STALL_S = 30


@pytest.fixture
def three(cog: CogEnv, redis_cluster: ClusterGroup) -> Iterator[list[str]]:  # noqa: F811
    """``SHARDING = "queues"`` in a fresh namespace; three queues, each the
    one queue of its group, on three masters. Yields them."""
    namespace = f"s{uuid.uuid4().hex[:12]}"
    cog.namespace = namespace
    cog.configure(NAMESPACE=namespace, SHARDING="queues")
    placed = queues_per_master(redis_cluster, namespace, 1)
    yield [names[0] for names in placed.values()]
    client = redis_cluster.client()
    try:
        delete_sharded(client, namespace)
    finally:
        client.close()


def ran(cog: CogEnv, kind: str) -> list[dict[str, Any]]:
    return cog.notes(kind)


def wait_notes(cog: CogEnv, kind: str, count: int, worker: Any) -> list[dict[str, Any]]:
    wait_for(
        lambda: len(ran(cog, kind)) >= count,
        STALL_S,
        f"{count} {kind} note(s)",
        progress=lambda: (len(ran(cog, "runs")), len(worker.log())),
    )
    return ran(cog, kind)


def left_in_transit(cog: CogEnv, queues: list[str]) -> dict[str, int]:
    """What waits in the outboxes and in ``{N}:forward``."""
    k = get_keys()
    found = {q: int(cog.redis.llen(k.for_queue(q).outbox)) for q in queues}
    found["forward"] = int(cog.redis.zcard(k.forward))
    return {where: n for where, n in found.items() if n}


def test_g22_sharded_a_batch_over_three_masters_fires_each_callback_once_after_every_member(
    cog: CogEnv, three: list[str]
) -> None:
    events = ("success", "complete", "settled")
    with batch(**{f"on_{e}": wf.callback.s(e).set(queue=three[i]) for i, e in enumerate(events)}) as b:
        for i in range(30):
            wf.member.set(queue=three[i % 3]).delay(i)
    k = get_keys()
    queued = {q: int(cog.redis.llen(k.queue(q))) for q in three}
    assert queued == dict.fromkeys(three, 10), "the members reach their groups at the block's exit"
    worker = cog.start_worker(QUEUES=three, CONCURRENCY=4)
    callbacks = wait_notes(cog, "callbacks", 3, worker)
    runs = ran(cog, "runs")
    assert sorted(r["tag"] for r in runs) == list(range(30))
    assert {r["bid"] for r in runs} == {b.bid}
    assert sorted((c["tag"], c["event"], c["bid"]) for c in callbacks) == sorted(
        (e, e, b.bid) for e in events
    )
    figures = {part: cog.redis.scard(k.batch(b.bid, part)) for part in ("pending", "succeeded", "dead")}
    assert figures == {"pending": 0, "succeeded": 30, "dead": 0}
    fired = cog.redis.hgetall(k.batch(b.bid))
    assert {f"fired:{e}".encode() for e in events} <= set(fired) and b"fired:death" not in fired
    wait_for(lambda: not left_in_transit(cog, three), 10, "outboxes and forward empty")
    # Each group's outbox was applied once per end: its numbers, kept in the batch.
    seqs = {f: v for f, v in fired.items() if f.startswith(b"seq:")}
    assert sorted(int(v) for v in seqs.values()) == [10, 10, 10], seqs


def test_g22_sharded_a_chain_and_a_chord_cross_three_masters_each_step_once(
    cog: CogEnv, three: list[str]
) -> None:
    a, b, c = three
    chain(
        wf.add.s(10, 20).set(queue=a), wf.double.s().set(queue=b), wf.collect.s(tag="chain").set(queue=c)
    ).delay()
    header = group(wf.double.s(i).set(queue=three[i % 3]) for i in range(9))
    bid = chord(header, wf.collect.s(tag="chord").set(queue=b)).delay()
    worker = cog.start_worker(QUEUES=three, CONCURRENCY=4)
    bodies = {str(n["tag"]): n for n in wait_notes(cog, "callbacks", 2, worker)}
    assert bodies["chain"]["results"] == 60, "10 + 20, doubled, handed on across three groups"
    assert bodies["chord"]["results"] == [i * 2 for i in range(9)], "in header order"
    assert bodies["chord"]["bid"] == bid
    counts = Counter(str(n["tag"]) for n in ran(cog, "runs"))
    assert counts == Counter({"[10, 20]": 1, "30": 1, **{str(i): 1 for i in range(9)}}), counts
    wait_for(lambda: not left_in_transit(cog, three), 10, "outboxes and forward empty")
    assert len(ran(cog, "callbacks")) == 2
