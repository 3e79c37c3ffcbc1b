"""G16: every Lua script call keeps its keys in one Redis Cluster slot
(SPEC sections 11 and 16).

A cluster refuses a script whose keys span slots (CROSSSLOT), and routes
it by its keys, so each key must also be in the namespace's slot: with a
hash-tagged namespace (``{name}``, as on a cluster) every key built in
``keys.py`` is. A plain redis-server checks neither, so the test looks
itself: ``tests/slot_guard.py`` wraps every way a script is sent and writes
one line per call, in this process (enqueues, the API) and in real worker
processes (through a ``sitecustomize``). One workload, on the plain server
of the ``cog`` fixture, then reaches every script but those sent only at a
faulty shutdown, under SHARDING or by the migration (``REACHED``,
``NOT_REACHED``), and no call may span slots or leave the namespace's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.crc

import django_cogworker
from django_cogworker import api, batch, chain
from django_cogworker.connection import get_keys
from testproject.testapp import jobs, limited_jobs
from testproject.testapp import workflow_jobs as wf
from tests import slot_guard
from tests.conftest import ROOT, CogEnv, cpu_seconds, kill, wait_for

LUA = Path(django_cogworker.__file__).parent / "lua"

#: The scripts the workload reaches, and what sends each.
REACHED = {
    "fetch": "a worker fetching jobs (Script.run)",
    "ack": "a job that ran; a recovered one; a chain's step with the next",
    "heartbeat": "every beat",
    "file": "a failure filed in retry, then in dead; a batch's member that dies",
    "move_due": "a scheduled job, a retry, a batch's member that expired while scheduled",
    "release_owned": "a unique job that ran or expired; a periodic run's lock",
    "periodic_enqueue": "the ticker pushing a slot of an every-second entry",
    "periodic_hold": "an until_executed run taking its running lock",
    "admit": "a job under a limiter asking for a slot, at its start or in its code (acquire())",
    "park": "a job whose code met a full limiter (its limit set to 0 through the API)",
    "promote": "a limit reset through the API; a slot freed with waiters",
    "release": "a slot taken in a job's code freed at its block's end",
    "forget_limiter": "the poller's sweep once the limiter has nothing left",
    "batch_open": "a batch's block exiting",
    "batch_move": "a batch's member dropped as expired by the poller",
    "move": "the API: kill, delete a batch's member, retry from dead (and bulk: Script.queue)",
    "requeue": "recovery of a SIGKILLed worker's jobs",
    "forget": "recovery forgetting that worker",
    "suspect": "a recovered job run isolated (MAX_ORPHANINGS 1)",
    "requeue_one": "a second recovered job given back while the first runs isolated",
    "file_head": "a job orphaned once too often, buried from repeat_orphans",
    "count": "that burial; a worker's last counts as it stops",
    "metrics": "a worker's last figures as it stops (EVAL from metrics.write)",
}

#: The scripts it does not reach, and why.
NOT_REACHED = {
    # Sent only at shutdown, for a failure whose filing in retry or dead
    # failed against Redis (an owed Filing): that needs a Redis fault inside
    # a worker process, which the guarantee tests inject on their own.
    "park_unsettled": "a shutdown with a filing owed to an outage",
    # Sent only when a forgotten process's list fills again (a fetch sent in
    # the moment between two stops): tests/test_revival_fetch.py makes one.
    "remember": "recovery registering such a process again",
    # Sent only under SHARDING, whose workers tests/test_sharded_layout.py
    # runs with this guard.
    "group_beat": "a beat to a worker's queue group (SHARDING)",
    # Sent only by manage.py cogworker_migrate: tests/test_sharded_migration.py.
    "migrate_push": "a job moved to the sharded layout",
    # A limiter's steps under SHARDING, split by slot (limits/sharded.py):
    # tests/test_sharded_limit_steps.py runs each with this guard.
    "room": "a job parking from its code under SHARDING",
    "shift": "a job moved into its group's waiting line or queue under SHARDING",
    "reserve": "a wake reserving slots under SHARDING",
    "promote_group": "a wake moving waiters onto their queue under SHARDING",
    "release_held": "slots freed under SHARDING",
    # A workflow's steps between its batch's slot and its jobs' groups under
    # SHARDING (workflows/forward.py): tests/test_sharded_workflows.py and
    # tests/test_sharded_workflow_modules.py run them on a real cluster,
    # which refuses any call across slots.
    "batch_apply": "a member's end applied from its group's outbox under SHARDING",
    "forward_push": "a job a batch started, pushed into its group under SHARDING",
}

#: A worker that beats only at its start (and deregisters as it stops), so
#: that its counts and figures are written by count.lua and metrics.lua,
#: not carried by a beat. ORPHAN_THRESHOLD >= HEARTBEAT_TTL > HEARTBEAT_INTERVAL.
ONE_BEAT = {"HEARTBEAT_INTERVAL": 60, "HEARTBEAT_TTL": 180, "ORPHAN_THRESHOLD": 360}

#: Pushed every second by the first worker's ticker.
TICK = {"cron": "* * * * * *", "job": jobs.record.name, "args": ["tick"], "until_executed": True}

#: How long a wait may go without progress.
STALL_S = 30


@pytest.fixture
def recorded(cog: CogEnv, tmp_path: Path) -> Iterator[Path]:
    """A hash-tagged namespace, as on a cluster, and the guard installed in
    this process until the test ends; the file its lines go to."""
    if not cog.namespace.startswith("{"):  # already tagged on a cluster URL
        cog.namespace = "{" + cog.namespace + "}"
        cog.configure(NAMESPACE=cog.namespace)
    path = tmp_path / "script-slots.jsonl"
    path.touch()
    undo = slot_guard.install(str(path), cog.namespace)
    try:
        yield path
    finally:
        undo()


def guarded(cog: CogEnv, tmp_path: Path, path: Path) -> dict[str, str]:
    """The environment of a worker that records its script calls too."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(slot_guard.SITECUSTOMIZE)
    return {
        "PYTHONPATH": f"{site}:{ROOT}",
        slot_guard.FILE_ENV: str(path),
        slot_guard.NAMESPACE_ENV: cog.namespace,
    }


def calls(path: Path) -> list[dict[str, Any]]:
    """The lines written so far (a line being written has no newline yet)."""
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]]


def scripts(path: Path) -> set[str]:
    return {call["script"] for call in calls(path)}


def tags(cog: CogEnv, kind: str = "runs") -> set[str]:
    return {note["tag"] for note in cog.notes(kind) if isinstance(note["tag"], str)}


def redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def latest_deadline(cog: CogEnv) -> float:
    k = get_keys()
    entries = cog.redis.lrange(k.queue("default"), 0, -1) + cog.redis.zrange(k.schedule, 0, -1)
    return max(json.loads(raw).get("expires_at", 0.0) for raw in entries)


def dead_jids(cog: CogEnv) -> set[str]:
    return {json.loads(raw)["jid"] for raw in cog.redis.zrange(get_keys().dead, 0, -1)}


def test_g16_every_script_call_keeps_its_keys_in_one_slot(
    cog: CogEnv, recorded: Path, tmp_path: Path, async_jobs: Any
) -> None:
    assert set(REACHED) | set(NOT_REACHED) == {p.stem for p in LUA.glob("*.lua")}, "a script in neither list"
    k = get_keys()
    env = guarded(cog, tmp_path, recorded)
    # A recovered job runs isolated; a second orphaning buries it (G3).
    cog.configure(MAX_ORPHANINGS=1)
    # Every limited job waits until the resets below let them in (promote.lua):
    # erp_sync from its start (admit.lua), code_limited from its code (park.lua).
    api.Limit("erp").set(0)
    api.Limit("in-code").set(0)

    # Late by the time any worker sees them: dropped, never run.
    jobs.expiring.set(expires_in=0.3).delay("late")
    jobs.expiring_unique.set(expires_in=0.3).delay("late, unique")
    with batch(on_death=wf.callback.s("death"), on_settled=wf.callback.s("settled")):
        wf.member.delay("member")
        wf.die.delay("dies")
        wf.member.set(expires_in=0.3).delay_in(0.05, "expires while scheduled")
        deleted = wf.member.delay_in(3600, "deleted")
    deadline = latest_deadline(cog)
    wait_for(lambda: redis_now(cog.redis) > deadline + 0.05, 10, "Redis's clock past the deadlines")
    held = [jobs.wait_for_go.set(queue="victim").delay(f"held-{i}") for i in (1, 2, 3)]
    # Before any worker starts: else one could run the first and free its
    # lock (until success) before the second is enqueued.
    assert jobs.record.set(unique_for=60).delay("unique") is not None
    assert jobs.record.set(unique_for=60).delay("unique") is None, "the first one holds the lock"

    main = cog.start_worker(env=env, PERIODIC=[TICK])
    victim = cog.start_worker(env=env, QUEUES=["victim"])

    for i in range(3):
        jobs.record.delay(f"plain-{i}")
    failing = jobs.fail.delay("fails")
    jobs.record.delay_in(0.3, "scheduled")
    for i in range(4):
        limited_jobs.erp_sync.delay(0.1, f"erp-{i}")
    for i in range(2):
        limited_jobs.code_limited.delay(0.1, f"in-code-{i}")
    chain(wf.add.s(1, 2), wf.double.s()).delay()
    far = [jobs.record.delay_in(3600, f"far-{i}") for i in range(3)]
    # The API as the admin calls it: one entry at a time, and in bulk (a pipeline).
    assert api.ScheduledSet().find(str(far[0])).kill()
    assert api.bulk([api.ScheduledSet().find(str(jid)) for jid in far[1:]], "retry") == 2
    assert api.ScheduledSet().find(str(deleted)).delete()

    wait_for(
        lambda: (api.Limit("erp").waiting, api.Limit("in-code").waiting) == (4, 2),
        STALL_S,
        "the limited jobs to wait",
        progress=lambda: cpu_seconds(main.pid),
    )
    api.Limit("erp").reset()
    api.Limit("in-code").reset()

    wait_for(
        lambda: len([n for n in cog.notes("started") if n["pid"] == victim.pid]) == 3,
        STALL_S,
        "the victim to start its three jobs",
        progress=lambda: cpu_seconds(victim.pid),
    )
    # As if a process had died under it once before: this death is one too many.
    cog.redis.set(k.orphanings(str(held[2])), 1)
    kill(victim)
    finisher = cog.start_worker(
        env={**env, "COGWORKER_TEST_ASYNC_JOBS": "1"}, QUEUES=["victim", "quiet"], **ONE_BEAT
    )
    # held-1 and held-2 come back (recovered by main), both suspects: one runs
    # isolated, waiting for its go; the finisher gives the other back meanwhile.
    wait_for(
        lambda: "requeue_one" in scripts(recorded),
        STALL_S,
        "a recovered job given back while another ran isolated",
        progress=lambda: cpu_seconds(finisher.pid),
    )
    cog.redis.set(cog.key(f"test:go:{finisher.pid}"), 1)
    wait_for(lambda: {"held-1", "held-2"} <= tags(cog), STALL_S, "the recovered jobs to run")
    async_jobs.asleep.set(queue="quiet").delay(0.05, "async")
    jobs.record.set(queue="quiet").delay("quiet")

    expected = {
        *(f"plain-{i}" for i in range(3)),
        *(f"erp-{i}" for i in range(4)),
        *(f"in-code-{i}" for i in range(2)),
        "scheduled",
        "unique",
        "member",
        "far-1",
        "far-2",
        "tick",
        "async",
        "quiet",
    }

    def done() -> bool:
        return (
            expected <= tags(cog)
            and {"death", "settled"} <= tags(cog, "callbacks")
            and {str(failing), str(held[2])} <= dead_jids(cog)
            and 3 in [note["tag"] for note in cog.notes()]  # the chain's last step: double(1 + 2)
        )

    wait_for(done, STALL_S, "the workload to run", progress=lambda: len(tags(cog)))
    dead = api.DeadSet().find(str(failing))
    assert dead is not None and dead.retry()
    finisher.signal(signal.SIGTERM)  # it writes its last counts and figures
    assert finisher.wait(STALL_S) == 0, finisher.log()

    def missing() -> set[str]:
        return set(REACHED) - scripts(recorded)

    # Forgetting the limiter and the dead worker are later passes of main.
    with contextlib.suppress(AssertionError):  # told by name below
        wait_for(lambda: not missing(), 10, "every script of REACHED to be called")
    seen = calls(recorded)
    strays: dict[str, list[dict[str, Any]]] = {}
    for call in seen:
        if "keys" in call:
            strays.setdefault(call["script"], []).append(call)
    slot = redis.crc.key_slot(cog.namespace.encode())
    assert not strays, f"script calls with a key outside {cog.namespace}'s slot {slot}:\n" + "\n".join(
        f"{name}.lua ({len(found)} call(s)), e.g. {found[0]['slots']} slot(s): {found[0]['keys']}"
        for name, found in sorted(strays.items())
    )
    pids = {call["pid"] for call in seen}
    assert {os.getpid(), main.pid, victim.pid, finisher.pid} <= pids, "a process recorded nothing"
    assert not missing(), f"never called: {sorted(missing())}; called: {sorted(scripts(recorded))}"
