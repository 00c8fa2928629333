"""When the coordinator sweeps orphans during a run (zero orphans after any run).

Objects of aborted checkpoints and dead attempts, snapshots of abandoned
materializations and duplicate copies left by a writer's fallback are referenced by
no checkpoint. The coordinator deletes them during the run, off its loop (a
:class:`dstltree.coordinator.events.SweepOrphans` carried out by the storage worker),
every ``interval`` seconds, and once more when the run is finished:

- In-run sweeps delete unreferenced files modified before ``cutoff - grace``, where
  ``cutoff`` (``CoordinatorState.sweep_scope``) is the trigger of the latest completed
  checkpoint (or of a pending materialization epoch, if earlier): a live task's file
  written before that trigger holds data from before its barrier, so the checkpoint
  names it if the task still needs it; a file of an older attempt is never named again
  (its acknowledgements are fenced). Files named by a pending acknowledgement or
  report are spared too. ``grace`` (seconds) covers the clock difference between the
  driver and the store and a listing that takes long.
- The final sweep, once the final checkpoint is durable and committed and every task
  of the attempt was sent ``Finish``, deletes every unreferenced file whatever its
  age (grace 0): no checkpoint is triggered any more, tasks of older attempts are
  fenced, so no acknowledgement can name a file again; the retained checkpoints are
  the end state. A write still in flight when it lists (a snapshot part a task was
  uploading when its Finish came, a killed attempt's upload that lands late) can
  outlive it: so the coordinator sweeps once more when it stops (``final_only``),
  after the driver saw every task of the stage end; what a killed attempt leaves
  later still is deleted by the cleanup at the next start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from dstltree.coordinator.events import SweepOrphans
from dstltree.coordinator.state import CoordinatorState


@dataclass(frozen=True)
class SweepPolicy:
    """``interval``: seconds between in-run sweeps (0 = at every tick); ``grace``:
    seconds an unreferenced file is spared beyond the cutoff (and at start). Raises
    ValueError for negative numbers."""

    interval: float = 10.0
    grace: float = 60.0

    def __post_init__(self) -> None:
        if self.interval < 0 or self.grace < 0:
            raise ValueError("sweep interval and grace must be >= 0 seconds")


class OrphanSweeper:
    """Decides when to sweep; ``wall``: epoch seconds (the cutoff never passes
    ``wall() - grace``)."""

    def __init__(self, policy: SweepPolicy, wall: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self._wall = wall
        self._due = 0.0
        self.final_issued = False
        self.closing_issued = False

    def next(
        self, state: CoordinatorState, now: float, *, final_only: bool = False
    ) -> SweepOrphans | None:
        """The sweep to carry out now (``now``: monotonic seconds), or None: the final
        one once the run is finished (issued once, and once more with ``final_only``,
        when the coordinator stops), else an in-run one when due and safe (not with
        ``final_only``)."""
        if self.final_issued and (not final_only or self.closing_issued):
            return None
        scope = state.sweep_scope()
        if scope is None:
            return None
        referenced, cutoff = scope
        if cutoff is None:
            self.closing_issued = self.final_issued and final_only
            self.final_issued = True
            return SweepOrphans(referenced, None, final=True)
        if final_only or now < self._due:
            return None
        self._due = now + self.policy.interval
        limit = min(cutoff, self._wall()) - self.policy.grace
        return SweepOrphans(referenced, limit)
