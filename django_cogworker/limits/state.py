"""The limiters' state in Redis, and the calls that change it (SPEC
section 14, ``docs/redis-layout.md``).

Duties: build each script's KEYS from a limiter's name (every key in
``KEYS``, so the scripts run on Redis Cluster: the namespace's hash tag
keeps them in one slot), and read their replies:

- :func:`admit`, at a job's start (``admit.lua``): all its limiters or
  none; over a limit the job is parked in the same step;
- :func:`park`, a job whose code met a full limiter (``park.lua``);
- :func:`release_args`, what ``ack.lua``/``file.lua`` need to free a
  finished job's slots in the same call that settles it;
- :func:`release`, a slot taken in job code, when its block ends;
- :func:`held`, what a process holds, for the recovery that frees it (G23);
- :func:`wake`, waiters moved back onto their queues while there is room;
- :func:`unreserve`, the reservation of a promoted waiter dropped unrun;
- :func:`sweep`, each poller pass: wakes that were missed, idle names forgotten.

Under ``SHARDING`` a job's lists and its limiters are in two slots: each
call then goes to :mod:`.sharded`, which splits it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django_cogworker import lazy
from django_cogworker.keys import Keys
from django_cogworker.limits.layout import (
    PROMOTED_TTL_S,
    SEPARATOR,
    Admission,
    common_keys,
    numbers,
    text,
    waiting_queues,
)
from django_cogworker.limits.limiter import Limiter, limiter_of
from django_cogworker.scripts import Arg, script

if TYPE_CHECKING:
    from django_cogworker.limits import sharded
else:
    sharded = lazy.Module("django_cogworker.limits.sharded")  # loaded under SHARDING only

logger = logging.getLogger("django_cogworker")


def admit(
    client: Any,
    keys: Keys,
    inprogress: str,
    identity: str,
    raw: bytes,
    jid: str,
    queue: str,
    limiters: Sequence[Limiter],
    *,
    park: bool = True,
    listed: bool = True,
) -> Admission:
    if keys.sharded:
        return sharded.admit(
            client, keys, inprogress, identity, raw, jid, queue, limiters, park=park, listed=listed
        )
    script_keys = [inprogress, keys.limit_held(identity), keys.limits]
    args: list[Arg] = [
        raw,
        jid,
        identity,
        queue,
        PROMOTED_TTL_S,
        "1" if park else "0",
        "1" if listed else "0",
    ]
    for limiter in limiters:
        script_keys += [*common_keys(keys, limiter), keys.limit_waiting(limiter.name, queue)]
        args += [limiter.name, *numbers(limiter), limiter.spec()]
    reply = script("admit")(client, script_keys, args)
    code = int(reply[0])
    if code == 1:
        return Admission(True)
    if code == -1:
        return Admission(False, ours=False)
    return Admission(False, text(reply[1]), float(reply[2]))


def park(
    client: Any, keys: Keys, inprogress: str, raw: bytes, jid: str, queue: str, limiter: Limiter, listed: bool
) -> float | None:
    """Parks a job whose code met a full ``limiter`` (or puts it back on its
    queue if the limiter has room by now). Returns the seconds until a
    rate's window has room (0.0 otherwise), None when it went back to its
    queue or was no longer ours."""
    if keys.sharded:
        return sharded.park(client, keys, inprogress, raw, jid, queue, limiter, listed)
    script_keys = [
        inprogress,
        *common_keys(keys, limiter),
        keys.limit_waiting(limiter.name, queue),
        keys.queue(queue),
    ]
    args: list[Arg] = [
        raw,
        queue,
        limiter.kind,
        limiter.n,
        repr(limiter.per),
        PROMOTED_TTL_S,
        "1" if listed else "0",
        jid,
    ]
    reply = script("park")(client, script_keys, args)
    return float(reply[1]) if int(reply[0]) == 1 else None


def release_args(
    keys: Keys, identity: str, jid: str, queue: str, holds: Sequence[Limiter]
) -> tuple[list[str], list[Arg]]:
    """The KEYS and ARGV that ``release_slots()`` (lib/limits.lua) reads:
    appended to ``ack.lua``'s or ``file.lua``'s own, or ``release.lua``'s."""
    script_keys = [keys.limit_held(identity)]
    args: list[Arg] = [identity, PROMOTED_TTL_S]
    for limiter in holds:
        waiting = keys.limit_waiting(limiter.name, queue)
        script_keys += [*common_keys(keys, limiter), waiting, keys.queue(queue)]
        args += [limiter.name, jid, limiter.n]
    args.append(queue)
    return script_keys, args


def release(client: Any, keys: Keys, identity: str, jid: str, queue: str, holds: Sequence[Limiter]) -> int:
    """Frees slots taken in job code; returns how many limiters have room
    and waiters on other queues (wake those)."""
    if keys.sharded:
        return sharded.release(client, keys, identity, jid, holds)
    return int(script("release")(client, *release_args(keys, identity, jid, queue, holds)))


def held(client: Any, keys: Keys, identity: str) -> list[tuple[str, str]]:
    """The (limiter name, jid) slots ``identity`` holds."""
    slots = []
    for member in client.smembers(keys.limit_held(identity)):
        name, _, jid = text(member).partition(SEPARATOR)
        slots.append((name, jid))
    return slots


def wake(client: Any, keys: Keys, name: str, limiter: Limiter | None = None) -> tuple[int, float]:
    """Moves waiters of ``name`` back onto their queues while it has room.
    Returns (how many moved, seconds until a full rate window has room)."""
    if keys.sharded:
        return sharded.wake(client, keys, name, limiter)
    limiter, names = waiting_queues(client, keys, name, limiter)
    if limiter is None or not names:
        return 0, 0.0
    script_keys = common_keys(keys, limiter)
    for queue in names:
        script_keys += [keys.limit_waiting(name, queue), keys.queue(queue)]
    reply = script("promote")(
        client, script_keys, [limiter.kind, limiter.n, repr(limiter.per), PROMOTED_TTL_S, *names]
    )
    moved = int(reply[0])
    if moved:
        logger.debug("limiter %s: %d waiting job(s) back on their queue", name, moved)
    return moved, float(reply[1])


def unreserve(client: Any, keys: Keys, jid: str, limiters: Sequence[Limiter]) -> None:
    """A promoted waiter dropped unrun at its start (expired) gives up the
    slot reserved for it, which would otherwise stay held back for
    ``PROMOTED_TTL_S``; the next waiter is woken into it."""
    for limiter in limiters:
        if client.zrem(keys.limit(limiter.name, "promoted"), jid):
            wake(client, keys, limiter.name, limiter)


PARTS = ("holders", "starts", "queues", "promoted", "max")


def sweep(client: Any, keys: Keys) -> float | None:
    """Each poller pass: wakes the waiters of every limiter with room (a
    wake missed: a recovering process that died before waking them, a
    rate window that reopened with no worker told) and forgets the names
    with nothing left (no holder, start, waiter, reservation or override),
    so that dynamic names (``account:<id>``) leave no key behind. Returns
    the shortest wait of a rate that is full, if any. Under SHARDING,
    ``keys`` are the poller's group's, which it repairs first
    (:func:`.sharded.repair`)."""
    if keys.sharded:
        sharded.repair(client, keys)
    registry = {text(name): spec for name, spec in client.hgetall(keys.limits).items()}
    if not registry:
        return None
    names = sorted(registry)
    pipe = client.pipeline(transaction=False)
    for name in names:
        for part in PARTS:
            pipe.exists(keys.limit(name, part))
    found = pipe.execute()
    shortest = None
    for i, name in enumerate(names):
        holders, starts, queues, promoted, override = found[len(PARTS) * i : len(PARTS) * (i + 1)]
        if queues:
            _, wait_s = wake(client, keys, name, limiter_of(name, registry[name]))
            if wait_s > 0:
                shortest = wait_s if shortest is None else min(shortest, wait_s)
        elif not (holders or starts or promoted or override):
            script("forget_limiter")(client, [keys.limits, *(keys.limit(name, p) for p in PARTS)], [name])
    return shortest
