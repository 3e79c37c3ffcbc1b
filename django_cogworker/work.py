"""What a fetch brings: one job, exactly as it came from its queue.

Made by the fetchers (``fetch.py``) and held, run and settled by reference
by the ledger, the processor and the settler; its payload is parsed once,
on first use, and a payload that cannot be parsed stays a value (G13).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django_cogworker.errors import BadPayload
from django_cogworker.limits.limiter import Limiter
from django_cogworker.payload import Payload, decode


@dataclass(eq=False)
class UnitOfWork:
    """A fetched job, exactly as it came from its queue."""

    queue: str
    raw: bytes
    #: When the fetch that brought it was sent (monotonic clock): a job not
    #: started soon after is checked to be still ours first (G18). Not when
    #: its reply was read: a process stopped with the fetch in flight reads
    #: it only when it resumes.
    fetched_at: float = 0.0
    #: The concurrency limiters whose slots it holds (SPEC section 14): taken
    #: at its start or in its code, freed in the call that settles it.
    holds: tuple[Limiter, ...] = ()
    _payload: Payload | BadPayload | None = field(default=None, repr=False)
    #: Runs isolated (recovered again, G3): an ``async def`` one then runs
    #: in its thread, not on the event loop beside the others.
    isolated: bool = False
    #: A workflow's job (SPEC section 13): the return value it hands on
    #: (JSON), and whether it ended failed for good though acknowledged
    #: (``dead=False``): dead in its batch.
    result: str | None = None
    lost: bool = False

    def payload(self) -> Payload:
        """The decoded payload (parsed once), or BadPayload (G13)."""
        if self._payload is None:
            try:
                self._payload = decode(self.raw)
            except BadPayload as exc:
                self._payload = exc
        if isinstance(self._payload, BadPayload):
            raise self._payload
        return self._payload

    @property
    def recovered(self) -> bool:
        """Recovered once from a dead process: the payload's ``orphaned``
        field, which the requeue writes (G3)."""
        try:
            return self.payload().get("orphaned") is not None
        except BadPayload:
            return False

    @property
    def jid(self) -> str:
        try:
            return str(self.payload().get("jid") or "")
        except BadPayload:
            return ""
