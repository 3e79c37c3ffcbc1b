"""The two key layouts, and :func:`keys`, which picks one: without
``SHARDING`` every name built from the namespace (``keys.Keys``); with
``SHARDING = "queues"`` (SPEC section 16) each queue group's under its own
hash tag (:class:`GroupKeys`), and the shared ones under ``{N}`` with the
way to each group's (:class:`ShardedKeys`). Every name is documented in
``docs/redis-layout.md``."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from django_cogworker.conf import DEFAULT_QUEUE
from django_cogworker.keys import Keys


class GroupKeys(Keys):
    """The keys of one queue group under ``SHARDING = "queues"`` (SPEC
    section 16): its own under the tag ``{N:<group>}``, so that they share a
    slot, and the shared ones under ``{N}``. A queue named like its group is
    ``{N:<q>}:queue``; another queue of the group ``{N:<group>}:queue:<q>``."""

    sharded = True

    def __init__(self, namespace: str, group: str, root: ShardedKeys) -> None:
        self.namespace = namespace
        self.group_name = group
        self._root = root
        self._shared("{" + namespace + "}")
        self._per_group("{" + f"{namespace}:{group}" + "}")
        self._own_queue = self.queue_prefix.removesuffix(":")

    def queue(self, name: str) -> str:
        if name == self.group_name:
            return self._own_queue
        if self._root.group_of(name) == self.group_name:
            return self.queue_prefix + name
        return self._root.queue(name)  # a queue of another group: under its tag

    def queue_of(self, key: str) -> str:
        return self.group_name if key == self._own_queue else key.removeprefix(self.queue_prefix)

    def own(self, queue: str) -> str:
        if self._root.group_of(queue) == self.group_name:
            return queue
        return self._root.first_queue(self.group_name)

    @property
    def shared(self) -> Keys:
        return self._root

    @property
    def batch_schedule(self) -> str:
        return self.forward

    def group(self, name: str) -> Keys:
        return self._root.group(name)

    def for_queue(self, queue: str) -> Keys:
        return self._root.for_queue(queue)

    def group_of(self, queue: str) -> str:
        return self._root.group_of(queue)

    def for_payload(self, payload: Mapping[str, Any]) -> Keys:
        return self._root.for_payload(payload)

    def limit_waiting(self, name: str, queue: str) -> str:
        if self._root.group_of(queue) == self.group_name:
            return super().limit_waiting(name, queue)
        return self._root.limit_waiting(name, queue)

    def queue_clearing(self, name: str, token: str) -> str:
        if self._root.group_of(name) == self.group_name:
            return super().queue_clearing(name, token)
        return self._root.queue_clearing(name, token)


class ShardedKeys(Keys):
    """The shared keys under ``SHARDING = "queues"``, and the way to each
    group's (:meth:`group`, :meth:`for_queue`). A key that belongs to a
    group is not here: asking for it is a mistake, and says so."""

    sharded = True

    def __init__(self, namespace: str, groups: dict[str, str]) -> None:
        self.namespace = namespace
        self._groups = groups
        self._group_keys: dict[str, GroupKeys] = {}
        self._shared("{" + namespace + "}")

    def __getattr__(self, name: str) -> str:
        # Only called for a name __init__ did not set: a group's key.
        raise AttributeError(
            f"{name} belongs to one queue group under SHARDING = 'queues': "
            "take it from keys.group() or keys.for_queue()"
        )

    @property
    def batch_schedule(self) -> str:
        return self.forward

    def home(self, payload: Mapping[str, Any]) -> Keys:
        return self.for_payload(payload)

    def group(self, name: str) -> Keys:
        found = self._group_keys.get(name)
        if found is None:
            found = self._group_keys[name] = GroupKeys(self.namespace, name, self)
        return found

    def for_queue(self, queue: str) -> Keys:
        return self.group(self._groups.get(queue, queue))

    def for_payload(self, payload: Mapping[str, Any]) -> Keys:
        queue = payload.get("queue")
        return self.for_queue(queue if isinstance(queue, str) and queue else DEFAULT_QUEUE)

    def group_of(self, queue: str) -> str:
        return self._groups.get(queue, queue)

    def first_queue(self, group: str) -> str:
        """The first queue ``QUEUE_GROUPS`` lists in ``group``; the group
        itself when no entry names it (a group of one queue)."""
        return next((q for q, g in self._groups.items() if g == group), group)

    def queue(self, name: str) -> str:
        return self.for_queue(name).queue(name)

    def queue_of(self, key: str) -> str:
        raise AttributeError("a queue key belongs to one group: ask keys.group() which queue it names")

    def limit_waiting(self, name: str, queue: str) -> str:
        return self.for_queue(queue).limit_waiting(name, queue)

    def queue_clearing(self, name: str, token: str) -> str:
        return self.for_queue(name).queue_clearing(name, token)


@functools.lru_cache(maxsize=64)
def keys(namespace: str, groups: tuple[tuple[str, str], ...] | None = None) -> Keys:
    """The keys of ``namespace``; with ``groups`` (queue -> group pairs,
    from ``QUEUE_GROUPS``, empty when none), the sharded layout."""
    if groups is None:
        return Keys(namespace)
    return ShardedKeys(namespace, dict(groups))
