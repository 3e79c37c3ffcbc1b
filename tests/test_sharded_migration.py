"""Turning ``SHARDING`` on with jobs already queued in the one-slot layout
(SPEC section 16): ``manage.py cogworker_migrate`` moves each to its queue
group's keys, and loses none and moves none twice when it is SIGKILLed
midway and run again. Then workers of the sharded layout run them.

On one plain server (what is checked is where each entry goes and how many
times, not the cluster's slots: the moves are single-slot calls, the
script call of a list entry's move keeps to its group's slot).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from io import StringIO

import pytest
import redis
from django.core.management import CommandError, call_command

from django_cogworker.connection import get_keys
from django_cogworker.keys import Keys
from django_cogworker.layouts import keys
from django_cogworker.migrate_layout import Migration
from django_cogworker.payload import encode
from testproject.testapp import jobs, limited_jobs
from tests.conftest import MANAGE, ROOT, CogEnv, cpu_seconds, delete_sharded, manage_env, wait_for

GROUPS = {"mail": ["mail", "mail_bulk"]}
#: Enough entries that the migrator is still moving them when it is killed.
BULK = 3000
STALL_S = 30


@pytest.fixture
def namespace(cog: CogEnv) -> Iterator[str]:
    """A namespace first in the one-slot layout (braced, as on a cluster)."""
    name = f"m{uuid.uuid4().hex[:12]}"
    cog.namespace = "{" + name + "}"
    cog.configure(NAMESPACE=cog.namespace)
    yield name
    delete_sharded(cog.redis, name)


def sharded(cog: CogEnv, name: str) -> Keys:
    cog.namespace = name
    cog.configure(NAMESPACE=name, SHARDING="queues", QUEUE_GROUPS=GROUPS)
    return get_keys()


def every_job(cog: CogEnv, k: Keys, groups: list[str]) -> Counter[bytes]:
    """Every entry of the layout ``k`` (the one-slot one when ``groups`` is
    empty): its queues, sets and lists, in-progress lists included."""
    r, found = cog.redis, Counter[bytes]()
    for group in groups or [""]:
        g = k.group(group)
        lists = [*r.scan_iter(match=g.queue_prefix + "*"), *r.scan_iter(match=g.inprogress("*"))]
        lists += [g.unsettled, g.repeat_orphans] + ([g.queue(group)] if group else [])
        for key in lists:
            found.update(r.lrange(key, 0, -1))
        for zset in (g.schedule, g.retry, g.dead):
            found.update(r.zrange(zset, 0, -1))
    return found


def test_g16_migration_moves_every_job_to_its_group_once_though_killed_midway(
    cog: CogEnv, namespace: str
) -> None:
    old = get_keys()
    jobs.noop.delay_many([((), {})] * BULK)
    for i in range(3):
        jobs.record.delay(f"default-{i}")
        jobs.record_mail.delay(f"mail-{i}")
        jobs.record.set(queue="mail_bulk").delay(f"bulk-{i}")
    jobs.record.delay_in(3600, "later")
    assert jobs.record.set(queue="mail", unique_for=600).delay("unique") is not None
    # A dead process's list, a dead job and an unsettled one.
    ghost = jobs.record.set(queue="mail_bulk").payload(("ghost",), {})
    cog.redis.lpush(old.inprogress("ghost:1:a"), encode(ghost))
    cog.redis.zadd(old.dead, {encode(jobs.record.payload(("dead",), {})): time.time()})
    cog.redis.lpush(old.unsettled, encode(jobs.record_mail.payload(("unsettled",), {})))
    before = every_job(cog, old, [])
    assert sum(before.values()) == BULK + 9 + 5

    new = sharded(cog, namespace)
    out = StringIO()
    call_command("cogworker_migrate", "--dry-run", stdout=out)
    assert f"would move {BULK + 10} queued" in out.getvalue(), out.getvalue()
    assert every_job(cog, old, []) == before, "a dry run moves nothing"

    migrator = subprocess.Popen(
        [sys.executable, str(MANAGE), "cogworker_migrate"],
        env=manage_env(cog),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    wait_for(
        lambda: cog.redis.llen(new.queue("default")) >= 100 or migrator.poll() is not None,
        STALL_S,
        "the migrator to move its first jobs",
        progress=lambda: cpu_seconds(migrator.pid),
    )
    migrator.kill()
    migrator.wait(10)
    assert cog.redis.llen(old.queue("default")) > 0, "the migrator ended before it was killed"
    call_command("cogworker_migrate", stdout=out)

    after = every_job(cog, new, ["default", "mail"])
    assert after == before, "the moved jobs differ from those queued before"
    assert every_job(cog, old, []) == Counter()
    assert cog.redis.zcard(new.group("default").schedule) == 1
    assert cog.redis.zcard(new.group("default").dead) == 1
    assert cog.redis.llen(new.group("mail").unsettled) == 1
    # The unique lock followed its job: an identical job is still refused.
    assert jobs.record.set(queue="mail", unique_for=600).delay("unique") is None

    # The sharded layout's workers run them, each once.
    workers = [
        cog.start_worker("--skip-checks", QUEUES=["default"]),
        cog.start_worker("--skip-checks", QUEUES=["mail", "mail_bulk"]),
    ]
    tags = {f"{q}-{i}" for q in ("default", "mail", "bulk") for i in range(3)} | {"unique", "ghost"}
    wait_for(
        lambda: tags <= {str(n["tag"]) for n in cog.notes()},
        STALL_S,
        "the moved jobs to run",
        progress=lambda: sum(cpu_seconds(w.pid) for w in workers),
    )
    runs = Counter(str(n["tag"]) for n in cog.notes())
    assert runs == Counter(dict.fromkeys(tags, 1))


def test_migration_refuses_while_a_worker_of_the_one_slot_layout_lives(cog: CogEnv, namespace: str) -> None:
    worker = cog.start_worker()
    worker.identity()
    sharded(cog, namespace)
    with pytest.raises(CommandError, match=r"1 worker process\(es\) of the one-slot layout are alive"):
        call_command("cogworker_migrate")


def test_migration_says_what_it_needs_without_sharding(cog: CogEnv, namespace: str) -> None:
    with pytest.raises(CommandError, match=r"SHARDING'\] is not 'queues' in these settings"):
        call_command("cogworker_migrate")
    assert keys(namespace).namespace == namespace


def test_migration_stopped_between_a_move_and_its_removal_moves_that_entry_once(
    cog: CogEnv, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worst moment to stop: the entry is on its new list, and still on
    the old one. The rerun takes it off the old list only."""
    old = get_keys()
    jobs.record.delay_many([((f"j{i}",), {}) for i in range(5)])
    before = every_job(cog, old, [])
    new = sharded(cog, namespace)

    def cut(*args: object, **kwargs: object) -> None:
        raise redis.ConnectionError("cut between the move and the removal")

    with monkeypatch.context() as patch:
        patch.setattr(redis.Redis, "lrem", cut)
        with pytest.raises(redis.ConnectionError):
            Migration(cog.redis, new).run()
    assert cog.redis.llen(new.queue("default")) == 1 and cog.redis.llen(old.queue("default")) == 5
    Migration(cog.redis, new).run()
    assert every_job(cog, new, ["default"]) == before
    assert every_job(cog, old, []) == Counter()


def test_g16_migration_moves_a_limiters_waiters_to_their_groups_in_order_and_they_run(
    cog: CogEnv, namespace: str
) -> None:
    """Jobs waiting for a limiter's slot in the one-slot layout move to the
    waiting lists of their queues' groups, in their line's order, each
    noted in its group; the sharded workers then let them in under the
    limit, each once."""
    old = get_keys()
    spec = limited_jobs.ERP.spec()
    lines = {"default": ["d0", "d1", "d2"], "mail": ["m0", "m1"]}
    for queue, tags in lines.items():
        for tag in tags:
            payload = limited_jobs.erp_sync.set(queue=queue).payload((0.1, tag), {})
            cog.redis.rpush(old.limit_waiting("erp", queue), encode(payload))
        cog.redis.sadd(old.limit("erp", "queues"), queue)
    cog.redis.hset(old.limits, "erp", spec)
    waiting = {q: cog.redis.lrange(old.limit_waiting("erp", q), 0, -1) for q in lines}

    new = sharded(cog, namespace)
    out = StringIO()
    call_command("cogworker_migrate", stdout=out)
    assert "5 waiting for a limiter" in out.getvalue(), out.getvalue()
    for queue in lines:
        group = new.for_queue(queue)
        assert cog.redis.lrange(group.limit_waiting("erp", queue), 0, -1) == waiting[queue]
        assert cog.redis.hget(group.limit_waiters, f"erp\0{queue}") == spec.encode()
        assert not cog.redis.exists(old.limit_waiting("erp", queue))
    # The limiter's own keys are shared: the same names.
    assert cog.redis.smembers(new.limit("erp", "queues")) == {b"default", b"mail"}

    workers = [
        cog.start_worker("--skip-checks", QUEUES=["default"]),
        cog.start_worker("--skip-checks", QUEUES=["mail", "mail_bulk"]),
    ]
    expected = {tag for tags in lines.values() for tag in tags}
    wait_for(
        lambda: expected <= {str(n["tag"]) for n in cog.notes()},
        STALL_S,
        "the waiters to be let in",
        progress=lambda: sum(cpu_seconds(w.pid) for w in workers),
    )
    assert Counter(str(n["tag"]) for n in cog.notes()) == Counter(dict.fromkeys(expected, 1))
    assert int(cog.redis.get(f"{namespace}:test:gauge:erp:max") or 0) <= 2


def test_g22_migration_a_batch_opened_before_settles_after_it_on_the_sharded_layout(
    cog: CogEnv, namespace: str
) -> None:
    """A batch opened in the one-slot layout, its members still queued in
    two queues: its keys are shared ones and keep their names, its members
    move with their queues, and on the sharded layout their ends reach it
    through their groups' outboxes: it settles, its callback runs once."""
    from django_cogworker import batch
    from testproject.testapp import workflow_jobs as wf

    with batch(on_success=wf.callback.s("ok"), on_settled=wf.callback.s("fin")) as b:
        for i in range(3):
            wf.member.delay(f"default-{i}")
            wf.member.set(queue="mail").delay(f"mail-{i}")
    new = sharded(cog, namespace)
    call_command("cogworker_migrate", stdout=StringIO())
    assert cog.redis.llen(new.queue("default")) == 3 and cog.redis.llen(new.queue("mail")) == 3
    assert cog.redis.scard(new.batch(b.bid, "pending")) == 6, "the batch kept its name and its members"
    workers = [
        cog.start_worker("--skip-checks", QUEUES=["default"]),
        cog.start_worker("--skip-checks", QUEUES=["mail"]),
    ]
    wait_for(
        lambda: len(cog.notes("callbacks")) >= 2,
        STALL_S,
        "the batch's callbacks",
        progress=lambda: sum(cpu_seconds(w.pid) for w in workers),
    )
    assert sorted(str(n["tag"]) for n in cog.notes()) == sorted(
        f"{q}-{i}" for q in ("default", "mail") for i in range(3)
    )
    assert sorted(str(n["tag"]) for n in cog.notes("callbacks")) == ["fin", "ok"]
    assert cog.redis.hexists(new.batch(b.bid), "settled_at")
