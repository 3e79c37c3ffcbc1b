"""Batches (SPEC section 13, G22) with real worker processes on a real
Redis: members pushed all or none at the block's exit, each callback
enqueued once with the jid ``<bid>-<event>`` and only when its condition
is true, child batches, ``current_batch()`` and ``.add()``.

Chains and chords are in ``tests/test_chains.py``; faults (SIGKILL,
SIGSTOP, admin retries under load) in ``tests/test_batches_chaos.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import transaction

from django_cogworker import api, batch, current_batch
from testproject.testapp import jobs
from testproject.testapp import workflow_jobs as wf
from tests.conftest import CogEnv, wait_for

#: How long a wait may go without a job making progress.
STALL_S = 30


def notes(cog: CogEnv, kind: str) -> list[dict[str, Any]]:
    return cog.notes(kind)


def wait_callbacks(cog: CogEnv, count: int) -> list[dict[str, Any]]:
    wait_for(
        lambda: len(notes(cog, "callbacks")) >= count,
        STALL_S,
        f"{count} callback run(s)",
        progress=lambda: cog.redis.llen(cog.key("test:runs")),
    )
    return notes(cog, "callbacks")


def batch_hash(cog: CogEnv, bid: str) -> dict[str, str]:
    raw = cog.redis.hgetall(cog.key(f"batch:{bid}"))
    return {k.decode(): v.decode() for k, v in raw.items() if not k.startswith(b"cb:") and k != b"body"}


def members(cog: CogEnv, bid: str, part: str) -> set[str]:
    return {m.decode() for m in cog.redis.smembers(cog.key(f"batch:{bid}:{part}"))}


def wait_settled(cog: CogEnv, bid: str) -> dict[str, str]:
    wait_for(
        lambda: "settled_at" in batch_hash(cog, bid),
        STALL_S,
        f"batch {bid} settled",
        progress=lambda: cog.redis.llen(cog.key("test:runs")),
    )
    return batch_hash(cog, bid)


def callbacks_enqueued(cog: CogEnv, bid: str) -> list[str]:
    """The jids of ``bid``'s callbacks enqueued and not yet run: in
    ``N:schedule``, due now (the poller moves them), or under SHARDING
    already forwarded onto their queue."""
    raws = [*cog.redis.zrange(cog.key("schedule"), 0, -1), *cog.redis.lrange(cog.key("queue:default"), 0, -1)]
    return sorted(jid for jid in (json.loads(raw)["jid"] for raw in raws) if jid.startswith(f"{bid}-"))


def queued(cog: CogEnv, queue: str = "default") -> int:
    return int(cog.redis.llen(cog.key(f"queue:{queue}")))


def callbacks(**chosen: str) -> dict[str, Any]:
    return {f"on_{event}": wf.callback.s(tag) for event, tag in chosen.items()}


def test_g22_members_pushed_at_exit_and_each_callback_once(cog: CogEnv) -> None:
    with batch(
        description="import #7", **callbacks(success="ok", complete="done", death="dead", settled="fin")
    ) as b:
        for i in range(20):
            wf.member.delay(i)
        assert queued(cog) == 0, "members are pushed at the block's exit, not before"
    assert queued(cog) == 20
    assert members(cog, b.bid, "pending") == members(cog, b.bid, "members")
    cog.start_worker()
    runs = wait_callbacks(cog, 3)
    state = wait_settled(cog, b.bid)
    assert sorted(r["tag"] for r in notes(cog, "runs")) == list(range(20))
    assert {r["bid"] for r in notes(cog, "runs")} == {b.bid}
    assert {r["event"] for r in notes(cog, "runs")} == {None}
    by_tag = {r["tag"]: r for r in runs}
    assert set(by_tag) == {"ok", "done", "fin"}, "no death: on_death never fires"
    for event, tag in (("success", "ok"), ("complete", "done"), ("settled", "fin")):
        assert by_tag[tag]["jid"] == f"{b.bid}-{event}"
        assert by_tag[tag]["event"] == event and by_tag[tag]["bid"] == b.bid
        assert f"fired:{event}" in state
    assert "fired:death" not in state
    last_member = max(r["at"] for r in notes(cog, "runs"))
    assert min(r["at"] for r in runs) >= last_member
    assert state["description"] == "import #7"
    assert len(members(cog, b.bid, "succeeded")) == 20
    assert members(cog, b.bid, "pending") == set()
    assert len(notes(cog, "callbacks")) == 3
    ttl = cog.redis.ttl(cog.key(f"batch:{b.bid}"))
    assert 0 < ttl <= 7 * 24 * 3600, "a settled batch is kept BATCH_DONE_TTL"


def test_g22_empty_batch_fires_at_its_exit(cog: CogEnv) -> None:
    with batch(**callbacks(success="ok", complete="done", settled="fin")) as b:
        pass
    state = batch_hash(cog, b.bid)
    assert {"fired:success", "fired:complete", "fired:settled", "settled_at"} <= set(state)
    cog.start_worker()
    runs = wait_callbacks(cog, 3)
    expected = sorted(f"{b.bid}-{event}" for event in ("complete", "settled", "success"))
    assert sorted(r["jid"] for r in runs) == expected


def test_a_block_that_raises_pushes_nothing(cog: CogEnv) -> None:
    with pytest.raises(RuntimeError), batch(**callbacks(settled="fin")):
        wf.member.delay(1)
        raise RuntimeError("stop")
    assert queued(cog) == 0
    assert list(cog.redis.scan_iter(match=cog.key("batch*"))) == []


@pytest.mark.django_db(transaction=True)
def test_inside_atomic_pushed_on_commit_nothing_on_rollback(cog: CogEnv) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        with batch(**callbacks(settled="fin")):
            wf.member.delay("rolled back")
        raise RuntimeError("rollback")
    assert queued(cog) == 0 and list(cog.redis.scan_iter(match=cog.key("batch*"))) == []
    with transaction.atomic():
        with batch(**callbacks(settled="fin")) as b:
            wf.member.delay("committed")
        assert queued(cog) == 0, "pushed after the commit"
    assert queued(cog) == 1
    assert members(cog, b.bid, "pending") == members(cog, b.bid, "members")


def test_g22_deaths_fire_on_death_and_settled_never_success(cog: CogEnv) -> None:
    with batch(**callbacks(success="ok", complete="done", death="dead", settled="fin")) as b:
        wf.die.delay("a")
        wf.die.delay("b")
        wf.member.delay("c")
    cog.start_worker()
    wait_settled(cog, b.bid)
    runs = wait_callbacks(cog, 3)
    assert sorted(r["tag"] for r in runs) == ["dead", "done", "fin"]
    assert len(members(cog, b.bid, "dead")) == 2
    assert len(members(cog, b.bid, "succeeded")) == 1


def test_g22_failure_then_success_complete_before_success(cog: CogEnv) -> None:
    """complete fires once every member has run once (a failure counts);
    success and settled only after the retry succeeded."""
    cog.configure(POLL_INTERVAL=5)  # the retry waits: complete is seen first
    with batch(**callbacks(success="ok", complete="done", settled="fin")) as b:
        wf.fail_times.delay("flaky", 1)
    cog.start_worker(POLL_INTERVAL=0.2)
    wait_settled(cog, b.bid)
    runs = wait_callbacks(cog, 3)
    state = batch_hash(cog, b.bid)
    assert float(state["fired:complete"]) < float(state["fired:success"])
    assert sorted(r["tag"] for r in runs) == ["done", "fin", "ok"]


def test_current_batch_outside_is_none_and_description_inside(cog: CogEnv) -> None:
    assert current_batch() is None
    with batch(description="described") as b:
        wf.described.delay("x")
    cog.start_worker()
    wait_settled(cog, b.bid)
    (run,) = notes(cog, "runs")
    assert run["description"] == "described" and run["bid"] == b.bid and run["event"] is None


def test_g22_add_from_a_running_member(cog: CogEnv) -> None:
    with batch(**callbacks(settled="fin")) as b:
        wf.fan_out.delay("fan", 5)
    cog.start_worker()
    wait_settled(cog, b.bid)
    wait_callbacks(cog, 1)
    assert len(members(cog, b.bid, "members")) == 6
    assert len(members(cog, b.bid, "succeeded")) == 6
    fin_at = notes(cog, "callbacks")[0]["at"]
    assert all(r["at"] <= fin_at for r in notes(cog, "runs"))


def test_g22_child_batches_settle_before_their_parent(cog: CogEnv) -> None:
    with batch(**callbacks(settled="parent-fin")) as parent:
        wf.open_child.delay("m", 3)
        with batch(**callbacks(settled="nested-fin")) as nested:
            wf.member.delay("nested-0")
    assert f"b:{nested.bid}" in members(cog, parent.bid, "pending")
    cog.start_worker()
    wait_settled(cog, parent.bid)
    runs = wait_callbacks(cog, 3)
    by_tag = {r["tag"]: r for r in runs}
    assert set(by_tag) == {"parent-fin", "nested-fin", "m-child-settled"}
    assert by_tag["parent-fin"]["at"] >= max(r["at"] for r in notes(cog, "runs"))
    children = [m for m in members(cog, parent.bid, "succeeded") if m.startswith("b:")]
    assert len(children) == 2


def test_g22_a_child_with_a_death_is_a_dead_member_of_its_parent(cog: CogEnv) -> None:
    with (
        batch(**callbacks(success="parent-ok", death="parent-dead", settled="parent-fin")) as parent,
        batch() as child,
    ):
        wf.die.delay("x")
    cog.start_worker()
    wait_settled(cog, parent.bid)
    runs = wait_callbacks(cog, 2)
    assert sorted(r["tag"] for r in runs) == ["parent-dead", "parent-fin"]
    assert members(cog, parent.bid, "dead") == {f"b:{child.bid}"}


def test_g22_a_large_batch_is_pushed_in_chunks_and_fires_only_after_the_last(cog: CogEnv) -> None:
    with batch(**callbacks(settled="fin")) as b:
        jobs_many = [((i,), {}) for i in range(2500)]
        wf.member.delay_many(jobs_many)
    assert queued(cog) == 2500
    assert len(members(cog, b.bid, "members")) == 2500
    assert members(cog, b.bid, "pending") == members(cog, b.bid, "members"), "no ':open' left behind"
    assert "fired:complete" not in batch_hash(cog, b.bid)
    assert cog.redis.zscore(cog.key("batches"), b.bid) is not None


def test_g22_an_open_batch_is_kept_batch_ttl_renewed_by_each_end(cog: CogEnv) -> None:
    cog.configure(BATCH_TTL=1000, BATCH_DONE_TTL=100)
    with batch() as parent, batch() as child:
        wf.member.delay("now")
        slow = jobs.record.delay_in(3600, "later")
    for bid in (parent.bid, child.bid):
        assert 990 < cog.redis.ttl(cog.key(f"batch:{bid}")) <= 1000
        cog.redis.expire(cog.key(f"batch:{bid}"), 500)
    cog.start_worker()
    wait_for(lambda: len(members(cog, child.bid, "succeeded")) == 1, STALL_S, "the first member's end")
    for bid in (parent.bid, child.bid):
        assert cog.redis.ttl(cog.key(f"batch:{bid}")) > 900, "renewed, the parent's too"
    assert members(cog, child.bid, "pending") == {slow}
    assert next(e for e in api.ScheduledSet() if e.jid == slow).retry()
    wait_settled(cog, parent.bid)
    assert 90 < cog.redis.ttl(cog.key(f"batch:{parent.bid}")) <= 100, "settled: BATCH_DONE_TTL"


def test_g22_a_batch_and_the_children_of_its_block_open_in_one_call(
    cog: CogEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_cogworker.workflows import state

    calls: list[int] = []
    real = state.open_sections

    def counted(*args: Any) -> int:
        calls.append(len(args[3]))
        return real(*args)

    monkeypatch.setattr(state, "open_sections", counted)
    with batch(**callbacks(settled="fin")) as parent:
        p = wf.member.delay("p")
        with batch() as empty_child:
            pass
        with batch() as child:
            wf.member.delay("c")
    assert calls == [3], "one call, one section per batch"
    assert "settled_at" in batch_hash(cog, empty_child.bid)
    assert members(cog, parent.bid, "succeeded") == {f"b:{empty_child.bid}"}
    assert members(cog, parent.bid, "pending") == {f"b:{child.bid}", p}
