"""The cyclic garbage collector held off while many payloads are built.

Duties: ``delay_many()`` makes a dict (and its lists) for every call, tens of
thousands at once, each surviving the young collections it meets; one of
them then sets off a full collection, which walks every object of the
process (a Django process holds some 70,000) and took a third off that
call's rate when it came (docs/performance.md, "Enqueue"). Nothing built
there is cyclic garbage, so the collector waits for the end of the call:
:func:`held_off` turns it off for the call and back on after, whatever
the call raised. A collector someone turned off stays off. Another thread
that turns it off meanwhile finds it on again at the end of the call: its
state is the interpreter's, one for all threads.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def held_off() -> Iterator[None]:
    """No collection by the cyclic collector inside the block (reference
    counting frees as always)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
