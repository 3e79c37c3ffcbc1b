"""A workflow job's end, sent at once with its effects (SPEC section 13):
the worker's side of ``effects.py``.

Duties: tell a workflow's job from a plain one by its payload (``bid``);
send its ack (``ack.lua``) or its filing (``file.lua``) with the move of
its member in its batch, the next step of its chain, the callbacks its end
fires, all in one script; only if the job was still on this process's
list (G18): a revived process's late end changes nothing.
"""

from __future__ import annotations

from typing import Any

from django_cogworker.conf import Config
from django_cogworker.errors import BadPayload
from django_cogworker.filing import file_job
from django_cogworker.keys import Keys
from django_cogworker.ledger import Ack, Pending
from django_cogworker.payload import Payload, encode
from django_cogworker.scripts import script
from django_cogworker.work import UnitOfWork
from django_cogworker.workflows import effects, forward


def workflow_of(work: UnitOfWork) -> Payload | None:
    """The payload of a workflow's job, None for any other (or unreadable)."""
    try:
        payload = work.payload()
    except BadPayload:
        return None
    return payload if "bid" in payload else None


def settle_flow(
    client: Any,
    keys: Keys,
    config: Config,
    inprogress: str | None,
    work: UnitOfWork,
    how: Pending,
    payload: Payload,
) -> None:
    """Acknowledges or files a workflow's job with its effects, in one
    script (``inprogress`` None: basic fetch, or the testing helpers'
    ``drain()``: no list). Raises what Redis raised: the caller keeps it
    owed (G6)."""
    if isinstance(how, Ack):
        move = effects.DEAD if work.lost else effects.SUCCEEDED
        following = effects.next_step(payload, work.result) if move == effects.SUCCEEDED else None
        raw = encode(following) if following is not None else b""
        extra = effects.end_args(keys, config, payload, move, work.result, following, raw)
        if inprogress is None:
            # Basic fetch: no list to take it off, nothing to ack; its effects alone.
            script("batch_move")(client, *extra)
        else:
            script("ack")(client, [inprogress, keys.orphanings(work.jid), *extra[0]], [work.raw, *extra[1]])
        forward.soon(client, keys, config)  # its end, from the outbox to its batch
        return
    move = effects.DEAD if how.zset == keys.dead else effects.FAILED
    extra = effects.end_args(keys, config, payload, move, None, None)
    file_job(
        client,
        keys,
        config,
        inprogress,
        work.raw,
        how.zset,
        how.score,
        how.payload,
        how.jid,
        how.trim,
        extra=extra,
    )
    forward.soon(client, keys, config)
