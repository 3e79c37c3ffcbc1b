"""``REDIS_URL``: what it names, and how to show it without its password.

The forms (SPEC sections 3 and 11):

- ``redis://``, ``rediss://``, ``unix://``: one server, read by redis-py's
  ``from_url`` (query options included);
- ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/<service>[/<db>]``
  (``rediss+sentinel://``: TLS to the data nodes): the hosts are sentinels
  (port 26379 by default), the password is the data nodes';
- ``redis+cluster://[[user]:password@]host[:port][,host[:port]...]``
  (``rediss+cluster://``): the hosts are startup nodes of a Redis Cluster;
- ``"embedded"``: a local server started on demand.

:func:`parse` raises ``ValueError`` with a message that never contains the
password; :func:`masked` is the form of a URL for messages and log lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

PLAIN = "plain"
SENTINEL = "sentinel"
CLUSTER = "cluster"
EMBEDDED = "embedded"

#: scheme -> (kind, TLS)
SCHEMES: dict[str, tuple[str, bool]] = {
    "redis": (PLAIN, False),
    "rediss": (PLAIN, True),
    "unix": (PLAIN, False),
    "redis+sentinel": (SENTINEL, False),
    "rediss+sentinel": (SENTINEL, True),
    "redis+cluster": (CLUSTER, False),
    "rediss+cluster": (CLUSTER, True),
}

DEFAULT_PORTS = {PLAIN: 6379, SENTINEL: 26379, CLUSTER: 6379}

#: What the password looks like in a message or a log line.
MASK = "***"


@dataclass(frozen=True)
class Target:
    """What a ``REDIS_URL`` names. ``hosts`` and ``service`` are set for the
    Sentinel and Cluster forms only (a plain URL is left to redis-py)."""

    url: str = field(repr=False)
    kind: str
    tls: bool = False
    hosts: tuple[tuple[str, int], ...] = ()
    service: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def masked(self) -> str:
        return masked(self.url)


def parse(url: object) -> Target:
    if url == "embedded":
        return Target(url, EMBEDDED)
    if not isinstance(url, str):
        raise ValueError(
            f"{masked(url)} (a {type(url).__name__}) is not a URL: give a string such as 'redis://host:6379/0'"
        )
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        shown = repr(masked(url))
        raise ValueError(
            f"{shown} is not a URL cogworker reads: use redis://, rediss://, unix://, "
            "redis+sentinel://, rediss+sentinel://, redis+cluster://, rediss+cluster:// or 'embedded'"
        )
    kind, tls = SCHEMES[scheme.lower()]
    if kind == PLAIN:
        return Target(url, kind, tls)
    if "?" in rest or "#" in rest:
        raise ValueError(f"{masked(url)!r}: a {scheme}:// URL takes no query; put options in REDIS_OPTIONS")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    hosts = tuple(_host(h, DEFAULT_PORTS[kind], url) for h in hostlist.split(","))
    parts = [p for p in path.split("/") if p]
    service = None
    if kind == SENTINEL:
        if not parts:
            raise ValueError(f"{masked(url)!r} names no service: add /<service>, the master's name")
        service, parts = unquote(parts[0]), parts[1:]
    db = 0
    if parts:
        if len(parts) > 1 or not parts[0].isdigit():
            raise ValueError(f"{masked(url)!r}: {'/'.join(parts)!r} is not a database number")
        db = int(parts[0])
    if kind == CLUSTER and db != 0:
        raise ValueError(f"{masked(url)!r}: a Redis Cluster has only database 0")
    return Target(url, kind, tls, hosts, service, db, username, password)


def _host(text: str, default_port: int, url: str) -> tuple[str, int]:
    match = re.fullmatch(r"(\[[^\]]+\]|[^:\[\]]+)(?::(\d+))?", text.strip())
    if match is None:
        raise ValueError(f"{masked(url)!r}: {text!r} is not host[:port]")
    host = match.group(1).strip("[]")
    return host, int(match.group(2) or default_port)


#: A query option whose value may be a credential: ``password=``,
#: ``ssl_password=``, ``ssl_keyfile_password=``, a token...
_SECRET_OPTION = re.compile(
    r"(?P<head>(?:^|[?&;])[^=&;?#]*(?:pass|secret|token|auth|cred)[^=&;?#]*=)[^&;#]*", re.IGNORECASE
)
#: A scheme where a URL starts (at the start of the text or of a quoted
#: part), however many slashes follow it: ``redis:/`` is a typo of ``redis://``.
_SCHEME = re.compile(r"(?:^|(?<=[\s'\"(\[,]))[A-Za-z][A-Za-z0-9+.\-]*:/+")


def masked(url: object) -> str:
    """``url`` with whatever could be a credential replaced by ``***``, for
    messages and log lines: the user part before an ``@`` (its user name
    kept when a colon follows it; alone, it is masked too: some clients read
    it as a password), and the value of any query option that may hold a
    secret. It reads any text this way, not only a well-formed URL
    (``':pw@host'``, ``'redis:/:pw@host'``), and a list or tuple element by
    element (a stray trailing comma makes a tuple of the setting); any other
    value as its repr, masked alike."""
    if isinstance(url, str):
        return _masked_text(url)
    if isinstance(url, list | tuple):
        inner = ", ".join(repr(_masked_text(v)) if isinstance(v, str) else masked(v) for v in url)
        if isinstance(url, list):
            return f"[{inner}]"
        return f"({inner}{',' if len(url) == 1 else ''})"
    return _masked_text(repr(url))


def _masked_text(text: str) -> str:
    # The last @: a password may hold an unencoded @, never the host part.
    at = text.rfind("@")
    if at != -1:
        scheme = _SCHEME.search(text, 0, at)
        start = scheme.end() if scheme else 0
        user, colon, _ = text[start:at].partition(":")
        text = text[:start] + (f"{user}:{MASK}" if colon else MASK) + text[at:]
    return _SECRET_OPTION.sub(lambda m: m["head"] + MASK, text)


def redacted(options: object) -> str:
    """``REDIS_OPTIONS`` or ``SENTINEL_OPTIONS`` for a repr: every key, and
    the values that cannot be a secret (a number, a boolean, None) unless
    the key names one; any other value is ``***``."""
    if not isinstance(options, dict):
        return f"<{type(options).__name__}>"
    return "{" + ", ".join(f"{key!r}: {_shown(key, value)}" for key, value in options.items()) + "}"


def _shown(key: object, value: object) -> str:
    harmless = value is None or isinstance(value, bool | int | float)
    secret_key = isinstance(key, str) and _SECRET_OPTION.match(key + "=") is not None
    return repr(value) if harmless and not secret_key else repr(MASK)


class Options(dict[str, Any]):
    """Keyword arguments of a Redis client, whose repr shows no secret
    (:func:`redacted`): a traceback's captured locals print it."""

    def __repr__(self) -> str:
        return redacted(self)
