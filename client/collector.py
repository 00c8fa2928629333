"""CPython's cyclic garbage collector in a process that serves the hot path, and
while it restores state.

A node's process, or a task's, holds a steady set of long-lived objects (modules,
sockets, threads, restored state) and allocates short-lived ones per segment or per
record: items, futures, frames, acks. With CPython's defaults every 700 allocations of
container objects start a young collection, and the in-flight segments that survive
it are promoted until a full collection scans every object in the process (tens of
milliseconds with the libraries loaded). Measured on a node forwarding 64 KiB
segments, the collector took about a third of its loop's time under the interpreter
lock (BENCHMARKS.md, "Hot path").

:func:`serving_collector` freezes what exists when serving starts (``gc.freeze``: full
collections no longer scan it) and starts a young collection every
``young_threshold`` allocations instead of 700, so that an in-flight working set dies
by reference counting before a collection sees it. Cyclic garbage is still found, a
little later.

:func:`bulk_load_collector` turns cyclic collections off while a task restores its
state: every container a restore builds survives, so the collector's scans find
nothing to free and cost 5-10% of a restore, at times (a full collection over a
process's large heap) more than half.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000  # allocations of container objects between young collections


class _Serving:
    """How many blocks of :func:`serving_collector` are open in this process, and the
    thresholds to restore when the last one closes."""

    lock = threading.Lock()
    open = 0
    before: tuple[int, int, int] = (700, 10, 10)


@contextmanager
def serving_collector(young_threshold: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Within the block, the objects that exist on entry are frozen out of collections
    and a young collection starts every ``young_threshold`` (>= 1) allocations; when
    the last open block of the process exits, both are undone (the thresholds
    restored, the frozen objects collectable again), so blocks may overlap (tasks on
    threads of one process). Process-wide: for a process's serving loop (``dstl node``,
    a task's loop), not for a library call. Raises ValueError for a
    ``young_threshold`` below 1."""
    if young_threshold < 1:
        raise ValueError(f"young_threshold must be >= 1, got {young_threshold}")
    with _Serving.lock:
        if _Serving.open == 0:
            _Serving.before = gc.get_threshold()
        _Serving.open += 1
        gc.freeze()
        gc.set_threshold(young_threshold, *_Serving.before[1:])
    try:
        yield
    finally:
        with _Serving.lock:
            _Serving.open -= 1
            if _Serving.open == 0:
                gc.set_threshold(*_Serving.before)
                gc.unfreeze()


class _Bulk:
    """How many blocks of :func:`bulk_load_collector` are open in this process, and
    whether the collector was enabled when the first one opened."""

    lock = threading.Lock()
    open = 0
    was_enabled = True


@contextmanager
def bulk_load_collector() -> Iterator[None]:
    """Within the block no cyclic collection runs (``gc.disable``); when the last open
    block of the process exits, the collector is enabled again if it was enabled when
    the first one opened, so blocks may overlap (tasks restoring on threads of one
    process): an early exit does not turn it back on under another's load. For a bulk
    load whose objects all survive it (restoring state); reference counting frees as
    usual, and cycles made meanwhile wait for the first collection after the block."""
    with _Bulk.lock:
        if _Bulk.open == 0:
            _Bulk.was_enabled = gc.isenabled()
        _Bulk.open += 1
        gc.disable()
    try:
        yield
    finally:
        with _Bulk.lock:
            _Bulk.open -= 1
            if _Bulk.open == 0 and _Bulk.was_enabled:
                gc.enable()
