"""Which limiters a job starts under (SPEC section 14): its
``@job(limit=)`` (a limiter, or a callable of its arguments, called at each
start) and its queue's ``QUEUE_LIMITS`` entry; none for a plain job (two
lookups). ``Processor.admitted`` admits it under them (``state.admit``);
:func:`dropped_unrun` gives back what a job dropped at its start reserved.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django_cogworker import registry
from django_cogworker.limits import Limiter, for_queue, state

if TYPE_CHECKING:
    from django_cogworker.conf import Config
    from django_cogworker.keys import Keys
    from django_cogworker.payload import Payload

logger = logging.getLogger("django_cogworker")


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


def dropped_unrun(client: Any, keys: Keys, jid: str, payload: Payload, queue: str, config: Config) -> None:
    """A job dropped at its start without running (expired): if it was a
    waiter put back on its queue, its reserved slot goes to the next one."""
    try:
        limiters = limiters_for(payload, queue, config)
        if limiters:
            state.unreserve(client, keys, jid, limiters)
    except Exception as exc:
        # Its reservation lapses after PROMOTED_TTL_S; the sweep wakes the next.
        logger.debug("jid=%s: its limiters' reservation not dropped (%s)", jid, exc)
