"""Middleware the test suite configures in real worker processes.

Each notes what it saw in Redis under the test's own namespace, like the
jobs of ``jobs.py``, so a test can see every call in any process.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from django_cogworker.conf import get_config
from django_cogworker.connection import get_redis
from django_cogworker.middleware import ClientMiddleware, Result, ServerMiddleware
from django_cogworker.payload import Payload


def _note(kind: str, **entry: object) -> None:
    get_redis().rpush(f"{get_config().namespace}:test:{kind}", json.dumps({"pid": os.getpid(), **entry}))


class NoteRuns(ServerMiddleware):
    """Notes every run: its jid, job, periodic slot, and how it ended."""

    def before(self, payload: Payload) -> None:
        _note(
            "middleware",
            hook="before",
            jid=payload.get("jid"),
            job=payload.get("job"),
            slot=payload.get("periodic_slot"),
            tagged=payload.get("tagged_by"),
            at=time.time(),
        )

    def after(self, payload: Payload, result: Result) -> None:
        _note(
            "middleware",
            hook="after",
            jid=payload.get("jid"),
            job=payload.get("job"),
            slot=payload.get("periodic_slot"),
            status=result.status,
            error=type(result.exc).__name__ if result.exc else None,
            at=time.time(),
        )


class TagPayloads(ClientMiddleware):
    """Adds a field to every payload it lets through."""

    def enqueue(self, payload: Payload, *, at: float | None = None) -> Payload | None:
        return {**payload, "tagged_by": "TagPayloads"}


class AsyncNotes(ServerMiddleware):
    """A server middleware with an async form: notes which form ran."""

    def before(self, payload: Payload) -> None:
        _note("middleware", hook="before", jid=payload.get("jid"))

    def after(self, payload: Payload, result: Result) -> None:
        _note("middleware", hook="after", jid=payload.get("jid"), status=result.status)

    async def abefore(self, payload: Payload) -> None:
        await asyncio.sleep(0)
        _note("middleware", hook="abefore", jid=payload.get("jid"))

    async def aafter(self, payload: Payload, result: Result) -> None:
        await asyncio.sleep(0)
        _note("middleware", hook="aafter", jid=payload.get("jid"), status=result.status)
