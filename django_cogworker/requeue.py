"""Putting jobs back on their queues from an in-progress list.

Duties: read where each job goes (its queue, its orphan counter, the
periodic running lock it re-takes) from its payload, in Python, and hand
those keys to the scripts, which build none (every key a script touches is
in ``KEYS``, so a cluster proxy that checks them works too, G16). The
scripts re-check atomically what the read could not: that the owner is dead
(G2) and that each job is still on the list. Used by orphan recovery, by the
shutdown (G8), by give-backs and by the stray check (G7).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django_cogworker.conf import DEFAULT_QUEUE, Config
from django_cogworker.errors import BadPayload
from django_cogworker.keys import Keys
from django_cogworker.limits import state
from django_cogworker.payload import Payload, parse
from django_cogworker.scripts import Arg, script

logger = logging.getLogger("django_cogworker")

#: TTL of the periodic running lock while its job waits in a queue.
PERIODIC_QUEUED_TTL_S = 3600

#: How long an orphan counter lives (G3).
ORPHANINGS_TTL_S = 7 * 24 * 3600

#: A job recovered this many times (or MAX_ORPHANINGS times, if fewer) runs
#: isolated: one such job at a time per process (G3). A job recovered fewer
#: times runs beside the others, so that the jobs of a dead busy process
#: come back in parallel; a poison pill is isolated from its second kill on,
#: and kills no other isolated job after that.
ISOLATE_FROM_ORPHANINGS = 2


def orphan_count(value: bytes | None) -> int | None:
    """A job's orphan counter as read from Redis: 0 when absent, None when
    not a count (requeue.lua starts such a counter over)."""
    if value is None:
        return 0
    try:
        return int(value)
    except ValueError:
        return None


def isolated(count: int | None, max_orphanings: int) -> bool:
    """Whether a recovered job with ``count`` counted orphanings runs
    isolated (G3); an unreadable count is taken for the worst."""
    return count is None or count >= max(1, min(ISOLATE_FROM_ORPHANINGS, max_orphanings))


@dataclass(frozen=True)
class Destination:
    """Where a job from an in-progress list goes back to."""

    queue_key: str
    jid: str
    counter_key: str | None  # None: no jid to count by
    lock_key: str | None  # an until_executed periodic run's lock
    #: The payload without its closing brace, plus the recovered mark's
    #: field name, to which the script appends the count; None for a payload
    #: that is not a readable object or is marked already.
    mark_prefix: bytes | None
    #: Marked already: recovered once, a suspect of G3.
    recovered: bool = False


def destination(keys: Keys, raw: bytes) -> Destination:
    """A payload whose queue cannot be read goes to the default queue, where
    the processor files it in dead as unreadable (G13); under SHARDING, a
    queue of another group than ``keys``' goes to the group's first queue
    (``Keys.own``)."""
    try:
        value = parse(raw)
    except BadPayload:
        value = None
    if not isinstance(value, dict):
        return Destination(keys.queue(keys.own(DEFAULT_QUEUE)), "", None, None, None)
    payload: Payload = value
    queue = payload.get("queue")
    jid = payload.get("jid")
    jid = jid if isinstance(jid, str) and jid else ""
    pjid = payload.get("periodic_pjid")
    lock = (
        keys.periodic_running(pjid)
        if payload.get("periodic_until_executed") is True and isinstance(pjid, str) and pjid and jid
        else None
    )
    body = raw.rstrip()
    mark = None
    if "orphaned" not in payload and body.endswith(b"}"):
        # Spliced into the text, not re-encoded: the payload stays byte for
        # byte what the client wrote, but for the one field.
        mark = body[:-1] + (b',"orphaned":' if len(payload) else b'"orphaned":')
    return Destination(
        keys.queue(keys.own(queue if isinstance(queue, str) and queue else DEFAULT_QUEUE)),
        jid,
        keys.orphanings(jid) if jid else None,
        lock,
        mark,
        "orphaned" in payload,
    )


def requeue_one(client: Any, keys: Keys, list_key: str, raw: bytes) -> bool:
    """One job back on its queue if it is still on ``list_key``."""
    where = destination(keys, raw)
    script_keys = [list_key, where.queue_key]
    if where.lock_key:
        script_keys.append(where.lock_key)
    args: list[Arg] = [raw, where.jid, "1" if where.lock_key else "0", PERIODIC_QUEUED_TTL_S]
    return bool(script("requeue_one")(client, script_keys, args))


def requeue_list(
    client: Any,
    keys: Keys,
    config: Config,
    identity: str,
    *,
    if_dead_for_s: float | None = None,
    finished: Iterable[bytes] = (),
    keep: Iterable[bytes] = (),
    now: float | None = None,
    stall_gap_s: float | None = None,
) -> tuple[int, list[bytes]]:
    """Puts ``identity``'s in-progress jobs back on their queues. Returns
    (how many, jobs filed in dead raw for the caller to complete), or (-1,
    []) if ``if_dead_for_s`` is given and the owner is alive. ``finished``
    jobs are dropped (their ack), ``keep`` ones stay on the list."""
    list_key = keys.inprogress(identity)
    pipe = client.pipeline(transaction=False)
    pipe.lrange(list_key, 0, -1)
    # Under SHARDING the holds (G23) are in the {N} slot, not the group's:
    # the script notes the owner in its group, and they are freed after.
    freeing = keys.sharded and bool(client.exists(keys.limit_held(identity)))
    holds_key = keys.limits_freeing if keys.sharded else keys.limit_held(identity)
    if not keys.sharded:
        pipe.smembers(holds_key)
    listed, *held = pipe.execute()
    holds = held[0] if held else set()
    finished, keep = set(finished), set(keep)
    script_keys = [
        list_key,
        keys.process(identity),
        keys.last_beat,
        keys.repeat_orphans,
        keys.dead,
        keys.beats,
        holds_key,
    ]
    args: list[Arg] = [
        identity,
        "" if if_dead_for_s is None else repr(if_dead_for_s),
        repr(time.time() if now is None else now),
        ORPHANINGS_TTL_S,
        config.max_orphanings,
        "" if stall_gap_s is None else repr(stall_gap_s),
        PERIODIC_QUEUED_TTL_S,
        "f" if freeing else len(holds),
    ]
    # G23: the slots it holds are freed in the same call, under the same check.
    for member in holds:
        name, _, jid = member.partition(b"\0")
        script_keys.append(keys.limit(name.decode("utf-8", "surrogateescape"), "holders"))
        args += [name, jid]
    wheres = [destination(keys, raw) for raw in listed]
    spared = _spared(client, keys, config, identity, listed, wheres) if if_dead_for_s is not None else set()
    for raw, where in zip(listed, wheres, strict=True):
        flags = "d" if raw in finished else "k" if raw in keep else ""
        if raw in spared:
            flags += "s"
        script_keys.append(where.queue_key)
        if where.counter_key:
            flags += "c"
            script_keys.append(where.counter_key)
        if where.lock_key:
            flags += "l"
            script_keys.append(where.lock_key)
        args += [raw, flags, where.jid, where.mark_prefix or b""]
    if if_dead_for_s is None and not listed and not holds and not freeing:
        return 0, []
    reply = script("requeue")(client, script_keys, args)
    if freeing and int(reply[0]) >= 0:
        try:
            state.sharded.free_owner(client, keys, identity)  # ``freeing`` is under SHARDING only
        except Exception as exc:
            logger.warning("could not free the limiter slots of %s yet (%s); the sweep will", identity, exc)
    if holds and int(reply[0]) >= 0:
        wake_freed(client, keys, {member.partition(b"\0")[0] for member in holds})
    return int(reply[0]), list(reply[1:])


def wake_freed(client: Any, keys: Keys, names: set[bytes]) -> None:
    """Waiters of the limiters whose slots a requeue freed go back on their
    queues; a wake that fails is the sweep's (``limits.state.sweep``)."""
    for name in sorted(names):
        try:
            state.wake(client, keys, name.decode("utf-8", "surrogateescape"))
        except Exception as exc:
            logger.warning("could not wake the waiters of limiter %r (%s); the next sweep will", name, exc)


def _spared(
    client: Any, keys: Keys, config: Config, identity: str, listed: list[bytes], wheres: list[Destination]
) -> set[bytes]:
    """G3: of the isolated jobs on a dead process's list, only the one it
    recorded before starting it (one runs at a time) may be what killed it;
    the others were only held beside it, and are not counted again. Jobs
    recovered fewer times ran in parallel, and are counted as fresh ones."""
    recovered = [(raw, w.counter_key) for raw, w in zip(listed, wheres, strict=True) if w.recovered]
    if not recovered:
        return set()
    pipe = client.pipeline(transaction=False)
    pipe.get(keys.suspect(identity))
    for _, counter_key in recovered:
        if counter_key:
            pipe.get(counter_key)
    started, *counts = pipe.execute()
    read = iter(counts)
    spared = set()
    for raw, counter_key in recovered:
        count = orphan_count(next(read)) if counter_key else 0
        if raw != started and isolated(count, config.max_orphanings):
            spared.add(raw)
    return spared
