"""An idle processor thread's ``BLMOVE`` on a connection of the thread's own,
through the lean round trip (django_cogworker.direct_blocking), against
real redis-servers and real workers: the connection is the thread's and is
reused; the worker's stop closes it (CLIENT LIST); a demoted server
(READONLY) has it made again; a connection closed while idle is remade
before anything is sent on it; one killed while it waits, or whose reply
(a moved job) is lost, costs no job and runs none twice (G7); a short
``socket_timeout`` behaves as redis-py's own ``blmove`` with it; clients
that may not take the fast path keep ``client.blmove``."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker import connection, direct
from django_cogworker.direct_blocking import BlockingConnections
from django_cogworker.errors import is_full
from testproject.testapp import jobs
from tests.conftest import CogEnv, InProcessWorker, RedisServer, wait_for
from tests.proxy import PausableProxy
from tests.test_guarantees import keys, leftovers, runs


def blocked(cog: CogEnv, name: str) -> list[str]:
    """The addresses of the connections named ``name`` waiting in a BLMOVE."""
    return sorted(
        c["addr"]
        for c in cog.redis.client_list()
        if c.get("name") == name and c["cmd"] == "blmove" and "b" in c["flags"]
    )


def named(cog: CogEnv, name: str) -> list[dict[str, Any]]:
    return [c for c in cog.redis.client_list() if c.get("name") == name]


def addresses(holder: BlockingConnections) -> list[str]:
    """The local addresses of the holder's open connections, as CLIENT LIST says them."""
    found = []
    for conn in holder.connections():
        if conn._sock is not None:
            host, port = conn._sock.getsockname()[:2]
            found.append(f"{host}:{port}")
    return sorted(found)


def holder_of(worker: InProcessWorker) -> BlockingConnections:
    return worker.manager.context.blocking


def idle(cog: CogEnv, worker: InProcessWorker, name: str, threads: int) -> list[str]:
    """Waits until ``threads`` threads block in BLMOVE, each on its own connection."""
    wait_for(lambda: len(blocked(cog, name)) == threads, 20, f"{threads} threads to wait in BLMOVE")
    wait_for(lambda: blocked(cog, name) == addresses(holder_of(worker)), 10, "their own connections")
    return blocked(cog, name)


def test_an_idle_threads_blmove_goes_on_a_connection_of_its_own_kept_across_waits(
    cog: CogEnv, in_process: Callable[..., InProcessWorker]
) -> None:
    cog.configure(REDIS_OPTIONS={"client_name": "own"})
    worker = in_process(concurrency=2)
    first = idle(cog, worker, "own", 2)
    pool = connection.get_redis().connection_pool
    assert not set(holder_of(worker).connections()) & set(pool._available_connections)
    jid = str(jobs.record.delay("woke"))
    wait_for(lambda: runs(cog)[jid] == 1, 15, "the job to run")
    # Each thread waits again, a second later, on the same connection.
    wait_for(lambda: blocked(cog, "own") == first and worker.thread.is_alive(), 10, "the same connections")
    assert addresses(holder_of(worker)) == first


def test_the_workers_stop_closes_every_threads_blocking_connection(
    cog: CogEnv, in_process: Callable[..., InProcessWorker]
) -> None:
    cog.configure(REDIS_OPTIONS={"client_name": "stopping"})
    worker = in_process(concurrency=3)
    idle(cog, worker, "stopping", 3)
    worker.stop()
    assert holder_of(worker).connections() == []
    # Closed before stop() returned; the server drops them as it reads the close.
    wait_for(
        lambda: [c for c in named(cog, "stopping") if c["cmd"] == "blmove"] == [],
        5,
        "no BLMOVE connection left",
    )


def test_a_demoted_server_has_the_blocking_connections_made_again(
    cog: CogEnv, own_redis: Any, in_process: Callable[..., InProcessWorker], tmp_path: Path
) -> None:
    """READONLY (the server behind the URL is a replica now): as .delay()'s
    own connections, each thread's is closed and made again at its next
    BLMOVE, so that it resolves the address again."""
    own_redis()
    connection.reset()
    cog.configure(REDIS_OPTIONS={"client_name": "demoted"})
    worker = in_process(concurrency=2)
    before = idle(cog, worker, "demoted", 2)
    made = holder_of(worker).connections()
    (tmp_path / "master").mkdir()
    master = RedisServer(str(tmp_path / "master"))
    master.start()
    generation = direct.generation
    cog.redis.replicaof("127.0.0.1", master.port)
    try:
        wait_for(lambda: direct.generation > generation, 15, "a READONLY reply to drop the connections")
    finally:
        cog.redis.replicaof("NO", "ONE")
        master.stop()
    after = idle(cog, worker, "demoted", 2)
    assert not set(after) & set(before)
    assert all(conn._sock is None for conn in made if conn not in holder_of(worker).connections())
    jid = str(jobs.record.delay("after the failover"))
    wait_for(lambda: runs(cog)[jid] == 1, 15, "work to resume")


def test_a_connection_closed_while_idle_is_made_again_before_anything_is_sent_on_it(cog: CogEnv) -> None:
    """With no retry at all, a BLMOVE written to the dead socket would fail:
    the check before sending finds it closed, and a new one takes it."""
    cog.configure(REDIS_OPTIONS={"client_name": "idle-killed", "retry": Retry(NoBackoff(), 0)})
    connection.reset()
    client, k = connection.get_redis(), keys()
    holder = BlockingConnections()
    try:
        assert holder.blmove(client, k.queue("default"), k.inprogress("probe"), 0.01) is None
        (held,) = holder.connections()
        (address,) = addresses(holder)
        assert cog.redis.client_kill(address)
        wait_for(lambda: address not in [c["addr"] for c in named(cog, "idle-killed")], 5, "the kill")
        calls = int(cog.redis.info("commandstats").get("cmdstat_blmove", {}).get("calls", 0))
        cog.redis.lpush(k.queue("default"), b"job")
        assert holder.blmove(client, k.queue("default"), k.inprogress("probe"), 1) == b"job"
        assert int(cog.redis.info("commandstats")["cmdstat_blmove"]["calls"]) == calls + 1
        assert holder.connections() == [held] and addresses(holder) != [address]
    finally:
        holder.close_all()


def test_g7_a_connection_killed_while_it_waits_costs_no_job_and_runs_none_twice(
    cog: CogEnv, in_process: Callable[..., InProcessWorker]
) -> None:
    cog.configure(REDIS_OPTIONS={"client_name": "killed"})
    worker = in_process(concurrency=2)
    for address in idle(cog, worker, "killed", 2):
        cog.redis.client_kill(address)
    jids = [str(jobs.record.delay(f"after the kill {n}")) for n in range(6)]
    wait_for(lambda: all(runs(cog)[j] for j in jids), 20, "every job to run")
    idle(cog, worker, "killed", 2)
    more = [str(jobs.record.delay(f"later {n}")) for n in range(3)]
    wait_for(lambda: all(runs(cog)[j] for j in more), 20, "the later jobs to run")
    worker.stop()
    assert runs(cog) == Counter(dict.fromkeys(jids + more, 1))
    assert leftovers(cog) == {}


class ResettableProxy(PausableProxy):
    def reset(self) -> None:
        """Closes the worker's side of every connection made so far: what a
        cut holds (a reply Redis wrote) is lost, as when a connection resets."""
        with self._lock:
            made = list(self._sockets)  # all closed by close(), the server's sides too
        for sock in made[0::2]:  # (client, server) pairs: the client's side
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def test_g7_a_job_moved_by_a_blmove_whose_reply_is_lost_runs_exactly_once(
    cog: CogEnv, own_redis: Any
) -> None:
    """Redis moves a job into the worker's list for its waiting BLMOVE, and
    the reply never arrives (the connection resets meanwhile): no thread
    holds the job, so the stray check puts it back (G7), and it runs once."""
    server = own_redis()
    r, k = cog.redis, keys()
    with ResettableProxy(server.port) as proxy:
        worker = cog.start_worker("-c", "1", REDIS_URL=proxy.url, REDIS_OPTIONS={"client_name": "lost"})
        mine = k.inprogress(worker.identity())
        wait_for(lambda: len(blocked(cog, "lost")) == 1, 20, "the thread to wait in BLMOVE")
        proxy.cut()
        try:
            jid = str(jobs.record.delay("reply lost"))
            wait_for(lambda: r.llen(mine) == 1, 10, "Redis to move the job for the waiting BLMOVE")
            proxy.reset()
        finally:
            proxy.heal()
        wait_for(lambda: runs(cog)[jid], 30, "the stray to be requeued and run")
        later = str(jobs.record.delay("after"))
        wait_for(lambda: runs(cog)[later], 20, "the next job")
        assert runs(cog) == Counter({jid: 1, later: 1})
        wait_for(lambda: leftovers(cog) == {}, 15, "nothing left")
        worker.signal(15)
        assert worker.wait(15) == 0


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "redis-py"])
def test_a_socket_timeout_shorter_than_the_wait_still_runs_every_job_once(
    cog: CogEnv, fast_path: bool
) -> None:
    """BLMOVE waits 1 s on the server; the client's socket_timeout of 0.5 s
    ends each wait early, as it ends redis-py's own ``blmove``: the worker
    still runs every job, once, either way."""
    cog.configure(REDIS_OPTIONS={"socket_timeout": 0.5, "client_name": "short"}, FAST_PATH=fast_path)
    worker = cog.start_worker("-c", "2")
    worker.identity()
    jids = []
    for n in range(4):
        wait_for(lambda: len(blocked(cog, "short")) >= 1, 20, "a thread to wait in BLMOVE")
        jids.append(str(jobs.record.delay(f"short {n}")))
        wait_for(lambda: runs(cog)[jids[-1]], 20, "the job to run")
    assert runs(cog) == Counter(dict.fromkeys(jids, 1))
    wait_for(lambda: leftovers(cog) == {}, 15, "nothing left")


def test_fast_path_false_and_other_clients_keep_redis_pys_blmove(cog: CogEnv, own_redis: Any) -> None:
    own_redis()
    k = keys()
    single = redis.Redis.from_url(cog.url, single_connection_client=True)
    holder = BlockingConnections()
    try:
        single.lpush(k.queue("default"), b"one")
        assert holder.blmove(single, k.queue("default"), k.inprogress("probe"), 0.01) == b"one"
        cog.configure(FAST_PATH=False)
        connection.reset()
        cog.redis.lpush(k.queue("default"), b"two")
        client = connection.get_redis()
        assert holder.blmove(client, k.queue("default"), k.inprogress("probe"), 0.01) == b"two"
        assert holder.connections() == []
    finally:
        single.close()
        holder.close_all()


def test_a_full_redis_refusing_blmove_raises_its_oom_reply_and_keeps_the_connection(
    cog: CogEnv, own_redis: Any
) -> None:
    """fetch's ``is_full`` branch must see the refusal (it then polls)."""
    own_redis(extra=["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"])
    connection.reset()
    k, client = keys(), connection.get_redis()
    holder = BlockingConnections()
    try:
        assert holder.blmove(client, k.queue("default"), k.inprogress("probe"), 0.01) is None
        (held,) = holder.connections()
        with contextlib.suppress(redis.ResponseError):
            for n in range(1000):
                cog.redis.set(k.queue(f"filler{n}"), b"x" * 20_000)
        with pytest.raises(redis.ResponseError) as refused:
            holder.blmove(client, k.queue("default"), k.inprogress("probe"), 0.01)
        assert is_full(refused.value)
        assert holder.connections() == [held] and held._sock is not None
    finally:
        holder.close_all()


def test_a_stop_while_a_thread_waits_closes_its_connection_when_the_wait_ends(cog: CogEnv) -> None:
    """Its BLMOVE is not cut short (a reply cut off would be sent again on
    a new connection after the stop): the thread closes it, and from then
    on the holder makes no connection."""
    cog.configure(REDIS_OPTIONS={"client_name": "in-flight"})
    connection.reset()
    client, k = connection.get_redis(), keys()
    holder = BlockingConnections()
    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.append(holder.blmove(client, k.queue("default"), k.inprogress("probe"), 1))
    )
    waiter.start()
    try:
        wait_for(lambda: len(blocked(cog, "in-flight")) == 1, 10, "the thread to wait in BLMOVE")
        (address,) = blocked(cog, "in-flight")
        holder.close_all()
        assert blocked(cog, "in-flight") == [address]  # still waiting, on the same connection
        waiter.join(10)
        assert got == [None] and holder.connections() == []
        wait_for(lambda: named(cog, "in-flight") == [], 5, "its connection to close")
        cog.redis.lpush(k.queue("default"), b"after")
        assert holder.blmove(client, k.queue("default"), k.inprogress("probe"), 1) == b"after"
        assert holder.connections() == []
    finally:
        waiter.join(10)
