"""Where a page of sorted sets merged by score starts in each of them
(SPEC section 16: a set page under SHARDING merges the set of every queue
group), found from counts alone.

:func:`seek` halves the range of scores until it finds the score of the
merged entry at the page's offset; every entry below that score is before
the page, and only the entries that share it are read and skipped. A deep
page (the admin's "last page" of 100,000 dead jobs) thus costs thirty to fifty
rounds of ZCOUNTs, one pipeline each, and a page and its ties read, not
every entry before it.
"""

from __future__ import annotations

import math
from typing import Any

#: An offset past this is sought; one before it is reached by reading the
#: merge from its start (no more than this many entries).
SEEK_FROM = 1000

#: Halvings at most: a double's range takes fewer; a set whose scores run
#: to infinity could take more, and is then read from its start.
MAX_ROUNDS = 2100


def seek(client: Any, keys: list[str], offset: int, *, newest_first: bool) -> tuple[list[int], int]:
    """(the rank in each set of ``keys`` to read from, how many merged
    entries to skip from there) for the merged page at ``offset``. Scores
    are taken in the sets' order (negated when newest first), so one
    search serves both orders. Ties merge as ZRANGE orders them: by member."""
    sign = -1.0 if newest_first else 1.0
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.zcard(key)
        pipe.zrange(key, 0, 0, withscores=True)
        pipe.zrange(key, -1, -1, withscores=True)
    replies = pipe.execute()
    sizes = [int(n) for n in replies[::3]]
    ends = [sign * score for reply in replies[1::3] + replies[2::3] for _, score in reply]
    if not ends or offset >= sum(sizes):
        return sizes, 0

    def at_or_below(t: float, *, inclusive: bool) -> list[int]:
        """Entries of each set whose score, in the sets' order, is below ``t`` (or at it)."""
        edge = ("" if inclusive else "(") + repr(sign * t)
        pipe = client.pipeline(transaction=False)
        for key in keys:
            if newest_first:
                pipe.zcount(key, edge, "+inf")
            else:
                pipe.zcount(key, "-inf", edge)
        return [int(n) for n in pipe.execute()]

    # The least t with more than `offset` entries at or below it.
    lo, hi = min(ends), max(ends)
    for _ in range(MAX_ROUNDS):
        if lo >= hi:
            starts = at_or_below(lo, inclusive=False)
            return starts, offset - sum(starts)
        # Halfway, without overflow, and below hi so that each round gains.
        mid = min(lo / 2 + hi / 2, math.nextafter(hi, -math.inf))
        if not math.isfinite(mid):
            break
        if sum(at_or_below(mid, inclusive=True)) > offset:
            hi = mid
        else:
            lo = math.nextafter(mid, math.inf)
    return [0] * len(keys), offset
