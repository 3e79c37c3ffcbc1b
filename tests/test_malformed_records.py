"""Malformed records in Redis never take an admin page or the API down (SPEC
section 8): a process hash whose fields are not numbers or not JSON, a set
member that is not UTF-8, a counter that is not a number, a key of the
wrong type, a job time of -Infinity, a running job's record with a start
that is not a time, a payload nested 2,000 deep, a page number of 30
digits. Each is shown as malformed (or skipped, with a note saying so) and
the rest of the page is there. Also: the queues of ``QUEUES`` are listed
(and can be paused) before their first job. Real Redis, Django's test
client."""

from __future__ import annotations

import json
import re
import time
from html import unescape
from typing import Any

import pytest

from django_cogworker import api
from django_cogworker.admin.helpers import segment
from django_cogworker.payload import encode
from testproject.testapp import jobs

BASE = "/admin/django_cogworker/job/"

RECORD = "testproject.testapp.jobs.record"

GOOD, BAD = "host:1:good", "host:2:bad"

NOT_UTF8 = b"\xff\xfe"

HUGE_PAGE = "123456789012345678901234567890"


def body_of(client: Any, path: str) -> str:
    """The page at ``path`` (HTTP 200 asserted), its entities decoded."""
    response = client.get(BASE + path)
    assert response.status_code == 200, (path, response.status_code)
    return unescape(response.content.decode())


def add_process(cog: Any, identity: str, **fields: str) -> None:
    """A live process as its heartbeat records it, with ``fields`` overridden."""
    now = time.time()
    record = {
        "identity": identity,
        "hostname": "host",
        "pid": "4242",
        "tag": "",
        "concurrency": "5",
        "busy": "1",
        "queues": '["default", "mail"]',
        "quiet": "0",
        "started_at": repr(now - 60),
        "beat": repr(now),
        "rss_kb": "2048",
        "fetch": "reliable",
        "recovery": "{}",
        **fields,
    }
    cog.redis.sadd(cog.key("processes"), identity)
    cog.redis.hset(cog.key(f"process:{identity}"), mapping=record)
    cog.redis.expire(cog.key(f"process:{identity}"), 60)


def payload(jid: str, **fields: Any) -> dict[str, Any]:
    now = time.time()
    return {
        "jid": jid,
        "job": RECORD,
        "args": [1, "two"],
        "kwargs": {},
        "queue": "default",
        "retry": 3,
        "created_at": now - 100,
        "enqueued_at": now - 90,
        "error_class": "ValueError",
        "error_message": "boom",
        "failed_at": now - 10,
        **fields,
    }


def detail_links(body: str, set_name: str) -> list[str]:
    return [unescape(link) for link in re.findall(rf'href="({BASE}{set_name}/job/[^"]+)"', body)]


# -- 1, 2: a process hash ----------------------------------------------------------------


def test_a_process_hash_whose_pid_is_not_a_number_is_shown_as_malformed(cog, superclient):
    add_process(cog, GOOD, pid="4242")
    add_process(cog, BAD, pid="abc")
    good, bad = api.ProcessSet().all()
    assert (good.identity, good.pid, good.malformed) == (GOOD, 4242, {})
    assert (bad.identity, bad.pid, bad.concurrency) == (BAD, 0, 5)
    assert bad.malformed == {"pid": "'abc' is not a whole number"}
    for path in ("busy/", "dashboard/"):
        body = body_of(superclient, path)
        assert GOOD in body and BAD in body
        assert body.count(">malformed</span>") == 1
        assert "pid: 'abc' is not a whole number" in body
    assert "<td>4242</td>" in body_of(superclient, "busy/")


def test_a_process_hash_whose_queues_are_not_json_is_shown_as_malformed(cog, superclient):
    add_process(cog, GOOD)
    add_process(cog, BAD, queues="not json")
    good, bad = api.ProcessSet().all()
    assert (good.queues, good.malformed) == (["default", "mail"], {})
    assert bad.queues == [] and bad.busy == 1
    assert bad.malformed["queues"].startswith("not valid JSON")
    for path in ("busy/", "dashboard/"):
        body = body_of(superclient, path)
        assert GOOD in body and BAD in body and "default, mail" in body
        assert body.count(">malformed</span>") == 1
        assert "queues: not valid JSON" in body


# -- 3: set members that are not UTF-8 ------------------------------------------------


def test_members_of_the_processes_and_queues_sets_that_are_not_utf8_are_skipped_with_a_note(cog, superclient):
    add_process(cog, GOOD)
    cog.redis.sadd(cog.key("processes"), NOT_UTF8)
    jobs.record.delay("waiting")
    cog.redis.sadd(cog.key("queues"), NOT_UTF8)
    processes_note = f"a member of {cog.key('processes')} is not UTF-8 text (b'\\xff\\xfe'): skipped"
    queues_note = f"a member of {cog.key('queues')} is not UTF-8 text (b'\\xff\\xfe'): skipped"

    processes = api.ProcessSet().all()
    assert [p.identity for p in processes] == [GOOD] and processes.skipped == [processes_note]
    running = api.Workers().all()
    assert running == [] and running.skipped == [processes_note]
    queues = api.Queue.all()
    assert [q.name for q in queues] == ["default"] and queues.skipped == [queues_note]
    stats = api.Stats()
    assert stats.queue_sizes == {"default": 1} and stats.skipped == [queues_note]

    # Each note once, though several readings of the set skip the member.
    dashboard = body_of(superclient, "dashboard/")
    assert GOOD in dashboard and ">default</a>" in dashboard
    assert dashboard.count(processes_note) == 1 and dashboard.count(queues_note) == 1
    busy = body_of(superclient, "busy/")
    assert GOOD in busy and busy.count(processes_note) == 1
    queues_page = body_of(superclient, "queues/")
    assert ">default</a>" in queues_page and queues_page.count(queues_note) == 1
    # Every other page renders too: each reads the tabs' counts.
    for path in ("queues/default/", "dead/", "scheduled/", "periodic/"):
        assert 'aria-label="Jobs"' in body_of(superclient, path)


# -- 4: a counter that is not a number ------------------------------------------------


def test_a_total_that_is_not_a_number_is_shown_as_malformed(cog, superclient):
    today = time.strftime("%Y-%m-%d", time.gmtime())
    cog.redis.set(cog.key("stat:processed"), "abc")
    cog.redis.set(cog.key("stat:failed"), 7)
    cog.redis.set(cog.key(f"stat:processed:{today}"), "abc")
    cog.redis.set(cog.key(f"stat:failed:{today}"), 2)
    cog.redis.rpush(cog.key("unsettled"), "x")
    cog.redis.set(cog.key("dead"), "a string, not a sorted set")
    note = f"{cog.key('stat:processed')}: 'abc' is not a whole number"

    stats = api.Stats()
    assert (stats.processed, stats.failed, stats.unsettled_size, stats.dead_size) == (0, 7, 1, 0)
    assert stats.malformed == {"processed": note, "dead_size": f"{cog.key('dead')} is not a sorted set"}
    history = api.Stats.history(1)
    assert [(p, f) for _, p, f in history] == [(0, 2)]
    assert history.skipped == [f"{cog.key(f'stat:processed:{today}')}: 'abc' is not a whole number"]

    body = body_of(superclient, "dashboard/")
    assert "<strong>7</strong>Failed" in body
    assert 'Processed <span class="cog-badge cog-bad">malformed</span>' in body
    assert note in body and history.skipped[0] in body
    assert f"{cog.key('dead')} is not a sorted set" in body
    assert 'aria-label="Jobs"' in body_of(superclient, "unsettled/")


# -- 5: N:paused of the wrong type ------------------------------------------------------


@pytest.mark.parametrize("kind", ["string", "list"])
def test_a_paused_key_of_the_wrong_type_is_noted_and_the_queues_still_show(cog, superclient, kind):
    jobs.record.delay("waiting")
    if kind == "string":
        cog.redis.set(cog.key("paused"), "default")
    else:
        cog.redis.rpush(cog.key("paused"), "default")
    note = f"{cog.key('paused')} is not a set: no queue shows as paused"

    queues = api.Queue.all()
    assert [(q.name, q.size, q.paused) for q in queues] == [("default", 1, False)]
    assert [n for n in queues.skipped if n.startswith(note)] == queues.skipped != []

    for path in ("queues/", "dashboard/"):
        body = body_of(superclient, path)
        assert ">default</a>" in body and note in body
    body = body_of(superclient, "queues/default/")
    assert '"waiting"' in body and note in body

    response = superclient.post(BASE + "queues/default/action/", {"action": "pause"}, follow=True)
    assert response.status_code == 200
    said = " ".join(str(m) for m in response.context["messages"])
    assert "Could not pause queue default" in said and "WRONGTYPE" in said
    assert ">default</a>" in unescape(response.content.decode())


# -- 6: a time of -Infinity --------------------------------------------------------


NEG_INF_JSON = json.dumps(payload("neg-inf", enqueued_at=float("-inf")))  # writes -Infinity
NEG_1E400 = b'{"jid":"neg-1e400","enqueued_at":-1e400}'


def test_a_job_enqueued_at_minus_infinity_in_a_queue_shows_and_the_queue_has_no_latency(cog, superclient):
    q = cog.key("queue:default")
    cog.redis.rpush(q, NEG_INF_JSON)  # the oldest: it decides the latency
    cog.redis.lpush(q, NEG_1E400, encode(payload("good")))
    cog.redis.sadd(cog.key("queues"), "default")
    queue = api.Queue("default")
    assert queue.latency == 0.0
    assert [r.jid for r in queue] == ["neg-inf", "neg-1e400", "good"]

    for path in ("queues/", "dashboard/"):
        assert ">default</a>" in body_of(superclient, path)
    body = body_of(superclient, "queues/default/")
    assert "neg-inf" in body and "neg-1e400" in body and "good" in body
    assert "Latency <strong>0.0 s</strong>" in body


@pytest.mark.parametrize(("where", "set_name"), [("retry", "retries"), ("dead", "dead")])
def test_a_job_enqueued_at_minus_infinity_in_a_set_shows_and_can_be_acted_on(
    cog, superclient, where, set_name
):
    now = time.time()
    cog.redis.zadd(
        cog.key(where),
        {NEG_INF_JSON: now + 30, NEG_1E400: now + 20, encode(payload("good")): now + 10},
    )
    jobs_set = api.RetrySet() if where == "retry" else api.DeadSet()
    records = {r.jid: r for r in jobs_set}
    assert set(records) == {"neg-inf", "neg-1e400", "good"}
    assert records["neg-inf"].enqueued_at == float("-inf")

    body = body_of(superclient, f"{set_name}/")
    assert "neg-inf" in body and "neg-1e400" in body and "good" in body
    links = detail_links(body, set_name)
    assert len(links) == 3
    for link in links:
        assert superclient.get(link).status_code == 200, link
    # An action writes the payload again: its -Infinity must not fail the write.
    action, done, to = (
        ("kill", "Killed job", "dead") if where == "retry" else ("retry", "Retried job", "queue")
    )
    for record in records.values():
        url = f"{BASE}{set_name}/job/{segment(record.id).replace('%', '%25')}/action/"
        response = superclient.post(url, {"action": action}, follow=True)
        assert response.status_code == 200
        said = [str(m) for m in response.context["messages"]]
        assert any(m.startswith(done) for m in said), said
    assert cog.redis.zcard(cog.key(where)) == 0
    if to == "dead":
        moved = cog.redis.zrange(cog.key("dead"), 0, -1)
    else:
        moved = cog.redis.lrange(cog.key("queue:default"), 0, -1)
    by_jid = {json.loads(m)["jid"]: json.loads(m) for m in moved}
    assert set(by_jid) == {"neg-inf", "neg-1e400", "good"}
    assert by_jid["neg-inf"]["args"] == [1, "two"]
    if to == "dead":
        assert by_jid["neg-inf"]["enqueued_at"] == float("-inf")  # kept as it was
        assert by_jid["neg-1e400"]["error_class"] == "Killed"


# -- 7: a running job whose start is not a time ----------------------------------------


def test_a_running_job_whose_run_at_is_not_a_number_is_shown_as_malformed(cog, superclient):
    add_process(cog, GOOD)
    now = time.time()
    good = {"jid": "good-run", "job": RECORD, "queue": "default", "args_preview": '"fine"', "run_at": now}
    bad = {**good, "jid": "bad-run", "run_at": "abc"}
    cog.redis.hset(
        cog.key(f"workers:{GOOD}"), mapping={"good-run": json.dumps(good), "bad-run": json.dumps(bad)}
    )
    running = {j.jid: j for j in api.Workers().all()}
    assert running["good-run"].malformed == {} and running["good-run"].run_at == now
    assert running["bad-run"].malformed == {"run_at": "'abc' is not a number"}
    assert running["bad-run"].name == RECORD

    body = body_of(superclient, "busy/")
    assert "good-run" in body and "bad-run" in body and '"fine"' in body
    assert body.count(">malformed</span>") == 1
    assert "run_at: 'abc' is not a number" in body
    assert " d " not in body  # no "20,000 d" of running since 1970


# -- 8: a payload nested 2,000 deep ------------------------------------------------


DEEP = b'{"jid":"deep","job":"' + RECORD.encode() + b'","args":[' + b"[" * 2000 + b"]" * 2000 + b"]}"


def test_a_payload_nested_2000_deep_shows_as_unreadable_in_a_queue_and_in_dead(cog, superclient):
    cog.redis.lpush(cog.key("queue:default"), encode(payload("good-queued")), DEEP)
    cog.redis.sadd(cog.key("queues"), "default")
    now = time.time()
    cog.redis.zadd(cog.key("dead"), {DEEP: now, encode(payload("good-dead")): now - 1})

    body = body_of(superclient, "queues/default/")
    assert "good-queued" in body
    assert ">unreadable</span>" in body and "payload is nested too deeply" in body

    body = body_of(superclient, "dead/")
    assert "good-dead" in body and "Unreadable: payload is nested too deeply" in body
    links = detail_links(body, "dead")
    assert len(links) == 2
    details = [body_of(superclient, link.removeprefix(BASE)) for link in links]
    deep = next(d for d in details if "[[[[" in d)
    assert "nested too deeply" in deep
    assert any("good-dead" in d and "boom" in d for d in details)


# -- 9: a page number of 30 digits -------------------------------------------------------


@pytest.mark.parametrize("parameter", ["p", "page"])
@pytest.mark.parametrize("path", ["scheduled/", "retries/", "dead/", "unsettled/", "queues/default/"])
def test_a_page_number_of_30_digits_shows_the_last_page(cog, superclient, path, parameter):
    now = time.time()
    for where in ("schedule", "retry", "dead"):
        cog.redis.zadd(cog.key(where), {encode(payload(f"job-{i}")): now + i for i in range(30)})
    for i in range(30):
        cog.redis.rpush(
            cog.key("unsettled"),
            json.dumps(
                {"set": cog.key("dead"), "score": now, "payload": encode(payload(f"job-{i}")).decode()}
            ),
        )
        cog.redis.lpush(cog.key("queue:default"), encode(payload(f"job-{i}")))
    cog.redis.sadd(cog.key("queues"), "default")

    body = body_of(superclient, f"{path}?{parameter}={HUGE_PAGE}")
    shown = set(re.findall(r"job-\d+", body))
    if parameter == "p":  # the page parameter of the admin's lists: the last page
        assert 'aria-current="page">2</span>' in body and len(shown) == 5
    else:  # not a parameter the lists read: the first page
        assert 'aria-current="page">1</span>' in body and len(shown) == 25


# -- configured queues -------------------------------------------------------------------


def test_queue_all_lists_the_configured_queues_before_their_first_job(cog):
    cog.configure(QUEUES=["critical,3", "default,1"])
    jobs.record.set(queue="low").delay()
    assert [(q.name, q.size) for q in api.Queue.all()] == [("critical", 0), ("default", 0), ("low", 1)]


def test_the_queues_page_lists_a_configured_queue_with_no_job_and_pauses_it(cog, superclient):
    cog.configure(QUEUES=["critical", "default"])
    body = body_of(superclient, "queues/")
    assert ">critical</a>" in body and ">default</a>" in body
    assert cog.redis.exists(cog.key("queue:critical")) == 0

    response = superclient.post(
        BASE + f"queues/{segment('critical')}/action/", {"action": "pause"}, follow=True
    )
    assert response.status_code == 200
    assert cog.redis.smembers(cog.key("paused")) == {b"critical"}
    assert api.Queue("critical").paused
    row = re.search(r">critical</a>.*?</tr>", unescape(response.content.decode()), re.S)
    assert row is not None and 'cog-badge">paused' in row.group(0)


# -- also: a periodic entry's last run that is not a time ---------------------------------


def test_a_periodic_last_run_that_is_not_a_time_shows_as_never_with_a_note(cog, superclient):
    cog.configure(
        PERIODIC=[
            {"cron": "*/5 * * * *", "job": RECORD, "args": ["bad"]},
            {"cron": "*/7 * * * *", "job": RECORD, "args": ["good"]},
        ]
    )
    bad, good = api.PeriodicEntries().all()
    cog.redis.hset(cog.key("periodic:last"), mapping={bad.pjid: "abc", good.pjid: repr(time.time() - 60)})
    entries = api.PeriodicEntries().all()
    assert [e.last_run is None for e in entries] == [True, False]
    note = f"{cog.key('periodic:last')} {bad.pjid}: 'abc' is not a number: shown as never run"
    assert entries.skipped == [note]
    body = body_of(superclient, "periodic/")
    assert "*/5 * * * *" in body and "*/7 * * * *" in body and "never" in body and note in body
