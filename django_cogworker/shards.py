"""Where the queues' keys live: each group of queues that shares a hash
slot, the slot, and the server that holds it (``cogworker_status
--shards``, SPEC section 16).

Without ``SHARDING`` every key is built from the namespace (``keys.py``),
so every queue is in one group: on a Redis Cluster the namespace's hash tag
(``{N}``) puts all of them in one slot, on one master, and the other
masters hold none. That is failover, not more throughput, and
:func:`spread` says so with the masters left idle. With ``SHARDING`` each
queue group has its own tag and slot (:func:`known_groups` lists them);
a master that holds none is named too. The cluster's layout is read from
the client's own map of slots (no command sent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from redis.crc import key_slot

from django_cogworker import registry
from django_cogworker.conf import QueueSpec, get_config
from django_cogworker.connection import describe, get_keys, get_redis, is_cluster
from django_cogworker.errors import redis_boundary
from django_cogworker.escaping import storable
from django_cogworker.keys import Keys


@dataclass(frozen=True)
class Shard:
    #: What the group's keys share: the namespace, or under SHARDING the group's name.
    group: str
    queues: list[str]
    #: The hash slot of the group's keys; None on a server that is not a cluster.
    slot: int | None
    #: ``host:port`` of the master that holds the slot (the server, with no
    #: credentials, when it is not a cluster).
    server: str


@dataclass(frozen=True)
class Spread:
    shards: list[Shard]
    #: Every master of the cluster; the one server otherwise.
    masters: list[str]
    cluster: bool
    #: Each queue group in a slot of its own (SHARDING), or all in the namespace's.
    sharded: bool = False
    #: Under SHARDING, the masters with ``cluster-require-full-coverage yes``
    #: (Redis's default): while any master is down, they refuse every command.
    full_coverage: tuple[str, ...] = ()

    @property
    def idle_masters(self) -> list[str]:
        held = {s.server for s in self.shards}
        return [m for m in self.masters if m not in held]

    def as_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "sharded": self.sharded,
            "groups": [
                {"group": s.group, "queues": s.queues, "slot": s.slot, "master": s.server}
                for s in self.shards
            ],
            "masters": self.masters,
            "idle_masters": self.idle_masters,
            "full_coverage": list(self.full_coverage),
        }


@dataclass(frozen=True)
class GroupShare:
    """What one worker process of a worker spanning queue groups serves."""

    group: str
    #: The worker's queues of this group, in their order, with their weights.
    queues: tuple[QueueSpec, ...]
    #: Its threads: the worker's, shared by the groups' weights.
    concurrency: int

    def args(self) -> list[str]:
        """The ``cogworker`` arguments that start this process."""
        spec = [f"{q.name},{q.weight}" if q.weight else q.name for q in self.queues]
        return [*(a for name in spec for a in ("-q", name)), "-c", str(self.concurrency)]


def split(keys: Keys, queues: tuple[QueueSpec, ...], concurrency: int) -> list[GroupShare]:
    """Under SHARDING, a worker whose queues span several queue groups runs
    one process per group (each beats, fetches, acks and is judged on its
    own group's master alone): each gets its group's queues and a share of
    ``concurrency`` by the groups' weights (a queue's weight, 1 without
    one), at least one thread; the shares add up to ``concurrency`` (the
    threads left by rounding down go to the largest remainders), or to the
    number of groups when that is more. One share when the queues are in
    one group (and always without SHARDING)."""
    if not keys.sharded:
        return [GroupShare(keys.namespace, queues, concurrency)]
    groups: dict[str, list[QueueSpec]] = {}
    for queue in queues:
        groups.setdefault(keys.group_of(queue.name), []).append(queue)
    if len(groups) <= 1:
        return [GroupShare(g, tuple(qs), concurrency) for g, qs in groups.items()]
    weights = {g: sum(q.weight or 1 for q in qs) for g, qs in groups.items()}
    exact = {g: concurrency * w / sum(weights.values()) for g, w in weights.items()}
    threads = {g: max(1, int(e)) for g, e in exact.items()}
    left = concurrency - sum(threads.values())
    for g in sorted(exact, key=lambda g: exact[g] - int(exact[g]), reverse=True)[: max(0, left)]:
        threads[g] += 1
    return [GroupShare(g, tuple(qs), threads[g]) for g, qs in groups.items()]


def known_groups(client: Any, keys: Keys) -> list[Keys]:
    """The keys of every queue group there may be jobs in: without
    SHARDING, the one layout; with it, the groups of the queues known to
    Redis (``N:queues``), to this process's settings (``QUEUES``,
    ``QUEUE_GROUPS``) and to the registered jobs."""
    if not keys.sharded:
        return [keys]
    config = get_config()
    try:
        registered = client.smembers(keys.queues)
    except redis.ResponseError:
        registered = set()  # a registry of the wrong type: the pages say so (Stats.skipped)
    names = {m.decode("utf-8", "surrogateescape") for m in registered if isinstance(m, bytes)}
    names |= {q.name for q in config.queues} | {q for q, _ in config.queue_groups}
    names |= {job.queue for job in map(registry.get, registry.names()) if job is not None}
    return [keys.group(g) for g in sorted({keys.group_of(q) for q in names})]


@redis_boundary("read the queue groups")
def groups_known() -> list[Keys]:
    """:func:`known_groups` with this project's client and keys: what the
    API's views that merge the groups read when first needed."""
    return known_groups(get_redis(), get_keys())


def _address(node: Any) -> str:
    return f"{node.host}:{node.port}"


@redis_boundary("read where the queues' keys live")
def spread(client: Any, keys: Keys, queues: list[str], config: Any) -> Spread:
    """The groups of ``queues`` and where each is held."""
    if not is_cluster(client):
        server = describe(config)
        return Spread([Shard(keys.namespace, queues, None, server)], [server], cluster=False)
    masters = sorted(_address(n) for n in client.get_primaries())
    if not keys.sharded:
        key = storable(keys.queues)
        node = client.get_node_from_key(key)
        shard = Shard(keys.namespace, queues, key_slot(key.encode()), _address(node))
        return Spread([shard], masters, cluster=True, sharded=False)
    groups: dict[str, list[str]] = {}
    for queue in queues:
        groups.setdefault(keys.group_of(queue), []).append(queue)
    found = []
    for group, names in sorted(groups.items()):
        key = storable(keys.group(group).queue(names[0]))
        found.append(Shard(group, names, key_slot(key.encode()), _address(client.get_node_from_key(key))))
    return Spread(found, masters, cluster=True, sharded=True, full_coverage=_full_coverage(client))


def _full_coverage(client: Any) -> tuple[str, ...]:
    """The masters whose ``cluster-require-full-coverage`` is ``yes``; one
    that refuses CONFIG (an ACL, a managed service) is not named."""
    found = []
    for node in client.get_primaries():
        try:
            reply = node.redis_connection.config_get("cluster-require-full-coverage")
        except redis.RedisError:
            continue
        if str(reply.get("cluster-require-full-coverage", "")).lower() == "yes":
            found.append(_address(node))
    return tuple(sorted(found))


def lines(found: dict[str, Any]) -> list[str]:
    """``Spread.as_dict()`` for people (the caller escapes each line)."""
    groups, masters, idle = found["groups"], found["masters"], found["idle_masters"]
    if not found["cluster"]:
        return [f"shards: not a cluster: every queue is on {masters[0]}"]
    out = [f"shards: {len(groups)} group(s) on {len(masters) - len(idle)} of {len(masters)} masters"]
    for g in groups:
        names = ",".join(g["queues"]) or "-"
        out.append(f"  {g['group']}: slot {g['slot']} on {g['master']}, queues {names}")
    if idle and found.get("sharded"):
        out.append(
            f"warning: {len(idle)} master(s) hold no queue group ({', '.join(idle)}): they serve no "
            "job; queue names (or QUEUE_GROUPS) whose tags land there would spread the work"
        )
    elif idle:
        out.append(
            f"warning: {len(idle)} master(s) hold no queue ({', '.join(idle)}): every key is in "
            "the namespace's one slot, so one master serves every job (failover, not more throughput)"
        )
    if full := found.get("full_coverage"):
        out.append(
            f"warning: cluster-require-full-coverage is yes on {', '.join(full)}: while one master is "
            "down, these refuse every command, so every queue stops; set it to no (docs/deployment.md)"
        )
    return out
