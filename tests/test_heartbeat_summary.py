"""What a heartbeat records of each running job (``N:workers:<identity>``): a
bounded summary made once per job, never the payload, which every beat
would otherwise send again (a 50 MB argument moved about 700 MB through
Redis in 10 s). The busy page shows the summary and links to the whole job,
read from the process's in-progress list. Real Redis, real workers."""

from __future__ import annotations

import json
import re
import time
from html import unescape
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client

from django_cogworker import api, heartbeat
from django_cogworker.admin.helpers import segment
from django_cogworker.connection import get_keys
from django_cogworker.fetch import UnitOfWork
from django_cogworker.ledger import Running
from django_cogworker.payload import MAX_DEPTH, encode
from django_cogworker.summaries import ARGS_PREVIEW_CHARS, ELLIPSIS, summary
from testproject.testapp import jobs
from tests.conftest import wait_for

BASE = "/admin/django_cogworker/job/"

#: What one running job's record may take in ``N:workers``, whatever its arguments.
RECORD_MAX_BYTES = 2048

BIG_ARGUMENT_CHARS = 2 * 1024 * 1024


# -- summaries.summary --------------------------------------------------------------------


def test_summary_of_a_normal_payload_has_its_fields_and_its_arguments_on_one_line():
    raw = encode(
        {
            "jid": "j1",
            "job": "app.jobs.send",
            "args": [1, "two", None],
            "kwargs": {"to": "a@example.com"},
            "queue": "mail",
            "retry_count": 2,
        }
    )
    assert summary(raw) == {
        "jid": "j1",
        "job": "app.jobs.send",
        "queue": "mail",
        "retry_count": 2,
        "args_preview": '1, "two", null, to="a@example.com"',
    }
    assert "retry_count" not in summary(encode({"jid": "j", "job": "a", "args": []}))


def test_summary_of_large_arguments_is_cut_with_an_ellipsis():
    raw = encode({"jid": "j", "job": "a", "args": ["x" * BIG_ARGUMENT_CHARS, list(range(10**5))]})
    about = summary(raw)
    assert about["args_preview"] == '"' + "x" * (ARGS_PREVIEW_CHARS - 1) + ELLIPSIS
    assert len(json.dumps(about)) < 400
    many = summary(encode({"jid": "j", "job": "a", "args": [], "kwargs": {"ids": list(range(10**5))}}))
    assert many["args_preview"].startswith("ids=[0, 1, 2, 3") and many["args_preview"].endswith(ELLIPSIS)
    assert len(many["args_preview"]) == ARGS_PREVIEW_CHARS + 1
    long_fields = summary(encode({"jid": "j" * 10**5, "job": "a" * 10**5, "queue": "q" * 10**5, "args": []}))
    assert len(json.dumps(long_fields)) < 1000


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"\xff not json", "payload is not valid JSON"),
        (b"[1, 2]", "payload is a JSON list, not an object"),
        (b"[" * 10_000 + b"]" * 10_000, "payload is nested too deeply to read"),
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "payload is nested too deeply to read"),
        (
            b'{"jid":"deep","job":"a","args":[' + b"[" * 10_000 + b"]" * 10_000 + b"]}",
            "payload is nested too deeply",
        ),
    ],
    ids=["not-json", "not-an-object", "deep", "just-too-deep", "deep-object"],
)
def test_summary_of_an_unreadable_payload_says_so_and_keeps_the_start_of_its_text(raw, why):
    about = summary(raw)
    assert about["unreadable"].startswith(why)
    assert about["jid"] == about["job"] == about["queue"] == ""
    start = raw.decode("utf-8", "replace")
    assert about["args_preview"].rstrip(ELLIPSIS) == start[:ARGS_PREVIEW_CHARS]
    assert len(json.dumps(about)) < 1000


def test_summary_of_a_misshapen_object_keeps_the_jid_it_can_read():
    about = summary(b'{"jid": "j7", "job": "a", "args": "not a list"}')
    assert about["jid"] == "j7" and about["job"] == "a"
    assert about["unreadable"] == "payload 'args' is not a list"


# -- the heartbeat's record -----------------------------------------------------------


class FakeManager:
    """What ``Heartbeat.running_records`` reads of a manager, and no more:
    its ledger's jobs running now (``snapshot()``, which parses every
    payload on each call, is absent)."""

    def __init__(self) -> None:
        self.running: dict[int, tuple[UnitOfWork, float, str]] = {}

    @property
    def ledger(self) -> FakeManager:
        return self

    def running_now(self) -> list[tuple[int, Running]]:
        return [
            (i, Running(work, at)) for i, (work, at, _) in sorted(self.running.items(), key=lambda e: e[0])
        ]


def test_each_running_job_is_summarised_once_not_on_every_beat(monkeypatch):
    calls: list[bytes] = []

    def counting(raw: bytes) -> dict[str, Any]:
        calls.append(raw)
        return summary(raw)

    monkeypatch.setattr(heartbeat, "summary", counting)
    manager = FakeManager()
    beat = heartbeat.Heartbeat(SimpleNamespace(), manager.ledger, None, None)  # type: ignore[arg-type]
    first = UnitOfWork("default", encode({"jid": "a", "job": "app.a", "args": ["x" * 10**6]}))
    second = UnitOfWork("mail", b"not json")
    manager.running = {0: (first, 100.0, ""), 3: (second, 101.0, "")}
    for _ in range(5):
        pairs = beat.running_records()
    assert calls == [first.raw, second.raw]
    records = dict(zip(pairs[::2], (json.loads(r) for r in pairs[1::2]), strict=True))
    assert set(records) == {"a", "unreadable-3"}
    assert records["a"] == {
        "jid": "a",
        "job": "app.a",
        "queue": "default",
        "args_preview": '"' + "x" * (ARGS_PREVIEW_CHARS - 1) + ELLIPSIS,
        "run_at": 100.0,
        "thread": 0,
    }
    assert records["unreadable-3"]["unreadable"].startswith("payload is not valid JSON")
    assert records["unreadable-3"]["queue"] == "mail"

    # The cache holds the jobs running now only.
    del manager.running[0]
    beat.running_records()
    assert [raw for raw, _ in beat.summaries.values()] == [second.raw]
    manager.running[1] = (first, 102.0, "")  # the same payload, running again
    beat.running_records()
    assert calls == [first.raw, second.raw, first.raw]


# -- against a real worker ----------------------------------------------------------------


def workers_record(cog, identity: str, jid: str) -> bytes | None:
    return cog.redis.hget(get_keys().workers(identity), jid)


def test_a_running_job_with_a_large_argument_leaves_a_small_record(cog, superclient):
    worker = cog.start_worker()
    identity = worker.identity()
    big = "<big>" + "x" * BIG_ARGUMENT_CHARS
    jid = jobs.sleep_then_record.delay(30, big)
    wait_for(lambda: cog.notes("started"), 20, "the job to start")
    raw = wait_for(lambda: workers_record(cog, identity, jid), 10, "the heartbeat to record the job")
    assert len(raw) < RECORD_MAX_BYTES
    record = json.loads(raw)
    assert (record["jid"], record["job"], record["queue"]) == (jid, jobs.sleep_then_record.name, "default")
    assert record["args_preview"].startswith('30, "<big>xxx') and record["args_preview"].endswith(ELLIPSIS)
    assert len(record["args_preview"]) == ARGS_PREVIEW_CHARS + 1
    assert "payload" not in record
    assert time.time() - 30 < record["run_at"] <= time.time()
    assert isinstance(record["thread"], int)
    # Beats later, the same summary (made once), still small.
    time.sleep(0.6)
    assert workers_record(cog, identity, jid) == raw

    [running] = api.Workers().all()
    assert (running.jid, running.name, running.queue, running.identity) == (
        jid,
        jobs.sleep_then_record.name,
        "default",
        identity,
    )
    assert running.args_preview == record["args_preview"] and running.unreadable == ""
    assert running.running_for_s >= 0 and running.thread == record["thread"]
    assert running.payload["args"] == [30, big]  # read whole from the in-progress list

    # The busy page: the preview (escaped), and a link to the whole job.
    body = superclient.get(BASE + "busy/").content.decode()
    assert "30, &quot;&lt;big&gt;xxx" in body and "x" * 1000 not in body
    [link] = re.findall(rf'href="({BASE}busy/[^"]+/job/[^"]+)"', body)
    assert unescape(link) == f"{BASE}busy/{segment(identity)}/job/{segment(jid)}/".replace("%", "%25")
    page = superclient.get(unescape(link))
    assert page.status_code == 200
    detail = page.content.decode()
    assert "&lt;big&gt;" + "x" * BIG_ARGUMENT_CHARS in detail  # the whole argument
    assert identity in detail and "Running on" in detail
    assert 'name="action"' not in detail  # no action on a running job (G2)
    # Seeing it takes a staff login with the view permission, as every page.
    assert Client().get(unescape(link)).status_code == 302


def test_the_page_of_a_job_no_longer_running_sends_back_to_the_busy_page(cog, superclient):
    response = superclient.get(f"{BASE}busy/{segment('host:1:gone')}/job/nope/", follow=True)
    assert response.redirect_chain[-1][0] == BASE + "busy/"
    assert "no longer running on host:1:gone" in response.content.decode()


def test_a_record_of_the_old_shape_with_the_whole_payload_is_still_shown(cog, superclient):
    """A process not yet upgraded writes the whole payload (rolling upgrade)."""
    r, k = cog.redis, get_keys()
    identity = "old-host:42:cafe"
    now = time.time()
    payload = {
        "jid": "old1",
        "job": jobs.record.name,
        "args": ["<old>", 2],
        "kwargs": {"k": "v"},
        "queue": "mail",
        "retry_count": 1,
    }
    r.sadd(k.processes, identity)
    r.hset(k.process(identity), mapping={"identity": identity, "pid": "42", "busy": "1", "beat": str(now)})
    r.expire(k.process(identity), 60)
    old = {"queue": "mail", "payload": encode(payload).decode(), "run_at": now - 5, "thread": 0}
    r.hset(k.workers(identity), "old1", json.dumps(old))
    r.rpush(k.inprogress(identity), encode(payload))

    [running] = api.Workers().all()
    assert (running.jid, running.name, running.queue, running.retry_count) == (
        "old1",
        jobs.record.name,
        "mail",
        1,
    )
    assert running.args_preview == '"<old>", 2, k="v"'
    assert running.payload == payload
    assert 4 <= running.running_for_s < 60

    body = superclient.get(BASE + "busy/").content.decode()
    assert jobs.record.name in body and "&quot;&lt;old&gt;&quot;, 2, k=&quot;v&quot;" in body
    [link] = re.findall(rf'href="({BASE}busy/[^"]+/job/[^"]+)"', body)
    detail = superclient.get(unescape(link)).content.decode()
    assert "&lt;old&gt;" in detail and "old1" in detail
