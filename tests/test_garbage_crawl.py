"""SPEC section 8, swept: whatever one key of the namespace holds, no page of
the admin, no metrics scrape and no ``cogworker_status`` breaks.

The targeted tests (``test_malformed_records``, ``test_hostile_strings``,
the batches' and limits' pages) each plant one kind of garbage where they
know it is read. This one does not choose: a worker makes the records a
busy deployment has (queued, running, scheduled, retrying and dead jobs, a
chain, a chord with a dead member, a limiter held), every page the admin
links to is found by following its links, and then each key of the
namespace in turn is replaced, first by a key of another type, then by
members that are not numbers, not JSON or not UTF-8, and every kind of page
that reads it is loaded again (one of each route: a job's page stands for
every job's; what a page reads, MONITOR says), with the Prometheus scrape
and ``cogworker_status --json``. A page may say that a record is malformed
or that Redis refused (503); it never raises.
Real Redis, a real worker process (stopped with SIGSTOP while the keys are
swapped, so that its beats do not write them back), Django's test client."""

from __future__ import annotations

import contextlib
import io
import re
import signal
from html import unescape
from typing import Any

import pytest
from django.contrib import admin
from django.core.management import call_command
from django.urls import path

from django_cogworker import api, chain, chord, views
from django_cogworker.connection import get_keys
from testproject.testapp import jobs, limited_jobs
from testproject.testapp import workflow_jobs as wf
from tests.conftest import CogEnv, monitored, wait_for

urlpatterns = [path("admin/", admin.site.urls), path("cogworker/metrics", views.metrics)]
pytestmark = pytest.mark.urls(__name__)

BASE = "/admin/django_cogworker/job/"
METRICS = "/cogworker/metrics"
#: ``cogworker_status --json``, run in this process.
STATUS = "cogworker_status"
STARTS = [
    *(
        BASE + page + "/"
        for page in ("dashboard", "queues", "busy", "periodic", "metrics", "limits", "batches")
    ),
    *(BASE + page + "/" for page in ("dead", "retries", "scheduled")),
]

#: Answers a page may give: shown, redirected (a form), "Redis refused"
#: (503), or a record that is gone (404).
FINE = {200, 302, 404, 503}

#: Members that are not what a reader expects: not UTF-8, a surrogate as
#: CESU-8 writes it, numbers Python reads and JSON does not, cut JSON.
JUNK = [b"\xff\xfe", b"\xed\xb3\xbf", b"-inf", b"nan", b"1e999", b"-1", b'{"jid":', b"[]", b"null"]


def route(url: str) -> str:
    """The page's route: the segment after a list (a job, a queue, a batch,
    a limiter, a job name) stands for any."""
    parts = url[len(BASE) :].split("?")[0].strip("/").split("/")
    return "/".join(parts[:1] + ["*" for _ in parts[1:]])


def crawl(client: Any) -> list[str]:
    """One page of each route the admin links to from its pages (no
    deletion links), each answered 200. A page that redirects is passed
    over: the changelist (to the dashboard), and a running job's page when
    the job ended after the busy page, a beat behind, listed it."""
    pages: dict[str, str] = {}
    todo, visited = list(STARTS), set()
    while todo:
        url = todo.pop(0)
        if route(url) in pages or url in visited:
            continue
        visited.add(url)
        response = client.get(url)
        if response.status_code == 302 and (url == BASE or route(url) == "busy/*/*/*"):
            continue
        assert response.status_code == 200, (url, response.status_code)
        pages[route(url)] = url
        for href in re.findall(r'href="([^"]+)"', response.content.decode()):
            href = unescape(href)
            if href.startswith(BASE) and "delete" not in href and route(href) not in pages:
                todo.append(href)
    return list(pages.values())


def status() -> None:
    with contextlib.suppress(SystemExit):  # its exit codes: live, no process, Redis cannot be read
        call_command("cogworker_status", "--json", stdout=io.StringIO(), stderr=io.StringIO())


def broken(client: Any, readers: list[str]) -> list[tuple[str, str]]:
    """Of ``readers`` (pages, the scrape, ``STATUS``), those that raised or
    answered what no page may answer."""
    found = []
    for url in readers:
        try:
            if url == STATUS:
                status()
                continue
            answer = client.get(url).status_code
        except Exception as exc:  # the test client re-raises a view's exception
            found.append((url, repr(exc)[:300]))
            continue
        if answer not in FINE:
            found.append((url, str(answer)))
    return found


def keys_read(cog: CogEnv, client: Any, readers: list[str]) -> dict[str, set[str] | None]:
    """The keys of the namespace each reader sends Redis (MONITOR); one that
    scans the keyspace reads them all (None)."""
    read: dict[str, set[str] | None] = {}
    for url in readers:
        sent = monitored(cog.url, cog.namespace, status if url == STATUS else lambda url=url: client.get(url))
        names = {word for words in sent for word in words[1:] if word.startswith(cog.namespace + ":")}
        read[url] = None if any(words[0].upper() == "SCAN" for words in sent) else names
    return read


def plant(cog: CogEnv, key: str, kind: str, how: str) -> None:
    """``key`` (deleted) made again as garbage: of another type, or junk members."""
    r = cog.redis
    if how == "other type":
        if kind == "string":
            r.rpush(key, JUNK[0])
        else:
            r.set(key, b'\xff{"not json')
    elif kind == "string":
        r.set(key, b"\xed\xa0\x80nan")
    elif kind == "list":
        r.rpush(key, *JUNK)
    elif kind == "set":
        r.sadd(key, *JUNK)
    elif kind == "zset":
        r.zadd(key, {member: float(i) for i, member in enumerate(JUNK)})
    elif kind == "hash":
        fields = {member: member for member in JUNK}
        r.hset(
            key,
            mapping={**fields, b"pid": b"x", b"status": b"\xff", b"created_at": b"nan", b"total": b"-inf"},
        )
    else:  # a stream
        r.xadd(key, {JUNK[0]: JUNK[1]})


def test_no_key_of_the_namespace_holding_garbage_breaks_a_page_the_scrape_or_the_status(cog, superclient):
    k = get_keys()
    cog.configure(QUEUES=["default", "mail", "low"])
    for i in range(3):
        jobs.record.delay(i)
        jobs.fail.delay("retried, then dead")
    jobs.fail_no_retry.delay("dead")
    jobs.record.delay_in(3600, "scheduled")
    jobs.record_mail.delay("mail")
    chain(wf.add.s(1, 2), wf.double.s(), wf.add.si(10, 5)).delay()
    chord(
        [wf.member.s(1), wf.die.s(2), wf.member.s(3)], wf.collect.s("body"), on_death=wf.callback.s("dead")
    ).delay()
    for _ in range(2):
        limited_jobs.erp_sync.delay(0.2)
        limited_jobs.import_account.delay(1, 0.2)
    limited_jobs.charge.delay()
    worker = cog.start_worker("-c", "4")
    wait_for(lambda: cog.redis.zcard(k.dead) >= 5, 60, "the failures to reach dead")
    # Two jobs that stay running (the busy pages; a limiter with a holder,
    # which the sweep keeps listed), every other one ended, so that no page
    # the crawl finds ends under it; the job names' metrics written by a beat.
    jobs.sleep_then_record.delay(120, "running")
    limited_jobs.erp_sync.delay(120, "holding")
    held = k.inprogress(worker.identity())

    def settled() -> bool:
        running = sorted(b"sleep_then_record" in raw for raw in cog.redis.lrange(held, 0, -1))
        queued = sum(cog.redis.llen(k.queue(q)) for q in ("default", "mail", "low"))
        return running == [False, True] and not queued

    wait_for(settled, 60, "every job but the two long ones to end")
    wait_for(lambda: "erp" in {limit.name for limit in api.Limit.all()}, 60, "the held limiter to be listed")
    wait_for(lambda: cog.redis.hlen(k.metrics_totals) > 0, 60, "a beat to write the metrics")
    pages = crawl(superclient)
    # Every kind of page is among them: a job's, a queue's, a batch's, a limiter's, a job name's metrics.
    found = {route(p) for p in pages}
    assert {"dashboard", "queues", "queues/*", "busy", "busy/*/*/*", "dead", "dead/*/*"} <= found, found
    assert {"scheduled/*/*", "batches", "batches/*", "limits", "limits/*"} <= found, found
    assert {"metrics", "metrics/*"} <= found, found
    readers = [*pages, METRICS, STATUS]
    assert not broken(superclient, readers)

    worker.signal(signal.SIGSTOP)
    try:
        keys = sorted(key.decode() for key in cog.redis.scan_iter(match=cog.namespace + ":*", count=1000))
        assert len(keys) >= 25, keys  # the records of a busy deployment, not a few
        # Each key is garbage for the readers that read it: a page that does
        # not send Redis a key's name does not see what the key holds.
        read = keys_read(cog, superclient, readers)
        assert set() not in (read[METRICS], read[STATUS]), read  # MONITOR saw what they send
        problems = []
        for key in keys:
            kind, dump, ttl = cog.redis.type(key).decode(), cog.redis.dump(key), cog.redis.pttl(key)
            if dump is None:
                continue  # expired meanwhile
            its = [url for url in readers if read[url] is None or key in read[url]]
            for how in ("other type", "junk"):
                cog.redis.delete(key)
                plant(cog, key, kind, how)
                problems += [(key, how, *bad) for bad in broken(superclient, its)]
            cog.redis.restore(key, max(ttl, 0), dump, replace=True)
        assert not problems, problems[:10]
    finally:
        worker.signal(signal.SIGCONT)
