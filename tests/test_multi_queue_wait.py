"""G9 with several queues: an idle worker waits on every queue with
``BLMOVE`` (its idle threads spread over them), so a push to any of them
wakes it without a poll; with fewer threads than queues, each wait that ends
is followed by one look at every queue in order; a wait that ended empty is
renewed on the same queue without going back through ``retrieve()`` when
that is where the thread would go (``Waiters.stays``,
``ReliableFetch.renews``). Read with MONITOR on a real server, with real
worker processes, or by patching an in-process worker's calls."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

from django_cogworker.conf import parse_queue
from django_cogworker.connection import get_keys
from django_cogworker.direct_blocking import BlockingConnections
from django_cogworker.fetch import ReliableFetch
from django_cogworker.scripts import script
from django_cogworker.waiting import Waiters
from testproject.testapp import jobs
from tests.conftest import CogEnv, wait_for

QUEUES = ["q1", "q2", "q3", "q4", "default"]


def watch(
    cog: CogEnv, seconds: float, action: Callable[[], Any] = lambda: None
) -> list[tuple[float, str, str]]:
    """(time, "blmove" | "fetch script", the queue key BLMOVE waits on or
    "") of every fetch the server sees for ``seconds`` after ``action``."""
    fetch_sha = script("fetch").sha
    seen = []
    with redis.Redis.from_url(cog.url, socket_timeout=10) as client, client.monitor() as monitor:
        action()
        until = time.time() + seconds
        while time.time() < until:  # the heartbeat keeps the stream moving
            command = monitor.next_command()
            if cog.namespace not in command["command"]:
                continue  # another test's, on a shared server
            words = command["command"].split()
            if words[0] == "BLMOVE":
                seen.append((float(command["time"]), "blmove", words[1]))
            elif words[0] == "EVALSHA" and words[1] == fetch_sha:
                seen.append((float(command["time"]), "fetch script", ""))
    return seen


def idle_worker(cog: CogEnv, queues: list[str], concurrency: int) -> None:
    cog.configure(QUEUES=queues, CONCURRENCY=concurrency, FETCH_IDLE_MAX_INTERVAL=0.2)
    worker = cog.start_worker()
    worker.identity()
    # Idle: every thread's first look found the queues empty, and it waits.
    wait_for(
        lambda: cog.redis.info("clients")["blocked_clients"] >= concurrency, 20, "the idle threads to block"
    )
    # On a server shared with other tests, their workers' waits count in
    # blocked_clients too: idle is also a moment with no look of this worker's.
    wait_for(
        lambda: not any(kind == "fetch script" for _, kind, _ in watch(cog, 0.4)),
        20,
        "the worker's first looks to end",
    )


def test_g9_several_queues_each_has_a_thread_waiting_and_nothing_polls(cog: CogEnv) -> None:
    idle_worker(cog, QUEUES, concurrency=10)
    seen = watch(cog, 2.5)
    kinds = Counter(kind for _, kind, _ in seen)
    # Ten idle threads on five queues: two waits of 1 s on each, renewed
    # without a look at the others, but when the two waits of two queues
    # end together (a look, then). A poll (FETCH_IDLE_MAX_INTERVAL is 0.2 s)
    # would show up as about fifty fetch scripts a second.
    assert kinds["blmove"] >= 20, seen
    assert kinds["fetch script"] <= 3, seen
    waited_on = Counter(key for _, kind, key in seen if kind == "blmove")
    k = get_keys()
    assert set(waited_on) == {k.queue(q) for q in QUEUES}, waited_on


def test_g9_a_push_to_any_queue_wakes_an_idle_worker_without_a_fetch_script(cog: CogEnv) -> None:
    idle_worker(cog, QUEUES, concurrency=10)
    jids: dict[str, str] = {}

    def push() -> None:
        for q in ("q3", "default", "q1"):
            jids[q] = jobs.record.set(queue=q).delay(q)
            wait_for(lambda q=q: any(n["jid"] == jids[q] for n in cog.notes()), 10, f"the job on {q}")

    seen = watch(cog, 3.0, push)
    notes = {n["jid"]: n for n in cog.notes()}
    assert set(notes) == set(jids.values())
    first_run = min(n["at"] for n in notes.values())
    # Each job was taken by the BLMOVE waiting on its queue: the fetch
    # scripts came after a job ran (each carries a finished job's ack), but
    # for a look when two waits end together.
    assert len([t for t, kind, _ in seen if kind == "fetch script" and t < first_run]) <= 2, seen
    assert Counter(kind for _, kind, _ in seen)["fetch script"] <= len(jids) + 3, seen


def test_g9_fewer_threads_than_queues_look_at_every_queue_after_each_wait(cog: CogEnv) -> None:
    idle_worker(cog, ["default", "mail", "low"], concurrency=1)
    seen = watch(cog, 3.5)
    kinds = Counter(kind for _, kind, _ in seen)
    # One thread, three queues: a wait of 1 s on one of them, then one look
    # at all three in order: about one of each a second, no faster.
    assert 2 <= kinds["blmove"] <= 5, seen
    assert 2 <= kinds["fetch script"] <= 5, seen
    mail = jobs.record_mail.delay("mail")
    low = jobs.record.set(queue="low").delay("low")
    wait_for(lambda: {n["jid"] for n in cog.notes()} == {mail, low}, 10, "both jobs")


def test_g9_weighted_queues_spread_the_waiting_threads_by_weight(cog: CogEnv) -> None:
    idle_worker(cog, ["a,3", "b,1"], concurrency=8)
    k = get_keys()
    seen = watch(cog, 2.5)
    waited_on = Counter(key for _, kind, key in seen if kind == "blmove")
    # Six threads wait on "a" and two on "b" (renewing each second).
    assert waited_on[k.queue("a")] >= 2 * waited_on[k.queue("b")] > 0, waited_on
    assert len([kind for _, kind, _ in seen if kind == "fetch script"]) <= 3, seen


def runs(cog: CogEnv) -> Counter[str]:
    return Counter(note["jid"] for note in cog.notes("runs"))


def spread(specs: list[str], threads: int) -> Waiters:
    """``threads`` idle threads entered, as a worker's would, one by one."""
    waiters = Waiters([parse_queue(spec) for spec in specs])
    names = [parse_queue(spec).name for spec in specs]
    for _ in range(threads):
        waiters.enter(names)
    return waiters


def test_a_thread_stays_on_its_queue_when_every_queue_has_its_share():
    waiters = spread(["a", "b", "c"], 6)  # two on each
    assert all(waiters.stays(q) for q in "abc")


def test_a_thread_does_not_stay_while_another_queue_has_no_thread_waiting():
    waiters = spread(["a", "b"], 2)
    waiters.leave("b")  # b's thread took a job
    assert not waiters.stays("a")
    waiters.enter(["a", "b"])
    assert waiters.stays("a") and waiters.stays("b")


def test_a_thread_moves_to_the_queue_that_lacks_threads_for_its_weight():
    waiters = spread(["a,3", "b,1"], 4)  # three on a, one on b
    assert waiters.stays("a") and waiters.stays("b")
    waiters.leave("a")
    waiters.enter(["b"])  # as after a burst on b: two on a, two on b
    assert not waiters.stays("b"), "a thread on b would go back to a (2/3 against 2/1)"
    assert waiters.stays("a")


def test_a_lone_thread_on_one_queue_stays():
    assert spread(["default"], 1).stays("default")


class Sends:
    """Every BLMOVE an in-process worker's threads send: the thread and
    the queue key, in order."""

    def __init__(self, monkeypatch: Any) -> None:
        self.seen: list[tuple[int, str]] = []
        self.retrieves = 0
        original, retrieve = BlockingConnections.blmove, ReliableFetch.retrieve

        def blmove(connections: Any, client: Any, source: str, *args: Any) -> Any:
            self.seen.append((threading.get_ident(), source))
            return original(connections, client, source, *args)

        def counted(fetch: ReliableFetch) -> Any:
            self.retrieves += 1
            return retrieve(fetch)

        monkeypatch.setattr(BlockingConnections, "blmove", blmove)
        monkeypatch.setattr(ReliableFetch, "retrieve", counted)

    def count(self) -> int:
        return len(self.seen)

    def last_by_thread(self) -> dict[int, str]:
        return dict(self.seen)


def test_g9_idle_threads_renew_their_waits_without_going_back_through_retrieve(cog, in_process, monkeypatch):
    """The waits of idle threads end each second, all together; a thread
    whose queue needs it no less renews its wait at once, in a few calls,
    rather than through retrieve(), whose calls then held the GIL and the
    CPU that the thread getting a job needed."""
    threads = 10
    cog.configure(QUEUES=QUEUES, CONCURRENCY=threads)
    sends = Sends(monkeypatch)
    in_process()
    sent = sends.count
    wait_for(lambda: len(sends.last_by_thread()) == threads, 15, "every thread to wait", sent)
    # From here, two renewals of each wait (about two seconds); a renewal
    # that went back through retrieve() would count one call of it each.
    seen, retrieves = sent(), sends.retrieves
    wait_for(lambda: sent() >= seen + 2 * threads, 15, "two renewals of each wait", sent)
    assert sends.retrieves - retrieves <= 1, (sends.retrieves - retrieves, sent() - seen)
    # A job on any queue still wakes a thread at once, and the threads keep their spread.
    jid = str(jobs.record_mail.set(queue="q3").delay("renewed"))
    wait_for(lambda: runs(cog)[jid], 10, "the job pushed to a queue waited on by renewed waits")


def test_g9_a_queue_paused_while_idle_threads_wait_on_it_is_left(cog, in_process, monkeypatch):
    """A thread renewing its wait reads the paused queues too: once a queue
    is paused, its threads wait on the others, and its jobs stay queued."""
    cog.configure(QUEUES=["default", "mail"], CONCURRENCY=2)
    sends = Sends(monkeypatch)
    in_process()
    mail = get_keys().queue("mail")
    wait_for(lambda: mail in sends.last_by_thread().values(), 10, "a thread waiting on the mail queue")
    wait_for(lambda: len(sends.seen) >= 4, 10, "a renewal of each thread's wait")
    cog.redis.sadd(get_keys().paused, "mail")
    paused_at = len(sends.seen)
    # The paused set is read again within a second, and each wait ends within one.
    wait_for(
        lambda: len(sends.seen) >= paused_at + 6 and mail not in sends.last_by_thread().values(),
        10,
        "the threads to leave the paused queue",
    )
    jid = str(jobs.record_mail.delay("paused"))
    before = len(sends.seen)
    wait_for(lambda: len(sends.seen) >= before + 2, 10, "a renewal of each wait after the push")
    assert not runs(cog)[jid]
    assert cog.redis.llen(mail) == 1
    cog.redis.srem(get_keys().paused, "mail")
    wait_for(lambda: runs(cog)[jid], 10, "the mail job, once unpaused")
