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
