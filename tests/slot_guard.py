"""Records the Redis Cluster hash slots of every Lua script call (G16).

A cluster runs a script only if all its keys hash to one slot, which is
what a hash-tagged namespace (``{name}``) gives every key built in
``keys.py``. :func:`install` wraps the three ways a script is sent
(``Script._call``, which ``Script.__call__`` goes through; ``Script.run``;
``Script.queue``, into a pipeline) and the one EVAL sent by hand
(``metrics.write``), so that each call appends one JSON line to a file:
``{"script", "slots", "pid"}``, plus ``"keys"`` when they span more than one
slot or one other than the namespace's. ``tests/test_script_slots.py``
installs it in the test process, and in its workers through a
``sitecustomize`` (``SITECUSTOMIZE``), then reads the lines.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from redis.crc import key_slot

from django_cogworker import metrics
from django_cogworker.escaping import storable
from django_cogworker.scripts import Script

#: The environment of a worker started with the guard: the file the lines
#: go to, and the namespace whose slot every key must be in.
FILE_ENV = "COGWORKER_TEST_SLOTS_FILE"
NAMESPACE_ENV = "COGWORKER_TEST_SLOTS_NAMESPACE"

#: Imported at interpreter start by a worker whose PYTHONPATH leads with its
#: directory; ``tests`` is found on the repository root, next on the path.
SITECUSTOMIZE = """\
import os

from tests import slot_guard

slot_guard.install(os.environ[slot_guard.FILE_ENV], os.environ[slot_guard.NAMESPACE_ENV])
"""


def encoded(key: Any) -> bytes:
    """The key as it goes on the wire: a str holding a lone surrogate is
    sent escaped (``scripts._storable``), never refused."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, memoryview):
        return key.tobytes()
    return storable(str(key)).encode()


class Recorder:
    def __init__(self, path: str, namespace: str) -> None:
        self.path = path
        # No namespace: the sharded layout, whose calls may use any one slot.
        self.slot = key_slot(namespace.encode()) if namespace else None

    def __call__(self, script: str, keys: Sequence[Any]) -> None:
        names = [encoded(k) for k in keys]
        slots = {key_slot(k) for k in names}
        line: dict[str, Any] = {"script": script, "slots": len(slots), "pid": os.getpid()}
        if len(slots) > 1 or (self.slot is not None and slots != {self.slot}):
            line["keys"] = [k.decode("utf-8", "backslashreplace") for k in names]
        # One write(2) of an O_APPEND file per call: lines from the threads
        # and processes of a run never interleave.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)


class _EvalSeen:
    """The pipeline ``metrics.write`` is given: its EVAL is recorded on the way."""

    def __init__(self, pipe: Any, record: Recorder) -> None:
        self._pipe = pipe
        self._record = record

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args and args[0] == "EVAL":
            numkeys = int(args[2])
            self._record("metrics", args[3 : 3 + numkeys])
        return self._pipe.execute_command(*args, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


def install(path: str, namespace: str) -> Callable[[], None]:
    """Records every script call of this process from now on; returns
    what undoes it."""
    record = Recorder(path, namespace)
    originals: dict[str, Any] = {name: getattr(Script, name) for name in ("_call", "run", "queue")}
    original_write = metrics.write

    def recording(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(self: Script, target: Any, keys: Sequence[Any], args: Sequence[Any] = ()) -> Any:
            record(self.name, keys)
            return original(self, target, keys, args)

        return wrapper

    @functools.wraps(original_write)
    def write(pipe: Any, *args: Any, **kwargs: Any) -> None:
        original_write(_EvalSeen(pipe, record), *args, **kwargs)

    for name, original in originals.items():
        setattr(Script, name, recording(original))
    metrics.write = write

    def undo() -> None:
        for name, original in originals.items():
            setattr(Script, name, original)
        metrics.write = original_write

    return undo
