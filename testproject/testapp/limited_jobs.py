"""Jobs under limiters (SPEC section 14), for tests/test_limits*.py.

Each keeps a gauge in Redis of how many of its kind run at once, and
records the highest value seen, so a test sees the limit from every process.
"""

from __future__ import annotations

import time

from django_cogworker import job, limits
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.context import current_job
from testproject.testapp.jobs import _note

ERP = limits.Concurrency("erp", 2)
STRIPE = limits.Rate("stripe", 5, per=1)
IN_CODE = limits.Concurrency("in-code", 1)


def _gauged(gauge: str, seconds: float, tag: object) -> None:
    """Counts this run in ``test:gauge:<gauge>`` while it sleeps, keeping
    the highest count in ``test:gauge:<gauge>:max``."""
    client, namespace = get_redis(), get_config().namespace
    key = f"{namespace}:test:gauge:{gauge}"
    now = client.incr(key)
    client.eval(
        "if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then "
        "redis.call('SET', KEYS[1], ARGV[1]) end",
        1,
        f"{key}:max",
        now,
    )
    _note("started", tag=tag)
    try:
        time.sleep(seconds)
    finally:
        client.decr(key)
    _note("runs", tag=tag)


@job(limit=ERP, retry=0)
def erp_sync(seconds: float, tag: object = None) -> None:
    _gauged("erp", seconds, tag)


@job(limit=lambda account, seconds, tag=None: limits.Concurrency(f"account:{account}", 1), retry=0)
def import_account(account: int, seconds: float, tag: object = None) -> None:
    _gauged(f"account:{account}", seconds, tag)


@job(limit=STRIPE, retry=0)
def charge(tag: object = None) -> None:
    """Records its start on Redis's clock, and when the limiter admitted it
    (its entry in the rate's starts, also on Redis's clock)."""
    client = get_redis()
    seconds, micros = client.time()
    ctx = current_job()
    starts = get_keys().limit(STRIPE.name, "starts")
    admitted = [score for _, score in client.zscan_iter(starts, match=f"{ctx.jid}:*" if ctx else "")]
    _note("runs", tag=tag, redis_at=seconds + micros / 1e6, admitted_at=admitted[0] if admitted else None)


@job(retry=0)
def code_limited(seconds: float, tag: object = None) -> None:
    _note("entered", tag=tag)
    with IN_CODE.acquire():
        _gauged("in-code", seconds, tag)


@job(queue="low", retry=0)
def report(seconds: float, tag: object = None) -> None:
    _gauged("reports", seconds, tag)
