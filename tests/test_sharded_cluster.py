"""The sharded layout (SPEC section 16) on a real Redis Cluster of three
masters, each with a replica.

Limiters across groups are in ``tests/test_sharded_limits.py``, workflows
in ``tests/test_sharded_workflows.py``. Here:
queues spread over the masters (their share of the commands), each script
call in one slot (a cluster refuses any other), a SIGKILLed worker of
three groups (a process per group) whose jobs come back by the decision
of each group's master alone, a stalled master
that takes no live process for dead and stops only its own queues, a
stalled shared slot that stops none, a master SIGKILLed that stops only
its queues and loses no confirmed job, a confirmed push that waits on each
master it wrote to, ``cogworker_status`` summing the groups, the set
pages' merge of the groups' sets with a move on each entry's own master,
the Tasks record in its job's group, coroutine jobs of two groups, and a
worker cut off from its group's master only (a partial partition).
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_cogworker.client import enqueue_many
from django_cogworker.connection import get_keys
from testproject.testapp import jobs
from tests.conftest import ROOT, CogEnv, cpu_seconds, delete_sharded, kill, wait_for
from tests.test_failover import Producer
from tests.test_stall import SLOW_BEATS
from tests.test_worker_logs import status
from tests.topology import ClusterGroup, call, cluster_redis_url, healthy_cluster, redis_cluster  # noqa: F401

STALL_S = 30

PAUSE_S = 6.0

#: The commands each job costs its queue's master once: its push, its move
#: into an in-progress list (inside fetch.lua, or BLMOVE) and its ack. The
#: calls that carry them (EVALSHA, one per batch of jobs) vary with how a
#: loaded machine batches the fetches, not with where the keys live: a CI
#: run counting them measured 0.243 for one master. The shares of every
#: command, calls included, are in docs/performance.md (tools/bench_shards.py).
DATA_COMMANDS = {"lpush", "lmove", "blmove", "lrem"}

#: Jobs queued for each queue the failover test does not stop: more than
#: its workers run before the kill and during the takeover.
BACKLOG = 4000

#: Runs of each such queue before the kill: a few seconds at its pace, so
#: that the window before the kill (as long as the takeover) is past the
#: workers' start.
STEADY = 800


def masters(cluster: ClusterGroup) -> list[int]:
    port = next(n.port for n in cluster.nodes if n.alive)
    return sorted({owner for _, _, owner in cluster._owners(port)})


def record_each(queues: list[str], suffixes: Any) -> set[str]:
    """Enqueues a ``record`` job tagged ``<queue>-<suffix>`` per queue and
    suffix; returns the tags."""
    tagged = {f"{q}-{x}": q for q in queues for x in suffixes}
    for tag, q in tagged.items():
        jobs.record.set(queue=q).delay(tag)
    return set(tagged)


def tags(cog: CogEnv, kind: str = "runs") -> set[str]:
    return {str(note["tag"]) for note in cog.notes(kind)}


def queues_per_master(cluster: ClusterGroup, namespace: str, each: int) -> dict[int, list[str]]:
    """``each`` queue names whose group tag lands on each master."""
    found: dict[int, list[str]] = {port: [] for port in masters(cluster)}
    i = 0
    while any(len(names) < each for names in found.values()):
        name = f"q{i}"
        i += 1
        owner = cluster.owner_of(f"{{{namespace}:{name}}}")
        if len(found[owner]) < each:
            found[owner].append(name)
    return found


@pytest.fixture
def sharded(cog: CogEnv, redis_cluster: ClusterGroup) -> Iterator[CogEnv]:  # noqa: F811
    namespace = f"s{uuid.uuid4().hex[:12]}"
    cog.namespace = namespace
    cog.configure(NAMESPACE=namespace, SHARDING="queues")
    yield cog
    client = redis_cluster.client()
    try:
        delete_sharded(client, namespace)
    finally:
        client.close()


def data_calls(port: int) -> int:
    with redis.Redis(port=port) as node:
        stats = node.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k.removeprefix("cmdstat_") in DATA_COMMANDS)


def test_g16_sharded_six_queues_spread_their_commands_over_three_masters(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    cog = sharded
    placed = queues_per_master(redis_cluster, cog.namespace, 2)
    queues = [q for names in placed.values() for q in names]
    before = {port: data_calls(port) for port in placed}
    workers = [
        cog.start_worker("--skip-checks", QUEUES=[q], HEARTBEAT_INTERVAL=1, HEARTBEAT_TTL=5) for q in queues
    ]
    per_queue = 500
    for q in queues:
        for _ in range(per_queue):
            jobs.noop.set(queue=q).delay()
    k = get_keys()

    def drained() -> bool:
        return all(cog.redis.llen(k.queue(q)) == 0 for q in queues)

    wait_for(
        drained, STALL_S, "every queue to drain", progress=lambda: sum(cpu_seconds(w.pid) for w in workers)
    )
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(STALL_S) == 0, w.log()
    assert int(cog.redis.get(k.stat_processed) or 0) == per_queue * len(queues)
    calls = {port: data_calls(port) - before[port] for port in placed}
    total = sum(calls.values())
    m = len(placed)
    shares = {port: n / total for port, n in calls.items()}
    print(f"data commands per master: {calls}; shares {[round(x, 3) for x in shares.values()]}")
    assert all(abs(share - 1 / m) <= 0.25 / m for share in shares.values()), (shares, calls)


def test_g1_sharded_a_sigkilled_worker_of_three_groups_gets_its_jobs_back_by_each_masters_own_decision(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    """One worker serving queues of three groups on three masters (a
    process per group) is SIGKILLed, supervisor and processes: each group's
    jobs come back by its own master's decision and run once more, on
    another worker of the three groups."""
    cog = sharded
    placed = queues_per_master(redis_cluster, cog.namespace, 1)
    queues = [names[0] for names in placed.values()]
    victim = cog.start_worker("--skip-checks", QUEUES=queues, CONCURRENCY=6)
    for q in queues:
        for i in range(2):
            jobs.noted_pace.set(queue=q).delay(30, f"{q}-{i}")
    wait_for(
        lambda: len(cog.notes("started")) == 2 * len(queues),
        STALL_S,
        "the victim to start every job",
        progress=lambda: len(victim.log()),
    )
    holders = {str(n["queue"]): int(n["pid"]) for n in cog.notes("started")}
    assert len(set(holders.values())) == 3 and victim.pid not in holders.values(), "a process per group"
    k = get_keys()
    for q in queues:
        lists = list(cog.redis.scan_iter(match=k.for_queue(q).inprogress("*")))
        assert len(lists) == 1 and cog.redis.llen(lists[0]) == 2, f"{q}'s jobs in its group's list"
    for pid in holders.values():
        os.kill(pid, signal.SIGKILL)
    kill(victim)  # within the supervisor's restart pause: nothing is started again
    # The reruns take a short pace: the recovery is what is waited for.
    rescuer = cog.start_worker("--skip-checks", QUEUES=queues, CONCURRENCY=6)
    expected = {f"{q}-{i}" for q in queues for i in range(2)}
    wait_for(
        lambda: expected <= {str(n["tag"]) for n in cog.notes()},
        STALL_S + 40,
        "every held job to run again",
        progress=lambda: len(rescuer.log()),
    )
    runs = Counter(str(n["tag"]) for n in cog.notes())
    assert runs == Counter(dict.fromkeys(expected, 1))
    # Each job came back on its own group's master, run by that group's process.
    ran = {str(n["queue"]): {int(n["pid"])} for n in cog.notes()}
    for note in cog.notes():
        ran[str(note["queue"])].add(int(note["pid"]))
    assert all(len(pids) == 1 for pids in ran.values()), ran
    assert len({p for pids in ran.values() for p in pids} - set(holders.values())) == 3
    assert rescuer.log().count("requeued 2 job(s) left in progress by dead process") == 3


def pause(port: int, seconds: float) -> threading.Thread:
    """``CLIENT PAUSE`` of one master (answered at once, from a thread): it
    answers no other client for ``seconds`` (its keys do not expire
    meanwhile, as in a stall), while the cluster bus goes on, so that no
    replica takes over."""

    def paused() -> None:
        with redis.Redis(port=port) as node:
            node.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "ALL")

    thread = threading.Thread(target=paused, daemon=True)
    thread.start()
    return thread


def test_g2_sharded_a_stalled_master_takes_no_live_process_for_dead_and_stops_only_its_queues(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    cog = sharded
    placed = queues_per_master(redis_cluster, cog.namespace, 1)
    # The stalled master holds one queue's group, and neither the shared
    # slot nor the test's notes: what it stops is that group alone.
    others = {redis_cluster.owner_of(key) for key in (f"{{{cog.namespace}}}", cog.key("test:runs"))}
    stalled = next(port for port in placed if port not in others)
    slow = placed[stalled][0]
    fast = [names[0] for port, names in placed.items() if port != stalled]
    cog.configure(CONCURRENCY=2, **SLOW_BEATS)
    holder = cog.start_worker("--skip-checks", QUEUES=[slow])
    for i in range(2):
        jobs.sleep_then_record.set(queue=slow).delay(10.0, f"long-{i}")
    wait_for(lambda: len(cog.notes("started")) == 2, STALL_S, "the holder to start both long jobs")
    # A second worker of that group, whose recovery could take the holder for dead.
    watcher = cog.start_worker("--skip-checks", QUEUES=[slow])
    runners = [cog.start_worker("--skip-checks", QUEUES=[q]) for q in fast]
    record_each(fast, ["before"])
    wait_for(lambda: len(cog.notes()) == len(fast), STALL_S, "the other groups' workers to run a job")
    stall = pause(stalled, PAUSE_S)
    started_at = time.time()
    during = record_each(fast, range(5))
    wait_for(
        lambda: during <= {str(n["tag"]) for n in cog.notes()},
        PAUSE_S,
        "the other groups' jobs, in the stall",
    )
    assert time.time() - started_at < PAUSE_S, "the other groups waited for the stalled master"
    stall.join(PAUSE_S + 10)
    wait_for(
        lambda: {"long-0", "long-1"} <= {str(n["tag"]) for n in cog.notes()}, STALL_S, "the long jobs to end"
    )
    time.sleep(1.0)  # a second start, if any, would have been noted by now
    assert Counter(str(n["tag"]) for n in cog.notes("started")) == Counter({"long-0": 1, "long-1": 1})
    for worker in (holder, watcher, *runners):
        assert "left in progress by dead process" not in worker.log(), worker.log()


def test_g2_sharded_a_stall_of_the_shared_slots_master_stops_no_queue(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    """The shared records (the admin's, the counters) wait; each group's
    beats go on from their own thread, so its workers keep fetching."""
    cog = sharded
    # A namespace whose shared slot is on one master and the test jobs'
    # notes on another: the jobs write their notes during the stall.
    while redis_cluster.owner_of(f"{{{cog.namespace}}}") == redis_cluster.owner_of(cog.key("test:runs")):
        cog.namespace = f"s{uuid.uuid4().hex[:12]}"
        cog.configure(NAMESPACE=cog.namespace)
    shared = redis_cluster.owner_of(f"{{{cog.namespace}}}")
    placed = queues_per_master(redis_cluster, cog.namespace, 1)
    queues = [names[0] for port, names in placed.items() if port != shared]
    # No socket timeout: a call to the stalled master waits as long as it stalls.
    cog.configure(**{**SLOW_BEATS, "REDIS_OPTIONS": {}})
    workers = [cog.start_worker("--skip-checks", QUEUES=[q]) for q in queues]
    record_each(queues, ["before"])
    wait_for(lambda: len(cog.notes()) == len(queues), STALL_S, "the workers to run a job each")
    # Long enough for a registration renewed by a beat held up behind the
    # stalled shared call to lapse: the fetch would then wait for it (G18).
    stall, paused_at = pause(shared, PAUSE_S + 2), time.time()
    time.sleep(SLOW_BEATS["HEARTBEAT_INTERVAL"] + SLOW_BEATS["HEARTBEAT_TTL"] + 0.5)
    during = record_each(queues, range(5))
    wait_for(lambda: during <= tags(cog), 3, "the queues' jobs, while the shared master stalls")
    assert time.time() - paused_at < PAUSE_S + 2, "the jobs waited for the stall to end"
    stall.join(PAUSE_S + 10)
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait(STALL_S) == 0, worker.log()


def runs_between(cog: CogEnv, queue: str, start: float, end: float) -> int:
    return sum(1 for n in cog.notes() if n["queue"] == queue and start <= n["at"] < end)


def test_g11_sharded_a_master_sigkilled_stops_only_its_queues_and_loses_no_confirmed_job(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    """A master SIGKILLed, with ``cluster-require-full-coverage no`` (what
    docs/deployment.md asks for under SHARDING): its queue stops until its
    replica takes over, and loses no confirmed job; the other queues keep
    at least 80% of their throughput meanwhile (99 to 101% on a quiet
    machine; a run on a slow one kept 89.6%). With Redis's default
    (``yes``) every master refuses commands from the moment the dead one is
    marked failed to its replica's promotion: the others then stopped for
    0.75 to 1 s of a 2 to 3 s takeover (about 60% of their throughput)."""
    cog = sharded
    # The shared slot and the notes on one master, so that the victim is a
    # master with only a queue group on it.
    while redis_cluster.owner_of(f"{{{cog.namespace}}}") != redis_cluster.owner_of(cog.key("test:runs")):
        cog.namespace = f"s{uuid.uuid4().hex[:12]}"
        cog.configure(NAMESPACE=cog.namespace)
    shared = redis_cluster.owner_of(f"{{{cog.namespace}}}")
    placed = {port: names[0] for port, names in queues_per_master(redis_cluster, cog.namespace, 1).items()}
    victim = next(port for port in placed if port != shared)
    cog.configure(ENQUEUE_WAIT_REPLICAS=1, ENQUEUE_WAIT_TIMEOUT=0.5, HEARTBEAT_TTL=4, ORPHAN_THRESHOLD=8)
    slow = placed[victim]
    others = [q for port, q in placed.items() if port != victim]
    # The other queues' throughput is their workers' pace through a backlog
    # (20 ms jobs, 4 threads: about 190 a second each), not a producer's in
    # this process, whose threads share its GIL with the victim's producer.
    for q in others:
        enqueue_many([jobs.pace.set(queue=q).payload((0.02, f"{q}-{i}"), {}) for i in range(BACKLOG)])
    coverage(redis_cluster, "no")
    workers = [cog.start_worker("--skip-checks", QUEUES=[q]) for q in placed.values()]
    producer = Producer(0.001, queue=slow)
    producer.__enter__()
    try:
        wait_for(
            lambda: (
                all(runs_between(cog, q, 0, math.inf) >= STEADY for q in others)
                and runs_between(cog, slow, 0, math.inf) >= 30
            ),
            STALL_S,
            "every queue to run steadily (the window before the kill measures that)",
        )
        killed_at = time.time()
        promoted_in = redis_cluster.kill(victim)
        promoted_at = time.time()
        redis_cluster.restart(victim)  # the promoted master's replica, to confirm enqueues again
        at_restart = len(producer.confirmed)
        wait_for(lambda: len(producer.confirmed) >= at_restart + 20, STALL_S, "its queue confirmed again")
    finally:
        producer.__exit__()
        coverage(redis_cluster, "yes")
    confirmed = set(producer.confirmed)
    wait_for(lambda: confirmed <= {str(n["jid"]) for n in cog.notes()}, 60, "every confirmed job to run")
    assert all(w.alive() for w in workers)
    window = promoted_at - killed_at
    for q in others:
        before = runs_between(cog, q, killed_at - window, killed_at)
        during = runs_between(cog, q, killed_at, promoted_at)
        print(
            f"\n[sharded] {q}: {before} runs in the {window:.1f}s before the kill, {during} in the takeover"
        )
        assert runs_between(cog, q, promoted_at, math.inf) > 0, f"{q}'s backlog lasted the takeover"
        assert during >= 0.8 * before, (q, before, during)  # ``yes`` gives about 0.6
    promoted = f"promoted in {promoted_in:.1f}s"
    print(f"[sharded] {slow}: master killed, {promoted}; {len(confirmed)} confirmed jobs all ran")


def coverage(cluster: ClusterGroup, value: str) -> None:
    """``cluster-require-full-coverage`` on every live node."""
    for node in cluster.nodes:
        if node.alive:
            call(node.port, "CONFIG", "SET", "cluster-require-full-coverage", value)


def test_g11_sharded_a_confirmed_push_over_three_groups_waits_on_each_master(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    cog = sharded
    cog.configure(ENQUEUE_WAIT_REPLICAS=1, ENQUEUE_WAIT_TIMEOUT=2.0)
    placed = {port: names[0] for port, names in queues_per_master(redis_cluster, cog.namespace, 1).items()}
    waits = {port: wait_calls(port) for port in placed}
    payloads = [jobs.record.set(queue=q).payload((q,), {}) for q in placed.values() for _ in range(3)]
    assert len(enqueue_many(payloads)) == 9
    k = get_keys()
    assert [cog.redis.llen(k.queue(q)) for q in placed.values()] == [3, 3, 3]
    # One WAIT on each master written, after the push on the same connection.
    assert {port: wait_calls(port) - n for port, n in waits.items()} == dict.fromkeys(placed, 1)


def wait_calls(port: int) -> int:
    with redis.Redis(port=port) as node:
        return int(node.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def test_g16_sharded_status_sums_the_groups_and_names_each_groups_slot_and_master(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    """``cogworker_status`` (its system checks skipped: a probe) reads one
    view over the groups: the sets' sizes summed; ``--shards`` gives each
    group its slot and master."""
    cog = sharded
    placed = {port: names[0] for port, names in queues_per_master(redis_cluster, cog.namespace, 1).items()}
    queues = list(placed.values())
    cog.configure(QUEUES=queues)
    for q in queues:
        jobs.record.set(queue=q).delay(f"{q}-queued")
        jobs.record.set(queue=q).delay_in(3600, f"{q}-later")
    code, out, err = status(cog, "--shards", "--json")
    assert code == 1, out + err  # no process
    report = json.loads(out)
    assert report["scheduled"] == 3 and report["dead"] == 0, report
    assert {q["name"]: q["size"] for q in report["queues"]} == dict.fromkeys(queues, 1)
    found = report["shards"]
    assert found["sharded"] is True and found["idle_masters"] == [], found
    where = {g["group"]: g["master"] for g in found["groups"]}
    assert where == {q: f"127.0.0.1:{port}" for port, q in placed.items()}, found
    assert found["full_coverage"] == sorted(f"127.0.0.1:{port}" for port in placed), "Redis's default"
    code, out, _ = status(cog, "--shards")
    assert "shards: 3 group(s) on 3 of 3 masters" in out, out
    assert "hold no queue" not in out, out
    assert "warning: cluster-require-full-coverage is yes on 127.0.0.1:" in out, out
    coverage(redis_cluster, "no")
    try:
        code, out, _ = status(cog, "--shards")
    finally:
        coverage(redis_cluster, "yes")
    assert "cluster-require-full-coverage" not in out, out


def test_g16_sharded_set_pages_merge_the_groups_of_three_masters_and_act_on_each(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The API's sets (what the admin's pages list) over three groups on
    three masters: one size, one order by score, and each move a script on
    its entry's own master (a cluster refuses any call across slots); a
    bulk action pipelines each master's part of every 500 entries."""
    from django_cogworker import api
    from django_cogworker.api import actions

    parts: list[tuple[int, int]] = []
    pipelined = actions._pipelined

    def spy(client: Any, chunk: list[Any], action: str) -> int:
        parts.append((client.connection_pool.connection_kwargs["port"], len(chunk)))
        return pipelined(client, chunk, action)

    monkeypatch.setattr(actions, "_pipelined", spy)

    cog = sharded
    placed = [names[0] for names in queues_per_master(redis_cluster, cog.namespace, 1).values()]
    for i in range(30):
        q = placed[i % 3]
        jobs.fail.set(queue=q).delay_in(3600 + i // 2, f"{q}-{i}")  # ties across groups
    scheduled = api.ScheduledSet()
    # Queues no setting names: known from the producer's registration.
    assert {g.tag for g in scheduled.groups} >= {f"{{{cog.namespace}:{q}}}" for q in placed}
    assert scheduled.size == 30
    order = [(r.score, r.entry) for r in scheduled]
    assert order == sorted(order) and len(order) == 30
    assert [r.entry for r in scheduled.page(12, 6)] == [e for _, e in order[12:18]]
    k = get_keys()
    first = scheduled.find(json.loads(order[0][1])["jid"])
    assert first.kill() is True and api.DeadSet().size == 1
    assert first.source == k.for_queue(first.queue).schedule
    for i in range(1200):
        jobs.fail.set(queue=placed[i % 3]).delay_in(7200, f"more-{i}")
    # A deep page is sought by counts (api.seek), not read from the start:
    # the same entries as the merge from the start.
    whole = [r.entry for r in api.ScheduledSet()]
    assert len(whole) == 1229
    assert [r.entry for r in api.ScheduledSet().page(1150, 25)] == whole[1150:1175]
    assert [r.entry for r in api.ScheduledSet().page(1225, 25)] == whole[1225:]
    assert api.bulk(api.ScheduledSet(), "retry") == 1229
    assert sorted(cog.redis.llen(k.queue(q)) for q in placed) == [409, 410, 410]
    assert all(cog.redis.sismember(k.queues, q) for q in placed)
    # Three chunks (500, 500, 229), each in one pipeline per master.
    assert len(parts) == 9 and {port for port, _ in parts} == set(masters(redis_cluster))
    assert sum(n for _, n in parts) == 1229
    assert api.DeadSet().clear() == 1 and api.DeadSet().size == 0


def test_g16_sharded_a_tasks_result_lives_in_its_jobs_group_and_its_run_writes_it_there(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    """The Tasks backend's record and its job's push share one MULTI, which
    a cluster takes in one slot only: the record is in the job's group."""
    import asyncio

    from django_cogworker.tasks.compat import TaskResultStatus, task_backends
    from testproject.testapp import tasks

    default_task_backend = task_backends["default"]

    cog = sharded
    k = get_keys()
    done = [tasks.add.enqueue(2, 3), asyncio.run(tasks.add.aenqueue(4, 5))]
    group = k.for_queue("default")
    assert all(cog.redis.exists(group.result(r.id)) for r in done)
    assert cog.redis.llen(k.queue("default")) == 2 and cog.redis.sismember(k.queues, "default")
    worker = cog.start_worker("--skip-checks", QUEUES=["default"])
    ready = TaskResultStatus.SUCCESSFUL
    wait_for(
        lambda: all(default_task_backend.get_result(r.id).status == ready for r in done),
        STALL_S,
        "both tasks to run and write their result in their group",
        progress=lambda: cpu_seconds(worker.pid),
    )
    assert [default_task_backend.get_result(r.id).return_value for r in done] == [5, 9]
    assert asyncio.run(default_task_backend.aget_result(done[1].id)).return_value == 9


def test_g16_sharded_async_jobs_of_two_groups_run_side_by_side_in_each_groups_process(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
    async_jobs: Any,
) -> None:
    """SPEC section 15 with sharding on: ``async def`` jobs of two groups on
    two masters, each group's on its own process's event loop, many in
    flight at once."""
    cog = sharded
    queues = [names[0] for names in queues_per_master(redis_cluster, cog.namespace, 1).values()][:2]
    worker = cog.start_worker("--skip-checks", env={"COGWORKER_TEST_ASYNC_JOBS": "1"}, QUEUES=queues)
    for q in queues:
        for i in range(20):
            async_jobs.asleep.set(queue=q).delay(1.0, f"{q}-{i}")
    wait_for(
        lambda: len(cog.notes()) == 40,
        STALL_S,
        "the 40 coroutine jobs to run",
        progress=lambda: len(cog.notes("started")),
    )
    notes = cog.notes()
    assert Counter(str(n["tag"]) for n in notes) == Counter(
        {f"{q}-{i}": 1 for q in queues for i in range(20)}
    )
    assert all(n["seen_jid"] == n["jid"] for n in notes), "current_job() right after the await"
    pids = {q: {n["pid"] for n in notes if n["queue"] == q} for q in queues}
    assert all(len(p) == 1 for p in pids.values()) and len(set().union(*pids.values())) == 2, pids
    assert worker.pid not in set().union(*pids.values())
    # In flight together: every job of a group started before the first of them ended.
    for q in queues:
        started = sorted(float(n["at"]) for n in cog.notes("started") if n["queue"] == q)
        ended = min(float(n["at"]) for n in notes if n["queue"] == q)
        assert started[-1] < ended, q


#: Imported at a worker's start (its PYTHONPATH leads with the directory):
#: its cluster client reaches one master through a proxy the test can cut.
REMAP_SITECUSTOMIZE = """\
import os

import redis.cluster

_victim, _proxy = map(int, os.environ["COGWORKER_TEST_REMAP"].split(":"))
_init = redis.cluster.RedisCluster.__init__


def _remapped(self, *args, **kwargs):
    kwargs["address_remap"] = lambda address: (address[0], _proxy) if address[1] == _victim else address
    _init(self, *args, **kwargs)


redis.cluster.RedisCluster.__init__ = _remapped
"""


def test_g18_sharded_a_process_cut_off_from_its_groups_master_only_starts_nothing_twice(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
    tmp_path: Any,
) -> None:
    """A partial partition: worker A reaches the shared slot's master (its
    beat record, the notes) but not its group's, through a proxy that stops
    forwarding both ways with the sockets open. A runs two long jobs and
    its two idle threads wait in BLMOVE; during the cut two jobs come,
    which Redis moves into A's list for those waits. Past ORPHAN_THRESHOLD
    the group's master takes A for dead, and C runs the four jobs. Once the
    cut heals, A reads the held replies and starts neither job, and its
    late acks change nothing: only the two jobs A was running when the cut
    began run twice (docs/deployment.md)."""
    from tests.proxy import PausableProxy
    from tests.test_revival_fetch import NOT_STARTED

    cog = sharded
    while redis_cluster.owner_of(f"{{{cog.namespace}}}") != redis_cluster.owner_of(cog.key("test:runs")):
        cog.namespace = f"s{uuid.uuid4().hex[:12]}"
        cog.configure(NAMESPACE=cog.namespace)
    shared = redis_cluster.owner_of(f"{{{cog.namespace}}}")
    placed = queues_per_master(redis_cluster, cog.namespace, 1)
    victim = next(port for port in placed if port != shared)
    q = placed[victim][0]
    group = get_keys().for_queue(q)
    site = tmp_path / "remap"
    site.mkdir()
    (site / "sitecustomize.py").write_text(REMAP_SITECUSTOMIZE)

    def blocked(name: str) -> int:
        clients = redis.Redis(port=victim).client_list()
        return sum(1 for c in clients if c.get("name") == name and c["cmd"] == "blmove" and "b" in c["flags"])

    def notes_of(pid: int, kind: str = "runs") -> Counter[str]:
        return Counter(str(n["tag"]) for n in cog.notes(kind) if n["pid"] == pid)

    with PausableProxy(victim) as proxy:
        env = {"PYTHONPATH": f"{site}:{ROOT}", "COGWORKER_TEST_REMAP": f"{victim}:{proxy.port}"}
        a = cog.start_worker(
            "--skip-checks", env=env, QUEUES=[q], CONCURRENCY=4, REDIS_OPTIONS={"client_name": "cut"}
        )
        for i in range(2):
            jobs.noted_pace.set(queue=q).delay(4, f"held-{i}")
        wait_for(lambda: len(cog.notes("started")) == 2, STALL_S, "A to start both long jobs")
        assert {n["pid"] for n in cog.notes("started")} == {a.pid}
        wait_for(lambda: blocked("cut") == 2, STALL_S, "A's two idle threads to wait in BLMOVE")
        [a_list] = [key.decode() for key in cog.redis.scan_iter(match=group.inprogress("*"))]  # A's alone
        proxy.cut()
        try:
            for i in range(2):
                jobs.record.set(queue=q).delay(f"landed-{i}")
            wait_for(lambda: cog.redis.llen(a_list) == 4, STALL_S, "both new jobs to land in A's list")
            c = cog.start_worker("--skip-checks", QUEUES=[q], CONCURRENCY=4)
            wait_for(
                lambda: (
                    notes_of(c.pid, "started") == Counter(["held-0", "held-1"])
                    and notes_of(c.pid) >= Counter(["landed-0", "landed-1"])
                ),
                STALL_S,
                "the group's master to take A for dead, and C to run A's four jobs",
                progress=lambda: cpu_seconds(c.pid),
            )
        finally:
            proxy.heal()
        healed_at = time.time()
        wait_for(
            lambda: (
                a.log().count(NOT_STARTED) >= 2 or notes_of(a.pid)["landed-0"] + notes_of(a.pid)["landed-1"]
            ),
            STALL_S,
            "A to read the two replies held by the cut",
        )
        wait_for(
            lambda: notes_of(a.pid) + notes_of(c.pid) >= Counter({"held-0": 2, "held-1": 2}),
            STALL_S,
            "both runs of each held job to end (A's, begun before the cut, and C's)",
        )
        print(f"\n[sharded] partition: A logged {a.log().count(NOT_STARTED)} fetched job(s) as not started")
        after = [f"after-{i}" for i in range(6)]
        for tag in after:
            jobs.record.set(queue=q).delay(tag)
        wait_for(
            lambda: set(after) <= {str(n["tag"]) for n in cog.notes()},
            STALL_S,
            "new jobs to run after the cut",
        )
        runs = Counter(str(n["tag"]) for n in cog.notes())
        assert runs == Counter(
            {"held-0": 2, "held-1": 2, "landed-0": 1, "landed-1": 1, **dict.fromkeys(after, 1)}
        )
        assert notes_of(a.pid)["landed-0"] == notes_of(a.pid)["landed-1"] == 0, (
            "A started no job it got in the cut"
        )
        assert not [n for n in cog.notes("started") if n["pid"] == a.pid and n["at"] > healed_at]
        wait_for(lambda: cog.redis.llen(a_list) == 0, STALL_S, "A's list to empty")
        a.signal(signal.SIGTERM)
        c.signal(signal.SIGTERM)
        assert a.wait(STALL_S) == 0 and c.wait(STALL_S) == 0


def test_g17_sharded_every_node_killed_and_restarted_from_its_aof_mid_run_loses_nothing(
    sharded: CogEnv,
    redis_cluster: ClusterGroup,  # noqa: F811
) -> None:
    """G17 on the sharded layout: every node of the cluster (three masters,
    three replicas, append-only) SIGKILLed mid-run and started again from
    its files, while a worker of three groups on the three masters runs:
    its processes wait out the outage, and every job runs to an end, none
    lost, at most one per thread twice."""
    cog = sharded
    placed = [names[0] for names in queues_per_master(redis_cluster, cog.namespace, 1).values()]
    tagged = [f"{q}-{i}" for q in placed for i in range(150)]
    for q in placed:
        jobs.pace.set(queue=q).delay_many([((0.02, f"{q}-{i}"), {}) for i in range(150)])
    worker = cog.start_worker(QUEUES=placed, CONCURRENCY=6)  # a process per group, two threads each
    wait_for(
        lambda: len(cog.notes()) >= 60, STALL_S, "the run to get going", progress=lambda: len(worker.log())
    )
    for node in redis_cluster.nodes:
        node.kill()
    time.sleep(1.0)
    for node in redis_cluster.nodes:
        node.start()
    redis_cluster.heal()  # the same roles again (or, had a replica taken over, a replica for each master)

    def ran() -> Counter[str]:
        return Counter(str(n["tag"]) for n in cog.notes())

    wait_for(lambda: set(ran()) == set(tagged), STALL_S, "every job to run after the restart", progress=ran)
    k = get_keys()
    wait_for(
        lambda: sum(cog.redis.llen(k.queue(q)) for q in placed) == 0,
        STALL_S,
        "every queue empty",
        progress=ran,
    )
    assert worker.alive()
    second_runs = sum(n - 1 for n in ran().values())
    assert second_runs <= 6, f"{second_runs} jobs ran twice (at most one per thread)"
    log = worker.log()
    outage = ("Redis unreachable", "Redis has no master")
    assert any(said in log for said in outage) and "processing resumed" in log, log[-3000:]
