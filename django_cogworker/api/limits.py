"""The limiters (SPEC section 14) as operators and the admin see them.

Duties: ``Limit(name)`` reads a limiter's kind, the limit in force (an
override set here, else the ``n`` its code declared), its holders (a
concurrency limiter's slots taken; a rate's starts in its current window,
on Redis's clock) and its waiting jobs; ``set(n)`` and ``reset()`` change
the limit at once and then wake the waiters it lets start
(``limits.state.wake``, the one home of promotion). ``Limit.all()`` lists
the limiters of the registry (``N:limits``); ``limit_figures()`` reads the
figures of many in a fixed number of round trips (two, three when a rate
is among them: its window is read on Redis's clock), for the Limits page
and the metrics endpoint.

Whatever Redis holds is data: a registry entry whose name is not UTF-8 or
not a limiter's name is skipped with a note (``Listing.skipped``); a key of
the wrong type reads as empty, an unreadable spec as an unknown kind, an
override that is not a whole number as none, each noted in
``LimitFigures.malformed`` (SPEC section 8). Redis errors reach the caller
as ``CogworkerError`` (``errors.redis_boundary``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django_cogworker.api.parsing import (
    Listing,
    is_wrong_type,
    names_in,
    quoted,
    set_names,
    unless_wrong_type,
)
from django_cogworker.api.records import PAGE_SIZE, JobRecord
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import redis_boundary
from django_cogworker.limits import Limiter, Rate, state
from django_cogworker.limits.limiter import check_name, limiter_of
from django_cogworker.metrics import MAX_COUNTER
from django_cogworker.payload import text


@dataclass(frozen=True)
class LimitFigures:
    name: str
    #: "concurrency" or "rate"; None when the registry has no readable spec.
    kind: str | None
    #: A rate's window (s); None for a concurrency limiter.
    per_s: float | None
    #: The n its code declared (the registry's); None when unknown.
    declared: int | None
    #: The n set by ``Limit.set()``; None when there is none.
    override: int | None
    #: The limit in force: the override, else the declared n.
    limit: int | None
    holders: int
    waiting: int
    #: Why a value was read as a default (a key of the wrong type, ...).
    malformed: tuple[str, ...] = ()


class Limit:
    """One limiter, by name; a name its code never used reads as unknown
    (kind and limit None, no holders, no waiting job)."""

    def __init__(self, name: str) -> None:
        # Also refuses what no key can be built from (a lone surrogate).
        self.name = check_name(name, queue=True)

    def __repr__(self) -> str:
        return f"<Limit {self.name}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Limit) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    @classmethod
    @redis_boundary("list the limiters")
    def all(cls) -> Listing[Limit]:
        """Every limiter of the registry, by name."""
        key = get_keys().limits
        skipped: list[str] = []
        reply: Any = unless_wrong_type(lambda: get_redis().hkeys(key), None)
        if reply is None:
            return Listing([], [f"{key} is not a hash: no limiter is listed"])
        limits = []
        for name in names_in(key, reply, skipped):
            try:
                limits.append(cls(name))
            except ValueError as exc:
                skipped.append(f"{key}: {exc}: skipped")
        return Listing(limits, skipped)

    def figures(self) -> LimitFigures:
        return limit_figures([self])[0]

    @property
    def kind(self) -> str | None:
        return self.figures().kind

    @property
    def limit(self) -> int | None:
        return self.figures().limit

    @property
    def holders(self) -> int:
        return self.figures().holders

    @property
    def waiting(self) -> int:
        return self.figures().waiting

    def set(self, n: int) -> int:
        """Makes ``n`` the limit in force, at once, in every process; 0 holds
        every job of the limiter back. Returns how many waiting jobs it let
        start (back on their queues)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_COUNTER:
            raise ValueError(f"limiter {self.name!r}: a limit must be a whole number >= 0, not {n!r}")
        with redis_boundary("change a limit"):
            get_redis().set(get_keys().limit(self.name, "max"), n)
        return self._wake()

    def reset(self) -> int:
        """Drops the override: the limit is the one its code declares again.
        Returns how many waiting jobs it let start."""
        with redis_boundary("reset a limit"):
            get_redis().delete(get_keys().limit(self.name, "max"))
        return self._wake()

    @redis_boundary("let a limiter's waiting jobs in (its limit is changed)")
    def _wake(self) -> int:
        # After the write: the wake reads the new limit.
        return state.wake(get_redis(), get_keys(), self.name)[0]

    @redis_boundary("read a limiter's holders")
    def holder_jobs(self) -> list[tuple[str, str]]:
        """(jid, process identity) of each holder, by jid: a concurrency
        limiter's slots; for a rate, the jobs started in its current window
        (a rate keeps no process: the identity is "")."""
        figures = self.figures()
        client, k = get_redis(), get_keys()
        per_s = figures.per_s
        if per_s is not None:
            since = _redis_now(client) - per_s
            starts = k.limit(self.name, "starts")
            members: list[bytes] = unless_wrong_type(
                lambda: client.zrangebyscore(starts, f"({since!r}", "+inf"), []
            )
            # Members are "<jid>:<start>": the jid is what precedes the last colon.
            return sorted((text(m).rpartition(":")[0], "") for m in members)
        held: dict[bytes, bytes] = unless_wrong_type(
            lambda: client.hgetall(k.limit(self.name, "holders")), {}
        )
        return sorted((text(jid), text(identity)) for jid, identity in held.items())

    @redis_boundary("read a limiter's waiting jobs")
    def waiting_jobs(self, start: int = 0, count: int = PAGE_SIZE) -> list[JobRecord]:
        """Waiting jobs ``start`` to ``start + count``: each queue's in the
        order they will be let in (oldest first), queues by name."""
        client, k = get_redis(), get_keys()
        queues = set_names(client, k.limit(self.name, "queues"), [])
        lists = [k.limit_waiting(self.name, q) for q in queues]
        pipe = client.pipeline(transaction=False)
        for key in lists:
            pipe.llen(key)
        sizes = [0 if is_wrong_type(n) else int(n) for n in pipe.execute(raise_on_error=False)]
        # The slice of each list that falls in start .. start + count.
        ranges = []
        skip, left = max(0, start), max(0, count)
        for key, size in zip(lists, sizes, strict=True):
            if left and skip < size:
                ranges.append((key, skip, min(size, skip + left) - 1))
                left -= min(size, skip + left) - skip
            skip = max(0, skip - size)
        pipe = client.pipeline(transaction=False)
        for key, first, last in ranges:
            pipe.lrange(key, first, last)
        found: list[JobRecord] = []
        for (key, _, _), raws in zip(ranges, pipe.execute(raise_on_error=False), strict=True):
            if not is_wrong_type(raws):  # changed type since its LLEN
                found += [JobRecord(raw, source=key, kind="queue") for raw in raws]
        return found


def _redis_now(client: Any) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


def _override(key: str, reply: Any, notes: list[str]) -> int | None:
    """The override a ``GET`` read; None when unset, or when it is not a
    whole number >= 0 (``set()`` writes nothing else), noted: the page says
    to set or reset it rather than guess how a worker reads it."""
    if reply is None:
        return None
    if is_wrong_type(reply):
        notes.append(f"{key} is not a string: no override is in force")
        return None
    raw = text(reply)
    if raw.isascii() and raw.isdigit() and int(raw) <= MAX_COUNTER:
        return int(raw)
    notes.append(f"{key} holds {quoted(reply)}, not a whole number >= 0: set or reset the limit")
    return None


@dataclass
class _FirstRead:
    """What the first round trip read of one limiter."""

    name: str
    limiter: Limiter | None
    override: int | None
    holders: int
    queues: list[str]
    notes: list[str]


def _first_read(k: Any, name: str, replies: list[Any]) -> _FirstRead:
    spec, override, holders, queues = replies
    notes: list[str] = []
    if is_wrong_type(spec):
        notes.append(f"{k.limits} is not a hash: the limiter's kind is unknown")
        spec = None
    limiter = None if spec is None else limiter_of(name, spec)
    if spec is not None and limiter is None:
        notes.append(f"{k.limits}: the spec of {name!r}, {quoted(spec)}, cannot be read")
    if is_wrong_type(holders):
        notes.append(f"{k.limit(name, 'holders')} is not a hash: no holder is counted")
        holders = 0
    return _FirstRead(
        name,
        limiter,
        _override(k.limit(name, "max"), override, notes),
        int(holders),
        names_in(k.limit(name, "queues"), queues, notes),
        notes,
    )


@redis_boundary("read the limiters")
def limit_figures(limits: Iterable[Limit]) -> list[LimitFigures]:
    """The figures of each of ``limits``, in a fixed number of round trips:
    the registry entry, override, holders and queues of them all, then
    (after Redis's clock, when a rate is among them) the rates' starts in
    their window and the lengths of the waiting lists."""
    limits = list(limits)
    client, k = get_redis(), get_keys()
    pipe = client.pipeline(transaction=False)
    for limit in limits:
        pipe.hget(k.limits, limit.name)
        pipe.get(k.limit(limit.name, "max"))
        pipe.hlen(k.limit(limit.name, "holders"))
        pipe.smembers(k.limit(limit.name, "queues"))
    replies = pipe.execute(raise_on_error=False)
    read = [_first_read(k, limit.name, replies[4 * i : 4 * i + 4]) for i, limit in enumerate(limits)]
    now = _redis_now(client) if any(isinstance(r.limiter, Rate) for r in read) else 0.0
    pipe = client.pipeline(transaction=False)
    for r in read:
        if isinstance(r.limiter, Rate):
            pipe.zcount(k.limit(r.name, "starts"), f"({now - r.limiter.per!r}", "+inf")
        for queue in r.queues:
            pipe.llen(k.limit_waiting(r.name, queue))
    counts = iter(pipe.execute(raise_on_error=False))
    return [_figures(k, r, counts) for r in read]


def _figures(k: Any, r: _FirstRead, counts: Iterator[Any]) -> LimitFigures:
    """A limiter's figures, from its first read and its replies of the second."""
    holders = r.holders
    if isinstance(r.limiter, Rate):
        starts = next(counts)
        if is_wrong_type(starts):
            r.notes.append(f"{k.limit(r.name, 'starts')} is not a sorted set: no start is counted")
        holders = 0 if is_wrong_type(starts) else int(starts)
    waiting = 0
    for queue in r.queues:
        size = next(counts)
        if is_wrong_type(size):
            r.notes.append(f"{k.limit_waiting(r.name, queue)} is not a list: its jobs are not counted")
        else:
            waiting += int(size)
    declared = None if r.limiter is None else r.limiter.n
    kind = None if r.limiter is None else ("rate" if isinstance(r.limiter, Rate) else "concurrency")
    return LimitFigures(
        name=r.name,
        kind=kind,
        per_s=r.limiter.per if isinstance(r.limiter, Rate) else None,
        declared=declared,
        override=r.override,
        limit=r.override if r.override is not None else declared,
        holders=holders,
        waiting=waiting,
        malformed=tuple(r.notes),
    )
