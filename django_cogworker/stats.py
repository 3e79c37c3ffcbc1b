"""The processed and failed counters (SPEC section 4), written in one place.

The rule lives in ``lua/lib/count_stats.lua``: totals, a counter per day
that lives ``DAILY_STATS_TTL_S``, and a counter per minute that lives
``MINUTE_STATS_TTL_S`` (the dashboard's last hour). A worker's counts ride
on its heartbeat (one script call per beat, whatever the number of jobs), so
its jobs are counted in the minute of the beat that carries them: a job
that ends at 09:05:58 may be in 09:06 (``HEARTBEAT_INTERVAL``, 10 s by
default). :func:`count` is for what happens outside a beat: a process's
last counts as it stops, a job that recovery files in dead.
"""

from __future__ import annotations

import time
from typing import Any

from django_cogworker.keys import MINUTE_FORMAT, Keys
from django_cogworker.scripts import script

#: Daily counters are kept this long.
DAILY_STATS_TTL_S = 400 * 24 * 3600

#: Per-minute counters are kept this long: the dashboard shows the last
#: hour; the second hour is room for a reader whose clock is behind.
MINUTE_STATS_TTL_S = 2 * 3600


def today() -> str:
    """The day of the daily counters (UTC)."""
    return time.strftime("%Y-%m-%d", time.gmtime())


def minute(at_s: float | None = None) -> str:
    """The minute of the per-minute counters and metrics (UTC)."""
    return time.strftime(MINUTE_FORMAT, time.gmtime(at_s))


def stat_keys(keys: Keys, at_s: float | None = None) -> list[str]:
    """The six counters at ``at_s`` (epoch seconds, now by default), in the
    order count_stats.lua takes them: totals, the UTC day's, the UTC
    minute's. One clock reading, so that the day and the minute agree."""
    t = time.gmtime(at_s)
    day, minute = time.strftime("%Y-%m-%d", t), time.strftime(MINUTE_FORMAT, t)
    return [
        keys.stat_processed,
        keys.stat_failed,
        keys.stat_processed_on(day),
        keys.stat_failed_on(day),
        keys.stat_processed_minute(minute),
        keys.stat_failed_minute(minute),
    ]


def count(client: Any, keys: Keys, *, processed: int = 0, failed: int = 0) -> None:
    if processed or failed:
        script("count")(client, stat_keys(keys), [processed, failed, DAILY_STATS_TTL_S, MINUTE_STATS_TTL_S])
