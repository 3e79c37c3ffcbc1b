"""Lua scripts: read from ``lua/*.lua`` once, run by SHA (G11).

A script may start with ``--! include name.lua`` lines: the named files from
``lua/lib/`` are prepended, so a function shared by several scripts (such as
``requeue_job``) is written once. ``EVALSHA`` is tried first; on ``NOSCRIPT``
(a restarted or failed-over server, ``SCRIPT FLUSH``) the call is repeated
once with ``EVAL``, which also puts the script back in the server's cache.

A str read from a payload (a jid, a queue name) may hold a lone surrogate,
which redis-py's strict encoding refuses: such a call is sent with each one
written as text (``escaping.storable``), so that no payload can fail the
script that files, acknowledges or requeues it, nor the beat that records
it.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import NoScriptError

from django_cogworker import direct
from django_cogworker.escaping import storable

if TYPE_CHECKING:
    from django_cogworker.connection import Client


Arg = str | bytes | int | float


class Script:
    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Arg] = ()) -> Any:
        try:
            return self._call(client, keys, args)
        except UnicodeEncodeError:
            # Raised while packing the command, before anything was sent.
            return self._call(client, *_storable(keys, args))

    def _call(self, client: Any, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # EVAL loads and runs in one step: a SCRIPT LOAD then EVALSHA
            # would fail again if a flush (or a failover) fell in between.
            return client.eval(self.source, len(keys), *keys, *args)

    def run(self, client: Any, keys: Sequence[str], args: Sequence[Arg] = ()) -> Any:
        """As calling the script, on a connection of :mod:`direct`'s own
        when ``client`` is a plain one: for the calls made for every few
        jobs (``fetch.lua``), whose time redis-py's layers would double."""
        try:
            reply = direct.call(client, "EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(self.source, len(keys), *keys, *args)
        except UnicodeEncodeError:
            return self(client, keys, args)  # packed before anything was sent
        return self(client, keys, args) if reply is direct.ORDINARY else reply

    def queue(self, pipe: redis.client.Pipeline, keys: Sequence[str], args: Sequence[Arg] = ()) -> None:
        """Adds the call to a pipeline (the caller loads scripts first: see
        ``ensure_loaded``), its names storable at once: a pipeline's failure
        to pack one command would fail them all."""
        keys, args = _storable(keys, args)
        pipe.evalsha(self.sha, len(keys), *keys, *args)

    def ensure_loaded(self, client: Client) -> None:
        if not client.script_exists(self.sha)[0]:
            client.script_load(self.source)


def _storable(keys: Sequence[str], args: Sequence[Arg]) -> tuple[list[str], list[Arg]]:
    return [storable(k) for k in keys], [storable(a) if isinstance(a, str) else a for a in args]


def _read(path: str) -> str:
    return resources.files("django_cogworker").joinpath("lua", path).read_text()


@functools.cache
def script(name: str) -> Script:
    """The script ``lua/<name>.lua`` with its includes."""
    body = _read(f"{name}.lua")
    parts = []
    for line in body.splitlines():
        if line.startswith("--! include "):
            parts.append(_read("lib/" + line.removeprefix("--! include ").strip()))
    parts.append(body)
    return Script(name, "\n".join(parts))
