"""Jobs of workflows under faults (SPEC section 13, G22), for
tests/test_batches_chaos.py and tests/test_batches_faults.py.

Members note their runs like ``jobs.noted_pace``; a callback notes, at its
start, the figures of its batch read from the batch's keys in one
MULTI/EXEC, so a test sees whether its condition held when it ran.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django_cogworker import current_batch, current_job, job
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from testproject.testapp.jobs import _note

#: The sentinel in a batch's pending set while its members are being pushed.
OPEN = ":open"


def _first_run(what: str) -> bool:
    """True on the first run of the current job (per jid) that asks."""
    ctx = current_job()
    key = f"{get_config().namespace}:test:{what}:{ctx.jid if ctx else ''}"
    return bool(get_redis().set(key, 1, nx=True))


def _bid() -> str | None:
    batch = current_batch()
    return batch.bid if batch is not None else None


def figures(bid: str) -> dict[str, Any]:
    """A batch's figures, read from its keys in one MULTI/EXEC: the sizes of
    its sets (pending without the ``:open`` sentinel), whether it is still
    open, and the events fired (``fired:<event>`` fields of its hash)."""
    k = get_keys()
    pipe = get_redis().pipeline(transaction=True)
    for part in ("members", "pending", "failed", "succeeded", "dead"):
        pipe.scard(k.batch(bid, part))
    pipe.sismember(k.batch(bid, "pending"), OPEN)
    pipe.hgetall(k.batch(bid))
    total, pending, failed, succeeded, dead, is_open, fields = pipe.execute()
    fired = sorted(f.decode()[6:] for f in fields if f.startswith(b"fired:"))
    return {
        "total": total,
        "pending": pending - int(bool(is_open)),
        "open": bool(is_open),
        "failed": failed,
        "succeeded": succeeded,
        "dead": dead,
        "fired": fired,
    }


@job(retry_in=lambda count, exc: 0.2)
def member(seconds: float, tag: object = None) -> None:
    """A short member: notes its start and its end (with its batch)."""
    _note("started", tag=tag, bid=_bid())
    time.sleep(seconds)
    _note("runs", tag=tag, bid=_bid())


@job(retry_in=lambda count, exc: 0.2)
def fan_out(n: int, seconds: float, tag: str) -> None:
    """Adds ``n`` members to its batch (``current_batch().add``), then
    takes ``seconds``: a kill then catches it with its members added."""
    _note("started", tag=tag, bid=_bid())
    batch = current_batch()
    assert batch is not None
    for i in range(n):
        batch.add(member.s(seconds, f"{tag}-{i}"))
    time.sleep(seconds)
    _note("runs", tag=tag, bid=_bid())


@job(retry=5, retry_in=lambda count, exc: 0.2)
def flaky(seconds: float, tag: object = None) -> None:
    """Fails its first run (per jid), succeeds on the next."""
    _note("started", tag=tag, bid=_bid())
    time.sleep(seconds)
    if _first_run("flaked"):
        _note("failed", tag=tag, bid=_bid())
        raise ValueError("fails once")
    _note("runs", tag=tag, bid=_bid())


@job(retry=5, retry_in=lambda count, exc: 0.5)
def fails_then_succeeds(times: int, tag: object = None) -> None:
    """Fails its first ``times`` tries, then succeeds."""
    ctx = current_job()
    if ctx is not None and ctx.retry_count < times:
        _note("failed", tag=tag, bid=_bid())
        raise ValueError(f"try {ctx.retry_count + 1} of {times} failing")
    _note("runs", tag=tag, bid=_bid())


@job(retry=0)
def doomed(tag: object = None) -> None:
    """Always fails, never retried: filed in dead."""
    _note("doomed", tag=tag, bid=_bid())
    raise ValueError("doomed")


@job(retry=0)
def doomed_once(tag: object = None) -> None:
    """Dies on its first run (per jid); a run after an admin's retry succeeds."""
    if _first_run("doomed"):
        _note("doomed", tag=tag, bid=_bid())
        raise ValueError("dies once")
    _note("runs", tag=tag, bid=_bid())


@job(retry=5, retry_in=lambda count, exc: 3600)
def fail_into_retry(tag: object = None) -> None:
    """Fails, and waits an hour in retry: for the admin to kill or delete it."""
    _note("doomed", tag=tag, bid=_bid())
    raise ValueError("waits in retry")


@job(retry=0)
def gated(tag: object = None, timeout_s: float = 120.0) -> None:
    """Holds its batch open until the test sets ``test:go:<tag>``."""
    _note("started", tag=tag, bid=_bid())
    key = f"{get_config().namespace}:test:go:{tag}"
    deadline = time.monotonic() + timeout_s
    while not get_redis().exists(key):
        if time.monotonic() > deadline:
            raise TimeoutError("no go")
        time.sleep(0.02)
    _note("runs", tag=tag, bid=_bid())


@job
def slow_first(seconds: float, tag: object = None) -> None:
    """Takes ``seconds`` on its first run only (per jid): a test stops the
    process running it; any later run is quick."""
    _note("started", tag=tag, bid=_bid(), thread=threading.current_thread().name)
    if _first_run("slow"):
        # Noted once this run knows it is the first: a test that stops the
        # process stops it in the sleep, not between asking and knowing.
        _note("sleeping", tag=tag, bid=_bid())
        time.sleep(seconds)
    _note("runs", tag=tag, bid=_bid(), thread=threading.current_thread().name)


@job
def probe(seconds: float, tag: object = None) -> None:
    """Notes which thread of which process ran it."""
    time.sleep(seconds)
    _note("probes", tag=tag, thread=threading.current_thread().name)


@job(retry_in=lambda count, exc: 0.2)
def on_event(label: str) -> None:
    """A callback: notes its batch's figures at its start, and what
    ``current_batch()`` says it is."""
    batch = current_batch()
    ctx = current_job()
    bid = batch.bid if batch is not None else str(ctx.jid if ctx else "").rsplit("-", 1)[0]
    _note(
        "callbacks",
        label=label,
        bid=bid,
        event=batch.event if batch is not None else None,
        description=batch.description if batch is not None else None,
        figures=figures(bid),
    )
    # Long enough for a chaos test's kills to catch some callbacks running
    # (they run again, under the same jid).
    time.sleep(1.0)


@job(retry_in=lambda count, exc: 0.2)
def link(chain_id: str, index: int, seconds: float, so_far: list[int] | None = None) -> list[int]:
    """A chain's step: gets the previous step's result (the indexes so
    far), returns it with its own index."""
    _note("started", tag=[chain_id, index], so_far=so_far)
    time.sleep(seconds)
    _note("runs", tag=[chain_id, index], so_far=so_far)
    return [*(so_far or []), index]


@job(retry_in=lambda count, exc: 0.2)
def square(i: int, seconds: float) -> int:
    """A chord's header member."""
    time.sleep(seconds)
    _note("runs", tag=["square", i], bid=_bid())
    return i * i


@job(retry_in=lambda count, exc: 0.2)
def gather(results: list[int] | None = None, tag: object = None) -> None:
    """A chord's body: notes the results it was given."""
    _note("bodies", tag=tag, results=results)
