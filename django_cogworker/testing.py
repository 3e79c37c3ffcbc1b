"""Helpers for testing code that enqueues jobs.

``inline()``: while active, ``.delay()`` runs the job at once in the calling
thread (after a JSON round trip of its arguments, as a worker would see them)
and raises nothing; failures are handled like a worker would, minus Redis.

``drain()``: runs every job waiting in the queues, in this process, through
the real retry/dead logic, against the configured Redis.

Both drop a job whose ``expires`` deadline has passed as a worker does
(``expiry.drop``: counted, logged, its unique lock released) instead of
running it; ``drain(include_scheduled=True)`` moves due entries with the
poller's script, which drops the expired ones itself.

Both run ``async def`` jobs too, each on an event loop of its own
(``execution.execute`` hands them to ``arun.run_here``). ``drain()`` runs
workflows (SPEC section 13) as a worker does: a member's end moves it in its
batch, a chain's next step is pushed, callbacks go to the schedule (run them
with ``include_scheduled=True``); ``inline()`` runs a batch's members as
they are enqueued, and keeps no batch state.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

from django_cogworker import client, execution, expiry
from django_cogworker.conf import Config, get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import BadPayload
from django_cogworker.filing import file_job
from django_cogworker.ledger import ACK, Filing, Pending
from django_cogworker.payload import Payload, decode
from django_cogworker.poller import move_due
from django_cogworker.work import UnitOfWork
from django_cogworker.workflows import effects
from django_cogworker.workflows.ends import settle_flow

logger = logging.getLogger("django_cogworker")


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
        if _expired(payload):
            # Dropped unrun: neither processed nor failed.
            result.outcomes.append(execution.Outcome(execution.ACK, jid=str(payload.get("jid")), failed=None))
            return
        raw = json.dumps(payload).encode()
        outcome = execution.execute(raw, get_config(), close_connections=False)
        result.outcomes.append(outcome)
        if outcome.interrupted is not None:
            raise outcome.interrupted

    client.inline_runner = run
    try:
        yield result
    finally:
        client.inline_runner = previous


def drain(queues: list[str] | None = None, *, include_scheduled: bool = False, max_jobs: int = 10_000) -> int:
    """Runs queued jobs until the queues are empty; returns how many ran
    (a job dropped past its ``expires`` deadline did not run).

    Failures are filed in the retry or dead set as a worker would file them
    (retries are not run again unless ``include_scheduled`` moves due ones).
    A job that raises ``KeyboardInterrupt`` is filed the same way, then the
    interrupt is raised to the caller (this runs in the caller's thread,
    where Ctrl-C must stop it); any other exception is only filed.
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
        try:
            payload: Payload | None = decode(got)
        except BadPayload:
            payload = None  # execute() files it in dead, raw kept (G13)
        if payload is not None and _expired(payload):
            continue
        outcome = execution.execute(got, config, close_connections=False, payload=payload)
        ran += 1
        if payload is not None and "bid" in payload:
            _apply_flow(redis_client, k, outcome, config, UnitOfWork("", got), payload)
        else:
            _apply(redis_client, k, outcome, config)
        if outcome.interrupted is not None:
            # Filed first: a KeyboardInterrupt stops the caller, as Ctrl-C
            # should, and loses no job.
            raise outcome.interrupted
    return ran


def _expired(payload: Payload) -> bool:
    """Whether a job starts past its deadline: then it is dropped as a
    worker drops it (``expiry.drop``). When Redis's time cannot be read, it
    runs, as on a worker."""
    if expiry.FIELD not in payload:
        return False
    redis_client = get_redis()
    try:
        late = expiry.expired(payload, expiry.clock.now(redis_client))
    except Exception as exc:
        logger.warning("could not read Redis's time (%s); running jid=%s", exc, payload.get("jid"))
        return False
    if late:
        expiry.drop(redis_client, get_keys(), [payload], "not started in time")
        effects.expired(redis_client, get_keys(), get_config(), [payload])
    return late


def _pop_any(redis_client: Any, k: Any, names: list[str]) -> bytes | None:
    for name in names:
        raw = redis_client.rpop(k.queue(name))
        if raw is not None:
            return bytes(raw)
    return None


def _apply(redis_client: Any, k: Any, outcome: execution.Outcome, config: Config) -> None:
    """Files a failure with the script a worker files it with (``file.lua``:
    the dead set trimmed to DEAD_TIMEOUT and DEAD_MAX_JOBS alike)."""
    if outcome.kind in (execution.RETRY, execution.DEAD):
        zset = k.retry if outcome.kind == execution.RETRY else k.dead
        trim = outcome.kind == execution.DEAD
        payload, jid = outcome.encoded(), outcome.jid
        file_job(redis_client, k, config, None, b"", zset, outcome.score, payload, jid, trim)


def _apply_flow(
    redis_client: Any, k: Any, outcome: execution.Outcome, config: Config, work: UnitOfWork, payload: Payload
) -> None:
    """A workflow's job (SPEC section 13): its end with its effects, as a
    worker under basic fetch sends it (no list)."""
    how: Pending = ACK
    if outcome.kind in (execution.RETRY, execution.DEAD):
        zset = k.retry if outcome.kind == execution.RETRY else k.dead
        how = Filing(zset, outcome.score, outcome.encoded(), outcome.jid, outcome.kind == execution.DEAD)
    work.result = outcome.result
    work.lost = outcome.kind == execution.ACK and outcome.failed is True and not outcome.expired
    settle_flow(redis_client, k, config, None, work, how, payload)


def _move_due(redis_client: Any, k: Any) -> None:
    # With the poller's script: an unreadable entry goes to "default"
    # unchanged, where execute() files it in dead (G13).
    for zset in (k.schedule, k.retry):
        move_due(redis_client, k, zset)
