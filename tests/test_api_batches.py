"""``api.Batch`` and ``api.BatchSet`` (SPEC section 13) against a real Redis:
the figures of a batch as its documented keys hold them (docs/redis-layout.md,
written here as the engine writes them), the members' places, the index
newest first and open first, deleting a batch, the sets filtered by batch;
whatever garbage Redis holds, and Redis down."""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_cogworker import api, batch
from django_cogworker.errors import BatchNotFound, CogworkerError, RedisUnavailable
from django_cogworker.payload import encode
from testproject.testapp import workflow_jobs as wf
from tests.conftest import wait_for

MEMBER = "testproject.testapp.jobs.record"


def member(jid: str, bid: str, **fields: Any) -> bytes:
    now = time.time()
    payload = {"jid": jid, "job": MEMBER, "args": [jid], "kwargs": {}, "queue": "default", "retry": 3}
    return encode({**payload, "bid": bid, "created_at": now - 60, "enqueued_at": now - 50, **fields})


def write_batch(
    cog: Any,
    bid: str,
    *,
    description: str = "import #7",
    created_at: float | None = None,
    pending: tuple[str, ...] = (),
    failed: tuple[str, ...] = (),
    succeeded: tuple[str, ...] = (),
    dead: tuple[str, ...] = (),
    callbacks: tuple[str, ...] = ("success", "settled"),
    fired: dict[str, float] | None = None,
    settled_at: float | None = None,
    open_: bool = False,
    parent: str = "",
    kind: str = "batch",
) -> None:
    """A batch as the engine leaves it in Redis (the design's keys)."""
    r, key = cog.redis, cog.key(f"batch:{bid}")
    created_at = time.time() - 120 if created_at is None else created_at
    fields: dict[str, Any] = {"description": description, "created_at": repr(created_at)}
    fields |= {"parent": parent, "kind": kind}
    for event in callbacks:
        job = {"jid": f"{bid}-{event}", "job": "app.notify", "args": [7], "kwargs": {}, "queue": "default"}
        fields[f"cb:{event}"] = encode({**job, "bid": bid, "cb": event})
    for event, at in (fired or {}).items():
        fields[f"fired:{event}"] = repr(at)
    if settled_at is not None:
        fields["settled_at"] = repr(settled_at)
    r.hset(key, mapping=fields)
    everyone = pending + failed + succeeded + dead
    if everyone:
        r.sadd(f"{key}:members", *everyone)
    for part, jids in (("pending", pending), ("failed", failed), ("succeeded", succeeded), ("dead", dead)):
        if jids:
            r.sadd(f"{key}:{part}", *jids)
    if open_:
        r.sadd(f"{key}:pending", ":open")
    r.zadd(cog.key("batches"), {bid: created_at})


def test_a_batch_reads_the_sizes_of_its_membership_sets(cog):
    now = time.time()
    write_batch(
        cog,
        "b1",
        pending=("p1", "p2", "p3"),
        failed=("f1", "f2"),
        succeeded=("s1", "s2", "s3", "s4"),
        dead=("d1",),
        fired={"death": now - 5},
        created_at=now - 300,
        callbacks=("success", "death", "settled"),
    )
    b = api.Batch("b1")
    assert (b.total, b.pending, b.failed, b.succeeded, b.dead) == (10, 5, 2, 4, 1)
    assert b.settled is False and b.fired == {"death": pytest.approx(now - 5)}
    assert b.description == "import #7" and b.created_at == pytest.approx(now - 300)
    assert b.pending_jids() == ["f1", "f2", "p1", "p2", "p3"]
    assert len(b.pending_jids(2)) == 2 and set(b.pending_jids(2)) < {"f1", "f2", "p1", "p2", "p3"}
    assert b.dead_jids() == ["d1"]
    by_event = {c.event: c for c in b.callbacks}
    assert list(by_event) == ["success", "death", "settled"]
    assert by_event["death"].fired_at == pytest.approx(now - 5) and by_event["success"].fired_at is None
    assert (by_event["settled"].jid, by_event["settled"].name, by_event["settled"].args) == (
        "b1-settled",
        "app.notify",
        [7],
    )
    figures = b.figures()
    assert figures.malformed == () and figures.done == 5 and figures.done_percent == 50.0
    assert figures.expires_in_s is None and repr(b) == "<Batch b1>" and b == api.Batch("b1")


def test_the_open_sentinel_is_no_member(cog):
    write_batch(cog, "b2", pending=("p1",), open_=True)
    figures = api.Batch("b2").figures()
    assert (figures.total, figures.pending, figures.open) == (1, 1, True)
    assert api.Batch("b2").pending_jids() == ["p1"]


def test_a_settled_batch_and_a_chords_body(cog):
    now = time.time()
    write_batch(
        cog,
        "c1",
        kind="chord",
        succeeded=("s1", "s2"),
        fired={"success": now - 3, "complete": now - 3, "settled": now - 3},
        settled_at=now - 3,
    )
    body = {"jid": "c1-body", "job": "app.publish", "args": ["__COGWORKER_RESULTS__"], "kwargs": {}}
    cog.redis.hset(cog.key("batch:c1"), "body", encode(body))
    cog.redis.expire(cog.key("batch:c1"), 7 * 86400)
    figures = api.Batch("c1").figures()
    assert figures.settled and figures.pending == 0 and figures.kind == "chord"
    assert set(figures.fired) == {"success", "complete", "settled"}
    assert [c.event for c in figures.callbacks] == ["success", "settled", "body"]
    assert figures.callbacks[-1].fired_at == pytest.approx(now - 3)
    assert 6 * 86400 < figures.expires_in_s <= 7 * 86400


def test_an_empty_settled_batch_is_all_done(cog):
    write_batch(cog, "e1", fired={"success": 1.0, "settled": 1.0}, settled_at=1.0)
    figures = api.Batch("e1").figures()
    assert (figures.total, figures.done_percent, figures.settled) == (0, 100.0, True)


@pytest.mark.parametrize("bid", ["never-made", "", " b1", "a\nb", "x" * 201, "lone\udcff", "nul\x00"])
def test_an_unknown_or_impossible_bid_raises_batch_not_found(cog, bid):
    write_batch(cog, "b1", pending=("p1",))
    with pytest.raises(BatchNotFound) as caught:
        api.Batch(bid)
    assert isinstance(caught.value, CogworkerError) and isinstance(caught.value, LookupError)
    assert "batch" in str(caught.value)


def test_a_batch_deleted_meanwhile_raises_on_the_next_read(cog):
    write_batch(cog, "b1", pending=("p1",))
    b = api.Batch("b1")
    assert b.delete() is True
    with pytest.raises(BatchNotFound, match="never existed, expired or was deleted"):
        b.total  # noqa: B018
    assert cog.redis.keys(cog.key("batch*")) == [] and cog.redis.zcard(cog.key("batches")) == 0
    with pytest.raises(TypeError):
        api.Batch(7)  # type: ignore[arg-type]


def test_g22_a_real_batchs_figures_are_exact_once_it_settled(cog):
    with batch(description="real", on_death=wf.callback.s("dead"), on_settled=wf.callback.s("fin")) as b:
        for i in range(6):
            wf.member.delay(i)
        wf.die.delay("x")
    opened = api.Batch(b.bid).figures()
    assert (opened.total, opened.pending, opened.succeeded, opened.dead, opened.settled) == (
        7,
        7,
        0,
        0,
        False,
    )
    assert [f.bid for f in api.BatchSet()] == [b.bid]
    cog.start_worker()
    wait_for(lambda: api.Batch(b.bid).settled, 30, "the batch settled")
    figures = api.Batch(b.bid).figures()
    assert (figures.total, figures.pending, figures.succeeded, figures.dead) == (7, 0, 6, 1)
    assert set(figures.fired) == {"death", "complete", "settled"} and figures.malformed == ()
    assert [c.jid for c in figures.callbacks] == [f"{b.bid}-death", f"{b.bid}-settled"]
    assert figures.created_at == pytest.approx(time.time(), abs=60) and figures.description == "real"
    assert 0 < figures.expires_in_s <= 7 * 86400  # BATCH_DONE_TTL
    [dead] = api.Batch(b.bid).dead_jids()
    assert [(p.kind, p.record.name) for p in api.places(b.bid, [dead])] == [("dead", wf.die.name)]


# -- the index -------------------------------------------------------------------------------


def test_the_set_lists_newest_first_and_skips_expired_batches(cog):
    now = time.time()
    for i in range(7):
        write_batch(cog, f"b{i}", created_at=now - 100 + i, pending=(f"p{i}",))
    cog.redis.delete(cog.key("batch:b3"))  # expired: its index entry stays until the poller trims it
    assert [f.bid for f in api.BatchSet()] == ["b6", "b5", "b4", "b2", "b1", "b0"]
    assert api.BatchSet().size == 7


def test_a_page_lists_open_batches_first(cog, monkeypatch):
    monkeypatch.setattr("django_cogworker.api.batches.INDEX_PAGE", 3)  # several index pages
    now = time.time()
    for i in range(8):
        settled = i % 2 == 0
        write_batch(
            cog,
            f"b{i}",
            created_at=now - 100 + i,
            succeeded=(f"s{i}",),
            pending=() if settled else (f"p{i}",),
            fired={"settled": now} if settled else None,
            settled_at=now if settled else None,
        )
    count, page = api.BatchSet().page(0, 5)
    assert count == 8 and [f.bid for f in page] == ["b7", "b5", "b3", "b1", "b6"]
    assert [f.bid for f in api.BatchSet().page(5, 5)[1]] == ["b4", "b2", "b0"]
    assert api.BatchSet().page(0, 2, state="settled")[0] == 4
    assert [f.bid for f in api.BatchSet().page(2, 2, state="settled")[1]] == ["b2", "b0"]
    assert [f.bid for f in api.BatchSet().page(0, 9, state="open")[1]] == ["b7", "b5", "b3", "b1"]
    assert api.BatchSet().page(50, 5) == (8, [])
    with pytest.raises(ValueError, match="unknown batch state"):
        api.BatchSet().page(state="gone")


# -- the sets filtered by batch -------------------------------------------------------------


def test_the_sets_filter_by_batch(cog):
    r = cog.redis
    now = time.time()
    r.zadd(cog.key("retry"), {member("r1", "b1"): now, member("r2", "b2"): now, member("r3", "other"): now})
    # "bid" in the arguments, or twice: decided on the parsed payload.
    r.zadd(
        cog.key("retry"), {encode({"jid": "r4", "job": MEMBER, "args": ['"bid":"b1"'], "kwargs": {}}): now}
    )
    r.zadd(cog.key("dead"), {member("d1", "b1"): now, member("b1-death", "b1", cb="death"): now + 1})
    assert [x.jid for x in api.RetrySet().filter(bid="b1")] == ["r1"]
    assert [x.jid for x in api.RetrySet().filter(bid="b1", limit=5)] == ["r1"]
    assert [x.jid for x in api.RetrySet().filter_page(bid="b1")[1]] == ["r1"]
    assert [x.jid for x in api.DeadSet().filter(bid="b1")] == ["b1-death", "d1"]
    assert api.DeadSet().filter(bid="b1", name="no.such") == []
    assert api.RetrySet().find("r1").bid == "b1" and api.RetrySet().find("r4").bid == ""


# -- where each member is ------------------------------------------------------------------


def test_places_finds_each_member_where_it_is(cog):
    r, now = cog.redis, time.time()
    write_batch(cog, "b1", pending=("q1", "q2", "r1", "s1", "u1", "run1", "b:child", "lost"))
    r.lpush(cog.key("queue:mail"), member("q2", "b1", queue="mail"), member("x", "b9", queue="mail"))
    r.lpush(cog.key("queue:default"), member("q1", "b1"), member("q1", "b-other"))
    r.sadd(cog.key("queues"), "default", "mail")
    r.zadd(cog.key("retry"), {member("r1", "b1"): now})
    r.zadd(cog.key("schedule"), {member("s1", "b1"): now + 60})
    r.rpush(
        cog.key("unsettled"), encode({"payload": member("u1", "b1").decode(), "set": "dead", "score": now})
    )
    r.sadd(cog.key("processes"), "host:1:aaaa")
    r.hset(cog.key("process:host:1:aaaa"), mapping={"identity": "host:1:aaaa", "beat": repr(now)})
    r.hset(cog.key("workers:host:1:aaaa"), "run1", encode({"queue": "default", "run_at": now, "job": MEMBER}))
    found = {p.jid: p for p in api.places("b1", api.Batch("b1").pending_jids(100))}
    assert {jid: (p.kind, p.where) for jid, p in found.items()} == {
        "b:child": ("batch", "child"),
        "lost": ("unknown", ""),
        "q1": ("queue", "default"),
        "q2": ("queue", "mail"),
        "r1": ("retry", ""),
        "run1": ("running", "host:1:aaaa"),
        "s1": ("scheduled", ""),
        "u1": ("unsettled", ""),
    }
    assert found["q1"].record.bid == "b1" and found["r1"].record.id == api.RetrySet().find("r1").id


# -- whatever Redis holds -------------------------------------------------------------------


def test_garbage_in_a_batchs_keys_is_noted_never_raised(cog):
    r, key = cog.redis, cog.key("batch:g1")
    write_batch(cog, "g1", pending=("p1",), succeeded=("s1",))
    r.hset(key, mapping={"created_at": "soon", "fired:success": "1e999", "cb:death": "[" * 50_000})
    r.hset(
        key, mapping={"cb:success": b"\xff\xfe", "description": b"\xed\xa0\x80 bad \xff", "settled_at": "x"}
    )
    r.delete(f"{key}:failed", f"{key}:dead")
    r.set(f"{key}:failed", "not a set")
    r.rpush(f"{key}:dead", "not a set either")
    r.sadd(f"{key}:pending", b"\xff\xfe")
    figures = api.Batch("g1").figures()
    assert (figures.total, figures.pending, figures.failed, figures.dead) == (2, 2, 0, 0)
    assert figures.created_at == pytest.approx(time.time() - 120, abs=30)  # the index's score
    assert figures.fired == {} and figures.settled_at is None and "\ufffd" in figures.description
    assert {c.event: c.unreadable for c in figures.callbacks}["death"] == "its payload is unreadable"
    notes = " | ".join(figures.malformed)
    for expected in (
        "created_at",
        "fired:success",
        "settled_at",
        ":failed is not a set",
        ":dead is not a set",
    ):
        assert expected in notes, expected
    listed = api.Batch("g1").pending_jids()
    assert listed == ["p1"] and any("not UTF-8" in note for note in listed.skipped)
    assert api.Batch("g1").dead_jids() == [] and api.Batch("g1").dead_jids().skipped


def test_a_hash_of_the_wrong_type_and_a_garbage_index(cog):
    r = cog.redis
    r.set(cog.key("batch:w1"), "not a hash")
    r.zadd(cog.key("batches"), {"w1": 1.0, b"\xff\xfe": 2.0, "a\nb": 3.0})
    figures = api.Batch("w1").figures()
    assert figures.description == "" and "is not a hash" in figures.malformed[0]
    count, page = api.BatchSet().page()
    assert count == 1 and [f.bid for f in page] == ["w1"] and len(page.skipped) == 2
    r.delete(cog.key("batches"))
    r.set(cog.key("batches"), "not a zset")
    count, page = api.BatchSet().page()
    assert count == 0 and page.skipped == [f"{cog.key('batches')} is not a sorted set: no batch is listed"]
    assert list(api.BatchSet()) == []


def test_redis_down_is_redis_unavailable(cog, own_redis):
    server = own_redis()
    server.stop()
    cog.configure(REDIS_URL=f"redis://:s3cret-pw@127.0.0.1:{server.port}/0")
    for read in (
        lambda: api.Batch("b1"),
        lambda: api.BatchSet().page(),
        lambda: list(api.BatchSet()),
        lambda: api.places("b1", ["j1"]),
        lambda: api.BatchSet().size,
    ):
        with pytest.raises(RedisUnavailable) as caught:
            read()
        assert "s3cret-pw" not in str(caught.value)
