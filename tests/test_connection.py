"""Where the connection comes from: REDIS_URL, or a django-redis cache alias."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_cogworker.connection import get_redis, reset
from django_cogworker.errors import ConfigurationError
from testproject.testapp import jobs


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
