"""The coordinator's side of a source: the split enumerator of the current attempt and
the discovery schedule (pure bookkeeping for coordinator/state.py; no I/O, no clock).

The enumerator (FLIP-27 ``SplitEnumerator``, dstltree.sparkplug.sources.base) lives in
the coordinator state. At every attempt it is rebuilt from the latest completed
checkpoint: ``source.create_enumerator(latest.enumerator.resumed(latest.split_states()))``
(every split not finished becomes pending at the offset its reader recorded), or a
fresh one without a checkpoint. Listing is I/O and runs off the event loop: the state
asks for a :class:`ListSplits` every ``discovery_interval`` seconds (never two at a
time, never after a complete listing) and adds the answer with
``SplitEnumerator.add_listing``.
"""

from __future__ import annotations

from collections.abc import Iterable

from dstltree.coordinator.checkpoint import CompletedCheckpoint
from dstltree.coordinator.events import ListSplits
from dstltree.sparkplug.sources.base import (
    EnumeratorState,
    Listing,
    Source,
    Split,
    SplitEnumerator,
    SplitState,
)


class SourceSplits:
    """The enumerator of ``source`` and its discovery schedule (``discovery_interval``
    seconds between the end of one listing and the next). :attr:`enumerator` is None
    until :meth:`rebuild`. Counters (``splits_discovered``, ``listings_failed``) are
    public."""

    def __init__(self, source: Source, discovery_interval: float) -> None:
        self.source = source
        self.discovery_interval = discovery_interval
        self.enumerator: SplitEnumerator | None = None
        self.listing = False  # a ListSplits is outstanding
        self.due = 0.0
        self.splits_discovered = 0
        self.listings_failed = 0

    def restored(self, latest: CompletedCheckpoint | None) -> SplitEnumerator:
        """A new enumerator resuming ``latest`` (its snapshot with its readers' split
        states folded in), or a fresh one when ``latest`` is None or has no enumerator
        snapshot. Raises ValueError when the readers' states do not fit the snapshot
        (``EnumeratorState.resumed``)."""
        if latest is None or latest.enumerator is None:
            return self.source.create_enumerator(None)
        state: EnumeratorState = latest.enumerator.resumed(latest.split_states())
        return self.source.create_enumerator(state)

    def rebuild(self, enumerator: SplitEnumerator, now: float) -> None:
        """Use ``enumerator`` (from :meth:`restored`) from now on; list at once."""
        self.enumerator = enumerator
        self.due = now

    def maybe_list(self, now: float) -> list[ListSplits]:
        """A listing if one is due, none is outstanding and discovery is not over."""
        e = self.enumerator
        if e is None or self.listing or now < self.due or e.listing_complete():
            return []
        self.listing = True
        return [ListSplits(e)]

    def listed(self, now: float, listing: Listing) -> list[Split]:
        """The answer of the outstanding listing; returns the new splits (pending)."""
        self.listing = False
        self.due = now + self.discovery_interval
        if self.enumerator is None:
            return []
        new = self.enumerator.add_listing(listing)
        self.splits_discovered += len(new)
        return new

    def failed(self, now: float) -> None:
        """The outstanding listing failed: counted, retried an interval later."""
        self.listing = False
        self.due = now + self.discovery_interval
        self.listings_failed += 1

    def assign(self, num_tasks: int) -> dict[int, list[SplitState]]:
        """Every pending split to one of readers ``0 .. num_tasks - 1``."""
        if self.enumerator is None:
            return {}
        return self.enumerator.assign(range(num_tasks))

    def finish(self, reader: int, split_ids: Iterable[str]) -> None:
        """Reader ``reader`` consumed these splits to their end (idempotent). Raises
        ValueError for a split not assigned to that reader (nor finished)."""
        e = self.enumerator
        if e is None:
            raise ValueError("no split was assigned")
        ids = list(split_ids)
        mine = {s.split.id for s in e.assigned_to(reader)}
        finished = e.snapshot().finished if any(i not in mine for i in ids) else frozenset()
        for sid in ids:
            if sid not in mine and sid not in finished:
                raise ValueError(f"split {sid!r} is not assigned to reader {reader}")
        e.finish(ids)

    def is_finished(self) -> bool:
        """The source listed its last split and every split is finished."""
        return self.enumerator is not None and self.enumerator.is_finished()

    def snapshot(self) -> EnumeratorState | None:
        """The enumerator's snapshot now (None before the first attempt)."""
        return None if self.enumerator is None else self.enumerator.snapshot()

    def violation(self, num_tasks: int) -> str | None:
        """The first broken invariant of the enumerator's state, or None: a split is
        in one place only (pending, assigned or finished), and assigned splits belong
        to readers of the current attempt."""
        snap = self.snapshot()
        if snap is None:
            return None
        pending = {s.split.id for s in snap.pending}
        assigned = set(snap.assigned)
        if assigned & snap.finished or pending & snap.finished or pending & assigned:
            return "a split is never both assigned (or pending) and finished"
        if any(not 0 <= r < num_tasks for r, _ in snap.assigned.values()):
            return "splits are assigned to readers of the current attempt only"
        return None
