"""``batch()`` and ``current_batch()`` (SPEC section 13).

Duties: collect what is enqueued inside a ``with batch()`` block (the same
thread or task: a context variable that ``client.enqueue`` reads), each
payload marked with its ``bid`` (and its ancestors' ``bids``); at the
block's exit push them all through ``batch_open.lua`` (after the commit
inside ``transaction.atomic()``, nothing on rollback), or none when the
block raises; make a batch opened inside a member, or inside another
``with batch()``, a child of that batch; tell a member or a callback which
batch it belongs to (``current_batch()``), and let a member add to it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django_cogworker import atomic, client, middleware
from django_cogworker.conf import get_config
from django_cogworker.connection import get_keys, get_redis
from django_cogworker.context import current_job
from django_cogworker.errors import EnqueueRefused, redis_boundary
from django_cogworker.payload import Payload
from django_cogworker.workflows import forward, state
from django_cogworker.workflows.signature import Signature

#: The events a batch fires, each at most once (SPEC section 13).
EVENTS = ("success", "complete", "death", "settled")


def new_bid() -> str:
    """A batch id: 22 url-safe random characters."""
    return secrets.token_urlsafe(16)


def callback_jid(bid: str, event: str) -> str:
    """The jid of a batch's callback for ``event``: known in advance, so
    that a callback can make itself idempotent."""
    return f"{bid}-{event}"


@dataclass
class Batch:
    """A batch being built (``with batch() as b``), then pushed: ``b.bid``."""

    description: str = ""
    callbacks: dict[str, Signature] = field(default_factory=dict)
    kind: str = "batch"
    bid: str = field(default_factory=new_bid)
    #: The ancestors' bids, nearest first.
    ancestors: list[str] = field(default_factory=list)
    members: list[state.Member] = field(default_factory=list)
    children: list[Batch] = field(default_factory=list)
    #: A chord's body: the payload pushed with the results at success.
    body: Payload | None = None
    _chains: list[tuple[middleware.ClientChain, Payload]] = field(default_factory=list, repr=False)

    def collect(self, chain: middleware.ClientChain, payloads: list[Payload], at: float | None) -> None:
        """What ``client.enqueue`` hands over inside the block."""
        for payload in payloads:
            self.mark(payload)
            self.members.append((str(payload["jid"]), payload, at))
            self._chains.append((chain, payload))

    def mark(self, payload: Payload) -> None:
        payload["bid"] = self.bid
        if self.ancestors:
            payload["bids"] = list(self.ancestors)
        else:
            payload.pop("bids", None)

    def fields(self) -> dict[str, str | bytes]:
        from django_cogworker.payload import encode

        values: dict[str, str | bytes] = {
            "description": self.description,
            "parent": self.ancestors[0] if self.ancestors else "",
            "kind": self.kind,
        }
        for event, sig in self.callbacks.items():
            payload = sig.payload(jid=callback_jid(self.bid, event))
            values[f"cb:{event}"] = encode(self.callback(payload, event))
        if self.body is not None:
            values["body"] = encode(self.body)
        return values

    def callback(self, payload: Payload, event: str) -> Payload:
        """A callback's payload: not a member, but it knows its batch."""
        payload["bid"] = self.bid
        payload["cb"] = event
        return payload

    def cancel(self) -> None:
        """Nothing is pushed: a unique lock taken for a member is released."""
        for chain, payload in self._chains:
            chain.cancel(payload)
        for child in self.children:
            child.cancel()

    def family(self) -> list[Batch]:
        """This batch, then the children opened inside its block, and theirs."""
        return [self, *(b for child in self.children for b in child.family())]

    def push(self) -> None:
        """Opens this batch with its members, and its children's: in one
        call (all or none) up to ``state.CHUNK`` members in all; a larger
        family batch by batch, this one first (it waits for its children
        from then on), each in chunks."""
        family = self.family()
        client, keys, config = get_redis(), get_keys(), get_config()
        with redis_boundary("enqueue", refused=EnqueueRefused):
            try:
                if sum(len(b.members) for b in family) <= state.CHUNK:
                    sections = [state.Section([b.bid, *b.ancestors], b.fields(), b.members) for b in family]
                    state.open_sections(client, keys, config, sections)
                else:
                    for b in family:
                        state.open_batch(client, keys, config, [b.bid, *b.ancestors], b.fields(), b.members)
            except BaseException:
                self.cancel()
                raise
        forward.soon(client, keys, config)  # the members, from {N}:forward to their groups


def _enclosing() -> tuple[Batch | None, list[str]]:
    """The batch being built around this point, else the batch of the
    running member: (the enclosing one, the ancestors of a new child)."""
    sink = client.collecting.get()
    outer = getattr(sink, "__self__", None)
    if isinstance(outer, Batch):
        return outer, [outer.bid, *outer.ancestors]
    running = current_batch()
    if running is not None and running.event is None:
        return None, [running.bid, *running.ancestors]
    return None, []


@contextmanager
def building(built: Batch) -> Iterator[Batch]:
    """Collects what is enqueued in the block into ``built``; at its exit,
    pushes it (on commit), makes it a child of the enclosing batch, or
    pushes nothing when the block raises."""
    outer, built.ancestors = _enclosing()
    if client.inline_mode():
        # The testing helpers' inline mode runs each job as it is enqueued:
        # members run at once, and a batch has no state in Redis to fire from.
        yield built
        return
    token = client.collecting.set(built.collect)
    try:
        yield built
    except BaseException:
        client.collecting.reset(token)
        built.cancel()
        raise
    client.collecting.reset(token)
    if outer is not None:
        # Pushed after its parent, which waits for it from its own push on.
        outer.members.append((state.child_id(built.bid), None, None))
        outer.children.append(built)
        return
    atomic.on_commit_or_now(get_config().enqueue_on_commit, built.push)


def batch(
    description: str = "",
    *,
    on_success: Signature | None = None,
    on_complete: Signature | None = None,
    on_death: Signature | None = None,
    on_settled: Signature | None = None,
) -> Any:
    """``with batch(...) as b:``: every job enqueued in the block is a
    member, pushed at its exit, all or none (SPEC section 13)."""
    callbacks = {"success": on_success, "complete": on_complete, "death": on_death, "settled": on_settled}
    for event, sig in callbacks.items():
        if sig is not None and not isinstance(sig, Signature):
            raise TypeError(f"batch(): on_{event} must be a signature (job.s(...)), not {sig!r}")
        if sig is not None:
            sig.check()
    chosen = {event: sig for event, sig in callbacks.items() if sig is not None}
    return building(Batch(description=str(description), callbacks=chosen))


@dataclass(frozen=True)
class CurrentBatch:
    """The batch of the running member or callback."""

    bid: str
    #: The event a callback runs for; None in a member.
    event: str | None
    ancestors: list[str]

    @property
    def description(self) -> str:
        with redis_boundary("read the batch"):
            value = get_redis().hget(get_keys().batch(self.bid), "description")
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")

    def add(self, sig: Signature) -> str | None:
        """Adds ``sig`` as a member of this batch and pushes it, in one
        step, before the running member's own end: the batch waits for it.
        Returns its jid (None if a client middleware refused it)."""
        if self.event is not None:
            raise RuntimeError("current_batch().add() is for a running member, not a callback")
        if not isinstance(sig, Signature):
            raise TypeError(f"current_batch().add() takes a signature (job.s(...)), not {sig!r}")
        payload = sig.payload()
        payload["bid"] = self.bid
        if self.ancestors:
            payload["bids"] = list(self.ancestors)
        chain = middleware.client_chain()
        ready = chain.run(payload)
        if ready is None:
            return None
        jid = str(ready["jid"])
        try:
            with redis_boundary("enqueue", refused=EnqueueRefused):
                state.open_batch(
                    get_redis(),
                    get_keys(),
                    get_config(),
                    [self.bid, *self.ancestors],
                    {},
                    [(jid, ready, None)],
                    first=False,
                    last=False,
                )
        except BaseException:
            chain.cancel(ready)
            raise
        forward.soon(get_redis(), get_keys(), get_config())
        return jid


def current_batch() -> CurrentBatch | None:
    """Inside a member or a callback, its batch (``.bid``,
    ``.description``, ``.event``); elsewhere None."""
    ctx = current_job()
    flow = ctx.workflow if ctx is not None else None
    if not flow or not isinstance(flow.get("bid"), str):
        return None
    bids = flow.get("bids")
    ancestors = [b for b in bids if isinstance(b, str)] if isinstance(bids, list) else []
    event = flow.get("cb")
    return CurrentBatch(flow["bid"], event if isinstance(event, str) else None, ancestors)
