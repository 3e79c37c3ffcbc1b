"""The acks: the one owner of a finished job's acknowledgement (G6).

Duties: keep the acks owed by this process's threads until one of three
exits takes each, and keep the ledger's record of them true meanwhile, so
that an owed job is never taken for a stray nor run again (G6, G7):

1. it rides the next ``fetch.lua`` call (:meth:`Acks.take`, then
   :meth:`Acks.carried`): while the worker is busy, the call that brings the
   next jobs removes the finished ones too, no round trip of its own;
2. it is flushed through ``ack.lua`` (:meth:`Acks.flush`) when no call will
   come soon: the queues are paused, the thread's next job was fetched
   before its ack could ride, or the thread stops;
3. the settler settles it (``settle.py``): an ack sent at once (a recovered
   job, basic fetch), and any ack whose exit failed, owed in the ledger
   until reconcile or the shutdown sends it.

A job's end is recorded in one place, ``Settler.finished``, which owes its
ack here or settles it now.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django_cogworker.ledger import ACK, Ledger
from django_cogworker.work import UnitOfWork

#: A finished job and its jid (its orphan counter goes with an ``ack.lua`` ack).
Owed = tuple[UnitOfWork, str]


class Acks:
    """The acks waiting for a fetch call, shared by the threads of one process."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._lock = threading.Lock()
        self._waiting: list[Owed] = []
        # The ack each thread owed last, until its next fetch: a thread
        # handed a job fetched before its ack could ride sends it itself.
        self._mine = threading.local()

    def __len__(self) -> int:
        return len(self._waiting)

    def owe(self, work: UnitOfWork, jid: str) -> None:
        """A finished job's ack waits for the next fetch call. Recorded as
        owed in the ledger first: a call may carry it the moment it waits."""
        self.ledger.owe(work.raw, ACK)
        owed = (work, jid)
        with self._lock:
            self._waiting.append(owed)
        self._mine.owed = owed

    def mine(self) -> Owed | None:
        """The ack this thread owed since its last fetch, if any (once)."""
        owed: Owed | None = self._mine.__dict__.pop("owed", None)
        return owed

    def waits(self, owed: Owed) -> bool:
        """Whether no call has carried ``owed`` yet."""
        with self._lock:
            return owed in self._waiting

    def take(self) -> list[Owed]:
        """Exit 1: every ack waiting, for the ``fetch.lua`` call about to be
        sent. A call that fails leaves them owed in the ledger (exit 3)."""
        with self._lock:
            taken, self._waiting = self._waiting, []
        return taken

    def carried(self, taken: list[Owed]) -> None:
        """The call that took ``taken`` was answered: they are acknowledged."""
        if taken:
            self.ledger.acked([work.raw for work, _ in taken])

    def flush(self, send: Callable[[UnitOfWork, str], object]) -> None:
        """Exit 2: sends every ack waiting now, one ``send`` (``ack.lua``)
        each. A failure raises and leaves the rest owed in the ledger, for
        the settler (exit 3)."""
        for work, jid in self.take():
            send(work, jid)
            self.ledger.settled(work.raw)
