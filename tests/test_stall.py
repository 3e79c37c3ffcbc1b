"""Redis itself stalls or goes away while workers run.

A stall (``DEBUG SLEEP``) longer than ORPHAN_THRESHOLD lets every presence
key expire and every beat stamp age while the owners live: G2 must not take
them for dead. An outage (the server stopped, then started again) must cost
the log one line when it starts and one when it ends, per process (SPEC
section 8), however many passes of however many threads fail meanwhile.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections import Counter

import redis

from testproject.testapp import jobs
from tests.conftest import CogEnv, wait_for
from tests.test_guarantees import keys, leftovers, runs


def started(cog: CogEnv) -> set[str]:
    return {n["jid"] for n in cog.notes("started")}


def stall(cog: CogEnv, seconds: float) -> threading.Thread:
    """DEBUG SLEEP from a client of its own, in a thread: Redis answers no
    one for ``seconds``."""

    def sleep() -> None:
        with redis.Redis.from_url(cog.url, socket_timeout=seconds + 10) as client:
            client.execute_command("DEBUG", "SLEEP", seconds)

    thread = threading.Thread(target=sleep, daemon=True)
    thread.start()
    return thread


#: Settings under which a stall fakes deaths: calls time out during it
#: (socket_timeout, as production settings often have), so an owner's
#: beat fails and its heartbeat waits an interval before the next, while
#: the other processes' orphan checks, every 0.2 s, come first.
SLOW_BEATS = {
    "HEARTBEAT_INTERVAL": 1.5,
    "HEARTBEAT_TTL": 2,
    "ORPHAN_THRESHOLD": 2,
    "ORPHAN_CHECK_INTERVAL": 0.2,
    "REDIS_OPTIONS": {"socket_timeout": 0.5},
}
STALL_S = 3.0


def test_g2_a_redis_stall_longer_than_the_threshold_takes_no_live_process_for_dead(cog, own_redis):
    own_redis()
    cog.configure(CONCURRENCY=2, **SLOW_BEATS)
    jids = [str(jobs.sleep_then_record.delay(8.0, i)) for i in range(6)]
    workers = [cog.start_worker() for _ in range(3)]
    wait_for(lambda: started(cog) == set(jids), 20, "three workers to run two long jobs each")
    lists = {w.identity(): w for w in workers}
    stall(cog, STALL_S).join(STALL_S + 10)
    # The owners beat again and keep their jobs; none is run a second time.
    wait_for(lambda: set(runs(cog)) == set(jids), 20, "the long jobs to end")
    time.sleep(1.0)
    assert runs(cog) == Counter({jid: 1 for jid in jids})
    for worker in workers:
        assert "left in progress by dead process" not in worker.log(), worker.log()
    # Each job's ack rides its thread's next fetch, after its note.
    for identity in lists:
        wait_for(lambda i=identity: not cog.redis.exists(keys().inprogress(i)), 10, f"{identity}'s acks")
    assert runs(cog) == Counter({jid: 1 for jid in jids})
    assert leftovers(cog) == {}
    assert {i.decode() for i in cog.redis.smembers(keys().processes)} == set(lists)
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait(15) == 0


def test_g2_after_a_stall_a_process_that_really_died_is_still_recovered(cog, own_redis):
    """The stall check delays recovery, it does not stop it: a process
    SIGKILLed during the stall has its jobs back soon after."""
    own_redis()
    cog.configure(CONCURRENCY=2, **SLOW_BEATS)
    victim = cog.start_worker()
    jids = [str(jobs.block_first_run.delay(30, i)) for i in range(2)]
    wait_for(lambda: started(cog) == set(jids), 20, "the victim to start both jobs")
    survivor = cog.start_worker()
    survivor.identity()
    sleeper = stall(cog, STALL_S)
    time.sleep(0.3)
    victim.signal(signal.SIGKILL)
    victim.wait(10)
    sleeper.join(STALL_S + 10)
    wait_for(lambda: set(runs(cog)) == set(jids), 30, "the survivor to run the victim's jobs")
    # The housekeeper logs the recovery after its script requeued the jobs,
    # which the survivor's other threads may have run meanwhile.
    wait_for(lambda: "left in progress by dead process" in survivor.log(), 10, "the recovery logged")
    wait_for(lambda: leftovers(cog) == {}, 10, "nothing left")


def log_lines_between(log: str, start: float, end: float) -> list[str]:
    """The log lines stamped within [start, end] (epoch seconds)."""
    lines = []
    for line in log.splitlines():
        match = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) (\w+) ", line)
        if not match:
            continue
        at = time.mktime(time.strptime(match[1], "%Y-%m-%d %H:%M:%S")) + int(match[2]) / 1000
        if start <= at <= end:
            lines.append(line)
    return lines


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends_per_process(cog, own_redis):
    server = own_redis(appendonly=True)
    cog.configure(QUEUES=["default", "mail"])  # both fetch paths: script polling and the idle backoff
    worker = cog.start_worker("-c", "4")
    worker.identity()
    jids = [str(jobs.record.delay(i)) for i in range(20)]
    wait_for(lambda: set(runs(cog)) == set(jids), 15, "the first jobs")
    down_at = time.time()
    server.stop(signal.SIGKILL)
    # Long enough for every role to fail many times: processors, heartbeat,
    # poller, ticker, housekeeper (orphan checks every 0.5 s).
    time.sleep(4.0)
    server.start()
    later = [str(jobs.record.delay(i)) for i in range(20)]
    wait_for(lambda: set(runs(cog)) >= set(later), 20, "jobs after the outage")
    time.sleep(1.0)
    lines = [
        line
        for line in log_lines_between(worker.log(), down_at - 0.5, time.time())
        if " WARNING " in line or " ERROR " in line or " CRITICAL " in line
    ]
    assert len(lines) == 2, "\n".join(lines)
    assert "Redis unreachable" in lines[0]
    assert "Redis reachable again" in lines[1]
    assert "Traceback" not in worker.log()
    assert worker.alive()
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert leftovers(cog) == {}
