"""The admin's Batches pages (SPEC sections 7 and 13), through Django's test
client against a real Redis: the list (open first, figures, progress), one
batch's page (pending members linked to where each is, dead members,
callbacks and when they fired), its actions (retry the dead members,
delete the batch: POST, CSRF, permissions), the Retry and Dead pages
filtered by batch; garbage in Redis and Redis down, never a 500; and once
in a real browser (headless Chromium)."""

from __future__ import annotations

import json
import re
import signal
import time
from html import unescape

import pytest
from django.contrib.auth.models import User

from django_cogworker import api, batch
from django_cogworker.admin.helpers import segment
from testproject.testapp import workflow_jobs as wf
from tests import test_admin
from tests.conftest import wait_for
from tests.test_admin import client_for, messages_of, text
from tests.test_admin_browser import BASE, PASSWORD, Shots, chromium, login
from tests.test_api_batches import member, write_batch

BATCHES = BASE + "batches/"

#: Users of each kind (a fixture).
users = test_admin.users
XSS = "<script>alert('x')</script>"


def batch_url(bid: str, tail: str = "") -> str:
    return f"{BATCHES}{segment(bid).replace('%', '%25')}/{tail}"


@pytest.fixture
def imports(cog) -> None:
    """An open batch with members in a queue, retry and dead; a settled one; an empty one."""
    r, now = cog.redis, time.time()
    write_batch(
        cog,
        "imp7",
        description="import #7",
        pending=("q1",),
        failed=("r1",),
        succeeded=("s1", "s2"),
        dead=("d1",),
        fired={"death": now - 30},
        callbacks=("success", "death", "settled"),
        created_at=now - 600,
    )
    r.lpush(cog.key("queue:default"), member("q1", "imp7"))
    r.sadd(cog.key("queues"), "default")
    r.zadd(cog.key("retry"), {member("r1", "imp7", retry_count=0): now + 60})
    r.zadd(cog.key("dead"), {member("d1", "imp7", error_class="ValueError", error_message="bad row"): now})
    r.zadd(cog.key("dead"), {member("other", "elsewhere"): now})
    write_batch(
        cog,
        "done1",
        description="nightly",
        succeeded=("a", "b"),
        fired={"success": now - 5, "complete": now - 5, "settled": now - 5},
        settled_at=now - 5,
        created_at=now - 60,
    )


def rows(body: str) -> list[str]:
    """The batches table's rows as text, in order."""
    table = re.search(r'<table id="cog-batches">(.*?)</table>', body, re.S).group(1)
    found = re.findall(r"<tr>\s*<th scope=\"row\">(.*?)</tr>", table, re.S)
    return [" ".join(unescape(re.sub(r"<[^>]+>", " ", row)).split()) for row in found]


def test_the_list_shows_open_batches_first_with_their_figures(cog, superclient, imports):
    response = superclient.get(BATCHES)
    assert response.status_code == 200
    body = text(response)
    assert 'aria-current="page">Batches' in body  # its tab, with the count
    shown = rows(body)
    assert shown[0].startswith("import #7 imp7 open 10 minutes ago")
    assert shown[0].endswith("5 2 1 2 (1 retrying)")
    assert shown[1].startswith("nightly done1 succeeded") and shown[1].endswith("2 2 0 0")
    assert "2 batches" in body
    assert 'style="width: 40.0%"' in body and 'style="width: 20.0%"' in body  # 2 and 1 of 5
    assert rows(text(superclient.get(BATCHES, {"state": "settled"}))) == [shown[1]]
    assert rows(text(superclient.get(BATCHES, {"state": "open", "p": "99"}))) == [shown[0]]
    dashboard = text(superclient.get(BASE + "dashboard/"))
    assert re.search(r"<strong>2</strong>Batches</a>", dashboard)


def test_an_empty_namespace_says_no_batch_yet(cog, superclient):
    assert "No batch yet" in text(superclient.get(BATCHES))


def test_a_batchs_page_links_each_member_to_where_it_is(cog, superclient, imports):
    body = text(superclient.get(batch_url("imp7")))
    assert "<title>Batch import #7 |" in body
    pending = re.search(r'<table id="cog-pending">(.*?)</table>', body, re.S).group(1)
    assert "q1" in pending and f'href="{BASE}queues/default/"' in pending and "in queue default" in pending
    assert "r1" in pending and f'href="{BASE}retries/job/' in pending and "waiting for a retry" in pending
    dead = re.search(r'<table id="cog-dead">(.*?)</table>', body, re.S).group(1)
    assert "d1" in dead and f'href="{BASE}dead/job/' in dead and "ValueError: bad row" in dead
    callbacks = re.search(r'<table id="cog-callbacks">(.*?)</table>', body, re.S).group(1)
    cells = [
        " ".join(unescape(re.sub(r"<[^>]+>", " ", c)).split())
        for c in re.findall(r"<tr>(.*?)</tr>", callbacks, re.S)
    ]
    assert cells[1:] == [
        "on_success app.notify 7 imp7-success not yet",
        "on_death app.notify 7 imp7-death 30 s ago",
        "on_settled app.notify 7 imp7-settled not yet",
    ]
    assert f'href="{BASE}dead/?bid=imp7"' in body and f'href="{BASE}retries/?bid=imp7"' in body


def test_the_dead_and_retry_pages_filter_by_batch(cog, superclient, imports):
    body = text(superclient.get(BASE + "dead/", {"bid": "imp7"}))
    assert "d1" in body and "other" not in body.split('id="result_list"')[1]
    assert f'href="{batch_url("imp7")}"' in body and 'name="bid" value="imp7"' in body
    assert "1 result" in body
    assert "r1" in text(superclient.get(BASE + "retries/", {"bid": "imp7"}))
    assert "No job matches batch is nobody" in text(superclient.get(BASE + "retries/", {"bid": "nobody"}))
    # A bulk delete across the filter takes the batch's entries only.
    response = superclient.post(
        BASE + "dead/action/?bid=imp7", {"action": "delete", "select_across": "1", "post": "yes"}
    )
    assert response.status_code == 302
    assert [json.loads(m)["jid"] for m in cog.redis.zrange(cog.key("dead"), 0, -1)] == ["other"]


def test_g22_retrying_the_dead_members_before_settlement_brings_success_back(cog, superclient):
    with batch(description="heal", on_success=wf.callback.s("ok"), on_settled=wf.callback.s("fin")) as b:
        wf.dies_in_chain.delay(1)
        later = wf.member.delay_in(3600, "later")  # keeps the batch from settling meanwhile
    worker = cog.start_worker()
    wait_for(lambda: api.Batch(b.bid).dead == 1, 30, "the member died")
    assert "death" in api.Batch(b.bid).fired
    cog.redis.set(cog.key("test:heal"), "1")
    response = superclient.post(batch_url(b.bid, "action/"), {"action": "retry_dead"}, follow=True)
    assert response.redirect_chain == [(batch_url(b.bid), 302)]
    assert messages_of(response) == [f"Batch {b.bid}: 1 dead member retried."]
    wait_for(lambda: api.Batch(b.bid).succeeded == 1, 30, "the retried member succeeded")
    assert api.Batch(b.bid).dead == 0 and not api.Batch(b.bid).settled
    api.ScheduledSet().find(later).retry()
    wait_for(lambda: api.Batch(b.bid).settled, 30, "the batch settled")
    figures = api.Batch(b.bid).figures()
    assert (figures.total, figures.succeeded, figures.dead) == (2, 2, 0)
    assert {"success", "complete", "settled"} <= set(figures.fired)
    wait_for(lambda: len(cog.notes("callbacks")) == 2, 30, "both callbacks ran")
    assert sorted(n["tag"] for n in cog.notes("callbacks")) == ["fin", "ok"]
    # After settlement, a retry runs the job as a plain one: the batch does not change.
    response = superclient.post(batch_url(b.bid, "action/"), {"action": "retry_dead"}, follow=True)
    assert messages_of(response) == [f"Batch {b.bid}: no dead member to retry."]
    worker.signal(signal.SIGTERM)
    worker.wait(30)


def test_retrying_the_dead_members_after_settlement_runs_them_as_plain_jobs(cog, superclient):
    with batch(description="settled", on_death=wf.callback.s("dead")) as b:
        wf.die.delay("x")
        wf.member.delay("y")
    worker = cog.start_worker()
    wait_for(lambda: len(cog.notes("callbacks")) == 1, 30, "the batch settled and its callback ran")
    worker.signal(signal.SIGTERM)
    worker.wait(30)
    response = superclient.post(batch_url(b.bid, "action/"), {"action": "retry_dead"}, follow=True)
    assert messages_of(response) == [
        f"Batch {b.bid}: 1 dead member retried: the batch had settled, so they run as plain jobs."
    ]
    assert [r.name for r in api.Queue("default").page()] == [wf.die.name]  # not the callback
    figures = api.Batch(b.bid).figures()
    assert (figures.succeeded, figures.dead, figures.pending) == (1, 1, 0)


def test_g22_deleting_every_scheduled_job_counts_its_batch_members_dead(cog, superclient):
    with batch(description="cleared", on_death=wf.callback.s("dead"), on_settled=wf.callback.s("fin")) as b:
        wf.member.delay_in(3600, "later")
        wf.member.delay("now")
    wf.member.delay_in(3600, "plain")  # no batch
    worker = cog.start_worker()
    wait_for(lambda: api.Batch(b.bid).succeeded == 1, 30, "the first member ran")
    form = {"action": "delete", "select_across": "1", "post": "yes"}
    response = superclient.post(BASE + "scheduled/action/", form, follow=True)
    assert messages_of(response) == ["Deleted 2 of all matching jobs in Scheduled."]
    # What is left: the callbacks the deletion fired, pushed due now.
    assert {r.jid for r in api.ScheduledSet()} <= {f"{b.bid}-death", f"{b.bid}-settled"}
    wait_for(lambda: len(cog.notes("callbacks")) == 2, 30, "on_death and on_settled ran")
    figures = api.Batch(b.bid).figures()
    assert (figures.succeeded, figures.dead, figures.settled) == (1, 1, True)
    worker.signal(signal.SIGTERM)
    worker.wait(30)


def test_g22_clearing_a_queue_counts_its_batch_members_dead(cog, superclient):
    cog.configure(QUEUES=["default"])  # the worker leaves "mail" alone
    with batch(
        description="queue cleared", on_death=wf.callback.s("dead"), on_settled=wf.callback.s("fin")
    ) as b:
        wf.member.delay("now")
        for i in range(3):
            wf.member.set(queue="mail").delay(f"m{i}")
    wf.member.set(queue="mail").delay("plain")  # no batch
    worker = cog.start_worker()
    wait_for(lambda: api.Batch(b.bid).succeeded == 1, 30, "the member on default ran")
    response = superclient.post(BASE + "queues/mail/clear/", follow=True)
    assert messages_of(response) == ["Queue mail cleared: 4 jobs deleted."]
    assert api.Queue("mail").size == 0 and cog.redis.keys(cog.key("clearing*")) == []
    wait_for(lambda: len(cog.notes("callbacks")) == 2, 30, "on_death and on_settled ran")
    figures = api.Batch(b.bid).figures()
    assert (figures.succeeded, figures.dead, figures.pending, figures.settled) == (1, 3, 0, True)
    assert api.Queue("nothing-here").clear() == 0
    worker.signal(signal.SIGTERM)
    worker.wait(30)


def test_deleting_a_batch_asks_first_then_removes_its_keys(cog, superclient, imports):
    response = superclient.post(batch_url("imp7", "action/"), {"action": "delete"})
    assert response.status_code == 200 and "Yes, delete the batch" in text(response)
    assert cog.redis.exists(cog.key("batch:imp7"))
    response = superclient.post(
        batch_url("imp7", "action/"), {"action": "delete", "post": "yes"}, follow=True
    )
    assert response.redirect_chain == [(BATCHES, 302)]
    assert messages_of(response) == ["Batch imp7 deleted: its callbacks will not fire."]
    assert cog.redis.keys(cog.key("batch:imp7*")) == []
    assert cog.redis.zrange(cog.key("batches"), 0, -1) == [b"done1"]
    assert cog.redis.llen(cog.key("queue:default")) == 1  # its members are not touched
    assert superclient.get(batch_url("imp7")).status_code == 404


def test_permissions_csrf_and_unknown_actions(cog, users, imports):
    viewer = client_for(users["viewer"])
    body = text(viewer.get(batch_url("imp7")))
    assert "import #7" in body and 'name="action"' not in body
    assert viewer.post(batch_url("imp7", "action/"), {"action": "delete", "post": "yes"}).status_code == 403
    assert client_for(users["staff"]).get(BATCHES).status_code == 403
    assert client_for(None).get(batch_url("imp7")).status_code == 302
    strict = client_for(users["super"], csrf=True)
    assert strict.post(batch_url("imp7", "action/"), {"action": "delete", "post": "yes"}).status_code == 403
    superclient = client_for(users["super"])
    assert superclient.get(batch_url("imp7", "action/")).status_code == 405
    assert cog.redis.exists(cog.key("batch:imp7"))
    response = superclient.post(batch_url("imp7", "action/"), {"action": "drop"}, follow=True)
    assert messages_of(response) == ["Unknown batch action."]
    for bad in ("never-made", "a\nb", "x" * 201):
        assert superclient.get(batch_url(bad)).status_code == 404, bad
        assert superclient.post(batch_url(bad, "action/"), {"action": "delete"}).status_code == 404


# -- whatever Redis holds -------------------------------------------------------------------


def test_odd_text_is_escaped_and_odd_ids_round_trip(cog, superclient):
    for bid in ("a/b", "..", "ü%2F", "x<y"):
        write_batch(cog, bid, description=XSS, pending=(XSS,), callbacks=())
    body = text(superclient.get(BATCHES))
    assert "<script>alert" not in body and "&lt;script&gt;" in body
    for bid in ("a/b", "..", "ü%2F", "x<y"):
        page = superclient.get(batch_url(bid))
        assert page.status_code == 200, bid
        assert "<script>alert" not in text(page) and bid in unescape(text(page))


def test_garbage_in_redis_is_noted_never_a_500(cog, superclient, imports):
    r, key = cog.redis, cog.key("batch:imp7")
    r.hset(key, mapping={"created_at": "soon", "fired:death": "x", "cb:success": "[" * 50_000})
    r.hset(key, "description", b"\xed\xa0\x80\xff \x00 \xe2\x80\xae")
    r.delete(f"{key}:failed")
    r.set(f"{key}:failed", "not a set")
    r.sadd(f"{key}:pending", b"\xff")
    r.zadd(cog.key("batches"), {b"\xff\xfe": 1.0, "gone": 2.0})
    r.set(cog.key("batch:wrong"), "not a hash")
    r.zadd(cog.key("batches"), {"wrong": 3.0})
    r.lpush(cog.key("queue:default"), b'\xff not json "bid"', '{"bid": "imp7", "jid": 5}')
    for url in (BATCHES, batch_url("imp7"), batch_url("wrong"), BASE + "dead/?bid=imp7", BASE + "dashboard/"):
        response = superclient.get(url)
        assert response.status_code == 200, url
    assert "Malformed in Redis" in text(superclient.get(BATCHES))
    page = text(superclient.get(batch_url("imp7")))
    assert "Malformed in Redis" in page and "unreadable" in page
    r.delete(cog.key("batches"))
    r.set(cog.key("batches"), "not a zset")
    for url in (BATCHES, BASE + "dashboard/"):
        response = superclient.get(url)
        assert response.status_code == 200 and "Malformed in Redis" in text(response), url


@pytest.mark.parametrize("page", ["", "imp7/", "?state=open&p=3"])
def test_every_batches_page_answers_503_inside_the_admin_when_redis_is_down(
    cog, own_redis, superclient, page
):
    server = own_redis()
    server.stop()
    cog.configure(REDIS_URL=f"redis://:s3cret-pw@127.0.0.1:{server.port}/0")
    response = superclient.get(BATCHES + page)
    assert response.status_code == 503
    body = text(response)
    assert "Redis is unreachable" in body and "s3cret-pw" not in body
    response = superclient.post(batch_url("imp7", "action/"), {"action": "delete", "post": "yes"})
    assert response.status_code == 503 and "Redis is unreachable" in text(response)


# -- in a real browser ----------------------------------------------------------------------


def test_the_batches_pages_in_a_real_browser(cog, live_server, transactional_db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # a fast login
    User.objects.create_superuser("root", "root@example.com", PASSWORD)
    r, now = cog.redis, time.time()
    for i in range(3):
        write_batch(
            cog,
            f"nightly{i}aa11bb22cc33dd",
            description=f"nightly export {i}",
            succeeded=tuple(f"n{i}-{j}" for j in range(40)),
            fired={"success": now - 3600 * i, "complete": now - 3600 * i, "settled": now - 3600 * i},
            settled_at=now - 3600 * i,
            created_at=now - 3600 * i - 300,
        )
    pending = tuple(f"row{j:03d}aa11bb22cc33" for j in range(12))
    write_batch(
        cog,
        "import7aa11bb22cc33dd",
        description="import #7: customers.csv",
        pending=pending,
        failed=("row900aa11bb22cc33",),
        succeeded=tuple(f"done{j:03d}" for j in range(80)),
        dead=("row901aa11bb22cc33",),
        fired={"death": now - 20},
        callbacks=("success", "death", "settled"),
        created_at=now - 240,
    )
    r.sadd(cog.key("queues"), "default")
    for jid in pending:
        r.lpush(cog.key("queue:default"), member(jid, "import7aa11bb22cc33dd"))
    r.zadd(cog.key("retry"), {member("row900aa11bb22cc33", "import7aa11bb22cc33dd"): now + 90})
    dead = member(
        "row901aa11bb22cc33", "import7aa11bb22cc33dd", error_class="KeyError", error_message="'email'"
    )
    r.zadd(cog.key("dead"), {dead: now - 20})

    with chromium() as browser_context:
        page = browser_context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        shots = Shots()
        login(page, live_server.url, BATCHES)
        assert page.locator("#cog-batches tbody tr").count() == 4
        assert "import #7" in page.locator("#cog-batches tbody tr").first.inner_text()
        shots.take(page, "batches")

        page.click("#cog-batches a:text('import #7: customers.csv')")
        page.wait_for_url("**/batches/import7aa11bb22cc33dd/")
        assert page.locator("#cog-pending tbody tr").count() == 13
        assert page.locator("#cog-callbacks tbody tr").count() == 3
        shots.take(page, "batch")

        page.click("#cog-dead a:text('dead')")
        page.wait_for_url("**/dead/job/**")
        assert "'email'" in page.content()
        page.go_back()
        page.click("a:text('its dead jobs')")
        page.wait_for_url("**/dead/?bid=import7aa11bb22cc33dd")
        assert page.locator("#result_list tbody tr").count() == 1

        page.goto(live_server.url + batch_url("nightly2aa11bb22cc33dd"))
        page.click("button[value=delete]")
        page.click("input[value='Yes, delete the batch']")
        page.wait_for_selector("ul.messagelist li.success")
        assert page.locator("#cog-batches tbody tr").count() == 3
        assert not cog.redis.exists(cog.key("batch:nightly2aa11bb22cc33dd"))
        assert errors == []
