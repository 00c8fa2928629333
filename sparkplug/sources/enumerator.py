"""One enumerator for every source that can list its splits (files in a directory, an
in-memory dict): discovery, the assignment policy, finishing and snapshots.

Assignment policy (deterministic): pending splits go out in ``id`` order; each goes to
the reader with the fewest unfinished assigned splits at that moment, ties going to the
reader listed first in ``reader_ids``. With equal loads this is round-robin in
discovery order: splits ``s0, s1, s2`` over readers ``[0, 1]`` go to 0, 1, 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from dstltree.sparkplug.sources.base import (
    EnumeratorState,
    Listing,
    Split,
    SplitEnumerator,
    SplitState,
)


class ListingEnumerator(SplitEnumerator):
    """A :class:`SplitEnumerator` over ``list_splits() -> Listing`` (a function doing
    I/O only, called by :meth:`list_splits` and so by every :meth:`discover` until a
    listing is ``complete``). A split listed again (same id) is not new; a split is
    never read twice once finished (its id stays in the state)."""

    def __init__(
        self, list_splits: Callable[[], Listing], restored: EnumeratorState | None = None
    ) -> None:
        state = (restored or EnumeratorState()).resumed(())
        self._list_splits = list_splits
        self._pending: dict[str, SplitState] = {s.split.id: s for s in state.pending}
        self._assigned: dict[str, tuple[int, SplitState]] = {}
        self._finished: set[str] = set(state.finished)
        self._complete = state.complete

    def _known(self, split_id: str) -> bool:
        return split_id in self._pending or split_id in self._assigned or split_id in self._finished

    def list_splits(self) -> Listing:
        return self._list_splits()

    def add_listing(self, listing: Listing) -> list[Split]:
        if self._complete:
            return []
        new = sorted(s for s in set(listing.splits) if not self._known(s.id))
        for split in new:
            self._pending[split.id] = SplitState(split)
        self._complete = listing.complete
        return new

    def listing_complete(self) -> bool:
        return self._complete

    def assign(self, reader_ids: Sequence[int]) -> dict[int, list[SplitState]]:
        if not self._pending:
            return {}
        if not reader_ids:
            raise ValueError("no readers to assign splits to")
        load = {r: 0 for r in reader_ids}
        for reader, _ in self._assigned.values():
            if reader in load:
                load[reader] += 1
        out: dict[int, list[SplitState]] = {}
        for sid in sorted(self._pending):
            reader = min(reader_ids, key=lambda r: load[r])  # min keeps the first of ties
            state = self._pending.pop(sid)
            self._assigned[sid] = (reader, state)
            load[reader] += 1
            out.setdefault(reader, []).append(state)
        return out

    def finish(self, split_ids: Iterable[str]) -> None:
        for sid in split_ids:
            if sid in self._finished:
                continue
            if sid not in self._assigned:
                raise ValueError(f"split {sid!r} is not assigned")
            del self._assigned[sid]
            self._finished.add(sid)

    def add_splits_back(self, states: Iterable[SplitState]) -> None:
        for state in states:
            sid = state.split.id
            if sid not in self._assigned:
                raise ValueError(f"split {sid!r} is not assigned")
            del self._assigned[sid]
            if state.finished:
                self._finished.add(sid)
            else:
                self._pending[sid] = state

    def assigned_to(self, reader_id: int) -> list[SplitState]:
        return [s for sid, (r, s) in sorted(self._assigned.items()) if r == reader_id]

    def snapshot(self) -> EnumeratorState:
        return EnumeratorState(
            pending=tuple(self._pending[sid] for sid in sorted(self._pending)),
            assigned=dict(self._assigned),
            finished=frozenset(self._finished),
            complete=self._complete,
        )

    def is_finished(self) -> bool:
        return self._complete and not self._pending and not self._assigned
