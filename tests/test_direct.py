"""``.delay()``'s LPUSH and the worker's fetch call on connections of their
own (django_cogworker.direct), against a redis-server of the test's own: the
connections are reused and bounded, a killed one costs no job and no second
copy, an error reply keeps its connection, a flushed script cache is
reloaded on the same call, a forked child never writes on its parent's
sockets, and Sentinel, Cluster and pipeline clients keep redis-py's way.
The lean round trip packs as redis-py does and reads every kind of reply as
it does: an error, a due health check, a RESP3 push ahead of the reply."""

from __future__ import annotations

import json
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from django_cogworker import client, connection, direct
from django_cogworker.errors import EnqueueRefused, RedisUnavailable
from django_cogworker.scripts import script
from testproject.testapp import jobs
from tests.conftest import CogEnv, RedisServer


@pytest.fixture
def plain(cog: CogEnv, own_redis: Any) -> CogEnv:
    own_redis()
    connection.reset()
    return cog


def tags(cog: CogEnv) -> list[object]:
    raws = cog.redis.lrange(cog.key("queue:default"), 0, -1)
    return sorted(json.loads(raw)["args"][0] for raw in raws)


def clients(cog: CogEnv) -> int:
    return len(cog.redis.client_list())


def stack_of(cog: CogEnv) -> Any:
    stack = direct._stack
    assert stack is not None and stack.pool is connection.get_redis().connection_pool
    return stack


def test_a_delay_to_a_registered_queue_goes_on_one_connection_of_its_own_again(plain: CogEnv) -> None:
    jobs.record.delay(0)  # registers the queue: a SADD first, on the same connection
    jobs.record.delay(1)
    before = clients(plain)
    for tag in range(2, 12):
        jobs.record.delay(tag)
    assert tags(plain) == list(range(12))
    assert clients(plain) == before
    stack = stack_of(plain)
    assert stack.usable and len(stack.idle) == 1
    assert stack.idle[0] not in connection.get_redis().connection_pool._available_connections


def test_a_process_that_only_enqueues_holds_one_connection_registration_included(plain: CogEnv) -> None:
    before = clients(plain)
    for tag in range(3):
        jobs.record.delay(tag)  # the first registers the queue
    assert tags(plain) == [0, 1, 2]
    assert plain.redis.smembers(plain.key("queues")) == {b"default"}
    assert clients(plain) == before + 1
    # Registered again once QUEUE_REGISTRATION_TTL_S has passed: on the same connection.
    plain.redis.delete(plain.key("queues"))
    mine = (connection.get_keys().namespace, "default")
    client._registered[mine] -= client.QUEUE_REGISTRATION_TTL_S + 1
    jobs.record.delay(3)
    assert plain.redis.smembers(plain.key("queues")) == {b"default"}
    assert tags(plain) == [0, 1, 2, 3]
    assert clients(plain) == before + 1


def test_a_killed_connection_costs_no_job_and_pushes_no_second_copy(plain: CogEnv) -> None:
    jobs.record.delay(0)
    jobs.record.delay(1)
    (held,) = stack_of(plain).idle
    host, port = held._sock.getsockname()[:2]
    assert plain.redis.client_kill(f"{host}:{port}")
    jobs.record.delay(2)  # fails on the dead socket, then goes the ordinary way
    jobs.record.delay(3)
    assert tags(plain) == [0, 1, 2, 3]
    assert held._sock is None  # dropped, not reused


def test_an_error_reply_is_raised_and_its_connection_kept(plain: CogEnv) -> None:
    jobs.record.delay(0)
    jobs.record.delay(1)
    (held,) = stack_of(plain).idle
    plain.redis.rename(plain.key("queue:default"), plain.key("kept"))
    plain.redis.set(plain.key("queue:default"), "not a list")
    with pytest.raises(EnqueueRefused, match="WRONGTYPE"):
        jobs.record.delay(2)
    assert stack_of(plain).idle == [held] and held._sock is not None
    plain.redis.delete(plain.key("queue:default"))
    jobs.record.delay(3)
    assert tags(plain) == [3]
    assert stack_of(plain).idle == [held]


def test_threads_enqueueing_at_once_keep_at_most_max_idle_connections(plain: CogEnv) -> None:
    jobs.record.delay(-1)
    start = threading.Barrier(4 * direct.MAX_IDLE)

    def enqueue(first: int) -> None:
        start.wait(10)
        for tag in range(first, first + 25):
            jobs.record.delay(tag)

    threads = [threading.Thread(target=enqueue, args=(n * 25,)) for n in range(4 * direct.MAX_IDLE)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert tags(plain) == list(range(-1, 4 * direct.MAX_IDLE * 25))
    assert 1 <= len(stack_of(plain).idle) <= direct.MAX_IDLE


def test_a_forked_child_enqueues_on_connections_of_its_own(plain: CogEnv) -> None:
    jobs.record.delay(0)
    jobs.record.delay(1)
    (held,) = stack_of(plain).idle
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if it pushed on a new connection
        try:
            jobs.record.delay(2)
            stack = direct._stack
            mine = stack is not None and stack.pid == os.getpid() and held not in stack.idle
            os._exit(0 if mine else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    jobs.record.delay(3)  # the parent's connection still works: the child left it alone
    assert stack_of(plain).idle == [held]
    assert tags(plain) == [0, 1, 2, 3]


def test_sentinel_cluster_and_single_connection_clients_keep_redis_pys_way(plain: CogEnv) -> None:
    sentinel = redis.sentinel.Sentinel([("127.0.0.1", 1)]).master_for("mymaster")
    cluster = redis.RedisCluster.__new__(redis.RedisCluster)  # no nodes to reach: never connects
    single = redis.Redis.from_url(plain.url, single_connection_client=True)
    try:
        for client in (sentinel, cluster, single):
            assert direct.call(client, "LPUSH", plain.key("queue:default"), b"{}") is direct.ORDINARY
        assert plain.redis.llen(plain.key("queue:default")) == 0
    finally:
        single.close()


def test_a_demoted_server_closes_the_idle_connections_so_the_next_ones_resolve_it_again(
    plain: CogEnv, tmp_path: Path
) -> None:
    """READONLY (the server behind the URL is a replica now) is an outage,
    and the connections that met it are not kept: after a failover behind
    a DNS name they would ask the replica forever."""
    jobs.record.delay(0)
    jobs.record.delay(1)
    (held,) = stack_of(plain).idle
    (tmp_path / "master").mkdir()
    master = RedisServer(str(tmp_path / "master"))
    master.start()
    plain.redis.replicaof("127.0.0.1", master.port)
    try:
        with pytest.raises(RedisUnavailable, match="has no master"):
            jobs.record.delay(2)
        assert stack_of(plain).idle == [] and held._sock is None
    finally:
        plain.redis.replicaof("NO", "ONE")
        master.stop()
    jobs.record.delay(3)
    found = tags(plain)  # [3], or [0, 1, 3] if the replica had not synced yet
    assert 3 in found and 2 not in found


def test_new_settings_close_the_old_clients_connections_too(plain: CogEnv) -> None:
    jobs.record.delay(0)
    jobs.record.delay(1)
    (held,) = stack_of(plain).idle
    connection.reset()
    assert held._sock is None
    jobs.record.delay(2)  # a new client: its queue is registered again, then pushed on its own stack
    jobs.record.delay(3)
    assert tags(plain) == [0, 1, 2, 3] and stack_of(plain).idle != [held]


# -- the worker's fetch call (Script.run) ------------------------------------------------


def fetch_some(cog: CogEnv, want: int) -> list[Any]:
    """One fetch.lua call for up to ``want`` jobs of the default queue, as a
    worker makes it."""
    keys = [cog.key("queue:default"), cog.key("inprogress:probe")]
    return list(script("fetch").run(connection.get_redis(), keys, [1, want]))


def test_the_fetch_call_goes_on_a_connection_of_its_own_and_replies_as_redis_pys(plain: CogEnv) -> None:
    for tag in range(3):
        jobs.record.delay(tag)
    found = fetch_some(plain, 2)
    assert found[0] == 1 and len(found) == 3
    assert sorted(plain.redis.lrange(plain.key("inprogress:probe"), 0, -1)) == sorted(found[1:])
    (held,) = stack_of(plain).idle
    assert held not in connection.get_redis().connection_pool._available_connections
    assert fetch_some(plain, 2)[0] == 1 and stack_of(plain).idle == [held]


def test_a_flushed_script_cache_runs_the_fetch_with_eval_on_the_same_call(plain: CogEnv) -> None:
    jobs.record.delay(0)
    jobs.record.delay(1)
    plain.redis.script_flush()
    assert len(fetch_some(plain, 5)) == 3  # NOSCRIPT, then EVAL: both jobs in one call
    assert plain.redis.script_exists(script("fetch").sha) == [True]


def test_a_killed_connection_fetches_each_job_once_the_ordinary_way(plain: CogEnv) -> None:
    jobs.record.delay(0)
    jobs.record.delay(1)
    fetch_some(plain, 1)
    (held,) = stack_of(plain).idle
    host, port = held._sock.getsockname()[:2]
    assert plain.redis.client_kill(f"{host}:{port}")
    assert len(fetch_some(plain, 1)) == 2  # failed on the dead socket, then sent through redis-py
    assert held._sock is None
    assert plain.redis.llen(plain.key("inprogress:probe")) == 2
    assert plain.redis.llen(plain.key("queue:default")) == 0


def test_a_pipeline_never_takes_the_direct_way(plain: CogEnv) -> None:
    pipe = connection.get_redis().pipeline()
    assert direct.call(pipe, "LPUSH", plain.key("queue:default"), b"{}") is direct.ORDINARY
    assert plain.redis.llen(plain.key("queue:default")) == 0


def public_round_trip(conn: Any, *args: Any) -> Any:
    """What ``direct.call`` sent and read through before its lean way."""
    conn.send_packed_command(conn.pack_command(*args))
    return conn.read_response()


@pytest.fixture
def opened() -> Iterator[Callable[[redis.Redis], Any]]:
    """Opens connections like the client's pool's; closes them after."""
    made: list[Any] = []

    def open_one(client: redis.Redis) -> Any:
        conn = client.connection_pool.make_connection()
        conn.connect()
        made.append(conn)
        return conn

    yield open_one
    for conn in made:
        conn.disconnect()


def test_the_lean_packing_is_redis_pys_byte_for_byte(plain: CogEnv) -> None:
    conn = connection.get_redis().connection_pool.make_connection()
    for args in [
        ("LPUSH", "cogworker:queue:default", b'{"jid":"x"}'),
        ("EVALSHA", "0" * 40, 2, "k1", "k2", 1, -5, 0, b""),
        ("SET", "clé", "é" * 10),
        ("LPUSH", "k", b"x" * 100_000),
    ]:
        assert direct._pack(args) == b"".join(bytes(chunk) for chunk in conn.pack_command(*args))
    for other in (1.5, True, None, memoryview(b"v")):
        assert direct._pack(("SET", "k", other)) is None  # redis-py's own packing decides


def test_the_lean_round_trip_replies_as_redis_py_to_every_kind_of_reply(
    plain: CogEnv, opened: Callable[[redis.Redis], Any]
) -> None:
    client = connection.get_redis()
    lean, public = opened(client), opened(client)
    assert direct._lean_parser(lean) is not None, "the lean way is the one under test"
    key = plain.key("probe")
    plain.redis.set(f"{key}:str", b"v")
    plain.redis.rpush(f"{key}:list", b"a", b"b")
    plain.redis.hset(f"{key}:hash", mapping={"f": "1"})
    for args in [
        ("PING",),
        ("GET", f"{key}:str"),
        ("GET", f"{key}:missing"),
        ("LRANGE", f"{key}:list", 0, -1),
        ("HGETALL", f"{key}:hash"),
        ("LLEN", f"{key}:list"),
        ("EXISTS", f"{key}:str", f"{key}:missing"),
    ]:
        assert direct._roundtrip(lean, args) == public_round_trip(public, *args), args
    with pytest.raises(redis.ResponseError) as lean_error:
        direct._roundtrip(lean, ("LPUSH", f"{key}:str", b"x"))
    with pytest.raises(redis.ResponseError) as public_error:
        public_round_trip(public, "LPUSH", f"{key}:str", b"x")
    assert type(lean_error.value) is type(public_error.value)
    assert str(lean_error.value) == str(public_error.value)
    assert direct._roundtrip(lean, ("PING",)) in (b"PONG", "PONG")  # read whole: still in step


def test_a_connection_due_its_health_check_takes_redis_pys_way_which_pings(
    plain: CogEnv, opened: Callable[[redis.Redis], Any]
) -> None:
    client = connection.get_redis()
    conn = opened(client)
    assert conn.health_check_interval > 0

    def pings() -> int:
        stats = plain.redis.info("commandstats")
        return int(stats.get("cmdstat_ping", {}).get("calls", 0))

    before = pings()
    direct._roundtrip(conn, ("EXISTS", "x"))
    assert pings() == before  # not due: no PING
    conn.next_health_check = 0.0
    assert direct._lean_parser(conn) is None
    direct._roundtrip(conn, ("EXISTS", "x"))
    assert pings() == before + 1
    assert direct._lean_parser(conn) is not None  # the check is due again only after its interval


def test_a_resp3_push_ahead_of_the_reply_is_handled_as_redis_py_does(
    plain: CogEnv, opened: Callable[[redis.Redis], Any]
) -> None:
    client = redis.Redis.from_url(plain.url, protocol=3)
    lean, public = opened(client), opened(client)
    assert direct._lean_parser(lean) is not None
    key = plain.key("tracked")
    plain.redis.set(key, b"old")
    for conn in (lean, public):
        assert public_round_trip(conn, "CLIENT", "TRACKING", "ON") in (b"OK", "OK")
        assert public_round_trip(conn, "GET", key) == b"old"  # tracked from now on
    plain.redis.set(key, b"new")  # Redis pushes an invalidation to both
    deadline = time.monotonic() + 10
    while len(select.select([lean._sock, public._sock], [], [], 0.05)[0]) < 2:
        assert time.monotonic() < deadline, "no invalidation arrived"
    replies = [direct._roundtrip(lean, ("GET", key)), direct._roundtrip(lean, ("PING",))]
    assert replies == [public_round_trip(public, "GET", key), public_round_trip(public, "PING")]
    if getattr(lean._parser, "_hiredis_PushNotificationType", None) is not None:
        # This redis-py reads a push apart (redis-py 5 returns it as the reply, its own way and ours).
        assert replies[0] == b"new" and replies[1] in (b"PONG", "PONG")
    client.close()


def test_a_client_with_another_encoding_is_packed_here_only_as_its_own_packer_would(
    plain: CogEnv,
) -> None:
    """redis-py's hiredis packer sent a str as UTF-8 whatever the
    ``encoding`` option up to 8.1, and in that encoding from 8.2: the probe
    (``packs_alike``) takes the lean path only when ours packs alike, and
    either way the key is the one redis-py itself would send."""
    client = redis.Redis.from_url(plain.url, encoding="latin-1")
    key = plain.key("clé")
    theirs = b"".join(
        bytes(c) for c in client.connection_pool.make_connection().pack_command("LPUSH", key, b"0")
    )
    alike = direct._pack(("LPUSH", key, b"0")) == theirs
    for tag in (b"0", b"1"):  # the second on a connection opened already
        assert direct.call(client, "LPUSH", key, tag) in (1, 2)
    assert direct._stack_for(client).packs_alike is alike
    sent = key.encode("utf-8" if alike else "latin-1")
    assert sent in theirs
    assert plain.redis.lrange(sent, 0, -1) == [b"1", b"0"]
    client.close()


class Latin1Connection(redis.Connection):
    """A connection whose own packer encodes a str as latin-1."""

    def pack_command(self, *args: Any) -> list[bytes]:
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            raw = (
                arg.encode("latin-1")
                if isinstance(arg, str)
                else arg
                if isinstance(arg, bytes)
                else b"%d" % arg
            )
            parts.append(b"$%d\r\n%b\r\n" % (len(raw), raw))
        return [b"".join(parts)]


def test_a_connection_that_packs_otherwise_keeps_its_own_packer(plain: CogEnv) -> None:
    client = redis.Redis(
        connection_pool=redis.ConnectionPool.from_url(plain.url, connection_class=Latin1Connection)
    )
    key = plain.key("clé")
    for tag in (b"0", b"1"):
        assert direct.call(client, "LPUSH", key, tag) in (1, 2)
    stack = direct._stack_for(client)
    assert stack.usable and not stack.packs_alike
    assert plain.redis.lrange(key.encode("latin-1"), 0, -1) == [b"1", b"0"]
    assert not plain.redis.exists(key.encode())
    client.close()
