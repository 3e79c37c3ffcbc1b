"""G18 for the jobs Redis hands a silent process: its threads' fetches were
sent before it went silent, and their replies are read only once it is
back. Meanwhile the jobs sat on its in-progress list, were recovered and ran
elsewhere; the process must not start them a second time.

Three ways to be silent: a real SIGSTOP while idle threads block in BLMOVE;
a network cut (a proxy that stops forwarding, the connections left open)
past ORPHAN_THRESHOLD; and, in the test process where the moment can be
aimed, a thread held between sending a fetch and reading its reply while
its heartbeat fails.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from django_cogworker.conf import get_config
from django_cogworker.direct_blocking import BlockingConnections
from django_cogworker.fetch import BLOCKING_TIMEOUT_S, ReliableFetch
from django_cogworker.heartbeat import Heartbeat
from django_cogworker.process import Registration, open_process
from django_cogworker.recovery import FORGET_MARGIN_S, FORGOTTEN_KEEP_S, Recovery
from testproject.testapp import jobs
from tests.conftest import CogEnv, Worker, wait_for
from tests.proxy import PausableProxy
from tests.test_guarantees import keys, leftovers, plant_dead_identity, runs
from tests.test_revival import HeldThread

NOT_STARTED = "not starting a job fetched"


def blocked_in_blmove(cog: CogEnv, name: str) -> int:
    """Connections named ``name`` waiting in a BLMOVE on the server."""
    clients = cog.redis.client_list()
    return sum(1 for c in clients if c.get("name") == name and c["cmd"] == "blmove" and "b" in c["flags"])


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped: a SIGSTOP is delivered to
    a thread running on another CPU a moment after ``kill()`` returns, and a
    reply read in that moment is a job started before the stop."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            states.append(stat.read_text().rpartition(")")[2].split()[0])
        except OSError:
            continue  # a thread that just ended
    return bool(states) and all(state in ("T", "t") for state in states)


def hand_jobs_to_blocked_threads(cog: CogEnv, tag: str) -> list[str]:
    """More jobs than all the blocked threads of the two workers: Redis hands
    one to each thread still waiting, the silent worker's included."""
    return [str(j) for j in jobs.record.delay_many([((f"{tag}-{i}",), {}) for i in range(12)])]


def late_replies_dealt_with(cog: CogEnv, a: Worker, jids: list[str], dropped: int) -> Callable[[], bool]:
    """True once the silent worker logged ``dropped`` fetched jobs as not
    started, or once one of the jobs ran twice (the failure)."""

    def check() -> bool:
        ran = runs(cog)
        return a.log().count(NOT_STARTED) >= dropped or any(ran[j] > 1 for j in jids)

    return check


def test_g18_jobs_handed_to_a_stopped_process_in_blmove_are_not_started_on_sigcont(cog):
    """Several rounds: A's four idle threads wait in BLMOVE, A is stopped,
    jobs come; Redis moves one into A's list per waiting thread; B recovers
    them past the threshold and runs them; A is continued and reads the
    replies of its fetches. Every job runs exactly once."""
    cog.configure(CONCURRENCY=4)
    r, k = cog.redis, keys()
    a = cog.start_worker(REDIS_OPTIONS={"client_name": "stopped"})
    b = cog.start_worker()
    a_list = k.inprogress(a.identity())
    b.identity()
    landed_total, dropped, every = 0, 0, []
    for round_ in range(3):
        wait_for(lambda: blocked_in_blmove(cog, "stopped") == 4, 20, "A's four threads to wait in BLMOVE")
        a.signal(signal.SIGSTOP)
        try:
            wait_for(lambda: all_threads_stopped(a.pid), 5, "A to be stopped")
            jids = hand_jobs_to_blocked_threads(cog, f"round{round_}")
            every += jids
            landed = int(r.llen(a_list))
            wait_for(
                lambda: all(runs(cog)[j] for j in jids) and r.llen(a_list) == 0,  # noqa: B023
                30,
                "B to recover A's jobs and run every one",
            )
        finally:
            a.signal(signal.SIGCONT)
        landed_total += landed
        dropped += landed
        wait_for(late_replies_dealt_with(cog, a, jids, dropped), 15, "A to read its replies from the stop")
        twice = [j for j in jids if runs(cog)[j] > 1]
        assert not twice, f"round {round_}: {landed} jobs handed to A, these ran twice: {twice}"
    print(f"\nG18, BLMOVE under SIGSTOP: {landed_total} jobs handed to the stopped process in 3 rounds")
    assert landed_total >= 3, "few jobs reached the stopped process: the test proved little"
    assert runs(cog) == Counter(dict.fromkeys(every, 1))
    wait_for(lambda: leftovers(cog) == {}, 15, "nothing left")


def test_g18_jobs_handed_to_a_cut_off_worker_are_not_started_when_the_network_heals(cog, own_redis):
    """A's connections go through a proxy that stops forwarding both ways
    (sockets open, as when packets are dropped) past ORPHAN_THRESHOLD: the
    jobs Redis moved into A's list for its waiting BLMOVEs are recovered and
    run by B; when the cut heals, A reads the replies and starts none."""
    cog.configure(CONCURRENCY=4)
    server = own_redis()
    r, k = cog.redis, keys()
    with PausableProxy(server.port) as proxy:
        a = cog.start_worker(REDIS_URL=proxy.url, REDIS_OPTIONS={"client_name": "cut"})
        b = cog.start_worker()
        a_list = k.inprogress(a.identity())
        b.identity()
        wait_for(lambda: blocked_in_blmove(cog, "cut") == 4, 20, "A's four threads to wait in BLMOVE")
        proxy.cut()
        try:
            jids = hand_jobs_to_blocked_threads(cog, "cut")
            landed = int(r.llen(a_list))
            wait_for(
                lambda: all(runs(cog)[j] for j in jids) and r.llen(a_list) == 0,
                30,
                "B to recover A's jobs and run every one",
            )
        finally:
            proxy.heal()
        wait_for(late_replies_dealt_with(cog, a, jids, landed), 20, "A to read the replies held by the cut")
        print(f"\nG18, BLMOVE across a network cut: {landed} jobs handed to the cut-off worker")
        assert landed >= 1, "no job reached the cut-off worker: the test proved nothing"
        assert runs(cog) == Counter(dict.fromkeys(jids, 1))
        wait_for(lambda: leftovers(cog) == {}, 15, "nothing left")
        for worker in (a, b):
            worker.signal(signal.SIGTERM)
        assert a.wait(15) == 0 and b.wait(15) == 0


@pytest.mark.parametrize(
    ("queues", "owner", "name"),
    [(["default"], BlockingConnections, "blmove"), (["default", "mail"], ReliableFetch, "fetch_script")],
    ids=["blmove", "multi-queue-script"],
)
def test_g18_a_fetch_reply_read_after_the_silence_is_not_started(
    cog, in_process, monkeypatch, worker_log, queues, owner, name
):
    # Multi-queue: the one thread waits on "default" (first in order), so a
    # job on "mail" comes in the look at every queue after a wait: the script.
    job = jobs.record if name == "blmove" else jobs.record_mail
    r, k = cog.redis, keys()
    cog.configure(QUEUES=queues, REDIS_OPTIONS={"client_name": "held"})
    held = HeldThread(monkeypatch, owner, name)
    a = in_process(concurrency=1)
    wait_for(lambda: r.hexists(k.last_beat, a.identity), 15, "A to beat")
    if name == "blmove":
        wait_for(lambda: blocked_in_blmove(cog, "held") == 1, 15, "A's thread to wait in BLMOVE")
    jid = str(job.delay("reply read late"))
    assert held.fetched.wait(15), "A did not fetch the job"
    b = cog.start_worker("-c", "1")
    wait_for(lambda: runs(cog)[jid], 20, "B to recover and run the job")
    held.release.set()  # A reads the reply now
    wait_for(lambda: NOT_STARTED in worker_log.text or runs(cog)[jid] > 1, 10, "A to deal with the reply")
    a.stop()
    # B acknowledges the recovered job just after its note.
    b_list = k.inprogress(b.identity())
    wait_for(lambda: not r.exists(b_list), 10, "B's ack")
    assert runs(cog) == Counter({jid: 1})
    assert [n["pid"] for n in cog.notes() if n["jid"] == jid] == [b.pid]
    assert leftovers(cog) == {}
    assert a.manager.running_counter() == Counter(), "A still holds the job it did not start"


def test_g18_an_ownership_answer_read_after_a_silence_is_asked_for_again(
    cog, in_process, monkeypatch, worker_log
):
    """The LPOS that checks a job fetched long ago said "ours", but its
    answer is read only after a silence in which the job was recovered and
    run elsewhere: the thread asks again, and drops the job."""
    r, k = cog.redis, keys()
    original_retrieve = ReliableFetch.retrieve

    def retrieve(fetcher: ReliableFetch) -> Any:
        work = original_retrieve(fetcher)
        if work is not None:
            work.fetched_at -= 60  # as if its fetch had been sent long ago: checked before it starts
        return work

    monkeypatch.setattr(ReliableFetch, "retrieve", retrieve)
    held = HeldThread(monkeypatch, ReliableFetch, "still_owned")
    a = in_process(concurrency=1)
    wait_for(lambda: r.hexists(k.last_beat, a.identity), 15, "A to beat")
    jid = str(jobs.record.delay("ownership answer read late"))
    assert held.fetched.wait(15), "A did not check the job"
    b = cog.start_worker("-c", "1")
    wait_for(lambda: runs(cog)[jid], 20, "B to recover and run the job")
    held.release.set()  # A reads the answer "ours" now
    wait_for(lambda: NOT_STARTED in worker_log.text or runs(cog)[jid] > 1, 10, "A to deal with the answer")
    a.stop()
    # B acknowledges the recovered job just after its note.
    b_list = k.inprogress(b.identity())
    wait_for(lambda: not r.exists(b_list), 10, "B's ack")
    assert runs(cog) == Counter({jid: 1})
    assert [n["pid"] for n in cog.notes() if n["jid"] == jid] == [b.pid]
    assert leftovers(cog) == {}


def test_g18_a_silent_process_fetches_nothing_into_a_list_recovery_forgot(cog, in_process, monkeypatch):
    """A's heartbeat fails (as when it is stopped, or resumed for a moment
    between two stops: its beat not yet sent), long enough for B to recover
    A and forget its registration. A job comes: A's thread, which would be
    stopped again right after its fetch, must not have moved it into A's
    list, where no recovery looks any more. Every sample: the job is on A's
    list only while A is registered. Then A beats again and runs it once."""
    r, k = cog.redis, keys()
    silent = threading.Event()
    original_beat, original_retrieve = Heartbeat.beat, ReliableFetch.retrieve

    def beat(heartbeat: Heartbeat) -> Any:
        if silent.is_set():
            raise redis.ConnectionError("this process is stopped")
        return original_beat(heartbeat)

    def retrieve(fetcher: ReliableFetch) -> Any:
        work = original_retrieve(fetcher)
        while work is not None and silent.is_set():
            time.sleep(0.01)  # stopped again, the job in its hand
        return work

    monkeypatch.setattr(Heartbeat, "beat", beat)
    monkeypatch.setattr(ReliableFetch, "retrieve", retrieve)
    a = in_process(concurrency=1)
    a_list = k.inprogress(a.identity)
    wait_for(lambda: r.hexists(k.last_beat, a.identity), 15, "A to beat")
    silent.set()
    cog.start_worker("-c", "1", QUEUES=["mail"])  # recovers A; takes nothing from "default"
    wait_for(
        lambda: not r.sismember(k.inprogress_identities, a.identity),
        30,
        "B to recover A and forget its registration",
    )
    jid = str(jobs.record.delay("while A is silent"))
    stray = []
    watch_until = time.monotonic() + 3.0  # three of A's blocking fetches, had it sent them
    while time.monotonic() < watch_until:
        held = r.llen(a_list)
        if held and not r.sismember(k.inprogress_identities, a.identity):
            stray.append(held)
        time.sleep(0.01)
    assert not stray, "a job sat on the list of a forgotten process, where no recovery looks"
    assert r.llen(k.queue("default")) == 1, "the silent process took the job"
    resume_and_run_once(cog, a, silent, jid)


def resume_and_run_once(cog: CogEnv, a: Any, silent: threading.Event, jid: str) -> None:
    """A beats again: it runs the job once, and leaves nothing behind."""
    silent.clear()
    wait_for(lambda: runs(cog)[jid], 20, "A to beat again and run the job")
    a.stop()
    assert runs(cog) == Counter({jid: 1})
    assert leftovers(cog) == {}


def stop_between_check_and_send(
    cog: CogEnv, monkeypatch: pytest.MonkeyPatch, in_process: Any, in_hand: Callable[[Any], None]
) -> tuple[Any, threading.Event, threading.Event]:
    """Starts A in this process (one thread) and, once it has beaten, holds
    its thread right after its next registration check, then fails its
    beats: a stop between the check and the send of a fetch. Returns (A,
    ``silent``: A's beats fail while set, ``resumed``: set it to let the
    fetch go). The job that fetch brings is handed to ``in_hand`` before the
    thread goes on with it."""
    silent, armed, held, resumed = (threading.Event() for _ in range(4))
    original_beat, original_retrieve = Heartbeat.beat, ReliableFetch.retrieve
    original_awaited = Registration.awaited

    def beat(heartbeat: Heartbeat) -> Any:
        if silent.is_set():
            raise redis.ConnectionError("this process is stopped")
        return original_beat(heartbeat)

    def awaited(registration: Registration, quiet: threading.Event) -> bool:
        fresh = original_awaited(registration, quiet)
        if fresh and armed.is_set():
            armed.clear()
            held.set()
            resumed.wait(60)  # stopped after the check, before the send
        return fresh

    def retrieve(fetcher: ReliableFetch) -> Any:
        work = original_retrieve(fetcher)
        if work is not None and resumed.is_set():
            in_hand(work)
        return work

    monkeypatch.setattr(Heartbeat, "beat", beat)
    monkeypatch.setattr(Registration, "awaited", awaited)
    monkeypatch.setattr(ReliableFetch, "retrieve", retrieve)
    a = in_process(concurrency=1)
    wait_for(lambda: cog.redis.hexists(keys().last_beat, a.identity), 15, "A to beat")
    armed.set()
    wait_for(held.is_set, 15, "A's thread to pass the registration check")
    silent.set()
    return a, silent, resumed


def test_g18_a_fetch_decided_before_a_stop_and_sent_after_it_fills_a_forgotten_list_that_recovery_takes_back(
    cog, in_process, monkeypatch
):
    """A's thread passes the registration check, then A goes silent before
    the fetch is sent (held there, its beats failing: a stop between the two)
    long enough for B to recover A and forget it. A resumes for a moment: the
    fetch goes out and moves a job onto A's list, and A is silent again with
    the job in its hand, its first beat not sent. B must register A again
    and, A still silent past ORPHAN_THRESHOLD, put the job back on its queue;
    before, the job stayed on the list of a forgotten process, where no
    recovery looked, for as long as A stayed silent. When A resumes for good
    it does not start the job it holds (another may have run it): it runs
    it once, from the queue."""
    r, k = cog.redis, keys()

    def in_hand(work: Any) -> None:
        while silent.is_set():
            time.sleep(0.01)  # stopped again, the job in its hand

    a, silent, resumed = stop_between_check_and_send(cog, monkeypatch, in_process, in_hand)
    a_list = k.inprogress(a.identity)
    b = cog.start_worker("-c", "1", QUEUES=["mail"])  # recovers A; takes nothing from "default"
    wait_for(
        lambda: r.zscore(k.forgotten, a.identity) is not None,
        30,
        "B to recover A and forget it",
    )
    assert not r.sismember(k.inprogress_identities, a.identity)
    jid = str(jobs.record.delay("fetched into a forgotten list"))
    resumed.set()
    wait_for(lambda: r.llen(a_list) == 1, 15, "A's late fetch to move the job onto its list")
    wait_for(
        lambda: r.llen(a_list) == 0 and r.llen(k.queue("default")) == 1,
        30,
        "B to take the job back from the forgotten process's list",
    )
    assert "forgotten as dead, holds jobs on its in-progress list again" in b.log()
    assert runs(cog)[jid] == 0
    resume_and_run_once(cog, a, silent, jid)


def test_g18_a_fetch_sent_with_a_stale_registration_is_checked_after_a_beat_before_its_job_starts(
    cog, in_process, monkeypatch
):
    """A stop between a thread's registration check and its send: the fetch
    goes out the moment A resumes, before A's first beat, and its reply
    comes back at once. A recovery that falls in between (A still looks
    dead) takes the job back. The job must not start on its quick reply: it
    counts as fetched at A's last beat, and starts only if, once a beat has
    registered A again, it is still on A's list. Before, it started at once
    and ran twice (here and from its queue)."""
    r, k = cog.redis, keys()
    config = get_config()
    fetched, go = threading.Event(), threading.Event()

    def in_hand(work: Any) -> None:
        if not fetched.is_set():
            fetched.set()
            go.wait(60)  # the reply read; a recovery lands before the job starts

    a, silent, resumed = stop_between_check_and_send(cog, monkeypatch, in_process, in_hand)
    a_list = k.inprogress(a.identity)

    def silent_for_s() -> float:
        seconds, micros = r.time()
        return seconds + micros / 1e6 - float(r.hget(k.last_beat, a.identity) or 0)

    wait_for(
        lambda: not r.exists(k.process(a.identity)) and silent_for_s() > config.orphan_threshold_s + 0.2,
        15,
        "A to look dead",
    )
    jid = str(jobs.record.delay("fetched the moment A resumed"))
    resumed.set()
    wait_for(fetched.is_set, 15, "A's late fetch to bring the job")
    assert r.llen(a_list) == 1
    # Another worker's recovery pass, aimed at this moment (the others beat).
    seconds, _ = r.time()
    r.hset(k.beats, mapping={"last": seconds, "since": seconds - 60})
    Recovery(open_process(config, "host:8:recovery")).recover_orphans()
    assert r.llen(a_list) == 0 and r.llen(k.queue("default")) == 1, "the recovery did not take the job back"
    silent.clear()
    go.set()
    wait_for(lambda: runs(cog)[jid], 20, "A to run the job from its queue")
    wait_for(lambda: leftovers(cog) == {}, 15, "the job's ack")
    a.stop()
    assert runs(cog) == Counter({jid: 1})


def test_g18_recovery_looks_for_a_forgotten_process_only_for_a_while_and_only_at_a_list_with_jobs(cog):
    """remember.lua registers a forgotten process again only when its list
    holds jobs and no beat registered it meanwhile; the forgotten set keeps
    a process for FORGOTTEN_KEEP_S."""
    r, k = cog.redis, keys()
    recovery = Recovery(open_process(get_config(), "host:8:recovery"))
    now = time.time()
    r.zadd(
        k.forgotten,
        {
            "host:1:empty": now,
            "host:2:refilled": now,
            "host:3:beat": now,
            "host:4:long-ago": now - FORGOTTEN_KEEP_S - 5,
        },
    )
    r.rpush(k.inprogress("host:2:refilled"), b"job")
    r.rpush(k.inprogress("host:3:beat"), b"job")
    r.rpush(k.inprogress("host:4:long-ago"), b"job")
    r.sadd(k.inprogress_identities, "host:3:beat")
    assert recovery.remember_refilled(["host:3:beat"]) == 1
    assert r.smembers(k.inprogress_identities) == {b"host:2:refilled", b"host:3:beat"}
    assert r.hexists(k.last_beat, "host:2:refilled")
    assert r.zrange(k.forgotten, 0, -1) == [b"host:1:empty"]
    r.delete(*(k.inprogress(i) for i in ("host:2:refilled", "host:3:beat", "host:4:long-ago")))
    r.delete(k.forgotten, k.inprogress_identities, k.last_beat)


@pytest.mark.parametrize(
    ("state", "forgotten"),
    [
        ("a beat landed since", False),
        ("silent for less than the span", False),
        ("silent past the span", True),
    ],
)
def test_g18_recovery_forgets_a_process_only_when_no_fetch_of_its_own_can_fill_its_list(
    cog, state, forgotten
):
    """Recovered (its list empty), the process is forgotten only when it has
    no presence key (a beat that came after the recovery keeps it, decided
    atomically with the forget) and its last beat is older than
    HEARTBEAT_TTL plus a blocking fetch's wait plus slack."""
    r, k = cog.redis, keys()
    config = get_config()
    span_s = config.heartbeat_ttl_s + BLOCKING_TIMEOUT_S + FORGET_MARGIN_S
    identity = "host:7:forget"
    age_s = span_s + 5 if state != "silent for less than the span" else span_s - 1.5
    plant_dead_identity(cog, identity, [], beat_age_s=age_s)
    r.sadd(k.processes, identity)
    if state == "a beat landed since":
        r.set(k.process(identity), "alive", ex=30)
    Recovery(open_process(config, "host:8:recovery")).forget_if_empty(identity)
    assert r.sismember(k.inprogress_identities, identity) != forgotten
    assert r.sismember(k.processes, identity) != forgotten
    assert r.hexists(k.last_beat, identity) != forgotten
    assert (r.zscore(k.forgotten, identity) is not None) == forgotten  # looked for a while yet
