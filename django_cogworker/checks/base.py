"""What every check of ``COGWORKER`` shares: the shape of its errors, what
a number is, and the names that are not known, each with the suggestion of the closest
known one (the settings, the redis-py options, the Tasks backend's
``OPTIONS``)."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable

from django.core.checks import Error

NUMBER = (int, float)


def is_number(v: object) -> bool:
    """An int or a float, and not a bool (which Python counts as an int)."""
    return isinstance(v, NUMBER) and not isinstance(v, bool)


def is_whole(v: object, least: int) -> bool:
    """A whole number (not a bool) of at least ``least``."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def error(msg: str, hint: str, id_: str) -> Error:
    """An error about ``COGWORKER``: what is wrong, and what would be right."""
    return Error(msg, hint=hint, obj="COGWORKER", id=id_)


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """The end of a message about an unknown ``name``: ``"; did you mean
    'X'?"`` for the closest of ``known``, or ``"."`` when none is close."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else "."


def unknown_names(given: Iterable[object], known: Collection[str]) -> list[tuple[object, str]]:
    """Each name of ``given`` that ``known`` lacks, in the order of their
    text, with the end of its message (:func:`did_you_mean`)."""
    return [(name, did_you_mean(name, known)) for name in sorted(set(given) - set(known), key=str)]
