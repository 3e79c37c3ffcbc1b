"""Reading what Redis holds, for the inspection API: untrusted text.

Duties: every value comes through ``payload.parse``, so an entry that cannot
be read (not JSON, nested thousands deep) or a malformed field of a process
hash is a default value, never an exception (SPEC section 8); and the
byte-level prefilters that let a large set be filtered without parsing
every entry: ``glob_literal`` for ZSCAN's server-side pattern, then
``quick_match``, which settles most entries from the bytes and answers None
when unsure (then the caller parses, and decides exactly).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django_cogworker.errors import BadPayload
from django_cogworker.payload import Payload, parse


def glob_escape(value: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)


def glob_literal(value: str, *, fold_case: bool = False) -> str:
    """A glob fragment that every JSON encoding of ``value`` (inside a
    string) matches, as a prefilter that is checked exactly afterwards. A
    character that JSON may write escaped (a quote, backslash, slash or
    control character, or any non-ASCII one, which another client may write
    as ``\\uXXXX``) becomes ``*``; byte-wise globbing could not bracket a
    multi-byte character anyway."""
    parts = []
    for c in value:
        if fold_case and c.isascii() and c.isalpha():
            parts.append(f"[{c.lower()}{c.upper()}]")
        elif not c.isascii() or c in '"\\/' or ord(c) < 0x20:
            parts.append("*")
        else:
            parts.append(glob_escape(c))
    return "".join(parts)


def loads_object(raw: bytes | str) -> Payload | None:
    """The JSON object stored, or None when it is not one or cannot be read."""
    try:
        value = parse(raw)
    except BadPayload:
        return None
    return value if isinstance(value, dict) else None


def json_field(raw: str, default: Any) -> Any:
    """A JSON field of a process hash, or ``default`` when it is unreadable
    or of another type than ``default``."""
    try:
        value = parse(raw)
    except BadPayload:
        return default
    return value if isinstance(value, type(default)) else default


def number(raw: Any, kind: type[int] | type[float]) -> Any:
    """A number field of a process hash; 0 when malformed (shown, not a 500)."""
    try:
        value = kind(raw or 0)
    except (TypeError, ValueError, OverflowError):
        return kind(0)
    return value if math.isfinite(value) else kind(0)


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _string_field(field: str) -> re.Pattern[bytes]:
    return re.compile(b'"' + field.encode() + rb'"\s*:\s*"((?:[^"\\]|\\.)*)"')


_STRING_FIELDS = {f: _string_field(f) for f in ("jid", "job", "queue", "error_class", "error_message")}


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


def quick_match(raw: bytes, *, name: str | None, queue: str | None, search: str | None) -> bool | None:
    """``JobRecord.matches`` decided from the bytes, where a field can be read
    without parsing the payload; None when unsure (then the caller parses)."""
    for field, wanted in (("job", name), ("queue", queue)):
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
