"""Workflows across queue groups (SPEC sections 13 and 16, G22), on a real
Redis Cluster of three masters: a batch, a chain and a chord whose jobs
are in three groups, each on its own master, so that every member's end
reaches its batch through its group's outbox and every job a batch
starts reaches its group through ``{N}:forward`` (``workflows/forward.py``);
and the same under SIGKILL chaos, a process of one of the groups killed
every second.

The tests of the workflow modules run again on the sharded layout in
``tests/test_sharded_workflow_modules.py``, their SIGKILL chaos included.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from django_cogworker import batch, chain, chord, group
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys
from django_cogworker.scripts import script
from django_cogworker.workflows import effects, forward
from testproject.testapp import batch_jobs
from testproject.testapp import workflow_jobs as wf
from tests.conftest import CogEnv, delete_sharded, kill, wait_for
from tests.test_sharded_cluster import queues_per_master
from tests.topology import ClusterGroup, cluster_redis_url, healthy_cluster, redis_cluster  # noqa: F401

STALL_S = 30

EVENTS = ("success", "complete", "settled")


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
    with batch(**{f"on_{e}": wf.callback.s(e).set(queue=three[i]) for i, e in enumerate(EVENTS)}) as b:
        enqueued = [wf.member.set(queue=three[i % 3]).delay(i) for i in range(30)]
    k = get_keys()
    queued = {q: [json.loads(r)["jid"] for r in reversed(cog.redis.lrange(k.queue(q), 0, -1))] for q in three}
    assert queued == {q: enqueued[i::3] for i, q in enumerate(three)}, (
        "the members reach their groups at the block's exit, each queue in the order they were enqueued"
    )
    worker = cog.start_worker(QUEUES=three, CONCURRENCY=4)
    callbacks = wait_notes(cog, "callbacks", 3, worker)
    runs = ran(cog, "runs")
    assert sorted(r["tag"] for r in runs) == list(range(30))
    assert {r["bid"] for r in runs} == {b.bid}
    assert sorted((c["tag"], c["event"], c["bid"]) for c in callbacks) == sorted(
        (e, e, b.bid) for e in EVENTS
    )
    figures = {part: cog.redis.scard(k.batch(b.bid, part)) for part in ("pending", "succeeded", "dead")}
    assert figures == {"pending": 0, "succeeded": 30, "dead": 0}
    fired = cog.redis.hgetall(k.batch(b.bid))
    assert {f"fired:{e}".encode() for e in EVENTS} <= set(fired) and b"fired:death" not in fired
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


#: The cross-group chaos: its batches' callbacks (every other batch has a
#: member that dies), ticks, batches and chains opened per tick, members per batch.
CHAOS_EVENTS = ("success", "complete", "death", "settled")
TICKS = 8
TICK_S = 1.0
MEMBERS = 45
JOB_S = 0.2


def members_running(cog: CogEnv, tick: int) -> bool:
    """Whether a member of the chaos's batch of ``tick`` has started and not ended."""
    tags = {f"{tick}-{i}" for i in range(MEMBERS)}
    started = sum(1 for n in ran(cog, "started") if str(n["tag"]) in tags)
    return started > sum(1 for n in ran(cog, "runs") if str(n["tag"]) in tags)


def expected(tick: int) -> set[str]:
    """The events of the chaos's batch of ``tick``: with its doomed member, or without."""
    return {"complete", "death", "settled"} if tick % 2 else {"success", "complete", "settled"}


def test_g22_sharded_sigkill_chaos_over_three_masters_each_callback_once_nothing_lost(
    cog: CogEnv, three: list[str]
) -> None:
    """Two workers per group (each a process of one group), one of the six
    SIGKILLed and replaced every tick while batches and chains whose jobs
    are spread over the three groups stream through: their ends cross from
    three outboxes to the batches' slot, and their callbacks and next steps
    back, with processes dying between the two steps of each crossing.
    Every other batch has a member that dies (its filing crosses too).
    Every batch settles with every other member succeeded, each callback
    of the events that came true fired once (and ran), none of the others,
    every chain reached its last step with the results of the others, and
    nothing is left in transit."""
    seed = int(os.environ.get("COGWORKER_CHAOS_SEED") or random.randrange(2**32))
    print(f"COGWORKER_CHAOS_SEED={seed}")
    rng = random.Random(seed)
    settings = {"CONCURRENCY": 3, "MAX_ORPHANINGS": 20}
    workers = {(q, n): cog.start_worker(QUEUES=[q], **settings) for q in three for n in range(2)}
    opened: list[str] = []
    chains: list[str] = []
    kills = 0
    for tick in range(TICKS):
        tick_ends = time.monotonic() + TICK_S
        events = {
            f"on_{e}": wf.callback.s(f"{tick}-{e}").set(queue=three[i % 3])
            for i, e in enumerate(CHAOS_EVENTS)
        }
        with batch(**events) as b:
            for i in range(MEMBERS):
                batch_jobs.member.set(queue=three[i % 3]).delay(JOB_S, f"{tick}-{i}")
            if tick % 2:
                batch_jobs.doomed.set(queue=three[tick % 3]).delay(f"{tick}-doomed")
        opened.append(b.bid)
        name = f"c{tick}"
        chain(*(batch_jobs.link.s(name, i, JOB_S).set(queue=three[i]) for i in range(3))).delay()
        chains.append(name)
        # The kill lands while this tick's members run (each takes JOB_S),
        # at a drawn moment of the first of them: a kill after they all
        # ended would test nothing, and a fast machine ends them early.
        wait_for(lambda t=tick: members_running(cog, t), STALL_S, f"a member of tick {tick} to start")
        time.sleep(rng.uniform(0.0, 0.5) * JOB_S)
        where = rng.choice(sorted(workers))
        kill(workers[where])
        kills += 1
        workers[where] = cog.start_worker(QUEUES=[where[0]], **settings)
        time.sleep(max(0.0, tick_ends - time.monotonic()))
    k = get_keys()

    def unsettled() -> list[str]:
        return [bid for bid in opened if not cog.redis.hexists(k.batch(bid), "settled_at")]

    def moving() -> tuple[int, int, int]:
        return (
            len(ran(cog, "runs")),
            len(ran(cog, "callbacks")),
            sum(len(w.log()) for w in workers.values()),
        )

    wait_for(lambda: not unsettled(), STALL_S, "every batch settled", progress=moving)
    wait_for(lambda: len(ran(cog, "callbacks")) >= 3 * TICKS, STALL_S, "every callback run", progress=moving)
    wait_for(
        lambda: {c for c in chains if [c, 2] in [r["tag"] for r in ran(cog, "runs")]} == set(chains),
        STALL_S,
        "every chain's last step",
        progress=moving,
    )
    wait_for(lambda: not left_in_transit(cog, three), STALL_S, "outboxes and forward empty", progress=moving)
    for tick, bid in enumerate(opened):
        fields = cog.redis.hgetall(k.batch(bid))
        fired = {e for e in CHAOS_EVENTS if f"fired:{e}".encode() in fields}
        assert fired == expected(tick), (tick, fields)
        figures = {part: cog.redis.scard(k.batch(bid, part)) for part in ("pending", "failed", "dead")}
        assert figures == {"pending": 0, "failed": 0, "dead": tick % 2}, (tick, figures)
        assert cog.redis.scard(k.batch(bid, "succeeded")) == MEMBERS
    member_runs = Counter(str(r["tag"]) for r in ran(cog, "runs") if isinstance(r["tag"], str))
    starts = Counter(str(r["tag"]) for r in ran(cog, "started") if isinstance(r["tag"], str))
    again = sum(starts.values()) - len(starts)
    print(f"{kills} kills; members started again after a kill: {again}, run to their end again: ", end="")
    print(sum(member_runs.values()) - len(member_runs))
    assert again > 0, "no kill caught a member running: the chaos tested nothing"
    ran_members = set(member_runs)
    assert ran_members == {f"{t}-{i}" for t in range(TICKS) for i in range(MEMBERS)}, "no member lost"
    # Each callback enqueued once: its jid <bid>-<event>; it may run again
    # only if a kill caught it running (each takes 1 s).
    runs = Counter(str(c["tag"]) for c in ran(cog, "callbacks"))
    assert set(runs) == {f"{t}-{e}" for t in range(TICKS) for e in expected(t)}
    assert sum(runs.values()) - len(runs) <= kills * settings["CONCURRENCY"], runs
    # A chain's steps: each got what the one before returned.
    lasts = [r for r in ran(cog, "runs") if isinstance(r["tag"], list) and r["tag"][1] == 2]
    assert {r["tag"][0] for r in lasts} == set(chains)
    assert all(r["so_far"] == [0, 1] for r in lasts), lasts


def test_g12_sharded_a_queue_key_of_the_wrong_type_holds_up_no_other_forwarded_job(
    cog: CogEnv, three: list[str]
) -> None:
    """A member whose queue's key was overwritten by hand (a string) waits
    in ``{N}:forward``; the members of the other groups are pushed."""
    k = get_keys()
    broken, *fine = three
    cog.redis.set(k.queue(broken), "not a list")
    with batch():
        for i in range(6):
            wf.member.set(queue=three[i % 3]).delay(i)
    assert [cog.redis.llen(k.queue(q)) for q in fine] == [2, 2]
    assert cog.redis.zcard(k.forward) == 2, "the broken queue's two members wait"
    cog.redis.delete(k.queue(broken))
    forward.push_forwarded(cog.redis, k)
    assert cog.redis.llen(k.queue(broken)) == 2 and cog.redis.zcard(k.forward) == 0


def test_g12_sharded_an_end_whose_batch_key_is_of_the_wrong_type_is_set_aside_not_jamming_the_outbox(
    cog: CogEnv, three: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Two batches' members end in one group; the first batch's pending set
    was overwritten by hand: its end is set aside in the outbox's
    ``unapplied`` list, with an error logged, and the second batch settles."""
    q = three[0]
    k, group = get_keys(), get_keys().for_queue(q)
    bids = []
    for _ in range(2):
        with batch() as b:
            wf.member.set(queue=q).delay("one")
        bids.append(b.bid)
    cog.redis.delete(k.batch(bids[0], "pending"))
    cog.redis.set(k.batch(bids[0], "pending"), "not a set")
    config = get_config()
    for raw in reversed(cog.redis.lrange(group.queue(q), 0, -1)):
        payload = json.loads(raw)
        script("batch_move")(
            cog.redis, *effects.end_args(group, config, payload, effects.SUCCEEDED, None, None)
        )
    with caplog.at_level(logging.ERROR, logger="django_cogworker"):
        assert forward.apply_outbox(cog.redis, group, config) == 2
    assert cog.redis.llen(group.outbox) == 0 and cog.redis.llen(group.outbox_unapplied) == 1
    assert "an end set aside, not applied" in caplog.text
    assert cog.redis.hexists(k.batch(bids[1]), "settled_at"), "the second batch settled"
