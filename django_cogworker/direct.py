"""A ``.delay()``'s LPUSH and the worker's fetch call on connections of
their own, past redis-py's per-command layers.

redis-py's ``Redis.execute_command`` wraps every command in layers that one
LPUSH does not need: the pool's lock and its check that an idle connection
holds no stray reply (a ``poll()`` call), the retry object, the event
dispatcher and the connection metrics. For the most frequent enqueue, a
``.delay()`` to a queue this process registered lately, they cost more
than our own work and about as much CPU as the round trip
(docs/performance.md, "Enqueue"); so they do for the ``fetch.lua`` call
that brings a busy worker's jobs, where they took a fifth of the time the
worker held the GIL. :func:`call` sends one command on a connection from a
stack of this module's own, made from the client's pool's settings (so
TLS, credentials, timeouts and the health check are the client's), and puts
it back once the reply is read. On a connection that parses with hiredis
(``redis[hiredis]``, a dependency), the command is packed here and its
reply read with the connection's own hiredis reader, past the connection's
own layers too (:func:`_roundtrip`); any other connection is driven through
its public methods.

Only plain clients take this way: a Sentinel client keeps its pool (which
follows the master), a Cluster client its slot routing, a pool with a
client-side cache its cache, a single-connection client its connection, a
pipeline its queue of commands.

A connection that fails (a Redis restart, an idle connection cut) is
dropped, and the caller sends the command again the ordinary way, with
redis-py's retries: what redis-py does itself on a connection error. A reply that is
an error (OOM, WRONGTYPE, READONLY) was read whole, so its connection goes
back to the stack and the error is raised; after READONLY,
:func:`django_cogworker.connection.forget_demoted_master` closes the idle
ones with the pool's (:func:`drop_idle`).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

_HIREDIS_READER: Any
_NOT_ENOUGH_DATA: Any
try:
    from hiredis import Reader as _HIREDIS_READER
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # without hiredis, the connections' public methods do it all
    _HIREDIS_READER = _NOT_ENOUGH_DATA = None

#: Idle connections kept per process; more are made while more threads
#: enqueue at once, and closed when they are handed back beyond this.
MAX_IDLE = 8

#: The pool classes whose connections this module may copy.
_PLAIN_POOLS = (redis.ConnectionPool, redis.BlockingConnectionPool)


class _Stack:
    """Idle connections like ``pool``'s, for one process: ``list.pop`` and
    ``list.append`` are atomic, so threads share it without a lock."""

    def __init__(self, pool: Any, usable: bool) -> None:
        self.pool = pool
        self.usable = usable
        self.pid = os.getpid()
        #: The client last found to use ``pool`` (not a pipeline).
        self.client: Any = None
        #: Whether :func:`_pack` packs as the pool's connections do.
        self.packs_alike = usable and _packs_alike(pool)
        self.idle: list[Any] = []

    def take(self) -> Any:
        try:
            return self.idle.pop()
        except IndexError:
            return self.pool.connection_class(**self.pool.connection_kwargs)

    def give_back(self, conn: Any) -> None:
        if len(self.idle) < MAX_IDLE:
            self.idle.append(conn)
        else:
            conn.disconnect()


_stack: _Stack | None = None


#: What :func:`call` returns when the caller must send the command the
#: ordinary way.
ORDINARY: Any = object()

#: A stack for the clients that may not take this way (not kept).
_NONE = _Stack(None, usable=False)


def _stack_for(client: Any) -> _Stack:
    global _stack
    stack = _stack
    # A process forked by a server's C code runs no os.register_at_fork
    # hook, so the pid is checked on each call, as redis-py's pool does.
    pid = os.getpid()
    if stack is not None and stack.client is client and stack.pid == pid:
        return stack  # before isinstance(): redis-py's Pipeline is a Protocol, slow to check
    if isinstance(client, redis.client.Pipeline):
        return _NONE  # shares its client's pool, but its commands wait for execute()
    pool = getattr(client, "connection_pool", None)
    if stack is not None and stack.pool is pool and stack.pid == pid:
        stack.client = client
        return stack
    usable = (
        type(pool) in _PLAIN_POOLS
        and getattr(pool, "cache", None) is None
        and getattr(client, "connection", None) is None
    )
    # After a fork the parent's sockets are left alone: dropped, not closed.
    _stack = stack = _Stack(pool, usable)
    stack.client = client
    return stack


def _packs_alike(pool: Any) -> bool:
    """Whether the pool's connections pack a str as :func:`_pack` does, as
    UTF-8: redis-py's hiredis packer does, whatever the ``encoding`` option
    says; its own packer encodes with that option."""
    probe = ("ECHO", "clé")
    try:
        theirs = pool.connection_class(**pool.connection_kwargs).pack_command(*probe)
    except Exception:
        return False
    return b"".join(bytes(chunk) for chunk in theirs) == _pack(probe)


def _pack(args: tuple[Any, ...]) -> bytes | None:
    """The RESP bytes of a command whose arguments are all str, bytes or
    int, as redis-py packs them (str as UTF-8); None for any other."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        kind = type(arg)
        if kind is str:
            arg = arg.encode()
        elif kind is int:
            arg = b"%d" % arg
        elif kind is not bytes:
            return None
        parts.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(parts)


def _lean_parser(conn: Any) -> Any:
    """The connection's parser if the connection is open, parses with
    hiredis, and is not due a health check; otherwise None (its public
    methods then do all of it)."""
    parser = getattr(conn, "_parser", None)
    if type(getattr(parser, "_reader", None)) is not _HIREDIS_READER or conn._sock is None:
        return None
    if type(getattr(parser, "_buffer", None)) is not bytearray:
        return None
    interval = conn.health_check_interval
    if interval and time.monotonic() > conn.next_health_check:
        return None
    return parser


def _roundtrip(conn: Any, args: tuple[Any, ...], pack_here: bool = True) -> Any:
    """Sends one command on ``conn`` and returns its reply (an error reply
    is raised), as ``send_packed_command`` and ``read_response`` do;
    ``pack_here``: :func:`_pack` packs as the connection would."""
    parser = _lean_parser(conn) if pack_here else None
    packed = _pack(args) if parser is not None else None
    if parser is None or packed is None:
        conn.send_packed_command(conn.pack_command(*args))
        return conn.read_response()
    sock, reader, buffer = conn._sock, parser._reader, parser._buffer
    sock.sendall(packed)
    while True:
        reply = reader.gets()
        while reply is _NOT_ENOUGH_DATA:
            count = sock.recv_into(buffer)
            if not count:
                raise redis.ConnectionError("Connection closed by server.")
            reader.feed(buffer, 0, count)
            reply = reader.gets()
        push = getattr(parser, "_hiredis_PushNotificationType", None)  # RESP3, redis-py >= 5.1
        if push is None or not isinstance(reply, push):
            break
        parser.handle_push_response(reply)  # RESP3: a push is not the reply, which follows it
    if conn.health_check_interval:
        conn.next_health_check = time.monotonic() + conn.health_check_interval
    if isinstance(reply, Exception):
        raise reply  # hiredis made it with redis-py's own error classes
    if type(reply) is list and reply and isinstance(reply[0], redis.ConnectionError):
        raise reply[0]
    return reply


def call(client: Any, *args: Any) -> Any:
    """The reply to one command sent as above, or ORDINARY when the caller
    must send it the ordinary way: ``client`` is not a plain one, or the
    connection failed (and the command may have reached Redis, as with
    redis-py's own retries). A reply that is an error is raised."""
    stack = _stack_for(client)
    if not stack.usable:
        return ORDINARY
    conn = stack.take()
    try:
        reply = _roundtrip(conn, args, stack.packs_alike)
    except redis.ResponseError:
        stack.give_back(conn)
        raise
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        conn.disconnect()
        return ORDINARY
    except BaseException:
        conn.disconnect()  # a reply may be left unread: never reused
        raise
    stack.give_back(conn)
    return reply


def lpush(client: Any, key: str, value: bytes) -> bool:
    """LPUSHes ``value`` to ``key`` as above. False when the caller must
    push the ordinary way (see :func:`call`)."""
    return call(client, "LPUSH", key, value) is not ORDINARY


def drop_idle() -> None:
    """Closes the idle connections, so that the next ones resolve the
    client's address again (its server was demoted to a replica)."""
    stack = _stack
    while stack is not None and stack.idle:
        try:
            conn = stack.idle.pop()
        except IndexError:
            return  # another thread took the last one
        conn.disconnect()
