"""The limiters themselves: a name and a number, and ``acquire()`` for job
code, which holds something only inside a worker process (the worker binds
its side, :mod:`django_cogworker.limits.running`, at start).
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from django_cogworker.escaping import storable

#: The names of the limiters ``QUEUE_LIMITS`` makes (``queue:reports``);
#: not for other limiters.
QUEUE_PREFIX = "queue:"

MAX_NAME_LENGTH = 200


def check_name(name: object, *, queue: bool = False) -> str:
    """A limiter's name: text of 1 to 200 characters that a Redis key can
    carry (no lone surrogate), with no control character; ``queue:`` is
    ``QUEUE_LIMITS``'s own."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"a limiter's name must be text of 1 to {MAX_NAME_LENGTH} characters, not {name!r}")
    if storable(name) != name or any(unicodedata.category(c) == "Cc" for c in name):
        raise ValueError(f"limiter name {name!r} holds a control character or a lone surrogate")
    if name.startswith(QUEUE_PREFIX) and not queue:
        raise ValueError(f"limiter name {name!r}: names starting with {QUEUE_PREFIX!r} are QUEUE_LIMITS'")
    return name


def _whole(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a whole number >= 1, not {value!r}")
    return value


class InJob(Protocol):
    """The worker's side of ``acquire()`` (``limits.running``)."""

    def acquire(self, limiter: Limiter) -> bool: ...

    def release(self, limiter: Limiter) -> None: ...


#: Set in a worker process (``limits.running.bind``); None elsewhere.
_worker: InJob | None = None


def bind_worker(worker: InJob | None) -> None:
    global _worker
    _worker = worker


class Limiter:
    """What the limiters share: a name, a number, and ``acquire()``."""

    #: "c" (concurrency) or "r" (rate), as the scripts know them.
    kind = ""
    per = 0.0

    def __init__(self, name: str, n: int, *, _queue: bool = False) -> None:
        self.name = check_name(name, queue=_queue)
        self.n = _whole(n, f"limiter {name!r}: n")

    def spec(self) -> str:
        """What the registry (``N:limits``) keeps of it, as JSON."""
        spec: dict[str, object] = {"kind": "concurrency" if self.kind == "c" else "rate", "n": self.n}
        if self.kind == "r":
            spec["per"] = self.per
        return json.dumps(spec)

    @contextmanager
    def acquire(self) -> Iterator[None]:
        """Holds the limiter while the block runs, inside a job's code. Over
        the limit it raises :class:`OverLimit`: the job waits and runs
        again from its start (not a failure, not a retry). Outside a worker
        (``testing.inline``/``drain``, a shell) it holds nothing."""
        worker = _worker
        held = worker is not None and worker.acquire(self)
        try:
            yield
        finally:
            if held:
                assert worker is not None
                worker.release(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Limiter) and (self.kind, self.name, self.n, self.per) == (
            other.kind,
            other.name,
            other.n,
            other.per,
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.name, self.n, self.per))


class Concurrency(Limiter):
    """At most ``n`` jobs hold it at once, across every worker process. A
    slot held by a process that died is freed when its jobs are recovered
    (G23), never because a job is slow."""

    kind = "c"

    def __repr__(self) -> str:
        return f"Concurrency({self.name!r}, {self.n})"


class Rate(Limiter):
    """At most ``n`` starts in any window of ``per`` seconds (a sliding
    window, on Redis's clock)."""

    kind = "r"

    def __init__(self, name: str, n: int, *, per: float = 1.0) -> None:
        super().__init__(name, n)
        if isinstance(per, bool) or not isinstance(per, int | float) or not math.isfinite(per) or per <= 0:
            raise ValueError(f"limiter {name!r}: per must be a positive number of seconds, not {per!r}")
        self.per = float(per)

    def __repr__(self) -> str:
        return f"Rate({self.name!r}, {self.n}, per={self.per:g})"


def for_queue(queue: str, n: int) -> Concurrency:
    """The limiter of a queue in ``QUEUE_LIMITS``."""
    return Concurrency(QUEUE_PREFIX + queue, n, _queue=True)


def limiter_of(name: str, spec: Any) -> Limiter | None:
    """The limiter a registry entry (``N:limits``) describes; None when it
    cannot be read."""
    try:
        value = json.loads(spec or "")
        n = value["n"]
        if value.get("kind") == "rate":
            return Rate(name, n, per=value["per"])
        return Concurrency(name, n, _queue=True)
    except Exception:
        return None
