"""Whether the calling code is inside ``transaction.atomic()``, for the
on-commit rule of every push (``ENQUEUE_ON_COMMIT``).

Django keeps a database connection per thread behind asgiref's ``Local``,
whose lookup tells a synchronous thread from an event loop's by raising
and catching an exception: cold, as ``.delay()`` runs after a pause, it
takes about twice as long as reading the connection kept
(``tools/cold_calls.py``). A synchronous thread's connection is one
object for the thread's life (closing it keeps the object), so it is
looked up once per thread and kept here. Code running under an event loop
gets Django's own lookup each time: there, the connection belongs to the
async context, not to the thread.

Django replaces a thread's connection object only at the start of the
threads of its live test server (``connections[alias] = ...``), before
they run any code of their own; code that replaces it later in a thread
that has already enqueued is not seen here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from django.db import transaction


class _Thread(threading.local):
    connection: Any = None  # this thread's default database connection, once looked up


_thread = _Thread()


def inside() -> bool:
    """Whether the default database's connection of the calling code is in
    an atomic block, as ``transaction.get_connection().in_atomic_block``."""
    if asyncio._get_running_loop() is not None:
        return bool(transaction.get_connection().in_atomic_block)
    connection = _thread.connection
    if connection is None:
        connection = _thread.connection = transaction.get_connection()
    return bool(connection.in_atomic_block)


def on_commit_or_now(wanted: bool, push_them: Callable[[], None]) -> None:
    """Runs ``push_them`` after the transaction commits (not at all on
    rollback) if ``wanted`` and one is open; otherwise now."""
    if wanted and inside():
        transaction.on_commit(push_them)
    else:
        push_them()
