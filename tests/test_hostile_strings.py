"""A battery of hostile strings through every path a string takes (SPEC G13,
sections 8 and 12): lone surrogates of both halves, NUL, C0 and C1
controls, bidi controls, a 1 MB string, and bytes that are not UTF-8, as
``.delay()`` arguments, failure messages, job names and jids and queue
names in payloads pushed from outside, and entries stored in the dead,
retry and scheduled sets. All of them at once, through one real worker;
then every admin page, the job page of every entry, ``/metrics``,
``cogworker_status`` and the worker's heartbeat still work, each job ran
its due number of times (counted in Redis), and the stored entries can be
retried, killed and deleted from their pages."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from html import unescape
from typing import Any

import pytest
from django.contrib import admin
from django.urls import path
from prometheus_client.parser import text_string_to_metric_families

from django_cogworker import api, views
from django_cogworker.admin.helpers import segment
from django_cogworker.connection import get_keys
from django_cogworker.escaping import storable
from django_cogworker.payload import encode
from django_cogworker.summaries import summary_field
from testproject.testapp import jobs
from tests.conftest import MANAGE, ROOT, manage_env, wait_for
from tests.test_deep_payloads import in_progress

urlpatterns = [path("admin/", admin.site.urls), path("cogworker/metrics", views.metrics)]
pytestmark = pytest.mark.urls(__name__)

BASE = "/admin/django_cogworker/job/"

#: Strings a Python str can hold. Payloads from outside are pushed as
#: ``json.dumps`` writes them (every one of these escaped); stored entries
#: as ``payload.encode`` writes them (raw UTF-8 where JSON allows it).
KINDS = {
    "low-surrogate": "report\udcff.csv",
    "high-surrogate": "cut emoji \ud83d",
    "nul": "nul\x00byte",
    "c0": "line\nforged: 0 waiting\r\x1b[2J\x07",
    "c1": "csi\x9b31m\x85next",
    "bidi": "\u202egnp.exe\u2066\u200f",
    "1mb": "m" * 1_000_000,
}

#: Bytes, pushed raw: a surrogate as UTF-8 would write it (CESU-8, Java's
#: modified UTF-8), and bytes that are not UTF-8 at all.
RAW = {"surrogate-bytes": b"\xed\xb3\xbf", "not-utf8": b"\xff\xfe"}

#: The sets whose stored entries are listed, and the action tried on each.
STORED = {"dead": ("dead", "delete"), "retries": ("retry", "kill"), "scheduled": ("schedule", "retry")}


def outside(cog: Any, payload: dict[str, Any]) -> None:
    cog.redis.lpush(get_keys().queue("default"), json.dumps(payload))


def stored_entry(kind: str, s: str, where: str) -> dict[str, Any]:
    return {
        **jobs.record.payload((s,), {"k": s}),
        "jid": f"{where}:{kind}:{s}",
        "job": s,
        "queue": s,
        "retry_count": 0,
        "error_class": s,
        "error_message": s,
        "error_backtrace": [s],
        "failed_at": time.time(),
    }


@pytest.fixture
def battery(cog: Any, superclient: Any) -> dict[str, Any]:
    """Every input through every path, one worker for all; what is due."""
    k = get_keys()
    due: dict[str, Any] = {"runs": Counter(), "dead": 0, "waiting": {}}
    for kind, s in KINDS.items():
        due["runs"][jobs.record.delay(s)] = 1  # a .delay() argument
        due["runs"][jobs.fail.set(retry=1).delay(s)] = 2  # a failure message
        named = jobs.record.payload((f"name:{kind}",), {})
        named["job"] = s  # a job name: not registered, filed in dead
        outside(cog, named)
        running = jobs.wait_for_go.payload((f"jid:{kind}", 60), {})
        running["jid"] = s  # a jid: running until the test says go
        outside(cog, running)
        due["runs"][f"jid:{kind}"] = 1
        queued = jobs.fail.payload((f"queue:{kind}",), {})
        queued.update(queue=s, retry=1)  # a queue name: its retry goes to that queue
        outside(cog, queued)
        due["runs"][queued["jid"]] = 1
        due["waiting"][storable(s)] = queued["jid"]
        for where, (key, _) in STORED.items():
            score = time.time() + (0 if where == "dead" else 3600)
            cog.redis.zadd(getattr(k, key), {encode(stored_entry(kind, s, where)): score})
    due["dead"] += len(KINDS) * 3  # the failures, the job names, the stored dead entries
    for raw in RAW.values():
        cog.redis.lpush(k.queue("default"), b'{"jid":"' + raw + b'","job":"x","args":[]}')
        for where, (key, _) in STORED.items():
            entry = b'{"jid":"' + where.encode() + raw + b'","job":"' + raw + b'","queue":"' + raw + b'"}'
            cog.redis.zadd(getattr(k, key), {entry: time.time() + (0 if where == "dead" else 3600)})
    due["dead"] += len(RAW) * 2
    worker = cog.start_worker("-c", "12")
    due["worker"], due["identity"] = worker, worker.identity()
    return due


def runs_by_job(cog: Any) -> Counter:
    """Runs noted, by jid, or by tag when the jid is the hostile string."""
    counted: Counter = Counter()
    for note in cog.notes():
        tag = note.get("tag")
        counted[tag if isinstance(tag, str) and tag.startswith("jid:") else note["jid"]] += 1
    return counted


def readable_dead(cog: Any) -> list[dict[str, Any]]:
    """The dead entries JSON can read (the stored ones of ``RAW`` it cannot)."""
    found = []
    for raw in cog.redis.zrange(get_keys().dead, 0, -1):
        try:
            found.append(json.loads(raw))
        except ValueError:
            continue
    return found


def get_ok(client: Any, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url[:200], response.status_code)
    return response.content.decode()


def url_of(tail: str) -> str:
    """A page's URL as ``reverse()`` writes it: ``segment()``'s ``%`` quoted once more."""
    return BASE + tail.replace("%", "%25")


def page_url(set_name: str, record: api.JobRecord) -> str:
    return url_of(f"{set_name}/job/{segment(record.id)}/")


def is_stored(set_name: str, record: api.JobRecord) -> bool:
    """One of the entries the battery stored in ``set_name`` (readable or not)."""
    return record.jid.startswith(f"{set_name}:") or record.raw.startswith(f'{{"jid":"{set_name}')


def status(cog: Any, *args: str) -> tuple[int, str]:
    env = manage_env(cog)
    done = subprocess.run(
        [sys.executable, str(MANAGE), "cogworker_status", *args],
        env=env,
        capture_output=True,
        timeout=60,
        cwd=str(ROOT),
    )
    return done.returncode, done.stdout.decode("utf-8")  # strict: every line must be UTF-8


def test_hostile_strings_through_every_path(cog, superclient, battery):
    k, due = get_keys(), battery

    # While the jobs with hostile jids run: the beat records each one, and
    # the busy page and each one's own page show them.
    recorded = {storable(summary_field(s)).encode() for s in KINDS.values()}
    workers = k.workers(due["identity"])
    wait_for(lambda: recorded <= set(cog.redis.hkeys(workers)), 30, "the beat to record them")
    body = get_ok(superclient, BASE + "busy/")
    links = set(re.findall(rf'href="({BASE}busy/[^"]+/job/[^"]+)"', body))
    hostile = {url_of(f"busy/{segment(due['identity'])}/job/{segment(f.decode())}/") for f in recorded}
    assert hostile <= {unescape(link) for link in links}  # the others may have ended since
    assert all("jid:" in get_ok(superclient, link) for link in hostile)
    cog.redis.set(cog.key(f"test:go:{due['worker'].pid}"), 1)

    # Every job ran its due number of times, and nothing is left running.
    total = sum(due["runs"].values())
    wait_for(lambda: cog.redis.llen(cog.key("test:runs")) >= total, 60, f"{total} runs")
    wait_for(lambda: cog.redis.zcard(k.dead) >= due["dead"] and in_progress(cog) == 0, 30, "the filings")
    assert runs_by_job(cog) == due["runs"]
    assert cog.redis.zcard(k.dead) == due["dead"]
    for name, jid in due["waiting"].items():
        assert [r.jid for r in api.Queue(name).page()] == [jid]
    dead = readable_dead(cog)
    named = [e for e in dead if str((e.get("args") or [""])[0]).startswith("name:")]
    assert sorted(e["job"] for e in named) == sorted(KINDS.values())
    assert all("not registered" in e["error_message"] for e in named)
    # Python's json reads a surrogate written as UTF-8 would write it as that
    # lone surrogate (a readable payload, its job not registered); a stray
    # byte makes the payload unreadable, kept whole under raw.
    [unreadable] = [e for e in dead if "raw" in e]
    assert unreadable["raw"].startswith('{"jid":"\ufffd') and "not valid JSON" in unreadable["error_message"]
    [surrogate] = [e for e in dead if e.get("job") == "x" and "raw" not in e]
    assert surrogate["jid"] == "\udcff" and "not registered" in surrogate["error_message"]
    failed = [e for e in dead if e.get("job") == jobs.fail.name and e.get("retry_count") == 1]
    assert sorted(e["error_message"] for e in failed) == sorted(s[:2000] for s in KINDS.values())

    # Every page, every stored entry's page, /metrics, cogworker_status.
    pages = ["dashboard/", "queues/", "busy/", "dead/", "dead/?p=2", "retries/", "scheduled/", "unsettled/"]
    pages += ["periodic/", "metrics/", f"dead/?name={jobs.record.name}&q=csi"]
    pages += [f"queues/{segment(q.name)}/" for q in api.Queue.all()]
    for page in pages:
        assert 'aria-label="Jobs"' in get_ok(superclient, url_of(page))
    sets = {"dead": api.DeadSet(), "retries": api.RetrySet(), "scheduled": api.ScheduledSet()}
    for set_name, jobs_set in sets.items():
        for record in jobs_set:
            get_ok(superclient, page_url(set_name, record))
    metrics = superclient.get("/cogworker/metrics")
    assert metrics.status_code == 200
    sizes = {
        sample.labels["queue"]: sample.value
        for family in text_string_to_metric_families(metrics.content.decode())
        for sample in family.samples
        if sample.name == "cogworker_queue_size"
    }
    assert {name: sizes[name] for name in due["waiting"]} == dict.fromkeys(due["waiting"], 1.0)
    code, out = status(cog)
    assert code == 0 and f"{due['identity']}: pid " in out
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e\u2066\u200f]", out)
    # One line per queue, none forged: a name's newline is written escaped.
    lines = out.splitlines()
    assert len([line for line in lines if line.startswith("  ") and " waiting, latency " in line]) == len(
        api.Queue.all()
    )
    assert not [line for line in lines if line.startswith("forged")]
    code, out = status(cog, "--json")
    assert code == 0 and set(due["waiting"]) <= {q["name"] for q in json.loads(out)["queues"]}

    # The stored entries, acted on from their own pages: retry, kill, delete.
    for set_name, (_, action) in STORED.items():
        mine = [r for r in sets[set_name] if is_stored(set_name, r)]
        assert len(mine) == len(KINDS) + len(RAW)
        for record in mine:
            url = page_url(set_name, record) + "action/"
            assert superclient.post(url, {"action": action}).status_code == 302
        assert not [r for r in sets[set_name] if is_stored(set_name, r)]

    # The heartbeat goes on, and no job ran again.
    beat = cog.redis.hget(k.process(due["identity"]), "beat")
    wait_for(lambda: cog.redis.hget(k.process(due["identity"]), "beat") != beat, 10, "a later beat")
    log = due["worker"].log()
    assert "heartbeat failed" not in log and "crashed" not in log and "unexpectedly" not in log
    assert runs_by_job(cog) == due["runs"]
