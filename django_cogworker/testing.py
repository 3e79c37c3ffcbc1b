"""Helpers for testing code that enqueues jobs.

``inline()``: while active, ``.delay()`` runs the job at once in the calling
thread (after a JSON round trip of its arguments, as a worker would see them)
and raises nothing; failures are handled like a worker would, minus Redis.

``drain()``: runs every job waiting in the queues, in this process, through
the real retry/dead logic, against the configured Redis.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from django_cogworker import client, execution
from django_cogworker.conf import Config, get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.payload import Payload
from django_cogworker.poller import Poller


class InlineResult:
    def __init__(self) -> None:
        self.outcomes: list[execution.Outcome] = []


@contextlib.contextmanager
def inline() -> Iterator[InlineResult]:
    """``with inline() as result:`` runs ``.delay()`` inline; ``result.outcomes``
    holds what each job ended as (ACK, RETRY or DEAD)."""
    result = InlineResult()
    previous = client.inline_runner

    def run(payload: Payload) -> None:
        raw = json.dumps(payload).encode()
        result.outcomes.append(execution.execute(raw, get_config(), close_connections=False))

    client.inline_runner = run
    try:
        yield result
    finally:
        client.inline_runner = previous


def drain(queues: list[str] | None = None, *, include_scheduled: bool = False, max_jobs: int = 10_000) -> int:
    """Runs queued jobs until the queues are empty; returns how many ran.

    Failures are filed in the retry or dead set as a worker would file them
    (retries are not run again unless ``include_scheduled`` moves due ones).
    """
    config = get_config()
    redis_client, k = get_redis(), get_keys()
    names = queues or [q.name for q in config.queues]
    ran = 0
    while ran < max_jobs:
        if include_scheduled:
            _move_due(redis_client, k)
        got = redis_client.rpop(k.queue(names[0])) if len(names) == 1 else _pop_any(redis_client, k, names)
        if got is None:
            return ran
        outcome = execution.execute(got, config, close_connections=False)
        ran += 1
        _apply(redis_client, k, outcome, config)
    return ran


def _pop_any(redis_client: Any, k: Any, names: list[str]) -> bytes | None:
    for name in names:
        raw = redis_client.rpop(k.queue(name))
        if raw is not None:
            return bytes(raw)
    return None


def _apply(redis_client: Any, k: Any, outcome: execution.Outcome, config: Config) -> None:
    if outcome.kind == execution.RETRY:
        redis_client.zadd(k.retry, {outcome.encoded(): outcome.score})
    elif outcome.kind == execution.DEAD:
        # Trimmed as a worker's filing trims it (DEAD_TIMEOUT, DEAD_MAX_JOBS).
        pipe = redis_client.pipeline(transaction=False)
        pipe.zadd(k.dead, {outcome.encoded(): outcome.score})
        pipe.zremrangebyscore(k.dead, "-inf", f"({time.time() - config.dead_timeout_s!r}")
        pipe.zremrangebyrank(k.dead, 0, -(config.dead_max_jobs + 1))
        pipe.execute()


def _move_due(redis_client: Any, k: Any) -> None:
    now = time.time()
    for zset in (k.schedule, k.retry):
        for entry in redis_client.zrangebyscore(zset, "-inf", repr(now)):
            if redis_client.zrem(zset, entry):
                # As the poller moves it: an unreadable entry goes to
                # "default" unchanged, where execute() files it in dead (G13).
                queue, payload = Poller.prepare(entry, now)
                redis_client.lpush(k.queue(queue), payload)
