"""G13 for payloads nested thousands deep (SPEC section 8): Python's json
and Redis's cjson both give up past about 1,000 levels (RecursionError, a
failed ``cjson.decode``). Such a payload is unreadable like any other: filed
in dead once with its raw text kept, shown as malformed by the API and the
admin, refused by ``.delay()`` with a TypeError. Real Redis, real workers."""

from __future__ import annotations

import json
import re
import time
from html import unescape
from typing import Any

import pytest

from django_cogworker import api, payload, testing
from django_cogworker.admin.helpers import segment
from django_cogworker.connection import get_keys
from django_cogworker.errors import BadPayload
from django_cogworker.payload import MAX_ARGUMENT_DEPTH, MAX_DEPTH, encode
from testproject.testapp import jobs
from tests.conftest import wait_for

RECORD = "testproject.testapp.jobs.record"

BASE = "/admin/django_cogworker/job/"

#: Deeper than Python's recursion limit and cjson's decode depth (1,000).
DEPTH = 10_000

DEEP_ARGUMENT = b"[" * DEPTH + b"]" * DEPTH
DEEP_OBJECT = b'{"jid":"deep","job":"' + RECORD.encode() + b'","args":[' + DEEP_ARGUMENT + b'],"kwargs":{}}'
DEEP_LIST = DEEP_ARGUMENT  # the whole payload

DEEP = pytest.mark.parametrize("raw", [DEEP_OBJECT, DEEP_LIST], ids=["object", "bare-list"])

#: A fake live process whose records (in progress, running now) are deep.
IDENTITY = "host:1:deep"


def nested(depth: int) -> list[Any]:
    """A list ``depth`` levels deep (``[]`` is one level)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def dead_entries(cog) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in cog.redis.zrange(get_keys().dead, 0, -1)]


def in_progress(cog) -> int:
    k = get_keys()
    return sum(int(cog.redis.llen(key)) for key in cog.redis.scan_iter(match=f"{k.inprogress_prefix}*"))


def assert_filed_once_and_the_worker_goes_on(cog, raw: bytes) -> None:
    k = get_keys()
    [entry] = wait_for(lambda: dead_entries(cog), 15, "the deep payload to be filed in dead")
    assert entry["raw"] == raw.decode()
    assert entry["error_class"] == "django_cogworker.errors.BadPayload"
    assert "nested too deeply" in entry["error_message"]
    assert isinstance(entry["jid"], str) and entry["jid"]

    after = jobs.record.delay("after the deep one")
    wait_for(lambda: any(n["jid"] == after for n in cog.notes()), 10, "a normal job after it")
    # A few beats (0.2 s) and stray checks (0.5 s) later: filed once, and
    # nothing left on an in-progress list to be reconciled over and over.
    time.sleep(2)
    # The normal job's ack rides its thread's next fetch, after its note.
    wait_for(lambda: in_progress(cog) == 0, 10, "the normal job's ack")
    assert len(dead_entries(cog)) == 1
    assert cog.redis.llen(k.queue("default")) == 0


# -- the worker and the poller --------------------------------------------------------


@DEEP
def test_g13_a_payload_nested_10000_deep_is_filed_in_dead_once_and_the_worker_goes_on(cog, raw):
    cog.redis.lpush(get_keys().queue("default"), raw)
    worker = cog.start_worker()
    assert_filed_once_and_the_worker_goes_on(cog, raw)
    assert "failed unexpectedly" not in worker.log()
    assert worker.alive()


@pytest.mark.parametrize("zset", ["retry", "schedule"])
@DEEP
def test_g13_a_deep_payload_due_in_a_sorted_set_is_moved_by_the_poller_and_filed_in_dead(cog, zset, raw):
    k = get_keys()
    cog.redis.zadd(getattr(k, zset), {raw: time.time() - 1})
    worker = cog.start_worker()
    assert_filed_once_and_the_worker_goes_on(cog, raw)
    assert cog.redis.zcard(getattr(k, zset)) == 0
    assert "poller:" not in worker.log()


def test_g13_drain_files_a_deep_payload_in_dead_like_a_worker(cog):
    k = get_keys()
    cog.redis.zadd(k.retry, {DEEP_OBJECT: time.time() - 1})
    cog.redis.lpush(k.queue("default"), DEEP_LIST)
    assert testing.drain(include_scheduled=True) == 2
    assert sorted(e["raw"] for e in dead_entries(cog)) == sorted([DEEP_OBJECT.decode(), DEEP_LIST.decode()])
    assert cog.redis.zcard(k.retry) == 0


# -- .delay() -------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [DEPTH, MAX_ARGUMENT_DEPTH + 1])
def test_delay_of_arguments_nested_too_deeply_raises_type_error_and_pushes_nothing(cog, depth):
    k = get_keys()
    deep = nested(depth)
    with pytest.raises(TypeError, match=rf"positional argument 0 of job '{RECORD}' is nested too deeply"):
        jobs.record.delay(deep)
    with pytest.raises(TypeError, match=r"argument 'tag' of job .* is nested too deeply"):
        jobs.record.delay(tag={"a": deep})
    with pytest.raises(TypeError, match="nested too deeply"):
        jobs.record.delay_in(60, deep)
    assert cog.redis.llen(k.queue("default")) == 0
    assert cog.redis.zcard(k.schedule) == 0


def test_arguments_as_deep_as_allowed_are_pushed_and_run(cog):
    deep = nested(MAX_ARGUMENT_DEPTH)
    jid = jobs.record.delay(deep)
    [raw] = cog.redis.lrange(get_keys().queue("default"), 0, -1)
    assert raw.count(b"[") == MAX_DEPTH - 1  # the payload object makes MAX_DEPTH
    assert testing.drain() == 1
    [note] = cog.notes()
    assert note["jid"] == jid and note["tag"] == deep
    assert dead_entries(cog) == []


# -- the API and the admin ------------------------------------------------------------


def good_payload(jid: str) -> dict[str, Any]:
    now = time.time()
    return {
        "jid": jid,
        "job": RECORD,
        "args": ["fine"],
        "kwargs": {},
        "queue": "default",
        "retry": 3,
        "created_at": now,
        "enqueued_at": now,
    }


@pytest.fixture
def deep_everywhere(cog) -> None:
    """A deep entry, and a good one beside it, wherever a job can be."""
    r, k = cog.redis, get_keys()
    now = time.time()
    r.sadd(k.queues, "default")
    r.rpush(k.queue("default"), DEEP_OBJECT, encode(good_payload("good-queued")), DEEP_LIST)
    for zset, score in ((k.schedule, now + 3600), (k.retry, now + 600), (k.dead, now)):
        r.zadd(zset, {DEEP_OBJECT: score, DEEP_LIST: score + 1, encode(good_payload(f"good-{zset}")): score})
    deep_record = b'{"set":"' + k.dead.encode() + b'","score":1,"payload":' + DEEP_LIST + b"}"
    r.rpush(
        k.unsettled,
        json.dumps({"set": k.dead, "score": now, "payload": DEEP_OBJECT.decode()}),
        deep_record,
        json.dumps({"set": k.dead, "score": now, "payload": encode(good_payload("good-unsettled")).decode()}),
    )
    # A live process (its presence key) with deep records of its own.
    r.sadd(k.processes, IDENTITY)
    r.hset(
        k.process(IDENTITY),
        mapping={
            "identity": IDENTITY,
            "hostname": "host",
            "pid": "1",
            "concurrency": "4",
            "busy": "3",
            "queues": DEEP_LIST,
            "recovery": DEEP_LIST,
            "started_at": str(now),
            "beat": str(now),
        },
    )
    r.expire(k.process(IDENTITY), 60)
    r.rpush(k.inprogress(IDENTITY), DEEP_OBJECT, DEEP_LIST, encode(good_payload("good-running")))
    good_record = {
        "jid": "good-running",
        "job": RECORD,
        "queue": "default",
        "args_preview": '"fine"',
        "run_at": now,
        "thread": 2,
    }
    r.hset(
        k.workers(IDENTITY),
        mapping={
            "deep": DEEP_LIST,
            "deep-old": json.dumps({"queue": "default", "payload": DEEP_OBJECT.decode(), "run_at": now}),
            "good-running": json.dumps(good_record),
        },
    )
    r.set(k.recovery_report, DEEP_LIST)


def assert_unreadable(record: api.JobRecord) -> None:
    assert "nested too deeply" in record.unreadable
    assert record.raw in (DEEP_OBJECT.decode(), DEEP_LIST.decode())
    assert record.payload == {"raw": record.raw}


def test_the_api_shows_deep_entries_as_unreadable_and_reads_the_rest(cog, deep_everywhere):
    queue = api.Queue("default")
    records = list(queue)
    assert [r.jid for r in records] == ["", "good-queued", ""]
    for record in (records[0], records[2]):
        assert_unreadable(record)
    assert records[1].unreadable == "" and records[1].args == ["fine"]
    assert queue.latency == 0.0  # the oldest cannot be read: no enqueued_at
    assert queue.find("good-queued") is not None

    for jobs_set in (api.ScheduledSet(), api.RetrySet(), api.DeadSet()):
        records = list(jobs_set)
        assert len(records) == 3
        unreadable = [r for r in records if r.unreadable]
        assert len(unreadable) == 2
        for record in unreadable:
            assert_unreadable(record)
            assert jobs_set.get(record.id) is not None
        assert [r.jid for r in records if not r.unreadable] == [f"good-{jobs_set.key}"]
        assert jobs_set.find(f"good-{jobs_set.key}") is not None
        assert len(jobs_set.filter(name=RECORD)) == 1
        assert jobs_set.filter_page(search="good")[0] >= 1
        assert jobs_set.job_names() == ["", RECORD]

    unsettled = list(api.UnsettledSet())
    assert len(unsettled) == 3
    assert_unreadable(unsettled[0])
    assert "nested too deeply" in unsettled[1].unreadable  # the record itself is deep
    assert unsettled[2].jid == "good-unsettled"

    [process] = api.ProcessSet().all()
    assert (process.identity, process.queues, process.recovery, process.busy) == (IDENTITY, [], {}, 3)
    assert api.ProcessSet.last_recovery() == {}

    running = {j.jid: j for j in api.Workers().all()}
    assert set(running) == {"deep", "deep-old", "good-running"}
    assert running["deep"].unreadable and running["deep"].name == ""
    assert running["deep-old"].unreadable and running["deep-old"].payload == {}
    assert running["good-running"].name == RECORD and running["good-running"].args_preview == '"fine"'
    assert running["good-running"].payload["args"] == ["fine"]

    in_progress = api.InProgress(IDENTITY)
    assert in_progress.size == 3
    assert [bool(r.unreadable) for r in in_progress] == [True, True, False]
    assert in_progress.find("deep") is None  # its jid cannot be read
    found = in_progress.find("good-running")
    assert found is not None and found.args == ["fine"]
    # Running: no action applies to it.
    assert not found.retry() and not found.kill() and not found.delete()
    assert api.bulk([found], "delete") == 0
    assert in_progress.size == 3


def test_a_deep_entry_can_still_be_retried_killed_or_deleted(cog):
    r, k = cog.redis, get_keys()
    r.zadd(k.retry, {DEEP_OBJECT: time.time() + 600, DEEP_LIST: time.time() + 601})
    first, second = api.RetrySet().page()
    assert first.retry() and r.lrange(k.queue("default"), 0, -1) == [DEEP_OBJECT]  # byte for byte
    assert second.kill()
    [dead] = api.DeadSet().page()
    assert dead.payload["raw"] == DEEP_LIST.decode() and dead.error_class == "Killed"
    assert dead.delete() and r.zcard(k.dead) == 0 and r.zcard(k.retry) == 0


PAGES = [
    "dashboard/",
    "queues/",
    "queues/default/",
    "busy/",
    "scheduled/",
    "retries/",
    "dead/",
    f"dead/?name={RECORD}&queue=default&q=deep",
    "retries/?q=good",
    "unsettled/",
    "periodic/",
]


@pytest.mark.parametrize("page", PAGES)
def test_every_admin_page_renders_with_deep_entries_present(cog, deep_everywhere, superclient, page):
    response = superclient.get(BASE + page)
    assert response.status_code == 200
    assert 'aria-label="Jobs"' in response.content.decode()


@pytest.mark.parametrize("set_name", ["scheduled", "retries", "dead", "unsettled"])
def test_the_job_pages_of_deep_entries_render_and_say_why(cog, deep_everywhere, superclient, set_name):
    body = superclient.get(BASE + f"{set_name}/").content.decode()
    assert "Unreadable: payload is nested too deeply" in body
    links = re.findall(rf'href="({BASE}{set_name}/job/[^"]+)"', body)
    assert len(links) == 3
    for link in links:
        response = superclient.get(unescape(link))
        assert response.status_code == 200, link
    deep = next(r for r in api.DeadSet() if r.unreadable)
    detail = superclient.get(f"{BASE}dead/job/{segment(deep.id).replace('%', '%25')}/").content.decode()
    assert "nested too deeply" in detail and "[[[[" in detail


def test_the_busy_page_shows_deep_running_records_as_unreadable(cog, deep_everywhere, superclient):
    body = superclient.get(BASE + "busy/").content.decode()
    assert body.count(">unreadable</span>") == 2
    # Only the readable one links to its page; a deep one that cannot be
    # found by its jid sends back to the busy page.
    links = re.findall(rf'href="({BASE}busy/[^"]+/job/[^"]+)"', body)
    assert len(links) == 1
    assert superclient.get(unescape(links[0])).status_code == 200
    gone = superclient.get(f"{BASE}busy/{segment(IDENTITY)}/job/deep/", follow=True)
    assert gone.status_code == 200 and "no longer running" in gone.content.decode()


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jid":"j","job":"x","args":[1,"\xc3\xa9"],"kwargs":{}}',
        b'{"a":1}\n',  # spaces after: json.loads reads them
        b'  {"a":1}',
        b'{"a":1} x',
        b'{"a":',
        b'{"\xff":1}',  # not UTF-8
        b'{"a":"\xed\xb3\xbf"}',  # a lone surrogate, as Python writes one
        '{"a":"\udcff"}',
        b'{\x00"\x00a\x00"\x00:\x001\x00}\x00',  # UTF-16, which json.loads detects
        b'{"a":NaN,"b":1e999}',
        b"[1]",
        b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}",
    ],
)
def test_g13_a_payload_is_read_as_json_loads_reads_it(raw):
    """``payload.parse`` calls json's scanner itself for text as ours are
    written: the same value, or the same error, as ``json.loads``."""
    try:
        expected: Any = ("value", json.loads(raw))
    except RecursionError:
        expected = ("error", payload.TOO_DEEP)
    except ValueError as exc:
        expected = ("error", f"not valid JSON: {exc}")
    try:
        value = payload.parse(raw)
    except BadPayload as exc:
        assert ("error", str(exc)) == expected
    else:
        assert repr(("value", value)) == repr(expected)
