"""G15 failover (Sentinel, and a plain URL on a demoted master), G17
restart, and confirmed enqueue, against real servers: a master, a replica
and three sentinels (``tests.topology``), or servers of the test's own.

The Sentinel tests print what they measured (confirmed enqueues, the ones a
failover lost among those the master took but no replica confirmed, second
runs, how long until jobs ran again); docs/deployment.md quotes them.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from django_cogworker import connection, errors
from django_cogworker.connection import get_keys, get_redis
from testproject.testapp import jobs
from tests.conftest import CogEnv, Worker, client_for, wait_for
from tests.test_guarantees import leftovers, runs
from tests.topology import SentinelGroup, sentinel_group  # noqa: F401


class Producer:
    """Enqueues ``jobs.pace`` in a thread until stopped; sorts what happened
    to each enqueue: confirmed by a replica, pushed on the master but not
    confirmed (EnqueueNotReplicated), or refused (RedisUnavailable)."""

    def __init__(self, seconds: float = 0.01, queue: str | None = None) -> None:
        self.seconds = seconds
        self.job = jobs.pace if queue is None else jobs.pace.set(queue=queue)
        self.confirmed: list[str] = []
        self.unconfirmed: list[str] = []
        self.refused = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                jid = self.job.delay(self.seconds, i)
                self.confirmed.append(str(jid))
            except errors.EnqueueNotReplicated as exc:
                self.unconfirmed += exc.jids
            except errors.RedisUnavailable:
                self.refused += 1
                time.sleep(0.02)
            time.sleep(0.005)

    def __enter__(self) -> Producer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(30)


def beating_workers(cog: CogEnv, count: int = 2) -> list[Worker]:
    """``count`` workers started, each registered by its first beat."""
    workers = [cog.start_worker() for _ in range(count)]
    for worker in workers:
        worker.identity()
    return workers


def assert_only_outages(logs: str) -> None:
    """A failover is an outage in the workers' logs: no error of ours, no
    queue taken for broken (a job's own write may fail; it is retried)."""
    assert "fetch failed" not in logs and "heartbeat failed" not in logs and "cannot be read" not in logs


def first_run_after(cog: CogEnv, moment: float) -> float:
    """Seconds from ``moment`` (epoch) to the first job that finished after it."""
    times = sorted(n["at"] for n in cog.notes() if n["at"] > moment)
    return times[0] - moment if times else float("inf")


@pytest.fixture
def on_sentinel(cog: CogEnv, sentinel_group: SentinelGroup) -> SentinelGroup:  # noqa: F811
    """Points the test at the Sentinel group (healed first: a test before may have killed a node)."""
    sentinel_group.heal()
    connection.close(cog.redis)
    cog.url = sentinel_group.url()
    cog.redis = client_for(cog.url)
    cog.configure(REDIS_URL=cog.url)
    return sentinel_group


def test_g15_a_sentinel_url_finds_the_master(cog: CogEnv, on_sentinel: SentinelGroup) -> None:
    client = get_redis()
    assert isinstance(client.connection_pool, redis.sentinel.SentinelConnectionPool)
    jid = jobs.record.delay("through sentinel")
    with on_sentinel.master_client() as master:
        assert master.llen(get_keys().queue("default")) == 1
    worker = cog.start_worker()
    wait_for(lambda: [n["jid"] for n in cog.notes()] == [jid], 20, "the job to run")
    assert worker.alive()


def test_g15_planned_failover_then_sigkill_of_the_new_master_loses_no_confirmed_job(
    cog: CogEnv, on_sentinel: SentinelGroup
) -> None:
    """A producer and two workers; SENTINEL FAILOVER mid-run, then SIGKILL
    of the new master. With ENQUEUE_WAIT_REPLICAS=1 every confirmed enqueue
    runs, the same processes keep working, nothing is left, and no process
    is taken for dead (the thresholds are short next to the failover)."""
    cog.configure(ENQUEUE_WAIT_REPLICAS=1, ENQUEUE_WAIT_TIMEOUT=0.5, HEARTBEAT_TTL=2, ORPHAN_THRESHOLD=6)
    workers = beating_workers(cog)
    with Producer() as producer:
        wait_for(lambda: len(runs(cog)) >= 40, 20, "the run to get going")
        planned_at = time.time()
        _, _, planned_s = on_sentinel.failover(demote=False)  # the old master takes writes ~10 s more
        wait_for(
            lambda: len([n for n in cog.notes() if n["at"] > planned_at + planned_s]) >= 20, 30, "work after"
        )
        killed_at = time.time()
        _, _, killed_s = on_sentinel.kill_master()
        wait_for(
            lambda: len([n for n in cog.notes() if n["at"] > killed_at + killed_s]) >= 20, 30, "work after"
        )
    wait_for(lambda: set(producer.confirmed) <= set(runs(cog)), 60, "every confirmed job to run")
    wait_for(lambda: leftovers(cog) == {}, 30, "nothing left")
    assert all(w.alive() for w in workers), "the workers rode out both failovers"
    logs = "".join(w.log() for w in workers)
    assert not re.search(r"requeued [1-9]", logs), "no process was taken for dead"
    assert_only_outages(logs)
    ran = runs(cog)
    lost_unconfirmed = [j for j in producer.unconfirmed if j not in ran]
    print(
        f"\n[failover] planned: promoted in {planned_s:.1f}s, jobs ran again "
        f"{first_run_after(cog, planned_at + planned_s):.1f}s after; SIGKILL: promoted in {killed_s:.1f}s, "
        f"jobs ran again {first_run_after(cog, killed_at + killed_s):.1f}s after. {len(producer.confirmed)} "
        f"confirmed enqueues, 0 lost; {len(producer.unconfirmed)} pushed but not confirmed, of which "
        f"{len(lost_unconfirmed)} lost; {producer.refused} refused (no master); "
        f"{sum(n - 1 for n in ran.values())} second runs"
    )


def test_g15_a_worker_silent_through_the_failover_keeps_its_jobs(
    cog: CogEnv, on_sentinel: SentinelGroup
) -> None:
    """SIGSTOP a worker holding jobs, fail over, SIGCONT it within
    ORPHAN_THRESHOLD: the other worker never takes its jobs; each runs once."""
    cog.configure(HEARTBEAT_TTL=3, ORPHAN_THRESHOLD=30, CONCURRENCY=2)
    silent = cog.start_worker()
    identity = silent.identity()
    jids = [str(j) for j in jobs.pace.delay_many([((6.0, i), {}) for i in range(2)])]
    k = get_keys()
    # Both jobs on the silent worker's list, on the replica too, and the
    # worker stopped while they run (6 s each: stopped at once, whatever the
    # machine's load). The other worker starts after, or it could take one
    # of them first.
    wait_for(lambda: cog.redis.llen(k.inprogress(identity)) == 2, 10, "the silent worker to hold both jobs")
    with on_sentinel.replica_client() as replica:
        wait_for(lambda: replica.llen(k.inprogress(identity)) == 2, 10, "its list to reach the replica")
    silent.signal(signal.SIGSTOP)
    try:
        assert not set(jids) & set(runs(cog)), "the jobs ended before the stop: nothing was tested"
        other = cog.start_worker(CONCURRENCY=2)
        other.identity()
        on_sentinel.failover()
        more = wait_for(
            lambda: _retrying(lambda: jobs.pace.delay_many([((0.05, 100 + i), {}) for i in range(10)])),
            10,
            "an enqueue on the new master",
        )
        wait_for(lambda: set(more) <= set(runs(cog)), 20, "the other worker to work on the new master")
    finally:
        silent.signal(signal.SIGCONT)
    wait_for(lambda: set(jids) <= set(runs(cog)), 30, "the silent worker's jobs to finish")
    wait_for(lambda: leftovers(cog) == {}, 20, "nothing left")
    ran = runs(cog)
    assert [ran[j] for j in jids] == [1, 1], "no second run of a silent owner's jobs"
    assert silent.alive() and other.alive()


def test_g15_a_django_redis_sentinel_cache_alias_follows_the_failover(
    cog: CogEnv, on_sentinel: SentinelGroup, settings: Any
) -> None:
    settings.DJANGO_REDIS_CONNECTION_FACTORY = "django_redis.pool.SentinelConnectionFactory"
    settings.CACHES = {
        **settings.CACHES,
        "jobs": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{on_sentinel.service}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "SENTINELS": on_sentinel.sentinels,
            },
        },
    }
    cog.configure(CACHE_ALIAS="jobs")
    connection.reset()
    assert isinstance(get_redis().connection_pool, redis.sentinel.SentinelConnectionPool)
    first = jobs.record.delay("before")
    on_sentinel.failover()
    second = wait_for(
        lambda: _retrying(lambda: jobs.record.delay("after")), 15, "an enqueue on the new master"
    )
    with on_sentinel.master_client() as master:
        queued = master.lrange(get_keys().queue("default"), 0, -1)
    assert {first, second} <= {j for j in (_jid(r) for r in queued)}


def _retrying(enqueue: Callable[[], Any]) -> Any:
    """What ``enqueue`` returns, or None when it met the failover (a client
    on the old master meets one error, then follows the new one)."""
    try:
        return enqueue()
    except errors.RedisUnavailable:
        return None


def _jid(raw: bytes) -> str:
    import json

    return str(json.loads(raw)["jid"])


def test_g15_enqueues_are_confirmed_by_the_replica(cog: CogEnv, on_sentinel: SentinelGroup) -> None:
    cog.configure(ENQUEUE_WAIT_REPLICAS=1)
    from testproject.testapp import tasks

    jids = [jobs.record.delay("one"), *jobs.record.delay_many([(("many",), {})] * 5)]
    result = tasks.add.enqueue(1, 2)  # a MULTI, then its own write and WAIT
    with on_sentinel.replica_client() as replica:
        assert replica.llen(get_keys().queue("default")) == 7, "confirmed: already on the replica"
        assert replica.exists(get_keys().result(result.id)), "the task's result record too"
    cog.configure(ENQUEUE_WAIT_REPLICAS=2)  # there is one replica
    with pytest.raises(errors.EnqueueNotReplicated, match=r"[01] of the 2") as raised:
        jobs.record.delay("two replicas asked")
    assert raised.value.jids and raised.value.jids[0] not in jids
    with on_sentinel.master_client() as master:
        assert master.llen(get_keys().queue("default")) == 8, "pushed on the master all the same"


@pytest.mark.parametrize(
    ("reply", "outage"),
    [
        ("READONLY You can't write against a read only replica.", True),
        ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to no", True),
        ("NOREPLICAS Not enough good replicas to write.", True),
        ("CLUSTERDOWN The cluster is down", True),
        ("TRYAGAIN Multiple keys request during rehashing of slot", True),
        ("MOVED 3999 127.0.0.1:6381", True),
        ("ASK 3999 127.0.0.1:6381", True),
        ("LOADING Redis is loading the dataset in memory", True),
        (
            "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)",
            True,
        ),
        # From inside a script, Redis 6.2 puts the code after the script's line.
        (
            "ERR Error running script (call to f_1): @user_script:10: @user_script: 10: -READONLY You can't",
            True,
        ),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", False),
        ("OOM command not allowed when used memory > 'maxmemory'.", False),
        ("NOSCRIPT No matching script. Please use EVAL.", False),
        ("ERR unknown command 'BLMOVE'", False),
    ],
)
def test_replies_of_a_failover_are_outages_and_others_are_errors(reply: str, outage: bool) -> None:
    """Each reply as redis-py's own parser turns it into an exception: a
    failover's are outages (retried, logged once, RedisUnavailable at
    .delay()); a refusal of the command is not."""
    from redis._parsers.base import BaseParser

    exc = BaseParser.parse_error(reply)
    assert errors.is_unavailable(exc) is outage
    assert isinstance(errors.translate(exc, "enqueue"), errors.RedisUnavailable) is outage


def test_a_cluster_that_cannot_be_reached_is_an_outage_and_a_command_it_cannot_route_is_not() -> None:
    unreachable = redis.exceptions.RedisClusterException(
        "Redis Cluster cannot be connected. Please provide ..."
    )
    assert errors.is_unavailable(unreachable)
    assert errors.is_unavailable(redis.exceptions.SlotNotCoveredError("slot 12 is not covered"))
    assert errors.is_unavailable(redis.sentinel.MasterNotFoundError("No master found for 'mymaster'"))
    misuse = redis.exceptions.RedisClusterException(
        "No way to dispatch this command to Redis Cluster. Missing key."
    )
    assert not errors.is_unavailable(misuse)


def test_g15_async_enqueues_through_sentinel_are_confirmed(cog: CogEnv, on_sentinel: SentinelGroup) -> None:
    """The Tasks backend's aenqueue: a redis.asyncio Sentinel client, its
    MULTI, then the write and WAIT of confirmed enqueue."""
    import asyncio

    from testproject.testapp import tasks

    cog.configure(ENQUEUE_WAIT_REPLICAS=1)
    result = asyncio.run(tasks.async_add.aenqueue(20, 22))
    with on_sentinel.replica_client() as replica:
        assert replica.exists(get_keys().result(result.id)) and replica.llen(get_keys().queue("default")) == 1
    cog.start_worker()
    wait_for(lambda: [n["jid"] for n in cog.notes()] == [result.id], 20, "the async task to run")


# -- a plain URL on a demoted master ---------------------------------------------------------------


def test_g15_a_plain_url_on_a_demoted_master_is_an_outage_not_a_broken_queue(
    cog: CogEnv, own_redis: Any
) -> None:
    """The server behind a plain URL becomes a replica (READONLY on every
    write): the worker logs one outage without a traceback, never "a queue
    that cannot be read", fails no job, and resumes when it is a master again."""
    other = own_redis()
    own_redis()
    cog.configure(QUEUES=["default", "mail"])  # the fetch script, not BLMOVE
    worker = cog.start_worker()
    worker.identity()
    jobs.record.delay("before")
    wait_for(lambda: len(cog.notes()) == 1, 15, "the first job")
    connections_before = int(cog.redis.info("stats")["total_connections_received"])
    cog.redis.replicaof("127.0.0.1", other.port)
    wait_for(lambda: "has no master" in worker.log(), 15, "the outage to be logged")
    time.sleep(1.0)  # a second of READONLY replies
    cog.redis.replicaof("NO", "ONE")
    cog.redis.delete(cog.key("test:runs"))  # the sync from the other server emptied it anyway
    jid = jobs.record.delay("after")
    wait_for(lambda: [n["jid"] for n in cog.notes()] == [jid], 20, "work to resume")
    log = worker.log()
    assert log.count("has no master") == 1, log
    # The worker dropped its pool on READONLY (a new address may be behind
    # the URL after a failover): it connects again, each thread at its next
    # call (the one that ran the job may be the only one so far).
    wait_for(
        lambda: int(cog.redis.info("stats")["total_connections_received"]) > connections_before + 1,
        10,
        "the worker's threads to connect again",
    )
    assert "Traceback" not in log and "cannot be read" not in log and "failed" not in log.lower(), log
    assert worker.alive()


def test_g15_a_delay_that_meets_a_demoted_master_connects_again_for_the_next(
    cog: CogEnv, own_redis: Any
) -> None:
    """.delay() on a plain URL whose server became a replica raises
    RedisUnavailable and drops this process's pooled connections (the
    client's and .delay()'s own): the next .delay() connects again, so that
    it reaches a new master behind the same address instead of the replica."""
    other = own_redis()
    own_redis()
    jobs.record.delay("before")
    cog.redis.replicaof("127.0.0.1", other.port)
    wait_for(lambda: cog.redis.info("replication")["master_link_status"] == "up", 15, "the replica link")
    with pytest.raises(errors.RedisUnavailable, match="read only replica"):
        jobs.record.delay("refused")
    cog.redis.replicaof("NO", "ONE")
    before = int(cog.redis.info("stats")["total_connections_received"])
    jobs.record.delay("after")
    assert int(cog.redis.info("stats")["total_connections_received"]) > before


def test_g15_min_replicas_to_write_refusing_writes_is_an_outage_and_redis_unavailable(
    cog: CogEnv, own_redis: Any
) -> None:
    """A master set to refuse writes without a replica (min-replicas-to-write)
    answers NOREPLICAS: .delay() raises RedisUnavailable, the worker logs one
    outage and fails no job, and resumes when writes are taken again."""
    own_redis(extra=["--min-replicas-to-write", "1"])
    with pytest.raises(errors.RedisUnavailable, match=r"NOREPLICAS|enough good replicas"):
        jobs.record.delay("refused")
    cog.configure(QUEUES=["default", "mail"])
    cog.redis.config_set("min-replicas-to-write", 0)
    worker = cog.start_worker()
    worker.identity()
    cog.redis.config_set("min-replicas-to-write", 1)
    wait_for(lambda: "has no master" in worker.log(), 15, "the outage to be logged")
    cog.redis.config_set("min-replicas-to-write", 0)
    jid = jobs.record.delay("after")
    wait_for(lambda: [n["jid"] for n in cog.notes()] == [jid], 20, "work to resume")
    wait_for(lambda: "processing resumed" in worker.log(), 10, "the end of the outage to be logged")
    log = worker.log()
    assert log.count("has no master") == 1, log
    assert "cannot be read" not in log and "fetch failed" not in log, log


def test_the_worker_start_line_names_redis_without_its_password(cog: CogEnv, own_redis: Any) -> None:
    server = own_redis()
    cog.redis.config_set("requirepass", "s3cret-pw")
    url = f"redis://:s3cret-pw@127.0.0.1:{server.port}/0"
    worker = cog.start_worker(REDIS_URL=url, env={"COGWORKER_REDIS_URL": url})
    wait_for(lambda: "starting:" in worker.log(), 20, "the start line")
    line = next(ln for ln in worker.log().splitlines() if "starting:" in ln)
    assert f"redis redis://:***@127.0.0.1:{server.port}/0" in line, line
    assert "s3cret-pw" not in worker.log()


# -- G17 restart ---------------------------------------------------------------------------------


def test_g17_redis_shut_down_and_restarted_under_load_loses_nothing(cog: CogEnv, own_redis: Any) -> None:
    """SHUTDOWN (SIGTERM: AOF flushed) while a producer enqueues and two
    workers run; restarted a second later. Every enqueue that .delay()
    acknowledged runs; the workers resume on their own, logging the outage
    once each."""
    server = own_redis(appendonly=True)
    workers = beating_workers(cog)
    with Producer(0.02) as producer:
        wait_for(lambda: len(runs(cog)) >= 40, 20, "the run to get going")
        server.stop(signal.SIGTERM)
        down_at = time.time()
        time.sleep(1.0)
        server.start()
        wait_for(lambda: first_run_after(cog, down_at) < 60, 20, "jobs to run after the restart")
        resumed_s = first_run_after(cog, down_at)
        wait_for(lambda: len(runs(cog)) >= len(producer.confirmed) // 2 + 40, 30, "more work after")
    wait_for(lambda: set(producer.confirmed) <= set(runs(cog)), 60, "every acknowledged job to run")
    wait_for(lambda: leftovers(cog) == {}, 30, "nothing left")
    assert all(w.alive() for w in workers)
    for w in workers:
        log = w.log()
        # Once per outage (the jobs' own writes, and the test's error
        # handler, fail meanwhile: those are the jobs' failures, retried).
        assert 1 <= log.count("Redis unreachable") <= 2, log
    print(
        f"\n[restart] {len(producer.confirmed)} acknowledged enqueues all ran; "
        f"{producer.refused} refused while down; jobs ran again {resumed_s:.1f}s after the shutdown; "
        f"{sum(n - 1 for n in runs(cog).values())} second runs"
    )


# -- confirmed enqueue (ENQUEUE_WAIT_REPLICAS) --------------------------------------------------


def wait_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def test_confirmed_enqueue_with_no_replica_raises_enqueue_not_replicated_and_keeps_the_job(
    cog: CogEnv, own_redis: Any
) -> None:
    """A server with no replica: every kind of enqueue waits, then raises
    EnqueueNotReplicated naming its jobs, which are pushed all the same
    (a unique job keeps its lock: it is queued)."""
    own_redis()
    cog.configure(ENQUEUE_WAIT_REPLICAS=1, ENQUEUE_WAIT_TIMEOUT=0.05)
    k = get_keys()
    with pytest.raises(errors.EnqueueNotReplicated, match=r"0 of the 1 replica\(s\).*within 0.05s") as one:
        jobs.record.delay("one")
    assert len(one.value.jids) == 1 and wait_calls(cog.redis) == 1
    unique = jobs.record.set(unique_for=60)
    with pytest.raises(errors.EnqueueNotReplicated):
        unique.delay("unique")
    assert [key for key in cog.redis.scan_iter(match=k.unique_prefix + "*")], (
        "the unique lock stays with its job"
    )
    assert unique.delay("unique") is None, "and refuses a duplicate"
    # delay_many: one WAIT per pipeline (chunk), every chunk pushed, one error naming all.
    before = wait_calls(cog.redis)
    with pytest.raises(errors.EnqueueNotReplicated, match="2500 of 2500 jobs") as many:
        jobs.record.delay_many([((i,), {}) for i in range(2500)])
    assert len(many.value.jids) == 2500 and wait_calls(cog.redis) - before == 3
    assert cog.redis.llen(k.queue("default")) == 2 + 2500
    # With ENQUEUE_WAIT_REPLICAS = 0 nothing waits.
    cog.configure(ENQUEUE_WAIT_REPLICAS=0)
    before = wait_calls(cog.redis)
    jobs.record.delay("unconfirmed by choice")
    assert wait_calls(cog.redis) == before


def test_confirmed_enqueue_of_the_tasks_backend_and_the_periodic_ticker(cog: CogEnv, own_redis: Any) -> None:
    """The Tasks backend (its MULTI with the result record, sync and async)
    and a periodic slot confirm with a write of their own then WAIT."""
    import asyncio

    from django_cogworker.periodic.enqueue import ALREADY, enqueue_slot
    from django_cogworker.periodic.entry import Entry
    from testproject.testapp import tasks

    own_redis()
    cog.configure(ENQUEUE_WAIT_REPLICAS=1, ENQUEUE_WAIT_TIMEOUT=0.05)
    k = get_keys()
    with pytest.raises(errors.EnqueueNotReplicated):
        tasks.add.enqueue(1, 2)
    with pytest.raises(errors.EnqueueNotReplicated):
        asyncio.run(tasks.async_add.aenqueue(3, 4))
    assert cog.redis.llen(k.queue("default")) == 2
    assert len(list(cog.redis.scan_iter(match=k.results_prefix + "*"))) == 2, "result records written"
    entry = Entry("* * * * *", "testproject.testapp.jobs.record", ("tick",))
    slot = time.time() // 60 * 60
    with pytest.raises(errors.EnqueueNotReplicated):
        enqueue_slot(get_redis(), k, entry, slot, slot + 1)
    assert enqueue_slot(get_redis(), k, entry, slot, slot + 1) == ALREADY, "the slot is not pushed twice"
    assert cog.redis.llen(k.queue("default")) == 3
    assert int(cog.redis.get(k.replicated) or 0) == 3 and wait_calls(cog.redis) == 3
