"""An idle processor thread's ``BLMOVE`` on a connection of the thread's
own, through :mod:`django_cogworker.direct`'s lean round trip
(``FAST_PATH``, SPEC section 3).

Duties: keep one connection per processor thread for its blocking
``BLMOVE``, made from the client's pool's settings (TLS, credentials,
timeouts, retries and the health check are the client's) and probed as
direct.py probes its own, so that the same clients take this way (a plain
client, ``FAST_PATH`` on, a redis-py version it was tested with); the
others keep ``client.blmove``. Close a thread's connection before its next
``BLMOVE`` once the server was demoted (a READONLY reply:
:func:`direct.drop_idle <django_cogworker.direct.drop_idle>` moves
:data:`direct.generation <django_cogworker.direct.generation>` on), when the
thread ends, and at the worker's stop (:meth:`BlockingConnections.close_all`).

Failures, as for direct.py's own: a connection the server closed while it
was idle is found before any byte is sent and connected again; once the
``BLMOVE`` may have reached Redis, a failure sends it again only as
redis-py's retry rule would. The socket's timeout is the client's
``socket_timeout``, as for redis-py's ``blmove``: one shorter than the
server's wait ends it early, as a timeout redis-py retries as it would.
"""

from __future__ import annotations

import threading
from typing import Any

import redis

from django_cogworker import direct, redispy


class BlockingConnections:
    """The process's processor threads' connections for their ``BLMOVE``:
    each thread uses only its own; the set is kept to close them all."""

    def __init__(self) -> None:
        self._mine = threading.local()
        self._lock = threading.Lock()
        #: A thread's ident -> its connection.
        self._held: dict[int, Any] = {}
        #: The threads whose BLMOVE is in flight: their connection is closed by them.
        self._busy: set[int] = set()
        self._closed = False

    def blmove(self, client: Any, source: str, destination: str, timeout_s: float) -> Any:
        """``client.blmove(source, destination, timeout_s, "RIGHT", "LEFT")``,
        on the calling thread's own connection where the fast path may be
        taken: the job moved, or None when the wait ended with none."""
        stack = direct._stack_for(client)
        conn = self._take(stack) if stack.usable else None
        if conn is None:
            return client.blmove(source, destination, timeout_s, "RIGHT", "LEFT")
        # The timeout as redis-py packs a float (repr), so _pack packs it too.
        args = ("BLMOVE", source, destination, "RIGHT", "LEFT", repr(float(timeout_s)))
        try:
            if not self._ready(stack, conn):
                return client.blmove(source, destination, timeout_s, "RIGHT", "LEFT")
            try:
                return direct._roundtrip(conn, args, stack.packs_alike)
            except redis.ResponseError:
                raise  # read whole (OOM, WRONGTYPE, READONLY, UNBLOCKED): the connection stays usable
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # The BLMOVE may have reached Redis and moved a job whose
                # reply is lost: that job sits on this process's in-progress
                # list and no thread runs it; the stray check requeues it
                # once it sees it there twice in a row (G7). Sent again only
                # as redis-py's own retry rule would send it.
                return redispy.resend_as_redis_py_would(conn, args, exc)
            except BaseException:
                conn.disconnect()  # a reply may be left unread: never reused
                raise
        finally:
            self._give_back()

    def _take(self, stack: Any) -> Any:
        """The calling thread's connection, marked in use; made if it has
        none, or none since the server was last demoted. None after
        :meth:`close_all`."""
        mine = self._mine
        conn = getattr(mine, "conn", None)
        if conn is not None and (mine.pool is not stack.pool or mine.generation != direct.generation):
            conn.disconnect()  # resolves the address again when it connects
            if mine.pool is not stack.pool:
                conn = None  # new settings: made from the new pool's
        if conn is None:
            conn = stack.pool.connection_class(**stack.pool.connection_kwargs)
        mine.conn, mine.pool, mine.generation = conn, stack.pool, direct.generation
        ident = threading.get_ident()
        with self._lock:
            if self._closed:
                return None
            self._held[ident] = conn
            self._busy.add(ident)
        return conn

    def _give_back(self) -> None:
        ident = threading.get_ident()
        with self._lock:
            self._busy.discard(ident)
            if not self._closed:
                return
            conn = self._held.pop(ident, None)
        if conn is not None:
            conn.disconnect()  # the stop came while it waited

    def _ready(self, stack: Any, conn: Any) -> bool:
        """Opens ``conn`` (or probes it, as direct.py does its stack's first),
        connecting it again when the server closed it while it was idle: no
        byte was sent on it. False when the probe turned the fast path off."""
        try:
            ready = direct._ready(stack, conn)
        except redis.ConnectionError:
            if conn._sock is None:
                raise  # could not connect: redis-py's own error, after its own retries
            conn.disconnect()
            ready = direct._ready(stack, conn)
        if not ready:
            self.close_mine()
        return ready

    def connections(self) -> list[Any]:
        """The connections the threads hold now."""
        with self._lock:
            return list(self._held.values())

    def close_mine(self) -> None:
        """Closes the calling thread's connection (its loop ended)."""
        conn = getattr(self._mine, "conn", None)
        self._mine.conn = None
        with self._lock:
            self._held.pop(threading.get_ident(), None)
        if conn is not None:
            conn.disconnect()

    def close_all(self) -> None:
        """Closes every thread's connection, and sends no BLMOVE on one from
        now on (the worker stops): a connection whose BLMOVE is in flight
        is closed by its thread when the wait ends."""
        with self._lock:
            self._closed = True
            idle = [conn for ident, conn in self._held.items() if ident not in self._busy]
            self._held = {ident: conn for ident, conn in self._held.items() if ident in self._busy}
        for conn in idle:
            conn.disconnect()
