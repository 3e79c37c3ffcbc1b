"""The merged views of the sharded layout (SPEC section 16): the API's job
sets and the admin's set pages read every queue group's set and show one.

Sharding is on in this process against one plain redis-server (as in
``tests/test_sharded_layout.py``), with the slot guard recording every
script call, so a move that mixed two groups' slots, or the shared ``{N}``
slot with a group's, would be named. Entries are written straight into
each group's keys, with scores that interleave and tie across groups; the
oracle is the union of the groups' sets sorted as Redis sorts one.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from django_cogworker import api
from django_cogworker.api import sets
from django_cogworker.connection import get_keys
from django_cogworker.payload import encode
from tests.conftest import CogEnv
from tests.test_admin import BASE, detail_url, messages_of, payload, text, users  # noqa: F401
from tests.test_sharded_layout import calls, mixed_calls, sharded  # noqa: F401

#: Four queues in three groups: ``mail`` holds ``mail`` and ``mail_bulk``.
QUEUES = ["default", "mail", "mail_bulk", "low"]


def add(cog: CogEnv, where: str, jid: str, score: float, queue: str = "default", **fields: Any) -> bytes:
    """An entry in ``where`` (schedule, retry, dead) of ``queue``'s group."""
    raw = encode(payload(jid, queue=queue, **fields))
    cog.redis.zadd(getattr(get_keys().for_queue(queue), where), {raw: score})
    cog.redis.sadd(get_keys().queues, queue)  # as a producer registers it
    return raw


def oracle(cog: CogEnv, where: str, *, newest_first: bool = False) -> list[str]:
    """The jids of every group's ``where``, in the order one set would have."""
    entries = []
    for group in ("default", "mail", "low"):
        key = getattr(get_keys().group(group), where)
        entries += [(score, raw) for raw, score in cog.redis.zrange(key, 0, -1, withscores=True)]
    return [json.loads(raw)["jid"] for _, raw in sorted(entries, reverse=newest_first)]


def fill(cog: CogEnv, where: str, n: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    for i in range(n):
        # 20 scores for n entries: ties within and across groups.
        add(cog, where, f"{where[0]}{i}", 1_000_000 + rng.randrange(20), QUEUES[rng.randrange(4)])


def jids(found: list[api.JobRecord]) -> list[str]:
    return [r.jid for r in found]


def test_g16_sharded_views_page_and_iterate_every_group_in_the_sets_order(
    cog: CogEnv,
    sharded: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fill(cog, "retry", 90)
    fill(cog, "dead", 90, seed=8)
    expected, dead = oracle(cog, "retry"), oracle(cog, "dead", newest_first=True)
    per_group = [cog.redis.zcard(get_keys().group(g).retry) for g in ("default", "mail", "low")]
    assert min(per_group) > 10, per_group

    retries = api.RetrySet()
    assert retries.size == 90 and len(retries.groups) == 3
    for offset, limit in [(0, 25), (25, 25), (40, 7), (85, 25), (90, 25)]:
        assert jids(retries.page(offset, limit)) == expected[offset : offset + limit]
    assert jids(api.DeadSet().page(10, 30)) == dead[10:40]
    # Iteration reads each group's set a batch at a time and merges them.
    monkeypatch.setattr(sets, "ITERATION_BATCH", 7)
    assert jids(list(api.RetrySet())) == expected
    assert jids(list(api.DeadSet())) == dead
    # One group known: its own set, read by offset.
    mail = [j for j in expected if api.RetrySet().find(j).queue in ("mail", "mail_bulk")]
    monkeypatch.setattr(sets, "groups_known", lambda: [get_keys().group("mail")])
    assert jids(api.RetrySet().page(0, 100)) == mail and jids(list(api.RetrySet())) == mail


def test_g16_sharded_views_filter_find_and_get_across_groups(
    cog: CogEnv,
    sharded: Path,  # noqa: F811
) -> None:
    fill(cog, "retry", 60)
    add(cog, "retry", "needle", 1_000_005, "low", job="app.jobs.rare")
    expected = oracle(cog, "retry")
    retries = api.RetrySet()
    mail = [j for j in expected if j != "needle" and retries.find(j).queue in ("mail", "mail_bulk")]
    found = jids(retries.filter(queue="mail")) + jids(retries.filter(queue="mail_bulk"))
    assert mail and sorted(found) == sorted(mail)
    assert jids(retries.filter(name="app.jobs.rare")) == ["needle"]
    assert jids(retries.filter(search="needle")) == ["needle"]
    count, page = retries.filter_page(name=payload("x")["job"], offset=20, limit=10)
    plain = [j for j in expected if j != "needle"]
    assert (count, jids(page)) == (60, plain[20:30])
    count, page = retries.filter_page(name=payload("x")["job"], offset=500, limit=25, or_last=True)
    assert (count, jids(page)) == (60, plain[50:])
    assert jids(retries.filter(limit=5)) == expected[:5]

    # One record of each group, found again by its id, from its own group's key.
    for jid in ("needle", *(expected[i] for i in (0, 30, 59))):
        record = retries.find(jid)
        assert record is not None
        assert record.source == get_keys().for_queue(record.queue).retry
        again = retries.get(record.id)
        assert again is not None and (again.jid, again.source) == (jid, record.source)
    assert retries.find("nobody") is None and retries.get("1000000.0~nobody~abc") is None


def test_g16_sharded_views_actions_stay_in_the_entrys_group(
    cog: CogEnv,
    sharded: Path,  # noqa: F811
) -> None:
    k = get_keys()
    add(cog, "retry", "to-mail", 10, "mail_bulk")
    add(cog, "retry", "to-kill", 11, "low")
    add(cog, "retry", "to-delete", 12, "default")
    # Pushed by hand into the default group's set while naming a queue of
    # another group: its retry spans two slots, in two steps.
    stray = encode(payload("stray", queue="low"))
    cog.redis.zadd(k.group("default").retry, {stray: 13})
    retries = api.RetrySet()

    assert retries.find("to-mail").retry() is True
    assert [json.loads(r)["jid"] for r in cog.redis.lrange(k.queue("mail_bulk"), 0, -1)] == ["to-mail"]
    assert k.queue("mail_bulk") == f"{{{cog.namespace}:mail}}:queue:mail_bulk"
    assert cog.redis.sismember(k.queues, "mail_bulk")
    killed = retries.find("to-kill")
    assert killed.kill() is True and killed.kill() is False
    assert jids(list(api.DeadSet())) == ["to-kill"] and cog.redis.zcard(k.group("low").dead) == 1
    assert retries.find("to-delete").delete() is True

    found = retries.find("stray")
    assert found.retry() is True and found.retry() is False  # the second finds it gone: no copy
    assert [json.loads(r)["jid"] for r in cog.redis.lrange(k.queue("low"), 0, -1)] == ["stray"]
    assert retries.size == 0

    # Bulk over three groups, and clearing.
    fill(cog, "schedule", 40)
    assert api.bulk(api.ScheduledSet(), "retry") == 40
    queued = sum(cog.redis.llen(k.queue(q)) for q in QUEUES)
    assert queued == 40 + 2 and api.ScheduledSet().size == 0
    fill(cog, "dead", 30)
    assert api.DeadSet().clear() == 31 and api.DeadSet().size == 0
    assert mixed_calls(sharded) == {}
    assert {"move"} <= {c["script"] for c in calls(sharded)}, "the guard saw the moves"


def test_g22_sharded_a_dead_member_retried_into_another_groups_queue_is_live_again_in_its_batch(
    cog: CogEnv,
    sharded: Path,  # noqa: F811
) -> None:
    """A batch's member dead in the default group's set while its payload
    names ``low`` (pushed by hand, or QUEUE_GROUPS changed since): its retry
    spans two slots, in two steps, and its batch counts it live again, as
    for any retry from dead before the batch settled."""
    from django_cogworker import batch
    from testproject.testapp import jobs

    k = get_keys()
    with batch() as b:
        jid = jobs.record.set(queue="low").delay("revived")
        jobs.record.set(queue="low").delay("holds the batch open")
    raw = cog.redis.rpop(k.queue("low"))
    assert json.loads(raw)["jid"] == jid
    cog.redis.zadd(k.group("default").dead, {raw: 1.0})
    cog.redis.smove(k.batch(b.bid, "pending"), k.batch(b.bid, "dead"), jid)  # as its death would
    assert api.DeadSet().find(jid).retry() is True
    assert json.loads(cog.redis.lindex(k.queue("low"), 0))["jid"] == jid
    assert cog.redis.smembers(k.batch(b.bid, "failed")) == {jid.encode()}, "live again in its batch"
    assert cog.redis.scard(k.batch(b.bid, "dead")) == 0
    assert mixed_calls(sharded) == {}


def test_g16_sharded_views_unsettled_and_in_progress_lists_of_every_group(
    cog: CogEnv,
    sharded: Path,  # noqa: F811
) -> None:
    k = get_keys()
    for jid, queue in [("u1", "mail"), ("u2", "low"), ("u3", "low")]:
        entry = {"payload": encode(payload(jid, queue=queue)).decode(), "set": "retry", "score": 50}
        cog.redis.rpush(k.for_queue(queue).unsettled, json.dumps(entry))
        cog.redis.sadd(k.queues, queue)
    unsettled = api.UnsettledSet()
    assert unsettled.size == 3 and sorted(jids(list(unsettled))) == ["u1", "u2", "u3"]
    assert sorted(jids(unsettled.page(1, 5))) == sorted(jids(list(unsettled))[1:])
    record = unsettled.find("u2")
    assert record.source == k.group("low").unsettled and unsettled.get(record.id).jid == "u2"
    assert record.retry() is True and unsettled.size == 2
    assert [json.loads(r)["jid"] for r in cog.redis.lrange(k.queue("low"), 0, -1)] == ["u2"]

    cog.redis.rpush(k.group("mail").inprogress("host:1:abc"), encode(payload("running", queue="mail")))
    running = api.InProgress("host:1:abc")
    assert running.size == 1 and jids(list(running)) == ["running"]
    assert running.find("running").source == k.group("mail").inprogress("host:1:abc")
    assert mixed_calls(sharded) == {}


def staff(users: dict[str, Any]) -> Client:  # noqa: F811
    client = Client()
    client.force_login(users["super"])
    return client


PAGES = [
    "dashboard/",
    "queues/",
    "queues/mail_bulk/",
    "busy/",
    "scheduled/",
    "retries/",
    "dead/",
    "unsettled/",
]


@pytest.mark.parametrize("page", PAGES)
def test_g16_sharded_views_every_admin_page_renders_with_jobs_in_three_groups(
    cog: CogEnv,
    sharded: Path,  # noqa: F811
    users: dict[str, Any],  # noqa: F811
    page: str,
) -> None:
    now = time.time()
    for i, queue in enumerate(QUEUES):
        add(cog, "schedule", f"sched-{queue}", now + 600 + i, queue, error_class=None, error_message=None)
        add(cog, "retry", f"retry-{queue}", now + 60 + i, queue)
        add(cog, "dead", f"dead-{queue}", now - i, queue)
        cog.redis.lpush(get_keys().queue(queue), encode(payload(f"queued-{queue}", queue=queue)))
    response = staff(users).get(BASE + page)
    assert response.status_code == 200, text(response)[:2000]
    body = text(response)
    for name in ("sched", "retry", "dead"):
        if page.startswith({"sched": "scheduled", "retry": "retries", "dead": "dead"}[name]):
            assert all(f"{name}-{queue}" in body for queue in QUEUES), body
    if page == "queues/":
        assert all(f"queues/{queue}/" in body for queue in QUEUES)
    if page == "queues/mail_bulk/":
        assert "queued-mail_bulk" in body


def test_g16_sharded_views_admin_actions_on_one_job_and_on_all_across_groups(
    cog: CogEnv,
    sharded: Path,  # noqa: F811
    users: dict[str, Any],  # noqa: F811
) -> None:
    k = get_keys()
    for i, queue in enumerate(QUEUES):
        add(cog, "dead", f"dead-{queue}", 100 + i, queue)
    client = staff(users)
    record = api.DeadSet().find("dead-mail")
    response = client.post(detail_url("dead", record) + "action/", {"action": "retry"}, follow=True)
    assert "Retried job dead-mail" in " ".join(messages_of(response))
    assert [json.loads(r)["jid"] for r in cog.redis.lrange(k.queue("mail"), 0, -1)] == ["dead-mail"]
    every = {"action": "retry", "select_across": "1", "post": "yes"}
    response = client.post(BASE + "dead/action/", every, follow=True)
    assert "Retried 3 of all matching jobs" in " ".join(messages_of(response)), messages_of(response)
    assert api.DeadSet().size == 0
    assert {q: cog.redis.llen(k.queue(q)) for q in QUEUES} == dict.fromkeys(QUEUES, 1)
    assert mixed_calls(sharded) == {}
