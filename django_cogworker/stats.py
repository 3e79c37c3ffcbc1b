"""The processed and failed counters (SPEC section 4), written in one place.

The rule lives in ``lua/lib/count_stats.lua``: totals, and a counter per day
that lives ``DAILY_STATS_TTL_S``. A worker's counts ride on its heartbeat
(one script call per beat, whatever the number of jobs); :func:`count` is
for what happens outside a beat: a process's last counts as it stops, a job
that recovery files in dead.
"""

from __future__ import annotations

import time
from typing import Any

from django_cogworker.keys import Keys
from django_cogworker.scripts import script

#: Daily counters are kept this long.
DAILY_STATS_TTL_S = 400 * 24 * 3600


def today() -> str:
    """The day of the daily counters (UTC)."""
    return time.strftime("%Y-%m-%d", time.gmtime())


def stat_keys(keys: Keys, day: str) -> list[str]:
    """The four counters, in the order count_stats.lua takes them."""
    return [keys.stat_processed, keys.stat_failed, keys.stat_processed_on(day), keys.stat_failed_on(day)]


def count(client: Any, keys: Keys, *, processed: int = 0, failed: int = 0) -> None:
    if processed or failed:
        script("count")(client, stat_keys(keys, today()), [processed, failed, DAILY_STATS_TTL_S])
