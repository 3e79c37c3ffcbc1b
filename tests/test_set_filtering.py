"""Filtering a large job set, against a real Redis: one ZSCAN pass serves the
count and the page, in the order the unfiltered list shows; the MATCH
pattern finds non-ASCII text as any client may have stored it (UTF-8 or
``\\uXXXX``), treats glob characters in the text as literal, and narrows
the scan on the server; the admin list shows the same."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_cogworker import api, connection
from django_cogworker.api.scan import MAX_PATTERN_STARS, last_page_offset, match_pattern, select_page
from django_cogworker.payload import encode
from tests.test_admin import payload as admin_payload

BASE = "/admin/django_cogworker/job/"
NAME = "app.jobs.mail"


def payload(jid: str, **fields: Any) -> dict[str, Any]:
    """test_admin's record, with fixed times and a job name no filter here asks for."""
    fixed = {"created_at": 1_700_000_000.0, "enqueued_at": 1_700_000_010.0, "failed_at": 1_700_000_020.0}
    return admin_payload(jid, **{"job": "app.jobs.other", **fixed, **fields})


def escaped(p: dict[str, Any], *, upper_hex: bool = False) -> bytes:
    """As another client may store it: json.dumps' defaults (``\\uXXXX``, ", " and ": ")."""
    text = json.dumps(p)
    if upper_hex:
        text = re.sub(r"\\u[0-9a-f]{4}", lambda m: "\\u" + m[0][2:].upper(), text)
    return text.encode()


def fill(cog, where: str, entries: dict[bytes, float]) -> None:
    pipe = cog.redis.pipeline(transaction=False)
    items = list(entries.items())
    for start in range(0, len(items), 1000):
        pipe.zadd(cog.key(where), dict(items[start : start + 1000]))
    pipe.execute()


def shown_order(jobs: api.SortedSet) -> list[api.JobRecord]:
    """The whole set in the order the unfiltered list pages show it (ZRANGE/ZREVRANGE)."""
    return jobs.page(0, jobs.size)


class ZscanCalls:
    """Every ZSCAN the process's client sends: a counter around the real call."""

    def __init__(self, client: Any) -> None:
        self.calls: list[tuple[int, Any, list[bytes]]] = []  # (cursor, MATCH, entries returned)
        real = client.zscan

        def counted(name: Any, cursor: int = 0, **options: Any) -> Any:
            result = real(name, cursor, **options)
            self.calls.append((int(cursor), options.get("match"), [raw for raw, _ in result[1]]))
            return result

        client.zscan = counted

    @property
    def passes(self) -> int:
        """Scans over the set: each starts at cursor 0."""
        return sum(1 for cursor, _, _ in self.calls if cursor == 0)

    @property
    def returned(self) -> list[bytes]:
        """The entries Redis sent back, over all calls."""
        return [raw for _, _, raws in self.calls for raw in raws]

    def reset(self) -> None:
        self.calls.clear()


@pytest.fixture
def zscans(cog) -> Iterator[ZscanCalls]:
    client = connection.get_redis()
    calls = ZscanCalls(client)
    yield calls
    del client.zscan  # the class's own method again


@pytest.fixture
def big_dead(cog) -> None:
    """2,500 dead jobs, every other one named NAME, scores in runs of three
    equal ones (ties are ordered by the entry, as Redis orders them)."""
    entries = {}
    for i in range(2500):
        p = payload(f"j{i:05d}", job=NAME if i % 2 else "app.jobs.other", error_message=f"boom {i}")
        entries[encode(p)] = 1_700_000_000.0 + i // 3
    fill(cog, "dead", entries)


# -- one pass, count and page -----------------------------------------------------------


def test_a_filtered_page_counts_and_pages_in_the_shown_order_in_one_scan(cog, big_dead, zscans):
    dead = api.DeadSet()
    expected = [r.jid for r in shown_order(dead) if r.name == NAME]
    assert len(expected) == 1250
    for offset in (0, 25, 600, 1000):
        zscans.reset()
        count, page = dead.filter_page(name=NAME, offset=offset, limit=25)
        assert count == 1250
        assert [r.jid for r in page] == expected[offset : offset + 25]
        assert zscans.passes == 1 and len(zscans.calls) > 1, "one pass of several ZSCAN calls"


def test_a_far_page_and_a_page_past_the_end_come_from_one_scan(cog, big_dead, zscans):
    dead = api.DeadSet()
    everything = [r.jid for r in shown_order(dead)]
    for offset in (1300, 2000, 2475, 2490):  # nearer the end than the start: kept from the end
        zscans.reset()
        count, page = dead.filter_page(search="BOOM", offset=offset, limit=25)
        assert (count, [r.jid for r in page]) == (2500, everything[offset : offset + 25])
        assert zscans.passes == 1
    expected = [r.jid for r in shown_order(dead) if r.name == NAME]
    zscans.reset()
    assert dead.filter_page(name=NAME, offset=5000, limit=25) == (1250, [])
    count, page = dead.filter_page(name=NAME, offset=5000, limit=25, or_last=True)
    assert (count, [r.jid for r in page]) == (1250, expected[1225:])
    assert last_page_offset(1250, 25) == 1225
    assert zscans.passes == 2  # one per call


def test_ascending_sets_page_soonest_first_with_ties_as_redis_orders_them(cog, zscans):
    entries = {encode(payload(f"r{i:03d}", job=NAME)): 100.0 + i // 4 for i in range(400)}
    fill(cog, "retry", entries)
    retries = api.RetrySet()
    expected = [r.jid for r in shown_order(retries)]
    for offset in (0, 190, 375):
        assert [r.jid for r in retries.filter_page(name=NAME, offset=offset, limit=25)[1]] == expected[
            offset : offset + 25
        ]
    assert [r.jid for r in retries.filter(name=NAME, limit=30)] == expected[:30]
    assert [r.jid for r in retries.filter(name=NAME)] == expected


@pytest.mark.parametrize("descending", [False, True])
def test_select_page_equals_sorting_everything_then_slicing(descending):
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randrange(0, 120)
        matches = [
            (float(rng.randrange(0, 30)), bytes([rng.randrange(97, 100)]) * rng.randrange(1, 3))
            for _ in range(n)
        ]
        in_order = sorted(matches, reverse=descending)
        limit = rng.randrange(1, 30)
        offset = rng.randrange(0, 150)
        size = n + rng.randrange(0, 40)  # the set may hold more than match
        count, at, page = select_page(
            iter(matches), offset=offset, limit=limit, descending=descending, size=size
        )
        assert (count, at, page) == (n, offset, in_order[offset : offset + limit])
        count, at, page = select_page(
            iter(matches), offset=offset, limit=limit, descending=descending, size=size, or_last=True
        )
        if offset >= n > 0:
            assert at == last_page_offset(n, limit) and page == in_order[at:]
        else:
            assert (at, page) == (offset, in_order[offset : offset + limit])


class Held(bytes):
    """An entry that counts how many of its kind are alive (CPython frees one at once)."""

    alive = 0
    peak = 0

    def __new__(cls, value: bytes) -> Held:
        held = super().__new__(cls, value)
        Held.alive += 1
        Held.peak = max(Held.peak, Held.alive)
        return held

    def __del__(self) -> None:
        Held.alive -= 1


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize(
    ("offset", "or_last", "most_kept"),
    [
        (0, False, 25),  # the first page: the first 25
        (0, True, 50),  # and the last 25, in case the page is past the end
        (19_975, True, 25 + 25 + 200),  # the last page: the last 25, and room for a page and 1%
        (99_999, True, 25 + 200),  # past the end: the last page
    ],
)
def test_select_page_keeps_only_the_matches_that_can_fall_in_the_page(descending, offset, or_last, most_kept):
    Held.alive = Held.peak = 0

    def matches() -> Iterator[tuple[float, bytes]]:
        for i in random.Random(3).sample(range(20_000), 20_000):
            yield float(i), Held(b"%05d" % i)

    count, at, page = select_page(
        matches(), offset=offset, limit=25, descending=descending, size=20_000, or_last=or_last
    )
    in_order = sorted(range(20_000), reverse=descending)
    assert (count, at) == (20_000, min(offset, 19_975))
    assert [float(i) for i in in_order[at : at + 25]] == [score for score, _ in page]
    assert Held.peak <= most_kept + 2  # + the one being offered


def test_unsettled_filter_page_counts_pages_and_answers_the_last_page(cog):
    for i in range(60):
        p = payload(
            f"u{i:02d}", job=NAME if i % 3 == 0 else "app.jobs.other", error_message=f"Fehler café {i}"
        )
        entry = {"payload": encode(p).decode(), "score": 1.0 + i, "set": cog.key("dead")}
        cog.redis.rpush(cog.key("unsettled"), json.dumps(entry))
    unsettled = api.UnsettledSet()
    expected = [f"u{i:02d}" for i in range(0, 60, 3)]
    count, page = unsettled.filter_page(name=NAME, offset=5, limit=10)
    assert count == 20 and [r.jid for r in page] == expected[5:15]
    assert unsettled.filter_page(name=NAME, offset=20, limit=10) == (20, [])
    count, page = unsettled.filter_page(search="CAFÉ", offset=99, limit=25, or_last=True)
    assert count == 60 and [r.jid for r in page] == [f"u{i:02d}" for i in range(50, 60)]


# -- the MATCH pattern: non-ASCII text, glob characters ---------------------------------

#: Error texts stored three ways each (UTF-8 as our encoder writes them,
#: ``\\uxxxx`` and ``\\uXXXX`` as json.dumps-like clients do).
TRICKY = {  # by a key that none of the searches below contains (the jid is searched too)
    "fr": "Zeitüberschreitung im Café",
    "ja": "日本のサーバーに接続できません",
    "kv": "300 \u212aelvin",  # the Kelvin sign lowers to k
    "tr": "\u0130stanbul",  # lowers to i + combining dot
    "el": "ΟΔΟΣ",  # a final capital sigma lowers to ς
    "de": "STRA\u1e9eE",  # capital sharp s lowers to ß
    "om": "10 \u2126",  # the ohm sign lowers to ω
    "em": "failed 😀 again",
    "d1": "cafe au lait",
    "d2": "caf\u00e8 noir",
}

NEEDLES = [
    "café",
    "CAFÉ",
    "日本",
    "サーバー",
    "kelvin",
    "KELVIN",
    "\u0130stanbul",
    "istanbul",
    "οδος",
    "ΟΔΟΣ",
]
NEEDLES += ["straße", "STRASSE", "ω", "Ω", "😀", "é" * (MAX_PATTERN_STARS + 8)]


@pytest.fixture
def tricky_dead(cog) -> None:
    entries = {}
    for i in range(2000):  # ASCII filler: backtraces, escapes, digits
        entries[encode(payload(f"filler{i:05d}", error_message=f"timeout after {i} s\n\\retry"))] = float(i)
    score = 5000.0
    for key, message in TRICKY.items():
        p = payload(f"{key}_u", error_message=message)
        entries[encode(p)] = score
        entries[escaped(payload(f"{key}_x", error_message=message))] = score + 1
        entries[escaped(payload(f"{key}_X", error_message=message), upper_hex=True)] = score + 2
        score += 10
    entries[encode(payload("long_u", error_message="é" * (MAX_PATTERN_STARS + 8)))] = 9000.0
    entries[escaped(payload("long_x", error_message="é" * (MAX_PATTERN_STARS + 8)))] = 9001.0
    fill(cog, "dead", entries)


@pytest.mark.parametrize("needle", NEEDLES)
def test_non_ascii_search_finds_every_record_that_matches_in_any_encoding(cog, tricky_dead, zscans, needle):
    dead = api.DeadSet()
    expected = [r.jid for r in shown_order(dead) if r.matches(search=needle)]
    zscans.reset()
    assert [r.jid for r in dead.filter(search=needle)] == expected
    count, page = dead.filter_page(search=needle, limit=100)
    assert count == len(expected) and [r.jid for r in page] == expected
    # Filtered on the server: a real pattern, and the 2,000 filler jobs stay there.
    assert zscans.calls and all(match not in (None, "*", b"*") for _, match, _ in zscans.calls)
    assert not [raw for raw in zscans.returned if b'"jid":"filler' in raw]


def test_non_ascii_search_finds_the_right_records(cog, tricky_dead):
    def found(needle: str) -> set[str]:
        return {r.jid for r in api.DeadSet().filter(search=needle)}

    def three(key: str) -> set[str]:
        return {f"{key}_u", f"{key}_x", f"{key}_X"}

    assert found("café") == found("CAFÉ") == three("fr")
    assert found("日本") == three("ja")
    assert found("kelvin") == three("kv")
    assert found("\u0130stanbul") == three("tr")
    assert found("istanbul") == set()  # İ lowers to i + a combining dot, as Python compares
    assert found("οδος") == found("ΟΔΟΣ") == three("el")
    assert found("straße") == three("de")
    assert found("Ω") == three("om")
    assert found("😀") == three("em")


def test_the_pattern_matches_non_ascii_text_as_stored_or_escaped():
    # é: byte C3 (or the backslash of \u00e9), then A9 or 89 (É) (or its u), then the rest.
    assert match_pattern(None, None, "café") == b"*[Cc][Aa][Ff][\\\\\xc3][u\x89\xa9]*"
    # 日 is E6 97 A5, 本 E6 9C AC, or \u65e5 and \u672c.
    assert match_pattern(None, None, "日本") == b"*[\\\\\xe6][u\x97][6\xa5]*[\\\\\xe6][u\x9c][6\xac]*"
    assert match_pattern("tâche", None, None) == b'*"job":*"t[\\\\\xc3][u\xa2]*che"*'
    assert match_pattern(None, "日", None) == b'*"queue":*"[\\\\\xe6][u\x97][6\xa5]*"*'


def test_a_non_ascii_job_name_is_filtered_on_the_server_in_any_encoding(cog, zscans):
    name = "tâche.échoue"
    entries = {encode(payload(f"o{i}")): float(i) for i in range(300)}
    entries[encode(payload("n_u", job=name))] = 1000.0
    entries[escaped(payload("n_x", job=name))] = 1001.0
    entries[escaped(payload("n_X", job=name), upper_hex=True)] = 1002.0
    fill(cog, "dead", entries)
    zscans.reset()
    assert [r.jid for r in api.DeadSet().filter(name=name)] == ["n_X", "n_x", "n_u"]
    assert len(zscans.returned) == 3


GLOBBY = ["a*b", "a?b", "[x]", "a\\b", "a]b", "a^b", "a-b", "[^a]", "x[a-c]y"]
DECOYS = ["aXb", "acb", "x", "a", "ab", "xby", "\\", "-"]


@pytest.mark.parametrize("text", GLOBBY)
def test_glob_characters_in_the_search_are_literal(cog, zscans, text):
    entries = {
        encode(payload(f"g{i}", error_message=f"<{t}>")): float(i) for i, t in enumerate(GLOBBY + DECOYS)
    }
    fill(cog, "retry", entries)
    zscans.reset()
    assert [r.error_message for r in api.RetrySet().filter(search=text)] == [f"<{text}>"]
    assert len(zscans.returned) == 1, "the server returned only the literal match"


# -- the admin list ---------------------------------------------------------------------


def test_the_admin_list_searched_for_non_ascii_text_shows_its_rows_and_count(cog, superclient, zscans):
    now = time.time()
    entries = {encode(payload(f"p{i:03d}", error_message=f"plain {i}")): now - i for i in range(200)}
    for i in range(30):
        p = payload(f"c{i:02d}", error_message=f"Verbindung zum Café {i} abgebrochen")
        entries[encode(p) if i % 2 else escaped(p)] = now - 1000 - i
    fill(cog, "dead", entries)

    def listed(query: str) -> tuple[int, list[str], str]:
        zscans.reset()
        response = superclient.get(BASE + "dead/?" + query)
        assert response.status_code == 200
        assert zscans.passes == 1, "one scan for the request"
        return (
            response.context["count"],
            [row.record.jid for row in response.context["rows"]],
            response.content.decode(),
        )

    count, rows, body = listed("q=caf%C3%A9")
    assert count == 30 and rows == [f"c{i:02d}" for i in range(25)]
    assert not [raw for raw in zscans.returned if b"plain" in raw], "filtered on the server"
    assert "30 jobs" in body and 'aria-label="Select job c00"' in body and "p000" not in body
    count, rows, _ = listed("q=CAF%C3%89&p=2")
    assert count == 30 and rows == [f"c{i:02d}" for i in range(25, 30)]
    count, rows, _ = listed("q=caf%C3%A9&p=999")  # past the end: the last page, from the same scan
    assert count == 30 and rows == [f"c{i:02d}" for i in range(25, 30)]
    count, rows, body = listed("q=%E6%97%A5%E6%9C%AC")
    assert count == 0 and rows == [] and "No job matches" in body
