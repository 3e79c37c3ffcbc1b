"""The pauses between tries while Redis cannot be reached: the one backoff
rule, for the worker's boot (``connection.wait_for_client``), its first
beat (``launcher.Launcher.first_beat``) and a processor thread in an
outage (``processor.Processor.back_off`` and ``recovered``).

Duty: give the next pause, doubling from ``first_s`` up to ``max_s``, and
start over after a success. Use it as::

    pauses = Backoff(max_s=BOOT_RETRY_MAX_S)
    while not tried():
        if stop.wait(pauses.next_s()):
            return False

    # or, for a loop that keeps running through the outage (the processor):
    self.crew.quiet.wait(self.pauses.next_s())  # back_off(): on each failure
    if self.pauses.reset():  # recovered(): True when it ends an outage
        self.crew.outage.succeeded()

No jitter: the sequence the three loops kept by hand (0.1 s doubling to
5 s); each wait ends early on its stop event. redis-py's ``ExponentialBackoff`` computes
``base * 2**failures``, which overflows a float after about a thousand
failures (some 80 minutes of an outage at 5 s); this keeps the pause
itself instead of a count.
"""

from __future__ import annotations

#: The first pause (s): short, as most outages seen by a running worker are a
#: failover or a restart of a few seconds.
FIRST_PAUSE_S = 0.1


class Backoff:
    """Doubling pauses, ``first_s`` then twice the last, never above ``max_s``."""

    def __init__(self, max_s: float, first_s: float = FIRST_PAUSE_S) -> None:
        self.first_s = first_s
        self.max_s = max_s
        #: The last pause given since the last reset (0: none).
        self.last_s = 0.0

    def next_s(self) -> float:
        """The pause to take now, before the next try."""
        self.last_s = min(max(self.last_s * 2, self.first_s), self.max_s)
        return self.last_s

    def reset(self) -> bool:
        """Start over from ``first_s`` (a try succeeded); True when a pause
        had been taken since the last reset, i.e. this success ends a run of
        failures."""
        if not self.last_s:
            return False  # the common case, once a job: no write
        self.last_s = 0.0
        return True
