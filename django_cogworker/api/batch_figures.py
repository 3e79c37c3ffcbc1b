"""A batch's figures (SPEC section 13), read from its keys
(docs/redis-layout.md): what ``api.Batch`` and ``api.BatchSet`` return.

Duties: ``batch_figures(bids)`` reads many batches in one round trip: the
hash (description, kind, parent, created_at, the callbacks and when each
fired, settled_at), the sizes of the membership sets, the ``:open``
sentinel and the keys' TTL. The figures are the sizes of membership sets,
so they are never negative, whatever re-runs happened. Whatever Redis holds
is data: a key of the wrong type counts 0, a field that is not a number
reads as None, a callback that cannot be read is shown as unreadable, each
noted in ``malformed`` (SPEC section 8).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django_cogworker.api.parsing import as_dict, as_list, checked_number, is_wrong_type, loads_object
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import redis_boundary
from django_cogworker.keys import Keys
from django_cogworker.payload import text
from django_cogworker.workflows.batch import EVENTS

#: The member of ``pending`` that keeps a batch open while it is pushed.
OPEN_SENTINEL = ":open"

#: A child batch is a member of its parent under ``b:<child bid>``.
CHILD_PREFIX = "b:"

#: The membership sets, in the order ``_read`` counts them.
PARTS = ("members", "pending", "failed", "succeeded", "dead")

#: Redis commands queued per batch by ``_read``.
_READS = 9


@dataclass(frozen=True)
class Callback:
    """A callback recorded in a batch's hash, pushed (once) when its event fires."""

    #: One of ``EVENTS``, or "body": a chord's body, pushed at its success.
    event: str
    jid: str
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str
    #: When it was pushed (epoch seconds), None while its event has not fired.
    fired_at: float | None
    #: Why its payload cannot be read ("" when it can).
    unreadable: str = ""


@dataclass(frozen=True)
class BatchFigures:
    bid: str
    description: str
    #: "batch" or "chord".
    kind: str
    #: The parent batch's id, "" for a batch of its own.
    parent: str
    #: Epoch seconds (Redis's clock); None when unknown.
    created_at: float | None
    total: int
    #: Members not yet succeeded nor dead: waiting, running, or failed and
    #: waiting for a retry (``failed`` of them).
    pending: int
    failed: int
    succeeded: int
    dead: int
    #: Still being pushed (its last members not recorded yet).
    open: bool
    settled_at: float | None
    #: Event -> when it fired (epoch seconds), for those that fired.
    fired: dict[str, float]
    callbacks: tuple[Callback, ...]
    #: Seconds until its keys expire; None when they do not.
    expires_in_s: float | None
    malformed: tuple[str, ...] = field(default=())

    @property
    def settled(self) -> bool:
        """Every member succeeded or died (``settled`` fired)."""
        return self.settled_at is not None or "settled" in self.fired

    @property
    def done(self) -> int:
        return self.succeeded + self.dead

    @property
    def done_percent(self) -> float:
        """The share of members run to an outcome, 0 to 100 (100 for an empty batch)."""
        return 100.0 if self.total <= 0 else min(100.0, 100.0 * self.done / self.total)


def _queue_reads(pipe: Any, k: Keys, bid: str) -> None:
    pipe.hgetall(k.batch(bid))
    for part in PARTS:
        pipe.scard(k.batch(bid, part))
    pipe.sismember(k.batch(bid, "pending"), OPEN_SENTINEL)
    pipe.pttl(k.batch(bid))
    pipe.zscore(k.batches, bid)


def _number(key: str, name: str, raw: Any, notes: list[str]) -> float | None:
    if raw is None:
        return None
    value, why = checked_number(raw, float)
    if why:
        notes.append(f"{key}: the field {name} is {why}")
        return None
    return float(value)


def _callback(event: str, raw: bytes, fired_at: float | None, bid: str) -> Callback:
    payload = loads_object(raw)
    if payload is None:
        return Callback(event, f"{bid}-{event}", "", [], {}, "", fired_at, "its payload is unreadable")
    return Callback(
        event,
        str(payload.get("jid") or ""),
        str(payload.get("job") or ""),
        as_list(payload.get("args")),
        as_dict(payload.get("kwargs")),
        str(payload.get("queue") or ""),
        fired_at,
    )


def _figures(k: Keys, bid: str, replies: list[Any]) -> BatchFigures | None:
    """A batch's figures from its replies (``_queue_reads``); None when its
    hash is gone (expired, deleted, never there)."""
    raw_hash, *sizes, is_open, pttl, score = replies
    notes: list[str] = []
    key = k.batch(bid)
    if is_wrong_type(raw_hash):
        notes.append(f"{key} is not a hash: its description and callbacks are unknown")
        raw_hash = {}
    elif not raw_hash:
        return None
    fields = {text(name): value for name, value in raw_hash.items()}
    counts = []
    for part, size in zip(PARTS, sizes, strict=True):
        if is_wrong_type(size):
            notes.append(f"{k.batch(bid, part)} is not a set: counted as 0")
        counts.append(0 if is_wrong_type(size) else int(size))
    total, pending, failed, succeeded, dead = counts
    opened = not is_wrong_type(is_open) and bool(is_open)
    fired = {}
    for event in EVENTS:
        at = _number(key, f"fired:{event}", fields.get(f"fired:{event}"), notes)
        if at is not None:
            fired[event] = at
    callbacks = [
        _callback(event, fields[f"cb:{event}"], fired.get(event), bid)
        for event in EVENTS
        if f"cb:{event}" in fields
    ]
    if "body" in fields:
        callbacks.append(_callback("body", fields["body"], fired.get("success"), bid))
    created = _number(key, "created_at", fields.get("created_at"), notes)
    index_score = None if is_wrong_type(score) or score is None else float(score)
    return BatchFigures(
        bid=bid,
        description=text(fields.get("description", b"")),
        kind=text(fields.get("kind", b"")) or "batch",
        parent=text(fields.get("parent", b"")),
        created_at=created if created is not None else index_score,
        total=total,
        pending=max(0, pending - opened) + failed,
        failed=failed,
        succeeded=succeeded,
        dead=dead,
        open=opened,
        settled_at=_number(key, "settled_at", fields.get("settled_at"), notes),
        fired=fired,
        callbacks=tuple(callbacks),
        expires_in_s=pttl / 1000 if isinstance(pttl, int) and pttl >= 0 else None,
        malformed=tuple(notes),
    )


@redis_boundary("read the batches")
def batch_figures(bids: Iterable[str]) -> list[BatchFigures | None]:
    """The figures of each batch of ``bids`` (None for one that is gone), in one round trip."""
    bids = list(bids)
    k = get_keys()
    pipe = get_redis().pipeline(transaction=False)
    for bid in bids:
        _queue_reads(pipe, k, bid)
    replies = pipe.execute(raise_on_error=False)
    return [_figures(k, bid, replies[_READS * i : _READS * i + _READS]) for i, bid in enumerate(bids)]
