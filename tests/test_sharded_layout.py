"""The sharded key layout (SPEC section 16) on one plain server.

The admin's and the API's merged views are in
``tests/test_sharded_views.py``, limiters in ``tests/test_sharded_limits.py``,
workflows in ``tests/test_sharded_workflows.py``. Here: the layout and the
seam every key goes through (``keys.py``). These tests run workers with
sharding on against one plain redis-server (``--skip-checks``, which also
lets the URL name no cluster), so that a key built outside the seam
fails: the shared keys refuse to name a group's key.
They check that jobs run exactly as without sharding, that every key lands
under ``{N}`` or its group's ``{N:<g>}``, and, with the slot guard, that no
script call mixes slots. The same workers on a real cluster, which refuses
any call across slots, recovery and failover included:
``tests/test_sharded_cluster.py``.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.crc import key_slot

from django_cogworker.connection import get_keys
from testproject.testapp import jobs
from tests import slot_guard
from tests.conftest import ROOT, CogEnv, cpu_seconds, delete_sharded, wait_for

GROUPS = {"mail": ["mail", "mail_bulk"]}


STALL_S = 30

#: Pushed every second by the default group's worker: the ticker's script
#: keeps to the queue's group, the shared records written apart.
TICK = {"cron": "* * * * * *", "job": jobs.record.name, "args": ["tick"], "until_executed": True}


@pytest.fixture
def sharded(cog: CogEnv, tmp_path: Path) -> Iterator[Path]:
    """Sharding on, in this process and the workers: a namespace without
    braces, and the slot guard recording every script call."""
    namespace = f"s{uuid.uuid4().hex[:12]}"
    cog.namespace = namespace
    cog.configure(NAMESPACE=namespace, SHARDING="queues", QUEUE_GROUPS=GROUPS)
    path = tmp_path / "script-slots.jsonl"
    path.touch()
    undo = slot_guard.install(str(path), "")
    try:
        yield path
    finally:
        undo()
        delete_sharded(cog.redis, namespace)


def start(cog: CogEnv, tmp_path: Path, path: Path, queues: list[str], **overrides: Any) -> Any:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(slot_guard.SITECUSTOMIZE)
    env = {"PYTHONPATH": f"{site}:{ROOT}", slot_guard.FILE_ENV: str(path), slot_guard.NAMESPACE_ENV: ""}
    return cog.start_worker("--skip-checks", env=env, QUEUES=queues, **overrides)


def runs(cog: CogEnv) -> Counter[str]:
    return Counter(str(note["tag"]) for note in cog.notes())


def without_ticks(counts: Counter[str]) -> Counter[str]:
    return Counter({tag: n for tag, n in counts.items() if tag != "tick"})


def calls(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]]


def mixed_calls(path: Path, *workers: Any) -> dict[str, list[str]]:
    """The scripts whose calls spanned slots, each with its first such
    call's keys; after checking that the workers' calls were recorded."""
    seen = calls(path)
    for worker in workers:
        sent = {c["script"] for c in seen if c["pid"] == worker.pid}
        assert {"fetch", "heartbeat", "group_beat"} <= sent, f"not recorded: {sent}"
    found: dict[str, list[str]] = {}
    for call in seen:
        if "keys" in call:
            found.setdefault(call["script"], call["keys"])
    return found


def layout_problems(cog: CogEnv) -> list[str]:
    """Every key of the namespace outside ``{N}`` and the groups' tags, or
    a group whose keys are in more than one slot."""
    ns = cog.namespace
    problems, slots = [], {}
    for raw in cog.redis.scan_iter(match=f"*{ns}*", count=1000):
        key = raw.decode("utf-8", "backslashreplace")
        if key.startswith(f"{ns}:test:"):
            continue  # the test jobs' notes
        if key.startswith(f"{{{ns}}}:"):
            continue
        if not key.startswith(f"{{{ns}:"):
            problems.append(f"{key}: outside the sharded layout")
            continue
        group = key[len(ns) + 2 : key.index("}")]
        slots.setdefault(group, set()).add(key_slot(raw))
    problems += [f"group {g}: keys in {len(s)} slots" for g, s in slots.items() if len(s) > 1]
    return problems


def test_g16_sharded_layout_jobs_of_two_groups_run_once_each_under_their_own_tags(
    cog: CogEnv, sharded: Path, tmp_path: Path
) -> None:
    default = start(cog, tmp_path, sharded, ["default"], PERIODIC=[TICK])
    mail = start(cog, tmp_path, sharded, ["mail", "mail_bulk"])
    for i in range(5):
        jobs.record.delay(f"default-{i}")
        jobs.record_mail.delay(f"mail-{i}")
        jobs.record.set(queue="mail_bulk").delay(f"bulk-{i}")
    jobs.record_mail.delay_in(0.3, "mail-scheduled")
    jobs.record.delay_in(0.3, "default-scheduled")
    assert jobs.record.set(queue="mail", unique_for=60).delay("unique") is not None
    assert jobs.record.set(queue="mail", unique_for=60).delay("unique") is None, "the first holds the lock"
    jobs.fail.set(queue="mail_bulk").delay("fails")  # retried twice, then dead in the group

    k = get_keys()
    expected = Counter(
        {
            **{f"{q}-{i}": 1 for q in ("default", "mail", "bulk") for i in range(5)},
            "mail-scheduled": 1,
            "default-scheduled": 1,
            "unique": 1,
            "fails": 3,
        }
    )
    wait_for(
        lambda: (
            without_ticks(runs(cog)) == expected
            and cog.redis.zcard(k.group("mail").dead) == 1
            and runs(cog)["tick"] >= 1
        ),
        STALL_S,
        "every job to run, the failing one to be dead in its group, and a periodic run",
        progress=lambda: cpu_seconds(mail.pid) + cpu_seconds(default.pid),
    )
    assert {n["pid"] for n in cog.notes() if n["queue"] == "default"} == {default.pid}
    assert {n["pid"] for n in cog.notes() if n["queue"] != "default"} == {mail.pid}
    assert cog.redis.zcard(k.group("default").dead) == 0
    assert cog.redis.llen(k.queue("mail_bulk")) == 0 and k.queue("mail_bulk") == (
        f"{{{cog.namespace}:mail}}:queue:mail_bulk"
    )
    assert layout_problems(cog) == []
    assert mixed_calls(sharded, default, mail) == {}


def test_g16_sharded_layout_a_worker_of_two_groups_runs_a_process_per_group(
    cog: CogEnv, sharded: Path, tmp_path: Path
) -> None:
    """``manage.py cogworker`` with queues in two groups supervises a
    process per group, each with its group's queues and a share of the
    threads by weight; each group's jobs run in its own process."""
    worker = start(cog, tmp_path, sharded, ["default,3", "mail,1", "mail_bulk,2"], CONCURRENCY=6)
    for i in range(5):
        jobs.record.delay(f"default-{i}")
        jobs.record_mail.delay(f"mail-{i}")
        jobs.record.set(queue="mail_bulk").delay(f"bulk-{i}")
    expected = Counter({f"{q}-{i}": 1 for q in ("default", "mail", "bulk") for i in range(5)})
    wait_for(
        lambda: without_ticks(runs(cog)) == expected,
        STALL_S,
        "every job of both groups to run once",
        progress=lambda: cog.redis.llen(get_keys().queue("default")),
    )
    by_group = {
        group: {n["pid"] for n in cog.notes() if (n["queue"] == "default") == (group == "default")}
        for group in ("default", "mail")
    }
    assert all(len(pids) == 1 for pids in by_group.values()), by_group
    assert by_group["default"] != by_group["mail"]
    assert worker.pid not in by_group["default"] | by_group["mail"], "the supervisor runs no job"
    assert "queues in 2 groups, a process for each: default (3 threads), mail (3 threads)" in worker.log()
    seen = {c["pid"] for c in calls(sharded) if c["script"] == "group_beat"}
    assert by_group["default"] | by_group["mail"] <= seen
    assert mixed_calls(sharded) == {}
    worker.signal(signal.SIGTERM)
    assert worker.wait(STALL_S) == 0


def test_sharded_layout_a_worker_process_of_two_groups_is_refused_with_the_way_out(
    cog: CogEnv, sharded: Path
) -> None:
    from django_cogworker.conf import QueueSpec, get_config
    from django_cogworker.errors import ConfigurationError
    from django_cogworker.process import served_keys

    cog.configure(QUEUES=["default", "mail"])
    way_out = "runs a process per group, or list them in one QUEUE_GROUPS"
    with pytest.raises(ConfigurationError, match=way_out):
        served_keys(get_config())
    assert served_keys(get_config(), (QueueSpec("mail", 0), QueueSpec("mail_bulk", 0))).tag.endswith(":mail}")


def test_g16_sharded_layout_a_job_naming_another_groups_queue_goes_back_to_its_own_groups_first_queue(
    cog: CogEnv, sharded: Path, tmp_path: Path
) -> None:
    """A payload in the ``mail`` group's keys that names a queue of another
    group (pushed by hand, or QUEUE_GROUPS changed since) cannot be moved
    there by one script: recovered from a dead process's list, or due in
    the group's schedule, it goes to the group's first queue (``mail``),
    where the group's worker runs it; an unreadable one is filed in the
    group's dead set. No script call spans two slots."""
    from django_cogworker.payload import encode

    k = get_keys()
    mail = k.group("mail")
    assert mail.own("default") == "mail" and mail.own("mail_bulk") == "mail_bulk"
    stray = encode(jobs.record.payload(("recovered-stray",), {}))  # queue "default"
    assert b'"queue":"default"' in stray
    dead_id = "host:9:gone"
    cog.redis.rpush(mail.inprogress(dead_id), stray, b"not json")
    cog.redis.sadd(mail.inprogress_identities, dead_id)
    cog.redis.hset(mail.last_beat, dead_id, "0")
    cog.redis.zadd(mail.schedule, {encode(jobs.record.payload(("due-stray",), {})): 1})
    worker = start(cog, tmp_path, sharded, ["mail", "mail_bulk"])
    wait_for(
        lambda: {"recovered-stray", "due-stray"} <= set(runs(cog)) and cog.redis.zcard(mail.dead) == 1,
        STALL_S,
        "both strays to run on the mail group's worker and the unreadable one to be dead there",
        progress=lambda: cpu_seconds(worker.pid),
    )
    assert without_ticks(runs(cog)) == Counter({"recovered-stray": 1, "due-stray": 1})
    assert {n["pid"] for n in cog.notes()} == {worker.pid}
    assert not cog.redis.exists(mail.inprogress(dead_id)) and cog.redis.zcard(mail.schedule) == 0
    assert cog.redis.llen(k.queue("default")) == 0
    assert mixed_calls(sharded, worker) == {}
