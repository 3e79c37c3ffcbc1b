"""``api.Limit`` (SPEC section 14) against a real Redis: the figures the
admission scripts leave, the limit changed at once (``set``, ``reset``),
whatever garbage Redis holds, Redis down; and, with a real worker process,
a raised limit starting waiters at once and a limit of 0 holding starts
back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from django_cogworker import api, limits
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import RedisRefused, RedisUnavailable
from django_cogworker.limits import state
from django_cogworker.payload import encode
from testproject.testapp import jobs, limited_jobs
from tests.conftest import wait_for

IDENTITY = "host:1:aaaa1111"


def admit(limiter: limits.Limiter, jid: str, queue: str = "default", identity: str = IDENTITY) -> bool:
    """A job's start under ``limiter``, through the worker's own script: held,
    or parked on the limiter's waiting list of ``queue``."""
    raw = encode({"jid": jid, "job": "app.sync", "args": [jid], "kwargs": {}, "queue": queue})
    k = get_keys()
    answer = state.admit(
        get_redis(), k, k.inprogress(identity), identity, raw, jid, queue, (limiter,), listed=False
    )
    return answer.admitted


def queue_jids(cog: Any, queue: str = "default") -> list[str]:
    return [json.loads(raw)["jid"] for raw in cog.redis.lrange(cog.key(f"queue:{queue}"), 0, -1)]


# -- reading ------------------------------------------------------------------------------


def test_a_limiter_never_used_reads_as_unknown_and_empty(cog):
    erp = api.Limit("never-used")
    assert (erp.kind, erp.limit, erp.holders, erp.waiting) == (None, None, 0, 0)
    assert erp.holder_jobs() == [] and erp.waiting_jobs() == []
    assert erp.figures().malformed == ()
    assert api.Limit.all() == []


def test_concurrency_figures_are_what_admission_left(cog):
    erp = limits.Concurrency("erp", 2)
    held = [admit(erp, f"j{i}", "default") for i in range(2)]
    parked = [admit(erp, f"d{i}", "default") for i in range(3)] + [
        admit(erp, f"m{i}", "mail") for i in range(2)
    ]
    assert held == [True, True] and not any(parked)

    limit = api.Limit("erp")
    figures = limit.figures()
    assert (figures.kind, figures.declared, figures.override, figures.limit) == ("concurrency", 2, None, 2)
    assert (limit.holders, limit.waiting) == (2, 5)
    assert limit.holder_jobs() == [("j0", IDENTITY), ("j1", IDENTITY)]
    # Queues by name, each oldest first: the order they are let in.
    assert [r.jid for r in limit.waiting_jobs()] == ["d0", "d1", "d2", "m0", "m1"]
    assert [r.jid for r in limit.waiting_jobs(2, 2)] == ["d2", "m0"]
    assert [r.jid for r in limit.waiting_jobs(4, 10)] == ["m1"]
    assert limit.waiting_jobs(5) == [] and limit.waiting_jobs(0, 0) == []
    assert limit.waiting_jobs()[0].name == "app.sync"
    assert api.Limit.all() == [api.Limit("erp")]


def test_a_rates_holders_are_its_starts_in_the_window_on_redis_clock(cog):
    stripe = limits.Rate("stripe", 3, per=1)
    assert [admit(stripe, f"s{i}") for i in range(4)] == [True, True, True, False]
    limit = api.Limit("stripe")
    figures = limit.figures()
    assert (figures.kind, figures.per_s, figures.limit, figures.waiting) == ("rate", 1.0, 3, 1)
    assert figures.holders == 3
    assert limit.holder_jobs() == [("s0", ""), ("s1", ""), ("s2", "")]
    # The window moves on: no start is in it any more.
    wait_for(lambda: api.Limit("stripe").holders == 0, 10, "the rate's window to empty")
    assert api.Limit("stripe").holder_jobs() == []


def test_all_lists_the_registry_by_name_with_figures_of_each(cog):
    admit(limits.Rate("b-rate", 5, per=2), "r1")
    admit(limits.Concurrency("a-conc", 1), "c1")
    admit(limits.for_queue("reports", 1), "q1", "reports")
    listed = api.Limit.all()
    assert [limit.name for limit in listed] == ["a-conc", "b-rate", "queue:reports"]
    assert listed.skipped == []
    figures = api.limit_figures(listed)
    assert [(f.kind, f.limit, f.holders) for f in figures] == [
        ("concurrency", 1, 1),
        ("rate", 5, 1),
        ("concurrency", 1, 1),
    ]


# -- changing the limit -----------------------------------------------------------------------


def test_set_changes_the_limit_at_once_and_raising_it_lets_waiters_in(cog):
    erp = limits.Concurrency("erp", 2)
    for i in range(5):
        admit(erp, f"j{i}")
    limit = api.Limit("erp")
    assert limit.waiting == 3

    assert limit.set(3) == 1  # one more slot: the oldest waiter is back on its queue
    assert cog.redis.get(cog.key("limit:erp:max")) == b"3"
    assert (limit.limit, limit.figures().override, limit.figures().declared) == (3, 3, 2)
    assert (limit.waiting, queue_jids(cog)) == (2, ["j2"])
    # Its slot is kept for it: a newcomer is refused, the waiter gets in.
    assert admit(erp, "newcomer") is False
    assert admit(erp, "j2") is True

    assert limit.set(0) == 0
    assert limit.limit == 0 and admit(erp, "j3-again") is False
    assert limit.reset() == 0  # back to 2, and 3 hold a slot: no room
    assert cog.redis.exists(cog.key("limit:erp:max")) == 0
    assert (limit.limit, limit.figures().override) == (2, None)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None, 2**63])
def test_set_refuses_anything_but_a_whole_number_and_writes_nothing(cog, bad):
    with pytest.raises(ValueError, match="a limit must be a whole number >= 0"):
        api.Limit("erp").set(bad)
    assert cog.redis.exists(cog.key("limit:erp:max")) == 0


@pytest.mark.parametrize("bad", ["", "x" * 201, "\ud800", "a\nb", 3, None])
def test_a_name_no_limiter_can_have_is_a_clear_error(cog, bad):
    with pytest.raises(ValueError, match="limiter"):
        api.Limit(bad)


# -- whatever Redis holds -----------------------------------------------------------------


def test_registry_entries_that_are_no_limiters_name_are_skipped_with_a_note(cog):
    specs = {"fine": '{"kind": "concurrency", "n": 2}'}
    cog.redis.hset(cog.key("limits"), mapping=specs)
    for name in (b"\xff\xfe", b"\xed\xa0\x80", b"bad\nname", b"x" * 201, b""):
        cog.redis.hset(cog.key("limits"), name, specs["fine"])
    listed = api.Limit.all()
    assert listed == [api.Limit("fine")]
    assert len(listed.skipped) == 5
    assert any("not UTF-8" in note for note in listed.skipped)

    cog.redis.delete(cog.key("limits"))
    cog.redis.set(cog.key("limits"), "not a hash")
    listed = api.Limit.all()
    assert listed == [] and "is not a hash" in listed.skipped[0]
    figures = api.Limit("fine").figures()
    assert figures.kind is None and "is not a hash" in figures.malformed[0]


@pytest.mark.parametrize(
    "spec",
    [
        "not json",
        '{"kind": "rate", "n": 3}',  # no per
        '{"kind": "concurrency", "n": -1}',
        '{"kind": "concurrency", "n": "2"}',
        "[" * 100_000,
        b"\xff",
    ],
)
def test_an_unreadable_spec_reads_as_an_unknown_kind(cog, spec):
    cog.redis.hset(cog.key("limits"), "erp", spec)
    figures = api.Limit("erp").figures()
    assert (figures.kind, figures.declared, figures.limit) == (None, None, None)
    assert "cannot be read" in figures.malformed[0]


@pytest.mark.parametrize("override", ["abc", "2.5", "-1", " 3", "99999999999999999999999"])
def test_an_override_that_is_no_whole_number_is_noted_and_not_in_force(cog, override):
    cog.redis.hset(cog.key("limits"), "erp", '{"kind": "concurrency", "n": 2}')
    cog.redis.set(cog.key("limit:erp:max"), override)
    figures = api.Limit("erp").figures()
    assert (figures.override, figures.limit) == (None, 2)
    assert "not a whole number" in figures.malformed[0]


def test_keys_of_the_wrong_type_read_as_empty_with_a_note(cog):
    cog.redis.hset(cog.key("limits"), "erp", '{"kind": "concurrency", "n": 2}')
    cog.redis.hset(cog.key("limits"), "rate", '{"kind": "rate", "n": 2, "per": 1}')
    cog.redis.rpush(cog.key("limit:erp:max"), "3")
    cog.redis.set(cog.key("limit:erp:holders"), "x")
    cog.redis.sadd(cog.key("limit:erp:queues"), "default", "mail", b"\xff")
    cog.redis.set(cog.key("limit:erp:waiting:default"), "x")
    cog.redis.rpush(cog.key("limit:erp:waiting:mail"), "not json", encode({"jid": "m1"}))
    cog.redis.set(cog.key("limit:rate:starts"), "x")
    cog.redis.set(cog.key("limit:rate:queues"), "x")

    erp, rate = api.limit_figures([api.Limit("erp"), api.Limit("rate")])
    assert (erp.kind, erp.limit, erp.holders, erp.waiting) == ("concurrency", 2, 0, 2)
    assert len(erp.malformed) == 4, erp.malformed  # max, holders, a queue name, a waiting list
    assert (rate.kind, rate.holders, rate.waiting) == ("rate", 0, 0)
    assert len(rate.malformed) == 2, rate.malformed
    assert api.Limit("erp").holder_jobs() == [] and api.Limit("rate").holder_jobs() == []
    waiting = api.Limit("erp").waiting_jobs()
    assert [r.jid for r in waiting] == ["", "m1"] and waiting[0].unreadable

    # A key of the wrong type where the wake reads: a clear error, the override written.
    with pytest.raises(RedisRefused, match="waiting jobs in \\(its limit is changed\\)"):
        api.Limit("rate").set(5)
    assert api.Limit("rate").limit == 5


def test_redis_down_is_a_clear_error(cog, own_redis):
    server = own_redis()
    server.stop()
    for read in (
        api.Limit.all,
        lambda: api.Limit("erp").holders,
        lambda: api.Limit("erp").holder_jobs(),
        lambda: api.Limit("erp").waiting_jobs(),
        lambda: api.Limit("erp").set(3),
    ):
        with pytest.raises(RedisUnavailable):
            read()


# -- with a real worker -------------------------------------------------------------------


def test_a_raised_limit_starts_waiters_at_once_and_zero_holds_starts_back(cog):
    """``set(3)`` while jobs wait: a third starts with no holder ending (the
    gauge of jobs running at once reaches 3, which no release could do
    under 2); ``set(0)``: once the holders end, nothing starts while the
    worker runs other jobs; raised again, the rest run."""
    worker = cog.start_worker(CONCURRENCY=5)
    worker.identity()
    for i in range(7):
        limited_jobs.erp_sync.delay(3.0, i)
    erp = api.Limit("erp")
    started = lambda: len(cog.notes("started"))  # noqa: E731
    ran = lambda: len(cog.notes("runs"))  # noqa: E731
    wait_for(lambda: erp.holders == 2 and erp.waiting > 0, 20, "two holders and jobs waiting", started)

    erp.set(3)
    wait_for(lambda: cog.redis.get(cog.key("test:gauge:erp:max")) == b"3", 10, "three running at once")

    erp.set(0)
    # A waiter let in just before is refused at its fetch and waits again.
    wait_for(lambda: erp.holders == 0 and started() + erp.waiting == 7, 20, "the holders to end", ran)
    held_back, waiting = started(), erp.waiting
    assert waiting > 0
    # The worker fetches and runs other jobs meanwhile, and lets no waiter start.
    for tag in range(3):
        jobs.record.delay(f"plain-{tag}")
    wait_for(lambda: ran() == held_back + 3, 20, "the plain jobs to run")
    assert (started(), erp.waiting, erp.holders) == (held_back, waiting, 0)

    erp.set(2)
    wait_for(lambda: ran() == 7 + 3, 30, "every job to run", ran)
    assert cog.redis.get(cog.key("test:gauge:erp:max")) == b"3"
    assert cog.redis.get(cog.key("stat:failed")) in (None, b"0")
    assert worker.alive()
