"""How a limiter is laid out in Redis (``docs/redis-layout.md``): the keys
and arguments the limiter scripts take, and what their replies mean;
shared by the calls of one slot (:mod:`.state`) and those of a sharded
layout (:mod:`.sharded`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django_cogworker.keys import Keys
from django_cogworker.limits.limiter import Limiter, limiter_of
from django_cogworker.scripts import Arg

#: A waiter put back on its queue keeps its slot reserved this long: time
#: for a worker to fetch it. One never fetched (deleted from its queue)
#: stops holding the slot back after that.
PROMOTED_TTL_S = 60

#: Members of a process's holds set: "<name>\0<jid>" (a name holds no NUL).
SEPARATOR = "\0"


@dataclass(frozen=True)
class Admission:
    """How a job's admission went: ``admitted``; else the full limiter's
    name, and the seconds until a rate's window has room (0: a release
    wakes it); ``ours`` False when the job was no longer ours (G18)."""

    admitted: bool
    name: str = ""
    wait_s: float = 0.0
    ours: bool = True


def used_key(keys: Keys, limiter: Limiter) -> str:
    return keys.limit(limiter.name, "holders" if limiter.kind == "c" else "starts")


def common_keys(keys: Keys, limiter: Limiter) -> list[str]:
    """used, promoted, max, queues: the keys lib/limits.lua's functions take."""
    name = limiter.name
    return [
        used_key(keys, limiter),
        keys.limit(name, "promoted"),
        keys.limit(name, "max"),
        keys.limit(name, "queues"),
    ]


def numbers(limiter: Limiter) -> list[Arg]:
    """kind, n, per: how the scripts take a limiter."""
    return [limiter.kind, limiter.n, repr(limiter.per)]


def waiting_queues(
    client: Any, keys: Keys, name: str, limiter: Limiter | None
) -> tuple[Limiter | None, list[str]]:
    """A wake's first read: the limiter (from its declared spec when not
    given) and the queues noted as having waiters for it, by name."""
    pipe = client.pipeline(transaction=False)
    pipe.hget(keys.limits, name)
    pipe.smembers(keys.limit(name, "queues"))
    spec, queues = pipe.execute()
    return limiter or limiter_of(name, spec), sorted(text(q) for q in queues)


def text(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
