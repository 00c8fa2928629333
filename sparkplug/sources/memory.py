"""``MemorySource``: splits held in a dict, for tests and small examples."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dstltree.sparkplug.sources.base import (
    EnumeratorState,
    Listing,
    Record,
    Source,
    SourceError,
    Split,
    SplitEnumerator,
    SplitReader,
)
from dstltree.sparkplug.sources.enumerator import ListingEnumerator
from dstltree.sparkplug.sources.values import plain_record


class MemorySource(Source):
    relists = True  # every listing names every split

    """Splits ``split id -> records`` (dicts; values made plain on reading, see
    dstltree.sparkplug.sources.values). ``finished`` True: these are all the splits
    (the first listing is complete); False: more may come through :meth:`add_split`
    until :meth:`finish`. Enumerators see splits added later on their next
    ``discover()`` (they list this object). Pickling copies the splits: a reader in
    another process sees the splits as they were when the source was pickled."""

    def __init__(self, splits: dict[str, list[dict[str, Any]]], finished: bool = True) -> None:
        self.splits = {str(k): list(v) for k, v in splits.items()}
        self.finished = finished

    def add_split(self, split_id: str, records: list[dict[str, Any]]) -> None:
        """Adds a split. Raises ValueError if the id exists or the source is finished."""
        if self.finished:
            raise ValueError("source is finished: no split can be added")
        if split_id in self.splits:
            raise ValueError(f"split {split_id!r} exists")
        self.splits[split_id] = list(records)

    def finish(self) -> None:
        """No split will be added after this."""
        self.finished = True

    def list_splits(self) -> Listing:
        """Every split now; complete once :attr:`finished`."""
        return Listing([Split(sid) for sid in sorted(self.splits)], self.finished)

    def create_enumerator(self, restored_state: EnumeratorState | None = None) -> SplitEnumerator:
        return ListingEnumerator(self.list_splits, restored_state)

    def create_reader(self) -> SplitReader:
        return MemorySplitReader(self.splits)


class MemorySplitReader(SplitReader):
    """Reads the splits of one :class:`MemorySource` (shared, not copied)."""

    def __init__(self, splits: dict[str, list[dict[str, Any]]]) -> None:
        self.splits = splits

    def read(self, split: Split, offset: int) -> Iterator[Record]:
        records = self.splits.get(split.id)
        if records is None:
            raise SourceError(split.id, "no such split")
        if not 0 <= offset <= len(records):
            raise SourceError(split.id, f"offset {offset} outside [0, {len(records)}]")
        return (plain_record(r) for r in records[offset:])
