"""Which limiters a job starts under (SPEC section 14): its
``@job(limit=)`` (a limiter, or a callable of its arguments, called at each
start) and its queue's ``QUEUE_LIMITS`` entry; none for a plain job (two
lookups). ``Processor.admitted`` admits it under them (``state.admit``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_cogworker import registry
from django_cogworker.limits import Limiter, for_queue

if TYPE_CHECKING:
    from django_cogworker.conf import Config
    from django_cogworker.payload import Payload


def limiters_for(payload: Payload, queue: str, config: Config) -> tuple[Limiter, ...]:
    """The limiters a job starts under. A callable limit is called with the
    job's arguments; what it returns must be a limiter (TypeError, the
    job's failure, otherwise)."""
    name = payload.get("job")
    job = registry.get(name) if isinstance(name, str) else None
    func_limit = None if job is None else job.limit
    found: tuple[Limiter, ...] = ()
    if func_limit is not None:
        limiter = func_limit
        if not isinstance(limiter, Limiter):
            limiter = func_limit(*payload.get("args", []), **payload.get("kwargs", {}))
            if not isinstance(limiter, Limiter):
                raise TypeError(
                    f"the job's limit returned {limiter!r}, not a limits.Concurrency or limits.Rate"
                )
        found = (limiter,)
    n = config.queue_limits.get(queue) if config.queue_limits else None
    if n is not None:
        found += (for_queue(queue, n),)
    return found
