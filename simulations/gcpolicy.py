"""The cyclic garbage collector during a simulation."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["rare_collections"]


@contextmanager
def rare_collections(first_generation: int = 200_000) -> Iterator[None]:
    """Run the body with the collector's thresholds raised to ``first_generation``
    allocations and 1,000 collections for the older generations, then restore them.

    A simulation frees its messages, events and batches by reference counting (nothing
    per event builds a cycle), so at the default thresholds the collector mostly rescans
    the millions of long-lived objects of the node cores: about a third of a
    10,000-executor run. Memory stays bounded: the collector still runs, rarely."""
    old = gc.get_threshold()
    gc.set_threshold(first_generation, 1000, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*old)
