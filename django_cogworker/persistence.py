"""Whether Redis keeps its data across its own restart (SPEC section 8: a
Redis with neither AOF nor snapshots).

Every job lives only in Redis: a server with no append-only file and no
snapshot points starts empty after a restart, and the queued, scheduled,
retrying and dead jobs are gone with the stats. One reading of ``CONFIG
GET``, said in three places: the worker's start (a WARNING), the admin
dashboard and ``cogworker_status``. A server that does not answer
``CONFIG`` (a managed service, a renamed command, an ACL) is not judged:
nothing is said, and nothing fails.
"""

from __future__ import annotations

from typing import Any

from django_cogworker.connection import get_redis

#: What is said of a server that keeps nothing on disk; the deployment
#: page's section on persistence says what to set.
NOTE = (
    "Redis keeps nothing on disk (appendonly no, no save points): a restart of Redis loses every "
    "queued, scheduled, retrying and dead job, and the stats. Set appendonly yes on the server "
    "(docs/deployment.md, Persistence)."
)


def keeps_nothing(client: Any) -> bool:
    """True only when the server said it has neither the append-only file
    nor a snapshot point; False when it has one, or would not say."""
    try:
        appendonly = _value(client.config_get("appendonly"), "appendonly")
        save = _value(client.config_get("save"), "save")
    except Exception:
        return False  # CONFIG refused or renamed: not ours to judge
    if appendonly is None or save is None:
        return False  # an answer of another shape (a cluster's, per node)
    return appendonly.strip().lower() == "no" and not save.strip()


def note() -> str | None:
    """:data:`NOTE` when the configured Redis keeps nothing on disk, else
    None: for the dashboard and ``cogworker_status``."""
    return NOTE if keeps_nothing(get_redis()) else None


def _value(reply: Any, name: str) -> str | None:
    if not isinstance(reply, dict):
        return None
    for key, value in reply.items():
        if _text(key) == name:
            return _text(value)
    return None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None
