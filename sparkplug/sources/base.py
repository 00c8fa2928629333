"""The source interface: splits with record offsets, an enumerator on the driver that
discovers and assigns them, and a reader in the tasks that reads one split from an offset.

The model is Flink's FLIP-27 ("Refactor Source Interface"): a :class:`Source` is a
picklable factory of one :class:`SplitEnumerator` (driver side) and of
:class:`SplitReader` s (one per task). To connect another system, implement these three
classes; :class:`~dstltree.sparkplug.sources.enumerator.ListingEnumerator` already gives
the assignment, finishing and snapshot rules for any source that can list its splits.

Offsets and snapshots, precisely:

- A split is an ordered, finite sequence of records. Its offset ``o`` (an int) means
  "records ``[0, o)`` of the split are consumed"; the next record to read is record
  ``o``. ``SplitReader.read(split, o)`` yields records ``o, o + 1, ...`` to the end of
  the split and must give the same records for the same offset every time.
- At each checkpoint barrier a reader records one :class:`SplitState` for every split
  assigned to it in the current attempt: ``offset`` = records consumed before the
  barrier, ``finished`` = True once it has consumed the whole split. These reader states
  and the enumerator's :meth:`SplitEnumerator.snapshot` of the same checkpoint are the
  source's part of the checkpoint.
- The snapshot is taken when the checkpoint is triggered. It is consistent with the
  readers' states when assignments and barriers reach each reader in order: a split
  assigned before ``snapshot()`` reaches its reader before that reader's barrier, a
  split assigned after it reaches the reader after the barrier (Flink's coordinator
  gives the same ordering).
- Restore: ``EnumeratorState.resumed(reader_states)`` folds the readers' states into
  the snapshot, and ``Source.create_enumerator(restored_state)`` starts from it: every
  split not finished goes back to the pending splits at its recorded offset and is
  assigned again (possibly to another reader, with any new parallelism), so each
  record is read exactly once across the failure.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from dstltree.storage.errors import DstlError

#: a record: column name -> msgpack-encodable value (dstltree.sparkplug.sources.values)
Record = dict[str, Any]


class SourceError(DstlError):
    """A split cannot be listed or read: ``path`` names the split's file (or split id),
    ``row`` the record index within the split (0-based, the same numbering as offsets)
    where reading failed, or None where no row applies (an unreadable file footer, a
    listing failure). The cause is chained."""

    def __init__(self, path: str, detail: str, row: int | None = None) -> None:
        where = path if row is None else f"{path}, row {row}"
        super().__init__(f"{where}: {detail}")
        self.path = path
        self.row = row


@dataclass(frozen=True, order=True)
class Split:
    """One unit of source input. ``id`` is unique within the source and orders the
    splits (discovery and assignment go in ``id`` order); ``location`` tells the reader
    where the records are (a file URL for a ``FileSource``, unused by a
    ``MemorySource``). Picklable; :meth:`as_record` is msgpack-encodable."""

    id: str
    location: str = ""

    def as_record(self) -> list[str]:
        """``[id, location]``."""
        return [self.id, self.location]

    @classmethod
    def from_record(cls, record: Sequence[str]) -> Split:
        """The inverse of :meth:`as_record`."""
        return cls(str(record[0]), str(record[1]))


@dataclass(frozen=True)
class SplitState:
    """A split and how far it is consumed: records ``[0, offset)`` are consumed;
    ``finished`` means every record is (then ``offset`` is the split's length, where
    the reader knows it)."""

    split: Split
    offset: int = 0
    finished: bool = False

    def as_record(self) -> list[Any]:
        """``[id, location, offset, finished]`` (msgpack-encodable)."""
        return [*self.split.as_record(), self.offset, self.finished]

    @classmethod
    def from_record(cls, record: Sequence[Any]) -> SplitState:
        """The inverse of :meth:`as_record`."""
        return cls(Split.from_record(record[:2]), int(record[2]), bool(record[3]))


class Listing(NamedTuple):
    """What a source lists at one moment: every split it holds now, and ``complete``:
    no split will appear after this listing (a ``_SUCCESS`` marker)."""

    splits: list[Split]
    complete: bool


@dataclass(frozen=True)
class EnumeratorState:
    """The enumerator's part of a checkpoint (:meth:`SplitEnumerator.snapshot`).

    - ``pending``: splits known but not assigned, with the offset to resume from;
    - ``assigned``: split id -> (reader id, state at assignment);
    - ``finished``: ids of every split consumed to its end. They are kept for the
      life of the source, so that a split listed again is not read again: the state
      grows by one id per split (a directory: one name per file). A watermark of
      names would bound it, but only if files arrive in name order, which Spark's
      ``part-<n>-<uuid>`` names across writes do not promise;
    - ``complete``: the source listed its last split (no more discovery).

    Known split ids are the union of the three. :meth:`as_record` is msgpack-encodable.
    """

    pending: tuple[SplitState, ...] = ()
    assigned: Mapping[str, tuple[int, SplitState]] = field(default_factory=dict)
    finished: frozenset[str] = frozenset()
    complete: bool = False

    def as_record(self) -> dict[str, Any]:
        """A msgpack-encodable dict (lists sorted by split id: equal states encode
        equally)."""
        return {
            "pending": [s.as_record() for s in sorted(self.pending, key=_split_id)],
            "assigned": [[r, *s.as_record()] for _, (r, s) in sorted(self.assigned.items())],
            "finished": sorted(self.finished),
            "complete": self.complete,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> EnumeratorState:
        """The inverse of :meth:`as_record`."""
        assigned = {}
        for row in record["assigned"]:
            state = SplitState.from_record(row[1:])
            assigned[state.split.id] = (int(row[0]), state)
        return cls(
            pending=tuple(SplitState.from_record(r) for r in record["pending"]),
            assigned=assigned,
            finished=frozenset(record["finished"]),
            complete=bool(record["complete"]),
        )

    def resumed(self, reader_states: Iterable[SplitState]) -> EnumeratorState:
        """This snapshot with the readers' split states of the same checkpoint folded
        in: a split a reader reports finished becomes finished; any other reported
        split becomes pending at the reported offset; assigned splits no reader
        reported become pending at their offset at assignment (the reader had not
        started them). Raises ValueError for a reported split this snapshot does not
        know, or whose offset goes backwards."""
        open_ = {s.split.id: s for s in self.pending}
        open_.update({sid: s for sid, (_, s) in self.assigned.items()})
        finished = set(self.finished)
        for rs in reader_states:
            sid = rs.split.id
            if sid in finished:
                continue
            if sid not in open_:
                raise ValueError(f"reader state for unknown split {sid!r}")
            if rs.offset < open_[sid].offset:
                raise ValueError(f"split {sid!r}: offset {rs.offset} < {open_[sid].offset}")
            if rs.finished:
                finished.add(sid)
                del open_[sid]
            else:
                open_[sid] = replace(open_[sid], offset=rs.offset)
        pending = tuple(sorted(open_.values(), key=_split_id))
        return EnumeratorState(pending, {}, frozenset(finished), self.complete)


def _split_id(state: SplitState) -> str:
    return state.split.id


class SplitEnumerator(ABC):
    """The driver side of a source: discovers splits, assigns them to readers, learns
    which are finished, and snapshots all of that for a checkpoint (FLIP-27
    ``SplitEnumerator``). Not thread-safe: the driver calls it from one thread, except
    :meth:`list_splits`, which only does I/O and may run on another thread (the
    coordinator lists off its event loop). Reader ids are the task indexes."""

    @abstractmethod
    def list_splits(self) -> Listing:
        """Lists the source's splits now (I/O only). Does not change the enumerator,
        so the driver may call it on another thread while it keeps using the
        enumerator; hand the result to :meth:`add_listing` on the driver's thread.
        Raises SourceError if the listing fails."""

    @abstractmethod
    def add_listing(self, listing: Listing) -> list[Split]:
        """Makes the splits of ``listing`` not known yet pending (no I/O) and returns
        them in ``id`` order; a ``complete`` listing ends discovery. After the last
        listing (:meth:`listing_complete`) it returns ``[]`` and changes nothing."""

    def listing_complete(self) -> bool:
        """True once a complete listing was added: no split will be discovered."""
        return self.snapshot().complete

    def discover(self) -> list[Split]:
        """``add_listing(list_splits())`` on one thread: looks for splits not known
        yet, returns them in ``id`` order and makes them pending. After the source's
        last listing it returns ``[]`` without looking. Raises SourceError if the
        listing fails."""
        if self.listing_complete():
            return []
        return self.add_listing(self.list_splits())

    @abstractmethod
    def assign(self, reader_ids: Sequence[int]) -> dict[int, list[SplitState]]:
        """Assigns every pending split to one of ``reader_ids`` and returns, per
        reader, the states to read from (offset 0 for a new split, the recorded offset
        for a restored or returned one). Raises ValueError if ``reader_ids`` is empty
        and a split is pending."""

    @abstractmethod
    def finish(self, split_ids: Iterable[str]) -> None:
        """Records that readers consumed these assigned splits to the end (idempotent
        for splits already finished). Raises ValueError for a split not assigned."""

    @abstractmethod
    def add_splits_back(self, states: Iterable[SplitState]) -> None:
        """A reader failed without a global restore: its splits return to the
        pending splits at the offsets given (FLIP-27 ``addSplitsBack``); a state marked
        ``finished`` finishes its split instead. Raises ValueError for a split not
        assigned."""

    @abstractmethod
    def assigned_to(self, reader_id: int) -> list[SplitState]:
        """The unfinished splits assigned to ``reader_id``, in ``id`` order, with the
        offsets they were assigned at."""

    @abstractmethod
    def snapshot(self) -> EnumeratorState:
        """The enumerator's state now, for the checkpoint being triggered."""

    @abstractmethod
    def is_finished(self) -> bool:
        """True when the source listed its last split and every split is finished:
        the job's input is fully consumed."""


class SplitReader(ABC):
    """The task side of a source: reads one split from an offset. Created in the task
    by :meth:`Source.create_reader`; may keep connections or file systems open."""

    @abstractmethod
    def read(self, split: Split, offset: int) -> Iterator[Record]:
        """Records ``offset, offset + 1, ...`` of ``split``, in order, to its end; the
        same records for the same offset on every call. Skips records before
        ``offset`` without decoding them where the format allows. Raises SourceError
        (naming the split and the row) for records that cannot be read and for an
        offset past the split's end; nothing is skipped silently."""


class Source(ABC):
    """A picklable factory of the enumerator and the readers of one input (it travels
    in the Spark closure, so it holds parameters only, never open handles).

    ``relists``: every listing names every split there is (a directory listing), and
    the enumerator lists again after a restore whose state is not ``complete``; then a
    checkpoint need not keep splits no reader has started (offset 0): the coordinator
    leaves them out of checkpoint metadata (marking it not complete) and the restored
    enumerator finds them again, so metadata stays small however long the backlog.
    False (the default) keeps every pending split."""

    relists: bool = False

    @abstractmethod
    def create_enumerator(self, restored_state: EnumeratorState | None = None) -> SplitEnumerator:
        """A new enumerator, or one resuming ``restored_state`` (usually
        ``snapshot.resumed(reader_states)``): its assigned splits become pending at
        their recorded offsets."""

    @abstractmethod
    def create_reader(self) -> SplitReader:
        """A reader for one task."""
