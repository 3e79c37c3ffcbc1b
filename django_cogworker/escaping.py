"""Text that cannot break what carries it: Redis, JSON, a terminal, a log.

A Python str may hold lone surrogates (U+D800 to U+DFFF): ``os.listdir()``
makes them of file names that are not UTF-8, and JSON's ``"\\udcff"``
reads as one (JavaScript's ``JSON.stringify`` writes a cut-off emoji so).
No UTF-8 can carry one, and redis-py, Django's responses and a UTF-8
stream all encode strictly: one such character in a job's failure message
once made its filing fail, and the job run again every two seconds. The
rules, one home each:

- :func:`utf8`: JSON text as bytes, a lone surrogate written as its JSON
  escape (``\\udcff``), which every reader reads back as the same str.
- :func:`storable`: a name for Redis (a key, a set member, a hash field),
  a lone surrogate written as the same six characters of text.
- :func:`one_line`: text for a terminal or a log line, its control
  characters (C0, C1), bidi controls and lone surrogates escaped, so that
  a value read from Redis can neither forge a line nor hide one.

The strict encode is tried first: ordinary text pays nothing more.
"""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")

#: What would forge or hide a line: C0 controls and DEL, C1 controls (U+009B
#: is a terminal's CSI, as ``\x1b[`` is), the line and paragraph separators,
#: the bidi controls (U+202E turns what follows around), lone surrogates.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def _escaped(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def utf8(json_text: str) -> bytes:
    """JSON text as UTF-8; each lone surrogate, which UTF-8 cannot carry,
    as its JSON escape. Only for JSON text, where such a character can only
    be inside a string and the escape means it there. A high and a low one
    in a row read back as the one character they encode, as in any JSON."""
    try:
        return json_text.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escaped, json_text).encode()


def storable(name: str) -> str:
    """``name`` as Redis can hold it, unchanged unless it holds a lone
    surrogate: then each one is written as text (``\\udcff``), so that a jid
    or a queue name read from a payload still names a key, a member or a
    field (the same one each time)."""
    if name.isascii():
        return name
    try:
        name.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escaped, name)
    return name


def one_line(text: str) -> str:
    """``text`` with what could forge or hide a line escaped (``\\n``,
    ``\\x1b``, ``\\x9b``, ``\\u202e``, ``\\udcff``)."""
    if not _UNPRINTABLE.search(text):
        return text
    return _UNPRINTABLE.sub(_escaped, text)
