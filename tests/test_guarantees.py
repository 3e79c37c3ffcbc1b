"""The worker's guarantees (SPEC section 5, G1-G14), against a real Redis
server and real worker processes.

Faults are real and deterministic: SIGKILL, SIGSTOP and SIGTERM sent to
real ``manage.py cogworker`` processes; keys of the wrong type; a
redis-server of our own started with ``rename-command``, restarted from its
AOF, or with its script cache flushed; one call patched to raise, in a
worker run inside the test process (G6). Every wait is bounded.

Intervals come from ``FAST`` in conftest: heartbeat 0.2 s, presence TTL
1 s, ORPHAN_THRESHOLD 2 s, orphan check every 0.5 s.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.db import connection, connections

from django_cogworker import execution
from django_cogworker import runs as job_runs
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.fetch import ReliableFetch
from django_cogworker.heartbeat import Heartbeat
from django_cogworker.keys import Keys
from django_cogworker.launcher import Launcher
from django_cogworker.manager import INTERRUPT_DELAY_S, MAX_INTERRUPTS, Manager
from django_cogworker.payload import encode
from django_cogworker.process import open_process
from django_cogworker.recovery import ORPHANINGS_TTL_S
from django_cogworker.requeue import requeue_list
from django_cogworker.scripts import script
from testproject.testapp import jobs
from tests.conftest import CogEnv, kill, wait_for
from tests.test_multi_queue_wait import watch

RECORD = "testproject.testapp.jobs.record"


# -- helpers ----------------------------------------------------------------------


def keys() -> Keys:
    return get_keys()


def raw_job(job: Any, *args: Any, **kwargs: Any) -> bytes:
    """A payload as ``.delay()`` would push it."""
    return encode(job.payload(args, kwargs))


def jid_of(raw: bytes) -> str:
    return str(json.loads(raw)["jid"])


def runs(cog: CogEnv, kind: str = "runs") -> Counter[str]:
    return Counter(note["jid"] for note in cog.notes(kind))


def tags(cog: CogEnv, kind: str = "runs") -> list[Any]:
    return [note["tag"] for note in cog.notes(kind)]


def redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def plant_dead_identity(cog: CogEnv, identity: str, raws: list[bytes], *, beat_age_s: float = 60.0) -> None:
    """The traces a SIGKILLed process leaves: its in-progress list (``raws``
    in fetch order: each fetch pushes onto the left), its registration, a
    last beat ``beat_age_s`` ago, and no presence key."""
    k = keys()
    if raws:
        cog.redis.lpush(k.inprogress(identity), *raws)
    cog.redis.sadd(k.inprogress_identities, identity)
    cog.redis.hset(k.last_beat, identity, repr(redis_now(cog.redis) - beat_age_s))


def where_jobs_are(cog: CogEnv) -> tuple[dict[str, list[str]], Counter[str]]:
    """One atomic look (MULTI/EXEC) at every place a job can be, and at the
    runs recorded so far: {jid: [places]}, Counter of finished runs."""
    r, k = cog.redis, keys()
    patterns = [f"{k.queue_prefix}*", f"{k.inprogress_prefix}*"]
    if isinstance(r, redis.RedisCluster):
        # Every place of a job is in one slot (the namespace's, or under
        # SHARDING the group's): one MULTI on the master of that slot, its
        # KEYS included, as on one server. A SCAN before a snapshot and
        # another after it would miss a list made and emptied in between.
        r = r.get_redis_connection(r.get_node_from_key(k.schedule))
    for _attempt in range(50):
        lists = sorted({key for pattern in patterns for key in r.scan_iter(match=pattern, count=1000)})
        pipe = r.pipeline(transaction=True)
        for pattern in patterns:
            pipe.keys(pattern)
        for key in lists:
            pipe.lrange(key, 0, -1)
        for zset in (k.schedule, k.retry, k.dead):
            pipe.zrange(zset, 0, -1)
        pipe.lrange(k.repeat_orphans, 0, -1)
        pipe.lrange(k.unsettled, 0, -1)
        # Under SHARDING the notes may be in another slot than the group's
        # keys: read just after. Still sound: a job notes its run before its
        # ack takes it off its list, so a job in no place had noted its run.
        apart = k.sharded
        if not apart:
            pipe.lrange(cog.key("test:runs"), 0, -1)
        reply = pipe.execute()
        if apart:
            reply.append(cog.redis.lrange(cog.key("test:runs"), 0, -1))
        if not set(reply[0]) | set(reply[1]) <= set(lists):
            continue  # a list appeared between the scan and the snapshot: look again
        places: dict[str, list[str]] = {}
        contents = reply[2:]
        named = [key.decode() for key in lists] + ["schedule", "retry", "dead", "repeat_orphans"]
        for name, entries in zip(named, contents, strict=False):
            for entry in entries:
                places.setdefault(jid_of(entry), []).append(name)
        for record in contents[-2]:
            places.setdefault(jid_of(json.loads(record)["payload"]), []).append("unsettled")
        finished = Counter(json.loads(note)["jid"] for note in contents[-1])
        return places, finished
    raise AssertionError("the set of lists kept changing: no consistent snapshot")


def assert_each_in_one_place(cog: CogEnv, jids: list[str]) -> None:
    """G1: every job is in exactly one place, or it has finished."""
    places, finished = where_jobs_are(cog)
    for jid in jids:
        where = places.get(jid, [])
        assert len(where) <= 1, f"jid {jid} is in several places at once: {where}"
        assert where or finished[jid], f"jid {jid} is nowhere and never finished: lost"


def leftovers(cog: CogEnv) -> dict[str, int]:
    """Everything still held somewhere in the namespace (should be empty at
    the end of a run)."""
    r, k = cog.redis, keys()
    held = {key.decode(): int(r.llen(key)) for key in r.scan_iter(match=f"{k.queue_prefix}*")}
    held.update({key.decode(): int(r.llen(key)) for key in r.scan_iter(match=f"{k.inprogress_prefix}*")})
    held.update(
        retry=int(r.zcard(k.retry)),
        schedule=int(r.zcard(k.schedule)),
        dead=int(r.zcard(k.dead)),
        unsettled=int(r.llen(k.unsettled)),
        repeat_orphans=int(r.llen(k.repeat_orphans)),
    )
    return {name: n for name, n in held.items() if n}


def assert_deregistered(cog: CogEnv, identity: str) -> None:
    r, k = cog.redis, keys()
    assert not r.sismember(k.processes, identity)
    assert not r.sismember(k.inprogress_identities, identity)
    assert not r.exists(k.process(identity), k.workers(identity), k.inprogress(identity))
    assert r.hget(k.last_beat, identity) is None


def run_requeue(
    cog: CogEnv,
    identity: str,
    *,
    threshold_s: float | None,
    caller_now: float | None = None,
    client: redis.Redis | None = None,
    max_orphanings: int = 3,
    marks: tuple[bytes, ...] = (),
) -> list[Any]:
    """requeue.lua run as Recovery runs it (requeue.py), without the stall
    check: these tests plant beats by hand. ``marks``: b"d:<job>" (finished)
    or b"k:<job>" (kept)."""
    config = dataclasses.replace(get_config(), max_orphanings=max_orphanings)
    moved, buried = requeue_list(
        client or cog.redis,
        keys(),
        config,
        identity,
        if_dead_for_s=threshold_s,
        finished=[m[2:] for m in marks if m.startswith(b"d:")],
        keep=[m[2:] for m in marks if m.startswith(b"k:")],
        now=caller_now,
    )
    return [moved, *buried]


def fail_acking_fetch(
    monkeypatch: pytest.MonkeyPatch, times: int | None, *, reply_lost: bool = False
) -> list[str]:
    """Makes the fetch that carries a finished job's ack fail with a
    connection error, ``times`` times (None: always): before reaching Redis,
    or (``reply_lost``) after Redis ran it, the reply lost on the way back."""
    original = ReliableFetch.fetch
    calls: list[str] = []

    def fetch(self: ReliableFetch, queues: list[str], slots: Any) -> Any:
        if not self.acks or (times is not None and calls.count("fail") >= times):
            return original(self, queues, slots)
        calls.append("fail")
        if reply_lost:
            original(self, queues, slots)
        else:
            self.acks.take()  # taken for the call: they stay pending in the manager's memory
        raise redis.ConnectionError("injected failure of the fetch that acknowledges")

    monkeypatch.setattr(ReliableFetch, "fetch", fetch)
    return calls


def fail_calls(monkeypatch: pytest.MonkeyPatch, cls: type, name: str, times: int | None) -> list[str]:
    """Makes ``cls.name`` raise a connection error on its first ``times``
    calls (None: always); returns a log of the calls ("fail"/"ok")."""
    original = getattr(cls, name)
    calls: list[str] = []

    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        if times is None or calls.count("fail") < times:
            calls.append("fail")
            raise redis.ConnectionError(f"injected failure of {name}")
        calls.append("ok")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, patched)
    return calls


# -- G1 at least once --------------------------------------------------------------


def test_g1_jobs_of_a_sigkilled_worker_all_run_and_each_job_is_always_in_one_place(cog):
    victim = cog.start_worker("-c", "4")
    held = [jobs.block_first_run.delay(30, f"held-{i}") for i in range(4)]
    wait_for(lambda: len(cog.notes("started")) == 4, 20, "the victim to start the 4 held jobs")
    victim_identity = victim.identity()
    assert {n["pid"] for n in cog.notes("started")} == {victim.pid}
    samples = 0

    def sample() -> None:
        nonlocal samples
        assert_each_in_one_place(cog, held + quick)
        samples += 1

    quick: list[str] = []
    sample()
    rescuer = cog.start_worker("-c", "2")
    rescuer_identity = rescuer.identity()
    quick = [str(jobs.record.delay(f"quick-{i}")) for i in range(20)]
    sample()
    assert cog.redis.llen(keys().inprogress(victim_identity)) == 4
    kill(victim)
    sample()

    def all_done() -> bool:
        sample()
        return set(runs(cog)) >= set(held + quick)

    wait_for(all_done, 20, "every job, the victim's included, to run")
    time.sleep(0.5)
    sample()
    assert samples >= 5
    # A job's ack follows its note (a quick job's rides its thread's next
    # fetch): on a loaded machine, maybe later than the half second above.
    rescuer_list = keys().inprogress(rescuer_identity)
    wait_for(lambda: not cog.redis.exists(rescuer_list), 10, "the rescuer's last acks")
    done = runs(cog)
    assert all(done[jid] == 1 for jid in held + quick), done
    # The held jobs were run again by the rescuer, after the recovery.
    assert {n["pid"] for n in cog.notes() if n["jid"] in held} == {rescuer.pid}
    assert leftovers(cog) == {}
    wait_for(lambda: not cog.redis.sismember(keys().inprogress_identities, victim_identity), 5, "forgetting")
    assert cog.redis.hget(keys().last_beat, victim_identity) is None


# -- G2 no second run while the owner lives ---------------------------------------


def test_g2_live_but_silent_owner_keeps_its_jobs(cog):
    """SIGSTOP past HEARTBEAT_TTL (its presence key expires) but short of
    ORPHAN_THRESHOLD since its last beat: the other worker looks, and leaves
    the job alone; after SIGCONT it runs exactly once, on its owner."""
    # The steps below, from the stop to the check that the hold is still
    # short of the threshold, take about 2.5 s; a threshold well past that
    # leaves room for a loaded machine (at 4 s, only about a second).
    threshold_s = 8.0
    cog.configure(ORPHAN_THRESHOLD=threshold_s)
    # The rescuer works on another queue: it can only get the job by recovering it.
    rescuer = cog.start_worker("-c", "1", "-q", "mail")
    rescuer_identity = rescuer.identity()
    owner = cog.start_worker("-c", "1")
    owner_identity = owner.identity()
    jid = jobs.sleep_then_record.delay(1.5, "silent")
    wait_for(lambda: cog.notes("started"), 20, "the owner to start the job")
    owner.signal(signal.SIGSTOP)
    try:
        stopped_at = time.time()
        last_beat = float(cog.redis.hget(keys().last_beat, owner_identity))
        wait_for(
            lambda: not cog.redis.exists(keys().process(owner_identity)), 5, "the presence key to expire"
        )
        presence_gone_at = time.time()

        def looked_after_presence_gone() -> bool:
            report = json.loads(cog.redis.get(keys().recovery_report) or b"{}")
            return (
                report.get("identity") == rescuer_identity
                and report.get("at", 0) > presence_gone_at
                and report.get("checked", 0) >= 1
            )

        wait_for(looked_after_presence_gone, 5, "the rescuer to look for orphans without a presence key")
        wait_for(lambda: time.time() - stopped_at > 2.5, 5, "a hold past the presence TTL")
        held_s = redis_now(cog.redis) - last_beat
        assert held_s < threshold_s - 0.5, f"held {held_s:.1f}s, too long: the test would prove nothing"
        assert cog.redis.llen(keys().inprogress(owner_identity)) == 1
        assert cog.redis.llen(keys().queue("default")) == 0
        assert not cog.redis.exists(keys().orphanings(jid))
    finally:
        owner.signal(signal.SIGCONT)
    wait_for(lambda: runs(cog)[jid] == 1, 10, "the owner to finish its job")
    time.sleep(1.0)
    assert runs(cog) == Counter({jid: 1})
    assert len(cog.notes("started")) == 1
    assert {n["pid"] for n in cog.notes()} == {owner.pid}
    assert cog.redis.llen(keys().inprogress(owner_identity)) == 0
    assert owner.alive()


def test_g2_owner_silent_past_the_threshold_loses_its_job_to_another_worker(cog):
    owner = cog.start_worker("-c", "1")
    owner_identity = owner.identity()
    jid = jobs.block_first_run.delay(30, "stalled")
    wait_for(lambda: cog.notes("started"), 20, "the owner to start the job")
    owner.signal(signal.SIGSTOP)
    try:
        last_beat = float(cog.redis.hget(keys().last_beat, owner_identity))
        rescuer = cog.start_worker("-c", "1")
        wait_for(lambda: runs(cog)[jid], 15, "the rescuer to recover and run the job")
        recovered_run = cog.notes()[0]
        assert recovered_run["pid"] == rescuer.pid
        # Not before ORPHAN_THRESHOLD (2 s) since the owner's last beat.
        assert recovered_run["at"] - last_beat >= 2.0
        assert cog.redis.llen(keys().inprogress(owner_identity)) == 0
    finally:
        kill(owner)


def test_g2_requeue_script_decides_on_presence_and_last_beat_atomically(cog):
    r, k = cog.redis, keys()
    ident = "host:1:g2"
    job = raw_job(jobs.record, "g2")
    plant_dead_identity(cog, ident, [job], beat_age_s=0.5)
    r.set(k.process(ident), "alive")

    # Presence key there: refused, whatever the last beat says.
    r.hset(k.last_beat, ident, "0")
    assert run_requeue(cog, ident, threshold_s=2) == [-1]
    # Presence key gone, last beat 0.5 s ago on Redis's clock: refused, even
    # when the caller's own clock is far ahead (Redis's clock decides).
    r.delete(k.process(ident))
    r.hset(k.last_beat, ident, repr(redis_now(r) - 0.5))
    assert run_requeue(cog, ident, threshold_s=2, caller_now=time.time() + 3600) == [-1]
    assert r.lrange(k.inprogress(ident), 0, -1) == [job]
    # Stale: requeued.
    r.hset(k.last_beat, ident, repr(redis_now(r) - 2.5))
    assert run_requeue(cog, ident, threshold_s=2) == [1]
    [requeued] = r.lrange(k.queue("default"), 0, -1)
    assert json.loads(requeued) == {**json.loads(job), "orphaned": 1}
    assert not r.exists(k.inprogress(ident))

    # A stamp that is not a number counts as none: the presence key decides.
    r.delete(k.queue("default"))
    r.lpush(k.inprogress(ident), job)
    r.hset(k.last_beat, ident, "not-a-number")
    r.set(k.process(ident), "alive")
    assert run_requeue(cog, ident, threshold_s=2) == [-1]
    r.delete(k.process(ident))
    assert run_requeue(cog, ident, threshold_s=2) == [1]
    # No stamp at all: the same.
    r.hdel(k.last_beat, ident)
    r.lpush(k.inprogress(ident), raw_job(jobs.record, "g2-b"))
    assert run_requeue(cog, ident, threshold_s=2) == [1]
    assert r.llen(k.queue("default")) == 2


def test_g2_caller_clock_is_used_when_time_is_refused(cog, own_redis):
    """Redis's TIME refused by an ACL: the caller's clock stands in."""
    own_redis()
    r, k = cog.redis, keys()
    r.execute_command("ACL", "SETUSER", "notime", "on", ">pw", "~*", "+@all", "-time")
    ident = "host:2:g2"
    plant_dead_identity(cog, ident, [raw_job(jobs.record, "acl")], beat_age_s=0)
    last = float(r.hget(k.last_beat, ident))
    with redis.Redis.from_url(cog.url, username="notime", password="pw") as limited:
        with pytest.raises(redis.ResponseError):
            limited.time()
        assert run_requeue(cog, ident, threshold_s=2, caller_now=last + 1, client=limited) == [-1]
        assert run_requeue(cog, ident, threshold_s=2, caller_now=last + 3, client=limited) == [1]
    assert r.llen(k.queue("default")) == 1


# -- G3 poison pills ------------------------------------------------------------------


def test_g3_a_job_that_kills_its_process_ends_in_dead_after_max_orphanings_plus_one_runs(cog):
    cog.configure(MAX_ORPHANINGS=2, CONCURRENCY=2)
    pill = jobs.kill_own_process.delay()
    workers = [cog.start_worker(), cog.start_worker()]
    others: list[str] = []
    restarts = 0
    next_batch = 0.0

    def supervise() -> bool:
        """Restarts dead workers (as systemd would), keeps other jobs coming."""
        nonlocal restarts, next_batch
        for index, worker in enumerate(workers):
            if not worker.alive():
                worker.wait(5)
                workers[index] = cog.start_worker()
                restarts += 1
        if len(others) < 40 and time.monotonic() >= next_batch:
            others.extend(str(jobs.record.delay(f"other-{len(others) + i}")) for i in range(2))
            next_batch = time.monotonic() + 0.25
        return bool(cog.redis.zcard(keys().dead))

    wait_for(supervise, 60, "the poison pill to be filed in dead")
    wait_for(lambda: set(runs(cog)) >= set(others), 20, "the other jobs to run")

    assert tags(cog).count("kill") == 2 + 1
    assert restarts >= 2
    [entry] = cog.redis.zrange(keys().dead, 0, -1)
    dead = json.loads(entry)
    assert dead["jid"] == pill
    assert dead["error_class"] == "ProcessDied"
    assert "OOM" in dead["error_message"] and "SIGKILL" in dead["error_message"]

    # Counted, and its orphan counter deleted, by the call after the one
    # that filed it in dead.
    def buried() -> bool:
        counted = int(cog.redis.get(keys().stat_failed) or 0)
        return counted == 1 and not cog.redis.exists(keys().orphanings(pill))

    wait_for(buried, 10, "the burial counted once, its orphan counter gone")
    assert cog.redis.llen(keys().repeat_orphans) == 0
    assert all(runs(cog)[jid] >= 1 for jid in others)


def test_g3_finishing_a_job_clears_its_orphan_counter(cog):
    k = keys()
    job = raw_job(jobs.record, "orphaned-once")
    jid = jid_of(job)
    plant_dead_identity(cog, "host:3:g3", [job])
    cog.redis.sadd(k.paused, "default")
    cog.start_worker()
    wait_for(lambda: cog.redis.llen(k.queue("default")) == 1, 10, "the recovery of the planted job")
    assert cog.redis.get(k.orphanings(jid)) == b"1"
    assert 0 < cog.redis.ttl(k.orphanings(jid)) <= ORPHANINGS_TTL_S
    cog.redis.srem(k.paused, "default")
    wait_for(lambda: runs(cog)[jid], 10, "the recovered job to run")
    wait_for(lambda: not cog.redis.exists(k.orphanings(jid)), 5, "its counter to be cleared")


def test_g3_only_the_recovered_job_a_dead_process_had_started_is_counted_again(cog):
    """Of the recovered jobs on a dead process's list, only the one it
    recorded before starting it (N:suspect:<identity>) may be the pill: the
    others were held beside it, and a pill that kills again and again must
    not take them to dead with it."""
    k = keys()
    ran, held = (raw_job(jobs.record, tag)[:-1] + b',"orphaned":2}' for tag in ("ran", "held"))
    for raw in (ran, held):
        cog.redis.set(k.orphanings(jid_of(raw)), 2)
    ident = "host:4:g3"
    plant_dead_identity(cog, ident, [held, ran])
    cog.redis.set(k.suspect(ident), ran)
    moved = run_requeue(cog, ident, threshold_s=2, max_orphanings=2)
    assert moved[0] == 2
    assert cog.redis.lrange(k.repeat_orphans, 0, -1) == [ran], "the started one is parked (3 > 2)"
    assert cog.redis.get(k.orphanings(jid_of(held))) == b"2", "the held one is not counted"
    [requeued] = cog.redis.lrange(k.queue("default"), 0, -1)
    assert json.loads(requeued)["jid"] == jid_of(held)


# -- G4 order ------------------------------------------------------------------------


def test_g4_recovered_jobs_run_oldest_first_before_jobs_already_queued(cog):
    k = keys()
    victim = cog.start_worker("-c", "3")
    victim_identity = victim.identity()
    held = [jobs.block_first_run.delay(30, f"held-{i}") for i in range(3)]
    wait_for(lambda: len(cog.notes("started")) == 3, 20, "the victim to hold 3 jobs")
    queued = [jobs.record.delay(f"queued-{i}") for i in range(3)]
    assert cog.redis.llen(k.queue("default")) == 3
    cog.redis.sadd(k.paused, "default")
    kill(victim)
    cog.start_worker("-c", "1")
    wait_for(lambda: cog.redis.llen(k.queue("default")) == 6, 15, "the recovery")
    assert not cog.redis.exists(k.inprogress(victim_identity))
    # Popped from the right: the recovered jobs first, oldest first.
    pop_order = [jid_of(raw) for raw in reversed(cog.redis.lrange(k.queue("default"), 0, -1))]
    assert pop_order == held + queued
    cog.redis.srem(k.paused, "default")
    wait_for(lambda: len(cog.notes()) == 6, 15, "all six to run")
    assert [n["jid"] for n in cog.notes()] == held + queued


# -- G5 crash-safe scripts ---------------------------------------------------------------


def test_g5_a_job_whose_queue_key_is_broken_rotates_and_does_not_block_the_others(cog):
    r, k = cog.redis, keys()
    ident = "host:5:g5"
    broken = encode({**jobs.record.payload(("broken",), {}), "queue": "broken"})
    first, second = raw_job(jobs.record, "a"), raw_job(jobs.record, "b")
    r.set(k.queue("broken"), "not a list")
    # The broken job at the head, where the script's pass starts.
    r.rpush(k.inprogress(ident), broken, first, second)
    r.hset(k.last_beat, ident, repr(redis_now(r) - 60))

    assert run_requeue(cog, ident, threshold_s=2) == [2]
    assert r.lrange(k.inprogress(ident), 0, -1) == [broken]
    assert sorted(map(jid_of, r.lrange(k.queue("default"), 0, -1))) == sorted(map(jid_of, [first, second]))
    # Not counted as an orphaning: it never left.
    assert not r.exists(k.orphanings(jid_of(broken)))
    assert r.get(k.queue("broken")) == b"not a list"
    # Repaired: it goes on the next pass. Nothing was lost on the way.
    r.delete(k.queue("broken"))
    assert run_requeue(cog, ident, threshold_s=2) == [1]
    assert list(map(jid_of, r.lrange(k.queue("broken"), 0, -1))) == [jid_of(broken)]
    assert not r.exists(k.inprogress(ident))


def test_g5_recovery_by_a_worker_skips_the_broken_job_and_keeps_it(cog):
    r, k = cog.redis, keys()
    ident = "host:6:g5"
    broken = encode({**jobs.record.payload(("broken",), {}), "queue": "broken"})
    good = [raw_job(jobs.record, f"good-{i}") for i in range(3)]
    r.set(k.queue("broken"), "not a list")
    plant_dead_identity(cog, ident, [good[0], broken, good[1], good[2]])
    cog.start_worker()
    wait_for(lambda: set(runs(cog)) == {jid_of(g) for g in good}, 15, "the good jobs to run")
    assert r.lrange(k.inprogress(ident), 0, -1) == [broken]
    assert r.sismember(k.inprogress_identities, ident)  # still held: not forgotten
    r.delete(k.queue("broken"))
    wait_for(lambda: r.llen(k.queue("broken")) == 1, 10, "the repaired requeue")
    assert jid_of(r.lindex(k.queue("broken"), 0)) == jid_of(broken)
    wait_for(lambda: not r.sismember(k.inprogress_identities, ident), 5, "the identity to be forgotten")


# -- G6 settlement ----------------------------------------------------------------------


def test_g6_a_finished_job_whose_ack_failed_is_acked_later_never_rerun(cog, in_process, monkeypatch):
    fetches = fail_acking_fetch(monkeypatch, times=1)
    acks = fail_calls(monkeypatch, ReliableFetch, "ack", times=0)
    jid = jobs.record.delay("ack-fails-once")
    worker = in_process(concurrency=1)
    wait_for(lambda: runs(cog)[jid], 10, "the job to run")
    inprogress = keys().inprogress(worker.identity)
    wait_for(lambda: not cog.redis.exists(inprogress), 5, "the later ack")
    assert fetches == ["fail"] and acks == ["ok"], "acked by reconcile"
    # The thread forgets the ack just after its reply: on a loaded machine a moment later.
    wait_for(lambda: worker.manager.snapshot()[1] == {}, 5, "the acked job to be forgotten")
    time.sleep(1.0)  # five reconcile passes, two orphan checks
    worker.stop()
    assert runs(cog) == Counter({jid: 1})
    assert leftovers(cog) == {}


def test_g6_an_ack_whose_reply_was_lost_leaves_no_stray_behind(cog, in_process, monkeypatch, worker_log):
    """The fetch carrying the ack ran on the server (ack done, next job
    moved to the in-progress list) but its reply was lost: the job it
    fetched, run by no thread, is a stray and runs once; none runs twice."""
    fetches = fail_acking_fetch(monkeypatch, times=1, reply_lost=True)
    first = jobs.record.delay("first")
    second = jobs.record.delay("second")  # taken by the fetch that acks the first
    worker = in_process(concurrency=1)
    wait_for(lambda: runs(cog)[second], 10, "the second job (a stray first) to run")
    assert fetches == ["fail"]
    # Logged after the requeue, so the job can run before the line is out.
    line = f"requeued stray in-progress job jid={second}"
    wait_for(lambda: line in worker_log.text, 5, "the stray's log line")
    time.sleep(1.0)
    worker.stop()
    assert runs(cog) == Counter({first: 1, second: 1})
    assert leftovers(cog) == {}


def test_g6_a_job_whose_ack_keeps_failing_is_dropped_at_shutdown_not_requeued(cog, in_process, monkeypatch):
    k = keys()
    fail_acking_fetch(monkeypatch, times=None)
    fail_calls(monkeypatch, ReliableFetch, "ack", times=None)
    jid = str(jobs.record.delay("ack-always-fails"))
    cog.redis.set(k.orphanings(jid), 1)  # orphaned once before this run
    worker = in_process(concurrency=1)
    wait_for(lambda: runs(cog)[jid], 10, "the job to run")
    wait_for(lambda: worker.manager.snapshot()[1], 5, "the failed ack to be pending")
    time.sleep(1.0)  # reconcile keeps trying; a pending job is never a stray
    assert cog.redis.llen(k.inprogress(worker.identity)) == 1
    assert cog.redis.llen(k.queue("default")) == 0
    worker.stop()
    assert runs(cog) == Counter({jid: 1})
    assert leftovers(cog) == {}, "dropped (its ack), not requeued"
    assert not cog.redis.exists(k.orphanings(jid))
    assert_deregistered(cog, worker.identity)


def test_g6_a_failed_job_whose_filing_failed_is_filed_later(cog, in_process, monkeypatch):
    calls = fail_calls(monkeypatch, ReliableFetch, "file", times=1)
    jid = jobs.fail_no_retry.delay("filing-fails-once")
    worker = in_process(concurrency=1)
    wait_for(lambda: cog.redis.zcard(keys().dead), 10, "the job to be filed in dead")
    assert calls[:2] == ["fail", "ok"]
    time.sleep(1.0)
    worker.stop()
    [entry] = cog.redis.zrange(keys().dead, 0, -1)
    assert json.loads(entry)["jid"] == jid
    assert json.loads(entry)["error_class"] == "ValueError"
    assert runs(cog) == Counter({jid: 1})
    assert leftovers(cog) == {"dead": 1}


def test_g6_at_shutdown_an_unfileable_failure_goes_to_unsettled_and_a_live_process_files_it(
    cog, in_process, monkeypatch
):
    k = keys()
    fail_calls(monkeypatch, ReliableFetch, "file", times=None)
    jid = jobs.fail_no_retry.delay("filing-always-fails")
    worker = in_process(concurrency=1)
    wait_for(lambda: worker.manager.snapshot()[1], 10, "the failed filing to be pending")
    time.sleep(0.6)
    assert cog.redis.llen(k.inprogress(worker.identity)) == 1
    worker.stop()
    assert leftovers(cog) == {"unsettled": 1}
    [record] = cog.redis.lrange(k.unsettled, 0, -1)
    assert json.loads(record)["set"] == k.dead
    assert json.loads(json.loads(record)["payload"])["jid"] == jid
    assert_deregistered(cog, worker.identity)
    monkeypatch.undo()
    cog.start_worker()
    wait_for(lambda: cog.redis.zcard(k.dead) == 1, 10, "a live process to file it")
    [entry] = cog.redis.zrange(k.dead, 0, -1)
    assert json.loads(entry)["jid"] == jid
    assert json.loads(entry)["error_message"] == "filing-always-fails"
    assert leftovers(cog) == {"dead": 1}
    assert runs(cog) == Counter({jid: 1})


# -- G7 strays ------------------------------------------------------------------------------


def test_g7_a_stray_on_a_live_workers_list_is_requeued_when_seen_twice(cog):
    k = keys()
    cog.configure(HEARTBEAT_INTERVAL=0.5)
    worker = cog.start_worker("-c", "2")
    identity = worker.identity()
    long_jid = jobs.sleep_then_record.delay(3.0, "long")
    wait_for(lambda: cog.notes("started"), 15, "the long job to start")
    stray = raw_job(jobs.record, "stray")
    pushed_at = time.time()
    cog.redis.lpush(k.inprogress(identity), stray)
    wait_for(lambda: runs(cog)[jid_of(stray)], 10, "the stray to be requeued and run")
    # Seen on two passes, HEARTBEAT_INTERVAL apart, before it was requeued.
    # (Its note, not the first one: the long job, on the other thread, may
    # finish first on a loaded machine.)
    [stray_run] = [n for n in cog.notes() if n["jid"] == jid_of(stray)]
    assert stray_run["at"] - pushed_at >= 0.5 - 0.05
    wait_for(lambda: runs(cog)[long_jid], 10, "the long job to finish")
    time.sleep(0.6)
    # The long job's ack rides its thread's next fetch, after its note.
    wait_for(lambda: not cog.redis.exists(k.inprogress(identity)), 10, "the long job's ack")
    assert runs(cog) == Counter({jid_of(stray): 1, long_jid: 1})
    assert len(cog.notes("started")) == 1, "a running job was taken for a stray"
    log = worker.log()
    assert log.count(f"requeued stray in-progress job jid={jid_of(stray)}") == 1
    assert f"requeued stray in-progress job jid={long_jid}" not in log
    assert leftovers(cog) == {}


# -- G8 shutdown ---------------------------------------------------------------------------


def test_g8_sigterm_interrupts_a_job_past_the_timeout_files_it_in_retry_and_deregisters(cog):
    k = keys()
    worker = cog.start_worker("-c", "1", "-t", "1")
    identity = worker.identity()
    long_jid = jobs.block_first_run.delay(30, "long")
    wait_for(lambda: cog.notes("started"), 15, "the long job to start")
    queued = [jobs.record.delay(f"queued-{i}") for i in range(3)]
    queue_before = cog.redis.lrange(k.queue("default"), 0, -1)
    sent_at = time.time()
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    elapsed = time.monotonic() - started
    assert elapsed < 1 + 2.0, f"exited {elapsed:.1f}s after SIGTERM with a 1s timeout"

    [(entry, score)] = cog.redis.zrange(k.retry, 0, -1, withscores=True)
    interrupted = json.loads(entry)
    assert interrupted["jid"] == long_jid
    assert interrupted["interrupt_count"] == 1
    assert sent_at + INTERRUPT_DELAY_S <= score <= time.time() + INTERRUPT_DELAY_S
    assert len(cog.notes("started")) == 1 and runs(cog) == Counter(), "never run twice in parallel"
    assert cog.redis.lrange(k.queue("default"), 0, -1) == queue_before
    assert_deregistered(cog, identity)
    assert f"interrupted jid={long_jid}" in worker.log()

    # Nothing lost: due now, it runs again (quickly: not its first run).
    cog.redis.zadd(k.retry, {entry: time.time()}, xx=True)
    cog.start_worker("-c", "1")
    wait_for(lambda: set(runs(cog)) == {long_jid, *queued}, 15, "every job to run")
    assert runs(cog)[long_jid] == 1
    # The last job's ack follows its run (its thread's next fetch sends it).
    wait_for(lambda: leftovers(cog) == {}, 15, "nothing left")
    assert runs(cog)[long_jid] == 1


def test_g8_a_job_interrupted_max_times_is_requeued_normally(cog):
    k = keys()
    payload = {**jobs.block_first_run.payload((30, "long"), {}), "interrupt_count": MAX_INTERRUPTS}
    long_raw = encode(payload)
    cog.redis.lpush(k.queue("default"), long_raw)
    worker = cog.start_worker("-c", "1", "-t", "0.5")
    wait_for(lambda: cog.notes("started"), 15, "the long job to start")
    jobs.record.delay("queued")
    worker.signal(signal.SIGINT)  # as SIGTERM
    assert worker.wait(15) == 0
    assert cog.redis.zcard(k.retry) == 0
    assert cog.redis.lindex(k.queue("default"), -1) == long_raw, "back at the pop end, unchanged"
    assert cog.redis.llen(k.queue("default")) == 2


def test_g8_a_beat_in_flight_at_shutdown_does_not_register_the_process_again(cog, in_process, monkeypatch):
    worker = in_process(concurrency=1)
    wait_for(lambda: cog.redis.exists(keys().process(worker.identity)), 10, "the first beat")
    original = Heartbeat.beat
    beating = threading.Event()

    def slow_beat(self: Heartbeat) -> list[str]:
        beating.set()
        time.sleep(0.5)  # a slow round trip
        return original(self)

    monkeypatch.setattr(Heartbeat, "beat", slow_beat)
    assert beating.wait(5)
    worker.stop()
    time.sleep(0.6)
    assert_deregistered(cog, worker.identity)


def test_g8_sigtstp_stops_fetching_and_lets_the_running_job_finish(cog):
    k = keys()
    worker = cog.start_worker("-c", "2")
    identity = worker.identity()
    # Long enough that the quiet beat is seen while it still runs, on a
    # loaded machine too (2 s left about a second for that).
    long_jid = jobs.sleep_then_record.delay(5.0, "long")
    wait_for(lambda: cog.notes("started"), 15, "the long job to start")
    worker.signal(signal.SIGTSTP)
    wait_for(lambda: cog.redis.hget(k.process(identity), "quiet") == b"1", 5, "quiet in the process record")
    assert not runs(cog), "the job ended before the test could check it kept running"
    later = [jobs.record.delay(f"later-{i}") for i in range(3)]

    def pop_order() -> list[str]:
        return [jid_of(raw) for raw in reversed(cog.redis.lrange(k.queue("default"), 0, -1))]

    wait_for(lambda: runs(cog)[long_jid], 15, "the running job to finish")
    time.sleep(1.5)  # longer than a blocking fetch: an idle thread would have taken one by now
    assert runs(cog) == Counter({long_jid: 1})
    # A job the idle thread received after quiet went back where it was.
    assert pop_order() == later
    assert not cog.redis.exists(k.inprogress(identity))
    assert worker.alive()
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert pop_order() == later


def test_g8_sigttin_logs_every_threads_stack(cog):
    worker = cog.start_worker("-c", "2")
    worker.identity()
    names = ["MainThread", "cogworker-processor-0", "cogworker-processor-1", "cogworker-heartbeat"]
    names += ["cogworker-poller", "cogworker-housekeeper"]
    worker.signal(signal.SIGTTIN)
    wait_for(lambda: all(f"thread {n} (" in worker.log() for n in names), 10, "every thread's stack")
    assert 'File "' in worker.log()
    jid = jobs.record.delay("after the dump")
    wait_for(lambda: runs(cog)[jid], 10, "the worker to keep working")
    assert worker.alive()


# -- G9 fetch -------------------------------------------------------------------------------


def command_calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def watch_fetches(
    cog: CogEnv, seconds: float, action: Callable[[], Any] = lambda: None
) -> list[tuple[float, str]]:
    """(time, "blmove" | "fetch script") of every fetch the server sees for
    ``seconds`` after ``action``, read with MONITOR."""
    return [(at, kind) for at, kind, _ in watch(cog, seconds, action)]


def test_g9_one_queue_waits_on_a_blocking_blmove_without_polling(cog, own_redis):
    own_redis()
    worker = cog.start_worker("-c", "2")
    worker.identity()
    time.sleep(0.5)
    jids: list[str] = []
    seen = watch_fetches(cog, 3.0, lambda: jids.extend(jobs.record.delay(f"q-{i}") for i in range(5)))
    assert set(runs(cog)) == set(jids)
    kinds = Counter(kind for _, kind in seen)
    # The fetch script runs at most once per job, to carry acks (and take the
    # next jobs if there are any); an empty queue is waited on with BLMOVE,
    # 1 s at a time per thread: no polling.
    assert 1 <= kinds["fetch script"] <= len(jids)
    assert 2 <= kinds["blmove"] <= 2 * (3 + 2)
    assert command_calls(cog.redis, "blmove") > 0


def test_g9_paused_queues_are_skipped(cog):
    k = keys()
    cog.configure(QUEUES=["default", "mail"], CONCURRENCY=1)
    cog.redis.sadd(k.paused, "mail")
    worker = cog.start_worker()
    worker.identity()
    mail_jid = jobs.record_mail.delay("paused")
    default_jid = jobs.record.delay("unpaused")
    wait_for(lambda: runs(cog)[default_jid], 10, "the unpaused queue's job")
    time.sleep(1.5)
    assert not runs(cog)[mail_jid]
    assert cog.redis.llen(k.queue("mail")) == 1
    cog.redis.srem(k.paused, "mail")
    wait_for(lambda: runs(cog)[mail_jid], 10, "the unpaused mail job")


def test_g9_an_idle_worker_wakes_at_once_on_shutdown(cog):
    """Several queues, idle long enough that the backoff sleeps for seconds:
    SIGTERM still ends the process at once."""
    cog.configure(QUEUES=["default", "mail"], CONCURRENCY=2, FETCH_IDLE_MAX_INTERVAL=60.0)
    worker = cog.start_worker()
    worker.identity()
    # The idle sleeps are 0.25, 0.5, 1, 2, 4, 8, 16 s..., each cut to 75-100%
    # by the jitter. From 16 s after the first beat (the threads began to
    # fetch at most a few seconds before it) each thread is in the 16 s sleep
    # (12-16 s long, begun 11.6 s at the earliest): a thread that slept on
    # would hold the process at least 4.6 s more. A loaded machine slows the
    # process's exit by a second or two, never by that much.
    time.sleep(16.0)
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    elapsed = time.monotonic() - started
    assert elapsed < 4.0, f"{elapsed:.1f}s"


# -- G10 old servers ---------------------------------------------------------------------------


def test_g10_a_server_refusing_blmove_and_lpos_falls_back_to_basic_fetch(cog, own_redis):
    k = keys()
    own_redis(extra=["--rename-command", "BLMOVE", "", "--rename-command", "LPOS", ""])
    with pytest.raises(redis.ResponseError, match="unknown command"):
        cog.redis.blmove("a", "b", 0.1)
    worker = cog.start_worker("-c", "2")
    identity = worker.identity()
    jids = [jobs.record.delay(f"basic-{i}") for i in range(5)]
    wait_for(lambda: set(runs(cog)) == set(jids), 10, "the jobs to run on basic fetch")
    failing = jobs.fail_no_retry.delay("filed without LPOS")
    wait_for(lambda: cog.redis.zcard(k.dead), 10, "a failure to be filed")
    assert json.loads(cog.redis.zrange(k.dead, 0, -1)[0])["jid"] == failing
    assert cog.redis.hget(k.process(identity), "fetch") == b"basic"
    assert not cog.redis.sismember(k.inprogress_identities, identity)
    log = worker.log()
    assert log.count("falling back to basic fetch") == 1, log
    assert "refused by the server" not in log and " ERROR " not in log, log
    assert worker.alive()


def test_g10_a_connection_error_while_checking_is_not_taken_as_an_answer(cog, monkeypatch):
    config = get_config()
    manager = Manager(open_process(config, "host:10:g10"), config.queues, 1, "reliable", 1.0)
    original = manager.client.info
    failures = []

    def info(*args: Any, **kwargs: Any) -> Any:
        if not failures:
            failures.append(1)
            raise redis.ConnectionError("injected: Redis unreachable")
        return original(*args, **kwargs)

    monkeypatch.setattr(manager.client, "info", info)
    with pytest.raises(redis.ConnectionError):
        manager.fetcher()
    assert isinstance(manager.fetcher(), ReliableFetch)
    assert manager.reliable


# -- G11 scripts by SHA, reloaded on NOSCRIPT ---------------------------------------------------


def test_g11_jobs_keep_flowing_through_script_flushes(cog, own_redis):
    own_redis()
    cog.configure(QUEUES=["default", "mail"], CONCURRENCY=2)
    worker = cog.start_worker()
    worker.identity()
    jids: list[str] = []
    for round_ in range(12):
        jids += [str(jobs.record.delay(f"r{round_}-{i}")) for i in range(10)]
        jids += [str(jobs.record_mail.delay(f"m{round_}-{i}")) for i in range(5)]
        cog.redis.script_flush()
        time.sleep(0.15)
    wait_for(lambda: set(runs(cog)) == set(jids), 15, "every job to run")
    cog.redis.script_flush()
    failing = jobs.fail_no_retry.delay("after a flush")
    wait_for(lambda: cog.redis.zcard(keys().dead), 10, "a failure to be filed after a flush")
    assert json.loads(cog.redis.zrange(keys().dead, 0, -1)[0])["jid"] == failing
    shas = [script("fetch").sha, script("heartbeat").sha]
    wait_for(lambda: cog.redis.script_exists(*shas) == [True, True], 5, "the scripts to be loaded again")
    assert command_calls(cog.redis, "evalsha") > 0
    log = worker.log()
    # One traceback: the failing job's own, under its line.
    assert "ERROR" not in log and log.count("Traceback") == 1, log
    assert all(count == 1 for count in runs(cog).values())


def test_g11_a_flush_racing_with_the_reload_does_not_fail_the_call(cog, own_redis, monkeypatch):
    """A SCRIPT FLUSH that lands right after the script was loaded again
    (after a NOSCRIPT) must not make the call fail."""
    own_redis()
    client = get_redis()
    original = client.execute_command

    def execute_command(*args: Any, **options: Any) -> Any:
        reply = original(*args, **options)
        if " ".join(str(a) for a in args[:2]).upper().startswith("SCRIPT LOAD"):
            original("SCRIPT FLUSH")
        return reply

    monkeypatch.setattr(client, "execute_command", execute_command)
    cog.redis.script_flush()
    k = keys()
    ident = "host:11:g11"
    plant_dead_identity(cog, ident, [raw_job(jobs.record, "flushed")], beat_age_s=10)
    assert run_requeue(cog, ident, threshold_s=2, client=client) == [1]
    assert cog.redis.llen(k.queue("default")) == 1


# -- G12 isolation --------------------------------------------------------------------------------


def test_g12_a_broken_in_progress_list_does_not_stop_recovery_of_others_nor_the_poller(cog):
    r, k = cog.redis, keys()
    r.set(k.inprogress("host:12:broken"), "not a list")
    plant_dead_identity(cog, "host:12:broken", [])
    held = [raw_job(jobs.record, f"held-{i}") for i in range(3)]
    plant_dead_identity(cog, "host:12:dead", held)
    scheduled = jobs.record.delay_in(0.5, "scheduled")
    worker = cog.start_worker()
    identity = worker.identity()
    wait_for(lambda: set(runs(cog)) == {*map(jid_of, held), scheduled}, 15, "recovered and scheduled jobs")
    seen = []

    def passes_continue() -> bool:
        report = json.loads(r.get(k.recovery_report) or b"{}")
        if report.get("identity") == identity:
            seen.append(report)
        return len({s["at"] for s in seen}) >= 3

    wait_for(passes_continue, 10, "more recovery passes")
    assert all(s["errors"] >= 1 for s in seen)
    assert "orphan recovery skipped host:12:broken" in worker.log()
    assert r.get(k.inprogress("host:12:broken")) == b"not a list", "left for a person to look at"
    assert worker.alive()


def test_g12_a_broken_in_progress_registry_does_not_stop_the_worker_nor_the_poller(cog):
    r, k = cog.redis, keys()
    held = [raw_job(jobs.record, f"held-{i}") for i in range(2)]
    plant_dead_identity(cog, "host:12:scanned", held)
    r.delete(k.inprogress_identities)
    r.set(k.inprogress_identities, "not a set")
    scheduled = jobs.record.delay_in(0.5, "scheduled")
    worker = cog.start_worker()
    identity = worker.identity()
    assert r.exists(k.process(identity))
    # The boot scan finds the dead process's list without the registry.
    wait_for(lambda: set(runs(cog)) >= {*map(jid_of, held), scheduled}, 15, "recovered and scheduled jobs")
    queued = jobs.record.delay("queued")
    wait_for(lambda: runs(cog)[queued], 10, "a queued job")
    assert "reading the in-progress registry failed" in worker.log()
    time.sleep(0.5)
    assert r.exists(k.process(identity)), "the heartbeat stopped"
    assert worker.alive()


# -- G13 bad payloads ----------------------------------------------------------------------------


def test_g13_bad_payloads_are_filed_in_dead_with_raw_kept_and_the_worker_goes_on(cog, tmp_path):
    r, k = cog.redis, keys()
    marker = tmp_path / "imported-and-ran"
    bad: dict[str, bytes] = {
        "not json": b"not json{",
        "array": b"[1, 2]",
        "no job": b'{"jid": "nojob", "args": []}',
        "unknown": json.dumps(
            {"jid": "unknown", "job": "os.system", "args": [f"touch {marker}"], "kwargs": {}}
        ).encode(),
        "args": json.dumps({"jid": "badargs", "job": RECORD, "args": "x", "kwargs": {}}).encode(),
        "kwargs": json.dumps({"jid": "badkwargs", "job": RECORD, "args": [], "kwargs": [1]}).encode(),
        "utf8": b'{"jid": "utf", "job": "' + RECORD.encode() + b'", "args": ["\xff\xfe"]}',
    }
    r.lpush(k.queue("default"), *bad.values())
    worker = cog.start_worker("-c", "2")
    after = jobs.record.delay("after the bad ones")
    wait_for(lambda: r.zcard(k.dead) == len(bad), 15, "every bad payload to be filed in dead")
    wait_for(lambda: runs(cog)[after], 10, "a good job after them")
    # Its ack follows its note (it rides its thread's next fetch).
    listed = k.inprogress(worker.identity())
    wait_for(lambda: not r.exists(listed), 10, "the good job's ack")
    dead = [json.loads(entry) for entry in r.zrange(k.dead, 0, -1)]
    by_raw = {d["raw"]: d for d in dead if "raw" in d}
    by_jid = {d["jid"]: d for d in dead}

    for name, expected in [("not json", "not valid JSON"), ("array", "JSON list, not an object")]:
        entry = by_raw[bad[name].decode()]
        assert entry["error_class"] == "django_cogworker.errors.BadPayload"
        assert expected in entry["error_message"], name
    entry = by_raw[bad["utf8"].decode("utf-8", "replace")]
    assert "not valid JSON" in entry["error_message"]
    assert "no job name" in by_jid["nojob"]["error_message"]
    assert by_jid["unknown"]["error_class"] == "django_cogworker.errors.JobNotRegistered"
    assert "not registered" in by_jid["unknown"]["error_message"]
    assert by_jid["unknown"]["args"] == [f"touch {marker}"]
    assert not marker.exists(), "a job named in a payload was imported and run"
    assert "'args' is not a list" in by_jid["badargs"]["error_message"]
    assert "'kwargs' is not an object" in by_jid["badkwargs"]["error_message"]
    assert all(d.get("failed_at") for d in dead)
    assert runs(cog) == Counter({after: 1})
    assert leftovers(cog) == {"dead": len(bad)}
    assert worker.alive()


# -- G14 Django hygiene -----------------------------------------------------------------------------


def test_g14_close_old_connections_runs_before_and_after_each_job_in_process(cog, db, monkeypatch):
    connection.ensure_connection()  # this thread has a connection to close
    events: list[tuple[str, int]] = []
    monkeypatch.setattr(job_runs, "close_old_connections", lambda: events.append(("close", len(cog.notes()))))
    config = get_config()
    for job, args, kind in [
        (jobs.record, ("ok",), execution.ACK),
        (jobs.fail_no_retry, ("failing",), execution.DEAD),
        (jobs.raise_base_exception, ("SystemExit",), execution.DEAD),
    ]:
        events.clear()
        before = len(cog.notes())
        outcome = execution.execute(raw_job(job, *args), config)
        assert outcome.kind == kind
        assert events == [("close", before), ("close", before + 1)], job.name


def test_g14_a_thread_that_never_opened_a_connection_has_none_to_close(cog, db, monkeypatch):
    """close_old_connections() is skipped in a thread that never opened a
    database connection (it would close nothing), and made around every
    job once the thread has opened one: Django's connection_created says so."""
    calls: list[str] = []
    monkeypatch.setattr(job_runs, "close_old_connections", lambda: calls.append("close"))
    config = get_config()
    seen: list[tuple[int, int]] = []

    def run() -> None:
        execution.execute(raw_job(jobs.record, "no connection yet"), config)
        before = len(calls)
        connections["default"].ensure_connection()
        try:
            execution.execute(raw_job(jobs.record, "with a connection"), config)
        finally:
            connections["default"].close()
        seen.append((before, len(calls)))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert seen == [(0, 2)]
    assert len(cog.notes()) == 2


def test_g14_close_old_connections_before_and_after_each_job_in_a_worker(cog, tmp_path):
    """An obsolete connection (as CONN_MAX_AGE makes one) is closed right
    after the job that used it, and one that became obsolete while the
    thread was idle is closed before the next job starts."""
    worker = cog.start_worker("-c", "1", env={"COGWORKER_DB_PATH": str(tmp_path / "db.sqlite3")})
    worker.identity()
    first = jobs.db_close_probe.delay(0, "obsolete at its end")
    wait_for(lambda: runs(cog)[first], 10, "the first probe")
    # Obsolete only after the call that follows its job (a loaded machine
    # may hold the thread between the two), and before the third starts.
    second = jobs.db_close_probe.delay(1.5, "obsolete 1.5 s later")
    wait_for(lambda: runs(cog)[second], 10, "the second probe")
    time.sleep(2.5)
    third = jobs.db_close_probe.delay(60, "not obsolete")
    wait_for(lambda: runs(cog)[third], 10, "the third probe")
    time.sleep(0.3)
    # Closed by the call after the first job (its context may be reset by
    # then), not by the one before the second; and by the call before the third.
    closed = [n["jid"] for n in cog.notes("closed")]
    assert len(closed) == 2, closed
    assert closed[0] in (first, None) and closed[1] == third, closed
    assert [n["had_connection"] for n in cog.notes()] == [False, False, False]


def test_g14_a_job_raising_any_exception_never_kills_its_thread(cog):
    """Chosen behaviour: an exception of any kind raised by a job, a
    BaseException such as SystemExit or KeyboardInterrupt included, is that
    job's failure (retried or filed in dead like any other). The thread goes
    on to the next job, and the job is not run again as a stray."""
    k = keys()
    worker = cog.start_worker("-c", "1")
    worker.identity()
    failing = [
        jobs.fail_no_retry.delay("ValueError"),
        jobs.raise_base_exception.delay("SystemExit"),
        jobs.raise_base_exception.delay("KeyboardInterrupt"),
        jobs.raise_base_exception.delay("JobAborted"),
    ]
    after = jobs.record.delay("after")
    wait_for(lambda: runs(cog)[after], 10, "the job after them, on the same single thread")
    wait_for(lambda: cog.redis.zcard(k.dead) == 4, 5, "the four failures to be filed")
    time.sleep(1.0)  # reconcile passes: nothing is taken for a stray and run again
    assert runs(cog) == Counter({jid: 1 for jid in [*failing, after]})
    classes = {json.loads(e)["jid"]: json.loads(e)["error_class"] for e in cog.redis.zrange(k.dead, 0, -1)}
    assert classes == {
        failing[0]: "ValueError",
        failing[1]: "SystemExit",
        failing[2]: "KeyboardInterrupt",
        failing[3]: "testproject.testapp.jobs.JobAborted",
    }
    assert leftovers(cog) == {"dead": 4}
    assert worker.alive()


# -- Redis restarted mid-run ----------------------------------------------------------------------


def test_g17_redis_killed_and_restarted_from_its_aof_mid_run_loses_nothing(cog, own_redis):
    server = own_redis(appendonly=True)
    cog.configure(CONCURRENCY=4)
    jids = [str(j) for j in jobs.pace.delay_many([((0.02, i), {}) for i in range(300)])]
    worker = cog.start_worker()
    worker.identity()
    wait_for(lambda: len(cog.notes()) >= 40, 15, "the run to get going")
    server.stop(signal.SIGKILL)
    time.sleep(1.0)
    server.start()
    wait_for(lambda: set(runs(cog)) == set(jids), 30, "every job to run after the restart")
    wait_for(lambda: leftovers(cog) == {}, 10, "nothing left anywhere")
    assert worker.alive()
    second_runs = sum(n - 1 for n in runs(cog).values())
    assert second_runs <= 4, f"{second_runs} jobs ran twice (at most one per thread)"
    # The processors log an outage once (not once per thread or per try),
    # and once that they resumed.
    log = worker.log()
    outages = log.count("Redis unreachable")
    assert 1 <= outages <= 2 and log.count("processing resumed") == outages, log


def test_g12_a_queue_key_of_the_wrong_type_does_not_stop_the_other_queues(cog):
    cog.redis.set(cog.key("queue:mail"), "not a list")
    cog.redis.sadd(cog.key("queues"), "mail")
    jids = {jobs.record.delay(i) for i in range(5)}
    worker = cog.start_worker("-q", "mail", "-q", "default")
    wait_for(lambda: {n["jid"] for n in cog.notes()} == jids, 20, "the default queue's jobs to run")
    assert cog.redis.get(cog.key("queue:mail")) == b"not a list"
    wait_for(
        lambda: "skipping a queue that cannot be read" in worker.log(), 10, "the broken queue to be logged"
    )
    assert worker.log().count("skipping a queue that cannot be read") == 1
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


def test_g3_a_poison_pill_filed_in_dead_is_counted_failed_and_its_on_exhausted_called(cog):
    from django_cogworker.conf import get_config

    launcher = Launcher(get_config(), identity="test-burier")
    pill = jobs.fail_with_hook.payload(("pill",), {})
    cog.redis.rpush(cog.key("repeat_orphans"), json.dumps(pill))

    assert launcher.recovery.bury_repeat_orphans() == 1

    [entry] = cog.redis.zrange(cog.key("dead"), 0, -1)
    dead = json.loads(entry)
    assert (dead["jid"], dead["error_class"]) == (pill["jid"], "ProcessDied")
    assert cog.redis.llen(cog.key("repeat_orphans")) == 0
    assert int(cog.redis.get(cog.key("stat:failed"))) == 1
    [heard] = cog.notes("exhausted")
    assert heard["jid"] == pill["jid"] and heard["error_class"] == "ProcessDied"
