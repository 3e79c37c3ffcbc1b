"""Filtering a large job set in one pass: the server-side pattern, and the page.

Duties: ``match_pattern`` builds ZSCAN's MATCH glob for a filter, as bytes,
so that the entries Redis returns are few; ``select_page`` reads the
matches once and answers both the count and one page of them, in the
set's order, keeping only the entries that can still fall in that page.

Guarantees:

- The pattern may over-match, never under-match: every entry whose decoded
  field matches is returned by Redis, whichever way its JSON writes the
  text. Non-ASCII text is matched as stored (our encoder writes UTF-8,
  ``ensure_ascii=False``, as Lua's cjson and most clients do) and also as
  ``\\uXXXX`` escapes (Python's ``json.dumps`` default), in either case of
  hex digit; a character JSON may escape (``"`` ``\\`` ``/``, controls, and
  the ``<>&'`` that HTML-safe encoders escape) matches each of its forms;
  any other ASCII character is taken as written literally, as every JSON
  encoder does. Glob characters in the text are escaped: they match
  themselves. The caller still decides each entry on its decoded fields.
- Case-folding (the search) admits every character Python's ``str.lower``
  maps onto the wanted one (``K`` the Kelvin sign for ``k``, ``İ`` for ``i``,
  ``Σ`` for ``ς``), as ``JobRecord.matches`` compares lowered text.
- One pass. It keeps only the matches that can still fall in the page:
  those up to it or those from it on, whichever end of the set is nearer
  (``select_page``), so a page near the start or near the end of the set
  holds few entries, and none holds more than half the set's.
"""

from __future__ import annotations

import functools
import heapq
import sys
from collections.abc import Iterable
from typing import Any

#: A match as scanned: (score, the entry as stored, which of the set's keys
#: holds it: one key without SHARDING, one per queue group with it). The
#: set's own order is this tuple's (Redis orders equal scores by the
#: entry's bytes).
Entry = tuple[float, bytes, int]

#: Entries ZSCAN examines per call: 200 round trips for 200,000 entries,
#: each blocking Redis for a few milliseconds only.
SCAN_COUNT = 1000

#: ``*`` in one MATCH pattern at most. Redis answers "no match" once its
#: matcher nests deeper than 1,000 ``*`` (the fix of CVE-2024-31228), and
#: each one costs matching time: past this many, the rest of a long text is
#: left to the exact check, so it never under-matches.
MAX_PATTERN_STARS = 32

#: Bytes escaped with a backslash in a pattern, inside brackets or out.
_GLOB_SPECIAL = frozenset(b"*?[]\\^-")

#: Short escapes JSON has for some ASCII characters.
_SHORT_ESCAPES = {'"': b'\\"', "\\": b"\\\\", "/": b"\\/", "\b": b"\\b", "\f": b"\\f", "\n": b"\\n"}
_SHORT_ESCAPES |= {"\r": b"\\r", "\t": b"\\t"}

#: ASCII characters an encoder may write escaped: those JSON must or may
#: escape, and those HTML-safe encoders (Go's, Rails') write as ``\\u00XX``.
_ESCAPABLE_ASCII = frozenset("\"\\/<>&'\x7f") | {chr(c) for c in range(0x20)}


@functools.cache
def _lowered_from() -> tuple[dict[str, frozenset[str]], frozenset[str]]:
    """(for a lower-case character, the others that ``str.lower`` turns into
    it; the characters a lowering adds after its first, as ``İ`` -> ``i̇``).
    Read from Python's own tables once, on the first search (about 0.15 s)."""
    into: dict[str, set[str]] = {}
    added: set[str] = set()
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        lowered = char.lower()
        if lowered != char:
            into.setdefault(lowered[0], set()).add(char)
            added.update(lowered[1:])
    # The one lowering that depends on context: a final capital sigma.
    into.setdefault("ς", set()).add("Σ")
    return {c: frozenset(xs) for c, xs in into.items()}, frozenset(added)


def _u_escapes(char: str) -> set[bytes]:
    """``char`` as ``\\uXXXX`` (a surrogate pair above U+FFFF), hex in both cases."""
    units = char.encode("utf-16-be", "surrogatepass")
    codes = [int.from_bytes(units[i : i + 2], "big") for i in range(0, len(units), 2)]
    return {"".join(f"\\u{c:04x}" for c in codes).encode(), "".join(f"\\u{c:04X}" for c in codes).encode()}


def _forms(char: str) -> set[bytes]:
    """Every way a JSON string may hold ``char``, as bytes."""
    if char.isascii() and char not in _ESCAPABLE_ASCII:
        return {char.encode()}
    forms = _u_escapes(char)
    if char in _SHORT_ESCAPES:
        forms.add(_SHORT_ESCAPES[char])
    if char != '"' and char != "\\" and char >= " " and not 0xD800 <= ord(char) <= 0xDFFF:
        forms.add(char.encode())  # literally (UTF-8 for non-ASCII)
    return forms


def _one_of(values: set[int]) -> bytes:
    escaped = b"".join(b"\\" + bytes([v]) if v in _GLOB_SPECIAL else bytes([v]) for v in sorted(values))
    return escaped if len(values) == 1 else b"[" + escaped + b"]"


#: The wildcard token of a pattern (a run of any bytes, none included);
#: every other token matches one byte (a literal ``*`` is always escaped).
_ANY = b"*"


def _fragment(forms: set[bytes]) -> list[bytes]:
    """Glob tokens every one of ``forms`` matches: byte by byte while they
    are all that long, then ``*`` if some are longer, as Redis' glob has no
    alternation. ``é`` becomes: byte C3 or a backslash, byte A9 or ``u``,
    then ``*``, so that its UTF-8 bytes match exactly, and ``\\u00e9`` too."""
    shortest = min(len(f) for f in forms)
    tokens = [_one_of({f[i] for f in forms}) for i in range(shortest)]
    return [*tokens, _ANY] if any(len(f) > shortest for f in forms) else tokens


def text_glob(value: str, *, fold_case: bool = False) -> tuple[list[bytes], bool]:
    """(glob tokens that ``value`` inside any JSON string matches, whether
    they cover all of ``value``: not when cut at ``MAX_PATTERN_STARS``).
    With ``fold_case``, any text whose ``.lower()`` contains ``value.lower()``."""
    into, added = _lowered_from() if fold_case else ({}, frozenset())
    tokens: list[bytes] = []
    stars = 0
    for char in value.lower() if fold_case else value:
        # A character that a lowering added (İ -> i̇) may stand for no byte.
        part = [_ANY] if char in added else _fragment(set().union(*map(_forms, {char, *into.get(char, ())})))
        stars += part.count(_ANY)
        if stars > MAX_PATTERN_STARS:
            return tokens, False
        tokens += part
    return tokens, True


def _join(tokens: list[bytes]) -> bytes:
    """The pattern of ``tokens``, with one ``*`` for a run of them."""
    return b"".join(t for i, t in enumerate(tokens) if t != _ANY or not i or tokens[i - 1] != _ANY)


def match_pattern(name: str | None, queue: str | None, search: str | None, bid: str | None = None) -> bytes:
    """ZSCAN's MATCH pattern for a filter: on its most selective criterion
    (the batch, else the job name, else the search, else the queue); the
    others are left to the exact check, as JSON keys come in any order."""
    if bid:
        return _field_pattern("bid", bid)
    if name:
        return _field_pattern("job", name)
    if search:
        return _join([_ANY, *text_glob(search, fold_case=True)[0], _ANY])
    if queue:
        return _field_pattern("queue", queue)
    return _ANY


def _field_pattern(field: str, value: str) -> bytes:
    tokens, whole = text_glob(value)
    # ``*`` after the colon: another client may write a space there.
    key = b'"' + field.encode() + b'":'
    return _join([_ANY, key, _ANY, b'"', *tokens, b'"' if whole else _ANY, _ANY])


class _First:
    """The ``n`` first entries in an order, of all offered (a bounded heap)."""

    def __init__(self, n: int, *, descending: bool) -> None:
        self.n = n
        self.descending = descending
        self.heap: list[Any] = []  # descending: a min-heap; else a max-heap of _Last

    def offer(self, entry: Entry) -> None:
        heap = self.heap
        if self.descending:
            if len(heap) < self.n:
                heapq.heappush(heap, entry)
            elif heap and heap[0] < entry:
                heapq.heapreplace(heap, entry)
        elif len(heap) < self.n:
            heapq.heappush(heap, _Last(entry))
        elif heap and entry < heap[0].entry:
            heapq.heapreplace(heap, _Last(entry))

    def in_order(self) -> list[Entry]:
        if self.descending:
            return sorted(self.heap, reverse=True)
        return sorted(kept.entry for kept in self.heap)


class _Last:
    """An entry whose heap order is reversed: the top of a heap of these is the greatest."""

    __slots__ = ("entry",)

    def __init__(self, entry: Entry) -> None:
        self.entry = entry

    def __lt__(self, other: _Last) -> bool:
        return other.entry < self.entry


def last_page_offset(count: int, limit: int) -> int:
    """Where the last page of ``count`` matches starts, ``limit`` (> 0) a page; 0 when none."""
    return max(count - 1, 0) // limit * limit


def select_page(
    matches: Iterable[Entry],
    *,
    offset: int,
    limit: int,
    descending: bool,
    size: int,
    or_last: bool = False,
) -> tuple[int, int, list[Entry]]:
    """(how many ``matches``, the offset of the page returned, its entries in
    order) from one pass over ``matches``, which come in any order (ZSCAN's).

    ``size`` is the set's size before the scan: the count is known only at
    the end, so the set's size says which end the page is nearer. A page
    nearer the start keeps the first ``offset + limit`` matches; one nearer
    the end keeps the last ``size - offset``, plus room for entries added
    during the scan (a page and 1% of the set). So the first page keeps a
    page, the last page of a filter that most entries match about 1% of the
    set, and no page more than half the set; the last page of a filter
    that few entries match keeps those before it, few too. With
    ``or_last``, an offset past the end answers the last page (as the
    admin's paginator shows it) from the same pass: the last ``limit``
    matches are kept too."""
    front = offset + limit <= size - offset
    # Room for more matches than the set held: jobs that die during the
    # scan, and entries ZSCAN returns twice when the set shrinks meanwhile.
    slack = limit + size // 100
    head = _First(offset + limit if front else 0, descending=descending)
    tail = _First(limit if front else max(size - offset, 0) + slack, descending=not descending)
    count = 0
    for entry in matches:
        count += 1
        head.offer(entry)
        if or_last or not front:
            tail.offer(entry)
    if offset >= count:
        if not or_last or count == 0 or limit <= 0:
            return count, offset, []
        offset = last_page_offset(count, limit)
        front = False
    if front:
        return count, offset, head.in_order()[offset : offset + limit]
    last = tail.in_order()[::-1]  # the last len(last) positions, in order
    start = offset - (count - len(last))
    return count, offset, last[max(start, 0) : max(start + limit, 0)]
