"""Jobs of workflows (SPEC section 13), for tests/test_batches.py and
tests/test_chains.py (and the chaos tests of batches).

Each records its run under the test's namespace (``test:runs``), with the
batch it saw (``current_batch()``); callbacks record under ``test:callbacks``.
"""

from __future__ import annotations

from typing import Any

from django_cogworker import batch, current_batch, job
from django_cogworker.conf import get_config
from django_cogworker.connection import get_redis
from testproject.testapp.jobs import _note


def _seen() -> dict[str, Any]:
    b = current_batch()
    return {"bid": b.bid, "event": b.event} if b is not None else {"bid": None, "event": None}


@job
def member(tag: object = None) -> object:
    _note("runs", tag=tag, **_seen())
    return tag


@job
def described(tag: object = None) -> None:
    b = current_batch()
    _note("runs", tag=tag, description=b.description if b else None, **_seen())


@job
def callback(tag: object = None) -> None:
    _note("callbacks", tag=tag, **_seen())


@job(retry=3, retry_in=lambda count, exc: 0.1)
def fail_times(tag: str, times: int) -> str:
    """Fails its first ``times`` runs (counted in Redis), then succeeds."""
    runs = get_redis().incr(f"{get_config().namespace}:test:tries:{tag}")
    _note("runs", tag=tag, attempt=runs)
    if runs <= times:
        raise ValueError(f"{tag} fails run {runs}")
    return tag


@job(retry=0)
def die(tag: object = None) -> None:
    _note("runs", tag=tag)
    raise ValueError(f"{tag} dies")


@job
def fan_out(tag: str, count: int) -> None:
    """Adds ``count`` members to its own batch."""
    b = current_batch()
    assert b is not None
    for i in range(count):
        b.add(member.s(f"{tag}-{i}"))
    _note("runs", tag=tag, **_seen())


@job
def open_child(tag: str, count: int) -> None:
    """Opens a child batch of ``count`` members, with its own callback."""
    with batch(description=f"child of {tag}", on_settled=callback.s(f"{tag}-child-settled")):
        for i in range(count):
            member.delay(f"{tag}-child-{i}")
    _note("runs", tag=tag, **_seen())


@job
def add(x: int, y: int = 0) -> int:
    _note("runs", tag=[x, y])
    return x + y


@job
def double(x: int) -> int:
    _note("runs", tag=x)
    return x * 2


@job
def collect(results: list[Any], tag: object = None) -> None:
    _note("callbacks", tag=tag, results=results, **_seen())


@job
def huge(size: int) -> str:
    _note("runs", tag=size)
    return "x" * size


@job(retry=0)
def dies_in_chain(x: int) -> int:
    """Dies unless the test has set ``test:heal`` (then returns x + 100)."""
    _note("runs", tag=x)
    if not get_redis().get(f"{get_config().namespace}:test:heal"):
        raise ValueError("dies in chain")
    return x + 100
