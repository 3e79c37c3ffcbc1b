"""The enqueue side: ``@job``, ``.delay()`` and friends, on-commit, bad input."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import re
import threading
import time
import warnings
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from django.db import transaction

from django_cogworker import job, registry
from django_cogworker.bulk import encode_many
from django_cogworker.errors import CogworkerError, EnqueueRefused, RedisUnavailable
from django_cogworker.payload import encode, new_jid
from testproject.demo import jobs as demo_jobs
from testproject.testapp import jobs
from tests.conftest import free_port

RECORD = "testproject.testapp.jobs.record"
PAYLOAD_KEYS = {"jid", "job", "args", "kwargs", "queue", "retry", "created_at", "enqueued_at"}


def queued(cog: Any, queue: str = "default") -> list[dict[str, Any]]:
    """The queue's payloads, next to run first."""
    return [json.loads(r) for r in reversed(cog.redis.lrange(cog.key(f"queue:{queue}"), 0, -1))]


def scheduled(cog: Any) -> list[tuple[dict[str, Any], float]]:
    return [(json.loads(r), s) for r, s in cog.redis.zrange(cog.key("schedule"), 0, -1, withscores=True)]


def namespace_keys(cog: Any) -> list[bytes]:
    return sorted(cog.redis.scan_iter(match=f"{cog.namespace}:*"))


# -- .delay() ---------------------------------------------------------------------


def test_delay_writes_the_documented_payload(cog):
    before = time.time()
    jid = jobs.record.delay({"nested": [1, 2.5, None, "é"]})
    after = time.time()

    assert isinstance(jid, str) and re.fullmatch(r"[0-9a-f]{24}", jid)
    [payload] = queued(cog)
    assert set(payload) == PAYLOAD_KEYS
    assert payload["jid"] == jid
    assert payload["job"] == RECORD
    assert payload["args"] == [{"nested": [1, 2.5, None, "é"]}]
    assert payload["kwargs"] == {}
    assert payload["queue"] == "default"
    assert payload["retry"] is True
    assert before <= payload["created_at"] == payload["enqueued_at"] <= after
    assert cog.redis.smembers(cog.key("queues")) == {b"default"}


def test_delay_keeps_kwargs_and_the_jobs_options(cog):
    jid_mail = jobs.record_mail.delay(tag="k")
    jid_fail = jobs.fail.delay("m")
    jid_drop = jobs.fail_and_drop.delay()

    [mail] = queued(cog, "mail")
    assert (mail["jid"], mail["args"], mail["kwargs"], mail["queue"]) == (jid_mail, [], {"tag": "k"}, "mail")
    by_jid = {p["jid"]: p for p in queued(cog)}
    assert by_jid[jid_fail]["retry"] == 2
    assert "dead" not in by_jid[jid_fail]
    assert by_jid[jid_drop]["retry"] == 0
    assert by_jid[jid_drop]["dead"] is False
    assert cog.redis.smembers(cog.key("queues")) == {b"default", b"mail"}


def test_successive_delays_run_in_enqueue_order(cog):
    jids = [jobs.record.delay(i) for i in range(5)]
    assert [p["jid"] for p in queued(cog)] == jids
    assert len(set(jids)) == 5


# -- scheduling -------------------------------------------------------------------


@pytest.mark.parametrize("delay", [30, 2.5, timedelta(minutes=5)], ids=["int", "float", "timedelta"])
def test_delay_in_lands_in_the_schedule_with_its_due_time(cog, delay):
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    before = time.time()
    jid = jobs.record.delay_in(delay, "later")
    after = time.time()

    [(payload, score)] = scheduled(cog)
    assert payload["jid"] == jid
    assert payload["args"] == ["later"]
    assert set(payload) == PAYLOAD_KEYS
    assert before + seconds <= score <= after + seconds
    assert cog.redis.llen(cog.key("queue:default")) == 0


def test_delay_at_takes_an_aware_datetime_in_any_zone(cog):
    when = datetime(2031, 3, 4, 5, 6, 7, 250000, tzinfo=timezone(timedelta(hours=2)))
    jid = jobs.record.delay_at(when, tag="t")
    [(payload, score)] = scheduled(cog)
    assert payload["jid"] == jid
    assert payload["kwargs"] == {"tag": "t"}
    assert score == datetime(2031, 3, 4, 3, 6, 7, 250000, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("when", [1_900_000_000, 1_900_000_000.5])
def test_delay_at_takes_epoch_seconds(cog, when):
    jid = jobs.record.delay_at(when)
    [(payload, score)] = scheduled(cog)
    assert payload["jid"] == jid
    assert score == when


def test_delay_at_refuses_a_naive_datetime_and_writes_nothing(cog):
    with pytest.raises(ValueError) as info:
        jobs.record.delay_at(datetime(2031, 1, 1, 12, 0), "x")
    assert str(info.value) == f"job {RECORD!r}: delay_at() needs an aware datetime, got a naive one"
    assert namespace_keys(cog) == []


# -- .set() -----------------------------------------------------------------------


def test_set_returns_a_copy_and_leaves_the_registered_job_alone(cog):
    copy = jobs.record.set(queue="critical", retry=0)
    assert copy is not jobs.record
    assert (copy.queue, copy.retry, copy.name, copy.func) == ("critical", 0, RECORD, jobs.record.func)
    assert (jobs.record.queue, jobs.record.retry) == ("default", True)
    assert registry.get(RECORD) is jobs.record

    jid = copy.delay("x")
    [payload] = queued(cog, "critical")
    assert (payload["jid"], payload["queue"], payload["retry"]) == (jid, "critical", 0)
    jobs.record.delay("y")
    [plain] = queued(cog)
    assert (plain["queue"], plain["retry"]) == ("default", True)


def test_set_dead_false_marks_the_payload(cog):
    jobs.record.set(dead=False).delay()
    [payload] = queued(cog)
    assert payload["dead"] is False


@pytest.mark.parametrize(
    ("options", "named"),
    [({"colour": "red"}, "colour"), ({"name": "other"}, "name"), ({"func": print}, "func")],
)
def test_set_refuses_unknown_options(cog, options, named):
    with pytest.raises(TypeError) as info:
        jobs.record.set(**options)
    assert str(info.value) == f"job {RECORD!r}: unknown option(s) for set(): {named}"


def test_set_validates_the_values_it_is_given(cog):
    with pytest.raises(TypeError, match="retry must be True, False or a whole number >= 0"):
        jobs.record.set(retry=-1)
    with pytest.raises(TypeError, match="queue must be a non-empty string"):
        jobs.record.set(queue="")


def test_delay_checks_the_call_against_the_jobs_signature_and_pushes_nothing(cog):
    """``record(tag=None)``: three positional arguments, or a keyword it does
    not take, fail at .delay() (not five times in the worker)."""
    for call in (lambda: jobs.record.delay(1, 2, 3), lambda: jobs.record.delay(colour="red")):
        with pytest.raises(TypeError) as info:
            call()
        assert f"job {RECORD!r} cannot be called with these arguments" in str(info.value)
        assert "it takes (tag=None)" in str(info.value)
        assert "Nothing was enqueued" in str(info.value)
    with pytest.raises(TypeError):
        jobs.record.delay_many([(("fine",), {}), ((1, 2), {})])
    with pytest.raises(TypeError):
        jobs.record.delay_in(5, 1, 2)
    assert queued(cog) == [] and cog.redis.zcard(cog.key("schedule")) == 0
    assert jobs.record.delay(tag="ok") is not None


def test_a_call_shape_the_signature_took_once_does_not_let_another_through(cog):
    """The check remembers shapes it accepted (how many positional
    arguments, which keyword names), never one it refused."""
    for _ in range(2):
        assert jobs.record.delay(1) and jobs.record.delay(tag=2) and jobs.record.delay()
        refused: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
            ((1, 2), {}),
            ((), {"colour": "red"}),
            ((1,), {"tag": 2}),
        ]
        for args, kwargs in refused:
            with pytest.raises(TypeError, match="cannot be called with these arguments"):
                jobs.record.delay(*args, **kwargs)
    assert [p["args"] + list(p["kwargs"].values()) for p in queued(cog)] == [[1], [2], [], [1], [2], []]


# -- .delay_many() ----------------------------------------------------------------


def count_pushes(monkeypatch) -> list[int]:
    """The size of each push ``delay_many`` makes (each still goes to the real server)."""
    from django_cogworker import client

    sizes: list[int] = []
    real = client._push

    def push(payloads, *args, **kwargs):
        sizes.append(len(payloads))
        return real(payloads, *args, **kwargs)

    monkeypatch.setattr(client, "_push", push)
    return sizes


def test_delay_many_pushes_in_chunks_and_returns_every_jid(cog, monkeypatch):
    pushes = count_pushes(monkeypatch)
    calls = [((i,), {}) for i in range(2499)] + [((), {"tag": "last"})]
    jids = jobs.record.delay_many(calls)

    assert pushes == [1000, 1000, 500]  # 2500 calls, chunks of 1000: three pushes
    assert len(jids) == 2500 and len(set(jids)) == 2500
    # As .delay() makes them: 12 random bytes in hex (delay_many reads them in one go).
    assert all(re.fullmatch("[0-9a-f]{24}", jid) for jid in [*jids, jobs.record.delay()])
    payloads = queued(cog)[:-1]
    assert [p["jid"] for p in payloads] == jids
    assert [p["args"] for p in payloads[:3]] == [[0], [1], [2]]
    assert (payloads[-1]["args"], payloads[-1]["kwargs"]) == ([], {"tag": "last"})
    assert all(set(p) == PAYLOAD_KEYS for p in payloads)


@pytest.mark.parametrize("way", ["delay_many", "adelay_many"])
def test_delay_many_pushes_for_each_call_the_bytes_encode_writes_for_its_payload(cog, way):
    """Its payloads pass the built-in chain unchanged and are encoded
    together (``bulk.encode_alike``): byte for byte what ``encode`` writes
    for the payload ``.delay()`` would make of each call."""
    made = jobs.record.set(queue="bulk", retry=3, dead=False, timeout=5.0, expires_in=60)
    tags = [None, 1, 3.5, "\ud800 a lone surrogate", 'é\u2028"q"', [{"a": [1]}], {"nested": {"x": None}}]
    calls = [((tag,), {}) for tag in tags] + [((), {"tag": tag}) for tag in tags] + [((), {})]
    jids = made.delay_many(calls) if way == "delay_many" else asyncio.run(made.adelay_many(calls))

    raws = list(reversed(cog.redis.lrange(cog.key("queue:bulk"), 0, -1)))
    assert len(raws) == len(calls) == len(jids)
    for raw, jid, (args, kwargs) in zip(raws, jids, calls, strict=True):
        read = json.loads(raw)
        made_alone = made.payload(args, kwargs, read["created_at"], jid)
        assert raw == encode({**made_alone, "expires_at": read["expires_at"]})
    assert len({json.loads(raw)["expires_at"] for raw in raws}) == 1  # one deadline for all


def test_encode_many_gives_the_bytes_encode_gives_each_payload():
    now, queue, retry = time.time(), "default", True
    calls = [
        ([], {}),
        ([1, "two", 3.5], {}),
        ([], {"tag": 'é\u2028"q"', "n": None}),
        ([[{"a": [1]}]], {"x": 1}),
    ]
    shared = [
        {
            "jid": new_jid(),
            "job": "app.jobs.f",
            "args": args,
            "kwargs": kwargs,
            "queue": queue,
            "retry": retry,
            "created_at": now,
            "enqueued_at": now,
        }
        for args, kwargs in calls
    ]
    odd = [
        {**shared[0], "jid": 'a"b'},  # a middleware's jid that needs escaping
        {**shared[0], "retry": 1},  # equal to True, not the same object
        {**shared[0], "dead": False, "unique_for": 5.0},
        {"job": "app.jobs.f", "jid": new_jid(), "args": [], "kwargs": {}},  # another order
        {**shared[1], 7: "an int key"},
        {**shared[1], "retry": retry, "created_at": now},
        {"jid": new_jid(), "job": "app.jobs.g", "args": (1,), "kwargs": {}, "queue": queue},
    ]
    payloads = shared + odd + shared
    assert encode_many(payloads) == [encode(p) for p in payloads]
    assert encode_many([]) == []
    with pytest.raises(ValueError):
        encode_many([shared[0], {**shared[0], "created_at": math.nan}])


def test_encode_writes_what_json_writes_and_refuses_what_it_refuses():
    writer = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    payloads: list[dict[Any, Any]] = [
        {"jid": new_jid(), "args": [1, -2.5, 1e300, True, None], "kwargs": {"t": 'é\u2028"q"\\'}},
        {"args": [[{"a": [1, {"b": []}]}]], 7: "an int key", "kwargs": {}},
        {"jid": "x", "args": [], "kwargs": {}, "big": 10**30, "ctl": "\x00\x1f\x7f"},
    ]
    for payload in payloads:
        assert encode(payload) == writer.encode(payload).encode()
    # A lone surrogate: its escape, as before (the text is not UTF-8).
    assert encode({"s": "\udcff"}) == b'{"s":"\\udcff"}'
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular reference"):
        encode({"args": cycle})
    # The markers of a failed call are not carried into the next one.
    assert encode({"args": [[1]]}) == b'{"args":[[1]]}'
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode({"args": [math.inf]})
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode({"args": [object()]})


def test_jids_are_unique_across_threads_and_a_forked_child():
    seen: list[list[str]] = []

    def take() -> None:
        seen.append([new_jid() for _ in range(1_000)])

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    new_jid()  # the pool holds jids ahead now: a forked child must not hand them out again
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns when other tests left threads in this process;
        # the child only writes to the pipe and exits.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: its next jids to the parent, then gone
        try:
            os.write(write, " ".join(new_jid() for _ in range(50)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    parent = [new_jid() for _ in range(50)]
    every = [jid for batch in seen for jid in batch] + parent + child
    assert len(child) == 50
    assert all(re.fullmatch(r"[0-9a-f]{24}", jid) for jid in every)
    assert len(set(every)) == len(every)


def test_delay_many_with_a_small_chunk_size_and_calls_from_a_generator(cog, monkeypatch):
    pushes = count_pushes(monkeypatch)
    jids = jobs.record.set(queue="bulk").delay_many((((i,), {}) for i in range(25)), chunk_size=10)
    assert pushes == [10, 10, 5]
    assert [p["jid"] for p in queued(cog, "bulk")] == jids
    assert cog.redis.smembers(cog.key("queues")) == {b"bulk"}


def test_delay_many_checks_every_call_before_pushing_any(cog, monkeypatch):
    pushes = count_pushes(monkeypatch)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [((i,), {}) for i in range(4)]
    calls += [((object(),), {})] + [((i,), {}) for i in range(5, 1500)]
    with pytest.raises(TypeError, match=r"^positional argument 0 of job .*record' is not JSON-serialisable"):
        jobs.record.delay_many(calls)
    assert pushes == []
    assert namespace_keys(cog) == []


def test_delay_many_runs_no_collection_of_the_cyclic_collector_and_leaves_it_as_it_found_it(cog):
    """Thousands of payload dicts survive the young collections and set off
    a full one, which walks the whole process: not during the call."""
    collections: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    calls = [((i,), {}) for i in range(3000)]
    bulk = jobs.record.set(queue="bulk")
    thresholds = gc.get_threshold()
    gc.callbacks.append(seen)
    gc.set_threshold(50, 2, 2)  # a young collection every 50 allocations, older ones soon after
    try:
        gc.collect()  # the young generation empty: the call starts with room for 50 allocations
        collections.clear()
        bulk.delay_many(calls)
        # At most one young collection, as the collector comes back on at
        # the end (the payloads freed by then); over a hundred with it on.
        assert collections in ([], [0])
        assert gc.isenabled()
        # Bad arguments raise before anything is pushed, the collector back on.
        gc.collect()
        collections.clear()
        with pytest.raises(TypeError):
            jobs.record.delay_many([*calls, ((object(),), {})])
        assert gc.isenabled()
        assert collections in ([], [0])
        # One the caller turned off stays off.
        gc.disable()
        bulk.delay_many(calls[:10])
        assert not gc.isenabled()
        gc.enable()
        # Outside the call, the same thresholds collect: the test can see them.
        collections.clear()
        garbage = [[] for _ in range(500)]
        del garbage
        assert collections
    finally:
        gc.enable()
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(seen)
    assert cog.redis.llen(cog.key("queue:bulk")) == 3010


# -- bad arguments ----------------------------------------------------------------


def test_non_json_keyword_argument_is_named_and_nothing_is_pushed(cog):
    with pytest.raises(TypeError) as info:
        jobs.record.delay(tag={1, 2})
    assert str(info.value) == (
        f"argument 'tag' of job {RECORD!r} is not JSON-serialisable "
        "(set: Object of type set is not JSON serializable); "
        "pass plain JSON values (str, int, float, bool, None, list, dict), such as a model's pk"
    )
    assert namespace_keys(cog) == []


@pytest.mark.parametrize(
    "value", [object(), b"bytes", math.nan, math.inf, {"when": datetime.now(UTC)}, [1, {2, 3}]]
)
def test_non_json_positional_argument_is_refused_everywhere(cog, value):
    pattern = rf"^positional argument 1 of job {re.escape(repr(RECORD))} is not JSON-serialisable"
    with pytest.raises(TypeError, match=pattern):
        jobs.record.delay("ok", value)
    with pytest.raises(TypeError, match=pattern):
        jobs.record.delay_in(5, "ok", value)
    with pytest.raises(TypeError, match=pattern):
        jobs.record.delay_at(2_000_000_000, "ok", value)
    assert namespace_keys(cog) == []


def test_plain_call_runs_inline_and_enqueues_nothing(cog):
    assert jobs.record("inline") is None
    [note] = cog.notes()
    assert note["tag"] == "inline"
    assert note["jid"] is None  # no job context: it did not go through a worker
    assert cog.redis.exists(cog.key("queue:default"), cog.key("queues")) == 0


# -- @job and the registry --------------------------------------------------------


@job
def doubled(x: int) -> int:
    """Doubles x."""
    return 2 * x


@job(queue="mail", retry=3, dead=False, retry_in=lambda count, exc: 7, name="custom.configured")
def configured(x: int) -> int:
    return x + 1


def test_bare_job_has_every_default_and_is_registered_under_module_qualname():
    assert doubled.name == "tests.test_enqueue.doubled"
    assert (doubled.queue, doubled.retry, doubled.dead) == ("default", True, True)
    assert (doubled.retry_in, doubled.on_exhausted, doubled.unique_for, doubled.unique_until) == (
        None,
        None,
        None,
        "success",
    )
    assert doubled.__doc__ == "Doubles x."
    assert doubled(21) == 42
    assert registry.get("tests.test_enqueue.doubled") is doubled


def test_job_with_options_and_an_explicit_name():
    assert configured.name == "custom.configured"
    assert (configured.queue, configured.retry, configured.dead) == ("mail", 3, False)
    assert configured.retry_in is not None and configured.retry_in(1, ValueError()) == 7
    assert registry.get("custom.configured") is configured
    assert registry.get("tests.test_enqueue.configured") is None
    assert configured(1) == 2


def test_nested_function_name_uses_its_qualname():
    @job
    def inner() -> None:
        pass

    expected = "tests.test_enqueue.test_nested_function_name_uses_its_qualname.<locals>.inner"
    assert inner.name == expected
    assert registry.get(expected) is inner


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": ""}, "queue must be a non-empty string"),
        ({"queue": 3}, "queue must be a non-empty string"),
        ({"retry": -1}, "retry must be True, False or a whole number >= 0"),
        ({"retry": "3"}, "retry must be True, False or a whole number >= 0"),
        ({"unique_until": "never"}, "unique_until must be one of ('success', 'start')"),
        ({"unique_for": 0}, "unique_for must be a positive number of seconds or None"),
    ],
)
def test_job_options_are_validated_at_decoration(options, message):
    def f() -> None:
        pass

    with pytest.raises(TypeError) as info:
        job(name="tests.invalid", **options)(f)
    assert str(info.value) == f"job 'tests.invalid': {message}"
    assert registry.get("tests.invalid") is None


def test_unknown_job_option_is_a_type_error():
    with pytest.raises(TypeError):
        job(colour="red")(lambda: None)


def test_autodiscovery_registered_the_installed_apps_jobs_modules():
    names = registry.names()
    for name in (
        RECORD,
        "testproject.testapp.jobs.record_mail",
        "testproject.testapp.jobs.fail",
        "testproject.demo.jobs.add",
        "testproject.demo.jobs.slow",
    ):
        assert name in names
    assert registry.get(RECORD) is jobs.record
    assert registry.get("testproject.demo.jobs.add") is demo_jobs.add
    assert registry.get("testproject.testapp.jobs.nope") is None


# -- on commit --------------------------------------------------------------------


def test_inside_a_transaction_the_push_waits_for_commit(cog, transactional_db):
    with transaction.atomic():
        jid = jobs.record.delay("tx")
        later = jobs.record.delay_in(60, "tx-later")
        many = jobs.record.delay_many([((1,), {}), ((2,), {})])
        assert isinstance(jid, str) and re.fullmatch(r"[0-9a-f]{24}", jid)
        assert isinstance(later, str) and len(many) == 2
        assert namespace_keys(cog) == []
    assert [p["jid"] for p in queued(cog)] == [jid, *many]
    assert [p["jid"] for p, _ in scheduled(cog)] == [later]


def test_nothing_is_pushed_when_the_transaction_rolls_back(cog, transactional_db):
    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.record.delay("tx")
        jobs.record.delay_in(60, "tx-later")
        jobs.record.delay_many([((1,), {})])
        raise RuntimeError("roll back")
    assert namespace_keys(cog) == []


def test_a_savepoint_rollback_drops_only_its_own_jobs(cog, transactional_db):
    with transaction.atomic():
        kept = jobs.record.delay("kept")
        with pytest.raises(RuntimeError), transaction.atomic():
            jobs.record.delay("dropped")
            raise RuntimeError("roll back the savepoint")
    assert [p["jid"] for p in queued(cog)] == [kept]


def test_on_commit_with_captured_callbacks(cog, db, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        jid = jobs.record.delay("captured")
        assert namespace_keys(cog) == []
    assert len(callbacks) == 1
    assert [p["jid"] for p in queued(cog)] == [jid]


def test_enqueue_on_commit_false_pushes_at_once(cog, transactional_db):
    cog.configure(ENQUEUE_ON_COMMIT=False)
    with transaction.atomic():
        jid = jobs.record.delay("now")
        assert [p["jid"] for p in queued(cog)] == [jid]
        many = jobs.record.delay_many([((1,), {})])
        assert [p["jid"] for p in queued(cog)] == [jid, *many]


def test_each_thread_waits_for_its_own_transaction(cog, transactional_db):
    """A thread's connection is looked up once (django_cogworker/atomic.py):
    one thread's answer is never another's."""
    from django.db import connections

    outside = jobs.record.delay("this thread, no transaction")
    seen: dict[str, Any] = {}

    def in_a_transaction() -> None:
        try:
            with transaction.atomic():
                seen["jid"] = jobs.record.delay("another thread, in a transaction")
                seen["queued inside"] = [p["jid"] for p in queued(cog)]
        finally:
            connections.close_all()

    thread = threading.Thread(target=in_a_transaction)
    thread.start()
    thread.join(30)
    assert seen["queued inside"] == [outside]
    assert [p["jid"] for p in queued(cog)] == [outside, seen["jid"]]
    with transaction.atomic():
        inside = jobs.record.delay("this thread, in a transaction")
        assert [p["jid"] for p in queued(cog)] == [outside, seen["jid"]]
    assert [p["jid"] for p in queued(cog)] == [outside, seen["jid"], inside]


def test_under_an_event_loop_the_transaction_is_djangos_answer(cog, transactional_db):
    """Code under an event loop has a connection of its async context, not
    the thread's: inside the thread's atomic block, Django says it is in
    none, and the push goes at once, as before the lookup was kept."""
    import asyncio

    async def enqueue() -> str | None:
        return jobs.record.delay("under a loop")

    with transaction.atomic():
        jobs.record.delay("kept for the commit")  # the thread's connection, looked up
        jid = asyncio.run(enqueue())
        assert [p["jid"] for p in queued(cog)] == [jid]
    assert len(queued(cog)) == 2


# -- Redis down -------------------------------------------------------------------


def test_redis_down_at_delay_raises_redis_unavailable_and_writes_nothing(cog):
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    cog.settings.COGWORKER = {**cog.settings.COGWORKER, "REDIS_URL": dead_url}
    started = time.monotonic()
    for enqueue in (
        lambda: jobs.record.delay("x"),
        lambda: jobs.record.delay_in(5, "x"),
        lambda: jobs.record.delay_at(2_000_000_000, "x"),
        lambda: jobs.record.delay_many([((1,), {}), ((2,), {})]),
    ):
        with pytest.raises(RedisUnavailable) as info:
            enqueue()
        assert isinstance(info.value, CogworkerError)
        assert str(info.value).startswith("could not enqueue: Redis is unreachable (")
        assert isinstance(info.value.__cause__, redis.ConnectionError)
    assert time.monotonic() - started < 20  # fails fast enough for a web request to report it
    assert namespace_keys(cog) == []


def test_redis_down_at_commit_raises_after_the_commit_and_pushes_nothing(cog, transactional_db):
    """What docs/getting-started.md's checkout view relies on: the data is
    saved, the push raises from the end of the atomic block, and the view
    can tell the job apart from a failed save."""
    from django.contrib.auth.models import User

    live_url = cog.settings.COGWORKER["REDIS_URL"]
    cog.settings.COGWORKER = {**cog.settings.COGWORKER, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    unavailable = pytest.raises(RedisUnavailable, match="could not enqueue: Redis is unreachable")
    with unavailable, transaction.atomic():
        user = User.objects.create(username="paid-while-redis-was-down")
        jid = jobs.record.delay(user.pk)  # returned at once: the push waits for the commit
        assert re.fullmatch(r"[0-9a-f]{24}", jid)
    assert User.objects.filter(username="paid-while-redis-was-down").exists()
    cog.settings.COGWORKER = {**cog.settings.COGWORKER, "REDIS_URL": live_url}
    assert namespace_keys(cog) == []


def test_tuples_and_non_string_keys_are_refused_as_json_would_change_them(cog):
    cases = [
        ((1, 2), "contains a tuple (1, 2), which JSON turns into a list"),
        ({1: "a"}, 'contains a dict key 1 (int), which JSON turns into the string "1"'),
        ([{"x": (1,)}], "contains a tuple (1,), which JSON turns into a list"),
        ({True: 1}, 'contains a dict key True (bool), which JSON turns into the string "true"'),
    ]
    for value, expected in cases:
        with pytest.raises(TypeError) as info:
            jobs.record.delay(value)
        assert str(info.value).startswith(f"positional argument 0 of job {RECORD!r} {expected}")
        assert str(info.value).endswith("Nothing was enqueued.")
    with pytest.raises(TypeError, match="argument 'tag' of job"):
        jobs.record.delay(tag={"k": (1,)})
    with pytest.raises(TypeError, match="contains a tuple"):
        jobs.record.delay_many([((1,), {}), (([1, (2,)],), {})])
    assert namespace_keys(cog) == []
    # The call's own argument tuple and plain lists/dicts are fine.
    fine = [((1,), {}), (([1, [2]],), {}), ((), {"tag": {"a": {"b": None}}})]
    assert len(jobs.record.delay_many(fine)) == 3


def test_set_refuses_functions_that_cannot_travel_in_a_payload():
    with pytest.raises(TypeError, match="retry_in cannot be set per call"):
        jobs.record.set(retry_in=lambda count, exc: 1)
    with pytest.raises(TypeError, match="on_exhausted cannot be set per call"):
        jobs.record.set(on_exhausted=print)


def test_redis_refusing_the_push_raises_enqueue_refused_naming_the_reason(cog):
    # A queue key of the wrong type: Redis answers WRONGTYPE to the LPUSH.
    cog.redis.set(cog.key("queue:default"), "not a list")
    with pytest.raises(EnqueueRefused, match=r"Redis refused it .*WRONGTYPE") as caught:
        jobs.record.delay("x")
    assert isinstance(caught.value, CogworkerError)
    assert cog.redis.get(cog.key("queue:default")) == b"not a list"


def test_enqueueing_without_the_app_installed_warns_once_naming_the_setting(cog, settings, monkeypatch):
    from django_cogworker import client, installed

    monkeypatch.setattr(installed, "_installed_checked", False)
    settings.INSTALLED_APPS = [a for a in settings.INSTALLED_APPS if a != "django_cogworker"]
    with pytest.warns(client.NotInstalledWarning, match="'django_cogworker' is not in INSTALLED_APPS"):
        jobs.record.delay("one")
    jobs.record.delay("two")  # once per process: no second warning (warnings are errors here)
    assert len(queued(cog)) == 2
