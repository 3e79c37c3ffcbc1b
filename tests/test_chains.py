"""Chains and chords (SPEC section 13, G22) with real worker processes on a
real Redis: results handed on (``.si()`` takes none), a dead step that stops
a chain and its retry from the admin's API that resumes it, a chord's body
with its results in header order, once, and never after a death; a return
value too large fails clearly; a second completion of one member changes
nothing; a plain job's worker path sends what it sent before.
"""

from __future__ import annotations

import threading
from typing import Any

import redis

from django_cogworker import api, batch, chain, chord, group
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.keys import Keys
from django_cogworker.ledger import ACK
from django_cogworker.payload import decode
from django_cogworker.scripts import script
from django_cogworker.work import UnitOfWork
from django_cogworker.workflows.ends import settle_flow
from testproject.testapp import jobs
from testproject.testapp import workflow_jobs as wf
from tests.conftest import CogEnv, wait_for
from tests.test_batches import STALL_S, batch_hash, callbacks_enqueued, members, wait_callbacks, wait_settled


def flow_keys() -> Keys:
    """The keys the in-process ends take (the sharded run's group's)."""
    return get_keys()


def tags(cog: CogEnv) -> list[Any]:
    return [r["tag"] for r in cog.notes("runs")]


def wait_runs(cog: CogEnv, count: int) -> list[Any]:
    wait_for(lambda: len(tags(cog)) >= count, STALL_S, f"{count} runs", progress=lambda: len(tags(cog)))
    return tags(cog)


def test_g22_chain_hands_each_result_on_and_si_takes_none(cog: CogEnv) -> None:
    jid = chain(wf.add.s(1, 2), wf.double.s(), wf.add.si(10, 5), wf.double.s()).delay()
    first = decode(cog.redis.lindex(cog.key("queue:default"), 0))
    assert first["jid"] == jid and len(first["chain"]) == 3
    cog.start_worker()
    assert wait_runs(cog, 4) == [[1, 2], 3, [10, 5], 15]
    assert cog.redis.llen(cog.key("queue:default")) == 0


def test_g22_a_dead_step_stops_the_chain_and_its_retry_resumes_it(cog: CogEnv) -> None:
    chain(wf.add.s(1, 1), wf.dies_in_chain.s(), wf.double.s()).delay()
    cog.start_worker()
    wait_for(lambda: api.DeadSet().size == 1, STALL_S, "the dying step in dead")
    assert tags(cog) == [[1, 1], 2], "the chain stopped at its dead step"
    (entry,) = list(api.DeadSet())
    assert entry.payload["chain"][0]["name"] == wf.double.name, "the rest of the chain is in the dead entry"
    cog.redis.set(cog.key("test:heal"), "1")
    assert entry.retry()
    assert wait_runs(cog, 4) == [[1, 1], 2, 2, 102], "double(102): the healed step's result"


def test_g22_chord_body_gets_results_in_header_order_once(cog: CogEnv) -> None:
    bid = chord(group(wf.member.s(i) for i in range(30)), wf.collect.s("body")).delay()
    cog.start_worker()
    cog.start_worker()
    (body,) = wait_callbacks(cog, 1)
    assert body["results"] == list(range(30))
    assert body["jid"] == f"{bid}-success" and body["bid"] == bid and body["event"] == "success"
    wait_settled(cog, bid)
    assert len(cog.notes("callbacks")) == 1


def test_g22_a_dead_chord_member_means_no_body_and_on_death(cog: CogEnv) -> None:
    bid = chord(
        [wf.member.s(1), wf.die.s(2), wf.member.s(3)],
        wf.collect.s("body"),
        on_death=wf.callback.s("dead"),
        on_settled=wf.callback.s("fin"),
    ).delay()
    cog.start_worker()
    wait_settled(cog, bid)
    runs = wait_callbacks(cog, 2)
    assert sorted(r["tag"] for r in runs) == ["dead", "fin"]
    assert "fired:success" not in batch_hash(cog, bid)


def test_a_result_too_large_fails_the_member_clearly(cog: CogEnv) -> None:
    cog.configure(BATCH_RESULT_MAX_BYTES=1000)
    chord([wf.huge.s(2000)], wf.collect.s("body")).delay()
    cog.start_worker()
    wait_for(lambda: api.RetrySet().size == 1, STALL_S, "the member in retry")
    (entry,) = list(api.RetrySet())
    assert "more than BATCH_RESULT_MAX_BYTES (1000)" in entry.payload["error_message"]
    assert entry.payload["error_class"].endswith("ResultRefused")


def test_g22_a_chain_keeps_its_batch_open_until_its_last_step(cog: CogEnv) -> None:
    with batch(on_settled=wf.callback.s("fin")) as b:
        chain(wf.add.s(1, 1), wf.double.s(), wf.double.s()).delay()
    cog.start_worker()
    (fin,) = wait_callbacks(cog, 1)
    assert tags(cog) == [[1, 1], 2, 4]
    assert fin["at"] >= max(r["at"] for r in cog.notes("runs"))
    assert len(members(cog, b.bid, "succeeded")) == 3


def test_g22_a_second_completion_of_a_member_changes_nothing(cog: CogEnv) -> None:
    """A re-run's completion (the same raw payload acknowledged again, found
    on a list again) moves nothing and fires nothing twice."""
    with batch(on_success=wf.callback.s("ok"), on_settled=wf.callback.s("fin")) as b:
        jobs.record.delay("only")
    client, keys = get_redis(), flow_keys()
    inprogress = keys.inprogress("test-identity")
    raw = client.rpop(keys.queue("default"))
    for _ in range(2):
        client.lpush(inprogress, raw)
        work = UnitOfWork("default", raw)
        settle_flow(client, keys, get_config(), inprogress, work, ACK, work.payload())
        assert members(cog, b.bid, "succeeded") == {work.jid}
        assert len(callbacks_enqueued(cog, b.bid)) == 2, "on_success and on_settled, once"
    state = batch_hash(cog, b.bid)
    assert {"fired:success", "fired:complete", "fired:settled"} <= set(state)


def test_g22_g18_a_late_end_of_a_job_no_longer_ours_changes_nothing(cog: CogEnv) -> None:
    """A revived process's end of a member that recovery took from it: not
    on its list any more, so neither the ack nor the batch's move happens."""
    with batch(on_settled=wf.callback.s("fin")) as b:
        jobs.record.delay("taken back")
    client, keys = get_redis(), flow_keys()
    raw = client.lindex(keys.queue("default"), 0)
    work = UnitOfWork("default", raw)
    settle_flow(client, keys, get_config(), keys.inprogress("revived"), work, ACK, work.payload())
    assert members(cog, b.bid, "pending") == {work.jid}
    assert callbacks_enqueued(cog, b.bid) == [] and "fired:settled" not in batch_hash(cog, b.bid)


def test_a_plain_jobs_worker_path_sends_no_workflow_call(cog: CogEnv) -> None:
    """200 plain jobs: no ack.lua per job (their acks ride the fetches),
    no file.lua, no command on a batch key."""
    seen: list[str] = []
    stop = threading.Event()
    monitor_client = redis.Redis.from_url(cog.url).connection_pool.get_connection()
    monitor_client.send_command("MONITOR")
    monitor_client.read_response()

    def watch() -> None:
        while not stop.is_set():
            if monitor_client.can_read(timeout=0.1):
                seen.append(str(monitor_client.read_response()))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        jobs.record.delay_many([((i,), {}) for i in range(200)])
        cog.start_worker()
        wait_runs(cog, 200)
        wait_for(lambda: cog.redis.llen(cog.key("queue:default")) == 0, STALL_S, "the queue drained")
    finally:
        stop.set()
        watcher.join(5)
        monitor_client.disconnect()
    # Ours only: with a shared server, other tests' workers file and ack too.
    ours = [line for line in seen if cog.namespace in line]
    acks = sum(1 for line in ours if script("ack").sha in line)
    assert acks <= 10, f"{acks} ack.lua calls for 200 plain jobs"
    assert not any(script("file").sha in line for line in ours)
    # The poller's pass forgets old batches (one ZREMRANGEBYSCORE a pass, not a job).
    assert [line for line in ours if ":batch" in line and "ZREMRANGEBYSCORE" not in line] == []


def test_g22_basic_fetch_moves_members_and_chains_too(cog: CogEnv) -> None:
    with batch(on_settled=wf.callback.s("fin")) as b:
        chain(wf.add.s(1, 1), wf.double.s()).delay()
        wf.member.delay("m")
    cog.start_worker(FETCH="basic")
    assert [r["tag"] for r in wait_callbacks(cog, 1)] == ["fin"]
    assert sorted(map(str, tags(cog))) == sorted(map(str, [[1, 1], 2, "m"]))
    assert len(members(cog, b.bid, "succeeded")) == 3


def test_g22_async_def_steps_and_members_hand_their_results_on(cog: CogEnv) -> None:
    from testproject.testapp import async_jobs

    with batch(on_settled=wf.callback.s("fin")) as b:
        chain(wf.add.s(1, 2), async_jobs.adouble.s(), wf.double.s()).delay()
    bid = chord([async_jobs.adouble.s(i) for i in range(10, 15)], wf.collect.s("body")).delay()
    cog.start_worker(env={"COGWORKER_TEST_ASYNC_JOBS": "1"})
    runs = wait_callbacks(cog, 2)
    wait_settled(cog, b.bid)
    by_tag = {r["tag"]: r for r in runs}
    assert by_tag["body"]["results"] == [20, 22, 24, 26, 28] and by_tag["body"]["bid"] == bid
    assert [t for t in tags(cog) if t in (3, 6)] == [3, 6], "add -> adouble(3) -> double(6)"
    assert len(members(cog, b.bid, "succeeded")) == 3


def test_g22_a_dead_step_retried_after_its_batch_settled_still_resumes_its_chain(cog: CogEnv) -> None:
    with batch(on_death=wf.callback.s("dead"), on_settled=wf.callback.s("fin")) as b:
        chain(wf.dies_in_chain.s(1), wf.double.s()).delay()
    cog.start_worker()
    wait_settled(cog, b.bid)
    assert sorted(r["tag"] for r in wait_callbacks(cog, 2)) == ["dead", "fin"]
    cog.redis.set(cog.key("test:heal"), "1")
    (entry,) = list(api.DeadSet())
    assert entry.retry()
    assert wait_runs(cog, 3) == [1, 1, 101], "double(101) ran: the chain resumed"
    assert len(members(cog, b.bid, "members")) == 1, "a settled batch takes no new member"
    assert len(cog.notes("callbacks")) == 2, "nothing fires again"


def test_drain_runs_batches_and_chains_as_a_worker_does(cog: CogEnv) -> None:
    from django_cogworker.testing import drain

    with batch(on_success=wf.callback.s("ok"), on_settled=wf.callback.s("fin")) as b:
        chain(wf.add.s(1, 2), wf.double.s()).delay()
        wf.member.delay("m")
    bid = chord([wf.member.s(i) for i in range(3)], wf.collect.s("body")).delay()
    drain(include_scheduled=True)
    assert batch_hash(cog, b.bid).get("settled_at")
    by_tag = {r["tag"]: r for r in cog.notes("callbacks")}
    assert set(by_tag) == {"ok", "fin", "body"} and by_tag["body"]["results"] == [0, 1, 2]
    assert by_tag["body"]["bid"] == bid
    assert [t for t in tags(cog) if t in ([1, 2], 3)] == [[1, 2], 3]
