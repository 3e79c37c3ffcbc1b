"""Deep pages of sorted sets merged by score (SPEC section 16: under
SHARDING a set page merges every queue group's set): ``api.seek`` finds
where the page starts in each set from counts alone, on a real Redis,
and gives exactly the page a merge from the start gives, ties included,
in both orders. The admin's deep pages on a sharded cluster are in
``tests/test_sharded_cluster.py``.
"""

from __future__ import annotations

import heapq
import itertools
import random

import pytest

from django_cogworker.api.seek import seek
from tests.conftest import CogEnv


def merged(cog: CogEnv, keys: list[str], newest_first: bool, starts: list[int] | None = None) -> list[bytes]:
    """The merge as ``SortedSet._merged`` reads it: each set in its order, from its start rank."""
    read = cog.redis.zrevrange if newest_first else cog.redis.zrange
    streams = [
        [(score, raw, i) for raw, score in read(key, (starts or [0] * len(keys))[i], -1, withscores=True)]
        for i, key in enumerate(keys)
    ]
    return [raw for _, raw, _ in heapq.merge(*streams, reverse=newest_first)]


@pytest.mark.parametrize("newest_first", [False, True])
def test_g16_a_sought_page_is_the_page_a_merge_from_the_start_gives(cog: CogEnv, newest_first: bool) -> None:
    rng = random.Random(7)
    keys = [cog.key(f"test:seek:{i}") for i in range(3)]
    for i, key in enumerate(keys):
        # Whole seconds, so that many entries tie, within a set and across sets.
        start = 1_700_000_000
        entries = {f"{i}-{n}".encode(): float(rng.randrange(start, start + 400)) for n in range(1500)}
        entries.update({f"{i}-frac-{n}".encode(): start + rng.random() * 400 for n in range(500)})
        cog.redis.zadd(key, entries)
    whole = merged(cog, keys, newest_first)
    assert len(whole) == 6000
    for offset in (0, 1, 999, 1000, 2500, 4321, 5975, 5999, 6000, 7000):
        starts, skip = seek(cog.redis, keys, offset, newest_first=newest_first)
        page = list(itertools.islice(merged(cog, keys, newest_first, starts), skip, skip + 25))
        assert page == whole[offset : offset + 25], offset
        assert skip <= 60, f"offset {offset}: {skip} ties read and skipped"


def test_g16_seek_on_empty_sets_and_one_entry(cog: CogEnv) -> None:
    keys = [cog.key("test:seek:a"), cog.key("test:seek:b")]
    assert seek(cog.redis, keys, 5, newest_first=False) == ([0, 0], 0)
    cog.redis.zadd(keys[1], {b"only": 12.5})
    assert seek(cog.redis, keys, 0, newest_first=True) == ([0, 0], 0)
    assert seek(cog.redis, keys, 1, newest_first=False) == ([0, 1], 0)


def test_g16_seek_with_infinite_scores_falls_back_to_reading_from_the_start(cog: CogEnv) -> None:
    keys = [cog.key("test:seek:x"), cog.key("test:seek:y")]
    cog.redis.zadd(keys[0], {b"low": float("-inf"), b"mid": 1.0})
    cog.redis.zadd(keys[1], {b"high": float("inf"), b"mid2": 2.0})
    starts, skip = seek(cog.redis, keys, 2, newest_first=False)
    assert list(itertools.islice(merged(cog, keys, False, starts), skip, skip + 5)) == [b"mid2", b"high"]
