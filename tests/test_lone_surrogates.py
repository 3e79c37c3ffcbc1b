"""Lone surrogates (SPEC G13, section 8): a Python str may hold one
(``os.listdir`` makes them from file names that are not UTF-8) and JSON's
``"\\udcff"`` reads as one (JavaScript writes a cut-off emoji so). No UTF-8
can carry one. Whatever a payload's strings hold, the worker writes it
escaped (``\\udcff``, valid JSON that reads back the same), a job runs as
many times as its retries allow and is filed once, no thread or beat
fails; ``.delay()`` accepts one, escaped alike; the admin shows, retries,
deletes and kills such an entry. Real Redis, real worker processes."""

from __future__ import annotations

import json
import re
import time
from html import unescape
from typing import Any

import pytest

from django_cogworker import api, unique
from django_cogworker.admin.helpers import segment
from django_cogworker.connection import get_keys
from testproject.testapp import jobs
from tests.conftest import wait_for
from tests.test_deep_payloads import dead_entries, in_progress

BASE = "/admin/django_cogworker/job/"

#: One of each half: a file name's undecodable byte, a cut-off emoji.
LONE = pytest.mark.parametrize("char", ["\udcff", "\ud83d"], ids=["low", "high"])


def pushed(cog, payload: dict[str, Any], queue: str = "default") -> None:
    """Pushed as another producer would: JSON with the surrogate escaped."""
    cog.redis.lpush(get_keys().queue(queue), json.dumps(payload))


def crashes(log: str) -> int:
    """Tracebacks in a worker's log other than a failed job's own, which
    follow its ``failed (...)`` line or its ``traceback of attempt`` line:
    a thread, a beat or a poller that broke."""
    found = 0
    record = ""
    for line in log.splitlines():
        if line.startswith("Traceback"):
            found += 1  # Python's own hook: a thread died
        elif not line.startswith(" "):
            record = line
        elif line.strip().startswith("Traceback") and not (" failed (" in record or "traceback of" in record):
            found += 1
    return found


def runs(cog, tag: Any) -> int:
    return sum(1 for note in cog.notes() if note.get("tag") == tag)


def settled(cog, dead: int) -> list[dict[str, Any]]:
    """The dead entries once there are ``dead`` of them and no job is left
    in progress: from then on, nothing can run any of them again."""
    wait_for(
        lambda: len(dead_entries(cog)) >= dead and in_progress(cog) == 0, 20, f"{dead} dead, none running"
    )
    return dead_entries(cog)


# -- item 1: the worker ------------------------------------------------------------------


@LONE
def test_g13_a_failure_message_with_a_lone_surrogate_runs_as_its_retries_allow_and_is_filed_once(cog, char):
    message = f"report{char}.csv: not a CSV file"
    payload = jobs.fail.payload((message,), {})
    payload["retry"] = 1
    pushed(cog, payload)
    worker = cog.start_worker()
    [entry] = settled(cog, 1)
    assert runs(cog, message) == 2
    assert entry["jid"] == payload["jid"] and entry["retry_count"] == 1
    assert entry["error_message"] == message  # escaped in Redis, the same str read back
    assert cog.redis.zcard(get_keys().retry) == 0
    log = worker.log()
    failed_lines = [
        line for line in log.splitlines() if f"jid={payload['jid']} " in line and " failed (" in line
    ]
    assert len(failed_lines) == 2, log  # one retry line, one dead line
    assert "failed unexpectedly" not in log and crashes(log) == 0
    assert worker.alive()


@LONE
def test_g13_a_jid_with_a_lone_surrogate_runs_once_and_every_beat_records_it(cog, char):
    payload = jobs.sleep_then_record.payload((1.5, "slow"), {})
    payload["jid"] = f"job{char}"
    pushed(cog, payload)
    worker = cog.start_worker()
    identity = worker.identity()
    workers = get_keys().workers(identity)
    # The beat that records the running job is the one that failed before.
    [field] = wait_for(lambda: cog.redis.hkeys(workers), 15, "a beat recording the running job")
    assert field.decode() == "job\\u" + f"{ord(char):04x}"
    beat = cog.redis.hget(get_keys().process(identity), "beat")
    wait_for(lambda: runs(cog, "slow") == 1 and in_progress(cog) == 0, 15, "the run and its ack")
    wait_for(lambda: cog.redis.hget(get_keys().process(identity), "beat") != beat, 5, "a later beat")
    assert runs(cog, "slow") == 1 and dead_entries(cog) == []
    assert "heartbeat failed" not in worker.log() and crashes(worker.log()) == 0


@LONE
def test_g13_a_job_name_with_a_lone_surrogate_is_filed_in_dead_once(cog, char):
    payload = jobs.record.payload(("x",), {})
    payload["job"] = f"app.jobs.import{char}"
    pushed(cog, payload)
    worker = cog.start_worker()
    [entry] = settled(cog, 1)
    assert entry["job"] == payload["job"] and "not registered" in entry["error_message"]
    after = jobs.record.delay("after")
    wait_for(lambda: any(n["jid"] == after for n in cog.notes()), 15, "a job after it")
    assert len(dead_entries(cog)) == 1 and crashes(worker.log()) == 0


@LONE
def test_g13_a_queue_name_with_a_lone_surrogate_takes_the_retry_to_that_queue_escaped(cog, char):
    payload = jobs.fail.payload(("to another queue",), {})
    payload.update(retry=1, queue=f"q{char}")
    pushed(cog, payload)
    worker = cog.start_worker()
    name = "q\\u" + f"{ord(char):04x}"
    wait_for(lambda: cog.redis.llen(get_keys().queue(name)) == 1, 15, "the retry moved to its queue")
    assert name in [q.name for q in api.Queue.all()]
    [waiting] = api.Queue(name).page()
    assert waiting.jid == payload["jid"] and waiting.queue == f"q{char}"
    # The poller went on: a job due after it is moved and run.
    later = jobs.record.delay_in(0.1, "due later")
    wait_for(lambda: any(n["jid"] == later for n in cog.notes()), 15, "a due job after it")
    # Its ack may follow its note by a moment (it rides the thread's next call).
    wait_for(lambda: in_progress(cog) == 0, 15, "the due job's ack")
    assert runs(cog, "to another queue") == 1 and in_progress(cog) == 0
    assert "poller" not in worker.log() and crashes(worker.log()) == 0


@LONE
def test_g3_a_dead_process_job_with_a_lone_surrogate_in_its_jid_and_queue_is_recovered_once(cog, char):
    k = get_keys()
    identity = "host:9:dead"
    payload = jobs.record.payload(("recovered",), {})
    payload["jid"] = f"orphan{char}"
    cog.redis.rpush(k.inprogress(identity), json.dumps(payload))
    lost = jobs.record.payload(("elsewhere",), {})
    lost.update(jid=f"lost{char}", queue=f"q{char}")
    cog.redis.rpush(k.inprogress(identity), json.dumps(lost))
    cog.redis.sadd(k.inprogress_identities, identity)
    cog.redis.hset(k.last_beat, identity, time.time() - 3600)
    worker = cog.start_worker()
    wait_for(lambda: runs(cog, "recovered") == 1 and in_progress(cog) == 0, 20, "the recovered job's run")
    name = "q\\u" + f"{ord(char):04x}"
    [waiting] = api.Queue(name).page()  # the other one, back on its own queue
    assert waiting.jid == lost["jid"]
    # Its counter (G3) is kept under the jid as text, and the finished one's is gone.
    assert [key.decode() for key in cog.redis.scan_iter(match=cog.key("orphanings:*"))] == [
        k.orphanings("lost\\u" + f"{ord(char):04x}")
    ]
    assert runs(cog, "recovered") == 1 and crashes(worker.log()) == 0


def test_g13_a_number_json_cannot_write_runs_as_its_retries_allow_and_is_filed_once(cog):
    payload = jobs.fail.payload(("huge",), {})
    payload["retry"] = 1
    raw = json.dumps(payload).removesuffix("}") + ', "weight": 1e999, "ratio": -1e999}'
    cog.redis.lpush(get_keys().queue("default"), raw)
    cog.start_worker()
    [entry] = settled(cog, 1)
    assert runs(cog, "huge") == 2 and (entry["weight"], entry["ratio"]) == (float("inf"), float("-inf"))


def test_g13_a_job_that_meets_a_bug_of_ours_is_filed_in_dead_once_not_run_again_and_again(
    cog, in_process, monkeypatch
):
    """The net under every case above: whatever string or bug makes
    processing a job fail in the worker's own code (not the job's), the job
    is filed in dead once, raw kept, and its thread goes on."""
    from django_cogworker import execution

    real = execution.execute
    calls: list[str] = []

    def execute(raw: bytes, *args: Any, **kwargs: Any) -> Any:
        if b"meets-a-bug" in raw:
            calls.append("bug")
            raise UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed")
        return real(raw, *args, **kwargs)

    monkeypatch.setattr(execution, "execute", execute)
    jid = jobs.record.delay("meets-a-bug")
    in_process(concurrency=1)
    [entry] = settled(cog, 1)
    assert entry["jid"] == jid and entry["error_class"] == "UnicodeEncodeError"
    after = jobs.record.delay("after")
    wait_for(lambda: any(n["jid"] == after for n in cog.notes()), 10, "a job after it, on the same thread")
    assert calls == ["bug"] and len(dead_entries(cog)) == 1


# -- item 11: .delay() ------------------------------------------------------------------


@LONE
def test_delay_accepts_a_lone_surrogate_escaped_and_the_job_receives_it(cog, char):
    tag = f"name{char}"
    jid = jobs.record.delay(tag)
    many = jobs.record.delay_many([((tag,), {}), ((), {"tag": tag})])
    later = jobs.record.delay_in(0.1, tag)
    unique_jid = jobs.record.set(unique_for=30).delay(tag)
    raws = cog.redis.lrange(get_keys().queue("default"), 0, -1)
    raws += cog.redis.zrange(get_keys().schedule, 0, -1)
    assert len(raws) == 5
    for raw in raws:
        assert "\\u" + f"{ord(char):04x}" in raw.decode("utf-8")  # valid UTF-8, the surrogate escaped
    assert unique.digest(jobs.record.set(unique_for=30).payload((tag,), {})) in {
        key.decode().rpartition(":")[2] for key in cog.redis.scan_iter(match=cog.key("unique:*"))
    }
    cog.start_worker()
    want = {jid, *many, later, unique_jid}
    wait_for(lambda: {n["jid"] for n in cog.notes()} >= want, 15, "every job to run")
    assert all(n["tag"] == tag for n in cog.notes())


@LONE
def test_a_queue_named_with_a_lone_surrogate_is_refused_where_it_is_named(cog, char):
    with pytest.raises(TypeError, match="holds a lone surrogate, which no Redis key can carry"):
        jobs.record.set(queue=f"q{char}")
    assert cog.redis.keys(cog.key("*")) == []


def test_the_digests_of_arguments_with_a_lone_surrogate_are_taken_and_tell_them_apart():
    from django_cogworker.periodic.entry import Entry

    entries = [Entry("*/5 * * * *", jobs.record.name, (c,)) for c in ("\udcff", "\udcfe", "\ud83d")]
    assert len({e.pjid for e in entries}) == 3
    payloads = [jobs.record.set(unique_for=30).payload((c,), {}) for c in ("\udcff", "\udcfe")]
    assert len({unique.digest(p) for p in payloads}) == 2


# -- item 4: the admin ------------------------------------------------------------------


def stored(char: str, jid: str) -> dict[str, Any]:
    return {
        **jobs.record.payload((f"arg{char}",), {"k": char}),
        "jid": jid,
        "queue": f"default{char}",
        "retry_count": 0,
        "error_class": f"Error{char}",
        "error_message": f"{char}: not a CSV file",
        "error_backtrace": [f"ValueError: {char}"],
        "failed_at": time.time(),
    }


SETS = {
    "dead": (api.DeadSet, "dead"),
    "scheduled": (api.ScheduledSet, "schedule"),
    "retries": (api.RetrySet, "retry"),
}


@LONE
@pytest.mark.parametrize("set_name", sorted(SETS))
def test_an_entry_with_a_lone_surrogate_is_shown_retried_killed_and_deleted(cog, superclient, char, set_name):
    k = get_keys()
    source, key = SETS[set_name]
    zset = getattr(k, key)
    for jid in (f"retry{char}", f"kill{char}", f"delete{char}", "plain"):
        cog.redis.zadd(zset, {json.dumps(stored(char, jid)): time.time() + 600})
    escaped = "\\u" + f"{ord(char):04x}"
    body = superclient.get(f"{BASE}{set_name}/").content.decode()
    assert body.count(f"{escaped}: not a CSV file") >= 4
    links = [unescape(link) for link in re.findall(rf'href="({BASE}{set_name}/job/[^"]+)"', body)]
    assert len(links) == 4
    for link in links:
        page = superclient.get(link)
        assert page.status_code == 200 and f"{escaped}: not a CSV file" in page.content.decode()
    # Each action from the job's own page (a dead job is not killed again).
    for record in source().page():
        action = record.jid.removesuffix(char)
        if record.jid == "plain" or (action == "kill" and set_name == "dead"):
            continue
        url = f"{BASE}{set_name}/job/{segment(record.id).replace('%', '%25')}/action/"
        response = superclient.post(url, {"action": action}, follow=True)
        assert response.status_code == 200
        assert "no longer in" not in response.content.decode(), action
    left = {json.loads(raw)["jid"] for raw in cog.redis.zrange(zset, 0, -1)}
    assert left == ({"plain", f"kill{char}"} if set_name == "dead" else {"plain"})
    [retried] = cog.redis.lrange(k.queue(f"default{escaped}"), 0, -1)
    assert json.loads(retried)["jid"] == f"retry{char}"
    if set_name != "dead":
        assert [json.loads(raw)["jid"] for raw in cog.redis.zrange(k.dead, 0, -1)] == [f"kill{char}"]
    # And in bulk: every entry left, at once.
    response = superclient.post(
        f"{BASE}{set_name}/action/", {"action": "delete", "select_across": "1", "post": "yes"}, follow=True
    )
    assert response.status_code == 200 and cog.redis.zcard(zset) == 0


@LONE
def test_a_queued_entry_an_unsettled_one_and_a_running_record_with_a_lone_surrogate_show(
    cog, superclient, char
):
    k = get_keys()
    # An unsettled record's payload is JSON text inside JSON: the surrogate
    # reaches the str raw, escaped only in the record around it.
    unsettled = stored(char, f"unsettled{char}")
    unsettled["queue"] = "default"
    inner = json.dumps(unsettled, ensure_ascii=False)
    cog.redis.rpush(k.unsettled, json.dumps({"set": k.dead, "score": time.time(), "payload": inner}))
    body = superclient.get(BASE + "unsettled/").content.decode()
    [link] = re.findall(rf'href="({BASE}unsettled/job/[^"]+)"', body)
    assert superclient.get(unescape(link)).status_code == 200
    assert superclient.post(unescape(link) + "action/", {"action": "retry"}).status_code == 302
    assert cog.redis.llen(k.unsettled) == 0 and cog.redis.llen(k.queue("default")) == 1
    queued = stored(char, f"queued{char}")
    queued["queue"] = "default"
    pushed(cog, queued)
    identity = "host:1:lone"
    running = jobs.record.payload((f"arg{char}",), {})
    running["jid"] = f"run{char}"
    cog.redis.sadd(k.processes, identity)
    cog.redis.hset(k.process(identity), mapping={"identity": identity, "pid": "1", "beat": str(time.time())})
    cog.redis.rpush(k.inprogress(identity), json.dumps(running))
    record = {"jid": running["jid"], "job": running["job"], "queue": "default", "thread": 1}
    record.update(args_preview=json.dumps(running["args"][0]), run_at=time.time())
    cog.redis.hset(k.workers(identity), "run\\u" + f"{ord(char):04x}", json.dumps(record))
    queue_page = superclient.get(BASE + "queues/default/")
    assert queue_page.status_code == 200 and "arg\\u" in queue_page.content.decode()
    busy = superclient.get(BASE + "busy/")
    assert busy.status_code == 200
    [link] = re.findall(rf'href="({BASE}busy/[^"]+/job/[^"]+)"', busy.content.decode())
    page = superclient.get(unescape(link))
    assert page.status_code == 200 and "arg\\u" in page.content.decode()
