"""One job as stored, and what can be done to it.

Duties: ``JobRecord`` reads an entry of a queue, a sorted set, the
unsettled list or an in-progress list through ``payload.parse`` (an entry
that cannot be read is shown as unreadable, never an exception: SPEC
section 8) and moves it: ``retry()`` (back on its queue now), ``kill()``
(to dead), ``delete()``; ``api.actions.bulk`` does one of these to many entries.
Every move is one script (``move.lua``) that writes before it removes and
does nothing if someone else moved the entry first. A job running now
(``kind="inprogress"``) offers no action: it is its process's alone (G2).
Redis errors reach the caller as ``CogworkerError``
(``errors.redis_boundary``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from django_cogworker import registry
from django_cogworker.conf import DEFAULT_QUEUE, get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import BadPayload, redis_boundary
from django_cogworker.escaping import storable
from django_cogworker.keys import Keys
from django_cogworker.payload import Payload, encode_stored, parse, text
from django_cogworker.scripts import script
from django_cogworker.workflows import effects, forward

#: Jobs per page of a listing, when the caller does not say.
PAGE_SIZE = 25

#: What can be done to a job in a set, one by one or in bulk (``api.actions.bulk``).
ACTIONS = ("retry", "delete", "kill")

#: A move: the ``move`` script's KEYS and ARGV.
MoveCall = tuple[list[str], list[str | bytes | int | float]]

#: An offset past every list and sorted set: Redis counts ranges in signed
#: 64-bit integers and answers an error past them (a page number of 30
#: digits in a URL), so a page from there on is empty without asking.
MAX_OFFSET = 2**62


class JobRecord:
    """One job as stored: in a queue, a sorted set, or the unsettled list."""

    def __init__(
        self,
        raw: bytes,
        *,
        source: str,
        kind: str,
        score: float | None = None,
        payload_raw: bytes | None = None,
        target_set: str | None = None,
        home: Keys | None = None,
    ) -> None:
        self._raw = raw  # the entry exactly as stored (needed to move it)
        self.source = source  # the Redis key it is in
        #: The keys of the queue group ``source`` belongs to (SPEC section
        #: 16): where a kill sends it. Without SHARDING, the one layout.
        self.home = home if home is not None else get_keys()
        self.kind = kind  # "queue", "zset", "unsettled", or "inprogress" (running: no actions)
        self.score = score
        self.target_set = target_set  # unsettled: where it should be filed
        self.payload_raw = payload_raw if payload_raw is not None else raw
        #: Why the payload cannot be read ("" when it can); then ``payload``
        #: is ``{"raw": <its text>}``.
        self.unreadable = ""
        value: Any = None
        try:
            value = parse(self.payload_raw)
        except BadPayload as exc:
            self.unreadable = f"payload is {exc}"
        else:
            if not isinstance(value, dict):
                self.unreadable = f"payload is a JSON {type(value).__name__}, not an object"
        self.payload: Payload = value if isinstance(value, dict) else {"raw": text(self.payload_raw)}

    def __repr__(self) -> str:
        return f"<JobRecord {self.jid} {self.name} in {self.source}>"

    @property
    def raw(self) -> str:
        return text(self.payload_raw)

    @property
    def entry(self) -> bytes:
        return self._raw

    def _get(self, key: str, default: Any = None) -> Any:
        return self.payload.get(key, default)

    jid = property(lambda self: str(self._get("jid", "")))
    name = property(lambda self: str(self._get("job", "")))
    args = property(lambda self: self._get("args", []))
    kwargs = property(lambda self: self._get("kwargs", {}))
    queue = property(lambda self: str(self._get("queue", "") or ""))
    retry_count = property(lambda self: self._get("retry_count"))
    error_class = property(lambda self: self._get("error_class"))
    error_message = property(lambda self: self._get("error_message"))
    error_backtrace = property(lambda self: self._get("error_backtrace"))
    failed_at = property(lambda self: self._get("failed_at"))
    retried_at = property(lambda self: self._get("retried_at"))
    enqueued_at = property(lambda self: self._get("enqueued_at"))
    created_at = property(lambda self: self._get("created_at"))
    #: The batch it is a member of (SPEC section 13), or of which it is a
    #: callback (``cb``); "" for a plain job, or when the field is no text.
    bid = property(lambda self: b if isinstance(b := self._get("bid"), str) else "")

    @property
    def at(self) -> dt.datetime | None:
        """When it is due (scheduled, retry) or died (dead), as a datetime."""
        return None if self.score is None else dt.datetime.fromtimestamp(self.score, tz=dt.UTC)

    def matches(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        search: str | None = None,
        bid: str | None = None,
    ) -> bool:
        if bid and self.bid != bid:
            return False
        if name and self.name != name:
            return False
        if queue and self.queue != queue:
            return False
        if search:
            needle = search.lower()
            hay = [self.jid, str(self.error_message or ""), str(self.error_class or "")]
            if not any(needle in h.lower() for h in hay):
                return False
        return True

    @property
    def id(self) -> str:
        """A token that finds this exact entry again through its set's
        ``get()``, unique per entry: ``<score>~<jid>~<digest>`` in a sorted
        set (one ZRANGEBYSCORE away, however large the set; two unreadable
        entries of one score have no jid, but their own digests), a digest
        of the entry in a list. A lone surrogate in the jid is written as
        text (``escaping.storable``): the id goes into URLs and forms."""
        if self.kind == "zset":
            return f"{self.score!r}~{storable(self.jid)}~{self.digest[:12]}"
        return self.digest[:20]

    @property
    def digest(self) -> str:
        """A digest of the entry exactly as stored."""
        return hashlib.sha1(self._raw).hexdigest()

    # -- actions ---------------------------------------------------------------

    def _move_call(
        self, destination: str, payload: bytes, to_kind: str, where: str | float, move: str | None = None
    ) -> MoveCall:
        k = self.home
        source_kind = "zset" if self.kind == "zset" else "list"
        # A batch's member moves in its batch in the same step (SPEC 13).
        extra = effects.moved(k, get_config(), self.payload, move) if move else ([], [])
        return (
            [self.source, destination, k.moved_to, *extra[0]],
            [self._raw, payload, source_kind, to_kind, str(where), *extra[1]],
        )

    def _delete_call(self) -> MoveCall | None:
        """A batch's member deleted counts as dead in its batch: through
        ``move.lua``, moved nowhere. None for any other entry."""
        if self.kind == "inprogress" or (self.kind == "zset" and self.source == self.home.dead):
            return None
        if not effects.levels(self.payload):
            return None
        return self._move_call(self.source, b"", "none", "", effects.DEAD)

    @property
    def destination_queue(self) -> str:
        """The queue a retry puts it on: its payload's, as a worker's
        poller would write the name (scripts.py), or the default queue."""
        queue = self.payload.get("queue")
        return storable(queue) if isinstance(queue, str) and queue else DEFAULT_QUEUE

    def _retry_call(self) -> MoveCall | None:
        if self.kind in ("queue", "inprogress"):
            return None
        payload = dict(self.payload)
        queue = self.destination_queue
        payload["enqueued_at"] = time.time()
        data = encode_stored(payload) if "job" in payload else self.payload_raw
        revived = effects.REVIVED if self.kind == "zset" and self.source == self.home.dead else None
        return self._move_call(get_keys().queue(queue), data, "queue", queue, revived)

    def _kill_call(self) -> MoveCall | None:
        k = self.home
        if self.kind == "inprogress" or (self.kind == "zset" and self.source == k.dead):
            return None
        payload = dict(self.payload)
        payload.setdefault("error_class", "Killed")
        payload.setdefault("error_message", "killed by hand")
        payload["failed_at"] = payload.get("failed_at") or time.time()
        return self._move_call(k.dead, encode_stored(payload), "zset", repr(time.time()), effects.DEAD)

    def _call(self, action: str) -> MoveCall | None:
        return self._retry_call() if action == "retry" else self._kill_call()

    def crosses(self, action: str) -> bool:
        """Whether ``action`` would move it into another queue group's slot
        (``_across``): only a retry can."""
        if action != "retry" or not self.home.sharded or self.kind in ("queue", "inprogress"):
            return False
        return self._apart(get_keys().queue(self.destination_queue))

    def _across(self, call: MoveCall) -> bool:
        """Whether ``call`` moves the entry into another queue group's slot
        (a payload naming a queue of another group: pushed by hand, or
        ``QUEUE_GROUPS`` changed since), which no one script can do."""
        return self._apart(call[0][1])

    def _apart(self, destination: str) -> bool:
        return self.home.sharded and not destination.startswith(self.home.tag)

    def _queue_action(self, pipe: Any, action: str) -> bool:
        """Adds ``action`` on this entry to a pipeline; False if it does not apply."""
        if action == "delete":
            if self.kind == "inprogress":
                return False
            member = self._delete_call()
            if member is not None:
                script("move").queue(pipe, *member)
                return True
            if self.kind == "zset":
                pipe.zrem(self.source, self._raw)
            else:
                pipe.lrem(self.source, 1, self._raw)
            return True
        call = self._call(action)
        if call is None:
            return False
        script("move").queue(pipe, *call)
        return True

    def _move(self, call: MoveCall | None) -> bool:
        if call is None:
            return False
        client = get_redis()
        if self._across(call):
            return self._move_across(client, call)
        moved = bool(script("move")(client, *call))
        if moved and self.home.sharded and call[1][3] == "queue":
            client.sadd(get_keys().queues, call[1][4])  # the shared registry, in the {N} slot
        if moved:
            self.forward_ends()
        return moved

    def forward_ends(self) -> None:
        """Under SHARDING, a batch member's move reaches its batch now
        (``workflows/forward.py``) rather than at a worker's next poll."""
        if effects.levels(self.payload):
            forward.soon(get_redis(), self.home, get_config())

    def _move_across(self, client: Any, call: MoveCall) -> bool:
        """A retry into another group's queue, in two steps as two slots
        need: written there first, then removed here (a crash between
        leaves a second copy, never none), and taken back if someone else
        moved the entry first."""
        (source, destination, _, *extra_keys), (raw, data, _, _, queue, *extra_args) = call
        client.lpush(destination, data)
        client.sadd(get_keys().queues, queue)
        removed = client.zrem(source, raw) if self.kind == "zset" else client.lrem(source, 1, raw)
        if not removed:
            client.lrem(destination, 1, data)
        elif extra_args:
            # A batch's member: its move, as move.lua makes it, to its batch
            # through its group's outbox (after the removal: a crash before
            # leaves the copy, and the member dead, as a retry not made).
            script("batch_move")(client, extra_keys, extra_args)
            self.forward_ends()
        return bool(removed)

    @redis_boundary("retry a job")
    def retry(self) -> bool:
        """Back on its queue now (from schedule, retry, dead or unsettled)."""
        return self._move(self._retry_call())

    @redis_boundary("kill a job")
    def kill(self) -> bool:
        """To the dead set now."""
        return self._move(self._kill_call())

    @redis_boundary("delete a job")
    def delete(self) -> bool:
        client = get_redis()
        if self.kind == "inprogress":
            return False  # running: G2 gives it to its process alone
        member = self._delete_call()
        if member is not None:
            moved = bool(script("move")(client, *member))
            if moved:
                self.forward_ends()
            return moved
        if self.kind == "zset":
            return bool(client.zrem(self.source, self._raw))
        return bool(client.lrem(self.source, 1, self._raw))

    def apply(self, action: str) -> bool:
        """One of ``ACTIONS`` by name; False if the entry was gone (or it is dead and asked to die)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}: use one of {', '.join(ACTIONS)}")
        return bool(getattr(self, action)())


def job_names() -> list[str]:
    """The registered job names (what a list can be filtered by)."""
    return registry.names()


#: How many records iteration reads per call.
ITERATION_BATCH = 500


def paged(page: Callable[[int, int], list[JobRecord]]) -> Iterator[JobRecord]:
    """Every record, read ``ITERATION_BATCH`` at a time through ``page(offset, limit)``."""
    offset = 0
    while True:
        batch = page(offset, ITERATION_BATCH)
        yield from batch
        if len(batch) < ITERATION_BATCH:
            return
        offset += ITERATION_BATCH
