"""Each step of a limiter under ``SHARDING`` (``limits/sharded.py``), in
this process, on one plain redis-server with the slot guard recording
every script call: a limiter's keys in ``{N}``, the jobs' lists in their
group's slot, and no call mixing the two. The faults a step between two
calls can meet are made to happen here: a job gone from the head of its
line between a wake's read and its move, a recovering process that dies
between the requeue of a dead holder's jobs and the freeing of its slots,
a limiter's note of its waiting queues dropped by a race. The same steps
in real workers on a real cluster: ``tests/test_sharded_limits.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_cogworker import limits
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.keys import Keys
from django_cogworker.limits import sharded as sharded_steps
from django_cogworker.limits import state
from django_cogworker.payload import encode
from django_cogworker.requeue import requeue_list
from tests.conftest import CogEnv
from tests.test_sharded_layout import sharded  # noqa: F401

ERP = limits.Concurrency("erp", 1)
HOLDER = "host:1:aaaa1111"
OTHER = "host:2:bbbb2222"


@pytest.fixture
def guarded(sharded: Path) -> Iterator[Path]:  # noqa: F811
    """The sharded layout with the slot guard (``tests/test_sharded_layout.py``):
    no script call of the test may span two slots."""
    yield sharded
    calls = [json.loads(line) for line in sharded.read_text().splitlines()]
    assert [c for c in calls if "keys" in c] == [], "a script call spanned two slots"


def job(jid: str, queue: str = "default") -> bytes:
    return encode({"jid": jid, "job": "app.sync", "args": [jid], "kwargs": {}, "queue": queue})


def fetched(group: Keys, identity: str, raw: bytes) -> None:
    """As a fetch leaves it: on the process's in-progress list."""
    get_redis().lpush(group.inprogress(identity), raw)


def admit(jid: str, queue: str = "default", identity: str = HOLDER) -> state.Admission:
    group, raw = get_keys().for_queue(queue), job(jid, queue)
    fetched(group, identity, raw)
    return state.admit(get_redis(), group, group.inprogress(identity), identity, raw, jid, queue, (ERP,))


def jids(key: str) -> list[str]:
    return [json.loads(raw)["jid"] for raw in get_redis().lrange(key, 0, -1)]


def test_g23_sharded_over_the_limit_a_job_waits_in_its_group_and_a_release_lets_the_next_in(
    cog: CogEnv, guarded: Path
) -> None:
    k, r = get_keys(), get_redis()
    default, mail = k.for_queue("default"), k.for_queue("mail_bulk")
    assert admit("a").admitted
    over = admit("b", "mail_bulk", OTHER)
    assert (over.admitted, over.name, over.ours) == (False, "erp", True)
    # Off the in-progress list and in its group's line, noted on both sides.
    assert jids(mail.inprogress(OTHER)) == []
    assert jids(mail.limit_waiting("erp", "mail_bulk")) == ["b"]
    assert r.hgetall(mail.limit_waiters) == {b"erp\0mail_bulk": ERP.spec().encode()}
    assert r.smembers(k.limit("erp", "queues")) == {b"mail_bulk"}
    assert r.hgetall(k.limit("erp", "holders")) == {b"a": HOLDER.encode()}

    # The holder's end frees its slot first; the wake reserves it for the
    # waiter, then moves the waiter onto its queue.
    assert state.release(r, default, HOLDER, "a", "default", (ERP,)) == 0
    assert r.hlen(k.limit("erp", "holders")) == 0
    assert jids(mail.queue("mail_bulk")) == ["b"]
    assert r.zrange(k.limit("erp", "promoted"), 0, -1) == [b"b"]
    assert not r.exists(mail.limit_waiters) and not r.exists(k.limit("erp", "queues"))
    # A newcomer finds the slot reserved; the promoted job takes it.
    assert not admit("c").admitted
    raw = r.rpop(mail.queue("mail_bulk"))
    fetched(mail, OTHER, raw)
    answer = state.admit(r, mail, mail.inprogress(OTHER), OTHER, raw, "b", "mail_bulk", (ERP,))
    assert answer.admitted and r.zcard(k.limit("erp", "promoted")) == 0
    assert jids(default.limit_waiting("erp", "default")) == ["c"]


def test_g23_sharded_a_job_no_longer_on_its_list_is_neither_admitted_nor_parked(
    cog: CogEnv, guarded: Path
) -> None:
    k, r = get_keys(), get_redis()
    group = k.for_queue("default")
    answer = state.admit(r, group, group.inprogress(HOLDER), HOLDER, job("gone"), "gone", "default", (ERP,))
    assert (answer.admitted, answer.ours) == (False, False)
    assert r.hlen(k.limit("erp", "holders")) == 0
    assert not r.exists(group.limit_waiting("erp", "default"))


def test_g23_sharded_a_job_whose_code_met_a_full_limiter_goes_back_to_its_queue_or_in_line(
    cog: CogEnv, guarded: Path
) -> None:
    k, r = get_keys(), get_redis()
    group = k.for_queue("default")
    # Room by now: back on its queue, the end fetched next.
    fetched(group, HOLDER, job("p1"))
    assert state.park(r, group, group.inprogress(HOLDER), job("p1"), "p1", "default", ERP, True) is None
    assert jids(group.queue("default")) == ["p1"] and jids(group.inprogress(HOLDER)) == []
    # Full: in line, and at its head when it had been promoted (its turn kept).
    assert admit("holder", identity=OTHER).admitted
    fetched(group, HOLDER, job("p2"))
    assert state.park(r, group, group.inprogress(HOLDER), job("p2"), "p2", "default", ERP, True) == 0.0
    r.zadd(k.limit("erp", "promoted"), {"p3": 1e12})
    fetched(group, HOLDER, job("p3"))
    assert state.park(r, group, group.inprogress(HOLDER), job("p3"), "p3", "default", ERP, True) == 0.0
    assert jids(group.limit_waiting("erp", "default")) == ["p3", "p2"]
    assert r.zcard(k.limit("erp", "promoted")) == 0
    assert jids(group.inprogress(HOLDER)) == []


def test_g23_sharded_a_wake_drops_the_reservation_of_a_waiter_gone_from_the_head_meanwhile(
    cog: CogEnv, guarded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    k, r = get_keys(), get_redis()
    group = k.for_queue("default")
    assert admit("holder").admitted
    assert not admit("w1").admitted and not admit("w2").admitted
    r.hdel(k.limit("erp", "holders"), "holder")
    reserve = sharded_steps._reserve

    def raced(*args: Any) -> Any:
        reply = reserve(*args)
        r.lpop(group.limit_waiting("erp", "default"))  # another wake took w1 meanwhile
        return reply

    monkeypatch.setattr(sharded_steps, "_reserve", raced)
    assert state.wake(r, group, "erp", ERP) == (0, 0.0)
    assert r.zcard(k.limit("erp", "promoted")) == 0, "the reservation of the job not moved is dropped"
    assert jids(group.limit_waiting("erp", "default")) == ["w2"]
    monkeypatch.undo()
    assert state.wake(r, group, "erp", ERP) == (1, 0.0)
    assert jids(group.queue("default")) == ["w2"]
    assert r.zrange(k.limit("erp", "promoted"), 0, -1) == [b"w2"]


def test_g23_sharded_a_dead_holders_slots_are_freed_by_the_next_sweep_if_its_recoverer_died(
    cog: CogEnv, guarded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    k, r = get_keys(), get_redis()
    group = k.for_queue("default")
    assert admit("held").admitted
    assert not admit("waiter", identity=OTHER).admitted

    def died(*args: Any) -> None:
        raise ConnectionError("the recovering process died here")

    with monkeypatch.context() as patch:
        patch.setattr(sharded_steps, "free_owner", died)
        moved, _ = requeue_list(r, group, get_config(), HOLDER)
    assert moved == 1 and jids(group.queue("default")) == ["held"]
    # Its jobs are back, its slots still held: the group notes it.
    assert r.hlen(k.limit("erp", "holders")) == 1
    assert r.smembers(group.limits_freeing) == {HOLDER.encode()}
    state.sweep(r, group)
    assert r.hlen(k.limit("erp", "holders")) == 0 and not r.exists(k.limit_held(HOLDER))
    assert not r.exists(group.limits_freeing)
    # The waiter was let in with the slot freed: at the end fetched next.
    assert jids(group.queue("default")) == ["held", "waiter"]
    assert r.zrange(k.limit("erp", "promoted"), 0, -1) == [b"waiter"]


def test_g23_sharded_the_sweep_restores_a_queue_and_a_spec_the_limiters_side_lost(
    cog: CogEnv, guarded: Path
) -> None:
    k, r = get_keys(), get_redis()
    group = k.for_queue("mail")
    assert admit("holder").admitted
    assert not admit("lost", "mail", OTHER).admitted
    r.hdel(k.limit("erp", "holders"), "holder")
    r.delete(k.limit("erp", "queues"))
    r.hdel(k.limits, "erp")
    state.sweep(r, group)
    assert jids(group.queue("mail")) == ["lost"]
    assert r.hget(k.limits, "erp") == ERP.spec().encode()
    assert not r.exists(group.limit_waiters)


def test_g23_sharded_a_dead_holders_slot_is_freed_whatever_bytes_its_jid_holds(
    cog: CogEnv, guarded: Path
) -> None:
    """A hold whose jid is not UTF-8 (written by hand, or by another tool)
    is freed by its bytes, as the one-slot requeue frees it."""
    k, r = get_keys(), get_redis()
    group = k.for_queue("default")
    r.hset(k.limit("erp", "holders"), b"\xff\xfe", HOLDER)
    r.sadd(k.limit_held(HOLDER), b"erp\0\xff\xfe")
    assert admit("mine").admitted is False
    sharded_steps.free_owner(r, group, HOLDER)
    assert r.hlen(k.limit("erp", "holders")) == 0 and not r.exists(k.limit_held(HOLDER))
