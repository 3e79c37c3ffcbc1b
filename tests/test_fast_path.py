"""``FAST_PATH`` and what guards it (django_cogworker.redispy), against a
redis-server of the test's own: the setting turns it off; a redis-py
version it was not tested with, or a connection without the attributes it
reads, makes it fall back to redis-py's public API and say so once; and a
command whose reply times out is sent again exactly as often as redis-py
itself would send it (counted by the server: ``INFO commandstats``), never
once more."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis._parsers import _RESP2Parser
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker import connection, direct, redispy
from django_cogworker.errors import RedisUnavailable
from django_cogworker.scripts import script
from testproject.testapp import jobs
from tests.conftest import CogEnv, free_port, wait_for
from tests.test_tls import SERVER, make_certificates

OFF = "cogworker's fast path is off, redis-py's public API is used: "


@pytest.fixture
def plain(cog: CogEnv, own_redis: Any, monkeypatch: pytest.MonkeyPatch) -> CogEnv:
    own_redis()
    connection.reset()
    monkeypatch.setattr(redispy, "_said", set())  # "once per process": once per test here
    return cog


def lpush_calls(cog: CogEnv) -> int:
    return int(cog.redis.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0))


def queued(cog: CogEnv) -> int:
    return int(cog.redis.llen(cog.key("queue:default")))


def said(log: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in log.records if r.getMessage().startswith(OFF)]


def enqueue_and_fetch(cog: CogEnv, count: int) -> None:
    """``count`` delays (the first registers the queue) and one fetch call,
    all of which must arrive."""
    for tag in range(count):
        jobs.record.delay(tag)
    keys = [cog.key("queue:default"), cog.key("inprogress:probe")]
    reply = script("fetch").run(connection.get_redis(), keys, [1, count])
    assert reply[0] == 1 and len(reply) == count + 1


def test_fast_path_false_sends_every_command_through_redis_pys_public_api(
    plain: CogEnv, worker_log: pytest.LogCaptureFixture
) -> None:
    plain.configure(FAST_PATH=False)
    connection.reset()
    enqueue_and_fetch(plain, 3)
    client = connection.get_redis()
    stack = direct._stack_for(client)
    assert not stack.usable and not stack.probed and stack.idle == []
    assert direct.call(client, "PING") is direct.ORDINARY
    assert said(worker_log) == []  # asked for: nothing to explain


class ReaderlessConnection(redis.Connection):
    """A real connection whose parser keeps no hiredis ``_reader`` (it is
    redis-py's own RESP2 parser): to the probe, as a redis-py that renamed
    or dropped the attribute would look."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, "parser_class": _RESP2Parser})


def test_a_connection_without_the_attributes_read_falls_back_and_says_so_once(
    plain: CogEnv, worker_log: pytest.LogCaptureFixture
) -> None:
    plain.configure(REDIS_OPTIONS={"connection_class": ReaderlessConnection})
    connection.reset()
    enqueue_and_fetch(plain, 4)
    jobs.record.delay("more")
    assert queued(plain) == 1
    client = connection.get_redis()
    stack = direct._stack_for(client)
    assert not stack.usable and stack.idle == []
    (line,) = said(worker_log)  # the parser redis-py picks for a protocol: its RESP2 or RESP3 one
    assert re.fullmatch(OFF + r"ReaderlessConnection's parser \(_RESP\dParser\) has no hiredis _reader", line)
    assert direct.call(client, "PING") is direct.ORDINARY


def test_a_redis_py_version_not_tested_falls_back_and_says_so_once(
    plain: CogEnv, worker_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis, "__version__", "9.0.0")
    enqueue_and_fetch(plain, 3)
    assert not direct._stack_for(connection.get_redis()).usable
    assert said(worker_log) == [OFF + "redis-py 9.0.0 is not a version it was tested with (5.0.8 to 8.x)"]


def test_the_versions_tested_are_pyprojects_bounds() -> None:
    assert redispy.install_problem() is None  # the redis-py of this run
    for version in ("5.0.8", "5.3.1", "6.4.0", "8.1.0", "8.9.12"):
        assert redispy.install_problem(version) is None, version
    for version in ("5.0.7", "4.6.0", "9.0.0", "10.1.0", "main"):
        assert redispy.install_problem(version) is not None, version


def test_the_fast_path_is_taken_where_the_probe_passes(plain: CogEnv) -> None:
    enqueue_and_fetch(plain, 3)
    stack = direct._stack_for(connection.get_redis())
    assert stack.usable and stack.probed and len(stack.idle) == 1


# -- a reply that times out: sent again only as redis-py would ---------------------------


class ReplyHoldingProxy:
    """A TCP proxy to a Redis server. It forwards every command at once;
    once :meth:`hold_next_lpush` was called, the connection that next sends
    an LPUSH never gets another reply: the server runs the command, the
    client waits for its reply past ``socket_timeout``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = False
        self.held: set[socket.socket] = set()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def hold_next_lpush(self) -> None:
        self.armed = True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, client), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, None), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, commands_of: socket.socket | None) -> None:
        try:
            while data := source.recv(65536):
                if commands_of is not None and self.armed and b"LPUSH" in data:
                    self.armed = False
                    self.held.add(commands_of)  # before the command goes on: no reply slips out
                if commands_of is None and target in self.held:
                    continue  # a reply to a held connection: never delivered
                target.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, target):
                s.close()

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                s.close()


@pytest.fixture
def proxied(plain: CogEnv) -> Iterator[Callable[..., ReplyHoldingProxy]]:
    """Points the settings at a :class:`ReplyHoldingProxy` to the test's
    server, with a client of ``retries`` retries on a timeout."""
    made: list[ReplyHoldingProxy] = []
    port = redis.Redis.from_url(plain.url).connection_pool.connection_kwargs["port"]

    def start(retries: int, fast_path: bool) -> ReplyHoldingProxy:
        proxy = ReplyHoldingProxy(port)
        made.append(proxy)
        options = {
            "socket_timeout": 2.0,
            "retry": Retry(NoBackoff(), retries),
            "retry_on_error": [redis.TimeoutError],  # redis-py 5 retries only these
        }
        plain.configure(REDIS_URL=proxy.url, REDIS_OPTIONS=options, FAST_PATH=fast_path)
        connection.reset()
        return proxy

    yield start
    connection.reset()
    for proxy in made:
        proxy.close()


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "redis-py"])
def test_a_timed_out_lpush_is_sent_once_where_redis_py_would_not_retry_it(
    plain: CogEnv, proxied: Callable[..., ReplyHoldingProxy], fast_path: bool
) -> None:
    proxy = proxied(retries=0, fast_path=fast_path)
    jobs.record.delay(0)  # registers the queue: a pipeline
    jobs.record.delay(1)  # the fast path's own connection, opened and probed
    assert direct._stack_for(connection.get_redis()).probed is fast_path
    before = lpush_calls(plain)
    proxy.hold_next_lpush()
    with pytest.raises(RedisUnavailable, match="Timeout"):
        jobs.record.delay(2)
    wait_for(lambda: lpush_calls(plain) > before, 10, "the held LPUSH to run")
    assert lpush_calls(plain) == before + 1  # one send: redis-py would not retry it
    assert queued(plain) == 3


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "redis-py"])
def test_a_timed_out_lpush_is_sent_again_as_often_as_redis_py_retries_it(
    plain: CogEnv, proxied: Callable[..., ReplyHoldingProxy], fast_path: bool
) -> None:
    proxy = proxied(retries=1, fast_path=fast_path)
    jobs.record.delay(0)
    jobs.record.delay(1)
    assert direct._stack_for(connection.get_redis()).probed is fast_path
    before = lpush_calls(plain)
    proxy.hold_next_lpush()
    jobs.record.delay(2)  # the held send timed out; the retry redis-py makes got its reply
    wait_for(lambda: lpush_calls(plain) >= before + 2, 10, "both sends to run")
    assert lpush_calls(plain) == before + 2  # redis-py's own count: at least once, as it does
    assert queued(plain) == 4


# -- TLS: the probe and the idle check on an SSL socket ----------------------------------


@pytest.fixture
def tls_redis(cog: CogEnv, tmp_path: Path) -> Iterator[redis.Redis]:
    """A TLS-only redis-server of the test's own (Debian's, built with TLS,
    as tests/test_tls.py uses), the settings pointed at it; a client of the test's."""
    certs = make_certificates(tmp_path)
    port = free_port()
    argv = [SERVER, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--dir", str(tmp_path), "--tls-cert-file", certs["server.crt"]]
    argv += ["--tls-key-file", certs["server.key"], "--tls-ca-cert-file", certs["ca.crt"]]
    argv += ["--tls-auth-clients", "no"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    options = {"ssl_ca_certs": certs["ca.crt"], "socket_timeout": 5}
    client = redis.Redis(host="127.0.0.1", port=port, ssl=True, **options)
    try:
        wait_for(lambda: _pings(client), 15, "the TLS redis-server")
        cog.configure(REDIS_URL=f"rediss://127.0.0.1:{port}/0", REDIS_OPTIONS=options)
        connection.reset()
        yield client
    finally:
        connection.reset()
        client.close()
        proc.kill()
        proc.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def test_a_tls_connection_takes_the_fast_path_and_one_the_server_closed_is_not_written_to(
    cog: CogEnv, tls_redis: redis.Redis
) -> None:
    for tag in range(4):
        jobs.record.delay(tag)
    stack = direct._stack_for(connection.get_redis())
    assert stack.usable and stack.probed and len(stack.idle) == 1
    (held,) = stack.idle
    host, port = held._sock.getsockname()[:2]
    before = int(tls_redis.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0))
    assert tls_redis.client_kill(f"{host}:{port}")
    jobs.record.delay(4)  # the closed connection is found before the push, which goes redis-py's way
    jobs.record.delay(5)
    assert held._sock is None
    assert int(tls_redis.info("commandstats")["cmdstat_lpush"]["calls"]) == before + 2
    assert tls_redis.llen(cog.key("queue:default")) == 6
