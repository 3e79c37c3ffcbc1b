"""Where the connection comes from: REDIS_URL, or a django-redis cache alias."""

from __future__ import annotations

import io
import re
import socket
import time

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_cogworker.connection import get_redis, reset
from django_cogworker.errors import ConfigurationError
from django_cogworker.sentinel import SENTINEL_DISCOVERY_TIMEOUT_S
from testproject.testapp import jobs
from tests.conftest import free_port, wait_for


def cache_settings(url: str, **options: object) -> dict[str, object]:
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "jobs": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient", **options},
        },
    }


def test_cache_alias_takes_the_connection_of_that_django_redis_cache(cog):
    from django_redis import get_redis_connection

    with override_settings(CACHES=cache_settings(cog.url)):
        cog.configure(CACHE_ALIAS="jobs", REDIS_URL="redis://127.0.0.1:1/0")  # the URL is not used
        reset()
        try:
            assert get_redis() is get_redis_connection("jobs")
            jid = jobs.record.delay("via cache")
            assert cog.redis.llen(cog.key("queue:default")) == 1
            assert jid.encode() in cog.redis.lindex(cog.key("queue:default"), 0)
        finally:
            reset()


def test_cache_alias_whose_client_decodes_responses_is_refused(cog):
    # Another database index: django-redis keeps one pool per URL.
    settings = cache_settings(
        cog.url.rsplit("/", 1)[0] + "/15", CONNECTION_POOL_KWARGS={"decode_responses": True}
    )
    with override_settings(CACHES=settings):
        cog.configure(CACHE_ALIAS="jobs")
        reset()
        try:
            with pytest.raises(ConfigurationError, match="decodes responses"):
                get_redis()
        finally:
            reset()


def test_a_sentinel_url_builds_a_sentinel_client_with_the_data_nodes_password_and_sentinel_options(settings):
    """Built, not connected (the sentinels are asked at the first command):
    the URL's password and database are the data nodes', SENTINEL_OPTIONS
    go to the sentinels only, ``rediss+`` means TLS to the data nodes."""
    import redis.asyncio.sentinel
    import redis.sentinel

    from django_cogworker.conf import get_config
    from django_cogworker.connection import build

    settings.COGWORKER = {
        "REDIS_URL": "rediss+sentinel://app:data-pw@127.0.0.1:26001,127.0.0.1:26002/orders/3",
        "SENTINEL_OPTIONS": {"password": "sentinel-pw", "socket_timeout": 0.5},
        "REDIS_OPTIONS": {"socket_keepalive": True},
    }
    for async_client, module in ((False, redis.sentinel), (True, redis.asyncio.sentinel)):
        client = build(get_config(), async_client=async_client)
        pool = client.connection_pool
        assert isinstance(pool, module.SentinelConnectionPool) and pool.service_name == "orders"
        data = pool.connection_kwargs
        assert (data["username"], data["password"], data["db"]) == ("app", "data-pw", 3)
        assert data["socket_keepalive"] is True and data["decode_responses"] is False
        assert pool.connection_class is module.SentinelManagedSSLConnection
        sentinels = pool.sentinel_manager.sentinels
        assert [
            (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
            for s in sentinels
        ] == [("127.0.0.1", 26001), ("127.0.0.1", 26002)]
        kwargs = sentinels[0].connection_pool.connection_kwargs
        assert (kwargs["password"], kwargs["socket_timeout"]) == ("sentinel-pw", 0.5)
        assert "ssl" not in kwargs and kwargs.get("username") is None


def test_a_cluster_url_passes_its_startup_nodes_credentials_and_tls(settings, monkeypatch):
    """What RedisCluster is given (it connects at once, so the real cluster
    tests are in test_cluster.py; this one checks the arguments of TLS and
    a password, which the test cluster does not use)."""
    import redis

    from django_cogworker.conf import get_config
    from django_cogworker.connection import build

    given: dict[str, object] = {}

    class Recorder:
        def __init__(self, **kwargs: object) -> None:
            given.update(kwargs)

    monkeypatch.setattr(redis, "RedisCluster", Recorder)
    settings.COGWORKER = {"REDIS_URL": "rediss+cluster://:node-pw@10.0.0.1:7000,10.0.0.2"}
    build(get_config())
    nodes = given.pop("startup_nodes")
    assert [(n.host, n.port) for n in nodes] == [("10.0.0.1", 7000), ("10.0.0.2", 6379)]  # type: ignore[attr-defined]
    assert given["password"] == "node-pw" and given["ssl"] is True and given["decode_responses"] is False
    assert get_config().namespace == "{cogworker}"


@pytest.mark.parametrize(
    "url",
    ["redis+sentinel://127.0.0.1:1/mymaster", "redis+cluster://127.0.0.1:1"],
)
def test_a_sentinel_or_cluster_url_with_nothing_behind_it_is_redis_unavailable_at_delay(cog, url):
    """No sentinel, no cluster node answers: .delay() raises RedisUnavailable
    (a CogworkerError) naming no password, like a plain URL."""
    from django_cogworker.errors import RedisUnavailable

    cog.configure(REDIS_URL=url.replace("://", "://:hidden-pw@"))
    reset()
    with pytest.raises(RedisUnavailable) as raised:
        jobs.record.delay("nowhere")
    assert "hidden-pw" not in str(raised.value)


def silent_listener() -> socket.socket:
    """A port that takes connections (the kernel's backlog) and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    return listener


def test_refused_sentinels_fail_a_delay_and_the_status_probe_at_once_in_one_line(cog):
    """Each sentinel is asked once (redis-py's retries of a sentinel
    connection cost seconds of backoff each: 7 s for two), and the error is
    one line naming the sentinels, not the repr of redis-py's clients."""
    from django_cogworker.errors import RedisUnavailable

    ports = [free_port(), free_port(), free_port()]
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    cog.configure(REDIS_URL=f"redis+sentinel://:hidden-pw@{hosts}/mymaster", ENQUEUE_ON_COMMIT=False)
    reset()
    began = time.monotonic()
    with pytest.raises(RedisUnavailable) as raised:
        jobs.record.delay("nowhere")
    assert time.monotonic() - began < 1.0
    assert str(raised.value) == (
        "could not enqueue: Redis is unreachable (no sentinel named a master for 'mymaster' "
        f"(asked {', '.join(f'127.0.0.1:{p}' for p in ports)}, each once, within "
        f"{SENTINEL_DISCOVERY_TIMEOUT_S:g}s))"
    )
    began = time.monotonic()
    err = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("cogworker_status", stdout=io.StringIO(), stderr=err)
    assert exited.value.code == 2 and time.monotonic() - began < 1.0
    assert "no sentinel named a master for 'mymaster'" in err.getvalue() and "hidden-pw" not in err.getvalue()
    assert len(err.getvalue().splitlines()) == 1 and "redis.client.Redis" not in err.getvalue()


def test_sentinels_that_never_answer_are_bounded_by_the_discovery_timeout(cog):
    """Each sentinel's timeouts are cut to its share of the discovery's
    bound, those SENTINEL_OPTIONS sets too: asked in turn, they all fit in it."""
    from django_cogworker.errors import RedisUnavailable

    listeners = [silent_listener(), silent_listener()]
    try:
        hosts = ",".join(f"127.0.0.1:{s.getsockname()[1]}" for s in listeners)
        cog.configure(
            REDIS_URL=f"redis+sentinel://{hosts}/mymaster",
            SENTINEL_OPTIONS={"socket_timeout": 30},
            ENQUEUE_ON_COMMIT=False,
        )
        reset()
        began = time.monotonic()
        with pytest.raises(RedisUnavailable, match="no sentinel named a master"):
            jobs.record.delay("nowhere")
        elapsed = time.monotonic() - began
        # Both were waited for (each its share), and no longer than the bound.
        assert SENTINEL_DISCOVERY_TIMEOUT_S * 0.9 < elapsed < SENTINEL_DISCOVERY_TIMEOUT_S + 1.0, elapsed
    finally:
        for listener in listeners:
            listener.close()


def test_a_worker_on_a_cluster_url_waits_while_no_node_answers_then_works(cog, tmp_path):
    """As for every other URL form, not an exit (a restart loop of pods after
    a cluster restart): the worker logs that it waits, keeps running, and
    works once the cluster is up."""
    import json
    import signal

    from tests.topology import ClusterGroup

    cluster = ClusterGroup(tmp_path / "cluster")  # its ports chosen, nothing started yet
    url, namespace = cluster.url(), "{" + cog.namespace + "}"
    worker = cog.start_worker(REDIS_URL=url, NAMESPACE=namespace, env={"COGWORKER_REDIS_URL": url})
    try:
        wait_for(
            lambda: "waits for Redis at redis+cluster://" in worker.log() or not worker.alive(), 30, "a wait"
        )
        assert worker.alive(), worker.log()
        # redis-py names it RedisClusterException up to 8.1, RedisClusterUnreachableError from 8.2.
        assert (
            re.search(r"RedisCluster\w*(Exception|Error)", worker.log()) and "Traceback" not in worker.log()
        )
        cluster.start()
        with cluster.client() as client:
            cog.configure(REDIS_URL=url, NAMESPACE=namespace, ENQUEUE_ON_COMMIT=False)
            reset()
            jid = jobs.record.delay("after the cluster came up")
            ran = wait_for(lambda: client.lrange(f"{namespace}:test:runs", 0, -1), 60, "the job to run")
            assert [json.loads(r)["jid"] for r in ran] == [jid]
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.log()
    finally:
        if worker.alive():
            worker.proc.kill()
        cluster.stop()


def test_refused_sentinels_fail_an_async_client_at_once_in_one_line(settings):
    import asyncio

    import redis.asyncio.sentinel

    from django_cogworker.conf import get_config
    from django_cogworker.connection import aclose, build

    port = free_port()
    settings.COGWORKER = {"REDIS_URL": f"redis+sentinel://:hidden-pw@127.0.0.1:{port}/orders"}

    async def ping() -> None:
        client = build(get_config(), async_client=True)
        try:
            await client.ping()
        finally:
            await aclose(client)

    began = time.monotonic()
    with pytest.raises(redis.asyncio.sentinel.MasterNotFoundError) as raised:
        asyncio.run(ping())
    assert time.monotonic() - began < 1.0
    assert str(raised.value) == (
        f"no sentinel named a master for 'orders' (asked 127.0.0.1:{port}, each once, "
        f"within {SENTINEL_DISCOVERY_TIMEOUT_S:g}s)"
    )


# -- the pool of a worker process (SPEC section 8) -----------------------------------------


def test_a_worker_at_concurrency_100_has_a_connection_for_every_thread(cog, own_redis):
    """Every idle processor thread holds a connection while it waits in a
    blocking fetch; the heartbeat, poller, ticker and housekeeper need their
    own beside them. A pool smaller than that fails the beat with "Too many
    connections", which must never be reported as Redis being unreachable."""
    from tests.conftest import wait_for

    own_redis()
    worker = cog.start_worker("-c", "100")
    identity = worker.identity()

    def blocked() -> int:
        return int(cog.redis.info("clients")["blocked_clients"])

    wait_for(lambda: blocked() >= 100, 30, "the 100 idle threads to wait in a blocking fetch")

    def beat() -> float:
        return float(cog.redis.hget(cog.key(f"process:{identity}"), "beat") or 0)

    # The heartbeat goes on beside them (every 0.2 s here): three more beats.
    for _ in range(3):
        last = beat()
        wait_for(lambda last=last: beat() > last, 10, "the next beat")
    jids = [jobs.record.delay(i) for i in range(300)]
    wait_for(lambda: len(cog.notes()) >= 300, 60, "300 jobs to run")
    assert sorted(n["jid"] for n in cog.notes()) == sorted(jids)
    log = worker.log()
    for wrong in ("Too many connections", "MaxConnectionsError", "unreachable"):
        assert wrong not in log, log[-3000:]


def test_a_pool_with_no_connection_left_is_never_reported_as_an_outage(cog, worker_log):
    import redis

    from django_cogworker.errors import RedisUnavailable, translate
    from django_cogworker.outage import Outage

    client = redis.Redis.from_url(cog.url, max_connections=1)
    held = client.connection_pool.get_connection()
    try:
        with pytest.raises(redis.ConnectionError) as raised:
            client.ping()
    finally:
        client.connection_pool.release(held)
        client.close()
    exc = raised.value
    assert Outage().failed(exc)  # handled: retried with backoff, said once
    said = worker_log.text
    assert "every connection of this process's Redis pool is in use" in said and "unreachable" not in said
    error = translate(exc, "enqueue")
    assert isinstance(error, RedisUnavailable) and "unreachable" not in str(error)
    assert "raise max_connections in REDIS_OPTIONS" in str(error)


def test_credentials_refused_while_working_are_said_as_such_not_as_unreachable(cog, own_redis, worker_log):
    """A password changed under a running worker: retried like an outage
    (it may be put right), but said for what it is (SPEC section 8)."""
    import redis

    from django_cogworker.outage import Outage

    server = own_redis()
    cog.redis.config_set("requirepass", "right-pw")
    client = redis.Redis.from_url(f"redis://:wrong-pw@127.0.0.1:{server.port}/0")
    with pytest.raises(redis.AuthenticationError) as raised:
        client.ping()
    client.close()
    assert Outage().failed(raised.value)
    said = worker_log.text
    assert "Redis refused the credentials: check the user and password in REDIS_URL" in said, said
    assert "unreachable" not in said and "wrong-pw" not in said
