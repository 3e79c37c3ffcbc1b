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

On a Redis Cluster the ``WAIT`` goes to the master of the namespace's slot,
the node every key of ours lives on.
"""

from __future__ import annotations

from typing import Any

from django_cogworker.conf import Config
from django_cogworker.connection import is_cluster
from django_cogworker.errors import EnqueueNotReplicated
from django_cogworker.keys import Keys


def wanted(config: Config) -> bool:
    return config.enqueue_wait_replicas > 0


def queue_wait(pipe: Any, client: Any, keys: Keys, config: Config) -> None:
    """Adds ``WAIT`` to ``pipe`` (after the pushes queued on it)."""
    route = {"target_nodes": client.get_node_from_key(keys.queues)} if is_cluster(client) else {}
    pipe.execute_command(
        "WAIT", config.enqueue_wait_replicas, max(1, round(config.enqueue_wait_timeout_s * 1000)), **route
    )


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


def confirm(client: Any, keys: Keys, config: Config, jids: list[str]) -> None:
    """Waits for replicas to have the writes this process just made on any
    connection (see the module's docstring)."""
    pipe = client.pipeline(transaction=False)
    pipe.incr(keys.replicated)
    queue_wait(pipe, client, keys, config)
    check(_outcome(pipe.execute(raise_on_error=False)), config, jids)


async def aconfirm(client: Any, keys: Keys, config: Config, jids: list[str]) -> None:
    """:func:`confirm` on a ``redis.asyncio`` client."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.incr(keys.replicated)
        queue_wait(pipe, client, keys, config)
        replies = await pipe.execute(raise_on_error=False)
    check(_outcome(replies), config, jids)


def _outcome(replies: list[Any]) -> object:
    """WAIT's reply, unless the write before it failed: a WAIT after no
    write of its own would count the replicas of an older offset."""
    return replies[0] if isinstance(replies[0], Exception) else replies[-1]
