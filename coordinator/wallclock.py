"""The driver's wall clock as the coordinator's ticks report it, held against its
monotonic clock (pure: times come with the events).

In-run orphan sweeps (coordinator/sweep.py) compare a wall-clock cutoff (the trigger
of the latest checkpoint) with the store's modification times. A driver whose wall
clock is stepped forward (an NTP correction, a VM resumed, an operator's ``date``)
would put that cutoff ahead of the store's clock, and unreferenced files a live task
wrote after the latest trigger (the next checkpoint's, not acknowledged yet) would
look old enough to delete. Once the wall clock moved against the monotonic clock by
more than :data:`JUMP_S`, in-run sweeps stop for the rest of the run; the final sweep
needs no clock (it runs once every task was sent Finish).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JUMP_S", "WallClock"]

JUMP_S = 10.0
"""Seconds the wall clock may move against the monotonic clock before it counts as a
jump (NTP slews by at most 0.5 ms/s: 1.8 s over an hour; the sweep's grace, 60 s by
default, covers what is below)."""


@dataclass
class WallClock:
    """``offset``: wall minus monotonic at the first tick (seconds); ``moved_s``: the
    largest move against it seen (signed); ``jumped``: a move beyond JUMP_S."""

    offset: float | None = None
    moved_s: float = 0.0
    jumped: bool = False

    def observe(self, now: float, wall: float) -> None:
        """A tick at monotonic ``now`` with wall-clock time ``wall`` (epoch seconds)."""
        if self.offset is None:
            self.offset = wall - now
            return
        moved = (wall - now) - self.offset
        if abs(moved) > abs(self.moved_s):
            self.moved_s = moved
        self.jumped = self.jumped or abs(moved) > JUMP_S

    def validate(self) -> None:
        """Raises AssertionError when ``jumped`` disagrees with ``moved_s``."""
        assert self.jumped == (abs(self.moved_s) > JUMP_S), self
