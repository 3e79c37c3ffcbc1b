"""``Signature``: one call of a job, to run later as a workflow's step
(SPEC section 13): ``job.s(*args, **kwargs)``, ``job.si(...)``.

Checked when it is made, as ``.delay()`` checks its arguments: JSON that
arrives as it was passed, and a call the function accepts so far (a chain
step or a chord's body gets one more argument later: that call is checked
where the workflow is built). A signature travels as a dict (``to_dict``):
``name``, ``args``, ``kwargs``, ``queue``, ``options``, ``immutable``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from django_cogworker.payload import Payload, check_arguments, check_shape

#: A ``job.Job`` (not imported: ``Job.s()`` makes signatures, so ``job.py``
#: imports this module).
Job = Any


@dataclasses.dataclass(frozen=True)
class Signature:
    job: Job
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: Per-call options, as ``Job.set()`` takes them (``queue``, ``retry``, ...).
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Takes no previous step's result in a chain (``.si()``).
    immutable: bool = False

    @classmethod
    def of(cls, job: Job, args: Sequence[Any], kwargs: dict[str, Any]) -> Signature:
        check_arguments(job.name, args, kwargs)
        check_shape(job.name, args, kwargs)
        signature = job.signature
        if signature is not None:
            try:
                signature.bind_partial(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(
                    f"job {job.name!r} cannot be called with these arguments ({exc}). Nothing was enqueued."
                ) from None
        return cls(job, tuple(args), dict(kwargs))

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def queue(self) -> str:
        return str(self.options.get("queue", self.job.queue))

    def set(self, **options: Any) -> Signature:
        """A copy with per-call options (``queue=...`` and the others of
        ``Job.set()``), checked now."""
        merged = {**self.options, **options}
        self.job.set(**merged)
        return dataclasses.replace(self, options=merged)

    def si(self) -> Signature:
        """An immutable copy: in a chain, it takes no previous result."""
        return dataclasses.replace(self, immutable=True)

    def configured(self) -> Job:
        return self.job.set(**self.options) if self.options else self.job

    def payload(
        self, *, first: Sequence[Any] = (), last: Sequence[Any] = (), jid: str | None = None
    ) -> Payload:
        """The payload of this call (``first`` and ``last``: arguments put
        before and after its own), checked as ``.delay()`` checks one."""
        return self.configured().checked_payload([*first, *self.args, *last], self.kwargs, jid=jid)

    def check(self, *, first: Sequence[Any] = (), last: Sequence[Any] = ()) -> None:
        """Raises TypeError if the function could not take this call."""
        self.job.check_call([*first, *self.args, *last], self.kwargs)

    def to_dict(self) -> dict[str, Any]:
        step: dict[str, Any] = {
            "name": self.name,
            "args": list(self.args),
            "kwargs": self.kwargs,
            "queue": self.queue,
        }
        options = {k: v for k, v in self.options.items() if k != "queue"}
        if options:
            step["options"] = options
        if self.immutable:
            step["immutable"] = True
        return step

    def delay(self) -> str | None:
        """Enqueues this call now, as ``job.delay(*args, **kwargs)``."""
        return self.configured().delay(*self.args, **self.kwargs)
