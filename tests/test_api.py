"""The inspection API (``django_cogworker.api``) against a real Redis, and
against real worker processes for ``ProcessSet`` and ``Workers``."""

from __future__ import annotations

import datetime as dt
import json
import signal
import socket
import threading
import time
from typing import Any

import pytest

from django_cogworker import execution, job, testing
from django_cogworker.api import (
    DeadSet,
    ProcessSet,
    Queue,
    RetrySet,
    ScheduledSet,
    Stats,
    UnsettledSet,
    Workers,
)
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.fetch import FetchContext
from django_cogworker.fetch_mode import Fetching
from django_cogworker.ledger import Filing, Ledger
from django_cogworker.outage import Outage
from django_cogworker.payload import encode
from django_cogworker.settle import Settler
from testproject.testapp import jobs
from tests.conftest import wait_for

FAIL = "testproject.testapp.jobs.fail"
RECORD = "testproject.testapp.jobs.record"


@job(name="tâche.échoue", retry=0)
def failing_unicode(message: str) -> None:
    raise ValueError(message)


def queued_jids(cog: Any, queue: str = "default") -> list[str]:
    """jids in the queue, next to run first."""
    return [json.loads(r)["jid"] for r in reversed(cog.redis.lrange(cog.key(f"queue:{queue}"), 0, -1))]


def zset_jids(cog: Any, name: str) -> list[str]:
    return [json.loads(r).get("jid") for r in cog.redis.zrange(cog.key(name), 0, -1)]


def to_dead(*calls: tuple[Any, tuple[Any, ...]]) -> list[str]:
    """Runs failing jobs through drain() so they land in dead as a worker files them."""
    jids = [j.set(retry=0).delay(*args) for j, args in calls]
    assert testing.drain() == len(jids)
    return [str(j) for j in jids]


# -- Queue --------------------------------------------------------------------------


def test_queue_size_latency_and_pause(cog):
    queue = Queue("default")
    assert (queue.name, queue.size, queue.latency, queue.paused) == ("default", 0, 0.0, False)
    jobs.record.delay("old")
    jobs.record.delay("new")
    assert queue.size == 2
    assert 0.0 <= queue.latency < 5.0
    # The oldest job (next to run) decides the latency.
    oldest = json.loads(cog.redis.rpop(cog.key("queue:default")))
    oldest["enqueued_at"] -= 60
    cog.redis.rpush(cog.key("queue:default"), json.dumps(oldest))
    assert 60.0 <= queue.latency < 65.0

    queue.pause()
    assert queue.paused is True
    assert cog.redis.smembers(cog.key("paused")) == {b"default"}
    assert Queue("mail").paused is False
    queue.unpause()
    assert queue.paused is False
    assert cog.redis.smembers(cog.key("paused")) == set()


def test_queue_clear_and_all(cog):
    jobs.record.delay_many([((i,), {}) for i in range(3)])
    jobs.record_mail.delay()
    jobs.record.set(queue="low").delay()
    assert [q.name for q in Queue.all()] == ["default", "low", "mail"]
    assert Queue("default").clear() == 3
    assert Queue("default").size == 0
    # The queue stays known (listed, with size 0): enqueuers skip re-registering it.
    assert [(q.name, q.size) for q in Queue.all()] == [("default", 0), ("low", 1), ("mail", 1)]
    jid = jobs.record.delay("after the clear")
    assert [r.jid for r in Queue("default")] == [jid]
    assert Queue("nothing").clear() == 0


def test_queue_iterates_in_run_order_pages_and_finds(cog):
    jids = jobs.record.delay_many([((i,), {}) for i in range(1203)])
    queue = Queue("default")
    assert [r.jid for r in queue] == jids  # more than two internal batches of 500
    assert [r.jid for r in queue.page()] == jids[:25]
    assert [r.jid for r in queue.page(1190, 50)] == jids[1190:]
    assert queue.page(1203) == []
    record = queue.find(jids[700])
    assert record is not None
    assert (record.jid, record.args, record.name, record.queue, record.kind) == (
        jids[700],
        [700],
        RECORD,
        "default",
        "queue",
    )
    assert queue.find("no-such-jid") is None


# -- sorted sets ------------------------------------------------------------------


def test_scheduled_set_iterates_by_due_time(cog):
    now = time.time()
    late = jobs.record.delay_at(now + 300, "late")
    soon = jobs.record.delay_at(now + 10, "soon")
    middle = jobs.record_mail.delay_at(now + 100, "middle")
    scheduled = ScheduledSet()
    assert scheduled.size == 3
    assert [r.jid for r in scheduled] == [soon, middle, late]
    assert [r.jid for r in scheduled.page(1, 1)] == [middle]
    first = scheduled.page()[0]
    assert first.score == now + 10
    assert first.at == dt.datetime.fromtimestamp(now + 10, tz=dt.UTC)
    assert scheduled.find(middle).queue == "mail"
    assert [r.jid for r in scheduled.filter(queue="mail")] == [middle]
    assert [r.jid for r in scheduled.filter(name=RECORD)] == [soon, late]
    assert scheduled.clear() == 3
    assert scheduled.size == 0 and list(scheduled) == []


def test_dead_set_lists_newest_first_and_filters(cog):
    first, second = to_dead((jobs.fail, ("first",)), (jobs.fail, ("second needle",)))
    [third] = to_dead((failing_unicode, ('say "hi" to Ünïcode',)))
    other = jobs.fail.set(queue="mail", retry=0).delay("mailed")
    assert testing.drain(["mail"]) == 1
    dead = DeadSet()
    assert dead.size == 4
    assert [r.jid for r in dead] == [other, third, second, first]
    assert [r.jid for r in dead.page(1, 2)] == [third, second]
    assert [r.jid for r in dead.filter(name=FAIL)] == [other, second, first]
    assert [r.jid for r in dead.filter(name="tâche.échoue")] == [third]
    assert [r.jid for r in dead.filter(queue="mail")] == [other]
    assert [r.jid for r in dead.filter(name=FAIL, queue="default")] == [second, first]
    assert [r.jid for r in dead.filter(search="NEEDLE")] == [second]
    assert [r.jid for r in dead.filter(search='say "hi"')] == [third]
    assert [r.jid for r in dead.filter(search="Ünïcode")] == [third]
    assert [r.jid for r in dead.filter(search=first[:10])] == [first]
    assert [r.jid for r in dead.filter(search="valueerror")] == [other, third, second, first]
    assert [r.jid for r in dead.filter(search="valueerror", limit=2)] == [other, third]
    assert dead.filter(search="absent") == []
    assert dead.find(second).error_message == "second needle"
    assert dead.find("no-such-jid") is None
    assert dead.job_names() == [FAIL, "tâche.échoue"]


def test_job_record_fields_of_a_failed_job(cog):
    before = time.time()
    jid = jobs.fail.delay(
        "broken",
    )
    assert testing.drain() == 1
    [record] = list(RetrySet())
    assert record.jid == jid
    assert record.name == FAIL
    assert record.args == ["broken"]
    assert record.kwargs == {}
    assert record.queue == "default"
    assert record.retry_count == 0
    assert record.error_class == "ValueError"
    assert record.error_message == "broken"
    assert "raise ValueError(message)" in record.error_backtrace
    assert before <= record.enqueued_at <= record.failed_at <= time.time()
    assert record.retried_at is None
    assert json.loads(record.raw) == record.payload
    assert record.payload["retry"] == 2
    assert record.kind == "zset" and record.source == cog.key("retry")


def test_job_record_of_an_unreadable_payload_keeps_the_raw_text(cog):
    cog.redis.lpush(cog.key("queue:default"), b"\xff not json")
    assert testing.drain() == 1
    [record] = list(DeadSet())
    assert record.payload["raw"] == "\ufffd not json"
    assert record.name == ""
    assert record.error_class == "django_cogworker.errors.BadPayload"


# -- JobRecord actions ------------------------------------------------------------


def test_retry_moves_a_retry_entry_to_its_queue_once(cog):
    jid = jobs.fail.set(queue="mail").delay("x")
    assert testing.drain(["mail"]) == 1
    [record] = list(RetrySet())
    before = time.time()
    assert record.retry() is True
    assert RetrySet().size == 0
    [payload] = [json.loads(r) for r in cog.redis.lrange(cog.key("queue:mail"), 0, -1)]
    assert payload["jid"] == jid
    assert payload["retry_count"] == 0 and payload["error_message"] == "x"  # its history is kept
    assert payload["enqueued_at"] >= before
    assert cog.redis.sismember(cog.key("queues"), "mail")
    # The same record a second time: it is no longer there, nothing moves.
    assert record.retry() is False
    assert queued_jids(cog, "mail") == [jid]


def test_retry_from_dead_and_from_the_schedule(cog):
    [dead_jid] = to_dead((jobs.fail, ("dead",)))
    later = jobs.record.delay_in(600, "later")
    assert DeadSet().find(dead_jid).retry() is True
    assert ScheduledSet().find(later).retry() is True
    assert queued_jids(cog) == [dead_jid, later]
    assert DeadSet().size == 0 and ScheduledSet().size == 0


def test_delete_removes_the_entry_once(cog):
    jid = jobs.record.delay_in(600)
    record = ScheduledSet().find(jid)
    assert record.delete() is True
    assert record.delete() is False
    assert ScheduledSet().size == 0
    queued = jobs.record.delay("q")
    record = Queue("default").find(queued)
    assert record.delete() is True
    assert Queue("default").size == 0


def test_kill_moves_to_dead_keeping_or_adding_the_error(cog):
    retried = jobs.fail.delay("kept error")
    assert testing.drain() == 1
    scheduled = jobs.record.delay_in(600, "s")
    queued = jobs.record.delay("q")
    before = time.time()
    assert RetrySet().find(retried).kill() is True
    assert ScheduledSet().find(scheduled).kill() is True
    assert Queue("default").find(queued).kill() is True
    assert RetrySet().size == ScheduledSet().size == Queue("default").size == 0

    dead = {r.jid: r for r in DeadSet()}
    assert set(dead) == {retried, scheduled, queued}
    assert (dead[retried].error_class, dead[retried].error_message) == ("ValueError", "kept error")
    for jid in (scheduled, queued):
        assert (dead[jid].error_class, dead[jid].error_message) == ("Killed", "killed by hand")
        assert before <= dead[jid].failed_at <= time.time()
        assert before <= dead[jid].score <= time.time()
    # Already dead: kill does nothing; a queued record cannot be "retried now".
    assert dead[retried].kill() is False
    assert DeadSet().size == 3
    again = jobs.record.delay("again")
    assert Queue("default").find(again).retry() is False
    assert queued_jids(cog) == [again]


# -- UnsettledSet -----------------------------------------------------------------


def park(cog: Any, job_obj: Any, *args: Any) -> execution.Outcome:
    """What a stopping worker does with a failure it could not file: the
    settler hands it to the unsettled list."""
    raw = encode(job_obj.payload(args, {}))
    outcome = execution.execute(raw, get_config(), close_connections=False)
    assert outcome.kind in (execution.RETRY, execution.DEAD)
    quiet = threading.Event()
    ctx = FetchContext(get_redis(), get_keys(), get_config(), "gone", (), quiet, Ledger(1, quiet))
    cog.redis.lpush(cog.key("inprogress:gone"), raw)
    zset = cog.key("retry") if outcome.kind == execution.RETRY else cog.key("dead")
    settler = Settler(ctx, Fetching(ctx, "reliable"), Outage())
    settler.park_unsettled({raw: Filing(zset, outcome.score, outcome.encoded(), outcome.jid, False)})
    assert cog.redis.llen(cog.key("inprogress:gone")) == 0
    return outcome


def test_unsettled_set_lists_finds_filters_and_clears(cog):
    first = park(cog, jobs.fail, "one")
    second = park(cog, jobs.fail.set(retry=0, queue="mail"), "two")
    unsettled = UnsettledSet()
    assert unsettled.size == 2
    records = list(unsettled)
    assert [r.jid for r in records] == [first.jid, second.jid]
    assert [r.target_set for r in records] == [cog.key("retry"), cog.key("dead")]
    assert records[0].score == first.score
    assert (records[1].name, records[1].queue, records[1].error_message) == (FAIL, "mail", "two")
    assert records[1].kind == "unsettled"
    assert json.loads(records[1].raw) == second.payload
    assert [r.jid for r in unsettled.page(1, 5)] == [second.jid]
    assert unsettled.find(second.jid).args == ["two"]
    assert unsettled.find("nope") is None
    assert [r.jid for r in unsettled.filter(queue="mail")] == [second.jid]
    assert [r.jid for r in unsettled.filter(search="ONE")] == [first.jid]
    assert [r.jid for r in unsettled.filter(name=FAIL)] == [first.jid, second.jid]
    assert unsettled.clear() == 2
    assert unsettled.size == 0


def test_unsettled_entries_retry_kill_and_delete(cog):
    to_retry = park(cog, jobs.fail, "r")
    to_kill = park(cog, jobs.fail, "k")
    to_delete = park(cog, jobs.fail, "d")
    unsettled = UnsettledSet()
    assert unsettled.find(to_retry.jid).retry() is True
    assert queued_jids(cog) == [to_retry.jid]
    record = unsettled.find(to_kill.jid)
    assert record.kill() is True
    assert record.kill() is False
    [dead] = list(DeadSet())
    assert (dead.jid, dead.error_class, dead.error_message) == (to_kill.jid, "ValueError", "k")
    assert unsettled.find(to_delete.jid).delete() is True
    assert unsettled.size == 0
    assert RetrySet().size == 0


def test_unreadable_entries_of_one_score_have_their_own_ids(cog):
    """Two unreadable payloads filed in dead at the same moment: each its
    own row id, so deleting one leaves the other."""
    k = get_keys()
    cog.redis.zadd(k.dead, {b"not json \xff one": 1767225600.0, b"not json \xff two": 1767225600.0})
    first, second = DeadSet().page(0, 10)
    assert first.jid == second.jid == "" and first.id != second.id
    assert DeadSet().get(second.id).raw == second.raw
    assert DeadSet().get(second.id).delete() is True
    [left] = DeadSet().page(0, 10)
    assert left.raw == first.raw and DeadSet().get(first.id) is not None


def test_a_selection_of_unsettled_entries_is_found_in_one_read_of_the_list(cog, own_redis):
    """Confirming a bulk action on 990 of 5,000 unsettled entries: one LRANGE,
    not one per id."""
    own_redis()
    k = get_keys()
    entries = [
        json.dumps({"payload": json.dumps({"jid": f"j{i}", "job": FAIL}), "set": k.dead}) for i in range(5000)
    ]
    cog.redis.rpush(k.unsettled, *entries)
    every = list(UnsettledSet())
    wanted = [r.id for r in every[::5]][:990]
    before = int(cog.redis.info("commandstats").get("cmdstat_lrange", {}).get("calls", 0))
    found = UnsettledSet().get_many(wanted)
    after = int(cog.redis.info("commandstats").get("cmdstat_lrange", {}).get("calls", 0))
    assert [r.id for r in found] == wanted and after - before == 1


# -- Stats --------------------------------------------------------------------------


def test_stats_totals_sizes_and_daily_history(cog):
    to_dead((jobs.fail, ("to dead",)))
    jobs.fail.delay("to retry")
    assert testing.drain() == 1
    jobs.record.delay_many([((1,), {}), ((2,), {})])
    jobs.record_mail.delay()
    jobs.record.delay_in(60)
    park(cog, jobs.fail, "unsettled")
    today = dt.datetime.now(dt.UTC).date()
    yesterday = today - dt.timedelta(days=1)
    cog.redis.mset(
        {
            cog.key("stat:processed"): 10,
            cog.key("stat:failed"): 3,
            cog.key(f"stat:processed:{today.isoformat()}"): 4,
            cog.key(f"stat:failed:{today.isoformat()}"): 1,
            cog.key(f"stat:processed:{yesterday.isoformat()}"): 6,
            cog.key(f"stat:failed:{yesterday.isoformat()}"): 2,
        }
    )
    stats = Stats()
    assert (stats.processed, stats.failed) == (10, 3)
    assert (stats.scheduled_size, stats.retry_size, stats.dead_size, stats.unsettled_size) == (1, 1, 1, 1)
    assert stats.queue_sizes == {"default": 2, "mail": 1}
    assert stats.enqueued == 3
    assert Stats.history(3, today=today) == [
        (today - dt.timedelta(days=2), 0, 0),
        (yesterday, 6, 2),
        (today, 4, 1),
    ]
    assert len(Stats.history()) == 30
    assert Stats.history()[-1] == (today, 4, 1)


def test_stats_of_an_empty_namespace(cog):
    stats = Stats()
    assert (stats.processed, stats.failed, stats.enqueued, stats.queue_sizes) == (0, 0, 0, {})
    assert (stats.scheduled_size, stats.retry_size, stats.dead_size) == (0, 0, 0)


# -- live processes -------------------------------------------------------------------


def only_process() -> Any:
    records = ProcessSet().all()
    assert len(records) == 1, records
    return records[0]


def test_process_set_and_workers_show_a_live_worker(cog):
    before = time.time()
    worker = cog.start_worker("-c", "3", "--tag", "blue", "-q", "default", "-q", "mail", "-t", "0.5")
    identity = worker.identity()
    record = only_process()
    assert record.identity == identity
    assert identity.startswith(f"{socket.gethostname()}:{worker.pid}:")
    assert (record.hostname, record.pid, record.tag) == (socket.gethostname(), worker.pid, "blue")
    assert (record.concurrency, record.queues, record.busy, record.quiet) == (
        3,
        ["default", "mail"],
        0,
        False,
    )
    assert record.fetch == "reliable"
    assert record.rss_kb > 0
    assert before - 1 <= record.started_at <= record.last_beat <= time.time() + 1
    assert ProcessSet().size == 1
    wait_for(lambda: only_process().last_beat > record.last_beat, 5, "the next beat")

    enqueued_at = time.time()
    jid = jobs.sleep_then_record.delay(30, "slow")
    wait_for(lambda: cog.notes("started"), 10, "the slow job to start")
    running = wait_for(Workers().all, 5, "the running job to be reported")
    assert len(running) == 1 and Workers().size == 1
    [slow] = running
    assert (slow.identity, slow.jid, slow.queue, slow.name) == (
        identity,
        jid,
        "default",
        "testproject.testapp.jobs.sleep_then_record",
    )
    assert slow.payload["args"] == [30, "slow"]
    assert enqueued_at <= slow.run_at <= time.time()
    assert slow.running_for_s >= 0
    wait_for(lambda: only_process().busy == 1, 5, "busy to show the running job")

    worker.signal(signal.SIGTSTP)
    wait_for(lambda: only_process().quiet, 5, "the worker to report quiet")
    quiet_since = only_process().last_beat
    waiting = jobs.record.delay("not fetched while quiet")
    wait_for(lambda: only_process().last_beat > quiet_since + 1.5, 10, "beats while quiet")
    assert queued_jids(cog) == [waiting]
    assert cog.notes() == []

    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 0
    assert ProcessSet().all() == []
    assert Workers().all() == []


def test_process_set_signal_quiet_then_stop_acted_on_at_the_next_beat(cog):
    worker = cog.start_worker()
    identity = worker.identity()
    with pytest.raises(ValueError, match="unknown signal 'reboot'"):
        ProcessSet.signal(identity, "reboot")
    ProcessSet.signal(identity, "quiet")
    wait_for(lambda: only_process().quiet, 5, "the worker to go quiet")
    assert worker.alive()
    assert cog.redis.exists(cog.key(f"signals:{identity}")) == 0  # collected by the beat
    only_process().stop_it()
    assert worker.wait(10) == 0
    assert ProcessSet().all() == []
    assert "received stop through Redis" in worker.log()
