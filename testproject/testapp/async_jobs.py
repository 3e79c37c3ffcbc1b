"""``async def`` jobs the test suite runs in real worker processes.

Imported by a worker only when ``COGWORKER_TEST_ASYNC_JOBS`` is set (see
``jobs.py``): a registered ``async def`` job starts a process's event loop
and widens its bound (SPEC section 15), which the other tests must not get.
"""

from __future__ import annotations

import asyncio
import threading
import time

from asgiref.sync import sync_to_async

from django_cogworker import current_job, job
from django_cogworker.connection import get_redis
from testproject.testapp.jobs import _note


@job
async def asleep(seconds: float, tag: object = None) -> None:
    """Notes its start under ``started``, awaits, then notes under ``runs``
    the jid ``current_job()`` gives after the await."""
    _note("started", tag=tag)
    await asyncio.sleep(seconds)
    ctx = current_job()
    _note("runs", tag=tag, seen_jid=ctx.jid if ctx else None, thread=threading.current_thread().name)


@job
async def anoop() -> None:
    pass


@job(retry_in=lambda count, exc: 0.2)
async def anoted_pace(seconds: float, tag: object = None) -> None:
    """``noted_pace`` awaiting: notes its start, awaits, notes its end (the
    async variant of the chaos test)."""
    _note("started", tag=tag)
    await asyncio.sleep(seconds)
    _note("runs", tag=tag)


@job(retry=False)
async def ablock(seconds: float) -> None:
    """Blocks the event loop (the mistake the lag watch names)."""
    _note("started")
    time.sleep(seconds)
    _note("runs")


@job(timeout=1, retry=False)
async def asleep_past_timeout(seconds: float = 10) -> None:
    _note("started")
    await asyncio.sleep(seconds)
    _note("overran")


@job(retry=False)
async def await_go(key: str, tag: object = None) -> None:
    """Notes its start, then awaits until ``key`` is set (a test decides
    when the runs end)."""
    _note("started", tag=tag)
    while not get_redis().exists(key):
        await asyncio.sleep(0.05)
    _note("runs", tag=tag)


@job
async def stop_the_loop() -> None:
    """Stops the event loop under the worker: its thread ends as a crash would."""
    asyncio.get_running_loop().stop()


@job(hard_timeout=1, retry=False)
async def asleep_past_hard_timeout(seconds: float = 30) -> None:
    _note("started")
    await asyncio.sleep(seconds)
    _note("overran")


def _slow_query(seconds: float) -> None:
    from django.contrib.auth.models import Group

    Group.objects.exists()
    time.sleep(seconds)  # a slow query, in this job's own thread


@job(retry=False)
async def aorm(name: str, seconds: float) -> None:
    """An ORM call through ``sync_to_async`` that takes ``seconds``, then an
    ``acreate()``: jobs that each wait on their own thread run together."""
    from django.contrib.auth.models import Group

    await sync_to_async(_slow_query)(seconds)
    await Group.objects.acreate(name=name)
    _note("runs", tag=name)


@job(retry=False)
async def async_sync_orm() -> None:
    """Synchronous ORM on the loop: fails with SynchronousOnlyOperation."""
    from django.contrib.auth.models import Group

    Group.objects.exists()


@job
async def adouble(x: int) -> int:
    """A chain's step or a chord's member on the event loop (SPEC section 13)."""
    await asyncio.sleep(0)
    _note("runs", tag=x)
    return x * 2
