"""Workflows (SPEC section 13): batches with callbacks, chains, chords.

``signature.py`` (``job.s()``), ``batch.py`` (``batch()``,
``current_batch()``), ``canvas.py`` (``chain``, ``group``, ``chord``),
``state.py`` (opening a batch: ``batch_open.lua``), ``effects.py`` (what a
member's end does, in the same script as its ack or filing:
``lua/lib/batches.lua``).
"""
