"""A ``.delay()``'s LPUSH and the worker's fetch call on connections of
their own, past redis-py's per-command layers (``FAST_PATH``, SPEC section 3).

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
TLS, credentials, timeouts, retries and the health check are the
client's), and puts it back once the reply is read. The command is packed
here and its reply read with the connection's own hiredis reader, past the
connection's own layers too (:func:`_roundtrip`).

That reads redis-py's private attributes, so it is done only where
:mod:`django_cogworker.redispy` allows it: ``FAST_PATH`` on, a redis-py
version it was tested with, and a probe of the first connection of each
pool; otherwise (said once, at INFO) every command takes redis-py's public
API. Only plain clients take this way: a Sentinel client keeps its pool
(which follows the master), a Cluster client its slot routing, a pool with
a client-side cache its cache, a single-connection client its connection,
a pipeline its queue of commands.

Failures: an idle connection the server closed (a Redis restart, a client
timeout, ``CLIENT KILL``) is found before any byte is sent (a poll and a
peek, the check redis-py's pool makes), dropped, and the caller sends the
command the ordinary way. Once the command's bytes may have reached Redis,
a failure (a timeout waiting for the reply, a connection reset) sends it
again only as redis-py's own retry rule for that connection would
(:func:`django_cogworker.redispy.resend_as_redis_py_would`), never one
time more: an ``LPUSH`` that timed out is not pushed a second time where
redis-py would have raised. A reply that is an error (OOM, WRONGTYPE,
READONLY) was read whole, so its connection goes back to the stack and the
error is raised; after READONLY,
:func:`django_cogworker.connection.forget_demoted_master` closes the idle
ones with the pool's (:func:`drop_idle`), and each idle processor thread's
own (:mod:`django_cogworker.direct_blocking`) before its next ``BLMOVE``.
"""

from __future__ import annotations

import os
import select
import socket
import time
from typing import Any

import redis

from django_cogworker import redispy
from django_cogworker.conf import get_config
from django_cogworker.redispy import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA

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
        #: False: every command takes redis-py's way (not a plain client,
        #: FAST_PATH off, or the probe found the fast path may not be taken).
        self.usable = usable
        #: Whether a connection of the pool passed the probe (redispy.connection_problem).
        self.probed = False
        self.pid = os.getpid()
        #: The client last found to use ``pool`` (not a pipeline).
        self.client: Any = None
        #: Whether :func:`_pack` packs as the pool's connections do.
        self.packs_alike = usable and _packs_alike(pool)
        self.idle: list[Any] = []
        #: A socket's file descriptor -> a poll object watching it
        #: (:func:`_closed_while_idle`), made once: a new one costs as much as the poll.
        self.pollers: dict[int, Any] = {}

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

#: Moved on by :func:`drop_idle`. A connection kept outside the stack
#: (:mod:`django_cogworker.direct_blocking`'s, one per thread) remembers the
#: generation it was made in, and is closed before its next command once
#: that is an older one.
generation = 0

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
        and _allowed()
    )
    # After a fork the parent's sockets are left alone: dropped, not closed.
    _stack = stack = _Stack(pool, usable)
    stack.client = client
    return stack


def _allowed() -> bool:
    """``FAST_PATH`` is on, and redis-py is a version the fast path was
    tested with (if not, said once)."""
    if not get_config().fast_path:
        return False
    problem = redispy.install_problem()
    if problem is not None:
        redispy.say_once(problem)
    return problem is None


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


def _ready(stack: _Stack, conn: Any) -> bool:
    """Opens ``conn`` if it is new, probing the stack's first connection;
    False when the probe found the fast path may not drive this pool's
    connections (said once; the stack is off from then on). Raises
    ConnectionError when the server closed ``conn`` while it was idle, and
    redis-py's error when it cannot connect: no byte of the command was sent."""
    if stack.probed:
        sock = conn._sock
        if sock is None:
            conn.connect()
        elif _closed_while_idle(stack, conn, sock):
            raise redis.ConnectionError("the server closed the idle connection")
        return True
    conn.connect()
    problem = redispy.connection_problem(conn)
    if problem is not None:
        stack.usable = False
        redispy.say_once(problem)
        return False
    stack.probed = True
    return True


def _closed_while_idle(stack: _Stack, conn: Any, sock: socket.socket) -> bool:
    """Whether the server closed or reset ``conn`` (on ``sock``) while it
    was idle: a command written there now would be lost, or taken for one
    that may have run. Bytes waiting (a RESP3 push, a TLS record) leave it
    open: its parser holds them, and the reply is read after them."""
    fd = sock.fileno()
    poller = stack.pollers.get(fd)
    if poller is None:
        # Polls whatever socket holds this descriptor: after a reconnection, the new one.
        poller = stack.pollers[fd] = select.poll()
        poller.register(fd, select.POLLIN)
    if not poller.poll(0):
        return False  # nothing to read: the usual case, one system call
    try:
        conn.can_read(timeout=0)  # redis-py's own check: reads what came, raises at the end of the stream
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return True
    return False


def _lean_parser(conn: Any) -> Any:
    """The connection's parser if the connection is open and not due a
    health check; otherwise None (its public methods then do all of it,
    the health check's PING included)."""
    if conn._sock is None:
        return None
    interval = conn.health_check_interval
    if interval and time.monotonic() > conn.next_health_check:
        return None
    return conn._parser


def _roundtrip(conn: Any, args: tuple[Any, ...], pack_here: bool = True) -> Any:
    """Sends one command on ``conn`` and returns its reply (an error reply
    is raised), as ``send_packed_command`` and ``read_response`` do, with
    their errors; ``pack_here``: :func:`_pack` packs as the connection would."""
    parser = _lean_parser(conn) if pack_here else None
    packed = _pack(args) if parser is not None else None
    if parser is None or packed is None:
        conn.send_packed_command(conn.pack_command(*args))
        return conn.read_response()
    sock, reader, buffer = conn._sock, parser._reader, parser._buffer
    try:
        sock.sendall(packed)
    except TimeoutError:
        raise redis.TimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        raise redis.ConnectionError(f"Error while writing to socket: {exc}") from None
    try:
        reply = _read(parser, sock, reader, buffer)
    except TimeoutError:
        raise redis.TimeoutError("Timeout reading from socket") from None
    except OSError as exc:
        raise redis.ConnectionError(f"Error while reading from socket: {exc}") from None
    if conn.health_check_interval:
        conn.next_health_check = time.monotonic() + conn.health_check_interval
    if isinstance(reply, Exception):
        raise reply  # hiredis made it with redis-py's own error classes
    if type(reply) is list and reply and isinstance(reply[0], redis.ConnectionError):
        raise reply[0]
    return reply


def _read(parser: Any, sock: socket.socket, reader: Any, buffer: bytearray) -> Any:
    """The next reply on ``sock``, past any RESP3 push ahead of it (handed
    to the parser, as redis-py does where it reads pushes apart)."""
    while True:
        reply = reader.gets()
        while reply is _NOT_ENOUGH_DATA:
            count = sock.recv_into(buffer)
            if not count:
                raise redis.ConnectionError("Connection closed by server.")
            reader.feed(buffer, 0, count)
            reply = reader.gets()
        push = getattr(parser, "_hiredis_PushNotificationType", None)  # where redis-py reads pushes apart
        if push is None or not isinstance(reply, push):
            return reply
        parser.handle_push_response(reply)  # RESP3: a push is not the reply, which follows it


def call(client: Any, *args: Any) -> Any:
    """The reply to one command sent as above, or ORDINARY when the caller
    must send it the ordinary way: ``client`` is not a plain one, the fast
    path is off, or the connection failed before any byte of the command
    was sent. A reply that is an error is raised; so is a failure after the
    command may have reached Redis, unless redis-py's retry rule sends it
    again (:mod:`django_cogworker.redispy`)."""
    stack = _stack_for(client)
    if not stack.usable:
        return ORDINARY
    conn = stack.take()
    try:
        ready = _ready(stack, conn)
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        ready = False
    if not ready:
        conn.disconnect()  # nothing of the command was sent: redis-py's way sends it once
        return ORDINARY
    try:
        reply = _roundtrip(conn, args, stack.packs_alike)
    except redis.ResponseError:
        stack.give_back(conn)
        raise
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        reply = redispy.resend_as_redis_py_would(conn, args, exc)  # raises when redis-py would not resend
    except BaseException:
        conn.disconnect()  # a reply may be left unread: never reused
        raise
    stack.give_back(conn)
    return reply


def sadd(client: Any, key: str, member: str) -> bool:
    """SADDs ``member`` to ``key`` as above. False when the caller must
    send it the ordinary way (see :func:`call`)."""
    return call(client, "SADD", key, member) is not ORDINARY


def drop_idle() -> None:
    """Closes the idle connections, so that the next ones resolve the
    client's address again (its server was demoted to a replica); those
    kept outside the stack, at their next command (:data:`generation`)."""
    global generation
    generation += 1
    stack = _stack
    while stack is not None and stack.idle:
        try:
            conn = stack.idle.pop()
        except IndexError:
            return  # another thread took the last one
        conn.disconnect()
