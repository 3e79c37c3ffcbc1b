"""The limiters under ``SHARDING = "queues"`` (SPEC sections 14 and 16).

A limiter's keys are shared (the ``{N}`` slot) while a job's lists (its
queue, the in-progress list, the limiter's waiting list for its queue) are
its queue group's, in another slot: no one script reaches both, so each
call of :mod:`.state` is two or three here, ordered so that no job is lost
and no more start than the limit lets in:

- admitting (:func:`admit`): the limiter's slot decides (``admit.lua`` in
  mode ``m``, which notes the queue as having waiters), then the job
  refused moves onto its waiting list in its group (``shift.lua``);
- parking a job whose code met a full limiter (:func:`park`): the room
  now (``room.lua``), then the job back onto its queue or its waiting
  list (``shift.lua``);
- releasing (:func:`release`): the slots freed (``release_held.lua``)
  before the job is settled (a crash between runs it again, as any crash
  before its ack does), then the limiter woken;
- a wake (:func:`wake`): the room counted (``room.lua``), waiters moved
  back onto their queue in their group (``promote_group.lua``), their slots
  reserved (``reserve.lua``). A newcomer admitted in between may take the
  room; the waiter then parks again, at the head of its line: the limit
  itself is enforced by admission alone;
- the group notes its waiting lists (``limit_waiters``) in the same steps
  that fill and empty them; each poller pass (:func:`repair`) restores from
  that note what a race or a crash between two calls dropped on the
  limiter's side (the queue in its ``queues``, its spec);
- G23: the requeue of a dead process notes it in its group
  (``limits_freeing``) in the same call; :func:`free_owner` then frees its
  slots, or the next pass of any poller of the group does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from django_cogworker.keys import Keys
from django_cogworker.limits.layout import (
    PROMOTED_TTL_S,
    SEPARATOR,
    Admission,
    common_keys,
    numbers,
    text,
    used_key,
    waiting_queues,
)
from django_cogworker.limits.limiter import Limiter
from django_cogworker.scripts import Arg, script

logger = logging.getLogger("django_cogworker")

#: The most waiters of one queue a wake reads and moves at once; a wake
#: with more room moves the next ones on the next wake (the sweep's, or a
#: release's).
WAKE_BATCH = 100


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
    park: bool,
    listed: bool,
) -> Admission:
    if listed and client.lpos(inprogress, raw) is None:
        return Admission(False, ours=False)
    # The job waits in its worker's group: its own queue's line, or the
    # group's first queue's for a job of another group (Keys.own).
    queue = keys.own(queue)
    # admit.lua reads neither the list nor the waiting lists in mode "m" or
    # "0": the registry's name stands in for them (one slot).
    script_keys = [keys.limits, keys.limit_held(identity), keys.limits]
    args: list[Arg] = [raw, jid, identity, queue, PROMOTED_TTL_S, "m" if park else "0", "0"]
    for limiter in limiters:
        script_keys += [*common_keys(keys, limiter), keys.limits]
        args += [limiter.name, *numbers(limiter), limiter.spec()]
    reply = script("admit")(client, script_keys, args)
    if int(reply[0]) == 1:
        return Admission(True)
    name, wait_s = text(reply[1]), float(reply[2])
    if park:
        full = next(limiter for limiter in limiters if limiter.name == name)
        head = int(reply[3]) == 1
        if not _wait_in_line(client, keys, inprogress, raw, full, queue, head=head, listed=listed):
            return Admission(False, name, wait_s, ours=False)
    return Admission(False, name, wait_s)


def park(
    client: Any, keys: Keys, inprogress: str, raw: bytes, jid: str, queue: str, limiter: Limiter, listed: bool
) -> float | None:
    """As :func:`.state.park`: the seconds until a rate's window has room
    once parked, None when the job went back to its queue or was not ours."""
    queue = keys.own(queue)
    free, wait_s, was = _room(client, keys, limiter, jid, queue)
    if free > 0:
        _shift(client, keys, [inprogress, keys.queue(queue)], [raw, "0", "1" if listed else "0"])
        return None
    if _wait_in_line(client, keys, inprogress, raw, limiter, queue, head=was, listed=listed):
        return wait_s
    return None


def release(client: Any, keys: Keys, identity: str, jid: str, holds: Sequence[Limiter]) -> int:
    """Frees a job's slots, then wakes their waiters; returns 0 (no wake is
    left to the caller)."""
    script_keys = [keys.limit_held(identity)]
    args: list[Arg] = [identity]
    for limiter in holds:
        script_keys.append(used_key(keys, limiter))
        args += [limiter.name, jid]
    if int(script("release_held")(client, script_keys, args)):
        _wake_all(client, keys, {limiter.name: limiter for limiter in holds})
    return 0


def free_owner(client: Any, keys: Keys, identity: str) -> None:
    """G23: the slots of a process found dead (or stopping: its own
    requeue), noted in its group by ``requeue.lua``, are freed; then the
    note is dropped and the limiters' waiters woken."""
    holds = client.smembers(keys.limit_held(identity))
    names: dict[str, Limiter | None] = {}
    if holds:
        script_keys = [keys.limit_held(identity)]
        args: list[Arg] = [identity]
        for member in holds:
            # As written: a jid's bytes are what its holder's field holds.
            name, _, jid = member.partition(SEPARATOR.encode())
            script_keys.append(keys.limit(text(name), "holders"))
            args += [name, jid]
            names[text(name)] = None
        script("release_held")(client, script_keys, args)
    client.srem(keys.limits_freeing, identity)
    _wake_all(client, keys, names)


def wake(client: Any, keys: Keys, name: str, limiter: Limiter | None = None) -> tuple[int, float]:
    """As :func:`.state.wake`: (how many moved, seconds until a full rate
    window has room for the waiters left). Per queue with waiters: its
    line's head read (in its group), as many of them reserved as there is
    room for (the limiter's slot), those moved onto the queue (the group),
    and the reservations of any that left the head meanwhile dropped."""
    limiter, queues = waiting_queues(client, keys, name, limiter)
    if limiter is None or not queues:
        return 0, 0.0
    moved, wait_s, left = 0, 0.0, False
    for queue in queues:
        group = keys.for_queue(queue)
        line = [group.limit_waiting(name, queue), group.queue(queue), group.limit_waiters]
        heads = client.lrange(line[0], 0, min(limiter.n, WAKE_BATCH) - 1)
        free, wait_s, count = _reserve(client, keys, limiter, [jid_of(raw) for raw in heads])
        reply = script("promote_group")(client, line, [f"{name}{SEPARATOR}{queue}", *heads[:count]])
        emptied, moved_here = int(reply[0]) == 1, int(reply[1])
        unmoved = [jid_of(raw) for raw in heads[moved_here:count]]
        if unmoved or emptied:
            pipe = client.pipeline(transaction=False)
            if unmoved:
                pipe.zrem(keys.limit(name, "promoted"), *unmoved)
            if emptied:
                pipe.srem(keys.limit(name, "queues"), queue)
            pipe.execute()
        moved += moved_here
        left = left or not emptied
        if free - count <= 0:
            left = True
            break
    if moved:
        logger.debug("limiter %s: %d waiting job(s) back on their queue", name, moved)
    return moved, wait_s if left else 0.0


def repair(client: Any, keys: Keys) -> None:
    """Each poller pass, for its group (``keys``, a group's): frees the
    slots of the dead processes noted and not freed yet (G23), and puts
    back, on the limiter's side, the queues with waiters and the specs a
    race or a crash between two calls dropped there."""
    for identity in client.smembers(keys.limits_freeing):
        free_owner(client, keys, text(identity))
    notes = client.hgetall(keys.limit_waiters)
    if not notes:
        return
    pipe = client.pipeline(transaction=False)
    for field, spec in notes.items():
        name, _, queue = text(field).partition(SEPARATOR)
        pipe.hsetnx(keys.limits, name, spec)
        pipe.sadd(keys.limit(name, "queues"), queue)
    pipe.execute()


def _reserve(client: Any, keys: Keys, limiter: Limiter, jids: list[str | bytes]) -> tuple[int, float, int]:
    reply = script("reserve")(client, common_keys(keys, limiter), [*numbers(limiter), PROMOTED_TTL_S, *jids])
    return int(reply[0]), float(reply[1]), int(reply[2])


def jid_of(raw: bytes) -> str | bytes:
    """The jid a waiting payload names, as admission reads it; else the
    payload itself (as ``jid_of`` in lua/lib/limits.lua)."""
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    jid = payload.get("jid") if isinstance(payload, dict) else None
    return jid if isinstance(jid, str) and jid else raw


def _room(client: Any, keys: Keys, limiter: Limiter, jid: str, queue: str) -> tuple[int, float, bool]:
    reply = script("room")(
        client, common_keys(keys, limiter), [*numbers(limiter), PROMOTED_TTL_S, jid, queue]
    )
    return int(reply[0]), float(reply[1]), int(reply[2]) == 1


def _wait_in_line(
    client: Any,
    keys: Keys,
    inprogress: str,
    raw: bytes,
    limiter: Limiter,
    queue: str,
    *,
    head: bool,
    listed: bool,
) -> bool:
    return _shift(
        client,
        keys,
        [inprogress, keys.limit_waiting(limiter.name, queue), keys.limit_waiters],
        [
            raw,
            "1" if head else "0",
            "1" if listed else "0",
            f"{limiter.name}{SEPARATOR}{queue}",
            limiter.spec(),
        ],
    )


def _shift(client: Any, keys: Keys, script_keys: list[str], args: list[Arg]) -> bool:
    return int(script("shift")(client, script_keys, args)) == 1


def _wake_all(client: Any, keys: Keys, limiters: dict[str, Limiter | None]) -> None:
    """Wakes each limiter's waiters; one that fails is the sweep's."""
    for name, limiter in sorted(limiters.items()):
        try:
            wake(client, keys, name, limiter)
        except Exception as exc:
            logger.debug("limiter %s: could not wake its waiters (%s); the sweep will", name, exc)
