"""What the end of a workflow's job does, in the same script as its ack or
filing (SPEC section 13, G22): ``ack.lua`` and ``file.lua`` with the
extra KEYS and ARGV that ``lua/lib/batches.lua``'s ``batch_member_end``
reads.

Duties: check the return value a chord's member or a chain's step hands
on (JSON, at most ``BATCH_RESULT_MAX_BYTES``: else the job fails, with an
error that says so); build a chain's next step from its signature dict and
that value; name every key of the member's batch and of its ancestors
(known from its payload's ``bid`` and ``bids``), so the script runs on
Redis Cluster; say how a member moves: succeeded, failed (a retry due),
dead, retried from dead.
"""

from __future__ import annotations

import json
import time
from typing import Any

from django_cogworker import registry
from django_cogworker.conf import Config
from django_cogworker.errors import CogworkerError
from django_cogworker.keys import Keys
from django_cogworker.payload import Payload, encode, new_jid
from django_cogworker.scripts import Arg, script
from django_cogworker.workflows.state import level_keys, ttls

#: How a member moves in its batch (``lib/batches.lua``).
SUCCEEDED, FAILED, DEAD, REVIVED = "s", "f", "d", "r"

#: The marker in ``ack.lua``'s and ``file.lua``'s ARGV that batch arguments follow.
MARKER = "@batch"

#: After MARKER: the end goes to its group's outbox (SHARDING).
OUTBOX = "@outbox"


class ResultRefused(CogworkerError):
    """A chord member's or chain step's return value that cannot be handed
    on: not JSON, or larger than ``BATCH_RESULT_MAX_BYTES``."""


def hands_on(payload: Payload) -> bool:
    """Whether the job's return value is handed on: a chord's member, a
    chain's step with a next step."""
    return bool(payload.get("chord") or payload.get("chain"))


def result_of(payload: Payload, value: Any, config: Config) -> str | None:
    """The return value as JSON, when it is handed on; raises
    ResultRefused when it cannot be."""
    if not hands_on(payload):
        return None
    name = payload.get("job")
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ResultRefused(
            f"job {name!r} returned a value JSON cannot carry ({exc}); a chord member's or a chain step's "
            "return value is handed on as JSON: return JSON (a dict, list, str, number, bool or None)"
        ) from None
    size = len(text.encode("utf-8", "surrogatepass"))
    limit = config.batch_result_max_bytes
    if size > limit:
        raise ResultRefused(
            f"job {name!r} returned {size} bytes of JSON, more than BATCH_RESULT_MAX_BYTES ({limit}); a "
            "chord member's or a chain step's return value is kept in Redis: return a reference (a key, "
            "a path, an id) instead of the data, or raise BATCH_RESULT_MAX_BYTES"
        )
    return text


def next_step(payload: Payload, result: str | None) -> Payload | None:
    """A chain's next step, built from its signature dict, with the result
    appended to its arguments unless immutable; it carries the rest of the
    chain, and the batch of the step that ended."""
    steps = payload.get("chain")
    if not isinstance(steps, list) or not steps or not isinstance(steps[0], dict):
        return None
    step, rest = steps[0], steps[1:]
    args = list(step.get("args") or [])
    if not step.get("immutable"):
        args.append(json.loads(result) if result is not None else None)
    kwargs = step.get("kwargs") or {}
    name, queue = str(step.get("name")), str(step.get("queue") or "default")
    job = registry.get(name)
    if job is not None:
        configured = job.set(**{**(step.get("options") or {}), "queue": queue})
        following = configured.payload(args, kwargs)
    else:
        # Not registered here: the worker that fetches it files it in dead,
        # naming the job (G13), as for any payload.
        now = time.time()
        following = {
            "jid": new_jid(),
            "job": name,
            "args": args,
            "kwargs": kwargs,
            "queue": queue,
            "retry": True,
            "created_at": now,
            "enqueued_at": now,
        }
    if rest:
        following["chain"] = rest
    following["bid"] = payload.get("bid")
    if payload.get("bids"):
        following["bids"] = payload["bids"]
    return following


def levels(payload: Payload) -> list[str]:
    """The bids whose state a member's end changes: its batch, then its
    ancestors; none for a callback (not a member) or a chain outside any batch."""
    bid = payload.get("bid")
    if not isinstance(bid, str) or not bid or "cb" in payload:
        return []
    bids = payload.get("bids")
    return [bid, *(b for b in bids if isinstance(b, str))] if isinstance(bids, list) else [bid]


def end_args(
    keys: Keys,
    config: Config,
    payload: Payload,
    move: str,
    result: str | None,
    following: Payload | None,
    following_raw: bytes = b"",
) -> tuple[list[str], list[Arg]]:
    """The extra KEYS and ARGV of ``batch_member_end`` for this member's end."""
    bids = levels(payload)
    if keys.sharded:
        return outbox_args(keys.home(payload), payload, move, bids, result, following)
    queue_key = keys.queue(str(following["queue"])) if following is not None else keys.schedule
    script_keys = [
        keys.schedule,
        keys.queues,
        keys.stat_batch_callbacks,
        keys.batches_open,
        queue_key,
        *level_keys(keys, bids),
    ]
    args: list[Arg] = [
        MARKER,
        move,
        str(payload.get("jid") or ""),
        len(bids),
        *bids,
        *ttls(config),
        (result or "") if payload.get("chord") else "",
        following_raw,
        str(following["jid"]) if following is not None else "",
        str(following["queue"]) if following is not None else "",
    ]
    return script_keys, args


def outbox_args(
    home: Keys, payload: Payload, move: str, bids: list[str], result: str | None, following: Payload | None
) -> tuple[list[str], list[Arg]]:
    """Under SHARDING the member's batch is in the ``{N}`` slot, out of the
    script's reach: the end goes to its group's outbox in the same step,
    for ``forward.py`` to apply to the batch (``batch_apply.lua``)."""
    end = {
        "g": getattr(home, "group_name", ""),
        "m": move,
        "j": str(payload.get("jid") or ""),
        "b": bids,
        "r": (result or "") if payload.get("chord") else "",
        "n": following,
    }
    return [home.outbox, home.outbox_seq], [MARKER, OUTBOX, encode(end)]


def moved(keys: Keys, config: Config, payload: Payload, move: str) -> tuple[list[str], list[Arg]]:
    """The extra KEYS and ARGV that move a member in its batch alongside
    another script's work (a poison pill buried, an admin's kill, delete
    or retry, an unsettled failure filed); empty for any other job."""
    if not levels(payload):
        return [], []
    return end_args(keys, config, payload, move, None, None)


def filed(keys: Keys, config: Config, zset: str, payload: Payload) -> tuple[list[str], list[Arg]]:
    """:func:`moved` for a failure filed in ``zset``: failed in its batch
    when filed in retry, dead in dead, unmoved in the schedule."""
    move = {keys.retry: FAILED, keys.dead: DEAD}.get(zset)
    return moved(keys, config, payload, move) if move else ([], [])


def expired(client: Any, keys: Keys, config: Config, payloads: list[Payload]) -> None:
    """Members dropped as expired by the poller count as succeeded
    (``batch_move.lua``), each on its own: their drop has no ack to ride."""
    for payload in payloads:
        extra = moved(keys, config, payload, SUCCEEDED)
        if extra[0]:
            script("batch_move")(client, *extra)
