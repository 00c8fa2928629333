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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Generic, TypeVar

YOUNG_THRESHOLD = 20_000  # allocations of container objects between young collections

_T = TypeVar("_T")


class _Overlapping(Generic[_T]):
    """A process-wide collector setting whose blocks may overlap (tasks on threads of
    one process): the first block in saves what the setting replaces (``save()``),
    every block applies it, the last one out restores what was saved
    (``restore(saved)``), so an early exit never undoes another block's setting."""

    def __init__(self, save: Callable[[], _T], restore: Callable[[_T], None]) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._save, self._restore = save, restore
        self._saved = save()  # replaced by what the first block finds

    @contextmanager
    def block(self, apply: Callable[[_T], None]) -> Iterator[None]:
        """Apply the setting (``apply(saved)``) for the block."""
        with self._lock:
            if self._open == 0:
                self._saved = self._save()
            self._open += 1
            apply(self._saved)
        try:
            yield
        finally:
            with self._lock:
                self._open -= 1
                if self._open == 0:
                    self._restore(self._saved)


def _unserve(before: tuple[int, int, int]) -> None:
    gc.set_threshold(*before)
    gc.unfreeze()


def _enable_if(was_enabled: bool) -> None:
    if was_enabled:
        gc.enable()


_SERVING = _Overlapping(gc.get_threshold, _unserve)
_BULK = _Overlapping(gc.isenabled, _enable_if)


def serving_collector(young_threshold: int = YOUNG_THRESHOLD) -> AbstractContextManager[None]:
    """Within the block, the objects that exist on entry are frozen out of collections
    and a young collection starts every ``young_threshold`` (>= 1) allocations; when
    the last open block of the process exits, both are undone (the thresholds
    restored, the frozen objects collectable again), so blocks may overlap (tasks on
    threads of one process). Process-wide: for a process's serving loop (``dstl node``,
    a task's loop), not for a library call. Raises ValueError for a
    ``young_threshold`` below 1."""
    if young_threshold < 1:
        raise ValueError(f"young_threshold must be >= 1, got {young_threshold}")

    def serve(before: tuple[int, int, int]) -> None:
        gc.freeze()
        gc.set_threshold(young_threshold, *before[1:])

    return _SERVING.block(serve)


def bulk_load_collector() -> AbstractContextManager[None]:
    """Within the block no cyclic collection runs (``gc.disable``); when the last open
    block of the process exits, the collector is enabled again if it was enabled when
    the first one opened, so blocks may overlap (tasks restoring on threads of one
    process): an early exit does not turn it back on under another's load. For a bulk
    load whose objects all survive it (restoring state); reference counting frees as
    usual, and cycles made meanwhile wait for the first collection after the block."""
    return _BULK.block(lambda _: gc.disable())
