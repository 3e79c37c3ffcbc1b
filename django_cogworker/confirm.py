"""Confirmed enqueue: ``ENQUEUE_WAIT_REPLICAS`` (SPEC section 11).

Redis replicates asynchronously: a push the master acknowledged can be lost
by a failover that promotes a replica it had not reached yet (Sentinel's
planned failover lets the old master take writes for seconds before it is
demoted). With ``ENQUEUE_WAIT_REPLICAS = N``, every enqueue is followed by
``WAIT N timeout`` and fewer confirmations raise
:class:`~django_cogworker.errors.EnqueueNotReplicated`.

``WAIT`` counts the replicas that have every write of *its own connection*,
so it must follow the write on the same connection: :func:`queue_wait` adds
it to the pipeline of the push. A write made elsewhere (a MULTI, whose
pipeline ends at EXEC; a script call) is confirmed by :func:`confirm`: one
more write, ``INCR N:replicated``, then ``WAIT`` on that connection. The
replication stream is ordered, so a replica that has that write has the
enqueue before it too.

On a Redis Cluster a ``WAIT`` goes to each master a push wrote to: the
master of the namespace's slot, or under ``SHARDING`` each master of a
queue group written (SPEC section 16).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django_cogworker.conf import Config
from django_cogworker.connection import is_cluster
from django_cogworker.errors import EnqueueNotReplicated
from django_cogworker.keys import Keys


def wanted(config: Config) -> bool:
    return config.enqueue_wait_replicas > 0


def queue_wait(pipe: Any, client: Any, written: Iterable[str], config: Config) -> int:
    """Adds a ``WAIT`` to ``pipe`` (after the pushes queued on it) for each
    master that holds one of the keys ``written``: one on a server that is
    not a cluster. Returns how many."""
    args = ("WAIT", config.enqueue_wait_replicas, max(1, round(config.enqueue_wait_timeout_s * 1000)))
    if not is_cluster(client):
        pipe.execute_command(*args)
        return 1
    nodes = {node.name: node for node in (client.get_node_from_key(key) for key in written)}
    for node in nodes.values():
        pipe.execute_command(*args, target_nodes=node)
    return len(nodes)


def check_all(replies: list[Any], config: Config, jids: list[str]) -> None:
    """:func:`check` of each ``WAIT``'s reply (:func:`queue_wait`)."""
    for confirmed in replies:
        check(confirmed, config, jids)


def check(confirmed: object, config: Config, jids: list[str]) -> None:
    """Raises EnqueueNotReplicated unless ``confirmed`` (WAIT's reply, or
    the error it met after the writes went through: a master demoted while
    it waited answers UNBLOCKED) is enough."""
    need = config.enqueue_wait_replicas
    if isinstance(confirmed, Exception):
        said = f"the wait for {need} replica(s) (ENQUEUE_WAIT_REPLICAS) failed ({confirmed})"
    else:
        got = int(confirmed)  # type: ignore[call-overload]
        if got >= need:
            return
        said = (
            f"{got} of the {need} replica(s) asked for (ENQUEUE_WAIT_REPLICAS) confirmed it "
            f"within {config.enqueue_wait_timeout_s:g}s"
        )
    shown = ", ".join(jids[:3]) + (f" and {len(jids) - 3} more" if len(jids) > 3 else "")
    raise EnqueueNotReplicated(
        f"enqueued jid={shown} on the Redis master, but {said}: a failover now could lose it. "
        "Push it again if it must not be lost (it may then run twice).",
        jids,
    )


def confirm(client: Any, groups: Iterable[Keys], config: Config, jids: list[str]) -> None:
    """Waits for replicas to have the writes this process just made on any
    connection (see the module's docstring), to the queue ``groups``' keys
    (one ``Keys`` without SHARDING)."""
    counters = sorted({keys.replicated for keys in groups})
    pipe = client.pipeline(transaction=False)
    for counter in counters:
        pipe.incr(counter)
    waits = queue_wait(pipe, client, counters, config)
    _checked(pipe.execute(raise_on_error=False), waits, config, jids)


async def aconfirm(client: Any, groups: Iterable[Keys], config: Config, jids: list[str]) -> None:
    """:func:`confirm` on a ``redis.asyncio`` client."""
    counters = sorted({keys.replicated for keys in groups})
    async with client.pipeline(transaction=False) as pipe:
        for counter in counters:
            pipe.incr(counter)
        waits = queue_wait(pipe, client, counters, config)
        replies = await pipe.execute(raise_on_error=False)
    _checked(replies, waits, config, jids)


def _checked(replies: list[Any], waits: int, config: Config, jids: list[str]) -> None:
    """The WAITs' replies checked, unless a write before them failed: a
    WAIT after no write of its own would count the replicas of an older
    offset."""
    failed = [reply for reply in replies[:-waits] if isinstance(reply, Exception)]
    check_all(failed[:1] or replies[-waits:], config, jids)
