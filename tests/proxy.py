"""A TCP proxy that a test can cut: it stops forwarding both ways while
every socket stays open, as a network that drops packets does.

Bytes read while cut are held and sent, in order, once it heals: a reply
Redis wrote during the cut reaches the client late, exactly as after a
partition that TCP retransmission survives.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class PausableProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.forwarding = threading.Event()
        self.forwarding.set()
        self.closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._accepter = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PausableProxy:
        self._accepter.start()
        return self

    def cut(self) -> None:
        """Stops forwarding both ways; the connections stay open."""
        self.forwarding.clear()

    def heal(self) -> None:
        self.forwarding.set()

    def close(self) -> None:
        self.closed.set()
        self.forwarding.set()  # frees the pumps waiting to forward
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def __enter__(self) -> PausableProxy:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.upstream)
            except OSError:
                return
            with self._lock:
                self._sockets += [client, server]
            for src, dst, name in ((client, server, "up"), (server, client, "down")):
                pump = threading.Thread(target=self._pump, args=(src, dst), name=f"proxy-{name}", daemon=True)
                pump.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            # Read already, held until the cut heals: nothing passes while cut.
            self.forwarding.wait()
            if not data or self.closed.is_set():
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
