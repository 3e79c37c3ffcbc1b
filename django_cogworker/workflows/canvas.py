"""``chain``, ``group`` and ``chord`` (SPEC section 13), built on
signatures and batches.

- ``chain(a.s(), b.s(), c.si()).delay()``: the first step is pushed with
  the rest in its payload (``chain``); each next step is pushed by the ack
  of the previous one, in the same script (``workflows/ends.py``), with
  its return value appended to its arguments unless ``.si()``. A step that
  dies keeps the rest in its dead entry: retried, it resumes the chain.
- ``group(sigs).delay()``: a batch of those signatures, no callbacks.
- ``chord(header, body).delay()``: a batch whose success pushes ``body``
  with the list of the header's results, in header order, as its first
  argument (``lib/batches.lua``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django_cogworker import client
from django_cogworker.workflows.batch import Batch, building, callback_jid
from django_cogworker.workflows.signature import Signature

#: What a chord's body holds in place of its first argument until its
#: success: ``lib/batches.lua`` writes the results there.
RESULTS_PLACEHOLDER = "__COGWORKER_RESULTS__"


def _signatures(what: str, sigs: Any) -> list[Signature]:
    out = list(sigs.signatures if isinstance(sigs, group) else sigs)
    for sig in out:
        if not isinstance(sig, Signature):
            raise TypeError(f"{what}: every step must be a signature (job.s(...)), not {sig!r}")
    return out


class chain:  # named as in Celery's canvas, which users know
    """Steps run one after the other, each after the previous succeeded."""

    def __init__(self, *steps: Signature) -> None:
        self.steps = _signatures("chain()", steps)
        if not self.steps:
            raise TypeError("chain() needs at least one step")
        self.steps[0].check()
        for step in self.steps[1:]:
            step.check(last=() if step.immutable else [None])

    def delay(self) -> str | None:
        """Pushes the first step; returns its jid."""
        first, rest = self.steps[0], self.steps[1:]
        payload = first.payload()
        if rest:
            payload["chain"] = [step.to_dict() for step in rest]
        # A chain's step is a workflow's job even outside any batch: its
        # ack pushes the next step. Inside a `with batch()`, the batch's id.
        payload["bid"] = None
        return client.enqueue(payload)


class group:
    """Signatures run in parallel, as one batch."""

    def __init__(self, sigs: Iterable[Signature], *more: Signature) -> None:
        self.signatures = _signatures("group()", [*sigs, *more] if more else sigs)
        for sig in self.signatures:
            sig.check()

    def delay(self) -> str:
        """Pushes them as one batch; returns its bid."""
        return _push(Batch(kind="batch"), self.signatures)


class chord:
    """A header of signatures run in parallel, then ``body`` with their
    results, once, if every one succeeded."""

    def __init__(
        self,
        header: Iterable[Signature] | group,
        body: Signature,
        *,
        on_death: Signature | None = None,
        on_settled: Signature | None = None,
    ) -> None:
        self.header = _signatures("chord()", header)
        for sig in self.header:
            sig.check()
        if not isinstance(body, Signature):
            raise TypeError(f"chord(): body must be a signature (job.s(...)), not {body!r}")
        body.check(first=[[]])
        self.body = body
        self.callbacks = {e: s for e, s in (("death", on_death), ("settled", on_settled)) if s is not None}
        for sig in self.callbacks.values():
            sig.check()

    def delay(self) -> str:
        """Pushes the header as one batch; returns its bid."""
        built = Batch(kind="chord", callbacks=dict(self.callbacks))
        built.body = self.body.payload(first=[RESULTS_PLACEHOLDER], jid=callback_jid(built.bid, "success"))
        built.callback(built.body, "success")
        return _push(built, self.header, chord=True)


def _push(built: Batch, sigs: list[Signature], *, chord: bool = False) -> str:
    with building(built):
        for sig in sigs:
            payload = sig.payload()
            if chord:
                payload["chord"] = True
            client.enqueue(payload)
    return built.bid
