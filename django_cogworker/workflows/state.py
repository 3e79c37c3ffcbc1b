"""A batch's state in Redis, and the calls that change it from the
enqueue side (SPEC section 13, ``docs/redis-layout.md``).

Duties: build ``batch_open.lua``'s KEYS and ARGV (every key in ``KEYS``,
so it runs on Redis Cluster: the namespace's hash tag keeps them in one
slot); open a batch with the children opened inside its block in one call,
or a large one in chunks of ``CHUNK`` members, its membership recorded
before any member is pushed, in the same call; add members to an open batch
from a running member (``current_batch().add``); forget old batches.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django_cogworker.conf import Config
from django_cogworker.keys import Keys
from django_cogworker.payload import Payload, encode
from django_cogworker.scripts import Arg, script

#: Members per ``batch_open.lua`` call: a call blocks Redis while it runs.
CHUNK = 1000

#: A member: its id (a jid, or ``b:<bid>`` for a child batch), its payload
#: (None: not pushed here), its due time (epoch s; None: now).
Member = tuple[str, Payload | None, float | None]


def trim(client: Any, keys: Keys, config: Config) -> None:
    """Forgets from ``N:batches`` the batches opened more than BATCH_TTL ago
    (their keys have expired, or will with their settled TTL)."""
    oldest = f"({time.time() - config.batch_ttl_s!r}"
    pipe = client.pipeline(transaction=False)
    pipe.zremrangebyscore(keys.batches, "-inf", oldest)
    pipe.zremrangebyscore(keys.batches_open, "-inf", oldest)
    pipe.execute()


def ttls(config: Config) -> list[Arg]:
    """BATCH_TTL and BATCH_DONE_TTL as EXPIRE takes them (whole seconds, >= 1)."""
    return [max(1, int(config.batch_ttl_s)), max(1, int(config.batch_done_ttl_s))]


def child_id(bid: str) -> str:
    """The member id of a child batch in its parent."""
    return f"b:{bid}"


def level_keys(keys: Keys, bids: Sequence[str]) -> list[str]:
    """The keys of each batch in ``bids`` (nearest first), as
    ``lib/batches.lua`` reads them."""
    return [key for bid in bids for key in keys.batch_keys(bid)]


@dataclass(frozen=True)
class Section:
    """A batch's part of a ``batch_open.lua`` call: the batch (then its
    ancestors), its hash's fields (written by its first section), members."""

    bids: Sequence[str]
    fields: dict[str, str | bytes]
    members: Sequence[Member]
    first: bool = True
    last: bool = True


def open_sections(
    client: Any, keys: Keys, config: Config, sections: Sequence[Section], first: int = 0
) -> int:
    """Every section in one ``batch_open.lua`` call, so in one step: a batch
    and the children opened inside its block, all or none. Returns how many
    members were pushed. Under SHARDING every member goes to
    ``{N}:forward``, which the caller pushes on at once (``forward.py``),
    and any worker's poller after a crash: due at once, scored by its
    place among the members pushed (from ``first``), so that they reach
    their queues in the order they were enqueued."""
    script_keys = [
        keys.batches,
        keys.batch_schedule,
        keys.queues,
        keys.stat_batch_callbacks,
        keys.batches_open,
    ]
    args: list[Arg] = [*ttls(config)]
    for section in sections:
        queues: dict[str, int] = {}
        entries: list[Arg] = []
        for member, payload, at in section.members:
            index = 0
            if payload is not None and at is None and keys.sharded:
                at, first = float(first), first + 1
            if payload is not None and at is None:
                index = queues.setdefault(str(payload["queue"]), len(queues) + 1)
            raw = encode(payload) if payload is not None else b""
            entries += [member, index, "" if at is None else repr(at), raw]
        pairs: list[Arg] = (
            [item for field in section.fields.items() for item in field] if section.first else []
        )
        script_keys += [*level_keys(keys, section.bids), *(keys.queue(name) for name in queues)]
        args += [
            "1" if section.first else "0",
            "1" if section.last else "0",
            len(section.bids),
            *section.bids,
        ]
        args += [len(pairs) // 2, *pairs, len(queues), *queues, len(section.members), *entries]
    return int(script("batch_open")(client, script_keys, args))


def open_batch(
    client: Any,
    keys: Keys,
    config: Config,
    bids: Sequence[str],
    fields: dict[str, str | bytes],
    members: Sequence[Member],
    *,
    first: bool = True,
    last: bool = True,
) -> int:
    """Opens the batch ``bids[0]`` (its ancestors after it) with
    ``fields`` in its hash and pushes ``members``, a call per ``CHUNK``.
    ``first`` / ``last`` False: members added to a batch already open, which
    stays open (``current_batch().add``). Returns how many were pushed."""
    pushed = 0
    chunks = [members[i : i + CHUNK] for i in range(0, len(members), CHUNK)] or [[]]
    for n, chunk in enumerate(chunks):
        section = Section(bids, fields, chunk, first and n == 0, last and n == len(chunks) - 1)
        pushed += open_sections(client, keys, config, [section], n * CHUNK)
    return pushed
