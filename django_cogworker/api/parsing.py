"""Reading what Redis holds, for the inspection API: untrusted text.

Duties: every value comes through ``payload.parse``, so an entry that cannot
be read (not JSON, nested thousands deep) or a malformed field of a process
hash is a default value, never an exception (SPEC section 8), and says why
(``Fields.malformed``); a set member that is not UTF-8 or a key of the
wrong type is skipped with a note (``Listing.skipped``), the rest read on;
and the byte-level prefilter that lets a large set be filtered without
parsing every entry (after ``scan``'s server-side pattern): ``quick_match``,
which settles most entries from the bytes and answers None when unsure
(then the caller parses, and decides exactly).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import redis

from django_cogworker.errors import BadPayload
from django_cogworker.metrics import MAX_COUNTER
from django_cogworker.payload import Payload, parse, text

_T = TypeVar("_T")

#: Characters of a malformed value quoted in a note.
QUOTED_CHARS = 60


def glob_escape(value: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)


def loads_object(raw: bytes | str) -> Payload | None:
    """The JSON object stored, or None when it is not one or cannot be read."""
    try:
        value = parse(raw)
    except BadPayload:
        return None
    return value if isinstance(value, dict) else None


def checked_json(raw: str | bytes, default: Any) -> tuple[Any, str]:
    """A JSON field and why it is malformed ("" when it is not): ``default``
    when it is unreadable or of another type than ``default``."""
    try:
        value = parse(raw)
    except BadPayload as exc:
        return default, str(exc)
    if not isinstance(value, type(default)):
        return default, f"a JSON {type(value).__name__}, not a {type(default).__name__}"
    return value, ""


def json_field(raw: str, default: Any) -> Any:
    """A JSON field of a process hash, or ``default`` when it is unreadable
    or of another type than ``default``."""
    return checked_json(raw, default)[0]


def quoted(raw: Any) -> str:
    """A malformed value as a note quotes it (text, cut short)."""
    shown = text(raw) if isinstance(raw, bytes | str) else raw
    quote = repr(shown)
    return quote if len(quote) <= QUOTED_CHARS else quote[:QUOTED_CHARS] + "…"


def checked_number(raw: Any, kind: type[int] | type[float]) -> tuple[Any, str]:
    """A number (as text in a hash, or a JSON value) and why it is malformed
    ("" when it is not); 0 when malformed, and when missing (not malformed:
    a record of an older version may lack the field). A whole number past
    64 bits, a 5,000-digit one (which ``int()`` refuses since Python 3.11)
    and a float that is not finite are malformed."""
    if raw is None or raw in ("", b""):
        return kind(0), ""
    what = "a whole number" if kind is int else "a number"
    try:
        value = kind(raw)
        fits = abs(value) <= MAX_COUNTER if kind is int else math.isfinite(value)
    except (TypeError, ValueError, OverflowError):
        fits = False
    if isinstance(raw, bool) or not fits:
        return kind(0), f"{quoted(raw)} is not {what}"
    return value, ""


def number(raw: Any, kind: type[int] | type[float]) -> Any:
    """A number field of a process hash; 0 when malformed (shown, not a 500)."""
    return checked_number(raw, kind)[0]


class Fields:
    """The fields of one record (a process's hash, a running job's summary)
    read as the types they should have: a malformed one is read as a
    default and noted in ``malformed`` (field name -> why), for the pages
    to show as malformed."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = values
        self.malformed: dict[str, str] = {}

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    def number(self, name: str, kind: type[int] | type[float]) -> Any:
        value, why = checked_number(self.values.get(name), kind)
        if why:
            self.malformed[name] = why
        return value

    def json(self, name: str, default: Any) -> Any:
        raw = self.values.get(name)
        if raw is None:
            return default
        value, why = checked_json(raw, default)
        if why:
            self.malformed[name] = why
        return value


class Listing(list[_T]):
    """A list read from Redis, and ``skipped``: a note on each entry left out
    because it is malformed (a set member that is not UTF-8, a key of the
    wrong type), for the pages to show. Compares as the list it is."""

    def __init__(self, items: Iterable[_T] = (), skipped: Iterable[str] = ()) -> None:
        super().__init__(items)
        self.skipped: list[str] = list(skipped)


def is_wrong_type(reply: Any) -> bool:
    """Whether a reply (of ``pipeline.execute(raise_on_error=False)``, or an
    exception caught) is Redis's WRONGTYPE error, a key of another type than
    the command reads; any other error is raised."""
    if isinstance(reply, redis.ResponseError):
        if str(reply).startswith("WRONGTYPE"):
            return True
        raise reply
    return False


def unless_wrong_type(read: Callable[[], _T], default: _T) -> _T:
    """``read()``, or ``default`` when the key it reads is of the wrong type."""
    try:
        return read()
    except redis.ResponseError as exc:
        is_wrong_type(exc)  # raises any other error
        return default


def names_in(key: str, reply: Any, skipped: list[str]) -> list[str]:
    """The members of a set of names (``N:queues``, ``N:processes``) from its
    SMEMBERS reply, as text, sorted. A member that is not UTF-8 is skipped
    with a note: no key name can be built from it. So is the whole set when
    ``key`` is not a set."""
    if is_wrong_type(reply):
        skipped.append(f"{key} is not a set: the names it should hold are not listed")
        return []
    names = []
    for member in reply:
        try:
            names.append(member.decode())
        except UnicodeDecodeError:
            skipped.append(f"a member of {key} is not UTF-8 text ({member!r}): skipped")
    return sorted(names)


def set_names(client: Any, key: str, skipped: list[str]) -> list[str]:
    """``names_in`` of the set at ``key``, read now."""
    try:
        reply: Any = client.smembers(key)
    except redis.ResponseError as exc:
        reply = exc
    return names_in(key, reply, skipped)


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _string_field(field: str) -> re.Pattern[bytes]:
    return re.compile(b'"' + field.encode() + rb'"\s*:\s*"((?:[^"\\]|\\.)*)"')


_STRING_FIELDS = {f: _string_field(f) for f in ("jid", "job", "queue", "bid", "error_class", "error_message")}


def field_text(raw: bytes, field: str) -> str | None:
    """The string value of ``field`` read from the bytes when the name occurs
    once (as a string key); "" when it does not occur; None when unsure (it
    occurs several times, or its value is not a string)."""
    occurrences = raw.count(b'"' + field.encode() + b'"')
    if occurrences == 0:
        return ""
    found = _STRING_FIELDS[field].findall(raw)
    if occurrences > 1 or len(found) != 1:
        return None
    value = found[0]
    try:
        return json.loads(b'"' + value + b'"') if b"\\" in value else value.decode()
    except (ValueError, UnicodeDecodeError):
        return None


def quick_match(
    raw: bytes, *, name: str | None, queue: str | None, search: str | None, bid: str | None = None
) -> bool | None:
    """``JobRecord.matches`` decided from the bytes, where a field can be read
    without parsing the payload; None when unsure (then the caller parses)."""
    for field, wanted in (("bid", bid), ("job", name), ("queue", queue)):
        if wanted:
            value = field_text(raw, field)
            if value is None:
                return None
            if value != wanted:
                return False
    if search:
        needle = search.lower()
        values = [field_text(raw, f) for f in ("jid", "error_message", "error_class")]
        if any(v is None for v in values):
            return None
        return any(needle in str(v).lower() for v in values)
    return True
